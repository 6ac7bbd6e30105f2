// Package verify checks the chain of trust of DESIGN.md §5.4: pinned root
// keys → a keyset signed by t of them → an envelope signed by a usable key of
// that keyset. Node engines and `meshctl verify` use it; the signer uses it to
// check that the keyset it serves lists its own key.
package verify

import (
	"bytes"
	"crypto/ed25519"
	"errors"
	"fmt"
	"os"
	"time"

	"google.golang.org/protobuf/encoding/protojson"

	"mesh.dev/internal/envelope"
	"mesh.dev/internal/lint"
	typev1 "mesh.dev/proto/mesh/type/v1"
)

// The errors verification returns; each failure wraps exactly one of them so
// callers can map it to a reason code.
var (
	// ErrRoots: the pinned roots themselves are malformed.
	ErrRoots = errors.New("trust roots invalid")
	// ErrKeyset: a keyset not signed by enough pinned roots, or malformed.
	ErrKeyset = errors.New("keyset not trusted")
	// ErrKeysetExpired: the keyset's expires_at has passed.
	ErrKeysetExpired = errors.New("keyset expired")
	// ErrUnknownKey: a signature by a key the keyset does not list.
	ErrUnknownKey = errors.New("signing key not in the keyset")
	// ErrRevoked: a signature by a REVOKED key.
	ErrRevoked = errors.New("signing key revoked")
	// ErrKeyNotValid: a signature by a key outside its validity window.
	ErrKeyNotValid = errors.New("signing key not valid at this time")
	// ErrSignature: a signature that does not verify.
	ErrSignature = errors.New("signature does not verify")
	// ErrPayload: a payload of the wrong type or that does not decode.
	ErrPayload = errors.New("payload invalid")
	// ErrNode: a manifest or composition of another node.
	ErrNode = errors.New("another node's")
	// ErrExpired: a manifest past its expiry (with the allowed skew).
	ErrExpired = errors.New("manifest expired")
	// ErrFastForward: a manifest issued too far ahead of the verifier's clock.
	ErrFastForward = errors.New("manifest issued in the future")
	// ErrBelowFloor: a manifest revision under the keyset's revision floor.
	ErrBelowFloor = errors.New("manifest revision below the keyset's floor")
	// ErrDigest: bytes whose digest is not the one declared.
	ErrDigest = errors.New("digest mismatch")
	// ErrWant: a composition whose module or fingerprint is not the want's.
	ErrWant = errors.New("composition does not match its want")
)

// Skew is the clock skew allowed when judging a manifest's expiry.
const Skew = time.Hour

// MaxAhead is how far in the future a manifest may have been issued before it
// is refused as a fast-forward.
const MaxAhead = 24 * time.Hour

// LoadRoots reads pinned root keys from a JSON file (mesh.type.v1.TrustRoots
// in protojson) and checks them.
func LoadRoots(path string) (*typev1.TrustRoots, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read trust roots: %w", err)
	}
	roots := &typev1.TrustRoots{}
	if err := (protojson.UnmarshalOptions{}).Unmarshal(b, roots); err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrRoots, path, err)
	}
	if err := CheckRoots(roots); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return roots, nil
}

// CheckRoots checks that roots have a threshold between 1 and the number of
// keys, 32-byte keys and ids derived from the keys, each once.
func CheckRoots(roots *typev1.TrustRoots) error {
	n := len(roots.GetKeys())
	if n == 0 {
		return fmt.Errorf("%w: no root keys", ErrRoots)
	}
	if t := roots.GetThreshold(); t < 1 || int(t) > n {
		return fmt.Errorf("%w: threshold %d is not between 1 and the %d root keys", ErrRoots, t, n)
	}
	seen := map[string]bool{}
	for i, k := range roots.GetKeys() {
		if len(k.GetPublicKey()) != ed25519.PublicKeySize {
			return fmt.Errorf("%w: keys[%d].public_key is %d bytes, want %d", ErrRoots, i, len(k.GetPublicKey()), ed25519.PublicKeySize)
		}
		if want := envelope.KeyID(k.GetPublicKey()); k.GetId() != want {
			return fmt.Errorf("%w: keys[%d].id %q is not the key's id %q", ErrRoots, i, k.GetId(), want)
		}
		if seen[k.GetId()] {
			return fmt.Errorf("%w: keys[%d].id %q is listed twice", ErrRoots, i, k.GetId())
		}
		seen[k.GetId()] = true
	}
	return nil
}

