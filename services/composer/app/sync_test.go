package app_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"mesh.dev/internal/envelope"
	"mesh.dev/internal/identity"
	"mesh.dev/internal/natsx"
	composerv1 "mesh.dev/proto/mesh/composer/v1"
	typev1 "mesh.dev/proto/mesh/type/v1"
	ct "mesh.dev/services/composer/internal/composertest"
)

// recvManifest reads messages until a manifest comes and returns it opened.
func recvManifest(t testing.TB, e *ct.Engine) *typev1.Manifest {
	t.Helper()
	for {
		msg, err := e.Recv(20 * time.Second)
		if err != nil {
			t.Fatalf("waiting for a manifest: %v", err)
		}
		if env := msg.GetManifest(); env != nil {
			m := &typev1.Manifest{}
			ct.Must(t, envelope.Open(env, typev1.PayloadType_PAYLOAD_TYPE_MANIFEST, m))
			return m
		}
	}
}

// TestSyncHello covers step 1 of the Sync protocol (DESIGN.md §6): a Hello
// naming another node than the certificate's, or a node with no spec, is
// refused with PERMISSION_DENIED; a first message that is not Hello, or
// haves naming another node's keys, with INVALID_ARGUMENT.
func TestSyncHello(t *testing.T) {
	t.Parallel()
	w := ct.New(t)
	c := w.StartComposer(t, "one")
	c.PutNode(t, ct.Spec("ace"))
	c.PutNode(t, ct.Spec("bob"))
	cases := []struct {
		name  string
		cert  string
		first *composerv1.SyncRequest
		code  codes.Code
		words string
	}{
		{"another node's name", "ace", hello(&composerv1.Hello{Node: "bob"}), codes.PermissionDenied, `may not act for node "bob"`},
		{"a node with no spec", "dan", hello(&composerv1.Hello{Node: "dan"}), codes.PermissionDenied, "node dan has no node spec"},
		{"a report first", "ace", &composerv1.SyncRequest{Msg: &composerv1.SyncRequest_Report{Report: &composerv1.Report{}}}, codes.InvalidArgument, "must be Hello"},
		{"another node's key", "ace", hello(&composerv1.Hello{Node: "ace", Haves: []*composerv1.Have{{Module: "motd", Applied: &composerv1.AppliedRef{Key: "bob.node"}}}}), codes.InvalidArgument, "not of node ace"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			stream, err := composerv1.NewSyncServiceClient(w.As(t, c.Addr, identity.RoleNode, tc.cert)).Sync(context.Background())
			ct.Must(t, err)
			ct.Must(t, stream.Send(tc.first))
			_, err = stream.Recv()
			if status.Code(err) != tc.code || !strings.Contains(status.Convert(err).Message(), tc.words) {
				t.Errorf("got %v, want %s %q", err, tc.code, tc.words)
			}
		})
	}
}

func hello(h *composerv1.Hello) *composerv1.SyncRequest {
	return &composerv1.SyncRequest{Msg: &composerv1.SyncRequest_Hello{Hello: h}}
}

