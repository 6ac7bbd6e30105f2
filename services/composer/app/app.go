// Package app runs the composer: Config (strict YAML and flags) and
// New/Run, used by mesh-composer's main, by tests and by the one-process dev
// mesh.
package app

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
	"google.golang.org/grpc"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"mesh.dev/internal/authz"
	"mesh.dev/internal/config"
	"mesh.dev/internal/grpcclient"
	"mesh.dev/internal/grpcserver"
	"mesh.dev/internal/identity"
	"mesh.dev/internal/natsx"
	"mesh.dev/internal/pki"
	"mesh.dev/internal/supervise"
	"mesh.dev/internal/verify"
	catalogv1 "mesh.dev/proto/mesh/catalog/v1"
	composerv1 "mesh.dev/proto/mesh/composer/v1"
	signerv1 "mesh.dev/proto/mesh/signer/v1"
	typev1 "mesh.dev/proto/mesh/type/v1"
	"mesh.dev/services/composer/internal/api"
	"mesh.dev/services/composer/internal/catalogview"
	"mesh.dev/services/composer/internal/lease"
	"mesh.dev/services/composer/internal/objects"
	"mesh.dev/services/composer/internal/pass"
	"mesh.dev/services/composer/internal/reconcile"
	"mesh.dev/services/composer/internal/signing"
	"mesh.dev/services/composer/internal/store"
	"mesh.dev/services/composer/internal/syncsvc"
	"mesh.dev/services/composer/internal/trust"
)

// Default addresses of the composer.
const (
	DefaultListen        = "127.0.0.1:7403"
	DefaultMetricsListen = "127.0.0.1:9403"
)

// Config is the composer's configuration file (YAML, unknown keys refused).
type Config struct {
	Listen        string `yaml:"listen"`
	MetricsListen string `yaml:"metrics_listen"`
	// CertFile, KeyFile, CAFile: the composer's mTLS identity
	// (spiffe://<td>/service/composer) and CA.
	CertFile string `yaml:"cert_file"`
	KeyFile  string `yaml:"key_file"`
	CAFile   string `yaml:"ca_file"`
	// RootsFile pins the root keys the keyset must verify against.
	RootsFile   string `yaml:"roots_file"`
	SignerAddr  string `yaml:"signer_addr"`
	CatalogAddr string `yaml:"catalog_addr"`
	// NATS is where the composer's buckets live.
	NATS natsx.ServiceConfig `yaml:"nats"`
	// LeaseTTL is how long the lease outlives its holder (default 15s).
	LeaseTTL config.Duration `yaml:"lease_ttl"`
	// Workers is how many nodes are composed at once (default 32).
	Workers int `yaml:"workers"`
	// ReconcilePeriod is how often every node is visited (default 15m).
	ReconcilePeriod config.Duration `yaml:"reconcile_period"`
	// Holder names this replica in the lease (default host-pid).
	Holder string `yaml:"holder"`
}

// Defaults fills in unset optional values.
func (c *Config) Defaults() {
	if c.Listen == "" {
		c.Listen = DefaultListen
	}
	// With no NATS configured, the embedded server mesh-catalog runs on the
	// same machine (the one-machine default, DESIGN.md §9).
	c.NATS.DefaultURL(natsx.DefaultEmbeddedURL)
	if c.LeaseTTL == 0 {
		c.LeaseTTL = config.Duration(15 * time.Second)
	}
	if c.Workers == 0 {
		// Passes mostly wait on the signer and JetStream round trips, so
		// far more run at once than there are cores.
		c.Workers = 32
	}
	if c.ReconcilePeriod == 0 {
		c.ReconcilePeriod = config.Duration(15 * time.Minute)
	}
	if c.Holder == "" {
		host, _ := os.Hostname()
		c.Holder = fmt.Sprintf("%s-%d", host, os.Getpid())
	}
}

// Validate names the first missing or invalid value.
func (c *Config) Validate() error {
	if err := config.Required(
		[2]string{"listen", c.Listen}, [2]string{"cert_file", c.CertFile}, [2]string{"key_file", c.KeyFile},
		[2]string{"ca_file", c.CAFile}, [2]string{"roots_file", c.RootsFile},
		[2]string{"signer_addr", c.SignerAddr}, [2]string{"catalog_addr", c.CatalogAddr},
	); err != nil {
		return err
	}
	if err := c.NATS.Validate(); err != nil {
		return err
	}
	if ttl := time.Duration(c.LeaseTTL); ttl < 3*time.Second || ttl > 5*time.Minute {
		return fmt.Errorf("config: lease_ttl %s is outside 3s..5m", ttl)
	}
	if c.Workers < 1 || c.Workers > 1024 {
		return fmt.Errorf("config: workers %d is outside 1..1024", c.Workers)
	}
	if p := time.Duration(c.ReconcilePeriod); p < time.Minute {
		return fmt.Errorf("config: reconcile_period %s is under a minute", p)
	}
	return nil
}

