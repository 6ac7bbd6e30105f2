package verify_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"mesh.dev/internal/envelope"
	"mesh.dev/internal/names"
	"mesh.dev/internal/testutil"
	"mesh.dev/internal/verify"
	typev1 "mesh.dev/proto/mesh/type/v1"
)

// fuzzNow is the verifier's clock in the fuzz targets: fixed, so that the
// committed corpus of signed envelopes keeps its meaning.
var fuzzNow = time.Date(2026, 6, 1, 12, 0, 0, 0, time.UTC)

// fuzzWorld is a fixed chain of trust and the payloads it genuinely signed:
// a fuzz target may accept only those, whatever bytes it is given.
type fuzzWorld struct {
	trust *testutil.Trust
	ring  *verify.Keyring
	// signed holds the payloads signed by the signing key (manifests,
	// compositions) or by at least threshold roots (keysets), by type.
	signed map[typev1.PayloadType]map[string]bool
}

func newFuzzWorld(t testing.TB) *fuzzWorld {
	tr := testutil.FixedTrust(t, "verify-fuzz", 3, 2, fuzzNow)
	ring, err := verify.Keyset(tr.Roots, tr.KeysetEnvelope)
	if err != nil {
		t.Fatal(err)
	}
	w := &fuzzWorld{trust: tr, ring: ring, signed: map[typev1.PayloadType]map[string]bool{}}
	w.note(typev1.PayloadType_PAYLOAD_TYPE_KEYSET, tr.KeysetEnvelope)
	return w
}

func (w *fuzzWorld) note(pt typev1.PayloadType, env *typev1.Envelope) {
	if w.signed[pt] == nil {
		w.signed[pt] = map[string]bool{}
	}
	w.signed[pt][string(env.GetPayload())] = true
}

// sign seals m and signs it with the online key, noting the payload.
func (w *fuzzWorld) sign(t testing.TB, pt typev1.PayloadType, m proto.Message) *typev1.Envelope {
	env, _ := w.trust.Sign(t, pt, m)
	w.note(pt, env)
	return env
}

// keyset signs a keyset with the given roots, noting it only when enough
// roots signed.
func (w *fuzzWorld) keyset(t testing.TB, ks *typev1.Keyset, roots int) *typev1.Envelope {
	env := w.trust.SignKeyset(t, ks, w.trust.RootKeys[:roots]...)
	if roots >= int(w.trust.Roots.GetThreshold()) {
		w.note(typev1.PayloadType_PAYLOAD_TYPE_KEYSET, env)
	}
	return env
}

