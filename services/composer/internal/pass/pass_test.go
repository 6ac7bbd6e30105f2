package pass_test

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"mesh.dev/internal/envelope"
	"mesh.dev/internal/identity"
	"mesh.dev/internal/names"
	"mesh.dev/internal/natsx"
	composerv1 "mesh.dev/proto/mesh/composer/v1"
	signerv1 "mesh.dev/proto/mesh/signer/v1"
	typev1 "mesh.dev/proto/mesh/type/v1"
	ct "mesh.dev/services/composer/internal/composertest"
	"mesh.dev/services/composer/internal/pass"
	"mesh.dev/services/composer/internal/signing"
)

func TestMain(m *testing.M) {
	ct.RunChildIfAsked()
	os.Exit(m.Run())
}

// setup is a world with a manual composer that composed node ace placing
// motd once.
type setup struct {
	w   *ct.World
	c   *ct.Composer
	fp  string
	key string
	// first is the value the first pass wrote under key.
	first []byte
}

func newSetup(t *testing.T, opts ...ct.ComposerOption) *setup {
	t.Helper()
	w := ct.New(t)
	c := w.StartManual(t, "one", opts...)
	fp := w.Release(t, ct.Motd("1.0"), nil)
	ct.WaitFor(t, "registration seen", 10*time.Second, func() (bool, string) {
		r, ok := c.View.Registration("motd")
		return ok && r.GetFingerprint() == fp, "not yet"
	})
	c.PutNode(t, ct.Spec("ace", "motd"))
	if res := c.Pass(t, "ace"); res.Err != nil {
		t.Fatal(res.Err)
	}
	s := &setup{w: w, c: c, fp: fp, key: "ace.motd." + names.FingerprintHex(fp)}
	e, err := w.KV(t, natsx.BucketCompositions).Get(context.Background(), s.key)
	ct.Must(t, err)
	s.first = e.Value
	return s
}

// variants signs other compositions of the same key (other content of the
// same resource), as another writer of the key would have.
func (s *setup) variants(t *testing.T, n int) [][]byte {
	t.Helper()
	signer := signerv1.NewSignerServiceClient(s.w.As(t, s.w.SignerAddr, identity.RoleComposer, ""))
	var comps []*typev1.Composition
	for i := range n {
		comps = append(comps, &typev1.Composition{Node: "ace", Module: "motd", Fingerprint: s.fp, Resources: []*typev1.Resource{{
			Id: "motd:motd", Module: "motd", Type: ct.File, Path: "/etc/motd", Mode: 0o644,
			Content: &typev1.Resource_Inline{Inline: []byte(fmt.Sprintf("variant %d\n", i))},
		}}})
	}
	resp, err := signer.SignCompositions(context.Background(), &signerv1.SignCompositionsRequest{FencingEpoch: s.c.Lease.Epoch(), Compositions: comps})
	ct.Must(t, err)
	var out [][]byte
	for _, it := range resp.GetItems() {
		b, err := proto.MarshalOptions{Deterministic: true}.Marshal(it.GetEnvelope())
		ct.Must(t, err)
		out = append(out, b)
	}
	return out
}

func (s *setup) put(t *testing.T, value []byte) uint64 {
	rev, err := s.w.KV(t, natsx.BucketCompositions).Put(context.Background(), s.key, value)
	if err != nil {
		t.Error(err)
	}
	return rev
}

func digestOf(t *testing.T, value []byte) string {
	env := &typev1.Envelope{}
	ct.Must(t, proto.Unmarshal(value, env))
	return envelope.Digest(env)
}

// TestFollowLoop covers DESIGN.md §5.2 step 5: after keeping its judgement
// record the writer reads the composition again and, while another writer
// replaced it, judges and keeps that one instead; after 3 follows the
// composition fails with its words, and a key found deleted deletes its
// record and fails the composition (it is not held).
func TestFollowLoop(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name string
		// moves is how many re-reads find the key replaced.
		moves   int
		deleted bool
		err     string
	}{
		{name: "settles after 3 follows", moves: 3},
		{name: "moved 4 times", moves: 4, err: "%s moved under this writer 4 times; its digest is kept by the next pass"},
		{name: "deleted under the writer", deleted: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := newSetup(t)
			variants := s.variants(t, 4)
			// The pass keeps a record (it was deleted), so it follows.
			ct.Must(t, s.w.KV(t, natsx.BucketComposed).Delete(context.Background(), s.key))
			var followed []int
			pass.SetHooks(s.c.Passer, pass.Hooks{BeforeReread: func(key string, follow int) {
				if key != s.key {
					return
				}
				followed = append(followed, follow)
				switch {
				case tc.deleted:
					ct.Must(t, s.w.KV(t, natsx.BucketCompositions).Delete(context.Background(), s.key))
				case follow < tc.moves:
					s.put(t, variants[follow])
				}
			}})
			res := s.c.Pass(t, "ace")
			rec := &composerv1.JudgementRecord{}
			_, recErr := s.w.Get(t, natsx.BucketComposed, s.key, rec)
			switch {
			case tc.err != "":
				want := fmt.Sprintf(tc.err, s.key)
				if res.Err == nil || !strings.Contains(res.Err.Error(), want) {
					t.Fatalf("pass error %v, want %q", res.Err, want)
				}
				if res.Committed {
					t.Error("a failed pass committed an assignment")
				}
				if len(followed) != 4 {
					t.Errorf("re-read %d times, want 4", len(followed))
				}
			case tc.deleted:
				// Not held: the composition fails, and no assignment names
				// it (step 7).
				if want := s.key + " was deleted under this writer"; res.Err == nil || !strings.Contains(res.Err.Error(), want) {
					t.Fatalf("pass error %v, want %q", res.Err, want)
				}
				if res.Committed {
					t.Error("an assignment was committed naming a composition not held")
				}
				if recErr == nil {
					t.Errorf("the record of a deleted composition stayed: %v", rec)
				}
			default:
				if res.Err != nil {
					t.Fatal(res.Err)
				}
				last := digestOf(t, variants[tc.moves-1])
				if rec.GetDigest() != last {
					t.Errorf("record names %s, want the last writer's %s", rec.GetDigest(), last)
				}
				if res.Compositions[0].Digest != last {
					t.Errorf("the pass kept %s, want %s", res.Compositions[0].Digest, last)
				}
				if len(followed) != tc.moves+1 {
					t.Errorf("re-read %d times, want %d", len(followed), tc.moves+1)
				}
			}
		})
	}
}