// Keyring is a keyset that verified against pinned roots.
type Keyring struct {
	keyset *typev1.Keyset
	env    *typev1.Envelope
	digest string
	keys   map[string]*typev1.KeysetKey
}

// Keyset verifies a root-signed keyset envelope: at least threshold distinct
// pinned roots signed it, and its keys are well formed. Expiry is not judged
// here (see Keyring.Expired) so an engine can still read an expired keyset's
// version while it reports itself stale.
func Keyset(roots *typev1.TrustRoots, env *typev1.Envelope) (*Keyring, error) {
	if err := CheckRoots(roots); err != nil {
		return nil, err
	}
	ks := &typev1.Keyset{}
	if err := envelope.Open(env, typev1.PayloadType_PAYLOAD_TYPE_KEYSET, ks); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrKeyset, err)
	}
	input, err := envelope.SigningInput(env.GetPayloadType(), env.GetPayload())
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrKeyset, err)
	}
	rootByID := map[string][]byte{}
	for _, r := range roots.GetKeys() {
		rootByID[r.GetId()] = r.GetPublicKey()
	}
	good := map[string]bool{}
	for _, s := range env.GetSignatures() {
		pub, ok := rootByID[s.GetKeyId()]
		if !ok || good[s.GetKeyId()] {
			continue
		}
		if ed25519.Verify(pub, input, s.GetSignature()) {
			good[s.GetKeyId()] = true
		}
	}
	if len(good) < int(roots.GetThreshold()) {
		return nil, fmt.Errorf("%w: %d of the %d root signatures needed verify", ErrKeyset, len(good), roots.GetThreshold())
	}
	if ks.GetVersion() == 0 {
		return nil, fmt.Errorf("%w: version is 0", ErrKeyset)
	}
	keys := map[string]*typev1.KeysetKey{}
	for i, k := range ks.GetKeys() {
		if len(k.GetPublicKey()) != ed25519.PublicKeySize {
			return nil, fmt.Errorf("%w: keys[%d].public_key is %d bytes", ErrKeyset, i, len(k.GetPublicKey()))
		}
		if want := envelope.KeyID(k.GetPublicKey()); k.GetId() != want {
			return nil, fmt.Errorf("%w: keys[%d].id %q is not the key's id %q", ErrKeyset, i, k.GetId(), want)
		}
		if _, dup := keys[k.GetId()]; dup {
			return nil, fmt.Errorf("%w: keys[%d].id %q is listed twice", ErrKeyset, i, k.GetId())
		}
		if k.GetState() == typev1.KeyState_KEY_STATE_UNSPECIFIED {
			return nil, fmt.Errorf("%w: keys[%d].state is unset", ErrKeyset, i)
		}
		keys[k.GetId()] = k
	}
	return &Keyring{keyset: ks, env: env, digest: envelope.Digest(env), keys: keys}, nil
}

// Keyset returns the verified keyset.
func (k *Keyring) Keyset() *typev1.Keyset { return k.keyset }

// Envelope returns the envelope the keyset was verified from.
func (k *Keyring) Envelope() *typev1.Envelope { return k.env }

// Version returns the keyset's version.
func (k *Keyring) Version() uint64 { return k.keyset.GetVersion() }

// Digest returns the digest of the keyset's canonical bytes.
func (k *Keyring) Digest() string { return k.digest }

// Expired reports whether the keyset's expires_at is before now.
func (k *Keyring) Expired(now time.Time) bool {
	exp := k.keyset.GetExpiresAt()
	return exp != nil && now.After(exp.AsTime())
}

// Key returns a listed key by id.
func (k *Keyring) Key(id string) (*typev1.KeysetKey, bool) {
	key, ok := k.keys[id]
	return key, ok
}

// ListsSigners reports whether every signature of env is by a key the
// keyset lists, in any state (a revoked key is listed: whether it may sign
// is judged at verification).
func (k *Keyring) ListsSigners(env *typev1.Envelope) bool {
	for _, sig := range env.GetSignatures() {
		if _, ok := k.Key(sig.GetKeyId()); !ok {
			return false
		}
	}
	return true
}

