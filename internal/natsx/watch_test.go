package natsx

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// event is what a test expects from a watcher: a key with its value and op,
// or the initial-values-done marker.
type event struct {
	key, value string
	op         jetstream.KeyValueOp
	done       bool
}

var doneMarker = event{done: true}

func (e event) String() string {
	if e.done {
		return "<initial values done>"
	}
	return fmt.Sprintf("%s=%q(%s)", e.key, e.value, e.op)
}

func eventOf(e *Entry) event {
	if e == nil {
		return doneMarker
	}
	return event{key: e.Key, value: string(e.Value), op: e.Op}
}

func TestWatch(t *testing.T) {
	t.Parallel()
	_, js := serverAndJS(t)
	put := jetstream.KeyValuePut
	del := jetstream.KeyValueDelete

	tests := []struct {
		name string
		// keys is the filter.
		keys string
		opts func(revs map[string]uint64) []WatchOption
		// after is written once the watcher runs.
		after []string
		want  []event
	}{
		{
			name: "latest values, marker, then updates",
			keys: ">",
			// Stored before: a=1, a=2, b=1, c deleted.
			after: []string{"b=2", "-a"},
			want: []event{
				{key: "a", value: "2", op: put}, {key: "b", value: "1", op: put}, {key: "c", op: del},
				doneMarker,
				{key: "b", value: "2", op: put}, {key: "a", op: del},
			},
		},
		{
			name:  "ignore deletes",
			keys:  ">",
			opts:  func(map[string]uint64) []WatchOption { return []WatchOption{IgnoreDeletes()} },
			after: []string{"-a", "d=1"},
			want: []event{
				{key: "a", value: "2", op: put}, {key: "b", value: "1", op: put},
				doneMarker,
				{key: "d", value: "1", op: put},
			},
		},
		{
			name:  "filter",
			keys:  "b",
			after: []string{"a=3", "b=2"},
			want:  []event{{key: "b", value: "1", op: put}, doneMarker, {key: "b", value: "2", op: put}},
		},
		{
			name:  "nothing matches yet",
			keys:  "z.>",
			after: []string{"z.1=x"},
			want:  []event{doneMarker, {key: "z.1", value: "x", op: put}},
		},
		{
			name:  "updates only",
			keys:  ">",
			opts:  func(map[string]uint64) []WatchOption { return []WatchOption{UpdatesOnly()} },
			after: []string{"b=2"},
			want:  []event{{key: "b", value: "2", op: put}},
		},
		{
			name: "include history",
			keys: "a",
			opts: func(map[string]uint64) []WatchOption { return []WatchOption{IncludeHistory()} },
			want: []event{{key: "a", value: "1", op: put}, {key: "a", value: "2", op: put}, doneMarker},
		},
		{
			name: "resume after a seen revision",
			keys: ">",
			// Resuming after a=1 replays everything written since, in order.
			opts:  func(revs map[string]uint64) []WatchOption { return []WatchOption{ResumeFromRevision(revs["a=1"] + 1)} },
			after: []string{"e=1"},
			want: []event{
				{key: "a", value: "2", op: put}, {key: "b", value: "1", op: put},
				{key: "c", value: "1", op: put}, {key: "c", op: del},
				doneMarker,
				{key: "e", value: "1", op: put},
			},
		},
		{
			name: "resume from the last revision",
			keys: ">",
			opts: func(revs map[string]uint64) []WatchOption { return []WatchOption{ResumeFromRevision(revs["-c"])} },
			want: []event{{key: "c", op: del}, doneMarker},
		},
		{
			name: "resume past the end",
			keys: ">",
			opts: func(revs map[string]uint64) []WatchOption {
				return []WatchOption{ResumeFromRevision(revs["-c"] + 1)}
			},
			after: []string{"f=1"},
			want:  []event{doneMarker, {key: "f", value: "1", op: put}},
		},
		{
			name: "meta only",
			keys: "a",
			opts: func(map[string]uint64) []WatchOption { return []WatchOption{MetaOnly()} },
			want: []event{{key: "a", op: put}, doneMarker},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			kv := ensureKV(t, js, testSpec(5))
			ctx := t.Context()
			revs := map[string]uint64{}
			write := func(op string) {
				t.Helper()
				var rev uint64
				var err error
				if key, ok := strings.CutPrefix(op, "-"); ok {
					err = kv.Delete(ctx, key)
					if err == nil {
						var e Entry
						e, err = kv.last(ctx, key)
						rev = e.Revision
					}
				} else {
					key, value, _ := strings.Cut(op, "=")
					rev, err = kv.Put(ctx, key, []byte(value))
				}
				if err != nil {
					t.Fatalf("%s: %v", op, err)
				}
				revs[op] = rev
			}
			for _, op := range []string{"a=1", "a=2", "b=1", "c=1", "-c"} {
				write(op)
			}
			var opts []WatchOption
			if tt.opts != nil {
				opts = tt.opts(revs)
			}
			w, err := kv.Watch(ctx, tt.keys, opts...)
			if err != nil {
				t.Fatal(err)
			}
			defer w.Stop()

			// The later values are written once the initial ones are in (at
			// once when no marker comes), so the expected order is the order
			// of the writes.
			writeAfter := func() {
				for _, op := range tt.after {
					write(op)
				}
			}
			if !containsDone(tt.want) {
				writeAfter()
			}
			var got []event
			for len(got) < len(tt.want) {
				ev := eventOf(next(t, w))
				got = append(got, ev)
				if ev == doneMarker {
					writeAfter()
				}
			}
			for i := range tt.want {
				if got[i] != tt.want[i] {
					t.Fatalf("watch delivered %v, want %v", got, tt.want)
				}
			}
			select {
			case e := <-w.Updates():
				t.Errorf("unexpected extra update %v", eventOf(e))
			default:
			}
		})
	}
}

