package natsx

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// silence makes the iterators a test picks drop every message they read,
// as a consumer gone or fallen silent without an error would: the watch
// waits and nothing comes.
type silence struct {
	mu     sync.Mutex
	silent map[jetstream.MessagesContext]bool
	// last is the iterator read last.
	last jetstream.MessagesContext
	// first silences the first iterator read from now on.
	first bool
}

// quickStallChecks makes the watch checks of this test frequent and its
// stall threshold short, and reads watches through s. The natsx tests that
// run in parallel wait until the sequential ones like this end.
func quickStallChecks(t *testing.T) *silence {
	s := &silence{silent: map[jetstream.MessagesContext]bool{}}
	tick, every, after, next := regressionTick, regressionCheckEvery, stallAfter, watchNext
	regressionTick, regressionCheckEvery, stallAfter = 20*time.Millisecond, 100*time.Millisecond, 400*time.Millisecond
	watchNext = func(it jetstream.MessagesContext, ctx context.Context) (jetstream.Msg, error) {
		for {
			s.mu.Lock()
			s.last = it
			if s.first {
				s.silent[it], s.first = true, false
			}
			drop := s.silent[it]
			s.mu.Unlock()
			m, err := next(it, ctx)
			if err != nil || !drop {
				return m, err
			}
		}
	}
	t.Cleanup(func() {
		regressionTick, regressionCheckEvery, stallAfter, watchNext = tick, every, after, next
	})
	return s
}

// watching starts a watch the test's end stops.
func watching(t *testing.T, kv *KV, keys string, opts ...WatchOption) *Watcher {
	t.Helper()
	w, err := kv.Watch(t.Context(), keys, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.Stop)
	return w
}

// silenceCurrent silences the iterator the watch reads now; the next one
// (made by a resume) is left alone.
func (s *silence) silenceCurrent() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.silent[s.last] = true
}

// silenceFirst silences the next watch's first iterator (its resume's is
// read).
func (s *silence) silenceFirst() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.first = true
}

// TestWatchResumesAfterItsConsumerFellSilent: a watch whose consumer stops
// delivering, with no error, while its keys get new values, resumes on a
// new consumer after what it delivered: it delivers the writes it missed,
// once each, and then the later ones.
func TestWatchResumesAfterItsConsumerFellSilent(t *testing.T) {
	s := quickStallChecks(t)
	_, js := serverAndJS(t)
	kv := ensureKV(t, js, testSpec(1))
	put := jetstream.KeyValuePut
	putValue(t, kv, "a", "1")
	w := watching(t, kv, ">")
	expect(t, w, event{key: "a", value: "1", op: put}, doneMarker)
	s.silenceCurrent()
	putValue(t, kv, "b", "1")
	putValue(t, kv, "a", "2")
	expect(t, w, event{key: "b", value: "1", op: put}, event{key: "a", value: "2", op: put})
	putValue(t, kv, "c", "1")
	expect(t, w, event{key: "c", value: "1", op: put})
	if n := w.Resumes(); n != 1 {
		t.Errorf("the watch resumed %d times, want 1", n)
	}
	if n := w.Regressions(); n != 0 {
		t.Errorf("the watch started over %d times, want 0", n)
	}
}

// TestWatchResumesWhileItsRegressionCheckFails: the stall check does not
// wait for the regression check to answer. A watch whose stream info keeps
// failing (a server that answers direct gets but not stream info, say)
// and whose consumer fell silent still resumes and delivers what it missed.
func TestWatchResumesWhileItsRegressionCheckFails(t *testing.T) {
	s := quickStallChecks(t)
	info := watchStreamInfo
	watchStreamInfo = func(context.Context, jetstream.Stream) (*jetstream.StreamInfo, error) {
		return nil, fmt.Errorf("stream info refused by the test")
	}
	t.Cleanup(func() { watchStreamInfo = info })
	_, js := serverAndJS(t)
	kv := ensureKV(t, js, testSpec(1))
	put := jetstream.KeyValuePut
	putValue(t, kv, "a", "1")
	w := watching(t, kv, ">")
	expect(t, w, event{key: "a", value: "1", op: put}, doneMarker)
	// The read already waiting delivers the next message; the silence
	// drops the one after it.
	s.silenceCurrent()
	putValue(t, kv, "b", "1")
	putValue(t, kv, "a", "2")
	expect(t, w, event{key: "b", value: "1", op: put}, event{key: "a", value: "2", op: put})
	if n := w.Resumes(); n != 1 {
		t.Errorf("the watch resumed %d times, want 1", n)
	}
}

