package pass

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"mesh.dev/internal/lru"
	composerv1 "mesh.dev/proto/mesh/composer/v1"
	"mesh.dev/services/composer/internal/store"
)

// LastSeenEvery is how often a node's last-seen time is persisted in its
// status (DESIGN.md §6 step 4: kept in memory, persisted at most every 5
// min), so a node whose engine is connected does not rewrite its status on
// every pass.
const LastSeenEvery = 5 * time.Minute

// LastSeen tells when a node's engine was last heard (kept in memory by the
// Sync streams); zero when unknown here.
type LastSeen func(node string) time.Time

// BuildStatus derives a node's status from its assignment, its haves and the
// pass's error (DESIGN.md §5.3): wanted vs applied per module with the
// engine's last attempt, holds, the manifest's revision and expiry. A node
// is converged when its engine applied the manifest and every wanted
// composition, and reports none of them FAILED or STALE.
func BuildStatus(node string, asg *composerv1.Assignment, haves *composerv1.HaveRecord, lastErr error, prev *composerv1.NodeStatus, seen time.Time, now time.Time) *composerv1.NodeStatus {
	st := &composerv1.NodeStatus{
		Node: node, Holds: asg.GetHolds(), ManifestRevision: asg.GetManifestRevision(), ManifestExpiresAt: asg.GetManifestExpiresAt(),
		AppliedRevision: haves.GetApplied().GetRevision(),
	}
	if lastErr != nil {
		st.LastError = strings.ReplaceAll(lastErr.Error(), "\n", "; ")
		st.LastErrorAt = timestamppb.New(now)
		if prev.GetLastError() == st.LastError && prev.GetLastErrorAt() != nil {
			st.LastErrorAt = prev.GetLastErrorAt()
		}
	}
	st.LastSeen = prev.GetLastSeen()
	if !seen.IsZero() && (st.LastSeen == nil || seen.Sub(st.LastSeen.AsTime()) >= LastSeenEvery) {
		st.LastSeen = timestamppb.New(seen)
	}
	have := map[string]*composerv1.Have{}
	for _, h := range haves.GetHaves() {
		have[h.GetModule()] = h
	}
	holdOf := map[string]*composerv1.Hold{}
	for _, h := range asg.GetHolds() {
		holdOf[h.GetModule()] = h
	}
	converged := asg != nil && lastErr == nil && haves.GetApplied().GetDigest() == asg.GetManifestDigest()
	seenModule := map[string]bool{}
	for _, w := range asg.GetWants() {
		h := have[w.GetModule()]
		ms := &composerv1.ModuleStatus{
			Module: w.GetModule(), WantedFingerprint: w.GetFingerprint(), WantedDigest: w.GetCompositionDigest(),
			AppliedFingerprint: h.GetApplied().GetFingerprint(), AppliedDigest: h.GetApplied().GetDigest(),
			State: h.GetAttempt().GetState(), ReasonCode: h.GetAttempt().GetReasonCode(), Reason: h.GetAttempt().GetReason(),
			Since: h.GetAttempt().GetSince(), Hold: holdOf[w.GetModule()],
		}
		// Applied at the wanted digest is not enough: an engine that
		// reports FAILED or STALE for the module (its state unreadable, a
		// manifest refused, expired) applies nothing new and may not
		// correct drift. HELD at the wanted digest keeps it in effect and
		// is shown as a hold.
		if ms.AppliedDigest != ms.WantedDigest || ms.State == composerv1.AttemptState_ATTEMPT_STATE_FAILED ||
			ms.State == composerv1.AttemptState_ATTEMPT_STATE_STALE {
			converged = false
		}
		st.Modules = append(st.Modules, ms)
		seenModule[w.GetModule()] = true
	}
	for _, h := range asg.GetHolds() {
		if !seenModule[h.GetModule()] {
			st.Modules = append(st.Modules, &composerv1.ModuleStatus{Module: h.GetModule(), Hold: h,
				AppliedFingerprint: have[h.GetModule()].GetApplied().GetFingerprint(), AppliedDigest: have[h.GetModule()].GetApplied().GetDigest()})
			seenModule[h.GetModule()] = true
		}
	}
	sortModules(st.Modules)
	st.Converged = converged
	return st
}

