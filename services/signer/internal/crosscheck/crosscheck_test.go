package crosscheck

import (
	"context"
	"runtime"
	"sync"
	"testing"

	"google.golang.org/grpc"

	catalogv1 "mesh.dev/proto/mesh/catalog/v1"
	typev1 "mesh.dev/proto/mesh/type/v1"
	"mesh.dev/services/signer/internal/crosscheck/crosschecktest"
)

// gatedCatalog holds every GetEntry until open is closed.
type gatedCatalog struct {
	*crosschecktest.Catalog
	open chan struct{}
}

func (g gatedCatalog) GetEntry(ctx context.Context, in *catalogv1.GetEntryRequest, opts ...grpc.CallOption) (*catalogv1.GetEntryResponse, error) {
	<-g.open
	return g.Catalog.GetEntry(ctx, in, opts...)
}

func TestLookupsOfOneFingerprintShareOneAsk(t *testing.T) {
	t.Parallel()
	cat := crosschecktest.New()
	fp := cat.Release(&typev1.ModuleManifest{Module: "web", Version: "1.0.0"}, catalogv1.BuildState_BUILD_STATE_DONE, catalogv1.Verdict_VERDICT_PASS)
	g := gatedCatalog{Catalog: cat, open: make(chan struct{})}
	c := New(g)
	const callers = 8
	var wg sync.WaitGroup
	errs := make(chan error, callers)
	for range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r, err := c.lookup(context.Background(), fp)
			if err == nil && r.module != "web" {
				t.Errorf("module %q, want web", r.module)
			}
			errs <- err
		}()
	}
	// Every caller is either the one asking or waiting for it once the
	// ask is in flight; then the catalog answers.
	for {
		if inFlight, _ := c.asking.InFlight(fp); inFlight {
			break
		}
		runtime.Gosched()
	}
	close(g.open)
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	// The cache is filled before the ask stops being in flight, so no
	// caller asks again.
	if cat.Calls != 1 {
		t.Fatalf("%d GetEntry calls for %d callers, want 1", cat.Calls, callers)
	}
	// Callers that came after the answer read the cache.
	if _, err := c.lookup(context.Background(), fp); err != nil {
		t.Fatal(err)
	}
	calls := cat.Calls
	if _, err := c.lookup(context.Background(), fp); err != nil || cat.Calls != calls {
		t.Fatalf("a cached fingerprint asked the catalog again (%d calls, then %d; %v)", calls, cat.Calls, err)
	}
}
