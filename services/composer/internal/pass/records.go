package pass

import (
	"context"
	"crypto/sha256"
	"errors"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"

	"mesh.dev/internal/envelope"
	"mesh.dev/internal/names"
	"mesh.dev/internal/natsx"
	composerv1 "mesh.dev/proto/mesh/composer/v1"
	typev1 "mesh.dev/proto/mesh/type/v1"
)

// mirrorWait is how long a pass waits for a mirror to catch up with its
// bucket before it reads the keys it needs one by one.
const mirrorWait = 100 * time.Millisecond

// mirror follows one bucket with one watch and keeps, per key, the revision
// and a summary of the value held. A pass compares with the mirror instead
// of reading each key — the JetStream API serves reads with as few workers
// as the server has cores, and a read of a stream waits for the fsync of
// the write before it — once the mirror is current (see current). Writes
// still go by CAS at the revision read, so a key changed meanwhile is read
// and compared again.
//
// Two mirrors run: of bucket composed (a judgement record is advisory and
// recomputable, DESIGN.md §5.2 step 5), summarised by the sha256 of its
// bytes, so a pass need not read the records it would rewrite; and of bucket
// compositions, summarised by the envelope's digest, for the re-read of
// step 5 after a pass wrote a node's compositions and records.
type mirror struct {
	name string
	// summary summarises a value ("" when it does not decode), and
	// names its signatures when it has any.
	summary func(value []byte) (sum, signatures string)

	// onWrite, when set, is told of every write the watch delivers once
	// the mirror holds the bucket's values; onResync when the watch
	// starts over because the bucket went back to an older state.
	onWrite  func(e *natsx.Entry)
	onResync func()

	// nodeOf, when set, names the node a key belongs to ("" none), and
	// byNode indexes the keys by it, so a node's keys are listed without
	// a look at every key (see keysOf).
	nodeOf func(key string) string

	mu      sync.Mutex
	changed *sync.Cond
	m       map[string]mirrored
	byNode  map[string]map[string]struct{}
	// seen is the last stream sequence delivered; ready is set once the
	// initial values were; running while the watch runs.
	seen           uint64
	ready, running bool
	// tenure is the lease epoch whose first barrier asked the stream (0:
	// none since the watch last started), and unsure the handle's count of
	// writes with no answer then: see current.
	tenure, unsure uint64
	// wait bounds a barrier's wait for the watch (mirrorWait).
	wait time.Duration
}

type mirrored struct {
	rev uint64
	// put is set for a value, unset for a delete or purge marker.
	put bool
	// sum is the value's summary; "" for a marker. signatures names a
	// signed value's signatures (signaturesKey).
	sum, signatures string
}

func newMirror(name string, summary func([]byte) (string, string)) *mirror {
	m := &mirror{name: name, summary: summary, m: map[string]mirrored{}, byNode: map[string]map[string]struct{}{}, wait: mirrorWait}
	m.changed = sync.NewCond(&m.mu)
	return m
}

// compositionNode is the node a composition key belongs to, "" for one
// that does not parse or is a node's own (outside <node>.*.*).
func compositionNode(key string) string {
	k, err := names.ParseCompositionKey(key)
	if err != nil || k.IsNodeOwn() {
		return ""
	}
	return k.Node
}

// resetLocked empties the mirror.
func (m *mirror) resetLocked() {
	m.m, m.byNode, m.seen, m.tenure = map[string]mirrored{}, map[string]map[string]struct{}{}, 0, 0
}

// putLocked keeps what a key holds.
func (m *mirror) putLocked(key string, v mirrored) {
	m.m[key] = v
	if m.nodeOf == nil {
		return
	}
	if node := m.nodeOf(key); node != "" {
		keys := m.byNode[node]
		if keys == nil {
			keys = map[string]struct{}{}
			m.byNode[node] = keys
		}
		keys[key] = struct{}{}
	}
}

// forgetMarker drops a key the mirror holds a marker of at rev or below,
// once the stream holds nothing of it any more (the marker removed): a
// later write has a higher revision, or is a value, and stays.
func (m *mirror) forgetMarker(key string, rev uint64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	v, ok := m.m[key]
	if !ok || v.put || v.rev > rev {
		return
	}
	delete(m.m, key)
	if m.nodeOf == nil {
		return
	}
	if node := m.nodeOf(key); node != "" {
		delete(m.byNode[node], key)
		if len(m.byNode[node]) == 0 {
			delete(m.byNode, node)
		}
	}
}

// keysOf lists a node's keys the mirror holds a message of, value or
// marker, sorted: what the stream holds once current said so. ok is false
// when the mirror stopped or started over since (its list would be
// partial).
func (m *mirror) keysOf(node string) (keys []string, ok bool) {
	m.mu.Lock()
	if !m.running || !m.ready {
		m.mu.Unlock()
		return nil, false
	}
	keys = make([]string, 0, len(m.byNode[node]))
	for k := range m.byNode[node] {
		keys = append(keys, k)
	}
	m.mu.Unlock()
	slices.Sort(keys)
	return keys, true
}

// recordSummary is the sha256 of a judgement record's bytes.
func recordSummary(value []byte) (string, string) {
	sum := sha256.Sum256(value)
	return string(sum[:]), ""
}

// compositionSummary is the digest of a composition's envelope and its
// signatures, "" when the value does not decode: with the signatures
// verified recently (the verify cache), a key the mirror shows holding the
// digest a pass sealed holds that very composition, signed.
func compositionSummary(value []byte) (string, string) {
	env := &typev1.Envelope{}
	if proto.Unmarshal(value, env) != nil {
		return "", ""
	}
	return envelope.Digest(env), signaturesKey(env)
}

