package app_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"google.golang.org/grpc"

	"mesh.dev/internal/identity"
	"mesh.dev/internal/natsx"
	"mesh.dev/internal/testutil"
	composerv1 "mesh.dev/proto/mesh/composer/v1"
	signerv1 "mesh.dev/proto/mesh/signer/v1"
	typev1 "mesh.dev/proto/mesh/type/v1"
	ct "mesh.dev/services/composer/internal/composertest"
	"mesh.dev/services/composer/internal/pass"
	"mesh.dev/services/composer/internal/signing"
	"mesh.dev/services/composer/internal/store"
)

const childTTL = 3 * time.Second

func waitReady(t testing.TB, c *ct.Child) {
	t.Helper()
	ct.WaitFor(t, c.Holder+" ready", 30*time.Second, func() (bool, string) {
		for _, l := range c.Lines() {
			if len(l) > 5 && l[:5] == "ready" {
				return true, ""
			}
		}
		return false, fmt.Sprintf("said %v (exited %v)", c.Lines(), c.Exited())
	})
}

// leaseRecord is the value of the lease key.
type leaseRecord struct {
	Holder string `json:"holder"`
	Epoch  uint64 `json:"epoch"`
}

func lease(t testing.TB, w *ct.World) (leaseRecord, natsx.Entry, bool) {
	t.Helper()
	kv, err := natsx.OpenKV(context.Background(), w.JS, natsx.BucketComposerLease)
	if err != nil {
		// No composer created the bucket yet.
		return leaseRecord{}, natsx.Entry{}, false
	}
	e, err := kv.Get(context.Background(), natsx.KeyLeaseLeader)
	if err != nil {
		return leaseRecord{}, natsx.Entry{}, false
	}
	var r leaseRecord
	ct.Must(t, json.Unmarshal(e.Value, &r))
	return r, e, true
}

func waitHolder(t testing.TB, w *ct.World, holder string, d time.Duration) (leaseRecord, natsx.Entry) {
	t.Helper()
	var r leaseRecord
	var e natsx.Entry
	ct.WaitFor(t, holder+" holds the lease", d, func() (bool, string) {
		var ok bool
		r, e, ok = lease(t, w)
		return ok && r.Holder == holder && r.Epoch > 0, fmt.Sprintf("lease %+v", r)
	})
	return r, e
}

// checkAll checks every committed assignment: its manifest verifies and
// every composition it names is held and verifies.
func checkAll(t testing.TB, w *ct.World, nodes []string) int {
	t.Helper()
	n := 0
	for _, node := range nodes {
		a, _, err := w.Assignment(t, node)
		if err != nil {
			continue
		}
		n++
		if _, err := w.CheckAssignment(t, a); err != nil {
			t.Errorf("after a kill: %v", err)
		}
	}
	return n
}

// killAfter SIGKILLs a child once it has made n composition writes.
func killAfter(t testing.TB, w *ct.World, c *ct.Child, n int64) <-chan struct{} {
	t.Helper()
	nc, err := nats.Connect(w.Embedded.ClientURL())
	ct.Must(t, err)
	t.Cleanup(nc.Close)
	var seen atomic.Int64
	killed := make(chan struct{})
	_, err = nc.Subscribe("$KV."+natsx.BucketCompositions+".>", func(*nats.Msg) {
		if seen.Add(1) == n {
			c.Signal(syscall.SIGKILL)
			close(killed)
		}
	})
	ct.Must(t, err)
	ct.Must(t, nc.Flush())
	return killed
}

func waitKilled(t testing.TB, killed <-chan struct{}) {
	t.Helper()
	select {
	case <-killed:
	case <-time.After(60 * time.Second):
		t.Fatal("the composer never made the writes it was to be killed after")
	}
}

