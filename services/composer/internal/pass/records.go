package pass

import (
	"context"
	"crypto/sha256"
	"errors"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"

	composerv1 "mesh.dev/proto/mesh/composer/v1"
)

// mirrorWait is how long a pass waits for the record mirror to catch up
// with the bucket before it reads the records it needs one by one.
const mirrorWait = 100 * time.Millisecond

// recordMirror follows bucket composed with one watch and keeps, per key,
// the revision and a digest of the record held (a judgement record is
// advisory and recomputable, DESIGN.md §5.2 step 5). A pass compares the
// record it would write with the mirror instead of reading each key — the
// JetStream API serves reads with as few workers as the server has cores —
// once the mirror has seen every write the stream acknowledged when the
// pass asked (one stream-info request). A write still goes by CAS at the
// revision mirrored, so a record changed meanwhile is read and compared
// again.
type recordMirror struct {
	mu      sync.Mutex
	changed *sync.Cond
	m       map[string]mirrored
	// seen is the last stream sequence delivered; ready is set once the
	// initial values were; running while the watch runs.
	seen           uint64
	ready, running bool
}

type mirrored struct {
	rev uint64
	// sum is the sha256 of the record's bytes; "" for a delete marker.
	sum string
}

func newRecordMirror() *recordMirror {
	m := &recordMirror{m: map[string]mirrored{}}
	m.changed = sync.NewCond(&m.mu)
	return m
}

// FollowRecords keeps the record mirror until ctx is done. Passes read
// records one by one while it does not run.
func (p *Passer) FollowRecords(ctx context.Context) error {
	m := p.records
	w, err := p.cfg.Store.Composed.Watch(ctx, ">")
	if err != nil {
		return err
	}
	defer w.Stop()
	m.mu.Lock()
	m.running = true
	m.mu.Unlock()
	defer func() {
		m.mu.Lock()
		m.running, m.ready = false, false
		m.m, m.seen = map[string]mirrored{}, 0
		m.changed.Broadcast()
		m.mu.Unlock()
	}()
	for e := range w.Updates() {
		m.mu.Lock()
		if e == nil {
			m.ready = true
		} else {
			v := mirrored{rev: e.Revision}
			if e.Op == jetstream.KeyValuePut {
				sum := sha256.Sum256(e.Value)
				v.sum = string(sum[:])
			}
			m.m[e.Key] = v
			m.seen = max(m.seen, e.Revision)
		}
		m.changed.Broadcast()
		m.mu.Unlock()
	}
	if ctx.Err() != nil {
		return nil
	}
	return errors.Join(errors.New("judgement record watch ended"), w.Err())
}

// current reports whether the mirror holds every record write the stream
// acknowledged by now, waiting a moment for it to catch up.
func (p *Passer) mirrorCurrent(ctx context.Context) bool {
	m := p.records
	m.mu.Lock()
	usable := m.running && m.ready
	m.mu.Unlock()
	if !usable {
		return false
	}
	last, err := p.cfg.Store.Composed.LastSequence(ctx)
	if err != nil {
		return false
	}
	deadline := time.Now().Add(mirrorWait)
	timer := time.AfterFunc(mirrorWait, func() {
		m.mu.Lock()
		m.changed.Broadcast()
		m.mu.Unlock()
	})
	defer timer.Stop()
	m.mu.Lock()
	defer m.mu.Unlock()
	for m.running && m.seen < last && time.Now().Before(deadline) {
		m.changed.Wait()
	}
	return m.running && m.seen >= last
}

// lookup returns what the mirror holds of a key.
func (m *recordMirror) lookup(key string) (mirrored, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	v, ok := m.m[key]
	return v, ok
}

// recordSum is the digest the mirror keeps of a record's bytes.
func recordSum(r *composerv1.JudgementRecord) string {
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(r)
	if err != nil {
		return ""
	}
	sum := sha256.Sum256(b)
	return string(sum[:])
}
