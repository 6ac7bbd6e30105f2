// Package app runs the node engine: Config (read from a strict YAML file and
// flags) and New/Run, used by mesh-nodeengine's main and by tests and the
// one-process dev mesh.
package app

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"time"

	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"

	"mesh.dev/internal/config"
	"mesh.dev/internal/grpcclient"
	"mesh.dev/internal/grpcserver"
	"mesh.dev/internal/identity"
	"mesh.dev/internal/names"
	"mesh.dev/internal/pki"
	"mesh.dev/internal/supervise"
	"mesh.dev/internal/verify"
	catalogv1 "mesh.dev/proto/mesh/catalog/v1"
	composerv1 "mesh.dev/proto/mesh/composer/v1"
	"mesh.dev/services/nodeengine/internal/admin"
	"mesh.dev/services/nodeengine/internal/apply"
	"mesh.dev/services/nodeengine/internal/engine"
	"mesh.dev/services/nodeengine/internal/state"
	"mesh.dev/services/nodeengine/internal/syncclient"
)

// Defaults of the node engine.
const (
	DefaultAdminListen = "127.0.0.1:7404"
	DefaultRoot        = "/"
	// Version is sent in Hello as engine_version.
	Version = "mesh-nodeengine/1"
)

// Config is the node engine's configuration file (YAML, unknown keys
// refused); flags override it.
type Config struct {
	// Root is prepended to every path the engine writes: "/" in
	// production, a directory of its own in a dev mesh or a test.
	Root string `yaml:"root"`
	// StateDir holds the engine's bbolt state, staged content and the
	// prior content of adopted paths.
	StateDir string `yaml:"state_dir"`
	// RootsFile pins the root keys (mesh.type.v1.TrustRoots in protojson).
	RootsFile string `yaml:"roots_file"`
	// AllowPrefixes are the only paths the engine writes under.
	AllowPrefixes []string `yaml:"allow_prefixes"`
	// ComposerAddr and CatalogAddr are gRPC targets.
	ComposerAddr string `yaml:"composer_addr"`
	CatalogAddr  string `yaml:"catalog_addr"`
	// AdminListen serves the local admin API (loopback by default).
	AdminListen string `yaml:"admin_listen"`
	// MetricsListen serves Prometheus /metrics; "" disables it.
	MetricsListen string `yaml:"metrics_listen"`
	// CertFile, KeyFile and CAFile are the engine's mTLS certificate (URI
	// SAN spiffe://<td>/node/<name>: the node name comes from it), its key
	// and the CA.
	CertFile string `yaml:"cert_file"`
	KeyFile  string `yaml:"key_file"`
	CAFile   string `yaml:"ca_file"`
	// DriftInterval is how often the engine looks for drift when nothing
	// else asks for a pass (default 1m).
	DriftInterval config.Duration `yaml:"drift_interval"`
}

// Defaults fills in unset optional values.
func (c *Config) Defaults() {
	if c.Root == "" {
		c.Root = DefaultRoot
	}
	if c.AdminListen == "" {
		c.AdminListen = DefaultAdminListen
	}
	if c.DriftInterval == 0 {
		c.DriftInterval = config.Duration(engine.DefaultDriftInterval)
	}
}

// Validate names the first missing or invalid value.
func (c *Config) Validate() error {
	if err := config.Required(
		[2]string{"root", c.Root}, [2]string{"state_dir", c.StateDir}, [2]string{"roots_file", c.RootsFile},
		[2]string{"composer_addr", c.ComposerAddr}, [2]string{"catalog_addr", c.CatalogAddr},
		[2]string{"admin_listen", c.AdminListen},
		[2]string{"cert_file", c.CertFile}, [2]string{"key_file", c.KeyFile}, [2]string{"ca_file", c.CAFile},
	); err != nil {
		return err
	}
	return c.validatePaths()
}

func (c *Config) validatePaths() error {
	if len(c.AllowPrefixes) == 0 {
		return errors.New("config: allow_prefixes is required (the only paths the engine writes under)")
	}
	for i, p := range c.AllowPrefixes {
		if err := names.CheckPath(fmt.Sprintf("allow_prefixes[%d]", i), p); err != nil {
			return fmt.Errorf("config: %w", err)
		}
	}
	if !filepath.IsAbs(c.Root) {
		return fmt.Errorf("config: root %q is not absolute", c.Root)
	}
	if time.Duration(c.DriftInterval) < time.Second {
		return fmt.Errorf("config: drift_interval %s is under 1s", time.Duration(c.DriftInterval))
	}
	return nil
}

// ComposerClient is what the engine asks of the composer: Sync, its
// compositions and their objects.
type ComposerClient interface {
	engine.Composer
	syncclient.Client
}