// TestKilledComposer covers DESIGN.md §5.2 step 7 under crashes: composer
// processes killed (SIGKILL) at random points of their writes never leave
// an assignment naming a composition that is missing or does not verify,
// and the composer taking over converges every node.
func TestKilledComposer(t *testing.T) {
	t.Parallel()
	seed := time.Now().UnixNano()
	rng := rand.New(rand.NewPCG(uint64(seed), 0))
	t.Logf("seed %d", seed)
	w := ct.New(t)
	modules := []func(v string) *typev1.ModuleManifest{ct.Motd, func(v string) *typev1.ModuleManifest { return ct.SSHD(v, "") }, func(v string) *typev1.ModuleManifest {
		return &typev1.ModuleManifest{Module: "app", Version: v, Upgrade: ct.Auto, Resources: []*typev1.ResourceTemplate{
			{Name: "conf", Type: ct.File, Path: "/etc/app.conf", Content: ct.Text("v" + v + " on {{ .Node }}\n")}}}
	}}
	release := func(v string) map[string]string {
		fps := map[string]string{}
		for _, m := range modules {
			mm := m(v)
			fps[mm.GetModule()] = w.Release(t, mm, nil)
		}
		return fps
	}
	var nodes []string
	for i := range 16 {
		nodes = append(nodes, fmt.Sprintf("n%02d", i))
	}
	fps := release("1.0")
	a := w.StartChild(t, "a", childTTL, 4)
	waitReady(t, a)
	// 16 nodes × 4 compositions: kill somewhere in the first pass.
	killed := killAfter(t, w, a, 1+rng.Int64N(16*4-1))
	for _, n := range nodes {
		// Specs go straight into the bucket: the kill may land while they
		// are being put, and the second composer must find them all.
		w.Put(t, natsx.BucketNodes, n, ct.Spec(n, "motd", "sshd", "app"))
	}
	waitKilled(t, killed)
	a.Kill()
	t.Logf("a killed with %d assignments committed", checkAll(t, w, nodes))

	b := w.StartChild(t, "b", childTTL, 4)
	for _, n := range nodes {
		w.Converged(t, n, fps)
	}
	checkAll(t, w, nodes)

	// A new release while b works through it (3 module compositions of
	// each node change): kill b at a random write.
	killed = killAfter(t, w, b, 1+rng.Int64N(16*3-1))
	fps = release("2.0")
	waitKilled(t, killed)
	b.Kill()
	t.Logf("b killed with %d assignments committed", checkAll(t, w, nodes))

	w.StartComposer(t, "c")
	for _, n := range nodes {
		w.Converged(t, n, fps)
	}
	checkAll(t, w, nodes)
}

// TestTwoComposersRacing covers two writers racing on one node (an Apply
// and the reconciler of one composer, or a paused leader and its
// successor before fencing): every write is a CAS, so whatever interleaving,
// each committed assignment names only held compositions that verify, and
// a final pass leaves every judgement record naming its composition's
// digest.
func TestTwoComposersRacing(t *testing.T) {
	t.Parallel()
	w := ct.New(t)
	c := w.StartManual(t, "one")
	// A second writer on its own NATS connection and store, signing under
	// the same lease and fencing epoch.
	second := newSecondPasser(t, w, c)
	fp := w.Release(t, ct.Motd("1.0"), nil)
	waitFingerprint(t, c, "motd", fp)
	c.PutNode(t, ct.Spec("ace", "motd", "sshd"))
	errs := make(chan error, 2)
	stop := make(chan struct{})
	var commits, failures atomic.Int64
	for _, p := range []*pass.Passer{c.Passer, second} {
		go func() {
			for {
				select {
				case <-stop:
					errs <- nil
					return
				default:
				}
				res, err := p.Run(context.Background(), "ace", pass.Write, nil)
				if err == nil && res.Committed {
					commits.Add(1)
				}
				if err != nil && failures.Add(1) < 5 {
					t.Logf("a racing pass: %v", err)
				}
			}
		}()
	}
	for v := 2; v <= 12; v++ {
		fp := w.Release(t, ct.Motd(fmt.Sprintf("%d.0", v)), nil)
		w.Release(t, ct.SSHD(fmt.Sprintf("%d.0", v), ""), nil)
		waitFingerprint(t, c, "motd", fp)
		for range 5 {
			a, _, err := w.Assignment(t, "ace")
			if err == nil {
				if _, err := w.CheckAssignment(t, a); err != nil {
					t.Error(err)
				}
			}
		}
	}
	close(stop)
	<-errs
	<-errs
	if commits.Load() == 0 {
		t.Fatal("no pass committed")
	}
	res := c.Pass(t, "ace")
	if res.Err != nil {
		t.Fatal(res.Err)
	}
	a, _, err := w.Assignment(t, "ace")
	ct.Must(t, err)
	if _, err := w.CheckAssignment(t, a); err != nil {
		t.Error(err)
	}
	for _, want := range a.GetWants() {
		rec := &composerv1.JudgementRecord{}
		if _, err := w.Get(t, natsx.BucketComposed, want.GetCompositionKey(), rec); err != nil || rec.GetDigest() != want.GetCompositionDigest() {
			t.Errorf("record of %s: %v %v, want digest %s", want.GetCompositionKey(), rec, err, want.GetCompositionDigest())
		}
	}
	t.Logf("%d commits raced", commits.Load())
}