func marshal(t testing.TB, m proto.Message) []byte {
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

var fuzzFP = names.FingerprintPrefix + strings.Repeat("5e", 32)

func fuzzComposition(node, module string) *typev1.Composition {
	if module == names.NodeModule {
		return &typev1.Composition{Node: node, Module: module, Resources: []*typev1.Resource{
			{Id: "net:conf", Type: typev1.ResourceType_RESOURCE_TYPE_FILE, Path: "/etc/net.conf", Content: &typev1.Resource_Inline{Inline: []byte("mtu 1400\n")}},
		}, Adoption: []string{"/etc/hosts"}}
	}
	return &typev1.Composition{Node: node, Module: module, Fingerprint: fuzzFP, Resources: []*typev1.Resource{
		{Id: module + ":dir", Module: module, Type: typev1.ResourceType_RESOURCE_TYPE_DIRECTORY, Path: "/etc/" + module, Mode: 0o755},
		{Id: module + ":conf", Module: module, Type: typev1.ResourceType_RESOURCE_TYPE_FILE, Path: "/etc/" + module + "/conf", Mode: 0o600,
			Content: &typev1.Resource_Inline{Inline: []byte("Port 22\n")}},
		{Id: module + ":link", Module: module, Type: typev1.ResourceType_RESOURCE_TYPE_SYMLINK, Path: "/etc/" + module + "/z", Target: "conf"},
	}}
}

func wantOf(t testing.TB, node string, env *typev1.Envelope, c *typev1.Composition) *typev1.Want {
	key, err := names.CompositionKey(node, c.GetModule(), c.GetFingerprint())
	if err != nil {
		t.Fatal(err)
	}
	return &typev1.Want{Module: c.GetModule(), Fingerprint: c.GetFingerprint(), CompositionKey: key, CompositionDigest: envelope.Digest(env)}
}

// withUnknownField returns m's canonical bytes with an unknown field added.
func withUnknownField(t testing.TB, m proto.Message) []byte {
	b := marshal(t, m)
	b = protowire.AppendTag(b, 999, protowire.BytesType)
	return protowire.AppendBytes(b, []byte("hidden meaning"))
}

// checkSentinel fails unless err wraps one of the package's sentinels, as
// its doc promises (callers map them to reason codes).
func checkSentinel(t *testing.T, err error) {
	t.Helper()
	for _, s := range []error{verify.ErrRoots, verify.ErrKeyset, verify.ErrKeysetExpired, verify.ErrUnknownKey, verify.ErrRevoked,
		verify.ErrKeyNotValid, verify.ErrSignature, verify.ErrPayload, verify.ErrNode, verify.ErrExpired, verify.ErrFastForward,
		verify.ErrBelowFloor, verify.ErrDigest, verify.ErrWant} {
		if errors.Is(err, s) {
			return
		}
	}
	t.Fatalf("error %q wraps none of verify's sentinels", err)
}

// keysetSeeds are keyset envelopes: good, one root short, tampered,
// malformed keys, unknown fields and another payload type.
func keysetSeeds(t testing.TB, w *fuzzWorld) [][]byte {
	tr := w.trust
	ks := proto.Clone(tr.Keyset).(*typev1.Keyset)
	v2 := proto.Clone(ks).(*typev1.Keyset)
	v2.Version = 2
	v2.Keys = append(v2.Keys, testutil.KeysetKeyOf(testutil.FixedKey("verify-fuzz retired"), typev1.KeyState_KEY_STATE_RETIRED, fuzzNow.Add(-time.Hour), fuzzNow.Add(time.Hour)))
	dup := proto.Clone(ks).(*typev1.Keyset)
	dup.Version = 3
	dup.Keys = append(dup.Keys, dup.Keys[0])
	unset := proto.Clone(ks).(*typev1.Keyset)
	unset.Version = 4
	unset.Keys[0].State = typev1.KeyState_KEY_STATE_UNSPECIFIED
	zero := proto.Clone(ks).(*typev1.Keyset)
	zero.Version = 0
	short := proto.Clone(ks).(*typev1.Keyset)
	short.Version = 5
	short.Keys[0].PublicKey = short.Keys[0].PublicKey[:31]
	unknownState := proto.Clone(ks).(*typev1.Keyset)
	unknownState.Version = 6
	unknownState.Keys[0].State = typev1.KeyState(42)
	tampered := proto.Clone(tr.KeysetEnvelope).(*typev1.Envelope)
	tampered.Payload[len(tampered.Payload)-1] ^= 1
	hidden := &typev1.Envelope{PayloadType: typev1.PayloadType_PAYLOAD_TYPE_KEYSET, Payload: withUnknownField(t, ks)}
	for _, r := range tr.RootKeys {
		if err := envelope.SignWith(hidden, r); err != nil {
			t.Fatal(err)
		}
	}
	asManifest := proto.Clone(tr.KeysetEnvelope).(*typev1.Envelope)
	asManifest.PayloadType = typev1.PayloadType_PAYLOAD_TYPE_MANIFEST
	out := [][]byte{
		marshal(t, tr.KeysetEnvelope),
		marshal(t, w.keyset(t, v2, 2)),
		marshal(t, w.keyset(t, v2, 1)),
		marshal(t, w.keyset(t, dup, 3)),
		marshal(t, w.keyset(t, unset, 3)),
		marshal(t, w.keyset(t, zero, 3)),
		marshal(t, w.keyset(t, short, 3)),
		marshal(t, w.keyset(t, unknownState, 3)),
		marshal(t, tampered),
		marshal(t, hidden),
		marshal(t, asManifest),
		{},
		[]byte("\x08\x03\x12\x02\xff\xff"),
	}
	return out
}

// FuzzKeyset feeds arbitrary bytes, and mutations of genuine keyset
// envelopes, to verify.Keyset: it must never panic, every refusal wraps a
// sentinel, and a keyset it accepts is one that threshold roots signed.
func FuzzKeyset(f *testing.F) {
	w := newFuzzWorld(f)
	seeds := testutil.NewFuzzSeeds(f)
	for _, b := range keysetSeeds(f, w) {
		seeds.Add(b)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		env := &typev1.Envelope{}
		if err := proto.Unmarshal(data, env); err != nil {
			return
		}
		ring, err := verify.Keyset(w.trust.Roots, env)
		if err != nil {
			checkSentinel(t, err)
			return
		}
		if !w.signed[typev1.PayloadType_PAYLOAD_TYPE_KEYSET][string(env.GetPayload())] {
			t.Fatalf("accepted a keyset payload no threshold of roots signed: %x", env.GetPayload())
		}
		if ring.Version() == 0 || ring.Digest() != envelope.Digest(env) {
			t.Fatalf("accepted keyset version %d digest %s", ring.Version(), ring.Digest())
		}
		ring.Expired(fuzzNow)
		for _, k := range ring.Keyset().GetKeys() {
			if _, ok := ring.Key(k.GetId()); !ok {
				t.Fatalf("key %s of the keyset is not found", k.GetId())
			}
		}
	})
}

