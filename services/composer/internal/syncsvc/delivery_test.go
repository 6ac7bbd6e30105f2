package syncsvc

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"mesh.dev/internal/envelope"
	"mesh.dev/internal/identity"
	"mesh.dev/internal/names"
	"mesh.dev/internal/testutil"
	"mesh.dev/internal/verify"
	composerv1 "mesh.dev/proto/mesh/composer/v1"
	typev1 "mesh.dev/proto/mesh/type/v1"
	"mesh.dev/services/composer/internal/pass"
)

// swapKeysets is the replica's keyset keeper; the test swaps it.
type swapKeysets struct {
	p atomic.Pointer[verify.Keyring]
}

func (k *swapKeysets) Keyring() *verify.Keyring { return k.p.Load() }

// lockedLabels is a node-labels source that can change while the hub reads it
// (the reconciler's spec watch in production).
type lockedLabels struct {
	mu sync.Mutex
	m  map[string]map[string]string
}

func (l *lockedLabels) set(n string, v map[string]string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.m[n] = v
}

func (l *lockedLabels) of(n string) map[string]string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.m[n]
}

// replicaWith is a replica with the keysets, labels and (when given) catalog
// given; w.replica is one with the world's.
func replicaWith(t *testing.T, w *syncWorld, ks Keysets, labels func(string) map[string]string, cat ...pass.Catalog) *replica {
	t.Helper()
	hub := NewHub(w.st, slog.New(slog.DiscardHandler))
	hub.now = w.clock.Now
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- hub.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	waitFor(t, "the hub caught up", hub.Healthy)
	var catalog pass.Catalog = w.catalog
	if len(cat) > 0 {
		catalog = cat[0]
	}
	srv := New(Config{Hub: hub, Store: w.st, Keysets: ks, Catalog: catalog, Labels: labels,
		Logger: slog.New(slog.DiscardHandler), HeardEvery: 10 * time.Millisecond})
	addr, _ := testutil.StartServer(t, w.pki, w.pki.Identity(identity.RoleComposer, ""), Policy(), srv.Register)
	return &replica{hub: hub, addr: addr}
}

