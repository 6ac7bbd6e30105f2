package pass

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"

	"mesh.dev/internal/envelope"
	"mesh.dev/internal/names"
	composerv1 "mesh.dev/proto/mesh/composer/v1"
	typev1 "mesh.dev/proto/mesh/type/v1"
	"mesh.dev/services/composer/internal/compose"
	"mesh.dev/services/composer/internal/store"
)

// assign decides the node's wants and holds (DESIGN.md §5.3): each module's
// want moves to its new composition when the policy lets it (or an approval
// does), and otherwise stays at the composition it named, listed as a hold;
// the node's own want always names the new own composition. Every
// composition a want names must be held; a want whose composition is gone is
// dropped and said in the hold.
func (p *Passer) assign(ctx context.Context, st *nodeState, work []*item, builds map[string]*catalogBuild, fpHolds []fpHold) ([]*typev1.Want, []*composerv1.Hold, []string, error) {
	node := st.spec.GetNode()
	labels := st.spec.GetLabels()
	approvals := st.approvals
	var wants []*typev1.Want
	var holds []*composerv1.Hold
	// content of each wanted composition, for the path check below.
	content := map[string]*typev1.Composition{}
	newWant := map[string]*typev1.Want{}
	prevWant := map[string]*typev1.Want{}
	// usedApproval names the approval that let each module's move through.
	usedApproval := map[string]string{}
	for _, it := range work {
		if it.own {
			w := &typev1.Want{Module: names.NodeModule, CompositionKey: it.key, CompositionDigest: it.digest}
			wants = append(wants, w)
			content[it.key] = it.comp
			continue
		}
		m := it.comp.GetModule()
		b := builds[m]
		nw := &typev1.Want{Module: m, Fingerprint: it.comp.GetFingerprint(), Parts: sortedParts(b.parts), CompositionKey: it.key, CompositionDigest: it.digest}
		prev := st.prevWant(m)
		if prev != nil && prev.GetCompositionKey() == nw.GetCompositionKey() && prev.GetCompositionDigest() == nw.GetCompositionDigest() {
			wants = append(wants, nw)
			content[it.key] = it.comp
			continue
		}
		approvedBy := approvalOf(approvals, m, it.digest, labels)
		move, why := compose.Decide(compose.Move{Module: m, Judged: it.judged, Policy: it.policy, Approved: approvedBy != "", Placed: prev == nil})
		if move {
			wants = append(wants, nw)
			content[it.key] = it.comp
			newWant[m], prevWant[m] = nw, prev
			if approvedBy != "" {
				if again, _ := compose.Decide(compose.Move{Module: m, Judged: it.judged, Policy: it.policy, Placed: prev == nil}); !again {
					usedApproval[m] = approvedBy
				}
			}
			continue
		}
		hold := &composerv1.Hold{Module: m, Fingerprint: nw.GetFingerprint(), CompositionKey: it.key, CompositionDigest: it.digest,
			Judgement: it.judged.Judgement, Words: it.judged.Words, Reason: why, Policy: it.policy.Policy, PolicyFrom: it.policy.From}
		if prev != nil {
			c, err := p.heldOrRebuilt(ctx, st, prev)
			switch {
			case err == nil:
				wants = append(wants, prev)
				content[prev.GetCompositionKey()] = c
			case errors.Is(err, errNotHeld):
				hold.Reason += fmt.Sprintf("; the wanted %s (%s) is no longer held, so the module is not wanted until this is approved", prev.GetCompositionKey(), prev.GetCompositionDigest())
			default:
				return nil, nil, nil, err
			}
		}
		holds = append(holds, hold)
	}
	for _, h := range fpHolds {
		holds = append(holds, &composerv1.Hold{Module: h.module, Fingerprint: h.fingerprint, Reason: h.reason})
	}

	// No path may be declared by two compositions of one manifest: a move
	// that would declare a path a held composition still declares waits
	// with it.
	for {
		conflict := false
		owner := map[string]string{}
		for _, w := range wants {
			for _, r := range content[w.GetCompositionKey()].GetResources() {
				if other, ok := owner[r.GetPath()]; ok {
					mover := w.GetModule()
					if _, moved := newWant[mover]; !moved {
						mover = other
					}
					if _, moved := newWant[mover]; !moved {
						return nil, nil, nil, fmt.Errorf("node %s: 2 resources declare %s: in %s and %s", node, r.GetPath(), other, w.GetModule())
					}
					wants, holds = p.revert(ctx, wants, holds, newWant[mover], prevWant[mover], content,
						fmt.Sprintf("path %s is still declared by %s", r.GetPath(), keyOfModule(wants, mover, other, w.GetModule())))
					delete(newWant, mover)
					delete(usedApproval, mover)
					conflict = true
					break
				}
				owner[r.GetPath()] = w.GetModule()
			}
			if conflict {
				break
			}
		}
		if !conflict {
			break
		}
	}
	sort.Slice(wants, func(i, j int) bool { return wants[i].GetModule() < wants[j].GetModule() })
	sort.Slice(holds, func(i, j int) bool { return holds[i].GetModule() < holds[j].GetModule() })
	var used []string
	for _, id := range usedApproval {
		used = append(used, id)
	}
	slices.Sort(used)
	return wants, holds, slices.Compact(used), nil
}

