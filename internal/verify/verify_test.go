package verify_test

import (
	"crypto/ed25519"
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"mesh.dev/internal/envelope"
	"mesh.dev/internal/names"
	"mesh.dev/internal/testutil"
	"mesh.dev/internal/verify"
	typev1 "mesh.dev/proto/mesh/type/v1"
)

var fp = names.FingerprintPrefix + strings.Repeat("1f", 32)

func composition(node string) *typev1.Composition {
	return &typev1.Composition{
		Node: node, Module: "sshd", Fingerprint: fp,
		Resources: []*typev1.Resource{{Id: "sshd:config", Module: "sshd", Type: typev1.ResourceType_RESOURCE_TYPE_FILE,
			Path: "/etc/ssh/sshd_config", Mode: 0o600, Content: &typev1.Resource_Inline{Inline: []byte("Port 22\n")}}},
	}
}

func manifestFor(node string, revision uint64, issued, expires time.Time, wants ...*typev1.Want) *typev1.Manifest {
	return &typev1.Manifest{Node: node, Revision: revision, IssuedAt: timestamppb.New(issued), ExpiresAt: timestamppb.New(expires), KeysetVersion: 1, Wants: wants}
}

func TestKeysetChain(t *testing.T) {
	t.Parallel()
	tr := testutil.NewTrust(t, 3, 2)
	stranger := testutil.NewKey(t)

	tampered := proto.Clone(tr.KeysetEnvelope).(*typev1.Envelope)
	tampered.Payload[len(tampered.Payload)-1] ^= 1

	badSig := proto.Clone(tr.KeysetEnvelope).(*typev1.Envelope)
	for _, s := range badSig.Signatures {
		s.Signature[0] ^= 1
	}

	otherRoots := testutil.NewTrust(t, 2, 1)

	cases := []struct {
		name  string
		roots *typev1.TrustRoots
		env   *typev1.Envelope
		want  error
	}{
		{"all roots", tr.Roots, tr.KeysetEnvelope, nil},
		{"threshold exactly", tr.Roots, tr.SignKeyset(t, tr.Keyset, tr.RootKeys[0], tr.RootKeys[2]), nil},
		{"one root short", tr.Roots, tr.SignKeyset(t, tr.Keyset, tr.RootKeys[1]), verify.ErrKeyset},
		{"same root twice counts once", tr.Roots, tr.SignKeyset(t, tr.Keyset, tr.RootKeys[1], tr.RootKeys[1]), verify.ErrKeyset},
		{"signed by a stranger", tr.Roots, tr.SignKeyset(t, tr.Keyset, stranger, tr.RootKeys[0]), verify.ErrKeyset},
		{"tampered bytes", tr.Roots, tampered, verify.ErrKeyset},
		{"tampered signatures", tr.Roots, badSig, verify.ErrKeyset},
		{"other roots pinned", otherRoots.Roots, tr.KeysetEnvelope, verify.ErrKeyset},
		{"threshold above n", &typev1.TrustRoots{Threshold: 4, Keys: tr.Roots.Keys}, tr.KeysetEnvelope, verify.ErrRoots},
		{"root id not derived", &typev1.TrustRoots{Threshold: 1, Keys: []*typev1.RootKey{{Id: "k1:0000000000000000", PublicKey: tr.Roots.Keys[0].PublicKey}}}, tr.KeysetEnvelope, verify.ErrRoots},
		{"manifest posing as keyset", tr.Roots, func() *typev1.Envelope {
			e := proto.Clone(tr.KeysetEnvelope).(*typev1.Envelope)
			e.PayloadType = typev1.PayloadType_PAYLOAD_TYPE_MANIFEST
			return e
		}(), verify.ErrKeyset},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			ring, err := verify.Keyset(c.roots, c.env)
			if c.want == nil {
				if err != nil {
					t.Fatalf("Keyset: %v", err)
				}
				if ring.Version() != 1 {
					t.Errorf("version %d", ring.Version())
				}
				return
			}
			if !errors.Is(err, c.want) {
				t.Fatalf("Keyset error = %v, want %v", err, c.want)
			}
		})
	}
}

