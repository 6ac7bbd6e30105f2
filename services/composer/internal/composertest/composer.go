package composertest

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"mesh.dev/internal/config"
	"mesh.dev/internal/identity"
	"mesh.dev/internal/supervise"
	composerv1 "mesh.dev/proto/mesh/composer/v1"
	"mesh.dev/services/composer/app"
	"mesh.dev/services/composer/internal/pass"
)

// Composer is one composer running in the test's process.
type Composer struct {
	*app.Composer
	Addr   string
	Holder string
	w      *World
	stop   func()
	// pauseLease stops a manual composer's lease renewals (nil otherwise).
	pauseLease func()
}

// PauseLease stops renewing a manual composer's lease without giving it
// back, as a paused process would: the lease expires after its TTL and
// another composer takes over, while this one still believes what it
// checked last.
func (c *Composer) PauseLease() { c.pauseLease() }

// Stop stops the composer (a graceful stop: it gives its lease back).
func (c *Composer) Stop() { c.stop() }

// ComposerOption changes a composer's config or options before it starts.
type ComposerOption func(*app.Config, *app.Options)

// WithWorkers sets how many nodes are composed at once.
func WithWorkers(n int) ComposerOption {
	return func(c *app.Config, _ *app.Options) { c.Workers = n }
}

// WithLeaseTTL sets the lease TTL.
func WithLeaseTTL(d time.Duration) ComposerOption {
	return func(c *app.Config, _ *app.Options) { c.LeaseTTL = config.Duration(d) }
}

func (w *World) build(t testing.TB, holder string, opts []ComposerOption) *Composer {
	t.Helper()
	lis := Listen(t)
	cfg := app.Config{Listen: lis.Addr().String(), SignerAddr: w.SignerAddr, CatalogAddr: w.CatalogAddr, Holder: holder, Workers: 8}
	id := w.PKI.Identity(identity.RoleComposer, "")
	o := app.Options{
		Logger: Logger(t), JetStream: w.JS, Listener: lis, Roots: w.Roots, TracerProvider: w.opts.TracerProvider,
		ServerTLS: w.PKI.ServerTLS(t, id), ClientTLS: w.PKI.ClientTLS(t, id),
		OnPass: func(node string, res *pass.Result, err error) {
			if err == nil && res != nil {
				err = res.Err
			}
			w.onPass(node, res != nil && res.Committed, res != nil && res.Changes, err)
		},
	}
	for _, opt := range opts {
		opt(&cfg, &o)
	}
	c, err := app.New(context.Background(), cfg, o)
	if err != nil {
		t.Fatal(err)
	}
	return &Composer{Composer: c, Addr: lis.Addr().String(), Holder: holder, w: w}
}

// Build builds a composer without starting any of its loops; the test
// starts what it needs (Serve, ServeGRPC, Hub.Run…) and closes it.
func (w *World) Build(t testing.TB, holder string, opts ...ComposerOption) *Composer {
	t.Helper()
	c := w.build(t, holder, opts)
	c.stop = c.Close
	t.Cleanup(c.Close)
	return c
}

// StartComposer runs a whole composer (Serve: watches, lease, passes, the
// gRPC server) over real mTLS against the world.
func (w *World) StartComposer(t testing.TB, holder string, opts ...ComposerOption) *Composer {
	t.Helper()
	c := w.build(t, holder, opts)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Serve(ctx, nil) }()
	stopped := false
	c.stop = func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		if err := <-done; err != nil {
			t.Errorf("composer %s: %v", holder, err)
		}
	}
	t.Cleanup(c.stop)
	return c
}

// StartManual runs a composer whose passes only the test starts (Pass): the
// catalog, store and keyset watches, the Sync hub, the lease and the gRPC
// server run, but no reconciler works its queue. It returns once the
// composer holds the lease, knows the keyset and has caught up with the
// catalog.
func (w *World) StartManual(t testing.TB, holder string, opts ...ComposerOption) *Composer {
	t.Helper()
	c := w.build(t, holder, opts)
	ctx, cancel := context.WithCancel(context.Background())
	leaseCtx, pause := context.WithCancel(ctx)
	var paused atomic.Bool
	c.pauseLease = func() {
		paused.Store(true)
		pause()
	}
	done := make(chan error, 1)
	go func() {
		done <- supervise.Run(ctx,
			supervise.Task{Name: "catalog watch", Run: c.View.Run},
			supervise.Task{Name: "store watches", Run: c.Reconciler.Watch},
			supervise.Task{Name: "judgement records", Run: c.Passer.FollowRecords},
			supervise.Task{Name: "compositions mirror", Run: c.Passer.FollowCompositions},
			supervise.Task{Name: "assignments watch", Run: c.Passer.FollowAssignments},
			supervise.Task{Name: "keyset watch", Run: c.Trust.Watch},
			supervise.Task{Name: "sync hub", Run: c.Hub.Run},
			supervise.Task{Name: "lease", Run: func(ctx context.Context) error {
				err := c.Lease.Run(leaseCtx, func(context.Context) {})
				if !paused.Load() {
					c.Lease.Release(context.Background())
				}
				<-ctx.Done()
				return err
			}},
			supervise.Task{Name: "grpc server", Run: func(ctx context.Context) error { return c.ServeGRPC(ctx) }},
		)
	}()
	stopped := false
	c.stop = func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("composer %s: %v", holder, err)
		}
		c.Close()
	}
	t.Cleanup(c.stop)
	WaitFor(t, holder+" holds the lease and has caught up", 20*time.Second, func() (bool, string) {
		if !c.Lease.Held() {
			return false, "lease held by " + c.Lease.Holder()
		}
		if !c.View.CaughtUp() || !c.Reconciler.Loaded() {
			return false, "catalog view or store watches not caught up"
		}
		return true, ""
	})
	Must(t, c.Trust.Refresh(context.Background()))
	return c
}

// Pass runs one Write pass of a node now and counts it.
func (c *Composer) Pass(t testing.TB, node string) *pass.Result {
	t.Helper()
	res, err := c.Passer.Run(context.Background(), node, pass.Write, nil)
	if err == nil && res != nil {
		err = res.Err
	}
	c.w.onPass(node, res != nil && res.Committed, res != nil && res.Changes, err)
	if res == nil {
		t.Fatalf("pass of %s: %v", node, err)
	}
	return res
}

// PutNode writes a node spec through the composer's API as an operator.
func (c *Composer) PutNode(t testing.TB, spec *composerv1.NodeSpec) uint64 {
	t.Helper()
	resp, err := c.Operator(t).PutNode(context.Background(), &composerv1.PutNodeRequest{Spec: spec})
	if err != nil {
		t.Fatalf("PutNode %s: %v", spec.GetNode(), err)
	}
	return resp.GetRevision()
}

// Operator is an operator's client of the composer.
func (c *Composer) Operator(t testing.TB) composerv1.ComposerServiceClient {
	return composerv1.NewComposerServiceClient(c.w.As(t, c.Addr, identity.RoleOperator, "admin"))
}

// WaitSpec waits until the composer's spec watch holds a node's spec at
// least as new as rev (passes read the bucket; the reconciler and the Sync
// service read the watch).
func (c *Composer) WaitSpec(t testing.TB, node string) {
	t.Helper()
	WaitFor(t, "spec of "+node+" seen", 10*time.Second, func() (bool, string) {
		_, ok := c.Reconciler.Spec(node)
		return ok, fmt.Sprintf("no spec of %s in the watch", node)
	})
}
