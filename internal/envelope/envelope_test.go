package envelope

import (
	"bytes"
	"crypto/ed25519"
	"encoding/hex"
	"errors"
	"testing"

	"mesh.dev/internal/names"
	typev1 "mesh.dev/proto/mesh/type/v1"
)

// sha256("abc"), FIPS 180-2's example.
const abcSHA256 = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"

// TestSigningInputKnownAnswers pins DESIGN.md §5.4's signed bytes,
// "mesh.<type>.v1\x00" ‖ sha256(canonical bytes), for every payload type: a
// change of domain, separator or hash would make every signature in the
// fleet fail, and must fail here first.
func TestSigningInputKnownAnswers(t *testing.T) {
	t.Parallel()
	sum, _ := hex.DecodeString(abcSHA256)
	for _, tt := range []struct {
		typ    typev1.PayloadType
		domain string
	}{
		{typev1.PayloadType_PAYLOAD_TYPE_COMPOSITION, "mesh.composition.v1"},
		{typev1.PayloadType_PAYLOAD_TYPE_MANIFEST, "mesh.manifest.v1"},
		{typev1.PayloadType_PAYLOAD_TYPE_KEYSET, "mesh.keyset.v1"},
	} {
		t.Run(tt.domain, func(t *testing.T) {
			t.Parallel()
			want := append(append([]byte(tt.domain), 0), sum...)
			got, err := SigningInput(tt.typ, []byte("abc"))
			if err != nil || !bytes.Equal(got, want) {
				t.Fatalf("SigningInput = %x, %v; want %x", got, err, want)
			}
			byDigest, err := SigningInputOfDigest(tt.typ, "sha256:"+abcSHA256)
			if err != nil || !bytes.Equal(byDigest, want) {
				t.Fatalf("SigningInputOfDigest = %x, %v; want %x", byDigest, err, want)
			}
		})
	}
	for _, bad := range []typev1.PayloadType{typev1.PayloadType_PAYLOAD_TYPE_UNSPECIFIED, typev1.PayloadType(99)} {
		if _, err := SigningInput(bad, []byte("abc")); !errors.Is(err, ErrPayloadType) {
			t.Errorf("SigningInput(%v) = %v, want ErrPayloadType", bad, err)
		}
		if _, err := SigningInputOfDigest(bad, "sha256:"+abcSHA256); !errors.Is(err, ErrPayloadType) {
			t.Errorf("SigningInputOfDigest(%v) = %v, want ErrPayloadType", bad, err)
		}
	}
	if _, err := SigningInputOfDigest(typev1.PayloadType_PAYLOAD_TYPE_MANIFEST, "sha256:abc"); err == nil {
		t.Error("SigningInputOfDigest took a malformed digest")
	}
}

// TestKeyIDAndSignatureKnownAnswers: the key id of RFC 8032's first test key
// (computed apart: "k1:" + the first 16 hex digits of sha256 of the public
// key), and a signature by it that verifies over the signing input (ed25519
// is deterministic, so the same bytes always sign the same).
func TestKeyIDAndSignatureKnownAnswers(t *testing.T) {
	t.Parallel()
	seed, _ := hex.DecodeString("9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60")
	key := ed25519.NewKeyFromSeed(seed)
	pub := key.Public().(ed25519.PublicKey)
	if got := hex.EncodeToString(pub); got != "d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a" {
		t.Fatalf("public key of RFC 8032 test 1 = %s", got)
	}
	if got := KeyID(pub); got != "k1:21fe31dfa154a261" {
		t.Fatalf("KeyID = %s, want k1:21fe31dfa154a261", got)
	}
	env := &typev1.Envelope{PayloadType: typev1.PayloadType_PAYLOAD_TYPE_MANIFEST, Payload: []byte("abc")}
	if err := SignWith(env, key); err != nil {
		t.Fatal(err)
	}
	input, _ := SigningInput(env.GetPayloadType(), env.GetPayload())
	sig := env.GetSignatures()[0]
	if sig.GetKeyId() != "k1:21fe31dfa154a261" || !ed25519.Verify(pub, input, sig.GetSignature()) {
		t.Fatalf("signature %x by %s does not verify over the signing input", sig.GetSignature(), sig.GetKeyId())
	}
	// Over the payload itself (no domain), the signature must not verify:
	// the domain is part of what is signed.
	if ed25519.Verify(pub, env.GetPayload(), sig.GetSignature()) {
		t.Fatal("the signature verifies over the bare payload")
	}
}

// TestSealOpen: Seal holds the canonical bytes and their digest; Open
// refuses another payload type and decodes the bytes it holds.
func TestSealOpen(t *testing.T) {
	t.Parallel()
	m := &typev1.Manifest{Node: "ace", Revision: 7}
	env, digest, err := Seal(typev1.PayloadType_PAYLOAD_TYPE_MANIFEST, m)
	if err != nil {
		t.Fatal(err)
	}
	if digest != names.Digest(env.GetPayload()) || Digest(env) != digest {
		t.Fatalf("digest %s is not that of the payload (%s)", digest, names.Digest(env.GetPayload()))
	}
	got := &typev1.Manifest{}
	if err := Open(env, typev1.PayloadType_PAYLOAD_TYPE_COMPOSITION, got); !errors.Is(err, ErrPayloadType) {
		t.Fatalf("Open as a composition = %v, want ErrPayloadType", err)
	}
	if err := Open(nil, typev1.PayloadType_PAYLOAD_TYPE_MANIFEST, got); !errors.Is(err, ErrPayloadType) {
		t.Fatalf("Open(nil) = %v, want ErrPayloadType", err)
	}
	if err := Open(env, typev1.PayloadType_PAYLOAD_TYPE_MANIFEST, got); err != nil || got.GetNode() != "ace" || got.GetRevision() != 7 {
		t.Fatalf("Open = %v, %v", got, err)
	}
}
