package app_test

import (
	"context"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"mesh.dev/internal/canonical"
	"mesh.dev/internal/names"
	"mesh.dev/internal/natsx"
	"mesh.dev/internal/testutil"
	catalogv1 "mesh.dev/proto/mesh/catalog/v1"
	"mesh.dev/services/catalog/internal/store"
)

func register(t testing.TB, c catalogv1.CatalogServiceClient, module, fp string) *catalogv1.RegisterModuleResponse {
	t.Helper()
	resp, err := c.RegisterModule(context.Background(), &catalogv1.RegisterModuleRequest{Module: module, Fingerprint: fp})
	if err != nil {
		t.Fatalf("register %s at %s: %v", module, fp, err)
	}
	return resp
}

func TestRegisterModuleAndHistory(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	spans := tracetest.NewSpanRecorder()
	w.opts.TracerProvider = sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	r := w.start(t)
	c := w.builder(t, r)
	op := w.operator(t, r)
	ctx := context.Background()
	v1 := release(t, c, "sshd", "1.0")
	v2 := release(t, c, "sshd", "1.1")
	motd := release(t, c, "motd", "1.0")

	unknown := names.FingerprintPrefix + strings.Repeat("0", 64)
	for _, tc := range []struct {
		module, fp string
		code       codes.Code
		msg        string
	}{
		{"sshd", unknown, codes.NotFound, "no entry of fingerprint " + unknown},
		{"sshd", motd.GetFingerprint(), codes.FailedPrecondition, "fingerprint " + motd.GetFingerprint() + ` is an entry of module "motd", not "sshd"`},
		{"node", v1.GetFingerprint(), codes.InvalidArgument, `module: module name "node" is reserved`},
		{"sshd", "fp1:1", codes.InvalidArgument, `fingerprint "fp1:1" is not a fingerprint`},
	} {
		_, err := c.RegisterModule(ctx, &catalogv1.RegisterModuleRequest{Module: tc.module, Fingerprint: tc.fp})
		mustCode(t, err, tc.code, tc.msg)
	}
	_, err := op.GetModule(ctx, &catalogv1.GetModuleRequest{Module: "sshd"})
	mustCode(t, err, codes.NotFound, "no registration of module sshd")
	_, err = op.GetModule(ctx, &catalogv1.GetModuleRequest{Module: "SSHD"})
	mustCode(t, err, codes.InvalidArgument, `module: module "SSHD" is not a DNS label`)

	first := register(t, c, "sshd", v1.GetFingerprint())
	if !first.GetChanged() || first.GetRegistration().GetSeq() != 1 || first.GetRegistration().GetRegisteredBy() != "builder/ci" {
		t.Fatalf("first registration: %v", first)
	}
	if same := register(t, op, "sshd", v1.GetFingerprint()); same.GetChanged() || !proto.Equal(same.GetRegistration(), first.GetRegistration()) {
		t.Fatalf("registering the same fingerprint again: %v", same)
	}
	second := register(t, op, "sshd", v2.GetFingerprint())
	third := register(t, c, "sshd", v1.GetFingerprint()) // a rollback is a registration too
	register(t, c, "motd", motd.GetFingerprint())
	if second.GetRegistration().GetSeq() != 2 || third.GetRegistration().GetSeq() != 3 || second.GetRegistration().GetRegisteredBy() != "operator/admin" {
		t.Fatalf("second %v, third %v", second, third)
	}

	got, err := op.GetModule(ctx, &catalogv1.GetModuleRequest{Module: "sshd", History: true})
	if err != nil {
		t.Fatal(err)
	}
	if !proto.Equal(got.GetRegistration(), third.GetRegistration()) {
		t.Errorf("current %v, want %v", got.GetRegistration(), third.GetRegistration())
	}
	var fps []string
	for i, h := range got.GetHistory() {
		if h.GetSeq() != uint64(i+1) {
			t.Errorf("history[%d] has seq %d", i, h.GetSeq())
		}
		fps = append(fps, h.GetFingerprint())
	}
	if want := []string{v1.GetFingerprint(), v2.GetFingerprint(), v1.GetFingerprint()}; !slices.Equal(fps, want) {
		t.Errorf("history %v, want %v", fps, want)
	}
	noHist, err := op.GetModule(ctx, &catalogv1.GetModuleRequest{Module: "sshd"})
	if err != nil || len(noHist.GetHistory()) != 0 {
		t.Errorf("history sent unasked: %v, %v", noHist, err)
	}

	list, err := w.client(t, r, "composer", "").ListModules(ctx, &catalogv1.ListModulesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	var mods []string
	for _, reg := range list.GetRegistrations() {
		mods = append(mods, reg.GetModule()+"@"+reg.GetFingerprint())
	}
	if want := []string{"motd@" + motd.GetFingerprint(), "sshd@" + v1.GetFingerprint()}; !slices.Equal(mods, want) {
		t.Errorf("ListModules %v, want %v", mods, want)
	}

	// The registration carries the trace context of its RegisterModule
	// span, so the composer's pass continues that trace.
	tp := third.GetRegistration().GetTraceparent()
	var span sdktrace.ReadOnlySpan
	for _, s := range spans.Ended() {
		if s.Name() == "catalog.RegisterModule" && strings.Contains(tp, s.SpanContext().SpanID().String()) {
			span = s
		}
	}
	if span == nil || !strings.Contains(tp, span.SpanContext().TraceID().String()) {
		t.Fatalf("traceparent %q names no RegisterModule span", tp)
	}
	var kvUpdate bool
	for _, s := range spans.Ended() {
		if s.Name() == "kv.update catalog-modules" && s.Parent().SpanID() == span.SpanContext().SpanID() {
			kvUpdate = true
		}
	}
	if !kvUpdate {
		t.Error("no kv.update span under the RegisterModule span")
	}
}

// TestRegistrationHistoryRepair stands in for a catalog that stopped between
// writing a registration and its history key: the next start writes it.
func TestRegistrationHistoryRepair(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	r := w.start(t)
	c := w.builder(t, r)
	v1 := release(t, c, "sshd", "1.0")
	v2 := release(t, c, "sshd", "1.1")
	register(t, c, "sshd", v1.GetFingerprint())
	orphan := &catalogv1.Registration{Module: "sshd", Fingerprint: v2.GetFingerprint(), Seq: 2, RegisteredAt: timestamppb.Now(), RegisteredBy: "builder/ci"}
	_, rev, err := r.catalog.Store.Registration(context.Background(), "sshd")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.catalog.Store.PutRegistration(context.Background(), orphan, rev); err != nil {
		t.Fatal(err)
	}
	r.stop()

	r2 := w.start(t)
	got, err := w.operator(t, r2).GetModule(context.Background(), &catalogv1.GetModuleRequest{Module: "sshd", History: true})
	if err != nil {
		t.Fatal(err)
	}
	if n := len(got.GetHistory()); n != 2 || !proto.Equal(got.GetHistory()[1], orphan) {
		t.Fatalf("history after repair: %v", got.GetHistory())
	}
	hist, err := r2.catalog.Store.History(context.Background(), "sshd", 0)
	if err != nil || len(hist) != 2 {
		t.Fatalf("history keys after repair: %v, %v", hist, err)
	}
	if next := register(t, w.builder(t, r2), "sshd", v1.GetFingerprint()); next.GetRegistration().GetSeq() != 3 {
		t.Fatalf("next registration: %v", next)
	}
}

// TestRegisterRefusesToRewriteHistory tampers with a history key by hand
// and registers again: the catalog, which first completes the current
// registration's history key, finds another registration there, refuses
// with INTERNAL (no retry helps; the detail goes to the log) and changes
// nothing.
func TestRegisterRefusesToRewriteHistory(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	r := w.start(t)
	c := w.builder(t, r)
	ctx := context.Background()
	v1 := release(t, c, "sshd", "1.0")
	v2 := release(t, c, "sshd", "1.1")
	register(t, c, "sshd", v1.GetFingerprint())
	kv, err := natsx.OpenKV(ctx, w.js, natsx.BucketCatalogModules)
	if err != nil {
		t.Fatal(err)
	}
	forged := &catalogv1.Registration{Module: "sshd", Fingerprint: v2.GetFingerprint(), Seq: 1, RegisteredAt: timestamppb.Now(), RegisteredBy: "operator/mallory"}
	b, err := canonical.Marshal(forged)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(ctx, store.HistoryKey("sshd", 1), b); err != nil {
		t.Fatal(err)
	}

	_, err = c.RegisterModule(ctx, &catalogv1.RegisterModuleRequest{Module: "sshd", Fingerprint: v2.GetFingerprint()})
	mustCode(t, err, codes.Internal, "internal error; see the catalog's log")
	got, err := w.operator(t, r).GetModule(ctx, &catalogv1.GetModuleRequest{Module: "sshd", History: true})
	if err != nil {
		t.Fatal(err)
	}
	if reg := got.GetRegistration(); reg.GetSeq() != 1 || reg.GetFingerprint() != v1.GetFingerprint() {
		t.Fatalf("the refused registration changed the current one: %v", reg)
	}
	if h := got.GetHistory(); len(h) != 1 || !proto.Equal(h[0], forged) {
		t.Fatalf("history: %v", h)
	}
}

// watcher reads a WatchModules stream.
type watcher struct {
	t      testing.TB
	stream interface {
		Recv() (*catalogv1.WatchModulesResponse, error)
	}
	cancel context.CancelFunc
}

func watch(t testing.TB, c catalogv1.CatalogServiceClient, from uint64) *watcher {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	stream, err := c.WatchModules(ctx, &catalogv1.WatchModulesRequest{FromRevision: from})
	if err != nil {
		t.Fatal(err)
	}
	return &watcher{t: t, stream: stream, cancel: cancel}
}

func (w *watcher) next() *catalogv1.WatchModulesResponse {
	w.t.Helper()
	m, err := w.stream.Recv()
	if err != nil {
		w.t.Fatalf("watch: %v", err)
	}
	return m
}

// untilCaughtUp returns "module@fp" of each registration before the marker
// and the marker's revision.
func (w *watcher) untilCaughtUp() ([]string, uint64) {
	w.t.Helper()
	var got []string
	for {
		m := w.next()
		if m.GetCaughtUp() {
			if m.GetRegistration() != nil {
				w.t.Fatalf("caught_up marker with a registration: %v", m)
			}
			return got, m.GetRevision()
		}
		got = append(got, m.GetRegistration().GetModule()+"@"+m.GetRegistration().GetFingerprint())
	}
}

func TestWatchModules(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	r := w.start(t)
	c := w.builder(t, r)
	composer := w.client(t, r, "composer", "")
	sshd1 := release(t, c, "sshd", "1.0")
	sshd2 := release(t, c, "sshd", "1.1")
	motd := release(t, c, "motd", "1.0")
	users := release(t, c, "users", "1.0")
	register(t, c, "sshd", sshd1.GetFingerprint())

	// A watch from 0 gets the current state, the marker, then changes.
	wa := watch(t, composer, 0)
	got, rev := wa.untilCaughtUp()
	if want := []string{"sshd@" + sshd1.GetFingerprint()}; !slices.Equal(got, want) {
		t.Fatalf("initial state %v, want %v", got, want)
	}
	if rev == 0 {
		t.Fatal("caught_up marker without a revision")
	}
	register(t, c, "motd", motd.GetFingerprint())
	m := wa.next()
	if m.GetRegistration().GetModule() != "motd" || m.GetRevision() <= rev {
		t.Fatalf("change: %v", m)
	}
	afterMotd := m.GetRevision()

	// A watch resumed from a revision gets only what changed after it.
	register(t, c, "sshd", sshd2.GetFingerprint())
	wb := watch(t, composer, afterMotd)
	got, rev = wb.untilCaughtUp()
	if want := []string{"sshd@" + sshd2.GetFingerprint()}; !slices.Equal(got, want) {
		t.Fatalf("resumed state %v, want %v", got, want)
	}

	// The catalog restarts, and so does NATS: a watch resumed from the
	// last revision seen gets exactly what changed since.
	wa.cancel()
	wb.cancel()
	r.stop()
	w.restartJetStream(t)
	r2 := w.start(t)
	c2 := w.builder(t, r2)
	register(t, c2, "users", users.GetFingerprint())
	wc := watch(t, w.client(t, r2, "operator", "admin"), rev)
	got, _ = wc.untilCaughtUp()
	if want := []string{"users@" + users.GetFingerprint()}; !slices.Equal(got, want) {
		t.Fatalf("state resumed after a restart %v, want %v", got, want)
	}
	register(t, c2, "sshd", sshd1.GetFingerprint())
	if m := wc.next(); m.GetRegistration().GetFingerprint() != sshd1.GetFingerprint() || m.GetRegistration().GetSeq() != 3 {
		t.Fatalf("change after the restart: %v", m)
	}

	// A revision the store never reached (restored from a backup) sends
	// everything.
	wd := watch(t, w.client(t, r2, "composer", ""), 1<<40)
	got, _ = wd.untilCaughtUp()
	if len(got) != 3 {
		t.Fatalf("watch from an unreached revision: %v", got)
	}

	// Stopping the catalog ends watches with UNAVAILABLE, naming the
	// revision to resume from.
	r2.stop()
	for {
		_, err := wc.stream.Recv()
		if err != nil {
			mustCode(t, err, codes.Unavailable, "resume from revision")
			break
		}
	}
}

// TestConcurrentRegistrations races registrations of one module: each
// either wins its compare-and-set or is told to retry (ABORTED), and the
// history stays one immutable key per change, numbered without gaps.
func TestConcurrentRegistrations(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	r := w.start(t)
	c := w.builder(t, r)
	fps := []string{release(t, c, "sshd", "1.0").GetFingerprint(), release(t, c, "sshd", "1.1").GetFingerprint()}
	const writers = 8
	type result struct {
		resp *catalogv1.RegisterModuleResponse
		err  error
	}
	results := make(chan result, writers*4)
	var wg sync.WaitGroup
	for i := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cl := w.builder(t, r)
			for j := range 4 {
				resp, err := cl.RegisterModule(context.Background(), &catalogv1.RegisterModuleRequest{Module: "sshd", Fingerprint: fps[(i+j)%2]})
				results <- result{resp, err}
			}
		}()
	}
	wg.Wait()
	close(results)
	changed := 0
	for res := range results {
		switch {
		case res.err == nil && res.resp.GetChanged():
			changed++
		case res.err == nil:
		case codeOf(res.err) == codes.Aborted:
		default:
			t.Fatalf("register: %v", res.err)
		}
	}
	got, err := w.operator(t, r).GetModule(context.Background(), &catalogv1.GetModuleRequest{Module: "sshd", History: true})
	if err != nil {
		t.Fatal(err)
	}
	hist := got.GetHistory()
	if len(hist) != changed {
		t.Fatalf("%d history keys for %d changes", len(hist), changed)
	}
	for i, h := range hist {
		if h.GetSeq() != uint64(i+1) {
			t.Fatalf("history[%d] has seq %d", i, h.GetSeq())
		}
		if i > 0 && h.GetFingerprint() == hist[i-1].GetFingerprint() {
			t.Fatalf("history[%d] repeats the fingerprint before it", i)
		}
	}
	if !proto.Equal(got.GetRegistration(), hist[len(hist)-1]) {
		t.Fatalf("current %v is not the last of the history", got.GetRegistration())
	}
}

