package app_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"mesh.dev/internal/testutil"
	signerv1 "mesh.dev/proto/mesh/signer/v1"
	typev1 "mesh.dev/proto/mesh/type/v1"
	"mesh.dev/services/signer/app"
	"mesh.dev/services/signer/internal/audit"
	"mesh.dev/services/signer/internal/crosscheck/crosschecktest"
	"mesh.dev/services/signer/internal/state"
)

// The kill test runs the signer as a child process: this test binary,
// re-executed with childEnv set to a config file, serves until it is killed.
const childEnv = "MESH_SIGNER_TEST_CHILD_CONFIG"

func TestMain(m *testing.M) {
	if path := os.Getenv(childEnv); path != "" {
		os.Exit(runChild(path))
	}
	os.Exit(m.Run())
}

func runChild(path string) int {
	var cfg app.Config
	b, err := os.ReadFile(path)
	if err == nil {
		err = yaml.Unmarshal(b, &cfg)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "child config:", err)
		return 2
	}
	addrFile := path + ".addr"
	err = app.Run(context.Background(), cfg, app.Options{
		Catalog: crosschecktest.New(),
		Ready: func(a net.Addr) {
			os.WriteFile(addrFile+".tmp", []byte(a.String()), 0o600)
			os.Rename(addrFile+".tmp", addrFile)
		},
	})
	fmt.Fprintln(os.Stderr, "child:", err)
	return 1
}

