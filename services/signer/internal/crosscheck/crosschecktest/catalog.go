// Package crosschecktest is an in-memory catalog for the signer's tests: it
// answers GetEntry and GetBuild as the catalog does, from entries the test
// releases.
package crosschecktest

import (
	"context"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"mesh.dev/internal/canonical"
	"mesh.dev/internal/names"
	catalogv1 "mesh.dev/proto/mesh/catalog/v1"
	typev1 "mesh.dev/proto/mesh/type/v1"
)

// Catalog holds entries and builds by fingerprint.
type Catalog struct {
	mu      sync.Mutex
	entries map[string]*catalogv1.Entry
	builds  map[string]*catalogv1.Build
	// Calls counts GetEntry calls, so tests can see the cache work.
	Calls int
	// down makes every call answer UNAVAILABLE, as a catalog that cannot
	// be reached.
	down bool
}

// SetDown makes the catalog unreachable (every call UNAVAILABLE), or
// reachable again.
func (c *Catalog) SetDown(down bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.down = down
}

// New returns an empty catalog.
func New() *Catalog {
	return &Catalog{entries: map[string]*catalogv1.Entry{}, builds: map[string]*catalogv1.Build{}}
}

// Release adds an entry of a module manifest with a build in the given state
// and verdict, and returns its fingerprint.
func (c *Catalog) Release(m *typev1.ModuleManifest, state catalogv1.BuildState, verdict catalogv1.Verdict, artifacts ...*typev1.Artifact) string {
	b, err := canonical.Marshal(m)
	if err != nil {
		panic(err)
	}
	src := names.Digest([]byte(m.GetModule() + m.GetVersion()))
	fp := names.ComputeFingerprint(m.GetModule(), "git.example/infra", "modules/"+m.GetModule(), src, names.Digest(b))
	e := &catalogv1.Entry{Fingerprint: fp, Module: m.GetModule(), Repository: "git.example/infra", Path: "modules/" + m.GetModule(),
		SourceDigest: src, Manifest: b, ManifestDigest: names.Digest(b), Verdict: verdict}
	for _, a := range artifacts {
		kind, _, _ := cut(a.GetRef())
		e.Artifacts = append(e.Artifacts, &catalogv1.ArtifactDecl{Ref: a.GetRef(), Kind: kind})
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.entries[fp] = e
	c.builds[fp] = &catalogv1.Build{Fingerprint: fp, State: state, Artifacts: artifacts}
	return fp
}

func cut(ref string) (string, string, bool) {
	for i := 0; i < len(ref); i++ {
		if ref[i] == ':' {
			return ref[:i], ref[i+1:], true
		}
	}
	return ref, "", false
}

// GetEntry answers like the catalog.
func (c *Catalog) GetEntry(_ context.Context, in *catalogv1.GetEntryRequest, _ ...grpc.CallOption) (*catalogv1.GetEntryResponse, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.Calls++
	if c.down {
		return nil, status.Error(codes.Unavailable, "catalog down")
	}
	e, ok := c.entries[in.GetFingerprint()]
	if !ok {
		return nil, status.Errorf(codes.NotFound, "no entry of fingerprint %s", in.GetFingerprint())
	}
	return &catalogv1.GetEntryResponse{Entry: proto.Clone(e).(*catalogv1.Entry)}, nil
}

// GetBuild answers like the catalog.
func (c *Catalog) GetBuild(_ context.Context, in *catalogv1.GetBuildRequest, _ ...grpc.CallOption) (*catalogv1.GetBuildResponse, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.down {
		return nil, status.Error(codes.Unavailable, "catalog down")
	}
	b, ok := c.builds[in.GetFingerprint()]
	if !ok {
		return nil, status.Errorf(codes.NotFound, "no build of fingerprint %s", in.GetFingerprint())
	}
	return &catalogv1.GetBuildResponse{Build: proto.Clone(b).(*catalogv1.Build)}, nil
}

// SetManifest replaces the manifest of the entry at fp, as a catalog
// answering with an entry the fingerprint does not name would: the entry no
// longer recomputes to fp.
func (c *Catalog) SetManifest(fp string, m *typev1.ModuleManifest) {
	b, err := canonical.Marshal(m)
	if err != nil {
		panic(err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.entries[fp].Manifest, c.entries[fp].ManifestDigest = b, names.Digest(b)
}