// TestManifestNotLostBehindItsKeyset: the signer switched to a new key K2
// (keyset v2 lists it) before this replica's keeper took keyset v2 (the pass
// commits such a manifest and only then calls Trust.Stale). The stream sends
// the K2 manifest while it can still only send keyset v1; the engine refuses
// it (unknown key) and drops it. When keyset v2 comes, the engine must
// still end up with the manifest: either it was held back until the keyset
// could go first, or it is sent again after the keyset.
func TestManifestNotLostBehindItsKeyset(t *testing.T) {
	t.Parallel()
	w := newSyncWorld(t)
	tr := testutil.NewTrust(t, 1, 1)
	ring1, err := verify.Keyset(tr.Roots, tr.KeysetEnvelope)
	if err != nil {
		t.Fatal(err)
	}
	k2 := testutil.NewKey(t)
	now := time.Now()
	ks2 := proto.Clone(tr.Keyset).(*typev1.Keyset)
	ks2.Version = 2
	ks2.Keys = append(ks2.Keys, testutil.KeysetKeyOf(k2, typev1.KeyState_KEY_STATE_ACTIVE, now.Add(-time.Hour), now.Add(24*time.Hour)))
	ring2, err := verify.Keyset(tr.Roots, tr.SignKeyset(t, ks2, tr.RootKeys...))
	if err != nil {
		t.Fatal(err)
	}
	keysets := &swapKeysets{}
	keysets.p.Store(ring1)

	ctx := context.Background()
	if _, err := w.st.PutSpec(ctx, &composerv1.NodeSpec{Node: "ace"}, 0, true); err != nil {
		t.Fatal(err)
	}
	env, _, err := envelope.Seal(typev1.PayloadType_PAYLOAD_TYPE_MANIFEST, &typev1.Manifest{Node: "ace", Revision: 5, KeysetVersion: 2,
		IssuedAt: timestamppb.New(now), ExpiresAt: timestamppb.New(now.Add(24 * time.Hour))})
	if err != nil {
		t.Fatal(err)
	}
	if err := envelope.SignWith(env, k2); err != nil {
		t.Fatal(err)
	}
	if _, err := w.st.WriteAssignment(ctx, &composerv1.Assignment{Node: "ace", Manifest: env, ManifestRevision: 5}, 0); err != nil {
		t.Fatal(err)
	}
	r := replicaWith(t, w, keysets, nil)

	conn := testutil.Dial(t, w.pki, r.addr, w.pki.Identity(identity.RoleNode, "ace"))
	sctx, cancel := context.WithCancel(ctx)
	t.Cleanup(cancel)
	st, err := composerv1.NewSyncServiceClient(conn).Sync(sctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Send(&composerv1.SyncRequest{Msg: &composerv1.SyncRequest_Hello{Hello: &composerv1.Hello{Node: "ace", KeysetVersion: 1, ReportSeq: 1}}}); err != nil {
		t.Fatal(err)
	}
	// The engine: verifies each manifest with the keyset it holds, drops
	// one that does not verify (engine.judgeLocked), takes newer keysets.
	ring := ring1
	accepted := make(chan struct{})
	firstManifest := make(chan struct{})
	go func() {
		sawManifest := false
		for {
			m, err := st.Recv()
			if err != nil {
				return
			}
			switch x := m.GetMsg().(type) {
			case *composerv1.SyncResponse_Keyset:
				if kr, err := verify.Keyset(tr.Roots, x.Keyset); err == nil && kr.Version() > ring.Version() {
					ring = kr
				}
			case *composerv1.SyncResponse_Manifest:
				if !sawManifest {
					sawManifest = true
					close(firstManifest)
				}
				if _, err := ring.Verify(x.Manifest, typev1.PayloadType_PAYLOAD_TYPE_MANIFEST, time.Now()); err == nil {
					close(accepted)
					return
				}
			}
		}
	}()
	select {
	case <-firstManifest:
	case <-accepted:
		return
	case <-time.After(time.Second):
		// Held back until the keyset that lists its key is here.
	}
	// The keeper takes keyset v2 (Trust.OnChange → Hub.NotifyKeyset).
	keysets.p.Store(ring2)
	r.hub.NotifyKeyset()
	select {
	case <-accepted:
	case <-time.After(5 * time.Second):
		t.Fatal("the engine never received a manifest it could verify: the K2 manifest went out before keyset v2 and was not sent again after it")
	}
}

// settled waits until the write of node's own haves (its Hello) reached the
// hub and the Heard it wakes went out, so nothing else is pending on its
// stream.
func settled(t *testing.T, r *replica, node string) {
	t.Helper()
	waitFor(t, "the hub saw "+node+"'s haves", func() bool {
		r.hub.mu.Lock()
		defer r.hub.mu.Unlock()
		return r.hub.haveRev[node] != 0
	})
	time.Sleep(200 * time.Millisecond)
}

// TestHeardFollowsLabelChange: a need's selector picks nodes by label. When
// an operator relabels a node that runs the needed module (its spec
// changes, its wants and haves do not), the streams hearing it are told:
// the reconciler's spec watch calls NodeChanged
// (reconcile.Config.OnLabelsChanged).
func TestHeardFollowsLabelChange(t *testing.T) {
	t.Parallel()
	w := newSyncWorld(t)
	zone := func(z string) map[string]string { return map[string]string{"zone": z} }
	labels := &lockedLabels{m: map[string]map[string]string{}}
	w.catalog[fpClient] = &typev1.ModuleManifest{Module: "client", Needs: []*typev1.Need{
		{Module: "server", Selector: &typev1.LabelSelector{MatchLabels: zone("a")}}}}
	w.node(t, "ace", nil, map[string]string{"client": fpClient})
	w.node(t, "s1", zone("a"), map[string]string{"server": fpOld})
	labels.set("s1", zone("a"))
	b, _ := proto.Marshal(&composerv1.HaveRecord{Node: "s1", ReportSeq: 1, Haves: []*composerv1.Have{
		have("s1", "server", fpOld, fpOld, composerv1.AttemptState_ATTEMPT_STATE_APPLIED)}})
	if _, err := w.st.Haves.Create(context.Background(), "s1", b); err != nil {
		t.Fatal(err)
	}
	r := replicaWith(t, w, fixedKeysets{w.ring}, labels.of)
	ace := w.dial(t, r, "ace")
	ace.waitHeard(t, "server: s1 a")
	settled(t, r, "ace")

	// The operator moves s1 to zone b: its spec changes (the reconciler's
	// spec watch, which Labels reads, takes it); wants and haves do not.
	if _, err := w.st.PutSpec(context.Background(), &composerv1.NodeSpec{Node: "s1", Labels: zone("b")}, 0, false); err != nil {
		t.Fatal(err)
	}
	labels.set("s1", zone("b"))
	r.hub.NodeChanged("s1") // what the reconciler's spec watch calls (OnLabelsChanged)
	ace.waitHeard(t, "server: ")
}

// TestHeardAfterUndecodableHaves: a node's haves record that does not decode
// counts as running nothing; once a good record comes back, the node is
// heard running what it reports again.
func TestHeardAfterUndecodableHaves(t *testing.T) {
	t.Parallel()
	w := newSyncWorld(t)
	ctx := context.Background()
	w.catalog[fpClient] = &typev1.ModuleManifest{Module: "client", Needs: []*typev1.Need{{Module: "server"}}}
	w.node(t, "ace", nil, map[string]string{"client": fpClient})
	w.node(t, "s1", nil, map[string]string{"server": fpNew})
	good := func(seq uint64) []byte {
		b, _ := proto.Marshal(&composerv1.HaveRecord{Node: "s1", ReportSeq: seq, Haves: []*composerv1.Have{
			have("s1", "server", fpOld, fpOld, composerv1.AttemptState_ATTEMPT_STATE_APPLIED)}})
		return b
	}
	if _, err := w.st.Haves.Create(ctx, "s1", good(1)); err != nil {
		t.Fatal(err)
	}
	r := w.replica(t)
	ace := w.dial(t, r, "ace")
	ace.waitHeard(t, "server: s1 a")

	// A corrupt value (a truncated write, a bad replica)...
	if _, err := w.st.Haves.Put(ctx, "s1", []byte{0xff, 0xff, 0xff}); err != nil {
		t.Fatal(err)
	}
	ace.waitHeard(t, "server: s1 b stopped")
	// ...then the engine's next report, running what it ran before.
	if _, err := w.st.Haves.Put(ctx, "s1", good(2)); err != nil {
		t.Fatal(err)
	}
	ace.waitHeard(t, "server: s1 a")
}

// flakyCatalog is needsCatalog whose Entry fails while down is set (the
// catalog restarting; an entry not cached yet on this replica).
type flakyCatalog struct {
	needsCatalog
	down atomic.Bool
}

func (c *flakyCatalog) Entry(ctx context.Context, fp string) (*pass.Release, error) {
	if c.down.Load() {
		return nil, errors.New("catalog GetEntry: unavailable")
	}
	return c.needsCatalog.Entry(ctx, fp)
}

// TestHeardThroughCatalogOutage: a catalog call that fails while a stream
// recomputes its Heard must not make the stream tell its engine that the
// needed module runs nowhere, nor leave the stream deaf to the nodes that
// run it once the catalog answers again.
func TestHeardThroughCatalogOutage(t *testing.T) {
	t.Parallel()
	w := newSyncWorld(t)
	ctx := context.Background()
	fpClient2 := fpOf('d')
	w.catalog[fpClient] = &typev1.ModuleManifest{Module: "client", Needs: []*typev1.Need{{Module: "server"}}}
	w.catalog[fpClient2] = &typev1.ModuleManifest{Module: "client", Needs: []*typev1.Need{{Module: "server"}}}
	cat := &flakyCatalog{needsCatalog: w.catalog}
	w.node(t, "ace", nil, map[string]string{"client": fpClient})
	w.node(t, "s1", nil, map[string]string{"server": fpOld})
	putHaves := func(fp string, seq uint64) {
		b, _ := proto.Marshal(&composerv1.HaveRecord{Node: "s1", ReportSeq: seq, Haves: []*composerv1.Have{
			have("s1", "server", fp, fp, composerv1.AttemptState_ATTEMPT_STATE_APPLIED)}})
		if _, err := w.st.Haves.Put(ctx, "s1", b); err != nil {
			t.Fatal(err)
		}
	}
	putHaves(fpOld, 1)
	r := replicaWith(t, w, fixedKeysets{w.ring}, w.labelsOf, cat)
	ace := w.dial(t, r, "ace")
	ace.waitHeard(t, "server: s1 a")
	settled(t, r, "ace")

	// The catalog is briefly down just as ace is assigned a new build of
	// client (same needs) whose entry this replica has not cached.
	cat.down.Store(true)
	a, rev, err := w.st.Assignment(ctx, "ace")
	if err != nil {
		t.Fatal(err)
	}
	key, _ := names.CompositionKey("ace", "client", fpClient2)
	a.Wants = []*typev1.Want{{Module: "client", Fingerprint: fpClient2, CompositionKey: key, CompositionDigest: names.Digest([]byte(key))}}
	a.ManifestRevision = 2
	if _, err := w.st.WriteAssignment(ctx, a, rev); err != nil {
		t.Fatal(err)
	}
	deadline := time.After(time.Second)
wait:
	for {
		select {
		case m := <-ace.msgs:
			if h := m.GetHeard(); h != nil && heardWords(h) != "server: s1 a" {
				t.Errorf("during a catalog outage the stream sent Heard %q: server no longer heard at all", heardWords(h))
			}
		case <-deadline:
			break wait
		}
	}
	// The catalog answers again; then s1 moves to fpNew.
	cat.down.Store(false)
	time.Sleep(200 * time.Millisecond)
	putHaves(fpNew, 2)
	ace.waitHeard(t, "server: s1 b")
}
