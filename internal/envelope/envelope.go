// Package envelope seals messages into envelopes of canonical bytes, names
// signing keys and builds the signed input of DESIGN.md §5.4:
// "mesh.<type>.v1\x00" ‖ sha256(canonical bytes).
package envelope

import (
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"

	"google.golang.org/protobuf/proto"

	"mesh.dev/internal/canonical"
	"mesh.dev/internal/names"
	typev1 "mesh.dev/proto/mesh/type/v1"
)

// ErrPayloadType is returned when an envelope holds another type of payload
// than the one asked for.
var ErrPayloadType = errors.New("wrong payload type")

// Domain returns the signing domain of a payload type, e.g.
// "mesh.composition.v1", or "" for an unknown type.
func Domain(t typev1.PayloadType) string {
	switch t {
	case typev1.PayloadType_PAYLOAD_TYPE_COMPOSITION:
		return "mesh.composition.v1"
	case typev1.PayloadType_PAYLOAD_TYPE_MANIFEST:
		return "mesh.manifest.v1"
	case typev1.PayloadType_PAYLOAD_TYPE_KEYSET:
		return "mesh.keyset.v1"
	}
	return ""
}

// SigningInput returns the bytes a signature covers: the domain of the payload
// type, a NUL byte and sha256 of the payload. Binding the type keeps a
// signature over one kind of payload from verifying as another.
func SigningInput(t typev1.PayloadType, payload []byte) ([]byte, error) {
	d := Domain(t)
	if d == "" {
		return nil, fmt.Errorf("%w: %v has no signing domain", ErrPayloadType, t)
	}
	sum := sha256.Sum256(payload)
	out := make([]byte, 0, len(d)+1+len(sum))
	out = append(out, d...)
	out = append(out, 0)
	return append(out, sum[:]...), nil
}

// SigningInputOfDigest is SigningInput for a payload whose digest is known,
// so the signer hashes each payload once.
func SigningInputOfDigest(t typev1.PayloadType, digest string) ([]byte, error) {
	d := Domain(t)
	if d == "" {
		return nil, fmt.Errorf("%w: %v has no signing domain", ErrPayloadType, t)
	}
	sum, err := names.DigestBytes(digest)
	if err != nil {
		return nil, err
	}
	out := make([]byte, 0, len(d)+1+len(sum))
	out = append(out, d...)
	out = append(out, 0)
	return append(out, sum...), nil
}

// KeyID names an ed25519 public key: "k1:" + the first 16 hex digits of
// sha256(public key).
func KeyID(pub ed25519.PublicKey) string {
	sum := sha256.Sum256(pub)
	return "k1:" + hex.EncodeToString(sum[:8])
}

// Seal returns an unsigned envelope holding the canonical bytes of m, and
// their digest.
func Seal(t typev1.PayloadType, m proto.Message) (*typev1.Envelope, string, error) {
	payload, err := canonical.Marshal(m)
	if err != nil {
		return nil, "", err
	}
	return &typev1.Envelope{PayloadType: t, Payload: payload}, names.Digest(payload), nil
}

// Digest returns the digest of an envelope's payload.
func Digest(env *typev1.Envelope) string { return names.Digest(env.GetPayload()) }

// SignWith appends a signature by an ed25519 private key. The signer service
// signs through its key source instead; this is for offline roots and tests.
func SignWith(env *typev1.Envelope, key ed25519.PrivateKey) error {
	input, err := SigningInput(env.GetPayloadType(), env.GetPayload())
	if err != nil {
		return err
	}
	env.Signatures = append(env.Signatures, &typev1.Signature{
		KeyId:     KeyID(key.Public().(ed25519.PublicKey)),
		Signature: ed25519.Sign(key, input),
	})
	return nil
}

// Open checks the payload type and decodes the payload into m (refusing
// unknown fields). It verifies nothing: see package verify.
func Open(env *typev1.Envelope, t typev1.PayloadType, m proto.Message) error {
	if env == nil {
		return fmt.Errorf("%w: no envelope", ErrPayloadType)
	}
	if env.GetPayloadType() != t {
		return fmt.Errorf("%w: got %v, want %v", ErrPayloadType, env.GetPayloadType(), t)
	}
	return canonical.Decode(env.GetPayload(), m)
}
