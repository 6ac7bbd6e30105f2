package syncsvc

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"mesh.dev/internal/identity"
	"mesh.dev/internal/natsx"
	"mesh.dev/internal/testutil"
	"mesh.dev/internal/verify"
	composerv1 "mesh.dev/proto/mesh/composer/v1"
	typev1 "mesh.dev/proto/mesh/type/v1"
	"mesh.dev/services/composer/internal/store"
)

// revisionManifest is a stand-in for a signed manifest that says its
// revision in its payload: the Sync server forwards manifests as they are.
func revisionManifest(rev uint64) *typev1.Envelope {
	return &typev1.Envelope{PayloadType: typev1.PayloadType_PAYLOAD_TYPE_MANIFEST, Payload: []byte(strconv.FormatUint(rev, 10))}
}

// follower is an engine that keeps a Sync stream open to a replica,
// reopening it whenever it ends as an engine does, and keeps the highest
// manifest revision it received.
type follower struct {
	node string
	mu   sync.Mutex
	got  uint64
}

func (f *follower) received() uint64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.got
}

func (f *follower) run(ctx context.Context, t *testing.T, w *syncWorld, addr string) {
	conn := testutil.Dial(t, w.pki, addr, w.pki.Identity(identity.RoleNode, f.node))
	client := composerv1.NewSyncServiceClient(conn)
	for seq := uint64(1); ctx.Err() == nil; seq++ {
		f.stream(ctx, client, w.ring.Version(), seq)
		select {
		case <-ctx.Done():
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func (f *follower) stream(ctx context.Context, client composerv1.SyncServiceClient, keyset, seq uint64) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	st, err := client.Sync(ctx)
	if err != nil {
		return
	}
	have := f.received()
	hello := &composerv1.Hello{Node: f.node, KeysetVersion: keyset, ReportSeq: seq, HighWater: have,
		Applied: &composerv1.ManifestRef{Revision: have}}
	if err := st.Send(&composerv1.SyncRequest{Msg: &composerv1.SyncRequest_Hello{Hello: hello}}); err != nil {
		return
	}
	for {
		m, err := st.Recv()
		if err != nil {
			return
		}
		if env := m.GetManifest(); env != nil {
			rev, err := strconv.ParseUint(string(env.GetPayload()), 10, 64)
			if err != nil {
				panic(err)
			}
			f.mu.Lock()
			f.got = max(f.got, rev)
			f.mu.Unlock()
		}
	}
}

// longOutage is surely judged more than MaxLag behind: the lag is checked
// every 2 s and each check may wait natsx.RequestTimeout for its reply.
const longOutage = MaxLag + 2*time.Second + 2*natsx.RequestTimeout

// TestStreamsConvergeAcrossNATSRestarts: JetStream restarts while the
// assignments of many nodes are being rewritten, once at once and once for
// longer than MaxLag; once the writes stop, every engine's stream (reopened
// as an engine does when the replica ends it) has received its node's
// latest manifest — none is left on one the watch or its stream missed
// around an outage (DESIGN.md §6 step 4).
func TestStreamsConvergeAcrossNATSRestarts(t *testing.T) {
	t.Parallel()
	js := testutil.StartJetStream(t)
	_, conn := testutil.ConnectJetStream(t, js)
	st, err := store.Open(context.Background(), conn, 1, 10*time.Second, nil)
	if err != nil {
		t.Fatal(err)
	}
	tr := testutil.NewTrust(t, 1, 1)
	ring, err := verify.Keyset(tr.Roots, tr.KeysetEnvelope)
	if err != nil {
		t.Fatal(err)
	}
	w := &syncWorld{st: st, pki: testutil.NewPKI(t), ring: ring, clock: &fakeClock{now: time.Now()},
		catalog: needsCatalog{}, labels: map[string]map[string]string{}}

	const nodes = 12
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var names []string
	revs := map[string]uint64{} // the store's revision of each node's assignment
	latest := map[string]uint64{}
	next := uint64(1000)
	write := func(node string) error {
		next++
		wctx, wcancel := context.WithTimeout(ctx, 2*time.Second)
		defer wcancel()
		rev, err := st.WriteAssignment(wctx, &composerv1.Assignment{Node: node, ManifestRevision: next, Manifest: revisionManifest(next)}, revs[node])
		if err != nil {
			// Written or not, the next write of the node reads the
			// revision again: an acknowledgement lost to the restart
			// may hide a write that was made.
			if a, r, gerr := st.Assignment(wctx, node); gerr == nil {
				revs[node], latest[node] = r, a.GetManifestRevision()
			}
			return err
		}
		revs[node], latest[node] = rev, next
		return nil
	}
	for i := range nodes {
		node := fmt.Sprintf("n%02d", i)
		names = append(names, node)
		if _, err := st.PutSpec(ctx, &composerv1.NodeSpec{Node: node}, 0, true); err != nil {
			t.Fatal(err)
		}
		if err := write(node); err != nil {
			t.Fatal(err)
		}
	}
	// The hub runs on the real clock: its lag is judged as in production.
	hub := NewHub(st, slog.New(slog.DiscardHandler))
	var stoppedServing atomic.Bool
	hub.OnHealth(func(serving bool) {
		if !serving {
			stoppedServing.Store(true)
		}
	})
	hubDone := make(chan error, 1)
	go func() { hubDone <- hub.Run(ctx) }()
	defer func() {
		cancel()
		<-hubDone
	}()
	waitFor(t, "the hub caught up", hub.Healthy)
	srv := New(Config{Hub: hub, Store: st, Keysets: fixedKeysets{ring}, Catalog: w.catalog, Labels: w.labelsOf,
		Logger: slog.New(slog.DiscardHandler), HeardEvery: 10 * time.Millisecond})
	addr, _ := testutil.StartServer(t, w.pki, w.pki.Identity(identity.RoleComposer, ""), Policy(), srv.Register)
	var followers []*follower
	var wg sync.WaitGroup
	defer func() {
		cancel()
		wg.Wait()
	}()
	for _, node := range names {
		f := &follower{node: node}
		followers = append(followers, f)
		wg.Add(1)
		go func() {
			defer wg.Done()
			f.run(ctx, t, w, addr)
		}()
	}
	waitFor(t, "every stream has its first manifest", func() bool {
		for _, f := range followers {
			if f.received() != latest[f.node] {
				return false
			}
		}
		return true
	})

	// Rewrite assignments without pause while the server restarts at once
	// (the watch resumes within MaxLag), then stays down for longer than
	// MaxLag (the replica stops serving, its streams end and come back),
	// and a while after each.
	rng := rand.New(rand.NewPCG(1, 2))
	restarts := make(chan error, 1)
	go func() {
		restarts <- func() error {
			for _, down := range []time.Duration{0, longOutage} {
				time.Sleep(300 * time.Millisecond)
				js.Shutdown()
				time.Sleep(down)
				next, err := natsx.StartEmbedded(js.Config())
				if err != nil {
					return err
				}
				t.Cleanup(next.Shutdown)
				js = next
			}
			time.Sleep(300 * time.Millisecond)
			return nil
		}()
	}()
	writes := 0
	for done := false; !done; {
		select {
		case err := <-restarts:
			if err != nil {
				t.Fatalf("restart jetstream: %v", err)
			}
			done = true
		default:
		}
		if write(names[rng.IntN(len(names))]) == nil {
			writes++
		}
	}
	t.Logf("%d assignment writes acknowledged across the restarts", writes)
	// What each node is assigned is what the store holds now (a write
	// whose acknowledgement was lost may have been made).
	for _, node := range names {
		waitFor(t, "the assignment of "+node+" read", func() bool {
			rctx, rcancel := context.WithTimeout(ctx, 2*time.Second)
			defer rcancel()
			a, _, err := st.Assignment(rctx, node)
			if err == nil {
				latest[node] = a.GetManifestRevision()
			}
			return err == nil
		})
	}

	deadline := time.Now().Add(MaxLag + 30*time.Second)
	for {
		var behind []string
		for _, f := range followers {
			if got := f.received(); got != latest[f.node] {
				behind = append(behind, fmt.Sprintf("%s at %d, assigned %d", f.node, got, latest[f.node]))
			}
		}
		if len(behind) == 0 {
			if !stoppedServing.Load() {
				t.Errorf("the replica never stopped serving while JetStream was down for %s", longOutage)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("streams left behind their node's assignment: %v (hub healthy %v)", behind, hub.Healthy())
		}
		time.Sleep(50 * time.Millisecond)
	}
}