// TestWatchModulesAfterTheStoreWentBack: nats-server's store goes back to
// an older snapshot under a running watch (the registrations made since are
// lost): the watch sends what the store holds now — the older registration,
// a module registered only since as one with no fingerprint — and a
// caught_up marker at a lower revision, then the changes made after.
func TestWatchModulesAfterTheStoreWentBack(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	r := w.start(t)
	c := w.builder(t, r)
	sshd1 := release(t, c, "sshd", "1.0")
	sshd2 := release(t, c, "sshd", "1.1")
	motd := release(t, c, "motd", "1.0")
	register(t, c, "sshd", sshd1.GetFingerprint())
	var snap string
	w.nats, snap = testutil.SnapshotJetStream(t, w.nats)
	registerEventually(t, c, "sshd", sshd2.GetFingerprint())
	registerEventually(t, c, "motd", motd.GetFingerprint())

	wa := watch(t, w.client(t, r, "composer", ""), 0)
	got, rev := wa.untilCaughtUp()
	if want := []string{"sshd@" + sshd2.GetFingerprint(), "motd@" + motd.GetFingerprint()}; !slices.Equal(got, want) {
		t.Fatalf("state before the loss %v, want %v", got, want)
	}
	w.nats = testutil.RollbackJetStream(t, w.nats, snap)
	got, after := wa.untilCaughtUp()
	if want := []string{"sshd@" + sshd1.GetFingerprint(), "motd@"}; !slices.Equal(got, want) {
		t.Fatalf("state sent after the store went back %v, want %v", got, want)
	}
	if after >= rev {
		t.Errorf("caught_up after the store went back at revision %d, not below %d", after, rev)
	}
	registerEventually(t, c, "motd", motd.GetFingerprint())
	if m := wa.next(); m.GetRegistration().GetFingerprint() != motd.GetFingerprint() || m.GetRevision() <= after {
		t.Fatalf("change after the store went back: %v", m)
	}
}

// registerEventually registers, retrying while the catalog reconnects to a
// restarted NATS.
func registerEventually(t testing.TB, c catalogv1.CatalogServiceClient, module, fp string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, err := c.RegisterModule(context.Background(), &catalogv1.RegisterModuleRequest{Module: module, Fingerprint: fp})
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("register %s at %s: %v", module, fp, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