// TestWatchOfUpdatesResumesAfterWhereItStarted: an updates-only watch that
// fell silent before it delivered anything resumes after where its
// consumer started: the writes made since come, the values before do not.
func TestWatchOfUpdatesResumesAfterWhereItStarted(t *testing.T) {
	s := quickStallChecks(t)
	_, js := serverAndJS(t)
	kv := ensureKV(t, js, testSpec(1))
	put := jetstream.KeyValuePut
	putValue(t, kv, "old", "1")
	putValue(t, kv, "old", "2")
	s.silenceFirst()
	w := watching(t, kv, ">", UpdatesOnly())
	putValue(t, kv, "new", "1")
	expect(t, w, event{key: "new", value: "1", op: put})
	if n := w.Resumes(); n != 1 {
		t.Errorf("the watch resumed %d times, want 1", n)
	}
}

// TestWatchStalledInItsInitialValues: a watch silenced while it delivers
// its initial values resumes and still marks their end once, after all of
// them.
func TestWatchStalledInItsInitialValues(t *testing.T) {
	s := quickStallChecks(t)
	_, js := serverAndJS(t)
	kv := ensureKV(t, js, testSpec(1))
	put := jetstream.KeyValuePut
	for _, k := range []string{"a", "b", "c"} {
		putValue(t, kv, k, "1")
	}
	s.silenceFirst()
	w := watching(t, kv, ">")
	expect(t, w, event{key: "a", value: "1", op: put}, event{key: "b", value: "1", op: put}, event{key: "c", value: "1", op: put}, doneMarker)
	putValue(t, kv, "d", "1")
	expect(t, w, event{key: "d", value: "1", op: put})
	if n := w.Resumes(); n != 1 {
		t.Errorf("the watch resumed %d times, want 1", n)
	}
}

// TestIdleWatchDoesNotResume: a watch with nothing to deliver, or whose
// reader is slow, is not stalled.
func TestIdleWatchDoesNotResume(t *testing.T) {
	quickStallChecks(t)
	_, js := serverAndJS(t)
	kv := ensureKV(t, js, testSpec(1))
	putValue(t, kv, "a", "1")
	w := watching(t, kv, "a")
	expect(t, w, event{key: "a", value: "1", op: jetstream.KeyValuePut}, doneMarker)
	// Writes of other keys are not the watch's.
	putValue(t, kv, "b", "1")
	// Its own, left unread for a while.
	putValue(t, kv, "a", "2")
	time.Sleep(4 * stallAfter)
	expect(t, w, event{key: "a", value: "2", op: jetstream.KeyValuePut})
	if n := w.Resumes(); n != 0 {
		t.Errorf("the watch resumed %d times, want 0", n)
	}
}

// TestWatchAfterItsConsumerWasDeleted: the server drops the watch's
// consumer (as a server that held it and died would). Whether nats.go's
// ordered consumer or the watch's own check makes the new one (both run
// here: the checks are quick), every write after comes once, in order.
func TestWatchAfterItsConsumerWasDeleted(t *testing.T) {
	quickStallChecks(t)
	_, js := serverAndJS(t)
	kv := ensureKV(t, js, testSpec(1))
	put := jetstream.KeyValuePut
	putValue(t, kv, "a", "1")
	w := watching(t, kv, ">")
	expect(t, w, event{key: "a", value: "1", op: put}, doneMarker)
	for round := range 3 {
		w.mu.Lock()
		name := w.cons.CachedInfo().Name
		w.mu.Unlock()
		ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
		// nats.go may have replaced it already: a consumer not found is fine.
		_ = js.DeleteConsumer(ctx, kvStreamName(kv.bucket), name)
		cancel()
		v := fmt.Sprint(round + 2)
		putValue(t, kv, "a", v)
		putValue(t, kv, "b", v)
		expect(t, w, event{key: "a", value: v, op: put}, event{key: "b", value: v, op: put})
	}
	select {
	case e := <-w.Updates():
		t.Errorf("one more entry than written: %v", eventOf(e))
	case <-time.After(4 * stallAfter):
	}
	t.Logf("the watch resumed %d times by itself over 3 deletions", w.Resumes())
}
