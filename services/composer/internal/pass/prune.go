package pass

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"sort"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"mesh.dev/internal/envelope"
	"mesh.dev/internal/names"
	"mesh.dev/internal/natsx"
	composerv1 "mesh.dev/proto/mesh/composer/v1"
	typev1 "mesh.dev/proto/mesh/type/v1"
	"mesh.dev/services/composer/internal/store"
)

// markerAge is how old a delete marker left by pruning must be before the
// prune removes it from the stream: long enough for every watcher to have
// seen the delete.
const markerAge = 30 * time.Minute

// prune keeps a node's compositions bounded (DESIGN.md §5.2 step 8). It
// lists only this node's keys (<node>.*.*): those the stream leader listed
// when the pass began (one stream-info request, no consumer) and those the
// pass wrote since. It looks up the last write of each other key of a
// module with more than KeepPerModule keys, a lookup error skipping that
// module. Of a module with more than KeepPerModule compositions it keeps the
// newest by the server's order of last writes (revision) plus any the
// node's wants or applied manifest name, and deletes
// each other one: its judgement record first, then the composition,
// ignoring not-found. Keys that do not parse are never touched. Delete
// markers pruning left behind are removed once old, so listings stay short.
func (p *Passer) prune(ctx context.Context, node string, asg *composerv1.Assignment, st *nodeState) error {
	var errs []error
	byModule := map[string][]natsx.Entry{}
	add := func(e natsx.Entry) {
		k, err := names.ParseCompositionKey(e.Key)
		if err != nil || k.Node != node || k.IsNodeOwn() {
			return
		}
		byModule[k.Module] = append(byModule[k.Module], e)
	}
	// The listing the pass began with and the keys it wrote since are the
	// node's keys now (one another writer created meanwhile waits for the
	// next pass); without a listing the keys are listed here.
	var keys []string
	if st.listed != nil {
		for k := range st.listed {
			keys = append(keys, k)
		}
	} else {
		listed, err := p.cfg.Store.CompositionKeys(ctx, node)
		if err != nil {
			return err
		}
		keys = listed
	}
	keys = append(keys, st.written...)
	slices.Sort(keys)
	keys = slices.Compact(keys)
	count := map[string]int{}
	for _, key := range keys {
		if k, err := names.ParseCompositionKey(key); err == nil && k.Node == node && !k.IsNodeOwn() {
			count[k.Module]++
		}
	}
	for _, key := range keys {
		k, err := names.ParseCompositionKey(key)
		if err != nil || k.Node != node || k.IsNodeOwn() || count[k.Module] <= p.cfg.KeepPerModule {
			continue
		}
		if rev, ok := st.writtenRev[key]; ok {
			// Written by this pass: its revision is the server's.
			add(natsx.Entry{Key: key, Op: jetstream.KeyValuePut, Revision: rev})
			continue
		}
		e, err := p.cfg.Store.CompositionMeta(ctx, key)
		if errors.Is(err, store.ErrNotFound) {
			// Nothing of it is left in the stream (a marker removed since
			// it was listed): not a key of the node.
			p.compositions.forgetMarker(key, math.MaxUint64)
			count[k.Module]--
			continue
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("prune %s: module %s skipped: %w", node, k.Module, err))
			count[k.Module] = 0
			delete(byModule, k.Module)
			continue
		}
		add(e)
	}
	modules := make([]string, 0, len(byModule))
	for m := range byModule {
		modules = append(modules, m)
	}
	sort.Strings(modules)
	var keep map[string]bool
	for _, m := range modules {
		var live []natsx.Entry
		for _, e := range byModule[m] {
			if e.Op != jetstream.KeyValuePut {
				if p.cfg.Now().Sub(e.Created) > markerAge {
					if err := p.cfg.Store.PurgeMarker(ctx, e.Key, e.Revision); err != nil {
						p.cfg.Logger.WarnContext(ctx, "prune: remove a delete marker", "key", e.Key, "error", err)
					} else {
						p.compositions.forgetMarker(e.Key, e.Revision)
					}
				}
				continue
			}
			live = append(live, e)
		}
		if len(live) <= p.cfg.KeepPerModule {
			continue
		}
		if keep == nil {
			keep = p.keepSet(ctx, node, asg, st.haves)
		}
		// Newest last write first, in the server's order of writes: the
		// stream sequence of each key's last message (its revision). It
		// is the order of the server's timestamps, known without a read
		// for the keys this pass wrote and untouched by any clock.
		sort.Slice(live, func(i, j int) bool { return live[i].Revision > live[j].Revision })
		for i, e := range live {
			if i < p.cfg.KeepPerModule || keep[e.Key] {
				continue
			}
			if err := p.cfg.Store.Composed.Delete(ctx, e.Key); err != nil && !errors.Is(err, store.ErrNotFound) {
				errs = append(errs, err)
				continue
			}
			p.own.wrote(natsx.BucketCompositions, e.Key, 0, true)
			if err := p.cfg.Store.Compositions.Delete(ctx, e.Key); err != nil && !errors.Is(err, store.ErrNotFound) {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

// keepSet returns the composition keys pruning keeps whatever their age:
// those the node's wants name, those the engine reports applied, and those
// of the manifest the engine reports applied — found in the assignment's
// history when it is not the current one.
func (p *Passer) keepSet(ctx context.Context, node string, asg *composerv1.Assignment, haves *composerv1.HaveRecord) map[string]bool {
	keep := map[string]bool{}
	for _, w := range asg.GetWants() {
		keep[w.GetCompositionKey()] = true
	}
	for _, h := range haves.GetHaves() {
		if k := h.GetApplied().GetKey(); k != "" {
			keep[k] = true
		}
	}
	applied := haves.GetApplied().GetDigest()
	if applied == "" || applied == asg.GetManifestDigest() {
		return keep
	}
	history, err := p.cfg.Store.AssignmentHistory(ctx, node)
	if err != nil {
		p.cfg.Logger.WarnContext(ctx, "prune: the assignment history could not be read; keeping what the engine reports", "node", node, "error", err)
	}
	for _, a := range history {
		if a.GetManifestDigest() != applied {
			continue
		}
		m := &typev1.Manifest{}
		if envelope.Open(a.GetManifest(), typev1.PayloadType_PAYLOAD_TYPE_MANIFEST, m) != nil {
			continue
		}
		for _, w := range m.GetWants() {
			keep[w.GetCompositionKey()] = true
		}
	}
	return keep
}