// newSecondPasser builds another Passer over its own NATS connection and
// signer client, sharing the lease (and so the fencing epoch) of c.
func newSecondPasser(t testing.TB, w *ct.World, c *ct.Composer) *pass.Passer {
	t.Helper()
	signer := signerv1.NewSignerServiceClient(w.As(t, w.SignerAddr, identity.RoleComposer, ""))
	_, js := testutil.ConnectJetStream(t, w.Embedded)
	st, err := store.Open(context.Background(), js, 1, 15*time.Second, nil)
	ct.Must(t, err)
	return pass.New(pass.Config{Store: st, Catalog: c.View, Signer: signing.New(signer, nil),
		Trust: c.Trust, Lease: c.Lease, Approvals: c.Reconciler, Logger: ct.Logger(t)})
}

// TestLeaseTakeover covers DESIGN.md §5.2 step 9 across processes: after
// the holder is killed, a second composer process takes over within the
// lease TTL of the holder's last renewal, with a higher fencing epoch; a
// holder paused (SIGSTOP) mid-pass with sign requests in flight has every
// one of them refused by the signer once its successor fenced, and signs
// nothing after.
func TestLeaseTakeover(t *testing.T) {
	t.Parallel()
	held := newSignHold()
	t.Cleanup(func() { held.release() })
	w := ct.New(t, ct.Options{SignerServerOptions: []grpc.ServerOption{grpc.ChainUnaryInterceptor(held.intercept)}})
	a := w.StartChild(t, "a", childTTL, 4)
	ra, _ := waitHolder(t, w, "a", 30*time.Second)
	b := w.StartChild(t, "b", childTTL, 4)
	waitReady(t, b)
	// Kill a just after a renewal, the worst case for its successor: its
	// key expires a TTL later, and b needs a moment for the server's
	// expiry and to fence (the margin below).
	_, before, _ := lease(t, w)
	ct.WaitFor(t, "a renews", 10*time.Second, func() (bool, string) {
		_, e, ok := lease(t, w)
		return ok && e.Revision != before.Revision, "not yet"
	})
	_, last, _ := lease(t, w)
	a.Kill()
	killedAt := time.Now()
	rb, eb := waitHolder(t, w, "b", 2*childTTL)
	took := eb.Created.Sub(last.Created)
	t.Logf("b took over %s after a's last renewal, %s after the kill", took.Round(time.Millisecond), time.Since(killedAt).Round(time.Millisecond))
	if took > childTTL+time.Second {
		t.Errorf("b took over %s after a's last renewal; the TTL is %s", took, childTTL)
	}
	if rb.Epoch <= ra.Epoch {
		t.Errorf("b's epoch %d is not above a's %d", rb.Epoch, ra.Epoch)
	}
	// b composes.
	op := composerv1.NewComposerServiceClient(w.As(t, b.Addr, identity.RoleOperator, "admin"))
	fp := w.Release(t, ct.Motd("1.0"), nil)
	var nodes []string
	for i := range 8 {
		n := fmt.Sprintf("n%d", i)
		nodes = append(nodes, n)
		_, err := op.PutNode(context.Background(), &composerv1.PutNodeRequest{Spec: ct.Spec(n, "motd")})
		ct.Must(t, err)
	}
	for _, n := range nodes {
		w.Converged(t, n, map[string]string{"motd": fp})
	}

	// b pauses mid-pass, its sign requests in flight: the signer holds
	// each request b makes under its epoch before judging it, and b is
	// stopped (SIGSTOP) while they wait. c takes over and fences. Then
	// the held requests go on and b resumes: the signer refuses every one
	// of them, and signs nothing under b's epoch after c's fence.
	held.arm(rb.Epoch)
	fp2 := w.Release(t, ct.Motd("2.0"), nil)
	held.waitCaught(t)
	b.Signal(syscall.SIGSTOP)
	c := w.StartComposer(t, "c", ct.WithLeaseTTL(childTTL))
	rc, _ := waitHolder(t, w, "c", 3*childTTL)
	n := held.release()
	b.Signal(syscall.SIGCONT)
	for _, node := range nodes {
		w.Converged(t, node, map[string]string{"motd": fp2})
	}
	ct.WaitFor(t, "c keeps the lease", 10*time.Second, func() (bool, string) {
		r, _, ok := lease(t, w)
		return ok && r.Holder == "c", "not yet"
	})
	refusal := fmt.Sprintf("fencing epoch %d is below the signer's %d", rb.Epoch, rc.Epoch)
	fenced, refused := false, 0
	for _, r := range auditLog(t, w) {
		switch {
		case r.Kind == "fence" && r.Epoch == rc.Epoch:
			fenced = true
		case fenced && r.Kind == "refused" && strings.Contains(r.Reason, refusal):
			refused++
		case fenced && r.Kind == "signed" && r.Epoch < rc.Epoch:
			t.Errorf("signed under epoch %d after epoch %d was handed out: %+v", r.Epoch, rc.Epoch, r)
		}
	}
	if !fenced {
		t.Fatal("c's fence is not in the audit log")
	}
	if refused < n {
		t.Errorf("%d of b's %d held sign requests refused (%q)", refused, n, refusal)
	}
	t.Logf("%d sign requests of b held across c's fence, %d refused after it", n, refused)
	_ = c
}