// Options carry what a caller in the same process provides instead of files
// and addresses. All are optional.
type Options struct {
	Logger         *slog.Logger
	TracerProvider trace.TracerProvider
	MeterProvider  metric.MeterProvider
	Listener       net.Listener
	ServerTLS      *tls.Config
	ClientTLS      *tls.Config
	// JetStream replaces cfg.NATS (a shared embedded server).
	JetStream jetstream.JetStream
	// Roots replaces RootsFile.
	Roots *typev1.TrustRoots
	// Signer and Catalog replace dialing their addresses.
	Signer  signing.Client
	Catalog catalogview.Client
	// OnPass is called after every pass (tests, benchmarks).
	OnPass func(node string, res *pass.Result, err error)
	// ServerOptions are added to the gRPC server's (interceptors given here
	// run inside authorization: tests count handler invocations with them).
	ServerOptions []grpc.ServerOption
	Ready         func(net.Addr)
}

// Policy is the composer's authorization table.
func Policy() authz.Policy {
	return authz.Merge(api.Policy(), syncsvc.Policy())
}

// Composer is a composer built from a Config.
type Composer struct {
	Store      *store.Store
	Passer     *pass.Passer
	Reconciler *reconcile.Reconciler
	Lease      *lease.Lease
	View       *catalogview.View
	Trust      *trust.Keeper
	Hub        *syncsvc.Hub
	// Sweeper deletes objects no composition names (lease holder only).
	Sweeper *objects.Sweeper

	cfg     Config
	log     *slog.Logger
	server  *grpcserver.Server
	closers []func()
}