// approvalOf is the id of the first approval that lets a module move to a
// composition digest on a node with these labels, or "".
func approvalOf(approvals []*composerv1.Approval, module, digest string, labels map[string]string) string {
	for _, a := range approvals {
		if compose.Approves(a, module, digest, labels) {
			return a.GetId()
		}
	}
	return ""
}

// sameKeyMove reports whether writing an item would replace the very
// composition the node wants: a change of params, facts or labels at the
// same fingerprint has the same key (<node>.<module>.<fp>).
func sameKeyMove(st *nodeState, it *item) bool {
	prev := st.prevWant(it.comp.GetModule())
	return !it.own && prev != nil && prev.GetCompositionKey() == it.key && it.heldDigest == prev.GetCompositionDigest()
}

// movesAhead decides the node's wants before anything is written, as the
// assigner will decide them after the writes, for a pass where a
// composition to write would replace the very composition the node wants
// (sameKeyMove). Such a write is made only when the assigner moves the
// module to it: a move it holds — by policy, for want of an approval, or
// reverted because a path it declares is still declared by a held
// composition — would leave the want naming a digest its key no longer
// holds, and the revert would find nothing to return to. It returns the
// wanted compositions as "key digest"; nil when the assigner cannot
// decide (the pass then fails the same way), so that no such write is
// made.
func (p *Passer) movesAhead(ctx context.Context, st *nodeState, work []*item, jc *judging, builds map[string]*catalogBuild, fpHolds []fpHold) map[string]bool {
	wants, _, err := p.planAssign(ctx, st, work, jc, builds, fpHolds)
	if err != nil {
		return nil
	}
	out := make(map[string]bool, len(wants))
	for _, w := range wants {
		out[w.GetCompositionKey()+" "+w.GetCompositionDigest()] = true
	}
	return out
}

// planAssign judges the items without an error and assigns as a Plan
// does, writing nothing.
func (p *Passer) planAssign(ctx context.Context, st *nodeState, work []*item, jc *judging, builds map[string]*catalogBuild, fpHolds []fpHold) ([]*typev1.Want, []string, error) {
	clean := make([]*item, 0, len(work))
	for _, it := range work {
		if it.err == nil {
			jc.judge(ctx, it)
			clean = append(clean, it)
		}
	}
	mode := st.mode
	st.mode = Plan
	defer func() { st.mode = mode }()
	wants, _, approvals, err := p.assign(ctx, st, clean, builds, fpHolds)
	return wants, approvals, err
}

