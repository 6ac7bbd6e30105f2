package pass

import (
	"context"
	"errors"
	"sort"

	"mesh.dev/internal/names"
	"mesh.dev/internal/natsx"
	composerv1 "mesh.dev/proto/mesh/composer/v1"
	"mesh.dev/services/composer/internal/store"
)

// prune keeps a node's compositions bounded (DESIGN.md §5.2 step 8): it lists
// only this node's module keys; for a module with more than KeepPerModule
// compositions it keeps the newest by the server's write time plus any the
// node's wants or applied manifest name, and deletes each other one — its
// judgement record first, then the composition — ignoring not-found. A
// listing error skips the node, and keys that do not parse are never touched.
func (p *Passer) prune(ctx context.Context, node string, asg *composerv1.Assignment, haves *composerv1.HaveRecord) error {
	metas, err := p.cfg.Store.Compositions.ListMeta(ctx, node+".*.*")
	if err != nil {
		return err
	}
	keep := map[string]bool{}
	for _, w := range asg.GetWants() {
		keep[w.GetCompositionKey()] = true
	}
	for _, h := range haves.GetHaves() {
		keep[h.GetApplied().GetKey()] = true
	}
	byModule := map[string][]natsx.Entry{}
	for _, m := range metas {
		k, err := names.ParseCompositionKey(m.Key)
		if err != nil || k.Node != node {
			continue
		}
		byModule[k.Module] = append(byModule[k.Module], m)
	}
	var errs []error
	for _, entries := range byModule {
		if len(entries) <= p.cfg.KeepPerModule {
			continue
		}
		sort.Slice(entries, func(i, j int) bool { return entries[i].Created.After(entries[j].Created) })
		for i, e := range entries {
			if i < p.cfg.KeepPerModule || keep[e.Key] {
				continue
			}
			if err := p.cfg.Store.Composed.Delete(ctx, e.Key); err != nil && !errors.Is(err, store.ErrNotFound) {
				errs = append(errs, err)
				continue
			}
			if err := p.cfg.Store.Compositions.Delete(ctx, e.Key); err != nil && !errors.Is(err, store.ErrNotFound) {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}