// New connects to NATS, the signer and the catalog and builds the composer.
func New(ctx context.Context, cfg Config, opts Options) (_ *Composer, err error) {
	cfg.Defaults()
	log := opts.Logger
	if log == nil {
		log = slog.Default()
	}
	tp := opts.TracerProvider
	if tp == nil {
		tp = noop.NewTracerProvider()
	}
	c := &Composer{cfg: cfg, log: log}
	defer func() {
		if err != nil {
			c.Close()
		}
	}()
	roots := opts.Roots
	if roots == nil {
		if roots, err = verify.LoadRoots(cfg.RootsFile); err != nil {
			return nil, err
		}
	}
	serverTLS, clientTLS := opts.ServerTLS, opts.ClientTLS
	if serverTLS == nil {
		if serverTLS, err = pki.ServerTLS(cfg.CertFile, cfg.KeyFile, cfg.CAFile); err != nil {
			return nil, fmt.Errorf("server tls: %w", err)
		}
	}
	dial := func(addr string, service identity.Role) (*grpc.ClientConn, error) {
		if clientTLS == nil {
			if clientTLS, err = pki.ClientTLS(cfg.CertFile, cfg.KeyFile, cfg.CAFile); err != nil {
				return nil, fmt.Errorf("client tls: %w", err)
			}
		}
		conn, err := grpcclient.Dial(addr, pki.RequireService(clientTLS, service), grpcclient.WithTracerProvider(tp))
		if err != nil {
			return nil, err
		}
		c.closers = append(c.closers, func() { conn.Close() })
		return conn, nil
	}
	signerClient := opts.Signer
	if signerClient == nil {
		conn, err := dial(cfg.SignerAddr, identity.RoleSigner)
		if err != nil {
			return nil, fmt.Errorf("signer client: %w", err)
		}
		signerClient = signerv1.NewSignerServiceClient(conn)
	}
	catalogClient := opts.Catalog
	if catalogClient == nil {
		conn, err := dial(cfg.CatalogAddr, identity.RoleCatalog)
		if err != nil {
			return nil, fmt.Errorf("catalog client: %w", err)
		}
		catalogClient = catalogv1.NewCatalogServiceClient(conn)
	}
	js := opts.JetStream
	if js == nil {
		_, j, closeNATS, err := cfg.NATS.Open(ctx, "mesh-composer", log)
		if err != nil {
			return nil, fmt.Errorf("nats: %w", err)
		}
		c.closers = append(c.closers, closeNATS)
		js = j
	}
	if c.Store, err = store.Open(ctx, js, cfg.NATS.ReplicaCount(), time.Duration(cfg.LeaseTTL), tp); err != nil {
		return nil, err
	}

	var signer *signing.Signer
	c.Lease = lease.New(c.Store.Lease, cfg.Holder, time.Duration(cfg.LeaseTTL), fencer{&signer}, log)
	signer = signing.New(signerClient, tp.Tracer("mesh.dev/services/composer"))
	c.Trust = trust.New(roots, c.Store, signerClient, log)
	if err := c.Trust.Load(ctx); err != nil {
		log.Warn("keyset in the bucket not taken", "error", err)
	}
	var rec *reconcile.Reconciler
	c.View = catalogview.New(catalogClient, log, func(r *catalogv1.Registration) {
		if rec != nil {
			rec.ModuleChanged(r)
		}
	})
	tracer := tp.Tracer("mesh.dev/services/composer")
	// recompose asks for a pass of a node (every node when node is ""):
	// another writer changed what a pass wrote, or a read found it corrupt.
	recompose := func(node, reason string) {
		if rec == nil {
			return
		}
		nodes := []string{node}
		if node == "" {
			nodes = rec.Nodes()
		}
		for _, n := range nodes {
			rec.Enqueue(context.Background(), n, reason)
		}
	}
	c.Hub = syncsvc.NewHub(c.Store, log)
	c.Sweeper = objects.New(c.Store, objects.DefaultGrace, log, nil)
	c.Passer = pass.New(pass.Config{
		LastSeen: c.Hub.LastSeen,
		Store:    c.Store, Catalog: c.View, Signer: signer, Trust: c.Trust, Lease: c.Lease,
		LeaseMargin: c.Lease.RenewInterval(), Tracer: tracer, Logger: log,
		Approvals: approvalsOf{&rec}, ObjectTouched: c.Sweeper.Touch,
		Recompose: recompose,
		// rec is made below, before any pass runs.
		Watched: func(node string) pass.Watched { return rec.Watched(node) },
		// The catalog's buckets live in the same JetStream: when the
		// composer's went back, the view reads the catalog again before
		// the passes that follow use it.
		StoreWentBack:   func(string) { c.View.Resync() },
		CatalogCaughtUp: c.View.CaughtUp,
	})
	rec = reconcile.New(reconcile.Config{Store: c.Store, Passer: c.Passer, Logger: log, Workers: cfg.Workers, Tracer: tracer,
		Period: time.Duration(cfg.ReconcilePeriod), OnPass: opts.OnPass, OnNodeDeleted: c.Hub.NodeGone,
		OnLabelsChanged: c.Hub.NodeChanged})
	c.Reconciler = rec
	c.Trust.OnChange(func(*verify.Keyring) {
		c.Hub.NotifyKeyset()
		for _, n := range rec.Nodes() {
			rec.Enqueue(context.Background(), n, "keyset changed")
		}
	})

	apiServer := api.New(api.Config{Store: c.Store, Passer: c.Passer, Declarer: c.Passer, Lease: c.Lease, Logger: log, Recompose: recompose,
		Keyring: c.Trust.Keyring, LastSeen: c.Hub.LastSeen})
	syncServer := syncsvc.New(syncsvc.Config{Hub: c.Hub, Store: c.Store, Keysets: c.Trust, Catalog: c.View, Logger: log, Tracer: tracer,
		Labels: func(node string) map[string]string {
			spec, _ := rec.Spec(node)
			return spec.GetLabels()
		}})
	c.server, err = grpcserver.Build(grpcserver.Config{
		Addr: cfg.Listen, Listener: opts.Listener, TLS: serverTLS, Policy: Policy(), Logger: log,
		TracerProvider: opts.TracerProvider, MeterProvider: opts.MeterProvider,
		// Age connections out so engines rebalance across replicas.
		MaxConnectionAge: time.Hour,
		ServerOptions:    opts.ServerOptions,
	}, apiServer.Register, syncServer.Register)
	if err != nil {
		return nil, err
	}
	// Sync is served only while the hub's watch is up and current.
	syncName := composerv1.SyncService_ServiceDesc.ServiceName
	c.server.Health().SetServingStatus(syncName, healthpb.HealthCheckResponse_NOT_SERVING)
	c.Hub.OnHealth(func(serving bool) {
		st := healthpb.HealthCheckResponse_NOT_SERVING
		if serving {
			st = healthpb.HealthCheckResponse_SERVING
		}
		c.server.Health().SetServingStatus(syncName, st)
	})
	return c, nil
}

