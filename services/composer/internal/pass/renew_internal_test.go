package pass

import (
	"crypto/ed25519"
	"fmt"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"mesh.dev/internal/envelope"
	"mesh.dev/internal/testutil"
	"mesh.dev/internal/verify"
	composerv1 "mesh.dev/proto/mesh/composer/v1"
	typev1 "mesh.dev/proto/mesh/type/v1"
)

type fakeTrust struct {
	ring *verify.Keyring
	id   string
}

func (f fakeTrust) Keyring() *verify.Keyring { return f.ring }
func (f fakeTrust) SigningKeyID() string     { return f.id }
func (fakeTrust) Stale()                     {}

func manifestAt(node string, rev uint64, issued time.Time, life time.Duration) *typev1.Manifest {
	return &typev1.Manifest{Node: node, Revision: rev, IssuedAt: timestamppb.New(issued), ExpiresAt: timestamppb.New(issued.Add(life))}
}

// TestRenewAt checks the renewal point of DESIGN.md §5.4: once less than
// half the lifetime is left, at a point of the next quarter spread evenly
// across a fleet's manifests — and, for one manifest, the same point every
// time it is computed (every pass, every replica).
func TestRenewAt(t *testing.T) {
	t.Parallel()
	issued := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	life := 24 * time.Hour
	const samples, bins = 2000, 8
	var count [bins]int
	for i := range samples {
		node := fmt.Sprintf("node-%d", i%500)
		m := manifestAt(node, 1_800_000_000_000+uint64(i), issued, life)
		at := renewAt(node, m).Sub(issued)
		if at < life/2 || at >= life*3/4 {
			t.Fatalf("%s renews %s after issue, outside [%s, %s)", node, at, life/2, life*3/4)
		}
		if again := renewAt(node, proto.Clone(m).(*typev1.Manifest)).Sub(issued); again != at {
			t.Fatalf("%s r%d renews at %s, then at %s", node, m.GetRevision(), at, again)
		}
		count[int((at-life/2)*bins/(life/4))]++
	}
	// Evenly spread: each eighth of the quarter holds about 1/8 of the
	// renewals (a loose bound; a uniform draw misses it with negligible
	// probability).
	for i, n := range count {
		if n < samples/bins/2 || n > samples/bins*3/2 {
			t.Errorf("renewals by eighth of the window %v: eighth %d holds %d of %d", count, i, n, samples)
			break
		}
	}
}

// TestNeedsCommit checks when a pass commits (changes) and when it signs the
// manifest again although nothing changed (renewal, a newer keyset, another
// signing key, an engine's high-water above the held revision, a revision
// conflict the engine reports — once), with an injected clock.
func TestNeedsCommit(t *testing.T) {
	t.Parallel()
	tr := testutil.NewTrust(t, 1, 1)
	ring, err := verify.Keyset(tr.Roots, tr.KeysetEnvelope)
	if err != nil {
		t.Fatal(err)
	}
	keyID := envelope.KeyID(tr.SigningKey.Public().(ed25519.PublicKey))
	issued := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	want := &typev1.Want{Module: "motd", Fingerprint: "fp1:" + strings.Repeat("a", 64), CompositionKey: "ace.motd." + strings.Repeat("a", 64), CompositionDigest: "sha256:" + strings.Repeat("1", 64)}
	hold := &composerv1.Hold{Module: "sshd", Reason: "pinned"}
	m := manifestAt("ace", 100, issued, 24*time.Hour)
	m.KeysetVersion = ring.Version()
	m.Wants = []*typev1.Want{want}
	env, digest := tr.Sign(t, typev1.PayloadType_PAYLOAD_TYPE_MANIFEST, m)
	asg := &composerv1.Assignment{Node: "ace", Wants: []*typev1.Want{want}, Holds: []*composerv1.Hold{hold}, Manifest: env, ManifestDigest: digest, ManifestRevision: 100}
	renew := renewAt("ace", m)
	conflict := func(highWater uint64) *composerv1.HaveRecord {
		return &composerv1.HaveRecord{HighWater: highWater, Applied: &composerv1.ManifestRef{Revision: 90, Digest: "sha256:old"}, Haves: []*composerv1.Have{{Module: "motd",
			Attempt: &composerv1.Attempt{State: composerv1.AttemptState_ATTEMPT_STATE_FAILED, ReasonCode: composerv1.ReasonCode_REASON_CODE_REVISION_CONFLICT}}}}
	}
	other := &typev1.Want{Module: "motd", Fingerprint: want.GetFingerprint(), CompositionKey: want.GetCompositionKey(), CompositionDigest: "sha256:" + strings.Repeat("2", 64)}
	cases := []struct {
		name            string
		asg             *composerv1.Assignment
		wants           []*typev1.Want
		holds           []*composerv1.Hold
		haves           *composerv1.HaveRecord
		now             time.Time
		signingKey      string
		changes, resign bool
	}{
		{name: "nothing changed", asg: asg, now: renew.Add(-time.Second)},
		{name: "no assignment yet", now: issued, changes: true, resign: true},
		{name: "wants differ", asg: asg, wants: []*typev1.Want{other}, now: issued, changes: true, resign: true},
		{name: "holds differ", asg: asg, holds: []*composerv1.Hold{}, now: issued, changes: true},
		{name: "renewal due", asg: asg, now: renew, resign: true},
		{name: "signed by a key the signer no longer uses", asg: asg, now: issued, signingKey: "other-key", resign: true},
		{name: "engine high-water above the held revision", asg: asg, now: issued, haves: &composerv1.HaveRecord{HighWater: 101}, resign: true},
		{name: "engine high-water at the held revision", asg: asg, now: issued, haves: &composerv1.HaveRecord{HighWater: 100}},
		{name: "engine reports a revision conflict at the held revision", asg: asg, now: issued, haves: conflict(100), resign: true},
		// The held manifest (100) was signed above the high-water of the
		// report: answered already, not signed again each pass.
		{name: "a revision conflict answered already", asg: asg, now: issued, haves: conflict(99)},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			id := keyID
			if tc.signingKey != "" {
				id = tc.signingKey
			}
			p := New(Config{Now: func() time.Time { return tc.now }, Trust: fakeTrust{ring: ring, id: id}})
			wants, holds := tc.wants, tc.holds
			if wants == nil {
				wants = asg.GetWants()
			}
			if holds == nil {
				holds = asg.GetHolds()
			}
			st := &nodeState{spec: &composerv1.NodeSpec{Node: "ace"}, assignment: tc.asg, haves: tc.haves}
			changes, resign := p.needsCommit(st, wants, holds, nil)
			if changes != tc.changes || resign != tc.resign {
				t.Errorf("needsCommit = changes %v resign %v, want %v %v", changes, resign, tc.changes, tc.resign)
			}
		})
	}
}
