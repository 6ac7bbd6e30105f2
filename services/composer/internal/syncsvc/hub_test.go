package syncsvc

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"mesh.dev/internal/identity"
	"mesh.dev/internal/names"
	"mesh.dev/internal/testutil"
	"mesh.dev/internal/verify"
	catalogv1 "mesh.dev/proto/mesh/catalog/v1"
	composerv1 "mesh.dev/proto/mesh/composer/v1"
	typev1 "mesh.dev/proto/mesh/type/v1"
	"mesh.dev/services/composer/internal/pass"
	"mesh.dev/services/composer/internal/store"
)

// fakeClock is the hubs' clock; the test moves it.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// needsCatalog answers entries whose manifests hold needs.
type needsCatalog map[string]*typev1.ModuleManifest

func (c needsCatalog) Registration(string) (*catalogv1.Registration, bool) { return nil, false }
func (c needsCatalog) Entry(_ context.Context, fp string) (*pass.Release, error) {
	m, ok := c[fp]
	if !ok {
		return nil, pass.ErrNoEntry
	}
	return &pass.Release{Entry: &catalogv1.Entry{Fingerprint: fp, Module: m.GetModule()}, Manifest: m}, nil
}
func (c needsCatalog) Build(context.Context, string) (*catalogv1.Build, error) {
	return nil, pass.ErrNoBuild
}

func fpOf(c byte) string { return names.FingerprintFromHex(strings.Repeat(string([]byte{c}), 64)) }

var (
	fpClient = fpOf('c')
	fpWeb    = fpOf('e')
	fpOld    = fpOf('a') // server at the fingerprint nodes run
	fpNew    = fpOf('b') // server at the fingerprint nodes are assigned
)

// syncWorld is a store on a real embedded JetStream shared by composer
// replicas, each a hub and a Sync server over real mTLS, on one clock.
type syncWorld struct {
	st      *store.Store
	pki     *testutil.PKI
	ring    *verify.Keyring
	clock   *fakeClock
	catalog needsCatalog
	labels  map[string]map[string]string
}

func newSyncWorld(t *testing.T) *syncWorld {
	t.Helper()
	_, js := testutil.ConnectJetStream(t, testutil.StartJetStream(t))
	st, err := store.Open(context.Background(), js, 1, 10*time.Second, nil)
	if err != nil {
		t.Fatal(err)
	}
	tr := testutil.NewTrust(t, 1, 1)
	ring, err := verify.Keyset(tr.Roots, tr.KeysetEnvelope)
	if err != nil {
		t.Fatal(err)
	}
	return &syncWorld{st: st, pki: testutil.NewPKI(t), ring: ring, clock: &fakeClock{now: time.Now()},
		catalog: needsCatalog{}, labels: map[string]map[string]string{}}
}

// node writes a node's spec and an assignment wanting modules at their
// fingerprints (module → fp).
func (w *syncWorld) node(t *testing.T, node string, labels map[string]string, wants map[string]string) {
	t.Helper()
	ctx := context.Background()
	if _, err := w.st.PutSpec(ctx, &composerv1.NodeSpec{Node: node, Labels: labels}, 0, true); err != nil {
		t.Fatal(err)
	}
	w.labels[node] = labels
	var ws []*typev1.Want
	for m, fp := range wants {
		key, _ := names.CompositionKey(node, m, fp)
		ws = append(ws, &typev1.Want{Module: m, Fingerprint: fp, CompositionKey: key, CompositionDigest: names.Digest([]byte(key))})
	}
	if _, err := w.st.WriteAssignment(ctx, &composerv1.Assignment{Node: node, Wants: ws, ManifestRevision: 1}, 0); err != nil {
		t.Fatal(err)
	}
}

func (w *syncWorld) labelsOf(n string) map[string]string { return w.labels[n] }

// replica is one composer replica: a hub and a Sync server.
type replica struct {
	hub  *Hub
	addr string
}

func (w *syncWorld) replica(t *testing.T) *replica {
	t.Helper()
	return replicaWith(t, w, fixedKeysets{w.ring}, w.labelsOf)
}

