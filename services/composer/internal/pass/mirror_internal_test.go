package pass

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"mesh.dev/internal/natsx"
	"mesh.dev/internal/testutil"
)

// TestMirrorAfterTheStoreWentBack: nats-server's store goes back to an
// older snapshot under a mirror. Until its watch started over the mirror
// is not current (it holds writes the bucket lost, at sequences handed out
// again); then it is current again, holding what the bucket holds, and
// follows the writes made since.
func TestMirrorAfterTheStoreWentBack(t *testing.T) {
	t.Parallel()
	e := testutil.StartJetStream(t)
	_, js := testutil.ConnectJetStream(t, e)
	ctx := context.Background()
	kv, err := natsx.EnsureKV(ctx, js, natsx.KVSpec{Bucket: "mirrored", History: 1})
	if err != nil {
		t.Fatal(err)
	}
	put := func(key, value string) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for {
			_, err := kv.Put(ctx, key, []byte(value))
			if err == nil {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("put %s: %v", key, err)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	m := newMirror("test", recordSummary)
	following(t, m, kv)
	sum := func(v string) string { s, _ := recordSummary([]byte(v)); return s }
	holds := func(key, value string) (bool, string) {
		v, ok := m.lookup(key)
		switch {
		case value == "" && (!ok || !v.put):
			return true, ""
		case value != "" && ok && v.put && v.sum == sum(value):
			return true, ""
		}
		return false, fmt.Sprintf("%s: %+v (held %v)", key, v, ok)
	}
	waitCurrent := func(what string, want map[string]string) {
		t.Helper()
		waitFor(t, what, 30*time.Second, func() (bool, string) {
			cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			defer cancel()
			if !m.current(cctx, kv, 0) {
				m.mu.Lock()
				defer m.mu.Unlock()
				return false, fmt.Sprintf("not current (seen %d, ready %v)", m.seen, m.ready)
			}
			for k, v := range want {
				if ok, why := holds(k, v); !ok {
					return false, why
				}
			}
			return true, ""
		})
	}

	put("a", "1")
	put("b", "1")
	waitCurrent("the mirror holds a and b", map[string]string{"a": "1", "b": "1"})
	var snap string
	e, snap = testutil.SnapshotJetStream(t, e)
	put("a", "2")
	put("lost", "1")
	for i := range 20 {
		put(fmt.Sprint("lost", i), "1")
	}
	waitCurrent("the mirror holds the writes after the snapshot", map[string]string{"a": "2", "lost": "1"})

	testutil.RollbackJetStream(t, e, snap)
	waitCurrent("the mirror holds what the bucket holds after it went back", map[string]string{"a": "1", "b": "1", "lost": ""})
	put("c", "1")
	waitCurrent("the mirror follows the writes after the store went back", map[string]string{"c": "1"})
	// The handle was acknowledged revisions the stream now hands out
	// again: a tenure's barriers keep asking the stream (waiting for Acked
	// they would time out, the watch never reaching it), and hold.
	for i := range 3 {
		key := fmt.Sprint("tenured", i)
		put(key, "1")
		if !m.current(ctx, kv, 7) {
			t.Fatalf("barrier %d of a tenure after the store went back: not current (Acked %d)", i, kv.Acked())
		}
		if ok, why := holds(key, "1"); !ok {
			t.Fatalf("barrier %d of a tenure after the store went back: %s", i, why)
		}
	}
}

// following runs m's watch of kv until the test ends.
func following(t *testing.T, m *mirror, kv *natsx.KV) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- m.follow(ctx, kv) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("follow: %v", err)
		}
	})
}

// TestMirrorNotCurrentAheadOfTheStream: a mirror that saw more of the
// stream than the stream now holds is not current, whatever it waits for.
func TestMirrorNotCurrentAheadOfTheStream(t *testing.T) {
	t.Parallel()
	_, js := testutil.ConnectJetStream(t, testutil.StartJetStream(t))
	ctx := context.Background()
	kv, err := natsx.EnsureKV(ctx, js, natsx.KVSpec{Bucket: "ahead", History: 1})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(ctx, "a", []byte("1")); err != nil {
		t.Fatal(err)
	}
	m := newMirror("test", recordSummary)
	m.running, m.ready, m.seen = true, true, 5
	if m.current(ctx, kv, 0) {
		t.Error("a mirror that saw revision 5 of a stream whose last is 1 counts as current")
	}
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
		time.Sleep(20 * time.Millisecond)
	}
}