// startChild starts a signer process on w's config and waits for its
// address.
func startChild(t *testing.T, w *world) (*exec.Cmd, string) {
	t.Helper()
	cfgPath := filepath.Join(w.dir, "child.yaml")
	b, err := yaml.Marshal(w.cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(cfgPath, b, 0o600); err != nil {
		t.Fatal(err)
	}
	os.Remove(cfgPath + ".addr")
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"="+cfgPath)
	cmd.Stderr = testWriter{t}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		if a, err := os.ReadFile(cfgPath + ".addr"); err == nil {
			return cmd, string(a)
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatal("the signer child did not start within 30s")
	return nil, ""
}

// acked is what the clients saw acknowledged before the kill.
type acked struct {
	mu        sync.Mutex
	digests   map[string]bool
	revisions map[string]uint64
	// batches counts the batches acknowledged in the current round, and
	// cut the calls the kill ended while they were in flight.
	batches, cut int
}

// TestKillMidBatchLosesNothingAcknowledged kills the signer with SIGKILL
// while clients sign manifests and compositions as fast as they can, three
// times over, and checks after each kill: the audit chain verifies, every
// acknowledged item has its signed record, every acknowledged revision is in
// the state, and after a restart revisions go on above every acknowledged one.
func TestKillMidBatchLosesNothingAcknowledged(t *testing.T) {
	if testing.Short() {
		t.Skip("starts and kills processes")
	}
	t.Parallel()
	w := newWorld(t)
	a := &acked{digests: map[string]bool{}, revisions: map[string]uint64{}}
	nodes := make([]string, 20)
	for i := range nodes {
		nodes[i] = fmt.Sprintf("node-%02d", i)
	}
	for round := 0; round < 3; round++ {
		cmd, addr := startChild(t, w)
		c := signerv1.NewSignerServiceClient(testutil.Dial(t, w.pki, addr, w.pki.Identity("composer", "")))
		epoch := fence(t, c)

		// After a restart, revisions go on above everything acknowledged.
		for _, n := range nodes {
			resp, err := c.SignManifests(context.Background(), &signerv1.SignManifestsRequest{FencingEpoch: epoch,
				Manifests: []*signerv1.ManifestItem{{Node: n, Wants: []*typev1.Want{nodeWant(t, n)}}}})
			if err != nil {
				t.Fatal(err)
			}
			a.mu.Lock()
			if got := resp.GetManifests()[0].GetRevision(); got <= a.revisions[n] {
				t.Fatalf("round %d: %s got revision %d, not above the acknowledged %d", round, n, got, a.revisions[n])
			}
			a.mu.Unlock()
		}

		ctx, cancel := context.WithCancel(context.Background())
		var wg sync.WaitGroup
		a.mu.Lock()
		a.batches, a.cut = 0, 0
		a.mu.Unlock()
		// failed counts a call the kill cut while it was in flight (the
		// test's own cancel comes after the kill).
		failed := func() {
			if ctx.Err() == nil {
				a.mu.Lock()
				a.cut++
				a.mu.Unlock()
			}
		}
		for g := 0; g < 4; g++ {
			wg.Add(1)
			go func(g int) {
				defer wg.Done()
				for i := 0; ctx.Err() == nil; i++ {
					if (g+i)%2 == 0 {
						items := make([]*signerv1.ManifestItem, len(nodes))
						for j, n := range nodes {
							items[j] = &signerv1.ManifestItem{Node: n, Wants: []*typev1.Want{nodeWant(t, n)}}
						}
						resp, err := c.SignManifests(ctx, &signerv1.SignManifestsRequest{FencingEpoch: epoch, Manifests: items})
						if err != nil {
							failed()
							return
						}
						a.mu.Lock()
						a.batches++
						for j, m := range resp.GetManifests() {
							a.revisions[nodes[j]] = max(a.revisions[nodes[j]], m.GetRevision())
							a.digests[m.GetItem().GetDigest()] = true
						}
						a.mu.Unlock()
					} else {
						comps := make([]*typev1.Composition, 50)
						for j := range comps {
							comps[j] = nodeComposition(fmt.Sprintf("n%d-%d-%d", g, i, j))
						}
						resp, err := c.SignCompositions(ctx, &signerv1.SignCompositionsRequest{FencingEpoch: epoch, Compositions: comps})
						if err != nil {
							failed()
							return
						}
						a.mu.Lock()
						a.batches++
						for _, it := range resp.GetItems() {
							a.digests[it.GetDigest()] = true
						}
						a.mu.Unlock()
					}
				}
			}(g)
		}
		// Kill after a number of acknowledged batches that grows each
		// round, while four clients keep a batch in flight each.
		waitBatches(t, a, 2+round*6)
		if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		cmd.Wait()
		wg.Wait()
		cancel()
		a.mu.Lock()
		cut := a.cut
		a.mu.Unlock()
		if cut == 0 {
			t.Fatalf("round %d: the kill cut no call in flight: it did not land mid-batch", round)
		}

		// The chain verifies (a torn last line is a write never acknowledged).
		rep, err := audit.Verify(filepath.Join(w.stateDir, "audit.log"))
		if err != nil {
			t.Fatalf("round %d: audit verify: %v", round, err)
		}
		signedDigests := map[string]bool{}
		answered := map[uint64]bool{}
		var requests []uint64
		for _, r := range auditRecords(t, w.stateDir)[:rep.Records] {
			switch r.Kind {
			case audit.KindSigned:
				for _, it := range r.Items {
					signedDigests[it.Digest] = true
				}
				answered[r.Request] = true
			case audit.KindRefused:
				answered[r.Request] = true
			case audit.KindRequest:
				requests = append(requests, r.Seq)
			}
		}
		unanswered := 0
		for _, seq := range requests {
			if !answered[seq] {
				unanswered++
			}
		}
		a.mu.Lock()
		for d := range a.digests {
			if !signedDigests[d] {
				t.Errorf("round %d: acknowledged %s has no signed audit record", round, d)
			}
		}
		st, err := state.Open(filepath.Join(w.stateDir, "signer.db"))
		if err != nil {
			t.Fatal(err)
		}
		for n, rev := range a.revisions {
			last, err := st.LastRevision(n)
			if err != nil || last < rev {
				t.Errorf("round %d: %s acknowledged revision %d, state holds %d (%v)", round, n, rev, last, err)
			}
		}
		st.Close()
		t.Logf("round %d: %d items acknowledged so far, %d calls cut in flight, %d audit records, %d requests recorded and never answered, torn tail %v",
			round, len(a.digests), cut, rep.Records, unanswered, rep.Torn)
		a.mu.Unlock()
	}
	if len(a.digests) == 0 {
		t.Fatal("nothing was acknowledged")
	}
}

// waitBatches waits until the current round has n acknowledged batches.
func waitBatches(t *testing.T, a *acked, n int) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		a.mu.Lock()
		got := a.batches
		a.mu.Unlock()
		if got >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("only %d of %d batches acknowledged within a minute", got, n)
		}
		time.Sleep(time.Millisecond)
	}
}