// FollowRecords keeps the judgement record mirror until ctx is done. Passes
// read records one by one while it does not run.
func (p *Passer) FollowRecords(ctx context.Context) error {
	return p.records.follow(ctx, p.cfg.Store.Composed)
}

// FollowCompositions keeps the composition mirror until ctx is done. Passes
// re-read what they wrote one key at a time while it does not run.
func (p *Passer) FollowCompositions(ctx context.Context) error {
	return p.compositions.follow(ctx, p.cfg.Store.Compositions)
}

func (m *mirror) follow(ctx context.Context, kv *natsx.KV) error {
	w, err := kv.Watch(ctx, ">", natsx.ResyncMarker())
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
		m.resetLocked()
		m.changed.Broadcast()
		m.mu.Unlock()
	}()
	for e := range w.Updates() {
		if e == nil {
			m.mu.Lock()
			m.ready = true
			m.changed.Broadcast()
			m.mu.Unlock()
			continue
		}
		if e.Resync {
			// The bucket's stream went back to an older state: what the
			// mirror holds is not what the bucket holds; the watch
			// delivers everything again, up to its next nil marker.
			m.mu.Lock()
			m.ready = false
			m.resetLocked()
			m.changed.Broadcast()
			m.mu.Unlock()
			if m.onResync != nil {
				m.onResync()
			}
			continue
		}
		v := mirrored{rev: e.Revision}
		if e.Op == jetstream.KeyValuePut {
			v.put = true
			v.sum, v.signatures = m.summary(e.Value)
		}
		m.mu.Lock()
		m.putLocked(e.Key, v)
		m.seen = max(m.seen, e.Revision)
		ready := m.ready
		m.changed.Broadcast()
		m.mu.Unlock()
		if ready && m.onWrite != nil {
			m.onWrite(e)
		}
	}
	if ctx.Err() != nil {
		return nil
	}
	return errors.Join(errors.New(m.name+" watch ended"), w.Err())
}

// current reports whether the mirror holds every write a pass must see,
// waiting a moment for it to catch up.
//
// With tenure 0 (a plan, its Apply, a test's pass) that is every write the
// stream acknowledged by now: one stream-info request, shared by the passes
// asking at once, which the server answers only after the writes queued
// before it on the stream's fsyncs. What the mirror holds then is what
// reading each key would give.
//
// A reconciler's pass gives the lease epoch it writes in. The first such
// barrier of a tenure asks the stream as above: the mirror then holds every
// write of the holders before. Every later one only waits for the writes
// this composer made through kv (kv.Acked, no request): it is the only
// writer of the bucket while it holds the lease, and a node's keys are
// written by one pass at a time. A write it did not make — an old holder's
// still in flight, bytes put straight into JetStream — may be missing when
// the pass decides: the watch delivers it a moment later; a composition
// written so asks for a pass of its node (judgeWrite), a judgement record
// (advisory) is put right by the node's next pass, and a CAS at a revision
// the mirror had fails on it and is read again. The stream is asked again
// after a write of kv got no answer (kv.Unsure: it may have been stored
// without a revision known) and after the connection came back (also
// kv.Unsure: the server may have come back from an older state, which the
// watch notices only later), after a wait that timed out, and after the
// watch started over; and the tenure is not taken while the stream holds
// less than kv was acknowledged (it went back to an older state).
func (m *mirror) current(ctx context.Context, kv *natsx.KV, tenure uint64) bool {
	unsure := kv.Unsure()
	m.mu.Lock()
	usable, seen := m.running && m.ready, m.seen
	tenured := tenure != 0 && m.tenure == tenure && m.unsure == unsure
	m.mu.Unlock()
	if !usable {
		return false
	}
	var last uint64
	acked := kv.Acked()
	if tenured {
		last = acked
	} else {
		var err error
		if last, err = kv.LastSequence(ctx); err != nil {
			return false
		}
		if seen > last {
			// The stream went back behind what the mirror had seen before
			// it asked (a store restored from an older snapshot) and the
			// watch has not started over yet: the mirror holds writes the
			// bucket lost.
			return false
		}
	}
	deadline := time.Now().Add(m.wait)
	timer := time.AfterFunc(m.wait, func() {
		m.mu.Lock()
		m.changed.Broadcast()
		m.mu.Unlock()
	})
	defer timer.Stop()
	m.mu.Lock()
	defer m.mu.Unlock()
	for m.running && m.ready && m.seen < last && time.Now().Before(deadline) {
		m.changed.Wait()
	}
	ok := m.running && m.ready && m.seen >= last
	switch {
	case tenured && !ok:
		// The watch did not deliver this composer's writes in time: ask
		// the stream next time.
		if m.tenure == tenure {
			m.tenure = 0
		}
	case !tenured && ok && tenure != 0 && tenure >= m.tenure && acked <= last:
		// The later barriers of the tenure need not ask.
		m.tenure, m.unsure = tenure, unsure
	}
	return ok
}

// mirrorCurrent reports whether the record mirror is current for a pass
// (see current).
func (p *Passer) mirrorCurrent(ctx context.Context, st *nodeState) bool {
	return p.records.current(ctx, p.cfg.Store.Composed, st.tenure)
}

// lookup returns what the mirror holds of a key.
func (m *mirror) lookup(key string) (mirrored, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	v, ok := m.m[key]
	return v, ok
}

// recordSum is the summary the record mirror keeps of a record.
func recordSum(r *composerv1.JudgementRecord) string {
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(r)
	if err != nil {
		return ""
	}
	sum, _ := recordSummary(b)
	return sum
}
