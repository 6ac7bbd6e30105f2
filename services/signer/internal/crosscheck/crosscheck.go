// Package crosscheck checks what the signer is asked to sign against the
// catalog (DESIGN.md §5.4): a module composition only for an entry of that
// module and fingerprint whose build is DONE with a verdict other than FAIL,
// with the resource ids, types, modes, owners, content kinds and data paths
// of the entry's manifest; a want's parts only as the build's artifacts. A
// compromised composer can then still mix released versions and feed
// hostile params, and nothing more.
package crosscheck

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"mesh.dev/internal/canonical"
	"mesh.dev/internal/flight"
	"mesh.dev/internal/lint"
	"mesh.dev/internal/names"
	catalogv1 "mesh.dev/proto/mesh/catalog/v1"
	typev1 "mesh.dev/proto/mesh/type/v1"
	"mesh.dev/services/signer/internal/service"
)

// Catalog is the read-only part of the catalog the signer calls.
type Catalog interface {
	GetEntry(ctx context.Context, in *catalogv1.GetEntryRequest, opts ...grpc.CallOption) (*catalogv1.GetEntryResponse, error)
	GetBuild(ctx context.Context, in *catalogv1.GetBuildRequest, opts ...grpc.CallOption) (*catalogv1.GetBuildResponse, error)
}

// released is what the signer keeps of a checked fingerprint: entries and
// DONE builds are immutable, so once both are seen they are cached for good.
type released struct {
	module    string
	resources map[string]*typev1.ResourceTemplate
	artifacts []*typev1.Artifact
	refs      map[string]bool
	dataPaths []string
}

// Checker implements service.Checker over a catalog client, with a cache by
// fingerprint.
type Checker struct {
	catalog Catalog

	mu    sync.Mutex
	cache map[string]*released
	// asking holds the lookups in flight: requests arriving together for a
	// fingerprint not cached yet (every batch of a fleet-wide change) wait
	// for one lookup instead of each asking the catalog.
	asking flight.Group[string, *released]
	// maxCache bounds the cache; when full it is cleared (entries are cheap
	// to ask again, and a bound matters more than a perfect policy here).
	maxCache int
}

var _ service.Checker = (*Checker)(nil)

// New returns a Checker.
func New(catalog Catalog) *Checker {
	return &Checker{catalog: catalog, cache: map[string]*released{}, maxCache: 10000}
}

// errRefused marks a composition or want the catalog does not back.
var errRefused = errors.New("not released")

func (c *Checker) lookup(ctx context.Context, fp string) (*released, error) {
	r, err := c.asking.Cached(ctx, fp, c.cached, func() (*released, error) { return c.fetch(ctx, fp) })
	if err != nil && err == ctx.Err() {
		// It ended while waiting on another request's lookup.
		return nil, catalogErr("entry", fp, err)
	}
	return r, err
}

func (c *Checker) cached(fp string) (*released, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	r, ok := c.cache[fp]
	return r, ok
}