// TestCASRetries covers DESIGN.md §5.2 step 4: a write conflicting with
// another writer re-reads and retries with an Update at the revision it read,
// a bounded number of times; a key that another writer gave this very
// composition is left alone. Never a blind overwrite.
func TestCASRetries(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name string
		// other writes before each of these attempts.
		interfere map[int]bool
		same      bool
		err       string
		// wantExpected is how the pass's own stored write was made:
		// "" none stored.
		stored bool
	}{
		{name: "another writer once: retried at its revision", interfere: map[int]bool{0: true}, stored: true},
		{name: "another writer wrote the same composition", interfere: map[int]bool{0: true}, same: true},
		{name: "another writer every time: bounded", interfere: map[int]bool{0: true, 1: true, 2: true, 3: true}, err: "write conflicted 4 times"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := newSetup(t)
			variants := s.variants(t, 4)
			// Corrupt the key so the next pass writes it again.
			s.put(t, []byte("corrupt"))
			var mu sync.Mutex
			last := map[int]uint64{}
			pass.SetHooks(s.c.Passer, pass.Hooks{BeforeWrite: func(key string, attempt int) {
				if key != s.key || !tc.interfere[attempt] {
					return
				}
				v := variants[attempt]
				if tc.same {
					v = s.first
				}
				mu.Lock()
				last[attempt] = s.put(t, v)
				mu.Unlock()
			}})
			rec := s.w.RecordWrites(t, natsx.BucketCompositions)
			res := s.c.Pass(t, "ace")
			var ours []ct.Write
			for _, wr := range rec.All() {
				if wr.Key == s.key && string(wr.Data) == string(s.first) && !tc.same {
					ours = append(ours, wr)
				}
			}
			e, err := s.w.KV(t, natsx.BucketCompositions).Get(context.Background(), s.key)
			ct.Must(t, err)
			switch {
			case tc.err != "":
				if res.Err == nil || !strings.Contains(res.Err.Error(), tc.err) {
					t.Fatalf("pass error %v, want %q", res.Err, tc.err)
				}
				if len(ours) != 0 || string(e.Value) != string(variants[3]) {
					t.Errorf("the pass overwrote another writer's value: %v", ours)
				}
			case tc.same:
				if res.Err != nil {
					t.Fatal(res.Err)
				}
				if n := len(rec.All()); n != 1 {
					t.Errorf("%d writes; the pass wrote the composition another writer had written", n-1)
				}
			default:
				if res.Err != nil {
					t.Fatal(res.Err)
				}
				if len(ours) != 1 || ours[0].Expected != fmt.Sprint(last[0]) {
					t.Errorf("the pass wrote %v, want one Update at r%d", ours, last[0])
				}
			}
		})
	}
}

// TestPausedLeaderCannotSign covers DESIGN.md §5.2 step 9: a composer that
// checked its lease and then paused (its renewals stopped) finds, once
// another composer took over and fenced, that the signer refuses its sign
// requests with FAILED_PRECONDITION; it writes nothing.
func TestPausedLeaderCannotSign(t *testing.T) {
	t.Parallel()
	s := newSetup(t, ct.WithLeaseTTL(3*time.Second))
	v2 := s.w.Release(t, ct.Motd("2.0"), nil)
	ct.WaitFor(t, "v2 seen", 10*time.Second, func() (bool, string) {
		r, _ := s.c.View.Registration("motd")
		return r.GetFingerprint() == v2, "not yet"
	})
	reached, resume := make(chan struct{}), make(chan struct{})
	pass.SetHooks(s.c.Passer, pass.Hooks{BeforeSign: func([]string) {
		close(reached)
		<-resume
	}})
	done := make(chan *pass.Result, 1)
	go func() {
		res, err := s.c.Passer.Run(context.Background(), "ace", pass.Write, nil)
		if res == nil {
			res = &pass.Result{Err: err}
		}
		done <- res
	}()
	<-reached
	oldEpoch := s.c.Lease.Epoch()
	s.c.PauseLease()
	rec := s.w.RecordWrites(t, natsx.BucketCompositions, natsx.BucketComposed, natsx.BucketAssignments)
	b := s.w.StartManual(t, "two", ct.WithLeaseTTL(3*time.Second))
	if b.Lease.Epoch() <= oldEpoch {
		t.Fatalf("the new leader's epoch %d is not above %d", b.Lease.Epoch(), oldEpoch)
	}
	close(resume)
	res := <-done
	if res.Err == nil || !strings.Contains(res.Err.Error(), codes.FailedPrecondition.String()) ||
		!strings.Contains(res.Err.Error(), fmt.Sprintf("fencing epoch %d is below", oldEpoch)) {
		t.Fatalf("the paused leader's pass: %v", res.Err)
	}
	if got := rec.All(); len(got) != 0 {
		t.Errorf("the paused leader wrote %v", got)
	}
	_ = status.Code
}

// TestRenewal covers DESIGN.md §5.4: a manifest is renewed once less than
// half its lifetime is left, at a point of the next quarter; a renewal
// changes only revision and times.
func TestRenewal(t *testing.T) {
	t.Parallel()
	s := newSetup(t)
	a1, _, err := s.w.Assignment(t, "ace")
	ct.Must(t, err)
	m1, err := s.w.CheckAssignment(t, a1)
	ct.Must(t, err)
	issued, life := m1.GetIssuedAt().AsTime(), m1.GetExpiresAt().AsTime().Sub(m1.GetIssuedAt().AsTime())
	at := func(frac float64) func() time.Time {
		return func() time.Time { return issued.Add(time.Duration(float64(life) * frac)) }
	}
	pass.SetNow(s.c.Passer, at(0.499))
	if res := s.c.Pass(t, "ace"); res.Err != nil || res.Committed {
		t.Fatalf("a pass before half the lifetime renewed (committed %v, %v)", res.Committed, res.Err)
	}
	pass.SetNow(s.c.Passer, at(0.751))
	res := s.c.Pass(t, "ace")
	if res.Err != nil || !res.Committed {
		t.Fatalf("a pass after three quarters of the lifetime did not renew (%v)", res.Err)
	}
	pass.SetNow(s.c.Passer, time.Now)
	a2, _, err := s.w.Assignment(t, "ace")
	ct.Must(t, err)
	m2, err := s.w.CheckAssignment(t, a2)
	ct.Must(t, err)
	if m2.GetRevision() <= m1.GetRevision() || !proto.Equal(&typev1.Manifest{Wants: m1.GetWants(), Node: m1.GetNode(), KeysetVersion: m1.GetKeysetVersion()},
		&typev1.Manifest{Wants: m2.GetWants(), Node: m2.GetNode(), KeysetVersion: m2.GetKeysetVersion()}) {
		t.Errorf("renewal changed more than revision and times:\n%v\n%v", m1, m2)
	}
	if !proto.Equal(a1.GetInputs(), a2.GetInputs()) && a1.GetInputs().GetSpecRevision() != a2.GetInputs().GetSpecRevision() {
		t.Errorf("inputs %v → %v", a1.GetInputs(), a2.GetInputs())
	}
	if !proto.Equal(&composerv1.Assignment{Wants: a1.GetWants(), Holds: a1.GetHolds(), Moved: a1.GetMoved()}, &composerv1.Assignment{Wants: a2.GetWants(), Holds: a2.GetHolds(), Moved: a2.GetMoved()}) {
		t.Error("renewal changed wants, holds or moved")
	}
}

