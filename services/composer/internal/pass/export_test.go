package pass

import (
	"context"
	"time"

	composerv1 "mesh.dev/proto/mesh/composer/v1"
)

// Hooks are the test hooks of a Passer (see hooks).
type Hooks struct {
	BeforeSign   func(keys []string)
	BeforeWrite  func(key string, attempt int)
	BeforeReread func(key string, follow int)
	BeforeCommit func(node string)
}

// SetHooks installs test hooks on a Passer.
func SetHooks(p *Passer, h Hooks) {
	p.hooks = hooks{beforeSign: h.BeforeSign, beforeWrite: h.BeforeWrite, beforeReread: h.BeforeReread, beforeCommit: h.BeforeCommit}
}

// SetNow replaces a Passer's clock.
func SetNow(p *Passer, now func() time.Time) { p.cfg.Now = now }

// Prune runs the prune of a pass over node with the given assignment and
// haves.
func Prune(ctx context.Context, p *Passer, node string, asg *composerv1.Assignment, haves *composerv1.HaveRecord) error {
	return p.prune(ctx, node, asg, &nodeState{haves: haves})
}

// PutStatus writes a node's status as a pass's finish does, given the
// haves the pass read at its start, at revision havesRev.
func PutStatus(ctx context.Context, p *Passer, node string, asg *composerv1.Assignment, haves *composerv1.HaveRecord, havesRev uint64) error {
	return p.putStatus(ctx, node, asg, haves, havesRev, 0, func(*composerv1.NodeStatus) error { return nil })
}

// SetWatched replaces what a Passer takes for the watches' copies.
func SetWatched(p *Passer, f func(node string) Watched) { p.cfg.Watched = f }

// WatchedAssignmentRev is the revision of a node's assignment the Passer's
// watch holds, 0 for none.
func WatchedAssignmentRev(p *Passer, node string) uint64 {
	p.assignments.mu.Lock()
	defer p.assignments.mu.Unlock()
	return p.assignments.m[node].rev
}

// NoteOwnWrite records a write as the Passer's own.
func NoteOwnWrite(p *Passer, bucket, key string, rev uint64) { p.own.wrote(bucket, key, rev, false) }

// CompositionsMirrorCurrent reports whether the composition mirror is
// current now.
func CompositionsMirrorCurrent(p *Passer) bool {
	return p.compositions.current(context.Background(), p.cfg.Store.Compositions, 0)
}

// NoteOwnDelete records a delete as the Passer's own.
func NoteOwnDelete(p *Passer, bucket, key string) { p.own.wrote(bucket, key, 0, true) }