// manifestSeeds are manifest envelopes: good, another node's, expired,
// issued too far ahead, malformed wants, unsigned, signed by a stranger,
// with unknown fields and of another payload type.
func manifestSeeds(t testing.TB, w *fuzzWorld) [][]byte {
	own := w.sign(t, typev1.PayloadType_PAYLOAD_TYPE_COMPOSITION, fuzzComposition("ace", names.NodeModule))
	mod := w.sign(t, typev1.PayloadType_PAYLOAD_TYPE_COMPOSITION, fuzzComposition("ace", "sshd"))
	wants := []*typev1.Want{wantOf(t, "ace", own, fuzzComposition("ace", names.NodeModule)), wantOf(t, "ace", mod, fuzzComposition("ace", "sshd"))}
	good := manifestFor("ace", 7, fuzzNow.Add(-time.Minute), fuzzNow.Add(24*time.Hour), wants...)
	other := manifestFor("bob", 7, fuzzNow.Add(-time.Minute), fuzzNow.Add(24*time.Hour))
	expired := manifestFor("ace", 8, fuzzNow.Add(-48*time.Hour), fuzzNow.Add(-2*time.Hour))
	ahead := manifestFor("ace", 9, fuzzNow.Add(25*time.Hour), fuzzNow.Add(48*time.Hour))
	unsorted := manifestFor("ace", 10, fuzzNow, fuzzNow.Add(time.Hour), wants[1], wants[0])
	badKey := proto.Clone(good).(*typev1.Manifest)
	badKey.Revision = 11
	badKey.Wants[1].CompositionKey = "bob.sshd." + strings.Repeat("5e", 32)
	stranger, _, err := envelope.Seal(typev1.PayloadType_PAYLOAD_TYPE_MANIFEST, good)
	if err != nil {
		t.Fatal(err)
	}
	if err := envelope.SignWith(stranger, testutil.FixedKey("stranger")); err != nil {
		t.Fatal(err)
	}
	unsigned, _, _ := envelope.Seal(typev1.PayloadType_PAYLOAD_TYPE_MANIFEST, good)
	hidden := &typev1.Envelope{PayloadType: typev1.PayloadType_PAYLOAD_TYPE_MANIFEST, Payload: withUnknownField(t, good)}
	if err := envelope.SignWith(hidden, w.trust.SigningKey); err != nil {
		t.Fatal(err)
	}
	goodEnv := w.sign(t, typev1.PayloadType_PAYLOAD_TYPE_MANIFEST, good)
	asComposition := proto.Clone(goodEnv).(*typev1.Envelope)
	asComposition.PayloadType = typev1.PayloadType_PAYLOAD_TYPE_COMPOSITION
	return [][]byte{
		marshal(t, goodEnv),
		marshal(t, w.sign(t, typev1.PayloadType_PAYLOAD_TYPE_MANIFEST, other)),
		marshal(t, w.sign(t, typev1.PayloadType_PAYLOAD_TYPE_MANIFEST, expired)),
		marshal(t, w.sign(t, typev1.PayloadType_PAYLOAD_TYPE_MANIFEST, ahead)),
		marshal(t, w.sign(t, typev1.PayloadType_PAYLOAD_TYPE_MANIFEST, unsorted)),
		marshal(t, w.sign(t, typev1.PayloadType_PAYLOAD_TYPE_MANIFEST, badKey)),
		marshal(t, stranger),
		marshal(t, unsigned),
		marshal(t, hidden),
		marshal(t, asComposition),
		marshal(t, w.sign(t, typev1.PayloadType_PAYLOAD_TYPE_MANIFEST, &typev1.Manifest{Node: "ace"})),
		{},
	}
}

