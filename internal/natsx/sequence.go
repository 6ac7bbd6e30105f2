package natsx

import (
	"context"
	"fmt"
	"sync"

	"github.com/nats-io/nats.go/jetstream"
)

// LastSequence returns the bucket stream's last sequence: the revision of
// the newest write to any key. A watcher that has seen less is behind.
//
// The answer is at least the last sequence when LastSequence was called:
// callers arriving while a stream info request is in flight share the next
// one, which is sent only after they arrived. A pass of each of many nodes
// asks this at once; the server answers stream info requests one by one
// behind its other API requests, so sharing them keeps that queue short.
func (k *KV) LastSequence(ctx context.Context) (uint64, error) {
	ctx, span := k.tracer.Start(ctx, "kv.last_sequence "+k.bucket, spanKind, bucketAttr(k.bucket))
	defer span.End()
	var res lastSeqResult
	if k.lastSeq == nil {
		res = k.askLastSequence(ctx)
	} else {
		ch := k.lastSeq.wait(k)
		select {
		case res = <-ch:
		case <-ctx.Done():
			res.err = ctx.Err()
		}
	}
	if res.err != nil {
		return 0, endSpan(span, fmt.Errorf("kv %s: stream info: %w", k.bucket, MapError(res.err)))
	}
	return res.seq, nil
}

func (k *KV) askLastSequence(ctx context.Context) lastSeqResult {
	info, err := Request(ctx, func(ctx context.Context) (*jetstream.StreamInfo, error) { return k.stream.Info(ctx) })
	if err != nil {
		return lastSeqResult{err: err}
	}
	return lastSeqResult{seq: info.State.LastSeq}
}

type lastSeqResult struct {
	seq uint64
	err error
}

// lastSeqShare gathers the LastSequence callers of one bucket: one request
// in flight at a time, answering every caller that arrived before it was
// sent.
type lastSeqShare struct {
	mu      sync.Mutex
	running bool
	waiting []chan lastSeqResult
}

func (s *lastSeqShare) wait(k *KV) <-chan lastSeqResult {
	ch := make(chan lastSeqResult, 1)
	s.mu.Lock()
	s.waiting = append(s.waiting, ch)
	if !s.running {
		s.running = true
		go s.loop(k)
	}
	s.mu.Unlock()
	return ch
}

func (s *lastSeqShare) loop(k *KV) {
	for {
		s.mu.Lock()
		batch := s.waiting
		s.waiting = nil
		if len(batch) == 0 {
			s.running = false
			s.mu.Unlock()
			return
		}
		s.mu.Unlock()
		// On no caller's context: it answers several, and each caller
		// stops waiting on its own context.
		res := k.askLastSequence(context.Background())
		for _, ch := range batch {
			ch <- res
		}
	}
}