// usable reports why a key cannot verify a signature at a time, or nil.
func usable(key *typev1.KeysetKey, at time.Time) error {
	switch key.GetState() {
	case typev1.KeyState_KEY_STATE_REVOKED:
		return fmt.Errorf("%w: %s", ErrRevoked, key.GetId())
	case typev1.KeyState_KEY_STATE_ACTIVE, typev1.KeyState_KEY_STATE_RETIRED:
	default:
		return fmt.Errorf("%w: %s has state %v", ErrKeyNotValid, key.GetId(), key.GetState())
	}
	if nb := key.GetNotBefore(); nb != nil && at.Before(nb.AsTime()) {
		return fmt.Errorf("%w: %s is valid from %s", ErrKeyNotValid, key.GetId(), nb.AsTime().UTC().Format(time.RFC3339))
	}
	if na := key.GetNotAfter(); na != nil && at.After(na.AsTime()) {
		return fmt.Errorf("%w: %s was valid until %s", ErrKeyNotValid, key.GetId(), na.AsTime().UTC().Format(time.RFC3339))
	}
	return nil
}

// Verify checks that env holds a payload of type t with a valid signature by
// a key of the keyset usable at the given time (ACTIVE, or RETIRED before its
// not_after; never REVOKED). It returns the id of the key that verified.
func (k *Keyring) Verify(env *typev1.Envelope, t typev1.PayloadType, at time.Time) (string, error) {
	if env.GetPayloadType() != t {
		return "", fmt.Errorf("%w: payload type %v, want %v", ErrPayload, env.GetPayloadType(), t)
	}
	if len(env.GetSignatures()) == 0 {
		return "", fmt.Errorf("%w: the envelope is not signed", ErrSignature)
	}
	input, err := envelope.SigningInput(t, env.GetPayload())
	if err != nil {
		return "", fmt.Errorf("%w: %v", ErrPayload, err)
	}
	var firstErr error
	for _, s := range env.GetSignatures() {
		key, ok := k.keys[s.GetKeyId()]
		if !ok {
			firstErr = keepFirst(firstErr, fmt.Errorf("%w: %s (keyset version %d)", ErrUnknownKey, s.GetKeyId(), k.Version()))
			continue
		}
		if err := usable(key, at); err != nil {
			firstErr = keepFirst(firstErr, err)
			continue
		}
		if !ed25519.Verify(key.GetPublicKey(), input, s.GetSignature()) {
			firstErr = keepFirst(firstErr, fmt.Errorf("%w: by %s", ErrSignature, s.GetKeyId()))
			continue
		}
		return key.GetId(), nil
	}
	return "", firstErr
}

// Usable reports why the key of id keyID cannot verify at the given time
// (not in the keyset, revoked, outside its validity), nil when it can.
func (k *Keyring) Usable(keyID string, at time.Time) error {
	key, ok := k.keys[keyID]
	if !ok {
		return fmt.Errorf("%w: %s (keyset version %d)", ErrUnknownKey, keyID, k.Version())
	}
	return usable(key, at)
}

func keepFirst(first, err error) error {
	if first != nil {
		return first
	}
	return err
}

// Manifest verifies a signed manifest for a node at now: the signature (by a
// key usable at now), the node, expiry with Skew allowed, issue time and
// revision (as milliseconds since 1970) no more than MaxAhead in the future,
// the keyset's revision floor and the wants' form. Revision ordering
// against what the node holds is the caller's.
func (k *Keyring) Manifest(env *typev1.Envelope, node string, now time.Time) (*typev1.Manifest, string, error) {
	if _, err := k.Verify(env, typev1.PayloadType_PAYLOAD_TYPE_MANIFEST, now); err != nil {
		return nil, "", err
	}
	m := &typev1.Manifest{}
	if err := envelope.Open(env, typev1.PayloadType_PAYLOAD_TYPE_MANIFEST, m); err != nil {
		return nil, "", fmt.Errorf("%w: %v", ErrPayload, err)
	}
	if err := k.CheckManifest(m, node, now); err != nil {
		return nil, "", err
	}
	return m, envelope.Digest(env), nil
}

// Recheck judges again, at now, a manifest this keyring verified (with the
// key of id keyID) and opened: the key still usable (not revoked, not past
// its not_after) and CheckManifest. Its signature is not verified again:
// the bytes and the key are those it verified.
func (k *Keyring) Recheck(keyID string, m *typev1.Manifest, node string, now time.Time) error {
	if err := k.Usable(keyID, now); err != nil {
		return err
	}
	return k.CheckManifest(m, node, now)
}

