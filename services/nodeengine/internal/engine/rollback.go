package engine

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"

	"mesh.dev/internal/envelope"
	"mesh.dev/internal/names"
	"mesh.dev/internal/telemetry"
	"mesh.dev/services/nodeengine/internal/apply"
	"mesh.dev/services/nodeengine/internal/state"
)

// rollBack puts the modules applies left part-way back to what they had
// applied before (DESIGN.md §7: an apply is never left half). An op can fail
// after others of its module were done: a file that appeared on a new path
// while the engine was down after a crash (the replay cannot finish), or
// between Prepare and Execute, a full disk. The apply's commit keeps such
// modules, with the ledger records before of the paths their ops changed,
// in the journal section (state.Rollback); this applies each one's
// previously applied composition again, its artifact digests taken from
// those records, and removes the paths the apply created. A module that
// had nothing applied loses what the apply created. It runs right after
// such an apply and first thing each pass while any is kept, so a crash
// or a failure in between is rolled back later, and a module stays in the
// record until rolled back or applied whole. A path that moved to the
// module from another in that apply stays: the manifest declares it there.
//
// It returns, per module of the record, words to add to its failure.
func (e *Engine) rollBack(ctx context.Context) map[string]string {
	e.mu.Lock()
	rb := e.rollback
	if rb.Empty() {
		e.mu.Unlock()
		return nil
	}
	ledger := e.ledger
	comps := e.appliedLocked(rb.Modules, beforeView(ledger, rb))
	var adoption []string
	if c, ok := e.appliedComps[names.NodeModule]; ok {
		adoption = c.GetAdoption()
	}
	e.mu.Unlock()

	words := map[string]string{}
	left := map[string]bool{}
	for m := range rb.Modules {
		left[m] = true
	}
	refuse := func(m, why string) {
		words[m] = "left part-way, rolling it back failed: " + why + "; tried again each pass"
		delete(left, m)
	}
	for _, m := range slices.Sorted(maps.Keys(rb.Modules)) {
		c, ok := comps[m]
		if !ok {
			continue
		}
		// A path its applied composition declares that another module
		// holds now moved to that one, which applied whole: taking it
		// back would undo that module.
		for _, r := range c.Comp.GetResources() {
			if rec, ok := ledger[r.GetPath()]; ok && rec.Module != m {
				if _, half := rb.Modules[rec.Module]; !half {
					refuse(m, fmt.Sprintf("%s, declared by the composition it had applied, is now %s's", r.GetPath(), rec.Module))
					break
				}
			}
		}
	}
	var prep *apply.Prepared
	var settle []string
	for range len(rb.Modules) + 1 {
		if len(left) == 0 {
			break
		}
		in := map[string]*apply.Composition{}
		plan := apply.Plan{Ledger: ledger, Adoption: adoption, Undo: map[string]bool{}}
		settle = settle[:0]
		for m := range left {
			if c, ok := comps[m]; ok {
				in[m] = c
			}
			settle = append(settle, m)
		}
		for p, rp := range rb.Paths {
			// Only while the module still holds it: another module may
			// have taken it over since (a later manifest moved it).
			if rec, ok := ledger[p]; ok && left[rp.Module] && rp.Before == nil && rec.Module == rp.Module {
				plan.Undo[p] = true
			}
		}
		plan.Compositions = ordered(in)
		var failures map[string]*apply.Failure
		if prep, failures = e.prepareAndStage(ctx, plan); len(failures) == 0 {
			break
		}
		for m, f := range failures {
			refuse(m, f.Reason)
		}
		prep = nil
	}
	if prep == nil || len(left) == 0 {
		e.log.Error("rolling back applies left part-way failed", slog.Any("why", words))
		return words
	}
	slices.Sort(settle)
	meta := apply.Meta{Settle: settle}
	meta.Traceparent, _ = telemetry.Traceparent(ctx)
	back, err := e.cfg.Applier.Execute(ctx, prep, ledger, e.cfg.Store, meta)
	if err != nil {
		for m := range left {
			refuse(m, "its journal was not written: "+err.Error())
		}
		return words
	}
	e.mu.Lock()
	if back.CommitErr != nil {
		e.pending = back.Journal
		e.mu.Unlock()
		for m := range left {
			refuse(m, "its ops ran, its ledger is not committed (retried each pass): "+back.CommitErr.Error())
		}
		return words
	}
	e.takeAppliedLocked(nil, comps, nil, back)
	still := e.rollback
	e.mu.Unlock()
	for _, m := range settle {
		f, failed := back.Failed[m]
		if still.Holds(m) {
			why := "its rollback did not settle it"
			if failed {
				why = f.Reason
			}
			refuse(m, why)
			continue
		}
		w := "rolled back: it had nothing applied, what the apply created is removed"
		if c, ok := comps[m]; ok {
			w = "rolled back to the composition it had applied (" + envelope.Digest(c.Env) + ")"
		}
		var stays []string
		for _, p := range slices.Sorted(maps.Keys(rb.Paths)) {
			if rp := rb.Paths[p]; rp.Module == m && rp.Before != nil && rp.Before.Module != m {
				stays = append(stays, p+" (from "+rp.Before.Module+")")
			}
		}
		if len(stays) > 0 {
			w += "; what moved to it in that apply stays, as the manifest declares: " + strings.Join(stays, ", ")
		}
		if failed {
			// Only a directory's fsync (an op's failure keeps it in the
			// record): the next pass syncs it.
			w += " (" + f.Reason + ")"
		}
		words[m] = w
	}
	e.log.Warn("applies left part-way rolled back", slog.Any("modules", settle), slog.Int("ops", back.Ops), slog.Any("words", words))
	return words
}

// beforeView is the ledger as it was before the applies a rollback record
// holds left their modules part-way: an applied composition's artifact
// digests are read from it (the ledger now holds the new ones).
func beforeView(ledger map[string]*state.LedgerRecord, rb *state.Rollback) map[string]*state.LedgerRecord {
	if rb.Empty() {
		return ledger
	}
	view := maps.Clone(ledger)
	for p, rp := range rb.Paths {
		if rec, ok := ledger[p]; ok && rec.Module != rp.Module {
			continue // another module's since
		}
		if rp.Before == nil {
			delete(view, p)
		} else {
			view[p] = rp.Before
		}
	}
	return view
}

// prepareAndStage prepares a plan and, when no module is refused, stages
// the content it needs; it returns the modules either failed.
func (e *Engine) prepareAndStage(ctx context.Context, plan apply.Plan) (*apply.Prepared, map[string]*apply.Failure) {
	prep := e.cfg.Applier.Prepare(plan)
	if len(prep.Failures) > 0 {
		return prep, prep.Failures
	}
	return prep, e.cfg.Applier.Stage(ctx, prep, e.src)
}