// signHold holds, in the signer's server, the sign requests made under one
// fencing epoch until released: a composer whose requests are in flight
// while it is paused.
type signHold struct {
	mu      sync.Mutex
	epoch   uint64
	armed   bool
	held    int
	caught  chan struct{}
	resume  chan struct{}
	release func() int
}

func newSignHold() *signHold {
	h := &signHold{caught: make(chan struct{}), resume: make(chan struct{})}
	var once sync.Once
	h.release = func() int {
		h.mu.Lock()
		h.armed = false
		n := h.held
		h.mu.Unlock()
		once.Do(func() { close(h.resume) })
		return n
	}
	return h
}

func (h *signHold) arm(epoch uint64) {
	h.mu.Lock()
	h.epoch, h.armed = epoch, true
	h.mu.Unlock()
}

func (h *signHold) waitCaught(t testing.TB) {
	t.Helper()
	select {
	case <-h.caught:
	case <-time.After(30 * time.Second):
		t.Fatal("no sign request under the armed epoch arrived")
	}
}

func (h *signHold) intercept(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	var epoch uint64
	switch r := req.(type) {
	case *signerv1.SignCompositionsRequest:
		epoch = r.GetFencingEpoch()
	case *signerv1.SignManifestsRequest:
		epoch = r.GetFencingEpoch()
	default:
		return handler(ctx, req)
	}
	h.mu.Lock()
	hold := h.armed && epoch == h.epoch
	if hold {
		h.held++
		if h.held == 1 {
			close(h.caught)
		}
	}
	h.mu.Unlock()
	if hold {
		<-h.resume
	}
	return handler(ctx, req)
}
