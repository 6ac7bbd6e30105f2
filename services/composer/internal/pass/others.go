package pass

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"

	"mesh.dev/internal/names"
	"mesh.dev/internal/natsx"
	composerv1 "mesh.dev/proto/mesh/composer/v1"
)

// Writes this composer did not make to a node's assignment or compositions
// — a replayed old value, bad bytes written straight into JetStream, a
// store that went back to an older snapshot — make the lease holder pass
// over the node soon (DESIGN.md §5.2: derived data is rebuilt by
// recomposing; the assignment is re-derived and signed again above the
// replay). A watch of each bucket tells them from the composer's own by
// the revisions it wrote; as a watch may deliver a write before the CAS
// that made it returns, a write not known as its own is judged again
// othersGrace later.
const (
	othersGrace = 2 * time.Second
	// ownKept is how long the revisions of this composer's own writes are
	// remembered: a watch further behind takes its own writes for
	// another's, which costs a pass that finds nothing to do.
	ownKept = time.Minute
)

// ownWrites remembers the writes this composer made lately, by bucket and
// key: the revisions of values and that the key was deleted.
type ownWrites struct {
	mu        sync.Mutex
	m         map[string]*ownWrite
	lastSweep time.Time
}

type ownWrite struct {
	// revs are the revisions written within ownKept, oldest first, and
	// when.
	revs []ownRev
	// deletedAt is when the key was last deleted (zero: never).
	deletedAt time.Time
	at        time.Time
}

type ownRev struct {
	rev uint64
	at  time.Time
}

func ownKey(bucket, key string) string { return bucket + "\x00" + key }

// wrote notes a value written at rev (deleted: a delete marker, whose
// revision the caller does not know).
func (o *ownWrites) wrote(bucket, key string, rev uint64, deleted bool) {
	now := time.Now()
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.m == nil {
		o.m = map[string]*ownWrite{}
	}
	if now.Sub(o.lastSweep) > ownKept {
		for k, w := range o.m {
			if now.Sub(w.at) > ownKept {
				delete(o.m, k)
			}
		}
		o.lastSweep = now
	}
	w := o.m[ownKey(bucket, key)]
	if w == nil {
		w = &ownWrite{}
		o.m[ownKey(bucket, key)] = w
	}
	w.at = now
	if deleted {
		w.deletedAt = now
		return
	}
	// Every write of the last ownKept, however many: a node composed
	// several times in a row writes its assignment as often.
	for len(w.revs) > 0 && now.Sub(w.revs[0].at) > ownKept {
		w.revs = w.revs[1:]
	}
	w.revs = append(w.revs, ownRev{rev: rev, at: now})
}

// last returns the highest revision of a value this composer wrote to a
// key within ownKept (0: none).
func (o *ownWrites) last(bucket, key string) uint64 {
	o.mu.Lock()
	defer o.mu.Unlock()
	var last uint64
	if w := o.m[ownKey(bucket, key)]; w != nil {
		for _, r := range w.revs {
			last = max(last, r.rev)
		}
	}
	return last
}

// deletedLately reports whether this composer deleted a key within
// ownKept: a watch may not have delivered the delete yet.
func (o *ownWrites) deletedLately(bucket, key string) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	w := o.m[ownKey(bucket, key)]
	return w != nil && time.Since(w.deletedAt) <= ownKept
}

// own reports whether this composer made a write a watch delivered.
func (o *ownWrites) own(bucket string, e *natsx.Entry) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	w := o.m[ownKey(bucket, e.Key)]
	if w == nil {
		return false
	}
	if e.Op != jetstream.KeyValuePut {
		return !w.deletedAt.IsZero()
	}
	return slices.ContainsFunc(w.revs, func(r ownRev) bool { return r.rev == e.Revision })
}

// seenRevisions keeps the highest manifest revision seen in each node's
// assignment, whatever the bucket holds now: after the store went back to
// an older snapshot an engine may run a manifest above the one held, and
// until it says so (its next Hello) the composer knows it from here.
type seenRevisions struct {
	mu sync.Mutex
	m  map[string]uint64
}

func (s *seenRevisions) saw(node string, rev uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.m == nil {
		s.m = map[string]uint64{}
	}
	s.m[node] = max(s.m[node], rev)
}

func (s *seenRevisions) highest(node string) uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.m[node]
}

// watchedAssignments are the assignments as FollowAssignments last saw
// them, once its watch delivered what the bucket held when it started.
type watchedAssignments struct {
	mu    sync.Mutex
	ready bool
	m     map[string]watchedAssignment
}

// watchedAssignment is a node's assignment at a revision; nil when the
// value there does not decode.
type watchedAssignment struct {
	a   *composerv1.Assignment
	rev uint64
}

