package reconcile

import (
	"context"
	"slices"
	"testing"
	"time"

	composerv1 "mesh.dev/proto/mesh/composer/v1"
	"mesh.dev/services/composer/internal/pass"
)

func have(module, digest string, state composerv1.AttemptState, code composerv1.ReasonCode, reason string) *composerv1.Have {
	return &composerv1.Have{Module: module, Applied: &composerv1.AppliedRef{Digest: digest},
		Attempt: &composerv1.Attempt{State: state, ReasonCode: code, Reason: reason}}
}

// TestNeedsPass checks which haves changes call for a pass (DESIGN.md §6
// step 4): an applied digest changed, or an attempt failed for a digest or
// signature reason or a revision conflict; anything else only changes the
// status.
func TestNeedsPass(t *testing.T) {
	t.Parallel()
	applied := composerv1.AttemptState_ATTEMPT_STATE_APPLIED
	failed := composerv1.AttemptState_ATTEMPT_STATE_FAILED
	held := composerv1.AttemptState_ATTEMPT_STATE_HELD
	none := composerv1.ReasonCode_REASON_CODE_UNSPECIFIED
	rec := func(haves ...*composerv1.Have) *composerv1.HaveRecord { return &composerv1.HaveRecord{Haves: haves} }
	base := rec(have("motd", "D1", applied, none, ""))
	cases := []struct {
		name         string
		next         *composerv1.HaveRecord
		want, urgent bool
	}{
		{"nothing changed", rec(have("motd", "D1", applied, none, "")), false, false},
		{"applied digest changed", rec(have("motd", "D2", applied, none, "")), true, false},
		{"a module applied for the first time", rec(have("motd", "D1", applied, none, ""), have("sshd", "S1", applied, none, "")), true, false},
		{"a module gone", rec(), true, false},
		{"held for an entry", rec(have("motd", "D1", held, composerv1.ReasonCode_REASON_CODE_ENTRY_ASKED, "asked")), false, false},
		{"failed writing", rec(have("motd", "D1", failed, composerv1.ReasonCode_REASON_CODE_WRITE_FAILED, "disk full")), false, false},
		{"failed on a digest", rec(have("motd", "D1", failed, composerv1.ReasonCode_REASON_CODE_DIGEST_MISMATCH, "")), true, true},
		{"failed on a signature", rec(have("motd", "D1", failed, composerv1.ReasonCode_REASON_CODE_SIGNATURE_INVALID, "")), true, true},
		{"failed on a revision conflict", rec(have("motd", "D1", failed, composerv1.ReasonCode_REASON_CODE_REVISION_CONFLICT, "")), true, true},
		{"applied another and failed a fetch", rec(have("motd", "D2", failed, composerv1.ReasonCode_REASON_CODE_FETCH_FAILED, "")), true, true},
	}
	for _, tc := range cases {
		if got, urgent := needsPass(base, tc.next); got != tc.want || urgent != tc.urgent {
			t.Errorf("%s: needsPass = %v, urgent %v; want %v, %v", tc.name, got, urgent, tc.want, tc.urgent)
		}
	}
}

// TestFollowUpsWaitBehindChanges: follow-up passes (an engine reported what
// it applied) run after the queued passes of changes, unless one waited
// followUpWait; a node with a follow-up queued moves up when a change
// queues it, and runs once.
func TestFollowUpsWaitBehindChanges(t *testing.T) {
	t.Parallel()
	now := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	r := New(Config{Now: func() time.Time { return now }})
	ctx := t.Context()
	r.followUp(ctx, "f1", "engine reported a change")
	r.Enqueue(ctx, "c1", "module registered")
	r.followUp(ctx, "f2", "engine reported a change")
	r.Enqueue(ctx, "c2", "module registered")
	// f2 moves up; its entry among the follow-ups is passed over.
	r.Enqueue(ctx, "f2", "module registered")
	r.Enqueue(ctx, "c3", "module registered")
	// A follow-up of a node queued for a change leaves it where it is.
	r.followUp(ctx, "c3", "engine reported a change")
	if n := r.Pending(); n != 5 {
		t.Errorf("Pending = %d, want 5", n)
	}
	pop := func() string {
		t.Helper()
		r.mu.Lock()
		defer r.mu.Unlock()
		node, ok := r.popLocked()
		if !ok {
			return ""
		}
		delete(r.pending, node)
		return node
	}
	var got []string
	for range 3 {
		got = append(got, pop())
	}
	// f1 has waited long enough: it goes before the last change.
	now = now.Add(followUpWait)
	got = append(got, pop(), pop(), pop())
	want := []string{"c1", "c2", "f2", "f1", "c3", ""}
	if !slices.Equal(got, want) {
		t.Errorf("passes in the order %v, want %v", got, want)
	}
}