// fetch asks the catalog for a fingerprint's entry and build, and caches
// them once both show it released.
func (c *Checker) fetch(ctx context.Context, fp string) (*released, error) {
	er, err := c.catalog.GetEntry(ctx, &catalogv1.GetEntryRequest{Fingerprint: fp})
	if err != nil {
		return nil, catalogErr("entry", fp, err)
	}
	entry := er.GetEntry()
	if got := names.ComputeFingerprint(entry.GetModule(), entry.GetRepository(), entry.GetPath(), entry.GetSourceDigest(), names.Digest(entry.GetManifest())); got != fp {
		return nil, fmt.Errorf("%w: the catalog's entry of %s recomputes to %s", errRefused, fp, got)
	}
	if entry.GetVerdict() == catalogv1.Verdict_VERDICT_FAIL {
		return nil, fmt.Errorf("%w: entry %s has verdict FAIL", errRefused, fp)
	}
	br, err := c.catalog.GetBuild(ctx, &catalogv1.GetBuildRequest{Fingerprint: fp})
	if err != nil {
		return nil, catalogErr("build", fp, err)
	}
	if st := br.GetBuild().GetState(); st != catalogv1.BuildState_BUILD_STATE_DONE {
		return nil, fmt.Errorf("%w: the build of %s is %v, not DONE", errRefused, fp, st)
	}
	manifest := &typev1.ModuleManifest{}
	if err := canonical.Decode(entry.GetManifest(), manifest); err != nil {
		return nil, fmt.Errorf("%w: entry %s: %v", errRefused, fp, err)
	}
	r := &released{module: entry.GetModule(), resources: map[string]*typev1.ResourceTemplate{}, refs: map[string]bool{},
		artifacts: br.GetBuild().GetArtifacts(), dataPaths: slices.Sorted(slices.Values(manifest.GetDataPaths()))}
	for _, res := range manifest.GetResources() {
		r.resources[names.ResourceID(entry.GetModule(), res.GetName())] = res
	}
	for _, a := range entry.GetArtifacts() {
		r.refs[a.GetRef()] = true
	}
	c.mu.Lock()
	if len(c.cache) >= c.maxCache {
		c.cache = map[string]*released{}
	}
	c.cache[fp] = r
	c.mu.Unlock()
	return r, nil
}

func catalogErr(what, fp string, err error) error {
	switch status.Code(err) {
	case codes.NotFound:
		return fmt.Errorf("%w: the catalog holds no %s of %s", errRefused, what, fp)
	case codes.InvalidArgument, codes.PermissionDenied, codes.Unauthenticated, codes.FailedPrecondition:
		return fmt.Errorf("%w: catalog refused the %s of %s: %v", errRefused, what, fp, err)
	}
	return fmt.Errorf("%w: %s of %s: %v", service.ErrUnavailable, what, fp, err)
}

// CheckCompositions checks each module composition against its entry.
func (c *Checker) CheckCompositions(ctx context.Context, comps []*typev1.Composition) error {
	for i, comp := range comps {
		if err := c.checkComposition(ctx, comp); err != nil {
			if errors.Is(err, service.ErrUnavailable) {
				return err
			}
			key, _ := names.CompositionKey(comp.GetNode(), comp.GetModule(), comp.GetFingerprint())
			return &service.ItemError{Index: i, Key: key, Err: err}
		}
	}
	return nil
}

func (c *Checker) checkComposition(ctx context.Context, comp *typev1.Composition) error {
	r, err := c.lookup(ctx, comp.GetFingerprint())
	if err != nil {
		return err
	}
	if r.module != comp.GetModule() {
		return fmt.Errorf("%w: %s is an entry of module %q, not %q", errRefused, comp.GetFingerprint(), r.module, comp.GetModule())
	}
	seen := make(map[string]bool, len(comp.GetResources()))
	for _, res := range comp.GetResources() {
		rt, ok := r.resources[res.GetId()]
		if !ok {
			return fmt.Errorf("%w: resource %s is not in the manifest of %s", errRefused, res.GetId(), comp.GetFingerprint())
		}
		if rt.GetType() != res.GetType() {
			return fmt.Errorf("%w: resource %s is a %v, the manifest says %v", errRefused, res.GetId(), res.GetType(), rt.GetType())
		}
		if a, ok := res.GetContent().(*typev1.Resource_Artifact); ok && !r.refs[a.Artifact] {
			return fmt.Errorf("%w: resource %s names artifact %s, which the entry does not declare", errRefused, res.GetId(), a.Artifact)
		}
		if err := asReleased(res, rt); err != nil {
			return fmt.Errorf("%w: resource %s: %v", errRefused, res.GetId(), err)
		}
		seen[res.GetId()] = true
	}
	for id := range r.resources {
		if !seen[id] {
			return fmt.Errorf("%w: resource %s of the manifest is missing", errRefused, id)
		}
	}
	if !slices.Equal(comp.GetDataPaths(), r.dataPaths) {
		return fmt.Errorf("%w: data paths %v are not the manifest's %v", errRefused, comp.GetDataPaths(), r.dataPaths)
	}
	return nil
}