func TestManifestVerification(t *testing.T) {
	t.Parallel()
	tr := testutil.NewTrust(t, 1, 1)
	now := time.Now()
	compEnv, compDigest := tr.Sign(t, typev1.PayloadType_PAYLOAD_TYPE_COMPOSITION, composition("ace"))
	_ = compEnv
	want := &typev1.Want{Module: "sshd", Fingerprint: fp, CompositionKey: "ace.sshd." + names.FingerprintHex(fp), CompositionDigest: compDigest}
	good := manifestFor("ace", 10, now, now.Add(24*time.Hour), want)

	ring, err := verify.Keyset(tr.Roots, tr.KeysetEnvelope)
	if err != nil {
		t.Fatal(err)
	}
	retiredKey := testutil.NewKey(t)
	retiredLiveKey := testutil.NewKey(t)
	revokedKey := testutil.NewKey(t)
	ks2 := proto.Clone(tr.Keyset).(*typev1.Keyset)
	ks2.Version = 2
	ks2.RevisionFloor = 5
	ks2.Keys = append(ks2.Keys,
		testutil.KeysetKeyOf(retiredKey, typev1.KeyState_KEY_STATE_RETIRED, now.Add(-48*time.Hour), now.Add(-time.Minute)),
		testutil.KeysetKeyOf(retiredLiveKey, typev1.KeyState_KEY_STATE_RETIRED, now.Add(-48*time.Hour), now.Add(time.Minute)),
		testutil.KeysetKeyOf(revokedKey, typev1.KeyState_KEY_STATE_REVOKED, now.Add(-48*time.Hour), now.Add(48*time.Hour)))
	ring2, err := verify.Keyset(tr.Roots, tr.SignKeyset(t, ks2, tr.RootKeys...))
	if err != nil {
		t.Fatal(err)
	}

	signed := func(m *typev1.Manifest) *typev1.Envelope {
		env, _ := tr.Sign(t, typev1.PayloadType_PAYLOAD_TYPE_MANIFEST, m)
		return env
	}
	byKey := func(key ed25519.PrivateKey, m *typev1.Manifest) *typev1.Envelope {
		env, _, err := envelope.Seal(typev1.PayloadType_PAYLOAD_TYPE_MANIFEST, m)
		if err != nil {
			t.Fatal(err)
		}
		if err := envelope.SignWith(env, key); err != nil {
			t.Fatal(err)
		}
		return env
	}
	tamper := func(env *typev1.Envelope, f func(*typev1.Envelope)) *typev1.Envelope {
		e := proto.Clone(env).(*typev1.Envelope)
		f(e)
		return e
	}
	badWants := manifestFor("ace", 10, now, now.Add(time.Hour), &typev1.Want{Module: "sshd", Fingerprint: fp, CompositionKey: "bob.sshd." + names.FingerprintHex(fp), CompositionDigest: compDigest})

	cases := []struct {
		name string
		ring *verify.Keyring
		env  *typev1.Envelope
		node string
		want error
	}{
		{"good", ring, signed(good), "ace", nil},
		{"tampered payload", ring, tamper(signed(good), func(e *typev1.Envelope) { e.Payload[3] ^= 0x40 }), "ace", verify.ErrSignature},
		{"tampered signature", ring, tamper(signed(good), func(e *typev1.Envelope) { e.Signatures[0].Signature[5] ^= 1 }), "ace", verify.ErrSignature},
		{"tampered key id", ring, tamper(signed(good), func(e *typev1.Envelope) { e.Signatures[0].KeyId = "k1:ffffffffffffffff" }), "ace", verify.ErrUnknownKey},
		{"no signature", ring, tamper(signed(good), func(e *typev1.Envelope) { e.Signatures = nil }), "ace", verify.ErrSignature},
		{"key not in keyset", ring, byKey(testutil.NewKey(t), good), "ace", verify.ErrUnknownKey},
		{"other node's manifest", ring, signed(good), "bob", verify.ErrNode},
		{"expired beyond skew", ring, signed(manifestFor("ace", 10, now.Add(-48*time.Hour), now.Add(-61*time.Minute), want)), "ace", verify.ErrExpired},
		{"expired within skew", ring, signed(manifestFor("ace", 10, now.Add(-48*time.Hour), now.Add(-59*time.Minute), want)), "ace", nil},
		{"fast-forward", ring, signed(manifestFor("ace", 10, now.Add(25*time.Hour), now.Add(50*time.Hour), want)), "ace", verify.ErrFastForward},
		{"revision fast-forward", ring, signed(manifestFor("ace", uint64(now.Add(verify.MaxAhead+time.Second).UnixMilli()), now, now.Add(time.Hour), want)), "ace", verify.ErrFastForward},
		{"largest revision", ring, signed(manifestFor("ace", math.MaxUint64, now, now.Add(time.Hour), want)), "ace", verify.ErrFastForward},
		{"revision within a day ahead", ring, signed(manifestFor("ace", uint64(now.Add(verify.MaxAhead-time.Second).UnixMilli()), now, now.Add(time.Hour), want)), "ace", nil},
		{"composition posing as manifest", ring, tamper(compEnv, func(e *typev1.Envelope) { e.PayloadType = typev1.PayloadType_PAYLOAD_TYPE_MANIFEST }), "ace", verify.ErrSignature},
		{"retired key past not_after", ring2, byKey(retiredKey, good), "ace", verify.ErrKeyNotValid},
		{"retired key before not_after", ring2, byKey(retiredLiveKey, good), "ace", nil},
		{"revoked key", ring2, byKey(revokedKey, good), "ace", verify.ErrRevoked},
		{"below revision floor", ring2, signed(manifestFor("ace", 4, now, now.Add(time.Hour), want)), "ace", verify.ErrBelowFloor},
		{"want naming another node", ring, signed(badWants), "ace", verify.ErrPayload},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			m, digest, err := c.ring.Manifest(c.env, c.node, now)
			if c.want == nil {
				if err != nil {
					t.Fatalf("Manifest: %v", err)
				}
				if m.GetRevision() == 0 || !names.ValidDigest(digest) {
					t.Errorf("manifest %v digest %q", m, digest)
				}
				return
			}
			if !errors.Is(err, c.want) {
				t.Fatalf("Manifest error = %v, want %v", err, c.want)
			}
		})
		// Recheck of what Verify accepted agrees with Manifest.
		keyID, verr := c.ring.Verify(c.env, typev1.PayloadType_PAYLOAD_TYPE_MANIFEST, now)
		if verr != nil {
			continue
		}
		t.Run(c.name+"/recheck", func(t *testing.T) {
			t.Parallel()
			m := &typev1.Manifest{}
			if err := envelope.Open(c.env, typev1.PayloadType_PAYLOAD_TYPE_MANIFEST, m); err != nil {
				t.Fatal(err)
			}
			err := c.ring.Recheck(keyID, m, c.node, now)
			if (c.want == nil) != (err == nil) || (c.want != nil && !errors.Is(err, c.want)) {
				t.Fatalf("Recheck error = %v, want %v", err, c.want)
			}
		})
	}
	// Later, the key it was verified with is past its not_after; a key
	// the keyring does not hold is unknown.
	m := &typev1.Manifest{}
	if err := envelope.Open(byKey(retiredLiveKey, good), typev1.PayloadType_PAYLOAD_TYPE_MANIFEST, m); err != nil {
		t.Fatal(err)
	}
	keyID, err := ring2.Verify(byKey(retiredLiveKey, good), typev1.PayloadType_PAYLOAD_TYPE_MANIFEST, now)
	if err != nil {
		t.Fatal(err)
	}
	if err := ring2.Recheck(keyID, m, "ace", now.Add(2*time.Minute)); !errors.Is(err, verify.ErrKeyNotValid) {
		t.Errorf("Recheck after the key's not_after = %v, want %v", err, verify.ErrKeyNotValid)
	}
	if err := ring.Recheck(keyID, m, "ace", now); !errors.Is(err, verify.ErrUnknownKey) {
		t.Errorf("Recheck by a keyring without the key = %v, want %v", err, verify.ErrUnknownKey)
	}
}