// TestSyncStream covers steps 2 to 4 of the Sync protocol: the keyset when
// newer, the current manifest then each newer one; a lagging replica never
// sends a manifest older than the engine reported; reports become one haves
// record per node, a lower report_seq dropped; an engine that stops
// reading gets only the latest state when it reads again.
func TestSyncStream(t *testing.T) {
	t.Parallel()
	w := ct.New(t)
	c := w.StartComposer(t, "one")
	fp := w.Release(t, ct.Motd("1.0"), nil)
	c.PutNode(t, ct.Spec("ace", "motd"))
	a := w.Converged(t, "ace", map[string]string{"motd": fp})

	t.Run("keyset when newer, then the current manifest and each newer one", func(t *testing.T) {
		e := w.Dial(t, c.Addr, "ace", &composerv1.Hello{Node: "ace", KeysetVersion: 0})
		msg, err := e.Recv(10 * time.Second)
		ct.Must(t, err)
		if msg.GetKeyset() == nil {
			t.Fatalf("first message %v, want the keyset", msg)
		}
		if m := recvManifest(t, e); m.GetRevision() != a.GetManifestRevision() {
			t.Errorf("manifest revision %d, want the current %d", m.GetRevision(), a.GetManifestRevision())
		}
		fp2 := w.Release(t, ct.Motd("2.0"), nil)
		a2 := w.Converged(t, "ace", map[string]string{"motd": fp2})
		if m := recvManifest(t, e); m.GetRevision() != a2.GetManifestRevision() {
			t.Errorf("newer manifest revision %d, want %d", m.GetRevision(), a2.GetManifestRevision())
		}
		a = a2
		e2 := w.Dial(t, c.Addr, "ace", &composerv1.Hello{Node: "ace", KeysetVersion: w.Keyring(t).Version()})
		msg, err = e2.Recv(10 * time.Second)
		ct.Must(t, err)
		if msg.GetManifest() == nil {
			t.Errorf("an engine with the current keyset got %v first", msg)
		}
	})

	t.Run("reports: one record per node, a lower report_seq dropped", func(t *testing.T) {
		e := w.Dial(t, c.Addr, "ace", &composerv1.Hello{Node: "ace", ReportSeq: 10, KeysetVersion: 1,
			Applied: &composerv1.ManifestRef{Revision: a.GetManifestRevision(), Digest: a.GetManifestDigest()}, HighWater: a.GetManifestRevision()})
		recvManifest(t, e)
		report := func(seq uint64, reason string) {
			e.Report(t, &composerv1.Report{ReportSeq: seq, HighWater: a.GetManifestRevision(),
				Applied: &composerv1.ManifestRef{Revision: a.GetManifestRevision(), Digest: a.GetManifestDigest()},
				Haves:   []*composerv1.Have{{Module: "motd", Attempt: &composerv1.Attempt{State: composerv1.AttemptState_ATTEMPT_STATE_HELD, Reason: reason}}}})
		}
		recorded := func(seq uint64) uint64 {
			var rev uint64
			ct.WaitFor(t, fmt.Sprintf("report %d recorded", seq), 10*time.Second, func() (bool, string) {
				rec := &composerv1.HaveRecord{}
				var err error
				rev, err = w.Get(t, natsx.BucketHaves, "ace", rec)
				return err == nil && rec.GetReportSeq() == seq, fmt.Sprint(rec, err)
			})
			return rev
		}
		report(12, "twelve")
		r12 := recorded(12)
		// The stream of a stream's reports is handled in order: 11 is
		// handled before 13. Had 11 been written, 13's revision would be
		// two past 12's (nothing else writes ace's haves meanwhile).
		report(11, "eleven")
		report(13, "thirteen")
		if r13 := recorded(13); r13 != r12+1 {
			t.Errorf("report 13 recorded at revision %d, 12 at %d: the lower report_seq 11 was written in between", r13, r12)
		}
		keys, err := w.KV(t, natsx.BucketHaves).ListKeys(context.Background())
		ct.Must(t, err)
		if len(keys) != 1 || keys[0] != "ace" {
			t.Errorf("haves keys %v", keys)
		}
		e.Close()
	})

	t.Run("never a manifest older than the engine reported", func(t *testing.T) {
		high := a.GetManifestRevision() + 1_000_000
		e := w.Dial(t, c.Addr, "ace", &composerv1.Hello{Node: "ace", KeysetVersion: 1, HighWater: high, ReportSeq: 100})
		m := recvManifest(t, e)
		if m.GetRevision() <= high {
			t.Errorf("sent revision %d to an engine at high-water %d", m.GetRevision(), high)
		}
	})

	t.Run("an engine that stops reading gets only the latest state", func(t *testing.T) {
		// Node big wants 24 modules: its manifests are a few KiB, so a 64
		// KiB window (the smallest gRPC takes) fills after a dozen or two;
		// what the composer holds for the stream meanwhile is one mark,
		// not a queue.
		var mods []string
		fps := map[string]string{}
		for i := range 24 {
			m := fmt.Sprintf("m%02d", i)
			mods = append(mods, m)
			fps[m] = w.Release(t, &typev1.ModuleManifest{Module: m, Version: "1.0", Upgrade: ct.Auto, Resources: []*typev1.ResourceTemplate{
				{Name: "f", Type: ct.File, Path: "/etc/" + m, Content: ct.Text(m)}}}, nil)
		}
		c.PutNode(t, ct.Spec("big", mods...))
		w.Converged(t, "big", fps)
		e := w.Dial(t, c.Addr, "big", &composerv1.Hello{Node: "big", KeysetVersion: 1, ReportSeq: 1000},
			grpc.WithInitialWindowSize(64<<10), grpc.WithInitialConnWindowSize(64<<10))
		var last uint64
		const commits = 60
		for i := range commits {
			cur, _, _ := w.Assignment(t, "big")
			w.Put(t, natsx.BucketHaves, "big", &composerv1.HaveRecord{Node: "big", ReportSeq: uint64(2000 + i), HighWater: cur.GetManifestRevision() + 1})
			ct.WaitFor(t, "re-signed", 20*time.Second, func() (bool, string) {
				next, _, _ := w.Assignment(t, "big")
				last = next.GetManifestRevision()
				return last > cur.GetManifestRevision(), "not yet"
			})
		}
		got := 0
		var seen uint64
		for seen < last {
			msg, err := e.Recv(10 * time.Second)
			if err != nil {
				t.Fatalf("after %d manifests (last %d of %d): %v", got, seen, last, err)
			}
			if env := msg.GetManifest(); env != nil {
				m := &typev1.Manifest{}
				ct.Must(t, envelope.Open(env, typev1.PayloadType_PAYLOAD_TYPE_MANIFEST, m))
				if m.GetRevision() <= seen {
					t.Fatalf("manifest %d after %d", m.GetRevision(), seen)
				}
				seen = m.GetRevision()
				got++
			}
		}
		if got >= commits {
			t.Errorf("the stream delivered %d manifests for %d commits: a queue, not the latest state", got, commits)
		}
		t.Logf("%d commits, %d manifests delivered", commits, got)
	})
}