// TestOwnWrites: every write of the last minute counts as the composer's
// own, however many a key had since; a revision it did not write, or a
// delete it did not make, does not.
func TestOwnWrites(t *testing.T) {
	t.Parallel()
	var o ownWrites
	for rev := uint64(10); rev < 20; rev++ {
		o.wrote("assignments", "a", rev, false)
	}
	put := func(rev uint64) *natsx.Entry { return &natsx.Entry{Key: "a", Revision: rev, Op: jetstream.KeyValuePut} }
	if !o.own("assignments", put(10)) || !o.own("assignments", put(19)) {
		t.Error("a write made ten writes ago is not counted as own")
	}
	if o.own("assignments", put(20)) || o.own("compositions", put(19)) {
		t.Error("a revision never written counts as own")
	}
	del := &natsx.Entry{Key: "a", Op: jetstream.KeyValueDelete}
	if o.own("assignments", del) {
		t.Error("a delete never made counts as own")
	}
	o.wrote("assignments", "a", 0, true)
	if !o.own("assignments", del) {
		t.Error("a delete made does not count as own")
	}
}

// TestMirrorListsANodesKeys: the composition mirror lists a node's module
// keys as the stream leader would — values and delete markers, not its
// own composition nor other nodes' keys — and drops a marker once the
// stream holds nothing of it, but never a value written after it.
func TestMirrorListsANodesKeys(t *testing.T) {
	t.Parallel()
	e := testutil.StartJetStream(t)
	_, js := testutil.ConnectJetStream(t, e)
	ctx := context.Background()
	kv, err := natsx.EnsureKV(ctx, js, natsx.KVSpec{Bucket: "listed", History: 1})
	if err != nil {
		t.Fatal(err)
	}
	m := newMirror("test", recordSummary)
	m.nodeOf = compositionNode
	if _, ok := m.keysOf("ace"); ok {
		t.Error("a mirror whose watch does not run lists keys")
	}
	following(t, m, kv)
	fa, fb := strings.Repeat("a", 64), strings.Repeat("b", 64)
	a, b, other := "ace.motd."+fa, "ace.web."+fb, "bee.motd."+fa
	for _, k := range []string{a, b, "ace.node", other} {
		if _, err := kv.Put(ctx, k, []byte("v")); err != nil {
			t.Fatal(err)
		}
	}
	if err := kv.Delete(ctx, b); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "mirror current", 10*time.Second, func() (bool, string) { return m.current(ctx, kv, 0), "not current" })
	if got, _ := m.keysOf("ace"); fmt.Sprint(got) != fmt.Sprint([]string{a, b}) {
		t.Errorf("keys of ace %s; want %s and the marker of %s", got, a, b)
	}
	marker, _ := m.lookup(b)
	m.forgetMarker(a, ^uint64(0))
	m.forgetMarker(b, marker.rev)
	if got, _ := m.keysOf("ace"); fmt.Sprint(got) != fmt.Sprint([]string{a}) {
		t.Errorf("keys of ace after its marker was removed %s; want only the value %s", got, a)
	}
	if got, _ := m.keysOf("bee"); fmt.Sprint(got) != fmt.Sprint([]string{other}) {
		t.Errorf("keys of bee %s", got)
	}
}