func sortModules(ms []*composerv1.ModuleStatus) {
	for i := 1; i < len(ms); i++ {
		for j := i; j > 0 && ms[j-1].GetModule() > ms[j].GetModule(); j-- {
			ms[j-1], ms[j] = ms[j], ms[j-1]
		}
	}
}

// sameStatus compares two statuses without their write times.
func sameStatus(a, b *composerv1.NodeStatus) bool {
	if a == nil || b == nil {
		return a == b
	}
	x, y := proto.Clone(a).(*composerv1.NodeStatus), proto.Clone(b).(*composerv1.NodeStatus)
	x.UpdatedAt, y.UpdatedAt = nil, nil
	return proto.Equal(x, y)
}

func (p *Passer) writeStatus(ctx context.Context, st *nodeState, res *Result, asg *composerv1.Assignment) error {
	passErr := errors.Join(append([]error{res.Err}, st.problems...)...)
	return p.putStatus(ctx, res.Node, asg, st.haves, st.havesRev, st.epoch, func(*composerv1.NodeStatus) error { return passErr })
}

// statusCacheBytes bounds the statuses kept written (see writtenStatuses):
// a few hundred bytes to a few KB each.
const statusCacheBytes = 32 << 20

// writtenStatuses keeps, per node, the status this composer wrote last,
// its revision and the lease epoch it was written in. Within that tenure
// the node's next status is compared with it and written by CAS at its
// revision without reading the key first: only the lease holder writes
// statuses, and a CAS that fails (another hand wrote meanwhile) reads the
// key as before. A status equal to the kept one is not skipped on its
// word: the key is read, so a status lost or written by another hand is
// put right by the next pass. A new tenure, the node deleted, or a bucket
// found gone back to an older state, and the key is read again.
type writtenStatuses struct {
	mu    sync.Mutex
	cache *lru.Cache[writtenStatus]
}

type writtenStatus struct {
	epoch, rev uint64
	st         *composerv1.NodeStatus
}

// get returns the status written last in the tenure epoch (0: none).
func (w *writtenStatuses) get(node string, epoch uint64) (*composerv1.NodeStatus, uint64, bool) {
	if epoch == 0 {
		return nil, 0, false
	}
	v, ok := w.cache.Get(node)
	if !ok || v.epoch != epoch {
		return nil, 0, false
	}
	return v.st, v.rev, true
}