// putBackWanted writes back, when a pass wrote a move over the very
// composition the node wants and then does not commit it (an approval it
// moved on was revoked meanwhile), the composition the key held before:
// the want still names it. A key left holding the move would fail the
// engine's fetch, and the next pass, finding the wanted composition gone
// and unable to render it again from params that changed, would drop the
// module from the wants.
func (p *Passer) putBackWanted(ctx context.Context, st *nodeState, work []*item) error {
	var errs []error
	for _, it := range work {
		if it.own || it.written == 0 || it.beforeHeld == nil || it.digest == it.beforeDigest {
			continue
		}
		prev := st.prevWant(it.comp.GetModule())
		if prev == nil || prev.GetCompositionKey() != it.key || prev.GetCompositionDigest() != it.beforeDigest {
			continue
		}
		if err := p.putBack(ctx, st, it); err != nil {
			errs = append(errs, fmt.Errorf("%s: put back the wanted %s: %w", it.key, it.beforeDigest, err))
		}
	}
	return errors.Join(errs...)
}

func (p *Passer) putBack(ctx context.Context, st *nodeState, it *item) error {
	env, digest, err := envelope.Seal(typev1.PayloadType_PAYLOAD_TYPE_COMPOSITION, it.beforeHeld)
	if err != nil {
		return err
	}
	if digest != it.beforeDigest {
		return fmt.Errorf("the composition held before seals to %s", digest)
	}
	return p.signAgainAndWrite(ctx, st, &item{key: it.key, comp: it.beforeHeld, env: env, digest: digest, heldRev: it.written, heldDigest: it.digest})
}

func keyOfModule(wants []*typev1.Want, mover, a, b string) string {
	other := a
	if other == mover {
		other = b
	}
	for _, w := range wants {
		if w.GetModule() == other {
			return w.GetCompositionKey()
		}
	}
	return other
}

// revert undoes a move: the module's want returns to the one it replaced
// (or none) and the move is listed as a hold with the reason.
func (p *Passer) revert(ctx context.Context, wants []*typev1.Want, holds []*composerv1.Hold, moved, prev *typev1.Want, content map[string]*typev1.Composition, reason string) ([]*typev1.Want, []*composerv1.Hold) {
	out := wants[:0:0]
	for _, w := range wants {
		if w.GetModule() != moved.GetModule() {
			out = append(out, w)
		}
	}
	if prev != nil {
		if c, err := p.heldComposition(ctx, prev); err == nil {
			out = append(out, prev)
			content[prev.GetCompositionKey()] = c
		}
	}
	holds = append(holds, &composerv1.Hold{Module: moved.GetModule(), Fingerprint: moved.GetFingerprint(),
		CompositionKey: moved.GetCompositionKey(), CompositionDigest: moved.GetCompositionDigest(), Reason: reason})
	return out, holds
}

var errNotHeld = errors.New("composition not held")

// heldComposition reads the composition a want names and checks it is held
// at the want's digest.
func (p *Passer) heldComposition(ctx context.Context, w *typev1.Want) (*typev1.Composition, error) {
	env, _, _, err := p.cfg.Store.Composition(ctx, w.GetCompositionKey())
	if errors.Is(err, store.ErrNotFound) {
		return nil, errNotHeld
	}
	if err != nil {
		return nil, fmt.Errorf("%s: read: %w", w.GetCompositionKey(), err)
	}
	if envelope.Digest(env) != w.GetCompositionDigest() {
		return nil, errNotHeld
	}
	c, ok := p.verifyHeld(env, w.GetCompositionKey(), false)
	if !ok {
		return nil, errNotHeld
	}
	return c, nil
}

func sortedParts(parts []*typev1.Artifact) []*typev1.Artifact {
	out := append([]*typev1.Artifact(nil), parts...)
	sort.Slice(out, func(i, j int) bool { return out[i].GetRef() < out[j].GetRef() })
	return out
}