// approvalsOf reads the approvals the reconciler's watch holds (built after
// the passer).
type approvalsOf struct{ r **reconcile.Reconciler }

func (a approvalsOf) Approvals() []*composerv1.Approval { return (*a.r).Approvals() }

// fencer lets the lease fence through the signer built after it.
type fencer struct{ s **signing.Signer }

func (f fencer) Fence(ctx context.Context, holder string) (uint64, error) {
	return (*f.s).Fence(ctx, holder)
}

// Close releases connections.
func (c *Composer) Close() {
	for i := len(c.closers) - 1; i >= 0; i-- {
		c.closers[i]()
	}
	c.closers = nil
}

// keysetPoll is how often the lease holder asks the signer for its keyset.
const keysetPoll = 10 * time.Second

// lead is the lease tenure: refresh the keyset from the signer, then run
// passes until the lease is lost.
func (c *Composer) lead(ctx context.Context) {
	for ctx.Err() == nil {
		if err := c.Trust.Refresh(ctx); err != nil {
			c.log.Warn("keyset refresh; passes wait for it", "error", err)
			select {
			case <-ctx.Done():
				return
			case <-time.After(2 * time.Second):
			}
			continue
		}
		break
	}
	// No pass before the catalog view holds every registration and the
	// watches every spec and approval: a pass on a partial view would hold
	// modules for want of a registration, or miss an approval.
	for !c.View.CaughtUp() || !c.Reconciler.Loaded() {
		select {
		case <-ctx.Done():
			return
		case <-time.After(20 * time.Millisecond):
		}
	}
	go func() {
		// The signer reloads its keyset file, so a new one (a rotation's
		// second step, a revocation) is polled for; a pass that finds the
		// signer signing with a key or keyset not held yet wakes this at
		// once.
		t := time.NewTicker(keysetPoll)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			case <-c.Trust.Refreshes():
			}
			if err := c.Trust.Refresh(ctx); err != nil {
				c.log.Warn("keyset refresh", "error", err)
			}
		}
	}()
	go c.Sweeper.Run(ctx, time.Hour)
	c.Reconciler.Lead(ctx)
}

// Serve runs every loop of the composer under one supervisor until ctx is
// done: the catalog watch, the spec/approval/haves watches, the keyset
// watch, the lease (whose tenure runs passes) and the gRPC server.
func (c *Composer) Serve(ctx context.Context, ready func(net.Addr)) error {
	defer c.Close()
	addr, err := c.server.Listen()
	if err != nil {
		return err
	}
	if ready != nil {
		ready(addr)
	}
	err = supervise.Run(ctx,
		supervise.Task{Name: "catalog watch", Run: c.View.Run},
		supervise.Task{Name: "store watches", Run: c.Reconciler.Watch},
		supervise.Task{Name: "judgement records", Run: c.Passer.FollowRecords},
		supervise.Task{Name: "compositions mirror", Run: c.Passer.FollowCompositions},
		supervise.Task{Name: "assignments watch", Run: c.Passer.FollowAssignments},
		supervise.Task{Name: "keyset watch", Run: c.Trust.Watch},
		supervise.Task{Name: "sync hub", Run: c.Hub.Run},
		supervise.Task{Name: "lease", Run: func(ctx context.Context) error {
			defer c.Lease.Release(context.Background())
			return c.Lease.Run(ctx, c.lead)
		}},
		supervise.Task{Name: "grpc server", Run: c.ServeGRPC},
	)
	if errors.Is(err, context.Canceled) {
		return nil
	}
	return err
}

// ServeGRPC serves the composer's gRPC API on its listener until ctx is done
// (Serve runs it beside every other loop).
func (c *Composer) ServeGRPC(ctx context.Context) error {
	return c.server.Serve(ctx)
}

// Run builds the composer and serves until ctx is done.
func Run(ctx context.Context, cfg Config, opts Options) error {
	c, err := New(ctx, cfg, opts)
	if err != nil {
		return err
	}
	return c.Serve(ctx, opts.Ready)
}