// TestPruneKeepsTheAppliedManifest covers the keep set of DESIGN.md §5.2
// step 8 beyond the wants: the compositions of the manifest the engine
// reports applied are kept, found in the assignment's history, even when the
// engine names no module's applied key.
func TestPruneKeepsTheAppliedManifest(t *testing.T) {
	t.Parallel()
	s := newSetup(t)
	a1, _, err := s.w.Assignment(t, "ace")
	ct.Must(t, err)
	keys := []string{s.key}
	// While the versions come, the engine reports v1 applied, so the
	// passes' prunes keep it.
	s.w.Put(t, natsx.BucketHaves, "ace", &composerv1.HaveRecord{Node: "ace", Haves: []*composerv1.Have{{Module: "motd",
		Applied: &composerv1.AppliedRef{Fingerprint: s.fp, Key: s.key, Digest: ct.Want(a1, "motd").GetCompositionDigest()}}}})
	for v := 2; v <= 7; v++ {
		fp := s.w.Release(t, ct.Motd(fmt.Sprintf("%d.0", v)), nil)
		ct.WaitFor(t, "registration seen", 10*time.Second, func() (bool, string) {
			r, _ := s.c.View.Registration("motd")
			return r.GetFingerprint() == fp, "not yet"
		})
		// Passes with the prune of a node with no assignment yet: the
		// history below is the test's.
		ct.Must(t, s.w.KV(t, natsx.BucketAssignments).Delete(context.Background(), "ace"))
		if res := s.c.Pass(t, "ace"); res.Err != nil {
			t.Fatal(res.Err)
		}
		keys = append(keys, "ace.motd."+names.FingerprintHex(fp))
	}
	current, _, err := s.w.Assignment(t, "ace")
	ct.Must(t, err)
	// The history holds a1 (v1) and the current assignment (v7); the
	// engine applied a1's manifest and reports no module's key.
	s.w.Put(t, natsx.BucketAssignments, "ace", a1)
	s.w.Put(t, natsx.BucketAssignments, "ace", current)
	haves := &composerv1.HaveRecord{Node: "ace", Applied: &composerv1.ManifestRef{Revision: a1.GetManifestRevision(), Digest: a1.GetManifestDigest()}}
	ct.Must(t, pass.Prune(context.Background(), s.c.Passer, "ace", current, haves))
	held, err := s.w.KV(t, natsx.BucketCompositions).ListKeys(context.Background(), "ace.motd.*")
	ct.Must(t, err)
	// v3..v7 are the 5 newest, v1 the applied manifest's: v2 goes.
	for i, k := range keys {
		if present := slices.Contains(held, k); present != (i != 1) {
			t.Errorf("v%d held=%v", i+1, present)
		}
	}
}

// TestLeaseGuardsWrites covers DESIGN.md §5.2 step 9 in a pass: only the
// lease holder writes, with at least one renewal interval left before each
// node, and only in the tenure the pass started under. A composer that lost
// the lease, has less than the margin left, loses it before the commit, or
// lost it and took it again mid-pass writes no composition, judgement
// record, assignment or status (its prune deletes nothing either).
func TestLeaseGuardsWrites(t *testing.T) {
	t.Parallel()
	const ttl = 3 * time.Second
	cases := []struct {
		name string
		// before runs before the pass; during installs hooks. Either
		// returns the words the pass's error must hold.
		before func(t *testing.T, s *setup) (run *pass.Passer, words string)
		// wrote lists the buckets the pass may still write (compositions
		// signed under its own tenure before it ended).
		wrote []string
	}{
		{name: "lost the lease", before: func(t *testing.T, s *setup) (*pass.Passer, string) {
			s.c.PauseLease()
			s.w.StartManual(t, "two", ct.WithLeaseTTL(ttl))
			return s.c.Passer, "not the lease holder"
		}},
		{name: "less than the margin left", before: func(t *testing.T, s *setup) (*pass.Passer, string) {
			signer := signerv1.NewSignerServiceClient(s.w.As(t, s.w.SignerAddr, identity.RoleComposer, ""))
			// A margin longer than the lease: never enough left.
			return pass.New(pass.Config{Store: s.c.Store, Catalog: s.c.View, Signer: signing.New(signer, nil), Trust: s.c.Trust,
				Lease: s.c.Lease, Approvals: s.c.Reconciler, LeaseMargin: 2 * ttl, Logger: ct.Logger(t)}), "of the lease left, need " + (2 * ttl).String()
		}},
		{name: "lost the lease before the commit", wrote: []string{natsx.BucketCompositions, natsx.BucketComposed},
			before: func(t *testing.T, s *setup) (*pass.Passer, string) {
				pass.SetHooks(s.c.Passer, pass.Hooks{BeforeCommit: func(string) {
					s.c.PauseLease()
					s.w.StartManual(t, "two", ct.WithLeaseTTL(ttl))
				}})
				return s.c.Passer, "ace: assignment not committed: not the lease holder"
			}},
		{name: "lost the lease and took it again mid-pass", before: func(t *testing.T, s *setup) (*pass.Passer, string) {
			first := s.c.Lease.Epoch()
			pass.SetHooks(s.c.Passer, pass.Hooks{BeforeSign: func([]string) {
				// The lease goes and the same composer takes it again in a
				// new tenure: the pass's reads belong to the old one.
				s.c.Lease.Release(context.Background())
				ct.WaitFor(t, "the lease taken again", 20*time.Second, func() (bool, string) {
					return s.c.Lease.Held() && s.c.Lease.Epoch() > first, fmt.Sprintf("epoch %d", s.c.Lease.Epoch())
				})
			}})
			// The request carries the epoch of the pass's tenure: refused.
			return s.c.Passer, fmt.Sprintf("fencing epoch %d is below the signer's %d", first, first+1)
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := newSetup(t, ct.WithLeaseTTL(ttl))
			v2 := s.w.Release(t, ct.Motd("2.0"), nil)
			ct.WaitFor(t, "v2 seen", 10*time.Second, func() (bool, string) {
				r, _ := s.c.View.Registration("motd")
				return r.GetFingerprint() == v2, "not yet"
			})
			before, _, err := s.w.Assignment(t, "ace")
			ct.Must(t, err)
			rec := s.w.RecordWrites(t, natsx.BucketCompositions, natsx.BucketComposed, natsx.BucketAssignments, natsx.BucketStatus)
			p, words := tc.before(t, s)
			res, err := p.Run(context.Background(), "ace", pass.Write, nil)
			if err == nil && res != nil {
				err = res.Err
			}
			if err == nil || !strings.Contains(err.Error(), words) {
				t.Fatalf("pass error %v, want %q", err, words)
			}
			for _, wr := range rec.All() {
				if !slices.Contains(tc.wrote, wr.Bucket) {
					t.Errorf("a composer without the lease wrote %s", wr)
				}
			}
			after, _, err := s.w.Assignment(t, "ace")
			ct.Must(t, err)
			if !proto.Equal(before, after) {
				t.Error("the assignment changed")
			}
		})
	}
}

