package engine

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"slices"

	"mesh.dev/internal/envelope"
	"mesh.dev/internal/telemetry"
	"mesh.dev/services/nodeengine/internal/apply"
	"mesh.dev/services/nodeengine/internal/state"
)

// rollBack puts the modules an apply left part-way back to what they had
// applied before it (DESIGN.md §7: an apply is never left half). An op that
// fails (a file that appeared on a new path while the engine was down, a
// full disk, a directory that does not sync) leaves its module's earlier
// ops done: the module's previous composition, with the artifact digests it
// was written with (from before, the ledger before the apply), is applied
// again over them and the paths they created are removed. A module that
// had nothing applied before loses what the apply created. It returns, per
// module, the words to add to its failure. It is called with the apply
// committed, e.ledger its ledger.
func (e *Engine) rollBack(ctx context.Context, before map[string]*state.LedgerRecord, res *apply.Result) map[string]string {
	if len(res.Half) == 0 {
		return nil
	}
	e.mu.Lock()
	comps := e.appliedLocked(res.Half, before)
	ledger := e.ledger
	e.mu.Unlock()
	words := map[string]string{}
	failAll := func(why string) map[string]string {
		for m := range res.Half {
			words[m] = "left part-way: rolling it back failed: " + why
		}
		return words
	}
	// A path a previous composition declares that another module now
	// holds moved to it in this apply: taking it back would undo that
	// module's applied composition.
	for _, c := range ordered(comps) {
		for _, r := range c.Comp.GetResources() {
			if rec, ok := ledger[r.GetPath()]; ok && rec.Module != c.Module && !res.Half[rec.Module] {
				return failAll(fmt.Sprintf("%s, declared by its previous composition, is now %s's", r.GetPath(), rec.Module))
			}
		}
	}
	prep := e.cfg.Applier.Prepare(apply.Plan{Compositions: ordered(comps), Ledger: ledger, Undo: res.Undo})
	failures := prep.Failures
	if len(failures) == 0 {
		failures = e.cfg.Applier.Stage(ctx, prep, e.src)
	}
	if len(failures) > 0 {
		for m := range res.Half {
			if f, ok := failures[m]; ok {
				words[m] = "left part-way: rolling it back failed: " + f.Reason
				continue
			}
			words[m] = "left part-way: rolling it back failed: " + failures[slices.Sorted(maps.Keys(failures))[0]].Reason
		}
		e.log.Error("rolling back an apply left part-way failed", slog.Any("modules", slices.Sorted(maps.Keys(res.Half))), slog.Any("why", words))
		return words
	}
	meta := apply.Meta{}
	meta.Traceparent, _ = telemetry.Traceparent(ctx)
	back, err := e.cfg.Applier.Execute(ctx, prep, ledger, e.cfg.Store, meta)
	if err != nil {
		return failAll("its journal was not written: " + err.Error())
	}
	e.mu.Lock()
	if back.CommitErr != nil {
		e.pending = back.Journal
		e.mu.Unlock()
		return failAll("its ops ran, its ledger is not committed (retried each pass): " + back.CommitErr.Error())
	}
	e.takeAppliedLocked(nil, comps, nil, back)
	e.mu.Unlock()
	for m := range res.Half {
		switch f, failed := back.Failed[m]; {
		case failed:
			words[m] = "left part-way: rolling it back failed: " + f.Reason
		case comps[m] != nil:
			words[m] = "rolled back to the composition it had applied (" + envelope.Digest(comps[m].Env) + ")"
		default:
			words[m] = "rolled back: it had nothing applied, what the apply created is removed"
		}
	}
	e.log.Warn("an apply left part-way was rolled back", slog.Any("modules", slices.Sorted(maps.Keys(res.Half))), slog.Int("ops", back.Ops))
	return words
}