// wrote keeps a status written at rev in epoch, unless a later write of
// the same tenure is kept already.
func (w *writtenStatuses) wrote(node string, epoch, rev uint64, st *composerv1.NodeStatus) {
	if epoch == 0 {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if v, ok := w.cache.Get(node); ok && v.epoch == epoch && v.rev >= rev {
		return
	}
	w.cache.Put(node, writtenStatus{epoch: epoch, rev: rev, st: proto.CloneOf(st)}, proto.Size(st)+64)
}

// forget drops what is kept of a node ("": of every node).
func (w *writtenStatuses) forget(node string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if node == "" {
		w.cache.Reset()
		return
	}
	w.cache.Delete(node)
}

// statusAttempts bounds the CAS attempts of one status write; another
// writer moving the key each time means statuses are being written from
// fresher haves anyway.
const statusAttempts = 3

// putStatus writes a node's status from its assignment and the haves
// record read after the status it replaces (haves is what the caller read
// before, at revision havesRev, used only when the record cannot be read
// now), by CAS. The engine
// reports while a pass runs: a status built from the haves the pass read
// at its start, written after a have report's refresh, would say the node
// applied nothing until its next report. The record is the one the haves
// watch delivered last when there is one (Config.Watched): the watch keeps
// it before it asks for the refresh or pass a newer record calls for, so a
// status read after that refresh's write is built from that record or a
// newer one, and one read before it is replaced by that refresh. A watched
// record older than the one the caller read is not taken: nothing may ask
// for a refresh after this status (a plan's Apply, a pass with no
// reconciler). The status it replaces is the one this composer wrote last
// in the lease tenure epoch when it is kept (writtenStatuses), else read.
// lastErr gives the compose error to show, from the status being replaced.
func (p *Passer) putStatus(ctx context.Context, node string, asg *composerv1.Assignment, haves *composerv1.HaveRecord, havesRev, epoch uint64, lastErr func(prev *composerv1.NodeStatus) error) error {
	var err error
	for attempt := range statusAttempts {
		prev, prevRev, kept := p.statuses.get(node, epoch)
		if !kept || attempt > 0 {
			kept = false
			var perr error
			prev, prevRev, perr = p.cfg.Store.NodeStatus(ctx, node)
			if perr != nil && !errors.Is(perr, store.ErrNotFound) {
				if prevRev == 0 {
					return fmt.Errorf("read status of %s: %w", node, perr)
				}
				prev = nil // does not decode: replaced
			}
		}
		haves, havesRev = p.havesNow(ctx, node, haves, havesRev)
		var seen time.Time
		if p.cfg.LastSeen != nil {
			seen = p.cfg.LastSeen(node)
		}
		at := p.cfg.Now()
		next := BuildStatus(node, asg, haves, lastErr(prev), prev, seen, at)
		if sameStatus(prev, next) {
			if kept {
				// Nothing would be written on the kept status alone: the
				// key is read, since it may have been lost, or written by
				// another hand, since this composer wrote it. (A write
				// needs no such read: its CAS at the kept revision fails
				// on any change.)
				continue
			}
			return nil
		}
		next.UpdatedAt = timestamppb.New(at)
		var rev uint64
		rev, err = p.cfg.Store.WriteStatus(ctx, next, prevRev)
		if err == nil {
			p.statuses.wrote(node, epoch, rev, next)
			return nil
		}
		// Also when no answer came: the write may have been stored, and
		// the status kept would then say what the key no longer holds.
		p.statuses.forget(node)
		if !errors.Is(err, store.ErrConflict) {
			return err
		}
	}
	return fmt.Errorf("status of %s: %w", node, err)
}

// havesNow returns a node's haves record and its revision as the watch
// delivered it last, when that is not older than before (read at revision
// beforeRev), else as the bucket holds it; before when it cannot be read.
func (p *Passer) havesNow(ctx context.Context, node string, before *composerv1.HaveRecord, beforeRev uint64) (*composerv1.HaveRecord, uint64) {
	if w, ok := p.watchedOf(node); ok && w.Haves != nil && w.HavesRev >= beforeRev {
		return proto.CloneOf(w.Haves), w.HavesRev
	}
	now, rev, err := p.cfg.Store.HaveAtLeast(ctx, node, beforeRev)
	switch {
	case err == nil:
		return now, rev
	case errors.Is(err, store.ErrNotFound):
		return nil, 0
	}
	return before, beforeRev
}

// RefreshStatus rewrites a node's status from its assignment and haves
// without composing (after a have report that needs no new pass). The last
// compose error is kept.
func (p *Passer) RefreshStatus(ctx context.Context, node string) error {
	asg, _, err := p.cfg.Store.Assignment(ctx, node)
	if err != nil && !errors.Is(err, store.ErrNotFound) {
		return err
	}
	// putStatus reads the haves; a record that does not decode counts as
	// none, and the last pass's status says so. The last compose error
	// stays.
	// In the tenure this composer holds, if any: the status it wrote last
	// then stands in for a read.
	var epoch uint64
	if p.cfg.Lease != nil {
		if e, err := p.cfg.Lease.Check(0); err == nil {
			epoch = e
		}
	}
	return p.putStatus(ctx, node, asg, nil, 0, epoch, func(prev *composerv1.NodeStatus) error {
		if prev.GetLastError() == "" {
			return nil
		}
		return errors.New(prev.GetLastError())
	})
}