// TestCorruptAssignment covers an assignment value that does not decode
// (written straight into the bucket): like a composition that does not
// decode it counts as present with no content. The next pass re-derives it
// and replaces it by CAS at its revision, with a manifest revision above
// the one it replaced (the signer's floor), and a move the policy holds
// keeps the node on what its engine reports applied instead of dropping
// the module.
func TestCorruptAssignment(t *testing.T) {
	t.Parallel()
	s := newSetup(t)
	spec := ct.Spec("ace", "motd")
	spec.Policies = map[string]*typev1.Policy{"motd": ct.Policy(typev1.UpgradePolicy_UPGRADE_POLICY_MANUAL, "")}
	s.c.PutNode(t, spec)
	if res := s.c.Pass(t, "ace"); res.Err != nil {
		t.Fatal(res.Err)
	}
	a1, _, err := s.w.Assignment(t, "ace")
	ct.Must(t, err)
	// The engine runs v1; v2 comes and MANUAL holds it.
	v1 := ct.Want(a1, "motd")
	s.w.Put(t, natsx.BucketHaves, "ace", &composerv1.HaveRecord{Node: "ace", HighWater: a1.GetManifestRevision(),
		Applied: &composerv1.ManifestRef{Revision: a1.GetManifestRevision(), Digest: a1.GetManifestDigest()},
		Haves:   []*composerv1.Have{{Module: "motd", Applied: &composerv1.AppliedRef{Fingerprint: v1.GetFingerprint(), Key: v1.GetCompositionKey(), Digest: v1.GetCompositionDigest()}}}})
	v2 := s.w.Release(t, ct.Motd("2.0"), nil)
	ct.WaitFor(t, "v2 seen", 10*time.Second, func() (bool, string) {
		r, _ := s.c.View.Registration("motd")
		return r.GetFingerprint() == v2, "not yet"
	})

	corrupt, err := s.w.KV(t, natsx.BucketAssignments).Put(context.Background(), "ace", []byte("\xff\xffnot an assignment"))
	ct.Must(t, err)
	rec := s.w.RecordWrites(t, natsx.BucketAssignments)
	res := s.c.Pass(t, "ace")
	if res.Err != nil || !res.Committed {
		t.Fatalf("the pass after a corrupt assignment: committed %v, %v", res.Committed, res.Err)
	}
	writes := rec.All()
	if len(writes) != 1 || writes[0].Expected != fmt.Sprint(corrupt) {
		t.Errorf("assignment writes %v, want one Update at the corrupt value's r%d", writes, corrupt)
	}
	a2, _, err := s.w.Assignment(t, "ace")
	ct.Must(t, err)
	if _, err := s.w.CheckAssignment(t, a2); err != nil {
		t.Fatal(err)
	}
	if a2.GetManifestRevision() <= a1.GetManifestRevision() {
		t.Errorf("manifest revision went from %d to %d", a1.GetManifestRevision(), a2.GetManifestRevision())
	}
	if w := ct.Want(a2, "motd"); w.GetCompositionDigest() != v1.GetCompositionDigest() {
		t.Errorf("motd wanted at %v, want the applied v1 %s kept while v2 is held", w, v1.GetCompositionDigest())
	}
	if len(a2.GetHolds()) != 1 || a2.GetHolds()[0].GetFingerprint() != v2 {
		t.Errorf("holds %v, want v2 held", a2.GetHolds())
	}
	// Repaired: the next pass has nothing to do.
	if res := s.c.Pass(t, "ace"); res.Err != nil || res.Changes {
		t.Errorf("the pass after the repair: changes %v, %v", res.Changes, res.Err)
	}
}

// TestCorruptHaves covers a haves record that does not decode: no haves
// are known, so each composition is judged NEW, the pass goes on, and the
// node's status says so until the engine reports again.
func TestCorruptHaves(t *testing.T) {
	t.Parallel()
	s := newSetup(t)
	a1, _, err := s.w.Assignment(t, "ace")
	ct.Must(t, err)
	v1 := ct.Want(a1, "motd")
	good := &composerv1.HaveRecord{Node: "ace", HighWater: a1.GetManifestRevision(),
		Applied: &composerv1.ManifestRef{Revision: a1.GetManifestRevision(), Digest: a1.GetManifestDigest()},
		Haves:   []*composerv1.Have{{Module: "motd", Applied: &composerv1.AppliedRef{Fingerprint: v1.GetFingerprint(), Key: v1.GetCompositionKey(), Digest: v1.GetCompositionDigest()}}}}
	v2 := s.w.Release(t, ct.Motd("2.0"), nil)
	ct.WaitFor(t, "v2 seen", 10*time.Second, func() (bool, string) {
		r, _ := s.c.View.Registration("motd")
		return r.GetFingerprint() == v2, "not yet"
	})
	_, err = s.w.KV(t, natsx.BucketHaves).Put(context.Background(), "ace", []byte("\xff\xffnot a haves record"))
	ct.Must(t, err)
	res := s.c.Pass(t, "ace")
	if res.Err != nil || !res.Committed {
		t.Fatalf("the pass with corrupt haves: committed %v, %v", res.Committed, res.Err)
	}
	if j := res.Compositions[0].Judged; j.Judgement != composerv1.Judgement_JUDGEMENT_NEW {
		t.Errorf("v2 judged %v (%s) with no haves known, want NEW", j.Judgement, j.Words)
	}
	st := &composerv1.NodeStatus{}
	_, err = s.w.Get(t, natsx.BucketStatus, "ace", st)
	ct.Must(t, err)
	if !strings.Contains(st.GetLastError(), "the haves record of ace") || !strings.Contains(st.GetLastError(), "does not decode") {
		t.Errorf("status last error %q, want the haves record named", st.GetLastError())
	}

	// The engine reports again: judged against what it applied, and the
	// status no longer names the haves.
	s.w.Put(t, natsx.BucketHaves, "ace", good)
	res = s.c.Pass(t, "ace")
	if res.Err != nil {
		t.Fatal(res.Err)
	}
	if j := res.Compositions[0].Judged; j.Judgement != composerv1.Judgement_JUDGEMENT_CHANGES || j.Against != v1.GetCompositionDigest() {
		t.Errorf("v2 judged %v against %s once haves are known, want CHANGES against v1", j.Judgement, j.Against)
	}
	_, err = s.w.Get(t, natsx.BucketStatus, "ace", st)
	ct.Must(t, err)
	if st.GetLastError() != "" {
		t.Errorf("status still says %q", st.GetLastError())
	}
}

