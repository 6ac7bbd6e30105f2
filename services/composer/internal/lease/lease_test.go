package lease

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"mesh.dev/internal/natsx"
	"mesh.dev/internal/testutil"
)

// fencer hands out epochs 1, 2, … as the signer's Fence does, or fails.
type fencer struct {
	mu   sync.Mutex
	last uint64
	fail error
}

func (f *fencer) Fence(_ context.Context, _ string) (uint64, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.fail != nil {
		return 0, f.fail
	}
	f.last++
	return f.last, nil
}

// bucket is a composer-lease bucket with a TTL on a real embedded JetStream.
func bucket(t *testing.T, ttl time.Duration) *natsx.KV {
	t.Helper()
	_, js := testutil.ConnectJetStream(t, testutil.StartJetStream(t))
	kv, err := natsx.EnsureKV(context.Background(), js, natsx.LeaseSpec(1, ttl))
	if err != nil {
		t.Fatal(err)
	}
	return kv
}

// running is a Lease whose Run loop runs until the test ends or stop.
type running struct {
	*Lease
	stop    func()
	tenures chan context.Context
}

func start(t *testing.T, kv *natsx.KV, holder string, ttl time.Duration, f Fencer, now func() time.Time) *running {
	t.Helper()
	l := New(kv, holder, ttl, f, nil)
	if now != nil {
		l.now = now
	}
	r := &running{Lease: l, tenures: make(chan context.Context, 8)}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- l.Run(ctx, func(tctx context.Context) { r.tenures <- tctx }) }()
	var once sync.Once
	r.stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("lease %s: %v", holder, err)
			}
		})
	}
	t.Cleanup(r.stop)
	return r
}

func waitFor(t *testing.T, what string, d time.Duration, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		ok, why := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s: %s", what, d, why)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func (r *running) tenure(t *testing.T) context.Context {
	t.Helper()
	select {
	case ctx := <-r.tenures:
		return ctx
	case <-time.After(20 * time.Second):
		t.Fatalf("%s never took the lease (holder %q)", r.holder, r.Holder())
		return nil
	}
}

func stored(t *testing.T, kv *natsx.KV) (record, natsx.Entry, bool) {
	t.Helper()
	e, err := kv.Get(context.Background(), natsx.KeyLeaseLeader)
	if errors.Is(err, natsx.ErrNotFound) {
		return record{}, natsx.Entry{}, false
	}
	if err != nil {
		t.Fatal(err)
	}
	var r record
	if err := json.Unmarshal(e.Value, &r); err != nil {
		t.Fatal(err)
	}
	return r, e, true
}

// TestTake covers taking the lease: the first contender takes it with an
// epoch from the fencer, recorded in the key; a second contender does not
// hold it, and its Check says who does.
func TestTake(t *testing.T) {
	t.Parallel()
	const ttl = 30 * time.Second
	kv := bucket(t, ttl)
	f := &fencer{}
	a := start(t, kv, "a", ttl, f, nil)
	a.tenure(t)
	epoch, err := a.Check(ttl / 3)
	if err != nil || epoch != 1 {
		t.Fatalf("a.Check = %d, %v; want epoch 1", epoch, err)
	}
	if r, _, ok := stored(t, kv); !ok || r.Holder != "a" || r.Epoch != 1 || r.TTLMilli != ttl.Milliseconds() {
		t.Errorf("lease key holds %+v (present %v)", r, ok)
	}
	b := start(t, kv, "b", ttl, f, nil)
	waitFor(t, "b sees a hold the lease", 10*time.Second, func() (bool, string) {
		return b.Holder() == "a", fmt.Sprintf("b says the holder is %q", b.Holder())
	})
	if _, err := b.Check(0); !errors.Is(err, ErrNotHolder) || !strings.Contains(err.Error(), `"a"`) {
		t.Errorf("b.Check = %v, want ErrNotHolder naming a", err)
	}
	if b.Held() {
		t.Error("two composers hold the lease")
	}
}

