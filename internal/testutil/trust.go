package testutil

import (
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"fmt"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"mesh.dev/internal/envelope"
	typev1 "mesh.dev/proto/mesh/type/v1"
)

// Trust is a complete chain of trust for tests: root keys, a root-signed
// keyset and the online signing key it lists as ACTIVE.
type Trust struct {
	RootKeys   []ed25519.PrivateKey
	Roots      *typev1.TrustRoots
	SigningKey ed25519.PrivateKey
	Keyset     *typev1.Keyset
	// KeysetEnvelope is Keyset signed by every root.
	KeysetEnvelope *typev1.Envelope
}

// NewKey returns a fresh ed25519 private key.
func NewKey(t testing.TB) ed25519.PrivateKey {
	t.Helper()
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return priv
}

// NewTrust makes n root keys with the given threshold, one signing key and a
// keyset of version 1 valid for a year listing it as ACTIVE.
func NewTrust(t testing.TB, n, threshold int) *Trust {
	t.Helper()
	tr := &Trust{Roots: &typev1.TrustRoots{Threshold: uint32(threshold)}}
	for i := 0; i < n; i++ {
		k := NewKey(t)
		tr.RootKeys = append(tr.RootKeys, k)
		pub := k.Public().(ed25519.PublicKey)
		tr.Roots.Keys = append(tr.Roots.Keys, &typev1.RootKey{Id: envelope.KeyID(pub), PublicKey: pub})
	}
	tr.SigningKey = NewKey(t)
	now := time.Now()
	tr.Keyset = &typev1.Keyset{
		Version:   1,
		IssuedAt:  timestamppb.New(now),
		ExpiresAt: timestamppb.New(now.Add(365 * 24 * time.Hour)),
		Keys:      []*typev1.KeysetKey{KeysetKeyOf(tr.SigningKey, typev1.KeyState_KEY_STATE_ACTIVE, now.Add(-time.Hour), now.Add(365*24*time.Hour))},
	}
	tr.KeysetEnvelope = tr.SignKeyset(t, tr.Keyset, tr.RootKeys...)
	return tr
}

// KeysetKeyOf lists a private key's public half in a keyset.
func KeysetKeyOf(k ed25519.PrivateKey, state typev1.KeyState, notBefore, notAfter time.Time) *typev1.KeysetKey {
	pub := k.Public().(ed25519.PublicKey)
	return &typev1.KeysetKey{
		Id: envelope.KeyID(pub), PublicKey: pub, State: state,
		NotBefore: timestamppb.New(notBefore), NotAfter: timestamppb.New(notAfter),
	}
}

// SignKeyset seals a keyset and signs it with the given root keys.
func (tr *Trust) SignKeyset(t testing.TB, ks *typev1.Keyset, roots ...ed25519.PrivateKey) *typev1.Envelope {
	t.Helper()
	env, _, err := envelope.Seal(typev1.PayloadType_PAYLOAD_TYPE_KEYSET, ks)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range roots {
		if err := envelope.SignWith(env, r); err != nil {
			t.Fatal(err)
		}
	}
	return env
}

// Sign seals a message of a payload type and signs it with the signing key.
func (tr *Trust) Sign(t testing.TB, pt typev1.PayloadType, m proto.Message) (*typev1.Envelope, string) {
	t.Helper()
	env, digest, err := envelope.Seal(pt, m)
	if err != nil {
		t.Fatal(err)
	}
	if err := envelope.SignWith(env, tr.SigningKey); err != nil {
		t.Fatal(err)
	}
	return env, digest
}

// FixedKey returns the ed25519 key derived from a name: the same name gives
// the same key in every run, so fuzz corpora of signed envelopes committed
// to testdata keep verifying.
func FixedKey(name string) ed25519.PrivateKey {
	seed := sha256.Sum256([]byte("mesh test key " + name))
	return ed25519.NewKeyFromSeed(seed[:])
}

// FixedTrust is NewTrust with keys derived from name and times from now (a
// fixed instant in fuzz tests): the same arguments give the same roots, key
// and keyset bytes in every run. The keyset is valid from a day before now
// for a year.
func FixedTrust(t testing.TB, name string, n, threshold int, now time.Time) *Trust {
	t.Helper()
	tr := &Trust{Roots: &typev1.TrustRoots{Threshold: uint32(threshold)}}
	for i := 0; i < n; i++ {
		k := FixedKey(fmt.Sprintf("%s root %d", name, i))
		tr.RootKeys = append(tr.RootKeys, k)
		pub := k.Public().(ed25519.PublicKey)
		tr.Roots.Keys = append(tr.Roots.Keys, &typev1.RootKey{Id: envelope.KeyID(pub), PublicKey: pub})
	}
	tr.SigningKey = FixedKey(name + " signing")
	tr.Keyset = &typev1.Keyset{
		Version:   1,
		IssuedAt:  timestamppb.New(now.Add(-24 * time.Hour)),
		ExpiresAt: timestamppb.New(now.Add(365 * 24 * time.Hour)),
		Keys:      []*typev1.KeysetKey{KeysetKeyOf(tr.SigningKey, typev1.KeyState_KEY_STATE_ACTIVE, now.Add(-24*time.Hour), now.Add(365*24*time.Hour))},
	}
	tr.KeysetEnvelope = tr.SignKeyset(t, tr.Keyset, tr.RootKeys...)
	return tr
}