// engine is one node engine's Sync stream.
type engine struct {
	stream grpc.BidiStreamingClient[composerv1.SyncRequest, composerv1.SyncResponse]
	msgs   chan *composerv1.SyncResponse
	err    chan error
}

func (w *syncWorld) dial(t *testing.T, r *replica, node string, haves ...*composerv1.Have) *engine {
	t.Helper()
	conn := testutil.Dial(t, w.pki, r.addr, w.pki.Identity(identity.RoleNode, node))
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	st, err := composerv1.NewSyncServiceClient(conn).Sync(ctx)
	if err != nil {
		t.Fatal(err)
	}
	hello := &composerv1.Hello{Node: node, KeysetVersion: w.ring.Version(), ReportSeq: 1, Haves: haves}
	if err := st.Send(&composerv1.SyncRequest{Msg: &composerv1.SyncRequest_Hello{Hello: hello}}); err != nil {
		t.Fatal(err)
	}
	e := &engine{stream: st, msgs: make(chan *composerv1.SyncResponse, 256), err: make(chan error, 1)}
	go func() {
		for {
			m, err := st.Recv()
			if err != nil {
				e.err <- err
				return
			}
			e.msgs <- m
		}
	}()
	return e
}

// have is a have of module: applied at applied (none when ""), its last
// attempt at attempt in state.
func have(node, module, applied, attempt string, state composerv1.AttemptState) *composerv1.Have {
	h := &composerv1.Have{Module: module}
	if applied != "" {
		key, _ := names.CompositionKey(node, module, applied)
		h.Applied = &composerv1.AppliedRef{Fingerprint: applied, Key: key, Digest: names.Digest([]byte(key))}
	}
	key, _ := names.CompositionKey(node, module, attempt)
	h.Attempt = &composerv1.Attempt{Fingerprint: attempt, Key: key, State: state, ReasonCode: composerv1.ReasonCode_REASON_CODE_ENTRY_ASKED}
	return h
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 20s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

func heardWords(h *composerv1.Heard) string {
	var parts []string
	for _, m := range h.GetModules() {
		var nodes []string
		for _, n := range m.GetNodes() {
			s := n.GetNode() + " " + names.FingerprintHex(n.GetFingerprint())[:1]
			if n.GetStopped() {
				s += " stopped"
			}
			nodes = append(nodes, s)
		}
		parts = append(parts, m.GetModule()+": "+strings.Join(nodes, ", "))
	}
	return strings.Join(parts, "; ")
}

// waitHeard reads the engine's stream until a Heard with the words comes.
func (e *engine) waitHeard(t *testing.T, want string) {
	t.Helper()
	deadline := time.After(20 * time.Second)
	last := "(none)"
	for {
		select {
		case m := <-e.msgs:
			if h := m.GetHeard(); h != nil {
				if last = heardWords(h); last == want {
					return
				}
			}
		case err := <-e.err:
			t.Fatalf("stream ended waiting for heard %q (last %q): %v", want, last, err)
		case <-deadline:
			t.Fatalf("heard %q, want %q", last, want)
		}
	}
}

// haveRevision returns the revision of a node's haves record.
func (w *syncWorld) haveRevision(t *testing.T, node string) uint64 {
	t.Helper()
	_, rev, err := w.st.Have(context.Background(), node)
	if err != nil {
		return 0
	}
	return rev
}

// TestHeardAcrossReplicas: an engine streaming to replica B is heard
// running by replica A (from the haves records B writes and touches every
// TouchEvery), at the fingerprint it runs even while its attempt at the
// assigned one is held; a node that runs nothing, or whose engine no
// replica heard within Liveness, is stopped. The lease holder's last-seen
// (its status) comes from the same writes.
func TestHeardAcrossReplicas(t *testing.T) {
	t.Parallel()
	w := newSyncWorld(t)
	w.catalog[fpClient] = &typev1.ModuleManifest{Module: "client", Needs: []*typev1.Need{{Module: "server"}}}
	w.node(t, "ace", nil, map[string]string{"client": fpClient})
	for _, n := range []string{"s1", "s2", "s3", "s4"} {
		w.node(t, n, nil, map[string]string{"server": fpNew})
	}
	// s4's engine reported once, long ago in this test's time, and then
	// went silent: its record is there, nobody touches it.
	b, _ := proto.Marshal(&composerv1.HaveRecord{Node: "s4", ReportSeq: 1, Haves: []*composerv1.Have{
		have("s4", "server", fpOld, fpOld, composerv1.AttemptState_ATTEMPT_STATE_APPLIED)}})
	if _, err := w.st.Haves.Create(context.Background(), "s4", b); err != nil {
		t.Fatal(err)
	}
	a, rb := w.replica(t), w.replica(t)

	// s1 runs the old fingerprint, its attempt at the new one held; s2
	// runs nothing yet; both stream to B. s3's engine never came.
	w.dial(t, rb, "s1", have("s1", "server", fpOld, fpNew, composerv1.AttemptState_ATTEMPT_STATE_HELD))
	w.dial(t, rb, "s2", have("s2", "server", "", fpNew, composerv1.AttemptState_ATTEMPT_STATE_FAILED))
	waitFor(t, "haves of s1 and s2 written", func() bool { return w.haveRevision(t, "s1") > 0 && w.haveRevision(t, "s2") > 0 })
	ace := w.dial(t, a, "ace")
	ace.waitHeard(t, "server: s1 a, s2 b stopped, s3 b stopped, s4 a")

	// Three touch periods later (more than Liveness): B rewrote s1's and
	// s2's records each period (so A still hears them), nobody wrote s4's,
	// which A now hears as stopped.
	for range 3 {
		before := w.haveRevision(t, "s1")
		w.clock.Add(TouchEvery + time.Second)
		waitFor(t, "B touched s1's haves", func() bool { return w.haveRevision(t, "s1") > before })
	}
	waitFor(t, "A saw the touch", func() bool { return a.hub.LastSeen("s1").Equal(w.clock.Now()) })
	a.hub.sweep(w.clock.Now())
	ace.waitHeard(t, "server: s1 a, s2 b stopped, s3 b stopped, s4 a stopped")
	if seen := a.hub.LastSeen("s1"); !seen.Equal(w.clock.Now()) {
		t.Errorf("A's last-seen of s1 (streaming to B) is %v, want now %v", seen, w.clock.Now())
	}
	if seen := a.hub.LastSeen("s4"); w.clock.Now().Sub(seen) <= Liveness {
		t.Errorf("A's last-seen of s4 is %v, within %v of now %v", seen, Liveness, w.clock.Now())
	}
}

// TestHeardBounds: each need's cap is applied after liveness, so running
// nodes take the places before stopped ones that sort first; two needs of
// one module with different selectors each select their own nodes.
func TestHeardBounds(t *testing.T) {
	t.Parallel()
	w := newSyncWorld(t)
	zone := func(z string) map[string]string { return map[string]string{"zone": z} }
	w.node(t, "a1", zone("a"), map[string]string{"server": fpNew}) // stopped: runs nothing
	w.node(t, "a2", zone("a"), map[string]string{"server": fpNew})
	w.node(t, "b1", zone("b"), map[string]string{"server": fpNew})
	w.node(t, "b2", zone("b"), map[string]string{"server": fpNew}) // stopped
	for _, n := range []string{"a2", "b1"} {
		b, _ := proto.Marshal(&composerv1.HaveRecord{Node: n, ReportSeq: 1, Haves: []*composerv1.Have{
			have(n, "server", fpNew, fpNew, composerv1.AttemptState_ATTEMPT_STATE_APPLIED)}})
		if _, err := w.st.Haves.Create(context.Background(), n, b); err != nil {
			t.Fatal(err)
		}
	}
	r := w.replica(t)
	waitFor(t, "the hub saw the haves", func() bool { return !r.hub.LastSeen("a2").IsZero() && !r.hub.LastSeen("b1").IsZero() })
	sel := func(z string, n uint32) *typev1.Need {
		return &typev1.Need{Module: "server", Selector: &typev1.LabelSelector{MatchLabels: zone(z)}, Cap: n}
	}
	tests := []struct {
		name  string
		needs []*typev1.Need
		want  string
	}{
		{"cap 1: the running node, not the stopped one sorting first", []*typev1.Need{{Module: "server", Cap: 1}}, "server: a2 b"},
		{"cap 3: running first, then stopped by name", []*typev1.Need{{Module: "server", Cap: 3}}, "server: a1 b stopped, a2 b, b1 b"},
		{"no cap: 16", []*typev1.Need{{Module: "server"}}, "server: a1 b stopped, a2 b, b1 b, b2 b stopped"},
		{"a selector", []*typev1.Need{sel("b", 0)}, "server: b1 b, b2 b stopped"},
		{"two selectors on one module: both", []*typev1.Need{sel("a", 1), sel("b", 1)}, "server: a2 b, b1 b"},
		{"two selectors, caps of their own", []*typev1.Need{sel("a", 2), sel("b", 1)}, "server: a1 b stopped, a2 b, b1 b"},
		{"needs of two modules, sorted", []*typev1.Need{{Module: "zeta"}, sel("a", 1)}, "server: a2 b; zeta: "},
		{"this node is never heard", []*typev1.Need{sel("a", 0)}, "server: a1 b stopped"},
	}
	for _, tt := range tests {
		self := "ace"
		if tt.name == "this node is never heard" {
			self = "a2"
		}
		if got := heardWords(r.hub.heard(self, tt.needs, w.labelsOf)); got != tt.want {
			t.Errorf("%s: heard %q, want %q", tt.name, got, tt.want)
		}
	}
}

// TestWriteHaves checks report_seq (DESIGN.md §6 step 3: a lower one is
// dropped): lower is dropped, equal or higher is written when the content
// differs, and the same content is never written again.
func TestWriteHaves(t *testing.T) {
	t.Parallel()
	w := newSyncWorld(t)
	hub := NewHub(w.st, slog.New(slog.DiscardHandler))
	ctx := context.Background()
	rec := func(seq uint64, reason string) *composerv1.HaveRecord {
		return &composerv1.HaveRecord{Node: "ace", ReportSeq: seq, Haves: []*composerv1.Have{{Module: "web",
			Attempt: &composerv1.Attempt{State: composerv1.AttemptState_ATTEMPT_STATE_HELD, Reason: reason}}}}
	}
	steps := []struct {
		name    string
		rec     *composerv1.HaveRecord
		written bool
		// held is the record's report_seq and reason after the step.
		seq    uint64
		reason string
	}{
		{"the first", rec(10, "ten"), true, 10, "ten"},
		{"lower with other content: dropped", rec(9, "nine"), false, 10, "ten"},
		{"equal with other content: written", rec(10, "ten again"), true, 10, "ten again"},
		{"equal, same content: not written", rec(10, "ten again"), false, 10, "ten again"},
		{"higher, same content: not written", rec(11, "ten again"), false, 10, "ten again"},
		{"higher with other content: written", rec(12, "twelve"), true, 12, "twelve"},
	}
	var rev uint64
	for _, s := range steps {
		if err := hub.writeHaves(ctx, s.rec); err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		got, next, err := w.st.Have(ctx, "ace")
		if err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		if (next != rev) != s.written || got.GetReportSeq() != s.seq || got.GetHaves()[0].GetAttempt().GetReason() != s.reason {
			t.Errorf("%s: revision %d→%d, held report_seq %d %q; want written %v, %d %q", s.name, rev, next, got.GetReportSeq(),
				got.GetHaves()[0].GetAttempt().GetReason(), s.written, s.seq, s.reason)
		}
		rev = next
	}
}

// TestWriteHavesOverTheWatchedRecord: the record the watch delivered last
// stands in for the read before the CAS, and is never trusted beyond it: a
// watched record the bucket moved past makes the CAS conflict and the
// report is judged against the bucket's record; one that would drop the
// report is checked against the bucket too.
func TestWriteHavesOverTheWatchedRecord(t *testing.T) {
	t.Parallel()
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	_, js := testutil.ConnectJetStream(t, testutil.StartJetStream(t))
	st, err := store.Open(context.Background(), js, 1, 10*time.Second, tp)
	if err != nil {
		t.Fatal(err)
	}
	w := &syncWorld{st: st}
	hub := NewHub(w.st, slog.New(slog.DiscardHandler))
	ctx := context.Background()
	// reads counts the reads of the haves bucket since the last count.
	reads := func() int {
		n := 0
		for _, s := range exp.GetSpans() {
			if s.Name == "kv.get haves" {
				n++
			}
		}
		exp.Reset()
		return n
	}
	rec := func(seq uint64, reason string) *composerv1.HaveRecord {
		return &composerv1.HaveRecord{Node: "ace", ReportSeq: seq, Haves: []*composerv1.Have{{Module: "web",
			Attempt: &composerv1.Attempt{State: composerv1.AttemptState_ATTEMPT_STATE_HELD, Reason: reason}}}}
	}
	// watch sets what the hub's watch delivered last, as the watch does.
	watch := func(r *composerv1.HaveRecord, rev uint64) {
		hub.mu.Lock()
		hub.haves["ace"], hub.haveRev["ace"] = r, rev
		hub.mu.Unlock()
	}
	held := func() (uint64, string, uint64) {
		got, rev, err := w.st.Have(ctx, "ace")
		if err != nil {
			t.Fatal(err)
		}
		return got.GetReportSeq(), got.GetHaves()[0].GetAttempt().GetReason(), rev
	}
	if err := hub.writeHaves(ctx, rec(10, "ten")); err != nil {
		t.Fatal(err)
	}
	_, _, rev := held()

	watch(rec(10, "ten"), rev)
	reads()
	if err := hub.writeHaves(ctx, rec(11, "eleven")); err != nil {
		t.Fatal(err)
	}
	if n := reads(); n != 0 {
		t.Errorf("a report over the current watched record read the bucket %d times; want none", n)
	}
	if seq, reason, now := held(); seq != 11 || reason != "eleven" || now == rev {
		t.Fatalf("over the current watched record: held %d %q r%d; want 11 \"eleven\" written", seq, reason, now)
	}
	// Another replica wrote 20 since the watch delivered 11: 15 is dropped.
	_, _, rev = held()
	watch(rec(11, "eleven"), rev)
	if err := hub.writeHaves(ctx, rec(20, "twenty")); err != nil {
		t.Fatal(err)
	}
	_, _, rev20 := held()
	reads()
	if err := hub.writeHaves(ctx, rec(15, "fifteen")); err != nil {
		t.Fatal(err)
	}
	if n := reads(); n != 1 {
		t.Errorf("a report over a watched record the bucket moved past read the bucket %d times; want once, after the conflict", n)
	}
	if seq, reason, now := held(); seq != 20 || reason != "twenty" || now != rev20 {
		t.Errorf("over a watched record the bucket moved past: held %d %q r%d; want 20 \"twenty\" left at r%d", seq, reason, now, rev20)
	}
	// A watched record that would drop the report (not what the bucket
	// holds) does not decide alone.
	watch(rec(30, "thirty"), rev20)
	if err := hub.writeHaves(ctx, rec(25, "twenty-five")); err != nil {
		t.Fatal(err)
	}
	if seq, reason, _ := held(); seq != 25 || reason != "twenty-five" {
		t.Errorf("a watched record above the report dropped it: held %d %q; want 25 \"twenty-five\" (the bucket holds 20)", seq, reason)
	}
}

// TestNotServingWhenBehind: a replica whose assignments watch is more than
// MaxLag behind the stream reports NOT_SERVING, ends its streams with
// UNAVAILABLE and a retry-after, and refuses new ones, until it catches up.
func TestNotServingWhenBehind(t *testing.T) {
	t.Parallel()
	w := newSyncWorld(t)
	ctx := context.Background()
	w.node(t, "ace", nil, nil)
	// The hub's watch is not run: the test moves it by hand, as one
	// caught up to revision 1 of the assignments.
	hub := NewHub(w.st, slog.New(slog.DiscardHandler))
	hub.now = w.clock.Now
	last, err := w.st.Assignments.LastSequence(ctx)
	if err != nil {
		t.Fatal(err)
	}
	hub.mu.Lock()
	hub.caughtUp, hub.seenRev = true, last
	hub.mu.Unlock()
	srv := New(Config{Hub: hub, Store: w.st, Keysets: fixedKeysets{w.ring}, Catalog: w.catalog, Logger: slog.New(slog.DiscardHandler)})
	addr, gs := testutil.StartServer(t, w.pki, w.pki.Identity(identity.RoleComposer, ""), Policy(), srv.Register)
	service := composerv1.SyncService_ServiceDesc.ServiceName
	hub.OnHealth(func(ok bool) {
		st := healthpb.HealthCheckResponse_NOT_SERVING
		if ok {
			st = healthpb.HealthCheckResponse_SERVING
		}
		gs.Health().SetServingStatus(service, st)
	})
	hub.judgeLag(ctx, w.clock.Now())
	health := healthpb.NewHealthClient(testutil.Dial(t, w.pki, addr, w.pki.Identity(identity.RoleNode, "ace")))
	serving := func() healthpb.HealthCheckResponse_ServingStatus {
		resp, err := health.Check(ctx, &healthpb.HealthCheckRequest{Service: service})
		if err != nil {
			t.Fatal(err)
		}
		return resp.GetStatus()
	}
	if st := serving(); st != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("a caught-up replica is %v", st)
	}
	e := w.dial(t, &replica{hub: hub, addr: addr}, "ace")
	waitFor(t, "the stream open", func() bool { return hub.Streams() == 1 })

	// An assignment the watch does not see: behind from now on.
	w.node(t, "bob", nil, nil)
	start := w.clock.Now()
	steps := []struct {
		at      time.Duration
		serving bool
	}{{0, true}, {MaxLag / 2, true}, {MaxLag, true}, {MaxLag + time.Millisecond, false}}
	for _, s := range steps {
		w.clock.Add(start.Add(s.at).Sub(w.clock.Now()))
		hub.judgeLag(ctx, w.clock.Now())
		if hub.Healthy() != s.serving {
			t.Fatalf("behind for %v: healthy %v, want %v", s.at, hub.Healthy(), s.serving)
		}
	}
	if st := serving(); st != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Errorf("a replica behind by more than %v is %v", MaxLag, st)
	}
	select {
	case err := <-e.err:
		if status.Code(err) != codes.Unavailable || retryDelay(err) <= 0 {
			t.Errorf("the stream ended with %v, want UNAVAILABLE with a retry-after", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the stream did not end")
	}
	e2 := w.dial(t, &replica{hub: hub, addr: addr}, "ace")
	if err := <-e2.err; status.Code(err) != codes.Unavailable || retryDelay(err) <= 0 {
		t.Errorf("a new stream on a replica behind: %v, want UNAVAILABLE with a retry-after", err)
	}

	// Caught up: serving again.
	last, err = w.st.Assignments.LastSequence(ctx)
	if err != nil {
		t.Fatal(err)
	}
	hub.mu.Lock()
	hub.seenRev = last
	hub.mu.Unlock()
	hub.judgeLag(ctx, w.clock.Now())
	if st := serving(); !hub.Healthy() || st != healthpb.HealthCheckResponse_SERVING {
		t.Errorf("caught up: healthy %v, %v", hub.Healthy(), st)
	}
	w.dial(t, &replica{hub: hub, addr: addr}, "ace")
	waitFor(t, "a new stream served", func() bool { return hub.Streams() == 1 })
}

func retryDelay(err error) time.Duration {
	for _, d := range status.Convert(err).Details() {
		if ri, ok := d.(*errdetails.RetryInfo); ok {
			return ri.GetRetryDelay().AsDuration()
		}
	}
	return 0
}