// TestSyncHeard covers Heard (DESIGN.md §6 step 2): for each module a
// module of the node needs, the nodes running it, bounded by the need's
// selector and cap, with whether they stopped; coalesced, at most one
// message a second per stream.
func TestSyncHeard(t *testing.T) {
	t.Parallel()
	w := ct.New(t)
	c := w.StartComposer(t, "one")
	serverFP, clientFP := serverAndClient(t, w, 2)
	c.PutNode(t, ct.Spec("ace", "client"))
	// s0 is in zone b: the need's selector leaves it out although its name
	// comes first; the cap of 2 leaves s3 out.
	for i, n := range []string{"s0", "s1", "s2", "s3"} {
		s := ct.Spec(n, "server")
		if i == 0 {
			s.Labels["zone"] = "b"
		}
		c.PutNode(t, s)
	}
	w.Converged(t, "ace", map[string]string{"client": clientFP})
	for _, n := range []string{"s0", "s1", "s2", "s3"} {
		w.Converged(t, n, map[string]string{"server": serverFP})
	}
	ct.WaitFor(t, "specs seen", 10*time.Second, func() (bool, string) { return len(c.Reconciler.Nodes()) == 5, "not yet" })
	e := w.Dial(t, c.Addr, "ace", &composerv1.Hello{Node: "ace", KeysetVersion: 1})
	nextHeard := func(d time.Duration) (*composerv1.Heard, error) {
		for {
			msg, err := e.Recv(d)
			if err != nil {
				return nil, err
			}
			if h := msg.GetHeard(); h != nil {
				return h, nil
			}
		}
	}
	h, err := nextHeard(10 * time.Second)
	ct.Must(t, err)
	want := "server: s1 " + serverFP + " stopped, s2 " + serverFP + " stopped"
	if got := heardWords(h); got != want {
		t.Fatalf("heard %q, want %q", got, want)
	}
	// s1's engine comes up and reports the module applied; then it
	// reports a change as fast as it can: ace hears at most once a second.
	s1 := w.Dial(t, c.Addr, "s1", &composerv1.Hello{Node: "s1", KeysetVersion: 1})
	s1a, _, _ := w.Assignment(t, "s1")
	report := func(seq uint64, fp string) {
		want := ct.Want(s1a, "server")
		s1.Report(t, &composerv1.Report{ReportSeq: seq, Haves: []*composerv1.Have{{Module: "server",
			Applied: &composerv1.AppliedRef{Fingerprint: fp, Key: want.GetCompositionKey(), Digest: want.GetCompositionDigest()},
			Attempt: &composerv1.Attempt{Fingerprint: fp, State: composerv1.AttemptState_ATTEMPT_STATE_APPLIED}}}})
	}
	report(1, serverFP)
	for {
		h, err := nextHeard(10 * time.Second)
		ct.Must(t, err)
		if strings.HasPrefix(heardWords(h), "server: s1 "+serverFP+",") {
			break
		}
	}
	start := time.Now()
	received := 0
	deadline := start.Add(2500 * time.Millisecond)
	for seq := uint64(2); time.Now().Before(deadline); seq++ {
		report(seq, fmt.Sprintf("fp1:%064x", seq))
		for {
			_, err := nextHeard(10 * time.Millisecond)
			if errors.Is(err, ct.ErrNothing) {
				break
			}
			ct.Must(t, err)
			received++
		}
	}
	elapsed := time.Since(start)
	if limit := int(elapsed/time.Second) + 1; received > limit || received == 0 {
		t.Errorf("%d Heard messages in %s of changes, want 1..%d", received, elapsed.Round(time.Millisecond), limit)
	}
}