func containsDone(evs []event) bool {
	for _, e := range evs {
		if e.done {
			return true
		}
	}
	return false
}

func TestWatchRevisionsAndTimes(t *testing.T) {
	t.Parallel()
	_, js := serverAndJS(t)
	kv := ensureKV(t, js, testSpec(1))
	before := time.Now().Add(-time.Minute)
	rev := mustPut(t, kv, "k")
	w, err := kv.Watch(t.Context(), "k")
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	e := next(t, w)
	got, err := kv.Get(t.Context(), "k")
	if err != nil {
		t.Fatal(err)
	}
	if e.Revision != rev || !e.Created.Equal(got.Created) || e.Created.Before(before) {
		t.Errorf("watch entry at %d created %v; get at %d created %v", e.Revision, e.Created, got.Revision, got.Created)
	}
}

func TestWatchEnds(t *testing.T) {
	t.Parallel()
	_, js := serverAndJS(t)
	kv := ensureKV(t, js, testSpec(1))
	mustPut(t, kv, "k")

	tests := []struct {
		name string
		end  func(w *Watcher, cancel context.CancelFunc)
	}{
		{name: "stop", end: func(w *Watcher, _ context.CancelFunc) { w.Stop() }},
		{name: "context ends", end: func(_ *Watcher, cancel context.CancelFunc) { cancel() }},
		{name: "stop twice", end: func(w *Watcher, _ context.CancelFunc) { w.Stop(); w.Stop() }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			w, err := kv.Watch(ctx, ">")
			if err != nil {
				t.Fatal(err)
			}
			// Leave the initial values unread: ending must not wait for a reader.
			tt.end(w, cancel)
			deadline := time.After(10 * time.Second)
			for {
				select {
				case _, ok := <-w.Updates():
					if !ok {
						if err := w.Err(); err != nil {
							t.Errorf("Err after an asked-for end = %v", err)
						}
						w.Stop()
						return
					}
				case <-deadline:
					t.Fatal("updates not closed")
				}
			}
		})
	}
}

func TestWatchRefusesBadFilter(t *testing.T) {
	t.Parallel()
	_, js := serverAndJS(t)
	kv := ensureKV(t, js, testSpec(1))
	for _, keys := range []string{"a..b", ".a", "a b"} {
		if _, err := kv.Watch(t.Context(), keys); err == nil || !strings.Contains(err.Error(), "invalid key") {
			t.Errorf("watch %q: %v", keys, err)
		}
	}
}

// TestWatchSurvivesServerRestart: the composer's watches run for days, across
// NATS restarts.
func TestWatchSurvivesServerRestart(t *testing.T) {
	t.Parallel()
	e := startServer(t, EmbeddedConfig{})
	msgs := make(chan string, 64)
	nc, js, err := Connect(t.Context(), ConnConfig{URL: e.ClientURL(), Logger: slog.New(chanHandler{msgs})})
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	kv := ensureKV(t, js, testSpec(1))
	mustPut(t, kv, "before")
	w, err := kv.Watch(t.Context(), ">")
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	if got := eventOf(next(t, w)); got.key != "before" {
		t.Fatalf("got %v", got)
	}
	if got := next(t, w); got != nil {
		t.Fatalf("got %v, want the marker", eventOf(got))
	}

	e.Shutdown()
	waitMsg(t, msgs, "nats disconnected")
	startServer(t, e.Config())
	waitMsg(t, msgs, "nats reconnected")
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	if _, err := kv.Put(ctx, "after", []byte("restart")); err != nil {
		t.Fatalf("put after restart: %v", err)
	}
	got := next(t, w)
	if got == nil || got.Key != "after" {
		t.Fatalf("after restart got %v", eventOf(got))
	}
}
