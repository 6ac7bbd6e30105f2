package natsx

import (
	"context"
	"testing"

	"github.com/nats-io/nats.go/jetstream"
)

// lagStream answers message gets as a direct-get replica that has applied
// the stream only up to seq upTo ("a follower's direct get may not hold a
// write the leader acknowledged"); Info is the leader's.
type lagStream struct {
	jetstream.Stream
	upTo uint64
}

func (s lagStream) GetMsg(ctx context.Context, seq uint64, opts ...jetstream.GetMsgOpt) (*jetstream.RawStreamMsg, error) {
	if seq > s.upTo {
		return nil, jetstream.ErrMsgNotFound
	}
	return s.Stream.GetMsg(ctx, seq, opts...)
}

func (s lagStream) GetLastMsgForSubject(ctx context.Context, subject string) (*jetstream.RawStreamMsg, error) {
	m, err := s.Stream.GetLastMsgForSubject(ctx, subject)
	if err == nil && m.Sequence > s.upTo {
		return nil, jetstream.ErrMsgNotFound // the key's only message is past what the replica applied
	}
	return m, err
}

// TestRegressionCheckReadsTheLeader: on a direct-get bucket (nodes,
// haves, assignments, status...), a replica that has not applied the
// message a watch delivered answers "not found" for it and for its key; the
// regression check reads both from the leader, so it does not report that
// the stream went back when nothing was lost (it once asked by direct get).
func TestRegressionCheckReadsTheLeader(t *testing.T) {
	_, js := serverAndJS(t)
	kv := ensureKV(t, js, testSpec(1))
	if kv.LeaderReads() {
		t.Fatal("want a direct-get bucket")
	}
	putValue(t, kv, "x", "1") // seq 1
	w, err := kv.Watch(t.Context(), "a")
	if err != nil {
		t.Fatal(err)
	}
	if e := next(t, w); e != nil {
		t.Fatalf("want the initial marker, got %v", e)
	}
	putValue(t, kv, "a", "1") // seq 2, delivered
	if e := next(t, w); e == nil || e.Revision != 2 {
		t.Fatalf("got %v", e)
	}
	putValue(t, kv, "x", "2") // seq 3: the stream grew past what the watch delivered
	w.Stop()
	lag := *kv
	lag.stream = lagStream{Stream: kv.stream, upTo: 1}
	w.k = &lag
	if got, err := w.regressed(t.Context()); err != nil || got {
		t.Fatalf("regressed = %v, %v with a replica one write behind; nothing was lost, want false", got, err)
	}
}