// TestFailedPassNamesItsWrites covers DESIGN.md §5.2 step 6: a composition
// that fails leaves the node's other modules written, the node's own is then
// not written, and the errors are returned with the keys the pass wrote —
// compositions and judgement records — exactly those the buckets stored.
func TestFailedPassNamesItsWrites(t *testing.T) {
	t.Parallel()
	s := newSetup(t)
	sshd := s.w.Release(t, ct.SSHD("1.0", ""), nil)
	motd := s.w.Release(t, ct.Motd("2.0"), nil)
	ct.WaitFor(t, "releases seen", 10*time.Second, func() (bool, string) {
		m, _ := s.c.View.Registration("motd")
		d, _ := s.c.View.Registration("sshd")
		return m.GetFingerprint() == motd && d.GetFingerprint() == sshd, "not yet"
	})
	s.c.PutNode(t, ct.Spec("ace", "motd", "sshd"))
	motdKey := "ace.motd." + names.FingerprintHex(motd)
	sshdKey := "ace.sshd." + names.FingerprintHex(sshd)
	// Another writer gets to the new motd key before each of the pass's
	// attempts: motd fails after its bounded retries.
	pass.SetHooks(s.c.Passer, pass.Hooks{BeforeWrite: func(key string, attempt int) {
		if key == motdKey {
			if _, err := s.w.KV(t, natsx.BucketCompositions).Put(context.Background(), key, []byte(fmt.Sprintf("other %d", attempt))); err != nil {
				t.Error(err)
			}
		}
	}})
	rec := s.w.RecordWrites(t, natsx.BucketCompositions, natsx.BucketComposed)
	res := s.c.Pass(t, "ace")
	for _, want := range []string{motdKey + ": write conflicted 4 times", "ace.node is not written: a module's composition of this pass was not"} {
		if res.Err == nil || !strings.Contains(res.Err.Error(), want) {
			t.Errorf("pass error %v, want %q", res.Err, want)
		}
	}
	var compositions, records []string
	for _, wr := range rec.All() {
		switch {
		case wr.Bucket == natsx.BucketComposed:
			records = append(records, wr.Key)
		case wr.Expected != "":
			// The other writer's puts are blind; the pass's are CAS.
			compositions = append(compositions, wr.Key)
		}
	}
	if !slices.Equal(res.Written, []string{sshdKey}) || !slices.Equal(res.Written, compositions) {
		t.Errorf("Written %v, the bucket stored %v; want [%s]", res.Written, compositions, sshdKey)
	}
	if !slices.Equal(res.Records, []string{sshdKey}) || !slices.Equal(res.Records, records) {
		t.Errorf("Records %v, the bucket stored %v; want [%s]", res.Records, records, sshdKey)
	}
	if res.Committed {
		t.Error("a failed pass committed")
	}
}

// TestPruneOrdersByServerWrites covers the order of DESIGN.md §5.2 step 8:
// a module's compositions are ordered by the server's order of their last
// writes, the keys this pass wrote included — not by the composer's clock.
// With the composer's clock half an hour behind the server's, the two keys
// one pass writes (a held want's composition rebuilt, and a new composition
// held by MANUAL) are still the newest: the oldest others go.
func TestPruneOrdersByServerWrites(t *testing.T) {
	t.Parallel()
	s := newSetup(t)
	spec := ct.Spec("ace", "motd")
	spec.Policies = map[string]*typev1.Policy{"motd": ct.Policy(typev1.UpgradePolicy_UPGRADE_POLICY_MANUAL, "")}
	s.c.PutNode(t, spec)
	release := func(v int) string {
		fp := s.w.Release(t, ct.Motd(fmt.Sprintf("%d.0", v)), nil)
		ct.WaitFor(t, "registration seen", 10*time.Second, func() (bool, string) {
			r, _ := s.c.View.Registration("motd")
			return r.GetFingerprint() == fp, "not yet"
		})
		return "ace.motd." + names.FingerprintHex(fp)
	}
	keys := []string{s.key}
	for v := 2; v <= 6; v++ {
		keys = append(keys, release(v))
		if res := s.c.Pass(t, "ace"); res.Err != nil || len(res.Holds) != 1 {
			t.Fatalf("v%d: holds %v, %v", v, res.Holds, res.Err)
		}
	}
	// v1 (wanted) lost its composition; v7 comes. The composer's clock is
	// behind.
	ct.Must(t, s.w.KV(t, natsx.BucketCompositions).Delete(context.Background(), s.key))
	keys = append(keys, release(7))
	pass.SetNow(s.c.Passer, func() time.Time { return time.Now().Add(-30 * time.Minute) })
	res := s.c.Pass(t, "ace")
	pass.SetNow(s.c.Passer, time.Now)
	if res.Err != nil {
		t.Fatal(res.Err)
	}
	if !slices.Contains(res.Written, keys[0]) || !slices.Contains(res.Written, keys[6]) {
		t.Fatalf("the pass wrote %v, want v1 rebuilt and v7", res.Written)
	}
	held, err := s.w.KV(t, natsx.BucketCompositions).ListKeys(context.Background(), "ace.motd.*")
	ct.Must(t, err)
	// Last written: v1 and v7 (this pass), then v6, v5, v4 — the 5
	// newest; v2 and v3 go. By the composer's clock v1 and v7 would be the
	// oldest, and v7 (held, not wanted) would go.
	for i, k := range keys {
		if present := slices.Contains(held, k); present != (i != 1 && i != 2) {
			t.Errorf("v%d held=%v", i+1, present)
		}
	}
}

// TestRevisionConflictSignedOnce covers DESIGN.md §6 step 4 and §7: an
// engine that refused the held manifest with REVISION_CONFLICT gets one
// manifest above the high-water it reported; while that report stands (the
// engine is offline), later passes do not sign yet another revision.
func TestRevisionConflictSignedOnce(t *testing.T) {
	t.Parallel()
	s := newSetup(t)
	a1, _, err := s.w.Assignment(t, "ace")
	ct.Must(t, err)
	// The engine's high-water is the held revision, reached by another
	// manifest (a lost one, say): it refused the held one.
	s.w.Put(t, natsx.BucketHaves, "ace", &composerv1.HaveRecord{Node: "ace", HighWater: a1.GetManifestRevision(),
		Applied: &composerv1.ManifestRef{Revision: a1.GetManifestRevision(), Digest: "sha256:" + strings.Repeat("0", 64)},
		Haves: []*composerv1.Have{{Module: names.NodeModule, Attempt: &composerv1.Attempt{State: composerv1.AttemptState_ATTEMPT_STATE_FAILED,
			ReasonCode: composerv1.ReasonCode_REASON_CODE_REVISION_CONFLICT, Reason: "revision at the high-water with another digest"}}}})
	res := s.c.Pass(t, "ace")
	if res.Err != nil || !res.Committed {
		t.Fatalf("the pass after the conflict: committed %v, %v", res.Committed, res.Err)
	}
	a2, _, err := s.w.Assignment(t, "ace")
	ct.Must(t, err)
	if a2.GetManifestRevision() <= a1.GetManifestRevision() {
		t.Fatalf("re-signed at r%d, not above the high-water r%d", a2.GetManifestRevision(), a1.GetManifestRevision())
	}
	for i := range 3 {
		if res := s.c.Pass(t, "ace"); res.Err != nil || res.Committed {
			t.Errorf("pass %d while the answered report stands: committed %v, %v", i+1, res.Committed, res.Err)
		}
	}
	a3, _, err := s.w.Assignment(t, "ace")
	ct.Must(t, err)
	if a3.GetManifestRevision() != a2.GetManifestRevision() {
		t.Errorf("the revision moved on to %d", a3.GetManifestRevision())
	}
}