// TestMirrorBarrierInATenure: the first barrier of a lease tenure asks the
// stream; the later ones of the tenure ask nothing and wait only for the
// writes made through the handle, which the mirror then holds; a barrier
// of no tenure, or of a new one, asks again and sees a write made by
// another handle.
func TestMirrorBarrierInATenure(t *testing.T) {
	t.Parallel()
	_, js := testutil.ConnectJetStream(t, testutil.StartJetStream(t))
	ctx := context.Background()
	m, kv, asked := countedMirror(t, js, "tenure")
	other, err := natsx.OpenKV(ctx, js, "tenure")
	if err != nil {
		t.Fatal(err)
	}
	sum := func(v string) string { s, _ := recordSummary([]byte(v)); return s }
	holds := func(key, value string) bool {
		v, ok := m.lookup(key)
		return ok && v.put && v.sum == sum(value)
	}

	if _, err := kv.Put(ctx, "a", []byte("1")); err != nil {
		t.Fatal(err)
	}
	if !m.current(ctx, kv, 7) || asked() != 1 || !holds("a", "1") {
		t.Fatalf("first barrier of tenure 7: %d stream-info requests (want 1), a held %v", asked(), holds("a", "1"))
	}
	for i := range 20 {
		v := fmt.Sprint(i)
		rev, err := kv.Put(ctx, "b", []byte(v))
		if err != nil {
			t.Fatal(err)
		}
		if kv.Acked() < rev {
			t.Fatalf("Acked %d after a write acknowledged at %d", kv.Acked(), rev)
		}
		if !m.current(ctx, kv, 7) || !holds("b", v) {
			t.Fatalf("barrier of tenure 7 after a write through the handle: b not held at %q", v)
		}
	}
	if asked() != 1 {
		t.Errorf("later barriers of tenure 7 asked the stream %d times; want none", asked()-1)
	}
	rev, err := other.Put(ctx, "c", []byte("1"))
	if err != nil {
		t.Fatal(err)
	}
	if kv.Acked() >= rev {
		t.Errorf("a write through another handle moved Acked to %d", kv.Acked())
	}
	if !m.current(ctx, kv, 0) || asked() != 2 || !holds("c", "1") {
		t.Errorf("barrier of no tenure: %d stream-info requests (want 2), another handle's write held %v", asked(), holds("c", "1"))
	}
	if _, err := other.Put(ctx, "c", []byte("2")); err != nil {
		t.Fatal(err)
	}
	if !m.current(ctx, kv, 8) || asked() != 3 || !holds("c", "2") {
		t.Errorf("first barrier of tenure 8: %d stream-info requests (want 3), another handle's write held %v", asked(), holds("c", "2"))
	}
	if !m.current(ctx, kv, 7) || asked() != 4 {
		t.Errorf("a barrier of the older tenure 7 after 8's: %d stream-info requests, want 4", asked())
	}
	// A write that got no answer may have been stored with a revision
	// Acked does not know: the next barrier of the tenure asks.
	if !m.current(ctx, kv, 8) || asked() != 4 {
		t.Errorf("a later barrier of tenure 8: %d stream-info requests, want 4", asked())
	}
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := kv.Put(cancelled, "d", []byte("1")); err == nil {
		t.Fatal("a put on a cancelled context succeeded")
	}
	if !m.current(ctx, kv, 8) || asked() != 5 {
		t.Errorf("barrier of tenure 8 after a write with no answer: %d stream-info requests, want 5", asked())
	}
	if !m.current(ctx, kv, 8) || asked() != 5 {
		t.Errorf("the barrier after: %d stream-info requests, want still 5", asked())
	}
	// A watch that starts over forgets the tenure.
	m.mu.Lock()
	m.resetLocked()
	m.mu.Unlock()
	if m.tenure != 0 {
		t.Errorf("tenure %d kept over a reset", m.tenure)
	}
}

// TestMirrorTenureEndsAtAReconnect: a server that comes back may hold less
// than it acknowledged (restored from an older snapshot), and the watch
// notices only later. The first barrier of the tenure after the
// connection came back asks the stream (which finds that out), not the
// handle's acknowledgements.
func TestMirrorTenureEndsAtAReconnect(t *testing.T) {
	t.Parallel()
	e := testutil.StartJetStream(t)
	nc, js := testutil.ConnectJetStream(t, e)
	ctx := context.Background()
	m, kv, asked := countedMirror(t, js, "reconnect")
	if _, err := kv.Put(ctx, "a", []byte("1")); err != nil {
		t.Fatal(err)
	}
	if !m.current(ctx, kv, 7) || !m.current(ctx, kv, 7) || asked() != 1 {
		t.Fatalf("two barriers of tenure 7: %d stream-info requests, want 1", asked())
	}
	unsure := kv.Unsure()
	testutil.RestartJetStream(t, e)
	waitFor(t, "the connection back", 30*time.Second, func() (bool, string) {
		return nc.Stats().Reconnects > 0 && nc.IsConnected(), "not yet"
	})
	if kv.Unsure() <= unsure {
		t.Errorf("Unsure %d after a reconnect, %d before; want it moved", kv.Unsure(), unsure)
	}
	waitFor(t, "a barrier after the reconnect", 30*time.Second, func() (bool, string) {
		return m.current(ctx, kv, 7), "not current"
	})
	if asked() < 2 {
		t.Errorf("barrier of tenure 7 after a reconnect asked the stream %d times in all; want it asked again", asked())
	}
	n := asked()
	if !m.current(ctx, kv, 7) || asked() != n {
		t.Errorf("the barrier after: %d stream-info requests, want still %d", asked(), n)
	}
}

// countedMirror makes bucket and a mirror following it (ready), and counts the
// stream-info requests (LastSequence) its barriers make. Each barrier must
// see the watch deliver: a slow machine must not make it time out.
func countedMirror(t *testing.T, js jetstream.JetStream, bucket string) (*mirror, *natsx.KV, func() int) {
	t.Helper()
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	kv, err := natsx.EnsureKV(context.Background(), js, natsx.KVSpec{Bucket: bucket, History: 1}, natsx.WithTracerProvider(tp))
	if err != nil {
		t.Fatal(err)
	}
	m := newMirror("test", recordSummary)
	m.wait = 10 * time.Second
	following(t, m, kv)
	waitFor(t, "the mirror ready", 10*time.Second, func() (bool, string) {
		m.mu.Lock()
		defer m.mu.Unlock()
		return m.ready, "not ready"
	})
	asked := func() int {
		n := 0
		for _, s := range exp.GetSpans() {
			if s.Name == "kv.last_sequence "+bucket {
				n++
			}
		}
		return n
	}
	return m, kv, asked
}