// TestRenew covers renewal: the holder rewrites the key (CAS) every
// RenewInterval, keeping its epoch, and each renewal moves its expiry on.
func TestRenew(t *testing.T) {
	t.Parallel()
	const ttl = 3 * time.Second
	kv := bucket(t, ttl)
	a := start(t, kv, "a", ttl, &fencer{}, nil)
	tctx := a.tenure(t)
	_, first, _ := stored(t, kv)
	a.mu.Lock()
	expires := a.expires
	a.mu.Unlock()
	for i := range 2 {
		// The renewal is written, then its expiry taken once the write
		// returned: a store that shows the write is not yet an expiry
		// moved.
		var renewed time.Time
		waitFor(t, fmt.Sprintf("renewal %d", i+1), 2*ttl, func() (bool, string) {
			_, e, ok := stored(t, kv)
			a.mu.Lock()
			renewed = a.expires
			a.mu.Unlock()
			switch {
			case !ok || e.Revision <= first.Revision:
				return false, "not renewed yet"
			case !renewed.After(expires):
				return false, fmt.Sprintf("renewed in the store, the expiry still %s", renewed)
			}
			return true, ""
		})
		r, e, _ := stored(t, kv)
		first = e
		if r.Holder != "a" || r.Epoch != 1 {
			t.Errorf("renewal %d wrote %+v", i+1, r)
		}
		expires = renewed
	}
	if epoch, err := a.Check(0); err != nil || epoch != 1 {
		t.Errorf("after renewals a.Check = %d, %v", epoch, err)
	}
	if tctx.Err() != nil {
		t.Error("a renewal ended the tenure")
	}
}

// TestLose covers losing the lease: when the key is no longer the holder's
// (another party replaced it) the next renewal fails, the tenure's context
// ends and Check refuses.
func TestLose(t *testing.T) {
	t.Parallel()
	const ttl = 3 * time.Second
	kv := bucket(t, ttl)
	a := start(t, kv, "a", ttl, &fencer{}, nil)
	tctx := a.tenure(t)
	b, _ := json.Marshal(record{Holder: "intruder", Epoch: 9})
	if _, err := kv.Put(context.Background(), natsx.KeyLeaseLeader, b); err != nil {
		t.Fatal(err)
	}
	select {
	case <-tctx.Done():
	case <-time.After(2 * ttl):
		t.Fatal("the tenure did not end after the key was taken")
	}
	if _, err := a.Check(0); !errors.Is(err, ErrNotHolder) {
		t.Errorf("a.Check after losing the lease = %v", err)
	}
	if a.Held() {
		t.Error("a still holds the lease")
	}
}

// TestExpiry covers a holder that stops renewing without giving the lease
// back (a killed or paused process): its key expires after the TTL, a
// contender takes over within the TTL of the last renewal with a higher
// epoch, and the old holder's own Check refuses once its expiry passed.
func TestExpiry(t *testing.T) {
	t.Parallel()
	const ttl = time.Second
	kv := bucket(t, ttl)
	f := &fencer{}
	a := start(t, kv, "a", ttl, f, nil)
	a.tenure(t)
	b := start(t, kv, "b", ttl, f, nil)
	waitFor(t, "b sees a", 10*time.Second, func() (bool, string) { return b.Holder() == "a", b.Holder() })
	a.stop()
	_, last, _ := stored(t, kv)
	b.tenure(t)
	r, e, _ := stored(t, kv)
	if r.Holder != "b" || r.Epoch <= 1 {
		t.Errorf("after a's expiry the key holds %+v", r)
	}
	// Server timestamps: b created its key at most a TTL (and the
	// server's expiry timer) after a's last write.
	if took := e.Created.Sub(last.Created); took > ttl+time.Second {
		t.Errorf("b took over %s after a's last renewal, TTL %s", took, ttl)
	}
	waitFor(t, "a's own check refuses", 2*ttl, func() (bool, string) {
		_, err := a.Check(0)
		return errors.Is(err, ErrNotHolder), fmt.Sprint(err)
	})
}

// TestMargin covers Check's margin (DESIGN.md §5.2 step 9): the holder may
// write only with at least margin left before its lease expires.
func TestMargin(t *testing.T) {
	t.Parallel()
	// A long TTL: no renewal moves the expiry while the clock is set.
	const ttl = 60 * time.Second
	margin := ttl / 3
	kv := bucket(t, ttl)
	var mu sync.Mutex
	t0 := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	now := t0
	clock := func() time.Time {
		mu.Lock()
		defer mu.Unlock()
		return now
	}
	a := start(t, kv, "a", ttl, &fencer{}, clock)
	a.tenure(t)
	cases := []struct {
		name string
		left time.Duration
		ok   bool
	}{
		{"a whole TTL left", ttl, true},
		{"exactly the margin left", margin, true},
		{"just under the margin", margin - time.Millisecond, false},
		{"expired", -time.Second, false},
	}
	for _, tc := range cases {
		mu.Lock()
		now = t0.Add(ttl - tc.left)
		mu.Unlock()
		epoch, err := a.Check(margin)
		if tc.ok && (err != nil || epoch != 1) {
			t.Errorf("%s: Check = %d, %v; want epoch 1", tc.name, epoch, err)
		}
		if !tc.ok && (!errors.Is(err, ErrNotHolder) || !strings.Contains(err.Error(), "of the lease left, need "+margin.String())) {
			t.Errorf("%s: Check = %d, %v; want ErrNotHolder with the time left", tc.name, epoch, err)
		}
	}
}