// TestDataPathChangeIsHeld covers DESIGN.md §5.3 for a release that only
// declares a data path: its resources are the same, but it is judged DATA,
// not SAME, so MANUAL holds it until approved.
func TestDataPathChangeIsHeld(t *testing.T) {
	t.Parallel()
	s := newSetup(t)
	spec := ct.Spec("ace", "motd")
	spec.Policies = map[string]*typev1.Policy{"motd": ct.Policy(typev1.UpgradePolicy_UPGRADE_POLICY_MANUAL, "")}
	s.c.PutNode(t, spec)
	a1, _, err := s.w.Assignment(t, "ace")
	ct.Must(t, err)
	v1 := ct.Want(a1, "motd")
	s.w.Put(t, natsx.BucketHaves, "ace", &composerv1.HaveRecord{Node: "ace", HighWater: a1.GetManifestRevision(),
		Applied: &composerv1.ManifestRef{Revision: a1.GetManifestRevision(), Digest: a1.GetManifestDigest()},
		Haves:   []*composerv1.Have{{Module: "motd", Applied: &composerv1.AppliedRef{Fingerprint: v1.GetFingerprint(), Key: v1.GetCompositionKey(), Digest: v1.GetCompositionDigest()}}}})
	m := ct.Motd("1.0")
	m.DataPaths = []string{"/var/lib/motd"}
	fp := s.w.Release(t, m, nil)
	ct.WaitFor(t, "registration seen", 10*time.Second, func() (bool, string) {
		r, _ := s.c.View.Registration("motd")
		return r.GetFingerprint() == fp, "not yet"
	})
	res := s.c.Pass(t, "ace")
	if res.Err != nil {
		t.Fatal(res.Err)
	}
	if j := res.Compositions[0].Judged; j.Judgement != composerv1.Judgement_JUDGEMENT_DATA || j.Words != "data paths: adds /var/lib/motd" {
		t.Errorf("judged %v %q, want DATA naming the data path", j.Judgement, j.Words)
	}
	if len(res.Holds) != 1 || res.Holds[0].GetFingerprint() != fp || ct.Want(&composerv1.Assignment{Wants: res.Wants}, "motd").GetFingerprint() != v1.GetFingerprint() {
		t.Errorf("wants %v holds %v: MANUAL let a data-path change through", res.Wants, res.Holds)
	}
}

// TestFollowThroughTheMirror covers the re-read of DESIGN.md §5.2 step 5
// when a pass wrote several compositions: they are read again together
// through the composition mirror, current as of after the writes, and one
// another writer replaced meanwhile is still followed.
func TestFollowThroughTheMirror(t *testing.T) {
	t.Parallel()
	s := newSetup(t)
	variants := s.variants(t, 1)
	sshd := s.w.Release(t, ct.SSHD("1.0", ""), nil)
	ct.WaitFor(t, "sshd seen", 10*time.Second, func() (bool, string) {
		r, _ := s.c.View.Registration("sshd")
		return r.GetFingerprint() == sshd, "not yet"
	})
	s.c.PutNode(t, ct.Spec("ace", "motd", "sshd"))
	// motd's value is corrupt, so the pass writes it again beside sshd's.
	s.put(t, []byte("corrupt"))
	pass.SetHooks(s.c.Passer, pass.Hooks{BeforeReread: func(key string, follow int) {
		if key == s.key && follow == 0 {
			s.put(t, variants[0])
		}
	}})
	res := s.c.Pass(t, "ace")
	if res.Err != nil {
		t.Fatal(res.Err)
	}
	if len(res.Written) != 2 {
		t.Fatalf("the pass wrote %v, want motd and sshd", res.Written)
	}
	want := digestOf(t, variants[0])
	rec := &composerv1.JudgementRecord{}
	_, err := s.w.Get(t, natsx.BucketComposed, s.key, rec)
	ct.Must(t, err)
	if rec.GetDigest() != want {
		t.Errorf("motd's record names %s, want the other writer's %s", rec.GetDigest(), want)
	}
	sshdKey := "ace.sshd." + names.FingerprintHex(sshd)
	for _, c := range res.Compositions {
		if c.Key == sshdKey {
			_, err := s.w.Get(t, natsx.BucketComposed, sshdKey, rec)
			ct.Must(t, err)
			if rec.GetDigest() != c.Digest {
				t.Errorf("sshd's record names %s, its composition is %s", rec.GetDigest(), c.Digest)
			}
		}
	}
}

// TestUnchangedPassReadsNoComposition covers the compare of DESIGN.md §5.2
// step 2 through the composition mirror: a pass that finds nothing changed
// reads none of the node's compositions from the stream (each read is a
// JetStream API request); it looks them up in the mirror, current as of
// the pass.
func TestUnchangedPassReadsNoComposition(t *testing.T) {
	t.Parallel()
	s := newSetup(t)
	nc, err := nats.Connect(s.w.Embedded.ClientURL())
	ct.Must(t, err)
	t.Cleanup(nc.Close)
	var reads atomic.Int64
	_, err = nc.Subscribe("$JS.API.STREAM.MSG.GET.KV_"+natsx.BucketCompositions, func(*nats.Msg) { reads.Add(1) })
	ct.Must(t, err)
	ct.Must(t, nc.Flush())
	res := s.c.Pass(t, "ace")
	if res.Err != nil || res.Changes || len(res.Written) != 0 {
		t.Fatalf("the second pass: changes %v, wrote %v, %v", res.Changes, res.Written, res.Err)
	}
	ct.Must(t, nc.Flush())
	if n := reads.Load(); n != 0 {
		t.Errorf("an unchanged pass read %d compositions", n)
	}
}

