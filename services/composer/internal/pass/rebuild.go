package pass

import (
	"bytes"
	"context"
	"errors"
	"fmt"

	"mesh.dev/internal/envelope"
	composerv1 "mesh.dev/proto/mesh/composer/v1"
	typev1 "mesh.dev/proto/mesh/type/v1"
	"mesh.dev/services/composer/internal/compose"
)

// rebuildHeld rebuilds the composition a held want names when it is no
// longer held (derived data lost, e.g. after a restore of the truth buckets
// alone, DESIGN.md §9): the module is rendered alone at the want's
// fingerprint with the node's current params. Only when that gives the very
// digest the want names is it signed and written again (Write) or counted
// as held (Plan); otherwise errNotHeld stands.
func (p *Passer) rebuildHeld(ctx context.Context, st *nodeState, prev *typev1.Want) (*typev1.Composition, error) {
	m := prev.GetModule()
	rel, _, why, err := p.usable(ctx, m, prev.GetFingerprint())
	if err != nil {
		return nil, err
	}
	if why != "" {
		return nil, errNotHeld
	}
	var placed *composerv1.PlacedModule
	for _, pm := range st.spec.GetModules() {
		if pm.GetModule() == m {
			placed = pm
		}
	}
	if placed == nil {
		return nil, errNotHeld
	}
	one := &composerv1.NodeSpec{Node: st.spec.GetNode(), Labels: st.spec.GetLabels(), Facts: st.spec.GetFacts(),
		Modules: []*composerv1.PlacedModule{placed}}
	decl, err := compose.Declare(one, map[string]compose.Module{m: {Fingerprint: prev.GetFingerprint(), Manifest: rel.Manifest}})
	if err != nil {
		return nil, errNotHeld
	}
	split := compose.SplitDeclaration(compose.SplitInput{Declaration: decl,
		Fingerprints: map[string]string{m: prev.GetFingerprint()},
		Manifests:    map[string]*typev1.ModuleManifest{m: rel.Manifest}, Runs: []string{m}})
	c, ok := split.Compositions[prev.GetCompositionKey()]
	if !ok {
		return nil, errNotHeld
	}
	it := &item{key: prev.GetCompositionKey()}
	it.comp, it.objects, it.objectOwner = spill(c)
	env, digest, err := envelope.Seal(typev1.PayloadType_PAYLOAD_TYPE_COMPOSITION, it.comp)
	if err != nil || digest != prev.GetCompositionDigest() {
		return nil, errNotHeld
	}
	if st.mode == Plan {
		return it.comp, nil
	}
	it.env, it.digest = env, digest
	if err := p.readHeld(ctx, it); err != nil {
		return nil, err
	}
	if err := p.holdObjects(ctx, st.spec.GetNode(), it, false); err != nil {
		return nil, err
	}
	if err := p.signAgainAndWrite(ctx, st, it); err != nil {
		return nil, err
	}
	p.cfg.Logger.InfoContext(ctx, "rebuilt a held composition that was no longer held", "key", it.key, "digest", digest)
	return it.comp, nil
}

// heldOrRebuilt is heldComposition, rebuilding the composition when it is
// no longer held.
func (p *Passer) heldOrRebuilt(ctx context.Context, st *nodeState, w *typev1.Want) (*typev1.Composition, error) {
	c, err := p.heldComposition(ctx, w)
	if !errors.Is(err, errNotHeld) {
		return c, err
	}
	return p.rebuildHeld(ctx, st, w)
}

// signAgainAndWrite signs a composition the key held, or must hold, again
// (it.env is its sealed envelope, it.digest its digest) and writes it by
// CAS at it.heldRev: the signer must return the very bytes asked, so the
// digest wants name stays.
func (p *Passer) signAgainAndWrite(ctx context.Context, st *nodeState, it *item) error {
	if err := p.stillHolds(st); err != nil {
		return fmt.Errorf("%s: not signed again: %w", it.key, err)
	}
	signed, err := p.cfg.Signer.SignCompositions(ctx, st.epoch, []*typev1.Composition{it.comp})
	if err != nil {
		return fmt.Errorf("%s: sign the held composition again: %w", it.key, err)
	}
	if len(signed) != 1 || signed[0].GetDigest() != it.digest || !bytes.Equal(signed[0].GetEnvelope().GetPayload(), it.env.GetPayload()) {
		return fmt.Errorf("%s: the signer returned other bytes than were asked", it.key)
	}
	it.env = signed[0].GetEnvelope()
	err = p.cas(ctx, it)
	if it.written != 0 {
		st.wrote(it.key, it.written)
	}
	return err
}