// serverAndClient releases server, and client, which needs server in zone
// a up to capN nodes (0: the default cap).
func serverAndClient(t *testing.T, w *ct.World, capN uint32) (serverFP, clientFP string) {
	t.Helper()
	serverFP = w.Release(t, &typev1.ModuleManifest{Module: "server", Version: "1.0", Upgrade: ct.Auto, Resources: []*typev1.ResourceTemplate{
		{Name: "conf", Type: ct.File, Path: "/etc/server.conf", Content: ct.Text("s")}}}, nil)
	clientFP = w.Release(t, &typev1.ModuleManifest{Module: "client", Version: "1.0", Upgrade: ct.Auto,
		Needs:     []*typev1.Need{{Module: "server", Selector: &typev1.LabelSelector{MatchLabels: map[string]string{"zone": "a"}}, Cap: capN}},
		Resources: []*typev1.ResourceTemplate{{Name: "conf", Type: ct.File, Path: "/etc/client.conf", Content: ct.Text("c")}}}, nil)
	return serverFP, clientFP
}

func heardWords(h *composerv1.Heard) string {
	var parts []string
	for _, m := range h.GetModules() {
		var nodes []string
		for _, n := range m.GetNodes() {
			s := n.GetNode() + " " + n.GetFingerprint()
			if n.GetStopped() {
				s += " stopped"
			}
			nodes = append(nodes, s)
		}
		parts = append(parts, m.GetModule()+": "+strings.Join(nodes, ", "))
	}
	return strings.Join(parts, "; ")
}

// TestSyncHealth covers DESIGN.md §6 step 4: a replica whose hub is not
// caught up with the assignments reports NOT_SERVING for the Sync service
// (engines then go to another replica), and SERVING once it is.
func TestSyncHealth(t *testing.T) {
	t.Parallel()
	w := ct.New(t)
	c := w.Build(t, "one")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 2)
	t.Cleanup(func() {
		cancel()
		<-done
		<-done
	})
	go func() { done <- c.ServeGRPC(ctx) }()
	health := healthpb.NewHealthClient(w.As(t, c.Addr, identity.RoleNode, "ace"))
	check := func() healthpb.HealthCheckResponse_ServingStatus {
		resp, err := health.Check(context.Background(), &healthpb.HealthCheckRequest{Service: composerv1.SyncService_ServiceDesc.ServiceName})
		ct.Must(t, err)
		return resp.GetStatus()
	}
	if st := check(); st != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Errorf("Sync is %s before the hub watched the assignments", st)
	}
	go func() { done <- c.Hub.Run(ctx) }()
	ct.WaitFor(t, "Sync serving", 10*time.Second, func() (bool, string) {
		st := check()
		return st == healthpb.HealthCheckResponse_SERVING, st.String()
	})
}

// TestSyncHeardFollowsARelabel: a need's selector picks nodes by label, and
// a relabel rewrites no assignment and no haves record: the reconciler's
// spec watch wakes the streams hearing the node, which judge the selector
// again.
func TestSyncHeardFollowsARelabel(t *testing.T) {
	t.Parallel()
	w := ct.New(t)
	c := w.StartComposer(t, "one")
	serverFP, clientFP := serverAndClient(t, w, 0)
	c.PutNode(t, ct.Spec("ace", "client"))
	s1 := ct.Spec("s1", "server")
	s1.Labels["zone"] = "a"
	c.PutNode(t, s1)
	w.Converged(t, "ace", map[string]string{"client": clientFP})
	w.Converged(t, "s1", map[string]string{"server": serverFP})
	ct.WaitFor(t, "specs seen", 10*time.Second, func() (bool, string) { return len(c.Reconciler.Nodes()) == 2, "not yet" })
	e := w.Dial(t, c.Addr, "ace", &composerv1.Hello{Node: "ace", KeysetVersion: 1})
	heard := func(want string) {
		t.Helper()
		got := "(none)"
		for {
			msg, err := e.Recv(10 * time.Second)
			if err != nil {
				t.Fatalf("heard %q, want %q: %v", got, want, err)
			}
			if h := msg.GetHeard(); h != nil {
				if got = heardWords(h); got == want {
					return
				}
			}
		}
	}
	heard("server: s1 " + serverFP + " stopped")
	// ace's Hello writes its haves, which wakes its stream once more: let
	// that pass, so only the relabel can wake it.
	ct.WaitFor(t, "ace's haves written", 10*time.Second, func() (bool, string) {
		_, err := c.Store.Haves.Get(context.Background(), "ace")
		return err == nil, fmt.Sprint(err)
	})
	time.Sleep(1500 * time.Millisecond)
	s1.Labels["zone"] = "b"
	c.PutNode(t, s1)
	heard("server: ")
}