// Options carry what a caller in the same process provides instead of files
// and addresses (tests, the one-process dev mesh). All are optional.
type Options struct {
	Logger         *slog.Logger
	TracerProvider trace.TracerProvider
	MeterProvider  metric.MeterProvider
	// AdminListener replaces AdminListen.
	AdminListener net.Listener
	// ServerTLS and ClientTLS replace the certificate files; the node name
	// is read from ClientTLS's certificate.
	ServerTLS, ClientTLS *tls.Config
	// Composer and Catalog replace dialling the addresses.
	Composer ComposerClient
	Catalog  engine.Catalog
	// Now is the engine's clock.
	Now func() time.Time
	// WrapStore wraps the state store (tests inject failures with it).
	WrapStore func(state.Store) state.Store
	// OnCommit is called after every durable commit of an apply and every
	// keyset taken (the fault harness records them).
	OnCommit func(Committed)
	// EntryBackoffBase and SyncBackoffBase shorten retries in tests.
	EntryBackoffBase, SyncBackoffBase, SyncBackoffMax time.Duration
	// CompositionDeadline and FetchStall shorten the bounds of fetches in
	// tests (engine.DefaultCompositionDeadline, engine.DefaultFetchStall).
	CompositionDeadline, FetchStall time.Duration
	// Ready is called with the admin API's address once it listens.
	Ready func(net.Addr)
	// ServerOptions are passed to the admin API's gRPC server after its
	// own; their interceptors run inside authorization (tests count
	// handler calls).
	ServerOptions []grpc.ServerOption
	// DialOptions are applied after mesh's own when the engine dials the
	// composer and the catalog (the fault harness shrinks the HTTP/2
	// windows with them). nil in production.
	DialOptions []grpc.DialOption
	// AfterApplyOp, when set, is called after each op of an apply (or of
	// the replay of a journal) has run, with the ops done and the count of
	// the journal's ops: the fault harness kills the engine between ops.
	// nil in production.
	AfterApplyOp func(done, total int)
}

// Engine is a node engine built from a Config, ready to run.
type Engine struct {
	Engine *engine.Engine
	Node   string
	log    *slog.Logger
	server *grpcserver.Server
	store  *state.DB
	conns  []*grpc.ClientConn
	sync   syncclient.Config
	ready  func(net.Addr)
}

// NodeOf reads the node name from a client TLS config's certificate, which
// must name a node (spiffe://<td>/node/<name>).
func NodeOf(cfg *tls.Config) (string, error) {
	if cfg == nil || cfg.GetClientCertificate == nil && len(cfg.Certificates) == 0 {
		return "", errors.New("no client certificate")
	}
	var cert *tls.Certificate
	if cfg.GetClientCertificate != nil {
		c, err := cfg.GetClientCertificate(&tls.CertificateRequestInfo{})
		if err != nil {
			return "", err
		}
		cert = c
	} else {
		cert = &cfg.Certificates[0]
	}
	if len(cert.Certificate) == 0 {
		return "", errors.New("empty client certificate")
	}
	leaf, err := x509.ParseCertificate(cert.Certificate[0])
	if err != nil {
		return "", err
	}
	id, err := identity.FromCertificate(leaf)
	if err != nil {
		return "", err
	}
	if id.Role != identity.RoleNode {
		return "", fmt.Errorf("the certificate names %s, not a node", id)
	}
	return id.Name, nil
}