func TestCompositionVerification(t *testing.T) {
	t.Parallel()
	tr := testutil.NewTrust(t, 1, 1)
	ring, err := verify.Keyset(tr.Roots, tr.KeysetEnvelope)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	env, digest := tr.Sign(t, typev1.PayloadType_PAYLOAD_TYPE_COMPOSITION, composition("ace"))
	want := &typev1.Want{Module: "sshd", Fingerprint: fp, CompositionKey: "ace.sshd." + names.FingerprintHex(fp), CompositionDigest: digest}

	otherFP := names.FingerprintPrefix + strings.Repeat("2e", 32)
	cases := []struct {
		name string
		env  *typev1.Envelope
		node string
		want *typev1.Want
		err  error
	}{
		{"good", env, "ace", want, nil},
		{"digest mismatch", env, "ace", &typev1.Want{Module: "sshd", Fingerprint: fp, CompositionDigest: names.Digest([]byte("x"))}, verify.ErrDigest},
		{"other node", env, "bob", want, verify.ErrNode},
		{"want of another fingerprint", env, "ace", &typev1.Want{Module: "sshd", Fingerprint: otherFP, CompositionDigest: digest}, verify.ErrWant},
		{"want of another module", env, "ace", &typev1.Want{Module: "motd", Fingerprint: fp, CompositionDigest: digest}, verify.ErrWant},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			got, err := ring.Composition(c.env, c.node, c.want, now)
			if c.err == nil {
				if err != nil || got.GetModule() != "sshd" {
					t.Fatalf("Composition = %v, %v", got, err)
				}
				return
			}
			if !errors.Is(err, c.err) {
				t.Fatalf("Composition error = %v, want %v", err, c.err)
			}
		})
	}
}