func (w *watchedAssignments) set(node string, a *composerv1.Assignment, rev uint64, deleted bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.m == nil {
		w.m = map[string]watchedAssignment{}
	}
	if deleted {
		delete(w.m, node)
		return
	}
	w.m[node] = watchedAssignment{a: a, rev: rev}
}

func (w *watchedAssignments) setReady(ready bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.ready = ready
	if !ready {
		// The watch starts over: what it delivers again replaces these.
		clear(w.m)
	}
}

// watchedAssignment returns a node's assignment as the watch delivered it
// last, a copy, when the watch is caught up, it decoded, and it is this
// composer's last write of it within ownKept or newer, with no delete of
// it by this composer since; ok false when the pass must read it. A newer
// write the watch has not delivered yet can only be another writer's: its
// delivery asks for a pass (judgeWrite), and the commit's CAS refuses to
// replace what this one did not read.
func (p *Passer) watchedAssignment(node string) (*composerv1.Assignment, uint64, bool) {
	p.assignments.mu.Lock()
	w, ok := p.assignments.m[node]
	ok = ok && p.assignments.ready && w.a != nil
	p.assignments.mu.Unlock()
	if !ok || w.rev < p.own.last(natsx.BucketAssignments, node) || p.own.deletedLately(natsx.BucketAssignments, node) {
		return nil, 0, false
	}
	return proto.CloneOf(w.a), w.rev, true
}

// FollowAssignments watches bucket assignments until ctx is done: it keeps
// each node's assignment and the highest manifest revision seen of each
// node, and asks for a pass of a node whose assignment another writer
// changed, and of every node when the bucket went back to an older state.
func (p *Passer) FollowAssignments(ctx context.Context) error {
	w, err := p.cfg.Store.Assignments.Watch(ctx, ">", natsx.ResyncMarker())
	if err != nil {
		return err
	}
	defer w.Stop()
	defer p.assignments.setReady(false)
	ready := false
	for e := range w.Updates() {
		switch {
		case e == nil:
			ready = true
			p.assignments.setReady(true)
			continue
		case e.Resync:
			ready = false
			p.assignments.setReady(false)
			p.storeWentBack(natsx.BucketAssignments)
			continue
		}
		var a *composerv1.Assignment
		if e.Op == jetstream.KeyValuePut {
			a = &composerv1.Assignment{}
			if proto.Unmarshal(e.Value, a) == nil {
				p.seen.saw(e.Key, a.GetManifestRevision())
			} else {
				a = nil
			}
		}
		p.assignments.set(e.Key, a, e.Revision, e.Op != jetstream.KeyValuePut)
		if ready {
			p.judgeWrite(natsx.BucketAssignments, e.Key, e)
		}
	}
	if ctx.Err() != nil {
		return nil
	}
	return errors.Join(errors.New("assignments watch ended"), w.Err())
}

// compositionWritten is told of every write the composition mirror sees
// once it holds the bucket's values.
func (p *Passer) compositionWritten(e *natsx.Entry) {
	k, err := names.ParseCompositionKey(e.Key)
	if err != nil {
		return
	}
	p.judgeWrite(natsx.BucketCompositions, k.Node, e)
}

// judgeWrite asks for a pass of node when this composer, holding the lease,
// did not make a write of its bucket — judged again othersGrace later, so
// that its own write delivered before its CAS returned counts as its own.
func (p *Passer) judgeWrite(bucket, node string, e *natsx.Entry) {
	if p.cfg.Recompose == nil || !p.holding() || p.own.own(bucket, e) {
		return
	}
	time.AfterFunc(othersGrace, func() {
		if !p.holding() || p.own.own(bucket, e) {
			return
		}
		what := "written"
		if e.Op != jetstream.KeyValuePut {
			what = "deleted"
		}
		p.cfg.Logger.Warn("another writer changed a key of a node; recomposing it", "bucket", bucket, "key", e.Key,
			"revision", e.Revision, "op", what, "node", node)
		p.cfg.Recompose(node, fmt.Sprintf("%s %s %s by another writer at revision %d", bucket, e.Key, what, e.Revision))
	})
}

// storeWentBack asks for a pass of every node when a bucket the passes
// write went back to an older state: what the passes wrote since is lost.
func (p *Passer) storeWentBack(bucket string) {
	p.cfg.Logger.Warn("a bucket went back to an older state; recomposing every node", "bucket", bucket)
	p.statuses.forget("")
	if p.cfg.StoreWentBack != nil {
		p.cfg.StoreWentBack(bucket)
	}
	if p.cfg.Recompose != nil && p.holding() {
		p.cfg.Recompose("", "bucket "+bucket+" went back to an older state")
	}
}

// holding reports whether this composer holds the lease.
func (p *Passer) holding() bool {
	_, err := p.cfg.Lease.Check(0)
	return err == nil
}
