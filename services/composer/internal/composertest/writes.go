package composertest

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Write is one message a KV bucket stored (a value or a marker), as the
// writer sent it.
type Write struct {
	Bucket, Key string
	// Expected is the expected last revision the writer asked for (the
	// Nats-Expected-Last-Subject-Sequence header); "" for a blind write.
	Expected string
	// Op is "" for a value, "DEL" or "PURGE" for a marker.
	Op       string
	Data     []byte
	Revision uint64
	Time     time.Time
}

func (w Write) String() string {
	s := w.Bucket + "/" + w.Key
	if w.Op != "" {
		s += " " + w.Op
	}
	if w.Expected != "" {
		s += " @" + w.Expected
	} else {
		s += " (blind)"
	}
	return s
}

// Writes records every message some buckets store from its start on, in
// the order of the server's timestamps: what a pass wrote, and how. A
// refused write (a CAS that failed) is not stored and not seen.
type Writes struct {
	t       testing.TB
	streams map[string]jetstream.Stream

	mu   sync.Mutex
	seen []Write
	last map[string]uint64
}

// RecordWrites follows the streams of buckets with ordered consumers that
// deliver only new messages.
func (w *World) RecordWrites(t testing.TB, buckets ...string) *Writes {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	r := &Writes{t: t, streams: map[string]jetstream.Stream{}, last: map[string]uint64{}}
	for _, b := range buckets {
		s, err := w.JS.Stream(ctx, "KV_"+b)
		Must(t, err)
		info, err := s.Info(ctx)
		Must(t, err)
		r.streams[b] = s
		r.last[b] = info.State.LastSeq
		cons, err := s.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{DeliverPolicy: jetstream.DeliverByStartSequencePolicy, OptStartSeq: info.State.LastSeq + 1})
		Must(t, err)
		prefix := "$KV." + b + "."
		cc, err := cons.Consume(func(m jetstream.Msg) {
			meta, err := m.Metadata()
			if err != nil {
				return
			}
			wr := Write{Bucket: b, Key: strings.TrimPrefix(m.Subject(), prefix), Data: m.Data(), Revision: meta.Sequence.Stream, Time: meta.Timestamp}
			if h := m.Headers(); h != nil {
				wr.Expected = h.Get(jetstream.ExpectedLastSubjSeqHeader)
				wr.Op = h.Get("KV-Operation")
			}
			r.mu.Lock()
			r.seen = append(r.seen, wr)
			r.last[b] = max(r.last[b], meta.Sequence.Stream)
			r.mu.Unlock()
		})
		Must(t, err)
		t.Cleanup(cc.Stop)
	}
	t.Cleanup(cancel)
	return r
}

// All returns every write stored so far: it waits until each stream's last
// message has been delivered.
func (r *Writes) All() []Write {
	r.t.Helper()
	for b, s := range r.streams {
		info, err := s.Info(context.Background())
		Must(r.t, err)
		want := info.State.LastSeq
		WaitFor(r.t, "writes to "+b+" delivered", 10*time.Second, func() (bool, string) {
			r.mu.Lock()
			defer r.mu.Unlock()
			return r.last[b] >= want, fmt.Sprintf("seen up to %d of %d", r.last[b], want)
		})
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	out := append([]Write(nil), r.seen...)
	sort.SliceStable(out, func(i, j int) bool { return out[i].Time.Before(out[j].Time) })
	return out
}

// Mark returns how many writes were seen so far, for Since.
func (r *Writes) Mark() int { return len(r.All()) }

// Since returns the writes seen after a Mark.
func (r *Writes) Since(mark int) []Write { return r.All()[mark:] }