// FuzzManifest feeds arbitrary bytes, and mutations of genuine signed
// manifests, to Keyring.Manifest for node ace: it must never panic, every
// refusal wraps a sentinel, and a manifest it accepts is one the signing
// key signed, of ace, unexpired, with well-formed wants.
func FuzzManifest(f *testing.F) {
	w := newFuzzWorld(f)
	seeds := testutil.NewFuzzSeeds(f)
	for _, b := range manifestSeeds(f, w) {
		seeds.Add(b)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		env := &typev1.Envelope{}
		if err := proto.Unmarshal(data, env); err != nil {
			return
		}
		m, digest, err := w.ring.Manifest(env, "ace", fuzzNow)
		if err != nil {
			checkSentinel(t, err)
			return
		}
		if !w.signed[typev1.PayloadType_PAYLOAD_TYPE_MANIFEST][string(env.GetPayload())] {
			t.Fatalf("accepted a manifest payload the signing key never signed: %x", env.GetPayload())
		}
		if m.GetNode() != "ace" || digest != names.Digest(env.GetPayload()) {
			t.Fatalf("accepted manifest of %q with digest %s", m.GetNode(), digest)
		}
		if fuzzNow.After(m.GetExpiresAt().AsTime().Add(verify.Skew)) {
			t.Fatalf("accepted a manifest that expired at %v", m.GetExpiresAt().AsTime())
		}
		for i, want := range m.GetWants() {
			k, err := names.ParseCompositionKey(want.GetCompositionKey())
			if err != nil || k.Node != "ace" {
				t.Fatalf("accepted want %d with key %q (%v)", i, want.GetCompositionKey(), err)
			}
		}
	})
}

// compositionSeeds pair composition envelopes with the want naming them.
func compositionSeeds(t testing.TB, w *fuzzWorld) [][2][]byte {
	var out [][2][]byte
	add := func(env *typev1.Envelope, want *typev1.Want) {
		out = append(out, [2][]byte{marshal(t, env), marshal(t, want)})
	}
	for _, module := range []string{"sshd", names.NodeModule} {
		c := fuzzComposition("ace", module)
		env := w.sign(t, typev1.PayloadType_PAYLOAD_TYPE_COMPOSITION, c)
		want := wantOf(t, "ace", env, c)
		add(env, want)
		// The same bytes against a want of another module or fingerprint.
		other := proto.Clone(want).(*typev1.Want)
		other.Module = "web"
		add(env, other)
		// Another node's composition whose digest the want names.
		bob := fuzzComposition("bob", module)
		bobEnv := w.sign(t, typev1.PayloadType_PAYLOAD_TYPE_COMPOSITION, bob)
		bobWant := proto.Clone(want).(*typev1.Want)
		bobWant.CompositionDigest = envelope.Digest(bobEnv)
		add(bobEnv, bobWant)
		// A replayed composition whose digest is not the want's.
		old := proto.Clone(c).(*typev1.Composition)
		old.Resources = old.Resources[:1]
		add(w.sign(t, typev1.PayloadType_PAYLOAD_TYPE_COMPOSITION, old), want)
		// Tampered bytes with the digest they now have.
		tampered := proto.Clone(env).(*typev1.Envelope)
		tampered.Payload[len(tampered.Payload)-2] ^= 0x20
		tw := proto.Clone(want).(*typev1.Want)
		tw.CompositionDigest = envelope.Digest(tampered)
		add(tampered, tw)
		// A manifest signature presented as a composition.
		asManifest := proto.Clone(env).(*typev1.Envelope)
		asManifest.PayloadType = typev1.PayloadType_PAYLOAD_TYPE_MANIFEST
		add(asManifest, want)
	}
	return out
}