// TestScheduleSpread checks the full reconcile's spread (DESIGN.md §5.2 step
// 7): every node is visited within the period, at points spread over its
// second half; sooner for a renewal, and soon after a failure or while a
// build is awaited.
func TestScheduleSpread(t *testing.T) {
	t.Parallel()
	now := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	period := 15 * time.Minute
	r := New(Config{Period: period, Now: func() time.Time { return now }})
	buckets := map[int]int{}
	for i := range 2000 {
		node := string(rune('a'+i%26)) + time.Duration(i).String()
		r.scheduleLocked(node, &pass.Result{}, nil)
		d := r.nextVisit[node].Sub(now)
		if d < period/2 || d > period {
			t.Fatalf("next visit in %s, outside [%s, %s]", d, period/2, period)
		}
		buckets[int(d/(period/20))]++
	}
	// Ten buckets of 45 s over the second half: each holds about 200.
	for b := 10; b < 20; b++ {
		if buckets[b] < 100 || buckets[b] > 300 {
			t.Errorf("visits not spread: %v", buckets)
			break
		}
	}
	cases := []struct {
		name     string
		res      *pass.Result
		err      error
		min, max time.Duration
	}{
		{"renewal sooner", &pass.Result{RenewAt: now.Add(time.Minute)}, nil, time.Minute, time.Minute},
		{"first failed pass", &pass.Result{Err: errTest}, nil, 500 * time.Millisecond, 1500 * time.Millisecond},
		{"second failure in a row", nil, errTest, time.Second, 3 * time.Second},
		{"third failure in a row", &pass.Result{Err: errTest}, nil, 2 * time.Second, 6 * time.Second},
		{"a clean pass resets the failures", &pass.Result{}, nil, period / 2, period},
		{"failed again: soon again", nil, errTest, 500 * time.Millisecond, 1500 * time.Millisecond},
		{"waiting for a build", &pass.Result{Waiting: true}, nil, 15 * time.Second, 45 * time.Second},
	}
	for _, tc := range cases {
		r.scheduleLocked("x", tc.res, tc.err)
		if d := r.nextVisit["x"].Sub(now); d < tc.min || d > tc.max {
			t.Errorf("%s: next visit in %s, want %s..%s", tc.name, d, tc.min, tc.max)
		}
	}
	// Failures that go on back off to retryFailedMax, never beyond.
	for range 20 {
		r.scheduleLocked("y", nil, errTest)
	}
	if d := r.nextVisit["y"].Sub(now); d < retryFailedMax/2 || d > retryFailedMax*3/2 {
		t.Errorf("after 20 failures: next visit in %s, want %s..%s", d, retryFailedMax/2, retryFailedMax*3/2)
	}
	// visitDue queues exactly the nodes whose visit has come.
	r2 := New(Config{Period: period, Now: func() time.Time { return now }})
	r2.specs = map[string]*composerv1.NodeSpec{"due": {}, "later": {}, "unknown": {}}
	r2.nextVisit = map[string]time.Time{"due": now.Add(-time.Second), "later": now.Add(time.Minute)}
	r2.visitDue()
	if len(r2.queue) != 1 || r2.queue[0] != "due" {
		t.Errorf("visitDue queued %v", r2.queue)
	}
}

type testError struct{}

func (testError) Error() string { return "test" }

var errTest error = testError{}

// TestStatusRefreshNeverBesideAPass: a refresh that read the assignment
// before a pass committed a new one would write a status of the old one
// after the pass's. A refresh is skipped while a pass is queued (it writes
// the status), becomes a pass after the running one, and otherwise holds
// the node so a pass queued meanwhile runs after it.
func TestStatusRefreshNeverBesideAPass(t *testing.T) {
	t.Parallel()
	r := New(Config{})
	ctx := t.Context()
	var refreshed []string
	r.refresh = func(_ context.Context, node string) error {
		refreshed = append(refreshed, node)
		r.mu.Lock()
		held := r.running[node]
		r.mu.Unlock()
		if !held {
			t.Errorf("%s refreshed while not held as running", node)
		}
		// A change while the refresh runs: its pass waits for it.
		r.Enqueue(ctx, node, "module registered")
		r.mu.Lock()
		_, queued := r.pending[node]
		r.mu.Unlock()
		if queued {
			t.Errorf("%s queued for a pass while its status is refreshed", node)
		}
		return nil
	}

	r.Enqueue(ctx, "queued", "module registered")
	r.refreshStatus(ctx, "queued")

	r.mu.Lock()
	r.running["busy"] = true
	r.mu.Unlock()
	r.refreshStatus(ctx, "busy")

	r.refreshStatus(ctx, "idle")

	if !slices.Equal(refreshed, []string{"idle"}) {
		t.Errorf("refreshed %v, want only the node neither queued nor passed over", refreshed)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.dirty["busy"]; !ok {
		t.Error("the node passed over is not passed over again after")
	}
	if r.running["idle"] {
		t.Error("the refreshed node is still held")
	}
	if _, ok := r.pending["idle"]; !ok {
		t.Error("the change that came during the refresh is not queued after it")
	}
}
