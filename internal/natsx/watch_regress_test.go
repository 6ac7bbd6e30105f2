package natsx

import (
	"context"
	"errors"
	"os"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// storeRollback runs an embedded server whose JetStream store can be set
// back to a snapshot taken earlier, as a restore of an older disk image (or
// a disk that lied about its fsyncs) does: acknowledged writes are lost and
// their sequences handed out again.
type storeRollback struct {
	t    *testing.T
	e    *Embedded
	snap string
}

func newStoreRollback(t *testing.T) *storeRollback {
	return &storeRollback{t: t, e: startServer(t, EmbeddedConfig{})}
}

// snapshot stops the server, copies its store and starts it again.
func (r *storeRollback) snapshot() {
	r.t.Helper()
	r.e.Shutdown()
	r.snap = r.t.TempDir()
	if err := os.CopyFS(r.snap, os.DirFS(r.e.Config().DataDir)); err != nil {
		r.t.Fatal(err)
	}
	r.e = startServer(r.t, r.e.Config())
}

// rollback stops the server, puts the snapshot in place of its store and
// starts it again on the same port.
func (r *storeRollback) rollback() {
	r.t.Helper()
	r.e.Shutdown()
	dir := r.e.Config().DataDir
	if err := os.RemoveAll(dir); err != nil {
		r.t.Fatal(err)
	}
	if err := os.CopyFS(dir, os.DirFS(r.snap)); err != nil {
		r.t.Fatal(err)
	}
	r.e = startServer(r.t, r.e.Config())
}

func putValue(t *testing.T, kv *KV, key, value string) uint64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for {
		rev, err := kv.Put(ctx, key, []byte(value))
		if err == nil {
			return rev
		}
		if ctx.Err() != nil {
			t.Fatalf("put %s: %v", key, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// reachable waits until the bucket answers again after a restart.
func reachable(t *testing.T, kv *KV) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_, err := kv.LastSequence(ctx)
		cancel()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("bucket %s unreachable: %v", kv.Bucket(), err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// expect reads events from w until it has len(want) of them and compares.
func expect(t *testing.T, w *Watcher, want ...event) {
	t.Helper()
	for i, ev := range want {
		got := next(t, w)
		var g event
		switch {
		case got != nil && got.Resync:
			g = event{key: "<resync>"}
		default:
			g = eventOf(got)
		}
		if g != ev {
			t.Fatalf("event %d: got %v, want %v", i, g, ev)
		}
		if got != nil && got.Key == "gone" && got.Op == jetstream.KeyValueDelete && got.Revision != 0 {
			t.Errorf("the delete marker of a key that holds nothing since the rollback has revision %d, want 0", got.Revision)
		}
	}
}

// TestWatchStartsOverWhenTheStreamWentBack: after the store went back to
// an older snapshot, a watch delivers what the bucket holds now (the older
// values, a delete marker for a key written only after the snapshot) and
// then every new write, although the new writes reuse sequences it
// delivered before.
func TestWatchStartsOverWhenTheStreamWentBack(t *testing.T) {
	t.Parallel()
	put, del := jetstream.KeyValuePut, jetstream.KeyValueDelete
	r := newStoreRollback(t)
	_, js := connect(t, r.e)
	kv := ensureKV(t, js, testSpec(1))
	putValue(t, kv, "a", "1")
	putValue(t, kv, "b", "1")
	r.snapshot()
	reachable(t, kv)

	w, err := kv.Watch(t.Context(), ">", ResyncMarker())
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	expect(t, w, event{key: "a", value: "1", op: put}, event{key: "b", value: "1", op: put}, doneMarker)
	putValue(t, kv, "gone", "1")
	putValue(t, kv, "a", "2")
	expect(t, w, event{key: "gone", value: "1", op: put}, event{key: "a", value: "2", op: put})

	r.rollback()
	expect(t, w, event{key: "<resync>"}, event{key: "a", value: "1", op: put}, event{key: "b", value: "1", op: put},
		event{key: "gone", op: del}, doneMarker)
	// The sequence the lost write of "gone" had is handed out again.
	putValue(t, kv, "c", "1")
	expect(t, w, event{key: "c", value: "1", op: put})
	if n := w.Regressions(); n != 1 {
		t.Errorf("the watch started over %d times, want 1", n)
	}
}

// TestWatchStartsOverWhenItsStopIsLost: nats.go's ordered consumer can
// lose a Stop: one that comes while it replaces its inner iterator after a
// server restart stops the iterator replaced, and its Next goes on reading
// the new one (seen as a mirror never starting over after its store went
// back). Here every Stop is lost that way: a read the iterator's Stop ended
// goes on until its context ends. The watch still starts over after the
// store went back, and still stops.
func TestWatchStartsOverWhenItsStopIsLost(t *testing.T) {
	// Not parallel: it replaces watchNext for every watch of the package.
	read := watchNext
	watchNext = func(it jetstream.MessagesContext, ctx context.Context) (jetstream.Msg, error) {
		m, err := read(it, ctx)
		if errors.Is(err, jetstream.ErrMsgIteratorClosed) {
			<-ctx.Done()
			return nil, ctx.Err()
		}
		return m, err
	}
	t.Cleanup(func() { watchNext = read })
	put, del := jetstream.KeyValuePut, jetstream.KeyValueDelete
	r := newStoreRollback(t)
	_, js := connect(t, r.e)
	kv := ensureKV(t, js, testSpec(1))
	putValue(t, kv, "a", "1")
	r.snapshot()
	reachable(t, kv)

	w, err := kv.Watch(t.Context(), ">", ResyncMarker())
	if err != nil {
		t.Fatal(err)
	}
	expect(t, w, event{key: "a", value: "1", op: put}, doneMarker)
	putValue(t, kv, "gone", "1")
	expect(t, w, event{key: "gone", value: "1", op: put})

	r.rollback()
	expect(t, w, event{key: "<resync>"}, event{key: "a", value: "1", op: put}, event{key: "gone", op: del}, doneMarker)
	putValue(t, kv, "c", "1")
	expect(t, w, event{key: "c", value: "1", op: put})

	w.Stop()
	select {
	case _, ok := <-w.Updates():
		for ok {
			_, ok = <-w.Updates()
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the watch did not stop")
	}
}

// TestWatchThatCannotStartOverEnds: a watch resuming from a revision has
// no meaning once that revision was handed out again: it ends with
// ErrRegressed.
func TestWatchThatCannotStartOverEnds(t *testing.T) {
	t.Parallel()
	r := newStoreRollback(t)
	_, js := connect(t, r.e)
	kv := ensureKV(t, js, testSpec(1))
	putValue(t, kv, "a", "1")
	r.snapshot()
	reachable(t, kv)
	w, err := kv.Watch(t.Context(), ">", ResumeFromRevision(1))
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	next(t, w)
	next(t, w)
	putValue(t, kv, "b", "1")
	next(t, w)
	r.rollback()
	select {
	case e, ok := <-w.Updates():
		if ok {
			t.Fatalf("got %v, want the watch to end", eventOf(e))
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the watch did not end")
	}
	if err := w.Err(); !errors.Is(err, ErrRegressed) {
		t.Errorf("Err = %v, want ErrRegressed", err)
	}
}

// TestRegressedAfterTheStreamGrewPast: a stream that went back and was
// written past the last message a watch delivered before the watch looked
// is still found regressed: the message at that sequence is another one.
func TestRegressedAfterTheStreamGrewPast(t *testing.T) {
	t.Parallel()
	r := newStoreRollback(t)
	_, js := connect(t, r.e)
	kv := ensureKV(t, js, testSpec(1))
	putValue(t, kv, "a", "1")
	r.snapshot()
	reachable(t, kv)
	w, err := kv.Watch(t.Context(), ">")
	if err != nil {
		t.Fatal(err)
	}
	next(t, w)
	next(t, w)
	putValue(t, kv, "b", "1")
	putValue(t, kv, "a", "2")
	next(t, w)
	next(t, w)
	// Stopped, the watch no longer checks on its own; regressed still
	// judges the last message it delivered.
	w.Stop()
	ctx := t.Context()
	if got, err := w.regressed(ctx); err != nil || got {
		t.Fatalf("before the rollback regressed = %v, %v", got, err)
	}
	r.rollback()
	reachable(t, kv)
	for _, k := range []string{"x", "y", "z"} {
		putValue(t, kv, k, "new")
	}
	if got, err := w.regressed(ctx); err != nil || !got {
		t.Errorf("after the rollback and three writes regressed = %v, %v; want true", got, err)
	}
}

// TestRegressedWhenTheDeliveredMessageWasReplaced: the stream went back and
// grew past the last message the watch delivered, and in a history-1
// bucket the message now at that sequence was replaced by a newer write of
// its key: nothing is left at that sequence, and only the key of the
// delivered message (its newest message is below it) shows the regression.
func TestRegressedWhenTheDeliveredMessageWasReplaced(t *testing.T) {
	t.Parallel()
	r := newStoreRollback(t)
	_, js := connect(t, r.e)
	kv := ensureKV(t, js, testSpec(1))
	putValue(t, kv, "a", "1") // seq 1
	r.snapshot()
	reachable(t, kv)
	w, err := kv.Watch(t.Context(), ">")
	if err != nil {
		t.Fatal(err)
	}
	next(t, w)
	next(t, w)
	putValue(t, kv, "b", "1") // seq 2
	putValue(t, kv, "c", "1") // seq 3: the last delivered
	next(t, w)
	next(t, w)
	w.Stop()
	ctx := t.Context()
	r.rollback()
	reachable(t, kv)
	// After the rollback: seq 2 and 3 are handed out again, to x and y;
	// then y is written again (seq 4), which removes seq 3 (history 1).
	for _, k := range []string{"x", "y", "y"} {
		putValue(t, kv, k, "new")
	}
	if got, err := w.regressed(ctx); err != nil || !got {
		t.Errorf("regressed = %v, %v; want true (c's newest message is gone with the rollback)", got, err)
	}
}

// TestOneWatchTellsTheOthers: two watches of one bucket on one connection;
// when one finds the stream went back, the other starts over too, even if
// its own check would come too late to tell.
func TestOneWatchTellsTheOthers(t *testing.T) {
	t.Parallel()
	r := newStoreRollback(t)
	_, js := connect(t, r.e)
	kv := ensureKV(t, js, testSpec(1))
	putValue(t, kv, "a", "1")
	w1, err := kv.Watch(t.Context(), ">")
	if err != nil {
		t.Fatal(err)
	}
	defer w1.Stop()
	w2, err := kv.Watch(t.Context(), ">")
	if err != nil {
		t.Fatal(err)
	}
	defer w2.Stop()
	for _, w := range []*Watcher{w1, w2} {
		next(t, w)
		next(t, w)
	}
	w1.startOver()
	w1.tellRegressed()
	deadline := time.Now().Add(20 * time.Second)
	for w2.Regressions() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the second watch was not told to start over")
		}
		time.Sleep(10 * time.Millisecond)
	}
}