// FuzzComposition feeds arbitrary envelopes and wants, and mutations of
// genuine pairs, to Keyring.Composition for node ace: it must never panic,
// every refusal wraps a sentinel, and a composition it accepts is one the
// signing key signed, of ace, whose digest, module and fingerprint are the
// want's.
func FuzzComposition(f *testing.F) {
	w := newFuzzWorld(f)
	seeds := testutil.NewFuzzSeeds(f)
	for _, p := range compositionSeeds(f, w) {
		seeds.Add(p[0], p[1])
	}
	f.Fuzz(func(t *testing.T, envBytes, wantBytes []byte) {
		env, want := &typev1.Envelope{}, &typev1.Want{}
		if proto.Unmarshal(envBytes, env) != nil || proto.Unmarshal(wantBytes, want) != nil {
			return
		}
		c, err := w.ring.Composition(env, "ace", want, fuzzNow)
		if err != nil {
			checkSentinel(t, err)
			return
		}
		if !w.signed[typev1.PayloadType_PAYLOAD_TYPE_COMPOSITION][string(env.GetPayload())] {
			t.Fatalf("accepted a composition payload the signing key never signed: %x", env.GetPayload())
		}
		if names.Digest(env.GetPayload()) != want.GetCompositionDigest() || c.GetNode() != "ace" ||
			c.GetModule() != want.GetModule() || c.GetFingerprint() != want.GetFingerprint() {
			t.Fatalf("accepted composition %s/%s/%s for want %v", c.GetNode(), c.GetModule(), c.GetFingerprint(), want)
		}
	})
}

// TestEveryBitFlipIsRefused flips every bit of genuine keyset, manifest and
// composition envelopes, one at a time: each mutation either leaves the
// signed payload as it was or is refused. It logs the figures the
// reliability table quotes.
func TestEveryBitFlipIsRefused(t *testing.T) {
	t.Parallel()
	w := newFuzzWorld(t)
	c := fuzzComposition("ace", "sshd")
	compEnv := w.sign(t, typev1.PayloadType_PAYLOAD_TYPE_COMPOSITION, c)
	want := wantOf(t, "ace", compEnv, c)
	manEnv := w.sign(t, typev1.PayloadType_PAYLOAD_TYPE_MANIFEST, manifestFor("ace", 3, fuzzNow, fuzzNow.Add(time.Hour), want))
	cases := []struct {
		name  string
		env   *typev1.Envelope
		check func(*typev1.Envelope) error
	}{
		{"keyset", w.trust.KeysetEnvelope, func(e *typev1.Envelope) error { _, err := verify.Keyset(w.trust.Roots, e); return err }},
		{"manifest", manEnv, func(e *typev1.Envelope) error { _, _, err := w.ring.Manifest(e, "ace", fuzzNow); return err }},
		{"composition", compEnv, func(e *typev1.Envelope) error { _, err := w.ring.Composition(e, "ace", want, fuzzNow); return err }},
	}
	total, refused := 0, 0
	for _, tc := range cases {
		good := marshal(t, tc.env)
		if err := tc.check(tc.env); err != nil {
			t.Fatalf("%s: the genuine envelope is refused: %v", tc.name, err)
		}
		for i := range good {
			for bit := 0; bit < 8; bit++ {
				b := append([]byte(nil), good...)
				b[i] ^= 1 << bit
				total++
				env := &typev1.Envelope{}
				if proto.Unmarshal(b, env) != nil {
					refused++
					continue
				}
				err := tc.check(env)
				if err != nil {
					refused++
					continue
				}
				if string(env.GetPayload()) != string(tc.env.GetPayload()) || env.GetPayloadType() != tc.env.GetPayloadType() {
					t.Errorf("%s: flipping bit %d of byte %d gives an accepted envelope with another payload", tc.name, bit, i)
				}
			}
		}
	}
	t.Logf("bit flips of signed envelopes: %d cases, %d refused, %d accepted with the payload unchanged (a spare root signature), 0 violations", total, refused, total-refused)
}