// asReleased checks what of a module composition's resource params cannot
// change: the composer copies mode, owner, group and user_list from the
// released template, and the kind of content (an artifact by the same ref,
// raw bytes as released, rendered text), so a composer mixing releases and
// params cannot make a released binary its own bytes, setuid (DESIGN.md
// §5.4). A path or target with no template action is the template's.
func asReleased(res *typev1.Resource, rt *typev1.ResourceTemplate) error {
	switch {
	case res.GetMode() != rt.GetMode():
		return fmt.Errorf("mode %04o, the manifest says %04o", res.GetMode(), rt.GetMode())
	case res.GetOwner() != rt.GetOwner() || res.GetGroup() != rt.GetGroup():
		return fmt.Errorf("owner %q:%q, the manifest says %q:%q", res.GetOwner(), res.GetGroup(), rt.GetOwner(), rt.GetGroup())
	case res.GetUserList() != rt.GetUserList():
		return fmt.Errorf("user_list %v, the manifest says %v", res.GetUserList(), rt.GetUserList())
	case lint.Literal(rt.GetPath()) && res.GetPath() != rt.GetPath():
		return fmt.Errorf("path %s, the manifest says %s", res.GetPath(), rt.GetPath())
	case lint.Literal(rt.GetTarget()) && res.GetTarget() != rt.GetTarget():
		return fmt.Errorf("target %q, the manifest says %q", res.GetTarget(), rt.GetTarget())
	}
	inline, _ := res.GetContent().(*typev1.Resource_Inline)
	object := res.GetObject()
	switch c := rt.GetContent().(type) {
	case *typev1.ResourceTemplate_Artifact:
		if a, ok := res.GetContent().(*typev1.Resource_Artifact); !ok || a.Artifact != c.Artifact {
			return fmt.Errorf("content is not artifact %s, as the manifest says", c.Artifact)
		}
	case *typev1.ResourceTemplate_Raw:
		switch {
		case inline != nil && bytes.Equal(inline.Inline, c.Raw):
		case object != nil && object.GetDigest() == names.Digest(c.Raw) && object.GetSize() == int64(len(c.Raw)):
		default:
			return errors.New("content is not the manifest's raw bytes")
		}
	case *typev1.ResourceTemplate_Text:
		if inline == nil && object == nil {
			return errors.New("content is not rendered text, as the manifest says")
		}
	default:
		if res.GetContent() != nil {
			return errors.New("has content the manifest does not declare")
		}
	}
	return nil
}

// CheckWants checks that each module want's parts are exactly its build's
// artifacts.
func (c *Checker) CheckWants(ctx context.Context, node string, wants []*typev1.Want) error {
	for i, w := range wants {
		if w.GetModule() == names.NodeModule {
			continue
		}
		r, err := c.lookup(ctx, w.GetFingerprint())
		if err != nil {
			if errors.Is(err, service.ErrUnavailable) {
				return err
			}
			return &service.ItemError{Index: i, Key: node + ":" + w.GetModule(), Err: err}
		}
		if r.module != w.GetModule() {
			return &service.ItemError{Index: i, Key: node + ":" + w.GetModule(), Err: fmt.Errorf("%w: %s is an entry of module %q", errRefused, w.GetFingerprint(), r.module)}
		}
		if !slices.EqualFunc(w.GetParts(), r.artifacts, func(a, b *typev1.Artifact) bool {
			return a.GetRef() == b.GetRef() && a.GetDigest() == b.GetDigest() && a.GetSize() == b.GetSize()
		}) {
			return &service.ItemError{Index: i, Key: node + ":" + w.GetModule(), Err: fmt.Errorf("%w: parts are not the build's artifacts", errRefused)}
		}
	}
	return nil
}
