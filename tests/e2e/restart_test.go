package e2e

import (
	"context"
	"fmt"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	"mesh.dev/cmd/meshctl/onebox"
	"mesh.dev/internal/identity"
	"mesh.dev/internal/natsx"
	composerv1 "mesh.dev/proto/mesh/composer/v1"
	nodeenginev1 "mesh.dev/proto/mesh/nodeengine/v1"
	nodeengineapp "mesh.dev/services/nodeengine/app"
)

// TestEngineStartedWithComposerDown converges a mesh, stops it, and starts
// one node's engine alone with neither composer nor catalog reachable: it
// applies nothing new (the tree under its root is unchanged, the applied
// manifest and high-water are the ones it kept) and reports its kept state
// (GetStatus connected=false with why, the applied manifest, its wants and
// haves; FirstViews with the wants' since kept across the restart). Started
// again with the whole mesh, it converges.
func TestEngineStartedWithComposerDown(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dir := t.TempDir()
	w := startMeshIn(t, dir, onebox.Options{Nodes: 3})
	w.converge(ctx)
	const node = "dev-1"
	e := w.engine(node)
	before, err := w.status(ctx, node)
	if err != nil {
		t.Fatal(err)
	}
	fvBefore, err := w.admin(node).FirstViews(ctx, &nodeenginev1.FirstViewsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	certs := w.m.CertsDir
	roots := w.m.RootsFile()
	w.stop()
	treeBefore := tree(t, e.Root)

	// Nothing listens on these: the composer and the catalog are down.
	down := closedAddr(t)
	cert, key, ca := certFiles(certs, node)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	restarted := time.Now()
	stopEngine := runEngine(t, nodeengineapp.Config{
		Root: e.Root, StateDir: e.State, RootsFile: roots, AllowPrefixes: onebox.Prefixes,
		ComposerAddr: down, CatalogAddr: down, CertFile: cert, KeyFile: key, CAFile: ca,
	}, nodeengineapp.Options{AdminListener: lis, Logger: w.logger("engine-" + node),
		SyncBackoffBase: 50 * time.Millisecond, SyncBackoffMax: 200 * time.Millisecond})
	admin := adminClient(t, lis.Addr().String(), certs)

	var s *nodeenginev1.GetStatusResponse
	waitFor(t, 30*time.Second, "the engine reports its kept state with the composer down", func() (bool, string) {
		s, err = admin.GetStatus(ctx, &nodeenginev1.GetStatusRequest{})
		switch {
		case err != nil:
			return false, err.Error()
		case s.GetConnected() || s.GetConnectionError() == "" || s.GetConnectionError() == "not connected to a composer yet":
			return false, fmt.Sprintf("connected %v: %q", s.GetConnected(), s.GetConnectionError())
		case len(s.GetHaves()) == 0:
			return false, "no haves yet"
		case len(s.GetWants()) == 0:
			// The haves are reported from the moment the engine is open;
			// the wants once its first pass ran.
			return false, "no wants yet (no pass ran)"
		}
		return true, ""
	})
	if !proto.Equal(s.GetApplied(), before.GetApplied()) || s.GetHighWater() != before.GetHighWater() {
		t.Errorf("applied %v high-water %d after the restart; before: %v %d", s.GetApplied(), s.GetHighWater(), before.GetApplied(), before.GetHighWater())
	}
	if s.GetPending() != nil {
		t.Errorf("a manifest is pending with the composer down: %v", s.GetPending())
	}
	// Every want but the node's own is kept (DESIGN.md §7).
	if len(s.GetWants()) != len(before.GetWants())-1 || wantOf(s.GetWants(), "node") != nil {
		t.Errorf("wants after the restart: %v; before: %v", s.GetWants(), before.GetWants())
	}
	for _, want := range before.GetWants() {
		if want.GetModule() == "node" {
			continue
		}
		if got := wantOf(s.GetWants(), want.GetModule()); !proto.Equal(got, want) {
			t.Errorf("kept want of %s is %v, was %v", want.GetModule(), got, want)
		}
	}
	for _, h := range before.GetHaves() {
		got := haveOf(s, h.GetModule())
		if !proto.Equal(got.GetApplied(), h.GetApplied()) {
			t.Errorf("%s: applied %v after the restart, %v before", h.GetModule(), got.GetApplied(), h.GetApplied())
		}
	}
	if len(s.GetHolds()) != 0 || len(s.GetDrift()) != 0 || s.GetStale() != "" {
		t.Errorf("holds %v, drift %v, stale %q with every entry kept", s.GetHolds(), s.GetDrift(), s.GetStale())
	}
	fv, err := admin.FirstViews(ctx, &nodeenginev1.FirstViewsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	checkFirstViews(t, node, s, fv, time.Time{}, time.Now())
	for _, v := range fvBefore.GetWants() {
		var got *nodeenginev1.WantView
		for _, x := range fv.GetWants() {
			if x.GetModule() == v.GetModule() {
				got = x
			}
		}
		if !got.GetSince().AsTime().Equal(v.GetSince().AsTime()) {
			t.Errorf("want of %s: since %v after the restart, %v before (kept across restarts)", v.GetModule(), got.GetSince().AsTime(), v.GetSince().AsTime())
		}
	}
	for _, en := range fv.GetEntries() {
		if en.GetSince().AsTime().Before(restarted.Add(-time.Second)) {
			t.Errorf("kept entry %s: since %v, not its load time after the restart", en.GetFingerprint(), en.GetSince().AsTime())
		}
	}
	if d := diffTrees(treeBefore, tree(t, e.Root)); len(d) > 0 {
		t.Errorf("the engine changed its root with the composer down:\n%s", strings.Join(d, "\n"))
	}
	stopEngine()

	// The whole mesh again, on the same data dir: it converges.
	w2 := startMeshIn(t, dir, onebox.Options{Nodes: 3})
	after := w2.waitConverged(ctx, nil)
	if got := after[node].GetApplied().GetRevision(); got < before.GetApplied().GetRevision() {
		t.Errorf("applied revision %d after the mesh came back, %d before", got, before.GetApplied().GetRevision())
	}
}

// TestNodeDeletedAndRecreatedKeepsConverging deletes a node's spec and puts
// it again, twice (once with a change, once as it was, without waiting for
// the engine to notice the deletion): the engine keeps converging, and
// neither its applied revision nor its high-water mark ever goes backwards.
func TestNodeDeletedAndRecreatedKeepsConverging(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	w := startMesh(t, 3)
	w.converge(ctx)
	const node = "dev-3"
	e := w.engine(node)
	mon := w.monitorRevisions(ctx, node)

	s0, err := w.status(ctx, node)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.composer.DeleteNode(ctx, &composerv1.DeleteNodeRequest{Node: node}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "the engine told its node has no spec", func() (bool, string) {
		s, err := w.status(ctx, node)
		if err != nil {
			return false, err.Error()
		}
		if s.GetConnected() || !strings.Contains(s.GetConnectionError(), "no node spec") {
			return false, fmt.Sprintf("connected %v, %q", s.GetConnected(), s.GetConnectionError())
		}
		return true, ""
	})
	// The engine keeps what it applied while its node has no spec.
	if s, err := w.status(ctx, node); err != nil || !proto.Equal(s.GetApplied(), s0.GetApplied()) {
		t.Fatalf("applied %v (%v) with the node deleted, %v before", s.GetApplied(), err, s0.GetApplied())
	}

	// Re-created with sshd on another port.
	spec := onebox.DevSpec(3)
	for _, p := range spec.GetModules() {
		if p.GetModule() == "sshd" {
			p.Params.Fields["port"] = structpb.NewNumberValue(2222)
		}
	}
	if _, err := w.composer.PutNode(ctx, &composerv1.PutNodeRequest{Spec: spec}); err != nil {
		t.Fatal(err)
	}
	s1 := w.waitConverged(ctx, func(n string, s *nodeenginev1.GetStatusResponse) (bool, string) {
		if n != node {
			return true, ""
		}
		if s.GetApplied().GetRevision() <= s0.GetApplied().GetRevision() {
			return false, "the re-created node's manifest not applied yet"
		}
		return true, ""
	})[node]
	if got := readFile(t, filepath.Join(e.Root, "etc", "ssh", "sshd_config")); !strings.Contains(got, "2222") {
		t.Errorf("sshd_config of the re-created node does not name port 2222:\n%s", got)
	}

	// Deleted and put back as it was, at once.
	if _, err := w.composer.DeleteNode(ctx, &composerv1.DeleteNodeRequest{Node: node}); err != nil {
		t.Fatal(err)
	}
	if _, err := w.composer.PutNode(ctx, &composerv1.PutNodeRequest{Spec: onebox.DevSpec(3)}); err != nil {
		t.Fatal(err)
	}
	w.waitConverged(ctx, func(n string, s *nodeenginev1.GetStatusResponse) (bool, string) {
		if n != node {
			return true, ""
		}
		if s.GetApplied().GetRevision() <= s1.GetApplied().GetRevision() {
			return false, "the manifest of the spec put back not applied yet"
		}
		if got := readFile(t, filepath.Join(e.Root, "etc", "ssh", "sshd_config")); strings.Contains(got, "2222") {
			return false, "sshd_config still names port 2222"
		}
		return true, ""
	})
	for _, err := range mon.stop() {
		t.Error(err)
	}
}

// revisionMonitor polls an engine's status and the composer's haves record
// of its node and records any applied revision or high-water mark that goes
// backwards.
type revisionMonitor struct {
	stop func() []error
}

func (w *world) monitorRevisions(ctx context.Context, node string) *revisionMonitor {
	ctx, cancel := context.WithCancel(ctx)
	var (
		mu               sync.Mutex
		errs             []error
		applied, hw      uint64
		polls, haveSeens int
	)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for ctx.Err() == nil {
			s, err := w.status(ctx, node)
			if err == nil {
				mu.Lock()
				polls++
				if r := s.GetApplied().GetRevision(); r < applied {
					errs = append(errs, fmt.Errorf("%s: applied revision went from %d to %d", node, applied, r))
				} else {
					applied = r
				}
				if s.GetHighWater() < hw {
					errs = append(errs, fmt.Errorf("%s: high-water went from %d to %d", node, hw, s.GetHighWater()))
				} else {
					hw = s.GetHighWater()
				}
				mu.Unlock()
			}
			select {
			case <-ctx.Done():
			case <-time.After(10 * time.Millisecond):
			}
		}
	}()
	// The haves the engine reported, as the composer recorded them.
	wg.Add(1)
	go func() {
		defer wg.Done()
		kv, err := w.m.JetStream.KeyValue(ctx, natsx.BucketHaves)
		if err != nil {
			mu.Lock()
			errs = append(errs, err)
			mu.Unlock()
			return
		}
		watch, err := kv.Watch(ctx, node)
		if err != nil {
			mu.Lock()
			errs = append(errs, err)
			mu.Unlock()
			return
		}
		defer watch.Stop()
		var last uint64
		for {
			select {
			case <-ctx.Done():
				return
			case e, ok := <-watch.Updates():
				if !ok {
					return
				}
				if e == nil || len(e.Value()) == 0 {
					continue
				}
				rec := &composerv1.HaveRecord{}
				if proto.Unmarshal(e.Value(), rec) != nil {
					continue
				}
				mu.Lock()
				haveSeens++
				if r := rec.GetApplied().GetRevision(); r < last {
					errs = append(errs, fmt.Errorf("%s: reported applied revision went from %d to %d", node, last, r))
				} else {
					last = r
				}
				mu.Unlock()
			}
		}
	}()
	return &revisionMonitor{stop: func() []error {
		cancel()
		wg.Wait()
		mu.Lock()
		defer mu.Unlock()
		if polls == 0 || haveSeens == 0 {
			errs = append(errs, fmt.Errorf("the monitor saw %d statuses and %d haves records", polls, haveSeens))
		}
		return errs
	}}
}

// closedAddr returns a loopback address nothing listens on.
func closedAddr(t *testing.T) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := lis.Addr().String()
	lis.Close()
	return addr
}

// certFiles returns the files of a node's certificate in a dev certs dir.
func certFiles(certsDir, node string) (cert, key, ca string) {
	id := identity.Identity{TrustDomain: onebox.TrustDomain, Role: identity.RoleNode, Name: node}
	return pkiPaths(certsDir, id)
}

// adminClient dials an engine's admin API as the operator admin.
func adminClient(t *testing.T, addr, certsDir string) nodeenginev1.NodeEngineServiceClient {
	t.Helper()
	conn, err := dialAs(addr, certsDir, identity.Identity{TrustDomain: onebox.TrustDomain, Role: identity.RoleOperator, Name: "admin"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return nodeenginev1.NewNodeEngineServiceClient(conn)
}

// runEngine runs a node engine in this process until the returned stop is
// called (or the test ends) and checks that it ended cleanly.
func runEngine(t *testing.T, cfg nodeengineapp.Config, opts nodeengineapp.Options) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- nodeengineapp.Run(ctx, cfg, opts) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("the engine ended with: %v", err)
			}
		})
	}
	t.Cleanup(stop)
	return stop
}