// TestFenceFails covers a taker that gets no epoch: it gives the key back
// at once (nothing could be signed under it), so another takes over
// without waiting for the TTL.
func TestFenceFails(t *testing.T) {
	t.Parallel()
	const ttl = 6 * time.Second
	kv := bucket(t, ttl)
	a := start(t, kv, "a", ttl, &fencer{fail: errors.New("signer down")}, nil)
	b := start(t, kv, "b", ttl, &fencer{last: 4}, nil)
	b.tenure(t)
	if epoch, err := b.Check(0); err != nil || epoch != 5 {
		t.Errorf("b.Check = %d, %v", epoch, err)
	}
	if a.Held() {
		t.Error("a holds the lease without an epoch")
	}
}

// TestRelease covers a graceful stop: Release deletes the key, so the next
// composer takes over without waiting for the TTL, and the releaser no
// longer passes Check.
func TestRelease(t *testing.T) {
	t.Parallel()
	const ttl = 6 * time.Second
	kv := bucket(t, ttl)
	f := &fencer{}
	a := start(t, kv, "a", ttl, f, nil)
	a.tenure(t)
	b := start(t, kv, "b", ttl, f, nil)
	waitFor(t, "b sees a", 10*time.Second, func() (bool, string) { return b.Holder() == "a", b.Holder() })
	a.stop()
	a.Release(context.Background())
	if _, err := a.Check(0); !errors.Is(err, ErrNotHolder) {
		t.Errorf("a.Check after Release = %v", err)
	}
	b.tenure(t)
	if epoch, _ := b.Check(0); epoch != 2 {
		t.Errorf("b's epoch %d, want 2", epoch)
	}
}

// TestTakenAgainAfterTheStoreWentBack: nats-server's store goes back to a
// snapshot (the holder's renewals since are lost: the key holds its older
// record at an older revision). The next renewal fails; the holder takes
// the lease again at once, by CAS over its own older record, with a fresh
// epoch, instead of waiting for that record to expire; nobody else took it
// meanwhile, or the key would name them.
func TestTakenAgainAfterTheStoreWentBack(t *testing.T) {
	t.Parallel()
	const ttl = 15 * time.Second
	e := testutil.StartJetStream(t)
	_, js := testutil.ConnectJetStream(t, e)
	kv, err := natsx.EnsureKV(context.Background(), js, natsx.LeaseSpec(1, ttl))
	if err != nil {
		t.Fatal(err)
	}
	f := &fencer{}
	a := start(t, kv, "a", ttl, f, nil)
	first := a.tenure(t)
	var snap string
	e, snap = testutil.SnapshotJetStream(t, e)
	reachable(t, kv)
	_, old, _ := stored(t, kv)
	waitFor(t, "a renewal after the snapshot", 2*ttl, func() (bool, string) {
		_, cur, ok := stored(t, kv)
		return ok && cur.Revision > old.Revision, "not renewed yet"
	})
	testutil.RollbackJetStream(t, e, snap)
	reachable(t, kv)
	select {
	case <-first.Done():
	case <-time.After(ttl):
		t.Fatal("the tenure did not end when the renewal failed")
	}
	a.tenure(t)
	if epoch, err := a.Check(0); err != nil || epoch != 2 {
		t.Errorf("a.Check after taking the lease again = %d, %v; want epoch 2", epoch, err)
	}
	r, cur, _ := stored(t, kv)
	if r.Holder != "a" || r.Epoch != 2 {
		t.Errorf("the lease key holds %+v", r)
	}
	// Server timestamps: taken again while the older record still stood.
	if !cur.Created.Before(old.Created.Add(ttl)) {
		t.Errorf("taken again at %s, after the restored record expired (%s)", cur.Created, old.Created.Add(ttl))
	}
}

// reachable waits until the bucket answers again after a restart.
func reachable(t *testing.T, kv *natsx.KV) {
	t.Helper()
	waitFor(t, "the bucket reachable", 30*time.Second, func() (bool, string) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_, err := kv.LastSequence(ctx)
		return err == nil, fmt.Sprint(err)
	})
}
