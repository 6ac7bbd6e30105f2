package catalogview

import (
	"context"
	"errors"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"

	"mesh.dev/internal/canonical"
	"mesh.dev/internal/names"
	catalogv1 "mesh.dev/proto/mesh/catalog/v1"
	typev1 "mesh.dev/proto/mesh/type/v1"
)

// gatedCatalog answers one released entry and its DONE build once open is
// closed, counting the calls.
type gatedCatalog struct {
	open          chan struct{}
	entry         *catalogv1.Entry
	entries, bldg atomic.Int32
}

func newGatedCatalog(t *testing.T) *gatedCatalog {
	t.Helper()
	m, err := canonical.Marshal(&typev1.ModuleManifest{Module: "web", Version: "1.0.0"})
	if err != nil {
		t.Fatal(err)
	}
	src := names.Digest([]byte("web sources"))
	fp := names.ComputeFingerprint("web", "git.example/infra", "modules/web", src, names.Digest(m))
	return &gatedCatalog{open: make(chan struct{}), entry: &catalogv1.Entry{Fingerprint: fp, Module: "web",
		Repository: "git.example/infra", Path: "modules/web", SourceDigest: src, Manifest: m, ManifestDigest: names.Digest(m)}}
}

func (g *gatedCatalog) GetEntry(ctx context.Context, in *catalogv1.GetEntryRequest, _ ...grpc.CallOption) (*catalogv1.GetEntryResponse, error) {
	g.entries.Add(1)
	<-g.open
	return &catalogv1.GetEntryResponse{Entry: g.entry}, nil
}

func (g *gatedCatalog) GetBuild(ctx context.Context, in *catalogv1.GetBuildRequest, _ ...grpc.CallOption) (*catalogv1.GetBuildResponse, error) {
	g.bldg.Add(1)
	<-g.open
	return &catalogv1.GetBuildResponse{Build: &catalogv1.Build{Fingerprint: in.GetFingerprint(), State: catalogv1.BuildState_BUILD_STATE_DONE}}, nil
}

func (g *gatedCatalog) WatchModules(context.Context, *catalogv1.WatchModulesRequest, ...grpc.CallOption) (grpc.ServerStreamingClient[catalogv1.WatchModulesResponse], error) {
	return nil, errors.New("not watched here")
}

// TestPassesAskingAtOnceShareOneCall: at a fleet-wide change every worker's
// pass asks for the new fingerprint's entry and build at once; the catalog
// is asked once for each, and the answers are then cached.
func TestPassesAskingAtOnceShareOneCall(t *testing.T) {
	t.Parallel()
	cat := newGatedCatalog(t)
	v := New(cat, nil, nil)
	fp := cat.entry.GetFingerprint()
	const passes = 16
	var wg sync.WaitGroup
	errs := make(chan error, 2*passes)
	for range passes {
		wg.Go(func() {
			rel, err := v.Entry(context.Background(), fp)
			if err == nil && rel.Manifest.GetModule() != "web" {
				err = errors.New("another entry's manifest")
			}
			errs <- err
		})
		wg.Go(func() {
			_, err := v.Build(context.Background(), fp)
			errs <- err
		})
	}
	// Released once every pass waits on the one call of each kind (or,
	// were nothing shared, after a while: the counts then tell).
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); runtime.Gosched() {
		_, entryWaiters := v.askingEntries.InFlight(fp)
		_, buildWaiters := v.askingBuilds.InFlight(fp)
		if entryWaiters == passes-1 && buildWaiters == passes-1 {
			break
		}
	}
	close(cat.open)
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if e, b := cat.entries.Load(), cat.bldg.Load(); e != 1 || b != 1 {
		t.Fatalf("%d GetEntry and %d GetBuild calls for %d passes, want 1 each", e, b, passes)
	}
	if _, err := v.Entry(context.Background(), fp); err != nil {
		t.Fatal(err)
	}
	if _, err := v.Build(context.Background(), fp); err != nil {
		t.Fatal(err)
	}
	if e, b := cat.entries.Load(), cat.bldg.Load(); e != 1 || b != 1 {
		t.Fatalf("cached answers asked again: %d GetEntry, %d GetBuild", e, b)
	}
}