// New reads the pinned roots and the kept state (whole, before anything is
// asked), opens the allowed prefixes, connects to the composer and the
// catalog and builds the admin server. Close releases what it opened when
// Run is not called.
func New(ctx context.Context, cfg Config, opts Options) (_ *Engine, err error) {
	cfg.Defaults()
	if err := cfg.validatePaths(); err != nil {
		return nil, err
	}
	log := opts.Logger
	if log == nil {
		log = slog.Default()
	}
	a := &Engine{log: log, ready: opts.Ready}
	defer func() {
		if err != nil {
			a.Close()
		}
	}()
	trustRoots, err := verify.LoadRoots(cfg.RootsFile)
	if err != nil {
		return nil, err
	}
	serverTLS, clientTLS := opts.ServerTLS, opts.ClientTLS
	if clientTLS == nil {
		if clientTLS, err = pki.ClientTLS(cfg.CertFile, cfg.KeyFile, cfg.CAFile); err != nil {
			return nil, fmt.Errorf("client tls: %w", err)
		}
	}
	if serverTLS == nil {
		if serverTLS, err = pki.ServerTLS(cfg.CertFile, cfg.KeyFile, cfg.CAFile); err != nil {
			return nil, fmt.Errorf("server tls: %w", err)
		}
	}
	if a.Node, err = NodeOf(clientTLS); err != nil {
		return nil, fmt.Errorf("node identity: %w", err)
	}
	log = log.With(slog.String("node", a.Node))
	a.log = log

	if err := os.MkdirAll(cfg.StateDir, 0o700); err != nil {
		return nil, fmt.Errorf("state dir: %w", err)
	}
	if a.store, err = state.Open(filepath.Join(cfg.StateDir, "engine.db")); err != nil {
		return nil, err
	}
	var store state.Store = a.store
	if opts.WrapStore != nil {
		store = opts.WrapStore(store)
	}
	if opts.OnCommit != nil {
		store = observed{Store: store, fn: opts.OnCommit}
	}
	applier, err := apply.New(apply.Config{Root: cfg.Root, Prefixes: cfg.AllowPrefixes, StateDir: cfg.StateDir, Logger: log, AfterOp: opts.AfterApplyOp})
	if err != nil {
		return nil, err
	}

	composer, catalog := opts.Composer, opts.Catalog
	dial := func(target string, service identity.Role) (*grpc.ClientConn, error) {
		conn, err := grpcclient.Dial(target, pki.RequireService(clientTLS, service), append([]grpc.DialOption{grpcclient.WithTracerProvider(opts.TracerProvider), grpcclient.WithMeterProvider(opts.MeterProvider)}, opts.DialOptions...)...)
		if err == nil {
			a.conns = append(a.conns, conn)
		}
		return conn, err
	}
	if composer == nil {
		conn, err := dial(cfg.ComposerAddr, identity.RoleComposer)
		if err != nil {
			applier.Close()
			return nil, fmt.Errorf("composer client: %w", err)
		}
		composer = struct {
			composerv1.ComposerServiceClient
			composerv1.SyncServiceClient
		}{composerv1.NewComposerServiceClient(conn), composerv1.NewSyncServiceClient(conn)}
	}
	if catalog == nil {
		conn, err := dial(cfg.CatalogAddr, identity.RoleCatalog)
		if err != nil {
			applier.Close()
			return nil, fmt.Errorf("catalog client: %w", err)
		}
		catalog = catalogv1.NewCatalogServiceClient(conn)
	}
	a.Engine, err = engine.New(ctx, engine.Config{
		Node: a.Node, Roots: trustRoots, Store: store, Applier: applier, Composer: composer, Catalog: catalog,
		EngineVersion: Version, Now: opts.Now, Logger: log, Tracer: opts.TracerProvider,
		EntryBackoffBase: opts.EntryBackoffBase, DriftInterval: time.Duration(cfg.DriftInterval),
		CompositionDeadline: opts.CompositionDeadline, FetchStall: opts.FetchStall,
	})
	if err != nil {
		applier.Close()
		return nil, err
	}
	a.sync = syncclient.Config{Client: composer, Engine: a.Engine, BackoffBase: opts.SyncBackoffBase, BackoffMax: opts.SyncBackoffMax, Logger: log}
	a.server, err = grpcserver.Build(grpcserver.Config{
		Addr: cfg.AdminListen, Listener: opts.AdminListener, TLS: serverTLS, Policy: admin.Policy(a.Node), Logger: log,
		TracerProvider: opts.TracerProvider, MeterProvider: opts.MeterProvider,
		ServerOptions: opts.ServerOptions,
	}, admin.New(a.Engine, log).Register)
	if err != nil {
		return nil, err
	}
	log.Info("node engine ready", slog.String("root", cfg.Root), slog.Any("allow_prefixes", cfg.AllowPrefixes), slog.String("state_dir", cfg.StateDir))
	return a, nil
}

// Close releases the state, the prefixes and the connections.
func (a *Engine) Close() {
	if a.Engine != nil {
		a.Engine.Close()
		a.Engine = nil
	}
	for _, c := range a.conns {
		c.Close()
	}
	a.conns = nil
	if a.store != nil {
		a.store.Close()
		a.store = nil
	}
}

// Run runs the passes, the Sync stream and the admin API under one
// supervisor until ctx is done or one of them fails, then closes.
func (a *Engine) Run(ctx context.Context) error {
	defer a.Close()
	err := supervise.Run(ctx,
		supervise.Task{Name: "passes", Run: a.Engine.Run},
		supervise.Task{Name: "sync", Run: func(ctx context.Context) error { return syncclient.Run(ctx, a.sync) }},
		supervise.Task{Name: "admin", Run: func(ctx context.Context) error { return a.server.Run(ctx, a.ready) }},
	)
	if err != nil {
		a.log.Error("node engine stopped", "error", err)
	}
	return err
}

// Run builds the engine and runs it until ctx is done.
func Run(ctx context.Context, cfg Config, opts Options) error {
	a, err := New(ctx, cfg, opts)
	if err != nil {
		return err
	}
	return a.Run(ctx)
}