// TestCommitOneCAS covers the commit point of DESIGN.md §5.2 step 7: one
// CAS of the assignment per node per pass, at the revision the pass read.
// Another writer's assignment between the read and the commit fails the
// pass: it is not retried over, and it stays.
func TestCommitOneCAS(t *testing.T) {
	t.Parallel()
	s := newSetup(t)
	v2 := s.w.Release(t, ct.Motd("2.0"), nil)
	ct.WaitFor(t, "v2 seen", 10*time.Second, func() (bool, string) {
		r, _ := s.c.View.Registration("motd")
		return r.GetFingerprint() == v2, "not yet"
	})
	asgs := s.w.KV(t, natsx.BucketAssignments)
	held, err := asgs.Get(context.Background(), "ace")
	ct.Must(t, err)
	var other uint64
	pass.SetHooks(s.c.Passer, pass.Hooks{BeforeCommit: func(node string) {
		if node == "ace" && other == 0 {
			// Another writer: the same bytes again, at a new revision.
			rev, err := asgs.Put(context.Background(), "ace", held.Value)
			ct.Must(t, err)
			other = rev
		}
	}})
	rec := s.w.RecordWrites(t, natsx.BucketAssignments)
	res := s.c.Pass(t, "ace")
	want := fmt.Sprintf("ace: commit assignment at revision %d: ", held.Revision)
	if res.Err == nil || !strings.Contains(res.Err.Error(), want) || res.Committed {
		t.Fatalf("pass: committed %v, error %v; want %q", res.Committed, res.Err, want)
	}
	if got := rec.All(); len(got) != 1 || got[0].Revision != other {
		t.Errorf("assignment writes %v; want only the other writer's r%d", got, other)
	}
	if now, err := asgs.Get(context.Background(), "ace"); err != nil || now.Revision != other {
		t.Errorf("the assignment is at %v (%v); want the other writer's r%d left alone", now, err, other)
	}
}

// appliedAll is the haves record of an engine that applied an assignment
// whole, reported at seq.
func appliedAll(asg *composerv1.Assignment, seq uint64) *composerv1.HaveRecord {
	var haves []*composerv1.Have
	for _, w := range asg.GetWants() {
		haves = append(haves, &composerv1.Have{Module: w.GetModule(),
			Applied: &composerv1.AppliedRef{Fingerprint: w.GetFingerprint(), Key: w.GetCompositionKey(), Digest: w.GetCompositionDigest()}})
	}
	return &composerv1.HaveRecord{Node: asg.GetNode(), ReportSeq: seq, Haves: haves,
		Applied: &composerv1.ManifestRef{Revision: asg.GetManifestRevision(), Digest: asg.GetManifestDigest()}}
}

// TestStatusFromTheHavesAfterIt: the engine reports while a pass runs (it
// applies the assignment the pass just committed before the pass's status
// is written). The status the pass writes is built from the haves record
// as it is when the status is written, not from the haves the pass read at
// its start: otherwise it would say the node applied nothing until the
// engine's next report.
func TestStatusFromTheHavesAfterIt(t *testing.T) {
	t.Parallel()
	s := newSetup(t)
	ctx := context.Background()
	asg, _, err := s.w.Assignment(t, "ace")
	ct.Must(t, err)
	s.w.Put(t, natsx.BucketHaves, "ace", appliedAll(asg, 2))
	stale := &composerv1.HaveRecord{Node: "ace", ReportSeq: 1}
	ct.Must(t, pass.PutStatus(ctx, s.c.Passer, "ace", asg, stale, 0))
	st := &composerv1.NodeStatus{}
	if _, err := s.w.Get(t, natsx.BucketStatus, "ace", st); err != nil {
		t.Fatal(err)
	}
	if !st.GetConverged() || st.GetAppliedRevision() != asg.GetManifestRevision() {
		t.Errorf("status built from the haves the pass read at its start: converged %v, applied r%d (the engine reports r%d)",
			st.GetConverged(), st.GetAppliedRevision(), asg.GetManifestRevision())
	}
}

// TestReconcilerPassesDecideOnTheWatchedCopies: the reconciler's passes
// (RunThenFinish) take the node's spec and haves record from the
// composer's watches instead of reading them again; a plan reads the
// buckets; and a part the watch holds no message of (it did not decode) is
// read from the bucket. The status takes the watched haves record too.
func TestReconcilerPassesDecideOnTheWatchedCopies(t *testing.T) {
	t.Parallel()
	s := newSetup(t)
	ctx := context.Background()
	spec := &composerv1.NodeSpec{}
	rev, err := s.w.Get(t, natsx.BucketNodes, "ace", spec)
	ct.Must(t, err)
	// The watch's copy places nothing; the bucket's places motd.
	bare := proto.CloneOf(spec)
	bare.Modules = nil
	var watched atomic.Pointer[pass.Watched]
	watched.Store(&pass.Watched{Spec: bare, SpecRev: rev})
	pass.SetWatched(s.c.Passer, func(string) pass.Watched { return *watched.Load() })
	places := func(res *pass.Result) bool {
		for _, w := range res.Wants {
			if w.GetModule() == "motd" {
				return true
			}
		}
		return false
	}

	plan, err := s.c.Passer.Run(ctx, "ace", pass.Plan, nil)
	ct.Must(t, err)
	if !places(plan) {
		t.Errorf("a plan decided on the watched spec (wants %v); it reads the bucket", plan.Wants)
	}
	res, finish, err := s.c.Passer.RunThenFinish(ctx, "ace")
	ct.Must(t, err)
	if finish != nil {
		finish()
	}
	if places(res) || res.Inputs.GetSpecRevision() != rev {
		t.Errorf("the reconciler's pass read the bucket: wants %v, spec r%d; want the watched spec r%d placing nothing", res.Wants, res.Inputs.GetSpecRevision(), rev)
	}
	watched.Store(&pass.Watched{SpecRev: rev})
	res, finish, err = s.c.Passer.RunThenFinish(ctx, "ace")
	ct.Must(t, err)
	if finish != nil {
		finish()
	}
	if !places(res) {
		t.Errorf("a spec the watch holds no message of was not read from the bucket: wants %v", res.Wants)
	}

	// The engine's report is in the watch and not (yet) read back: the
	// status is built from it.
	asg, _, err := s.w.Assignment(t, "ace")
	ct.Must(t, err)
	watched.Store(&pass.Watched{SpecRev: rev, Haves: appliedAll(asg, 2), HavesRev: 7})
	ct.Must(t, pass.PutStatus(ctx, s.c.Passer, "ace", asg, nil, 0))
	st := &composerv1.NodeStatus{}
	if _, err := s.w.Get(t, natsx.BucketStatus, "ace", st); err != nil {
		t.Fatal(err)
	}
	if !st.GetConverged() || st.GetAppliedRevision() != asg.GetManifestRevision() {
		t.Errorf("status not built from the watched haves record: converged %v, applied r%d; want r%d",
			st.GetConverged(), st.GetAppliedRevision(), asg.GetManifestRevision())
	}

	// A watched record older than the one the pass read is not taken:
	// nothing may ask for a refresh after the status (a plan's Apply, a
	// pass with no reconciler running).
	hrev := s.w.Put(t, natsx.BucketHaves, "ace", appliedAll(asg, 3))
	watched.Store(&pass.Watched{SpecRev: rev, Haves: &composerv1.HaveRecord{Node: "ace", ReportSeq: 1}, HavesRev: hrev - 1})
	status := func(read uint64) *composerv1.NodeStatus {
		t.Helper()
		ct.Must(t, pass.PutStatus(ctx, s.c.Passer, "ace", asg, appliedAll(asg, 3), read))
		st := &composerv1.NodeStatus{}
		if _, err := s.w.Get(t, natsx.BucketStatus, "ace", st); err != nil {
			t.Fatal(err)
		}
		return st
	}
	if st := status(0); st.GetConverged() {
		t.Errorf("status of a caller that read no haves record: not built from the watched one")
	}
	if st := status(hrev); !st.GetConverged() {
		t.Errorf("status of a pass that read the haves record at r%d built from the watched r%d: converged %v, applied r%d",
			hrev, hrev-1, st.GetConverged(), st.GetAppliedRevision())
	}
}

