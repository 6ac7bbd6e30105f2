package app

import (
	"crypto/ed25519"
	"crypto/rand"
	"fmt"
	"strings"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	"mesh.dev/internal/envelope"
	"mesh.dev/internal/lint"
	"mesh.dev/internal/names"
	"mesh.dev/internal/verify"
	typev1 "mesh.dev/proto/mesh/type/v1"
)

// VerifyFixture is a signed composition of about 12 KB (24 files of 480
// bytes) with its want and a keyset that verifies it: what the engine's
// verify cost is measured on (BenchmarkVerifyComposition, `meshctl bench
// converge`).
type VerifyFixture struct {
	ring *verify.Keyring
	env  *typev1.Envelope
	want *typev1.Want
	node string
	now  time.Time
}

// NewVerifyFixture makes a root, a keyset signed by it, and a composition
// signed by the keyset's key.
func NewVerifyFixture() (*VerifyFixture, error) {
	_, root, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, err
	}
	_, signing, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	rootPub, signPub := root.Public().(ed25519.PublicKey), signing.Public().(ed25519.PublicKey)
	roots := &typev1.TrustRoots{Threshold: 1, Keys: []*typev1.RootKey{{Id: envelope.KeyID(rootPub), PublicKey: rootPub}}}
	ks := &typev1.Keyset{Version: 1, IssuedAt: timestamppb.New(now), ExpiresAt: timestamppb.New(now.Add(24 * time.Hour)),
		Keys: []*typev1.KeysetKey{{Id: envelope.KeyID(signPub), PublicKey: signPub, State: typev1.KeyState_KEY_STATE_ACTIVE,
			NotBefore: timestamppb.New(now.Add(-time.Hour)), NotAfter: timestamppb.New(now.Add(24 * time.Hour))}}}
	ksEnv, _, err := envelope.Seal(typev1.PayloadType_PAYLOAD_TYPE_KEYSET, ks)
	if err != nil {
		return nil, err
	}
	if err := envelope.SignWith(ksEnv, root); err != nil {
		return nil, err
	}
	ring, err := verify.Keyset(roots, ksEnv)
	if err != nil {
		return nil, err
	}
	const node = "bench-node"
	fp := names.FingerprintFromHex(strings.Repeat("a1", 32))
	var rs []*typev1.Resource
	for i := 0; i < 24; i++ {
		rs = append(rs, &typev1.Resource{Id: fmt.Sprintf("web:f%02d", i), Module: "web", Type: typev1.ResourceType_RESOURCE_TYPE_FILE,
			Path: fmt.Sprintf("/etc/web/f%02d", i), Mode: 0o644, Owner: "root", Group: "root",
			Content: &typev1.Resource_Inline{Inline: []byte(strings.Repeat("x", 480))}})
	}
	env, digest, err := envelope.Seal(typev1.PayloadType_PAYLOAD_TYPE_COMPOSITION, &typev1.Composition{Node: node, Module: "web", Fingerprint: fp, Resources: rs})
	if err != nil {
		return nil, err
	}
	if err := envelope.SignWith(env, signing); err != nil {
		return nil, err
	}
	key, err := names.CompositionKey(node, "web", fp)
	if err != nil {
		return nil, err
	}
	want := &typev1.Want{Module: "web", Fingerprint: fp, CompositionKey: key, CompositionDigest: digest}
	f := &VerifyFixture{ring: ring, env: env, want: want, node: node, now: now}
	return f, f.Verify()
}

// Size is the composition's size in bytes (its canonical payload).
func (f *VerifyFixture) Size() int { return len(f.env.GetPayload()) }

// Verify does what the engine does with a fetched composition before it
// may apply it: digest against the want, signature by a keyset key,
// decode, node/module/fingerprint against the want, and lint.
func (f *VerifyFixture) Verify() error {
	c, err := f.ring.Composition(f.env, f.node, f.want, f.now)
	if err != nil {
		return err
	}
	return lint.CheckComposition(c)
}

// VerifyCost returns the mean time of one Verify over at least n calls and
// at least d.
func VerifyCost(n int, d time.Duration) (time.Duration, int, error) {
	f, err := NewVerifyFixture()
	if err != nil {
		return 0, 0, err
	}
	start := time.Now()
	calls := 0
	for calls < n || time.Since(start) < d {
		if err := f.Verify(); err != nil {
			return 0, 0, err
		}
		calls++
	}
	return time.Since(start) / time.Duration(calls), f.Size(), nil
}