// CheckManifest makes the checks of Manifest but the signature's on a
// manifest opened from an envelope Verify accepted: the node, expiry with
// Skew allowed, issue time and revision no more than MaxAhead in the
// future, the keyset's revision floor and the wants' form.
func (k *Keyring) CheckManifest(m *typev1.Manifest, node string, now time.Time) error {
	if m.GetNode() != node {
		return fmt.Errorf("%w: manifest of node %q, not %q", ErrNode, m.GetNode(), node)
	}
	if exp := m.GetExpiresAt(); exp == nil || now.After(exp.AsTime().Add(Skew)) {
		return fmt.Errorf("%w: revision %d expired at %s", ErrExpired, m.GetRevision(), exp.AsTime().UTC().Format(time.RFC3339))
	}
	if iss := m.GetIssuedAt(); iss == nil || iss.AsTime().After(now.Add(MaxAhead)) {
		return fmt.Errorf("%w: revision %d issued at %s, more than %s ahead", ErrFastForward, m.GetRevision(), iss.AsTime().UTC().Format(time.RFC3339), MaxAhead)
	}
	// A revision is milliseconds since 1970 at the latest (the signer's
	// max(last + 1, floor, unix ms), its floor refused beyond MaxAhead): one
	// further ahead, taken, would raise the node's high-water so far that
	// no honest manifest could follow it.
	if limit := now.Add(MaxAhead).UnixMilli(); limit > 0 && m.GetRevision() > uint64(limit) {
		return fmt.Errorf("%w: revision %d is beyond %d, milliseconds since 1970 %s from now: no signer issues it", ErrFastForward, m.GetRevision(), limit, MaxAhead)
	}
	if m.GetRevision() < k.keyset.GetRevisionFloor() {
		return fmt.Errorf("%w: revision %d < floor %d", ErrBelowFloor, m.GetRevision(), k.keyset.GetRevisionFloor())
	}
	if err := lint.CheckWants(node, m.GetWants()); err != nil {
		return fmt.Errorf("%w: %v", ErrPayload, err)
	}
	return nil
}

// Composition verifies a signed composition against the want that names it:
// the digest of its bytes equals the want's, the signature (at the given
// time), and node, module and fingerprint match the want.
func (k *Keyring) Composition(env *typev1.Envelope, node string, want *typev1.Want, at time.Time) (*typev1.Composition, error) {
	c, _, err := k.VerifyComposition(env, node, want, at)
	return c, err
}

// VerifyComposition is Composition that also returns the id of the key
// whose signature verified, for RecheckComposition.
func (k *Keyring) VerifyComposition(env *typev1.Envelope, node string, want *typev1.Want, at time.Time) (*typev1.Composition, string, error) {
	if got := envelope.Digest(env); got != want.GetCompositionDigest() {
		return nil, "", fmt.Errorf("%w: composition %s has digest %s, the manifest says %s", ErrDigest, want.GetCompositionKey(), got, want.GetCompositionDigest())
	}
	keyID, err := k.Verify(env, typev1.PayloadType_PAYLOAD_TYPE_COMPOSITION, at)
	if err != nil {
		return nil, "", err
	}
	c := &typev1.Composition{}
	if err := envelope.Open(env, typev1.PayloadType_PAYLOAD_TYPE_COMPOSITION, c); err != nil {
		return nil, "", fmt.Errorf("%w: %v", ErrPayload, err)
	}
	if err := CheckWant(c, node, want); err != nil {
		return nil, "", err
	}
	return c, keyID, nil
}

// RecheckComposition judges again, for a want and at a time, a composition
// this keyring verified (with the key of id keyID) and opened, whose
// envelope has the digest the want names: the key still usable (not
// revoked, not past its not_after) and CheckWant. Its signature is not
// verified again: the bytes and the key are those it verified.
func (k *Keyring) RecheckComposition(keyID string, c *typev1.Composition, node string, want *typev1.Want, at time.Time) error {
	if err := k.Usable(keyID, at); err != nil {
		return err
	}
	return CheckWant(c, node, want)
}

// CheckWant checks that a composition is of the node and of the want's
// module and fingerprint.
func CheckWant(c *typev1.Composition, node string, want *typev1.Want) error {
	if c.GetNode() != node {
		return fmt.Errorf("%w: composition %s is of node %q", ErrNode, want.GetCompositionKey(), c.GetNode())
	}
	if c.GetModule() != want.GetModule() || c.GetFingerprint() != want.GetFingerprint() {
		return fmt.Errorf("%w: composition %s is of module %q at %q, the want says %q at %q", ErrWant,
			want.GetCompositionKey(), c.GetModule(), c.GetFingerprint(), want.GetModule(), want.GetFingerprint())
	}
	return nil
}

// SameKeyset reports whether two keyset envelopes hold the same bytes.
func SameKeyset(a, b *typev1.Envelope) bool { return bytes.Equal(a.GetPayload(), b.GetPayload()) }