// TestReconcilerPassReadsOnlyWhatTheWatchesLack: once the watches
// delivered the node's spec, haves record and this composer's own last
// commit of its assignment, and the composition mirror is current, the
// reconciler's pass reads none of them nor lists the node's keys from the
// stream; while the composer wrote a newer assignment than the watch
// holds, or deleted the node's records lately, the pass reads them.
func TestReconcilerPassReadsOnlyWhatTheWatchesLack(t *testing.T) {
	t.Parallel()
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	w := ct.New(t, ct.Options{TracerProvider: tp})
	c := w.StartManual(t, "one")
	fp := w.Release(t, ct.Motd("1.0"), nil)
	ct.WaitFor(t, "registration seen", 10*time.Second, func() (bool, string) {
		r, ok := c.View.Registration("motd")
		return ok && r.GetFingerprint() == fp, "not yet"
	})
	c.PutNode(t, ct.Spec("ace", "motd"))
	c.WaitSpec(t, "ace")
	if res := c.Pass(t, "ace"); res.Err != nil || !res.Committed {
		t.Fatalf("first pass: committed %v, %v", res.Committed, res.Err)
	}
	_, rev, err := w.Assignment(t, "ace")
	ct.Must(t, err)
	havesRev := w.Put(t, natsx.BucketHaves, "ace", &composerv1.HaveRecord{Node: "ace", ReportSeq: 1})
	ct.WaitFor(t, "the commit and the haves watched, the mirror current", 10*time.Second, func() (bool, string) {
		got, haves := pass.WatchedAssignmentRev(c.Passer, "ace"), c.Reconciler.Watched("ace").HavesRev
		return got == rev && haves == havesRev && pass.CompositionsMirrorCurrent(c.Passer),
			fmt.Sprintf("watched assignment r%d (committed r%d), haves r%d (written r%d)", got, rev, haves, havesRev)
	})
	reads := func() (map[string]int, *pass.Result) {
		t.Helper()
		ctx, root := tp.Tracer("test").Start(context.Background(), "test pass")
		res, finish, err := c.Passer.RunThenFinish(ctx, "ace")
		if finish != nil {
			finish()
		}
		root.End()
		ct.Must(t, err)
		n := map[string]int{}
		for _, s := range exp.GetSpans() {
			if s.SpanContext.TraceID() == root.SpanContext().TraceID() {
				n[s.Name]++
			}
		}
		return n, res
	}
	n, res := reads()
	for _, name := range []string{"kv.get assignments", "kv.get nodes", "kv.get haves", "kv.list_subjects compositions"} {
		if n[name] != 0 {
			t.Errorf("pass with everything watched: %d %s spans; want none", n[name], name)
		}
	}
	if res.Inputs.GetAssignmentRevision() != rev || res.Inputs.GetHavesRevision() != havesRev {
		t.Errorf("pass decided on assignment r%d, haves r%d; want the watched r%d, r%d", res.Inputs.GetAssignmentRevision(), res.Inputs.GetHavesRevision(), rev, havesRev)
	}
	// The tenure's first pass asked the streams for their last sequence
	// (the mirrors hold every earlier holder's writes); the next asks
	// nothing more. Its status is the same as the one kept, so nothing
	// would be written: the key is read once to see that it still holds it.
	if n, _ := reads(); n["kv.last_sequence compositions"]+n["kv.last_sequence composed"] != 0 || n["kv.get status"] != 1 {
		t.Errorf("second pass of the tenure: %d and %d stream-info requests of compositions and composed, %d status reads; want none, none and 1",
			n["kv.last_sequence compositions"], n["kv.last_sequence composed"], n["kv.get status"])
	}
	// Another hand writes the status, and the engine reports: the CAS of
	// the new status at the revision this composer wrote fails, the key is
	// read, and the status is put right.
	w.Put(t, natsx.BucketStatus, "ace", &composerv1.NodeStatus{Node: "ace", LastError: "written by another hand"})
	asg, _, err := w.Assignment(t, "ace")
	ct.Must(t, err)
	havesRev = w.Put(t, natsx.BucketHaves, "ace", appliedAll(asg, 2))
	ct.WaitFor(t, "the report watched", 10*time.Second, func() (bool, string) {
		return c.Reconciler.Watched("ace").HavesRev == havesRev, "not yet"
	})
	if n, _ := reads(); n["kv.get status"] != 1 {
		t.Errorf("pass after another hand wrote the status: %d status reads, want 1", n["kv.get status"])
	}
	st := &composerv1.NodeStatus{}
	if _, err := w.Get(t, natsx.BucketStatus, "ace", st); err != nil || st.GetLastError() != "" || st.GetAppliedRevision() != asg.GetManifestRevision() {
		t.Errorf("status after another hand wrote it: %v (%v); want the pass's, applied r%d", st, err, asg.GetManifestRevision())
	}
	// A commit of this composer's the watch has not delivered: read.
	pass.NoteOwnWrite(c.Passer, natsx.BucketAssignments, "ace", rev+1000)
	if n, _ := reads(); n["kv.get assignments"] != 1 {
		t.Errorf("pass while the watch is behind this composer's last commit: %d assignment reads, want 1", n["kv.get assignments"])
	}
	// The node's haves deleted by this composer lately (its node deleted
	// and re-created): the watch may still hold the old node's record.
	pass.NoteOwnDelete(c.Passer, natsx.BucketHaves, "ace")
	if n, _ := reads(); n["kv.get haves"] == 0 {
		t.Errorf("pass right after this composer deleted the node's haves took the watched record; want it read")
	}
}
