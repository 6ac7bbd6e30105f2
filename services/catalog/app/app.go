// Package app runs the catalog: Config (read from a strict YAML file and
// flags) and Run, used by mesh-catalog's main, by tests and by the
// one-process dev mesh.
package app

import (
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"net"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	healthgrpc "google.golang.org/grpc/health/grpc_health_v1"

	"mesh.dev/internal/authz"
	"mesh.dev/internal/config"
	"mesh.dev/internal/grpcserver"
	"mesh.dev/internal/identity"
	"mesh.dev/internal/natsx"
	"mesh.dev/internal/pki"
	catalogv1 "mesh.dev/proto/mesh/catalog/v1"
	"mesh.dev/services/catalog/internal/service"
	"mesh.dev/services/catalog/internal/store"
)

// Defaults of the catalog and of its embedded NATS server, which it runs
// when its configuration names no NATS (the one-machine default, DESIGN.md
// §9; the composer of the machine connects to DefaultEmbeddedListen).
const (
	DefaultListen         = "127.0.0.1:7401"
	DefaultMetricsListen  = "127.0.0.1:9401"
	DefaultEmbeddedListen = natsx.DefaultEmbeddedListen
	// DefaultEmbeddedDir is the embedded server's data dir: its JetStream
	// files are in DefaultEmbeddedDir/jetstream.
	DefaultEmbeddedDir = "/var/lib/mesh-catalog"
	// MetricsOff as metrics_listen serves no metrics.
	MetricsOff = "off"
)

// Background work of a running catalog.
const (
	// sweepInterval is how often chunks of unfinished uploads are purged.
	sweepInterval = time.Hour
	// healthInterval is how often the NATS connection is looked at to
	// report the service SERVING or NOT_SERVING.
	healthInterval = 5 * time.Second
	// connectTimeout bounds the first connection to NATS and the creation
	// of the buckets.
	connectTimeout = 30 * time.Second
)

// Config is the catalog's configuration file (YAML, unknown keys refused).
type Config struct {
	// Listen is the gRPC address.
	Listen string `yaml:"listen"`
	// MetricsListen serves Prometheus /metrics (default
	// DefaultMetricsListen; "off" serves none).
	MetricsListen string `yaml:"metrics_listen"`
	// CertFile, KeyFile and CAFile are the catalog's mTLS certificate
	// (URI SAN spiffe://<td>/service/catalog), its key and the CA.
	CertFile string `yaml:"cert_file"`
	KeyFile  string `yaml:"key_file"`
	CAFile   string `yaml:"ca_file"`
	// NATS says where the catalog keeps its data.
	NATS NATSConfig `yaml:"nats"`
	// UploadIdleTimeout abandons an upload that sends nothing for this long
	// (default 1m).
	UploadIdleTimeout config.Duration `yaml:"upload_idle_timeout"`
	// EntryCacheBytes bounds the in-memory entry cache (default 64 MiB;
	// negative turns it off).
	EntryCacheBytes int `yaml:"entry_cache_bytes"`
}

// NATSConfig selects JetStream: an embedded server storing in EmbeddedDir
// (the one-machine default, in DefaultEmbeddedDir when the section names
// neither; the other services connect to its embedded_listen), or an
// external cluster at URL.
type NATSConfig = natsx.ServiceConfig

// Defaults fills in unset optional values.
func (c *Config) Defaults() {
	if c.Listen == "" {
		c.Listen = DefaultListen
	}
	if c.MetricsListen == "" {
		c.MetricsListen = DefaultMetricsListen
	}
	c.NATS.DefaultEmbedded(DefaultEmbeddedDir)
	c.NATS.Defaults(DefaultEmbeddedListen)
	if c.UploadIdleTimeout == 0 {
		c.UploadIdleTimeout = config.Duration(service.DefaultUploadIdleTimeout)
	}
}

// Validate names the first missing or invalid value of a configuration
// that reads everything from files (as mesh-catalog does).
func (c *Config) Validate() error {
	if err := config.Required(
		[2]string{"listen", c.Listen},
		[2]string{"cert_file", c.CertFile}, [2]string{"key_file", c.KeyFile}, [2]string{"ca_file", c.CAFile},
	); err != nil {
		return err
	}
	return c.validateNATS()
}

func (c *Config) validateNATS() error {
	if err := c.NATS.Validate(); err != nil {
		return err
	}
	if d := time.Duration(c.UploadIdleTimeout); d < time.Second || d > time.Hour {
		return fmt.Errorf("config: upload_idle_timeout %s is outside 1s..1h", d)
	}
	return nil
}

// Options carry what a caller in the same process provides instead of files
// and addresses (tests, the one-process dev mesh). All are optional.
type Options struct {
	Logger         *slog.Logger
	TracerProvider trace.TracerProvider
	MeterProvider  metric.MeterProvider
	// Listener replaces Listen.
	Listener net.Listener
	// ServerTLS replaces the certificate files.
	ServerTLS *tls.Config
	// JetStream replaces Config.NATS: the catalog uses this connection
	// (which its caller owns and closes) and starts no server. The dev mesh
	// passes the one its embedded server serves to every service.
	JetStream jetstream.JetStream
	// Ready is called with the server's address once it listens.
	Ready func(net.Addr)
	// ServerOptions are passed to the gRPC server after its own; their
	// interceptors run inside authorization (tests count handler calls).
	ServerOptions []grpc.ServerOption
}

// Policy is the catalog's authorization table (DESIGN.md §8): builders
// write entries, builds, artifacts and registrations; operators put entries
// and register; each read is allowed to the roles that call it, and no
// more:
//   - GetEntry: the composer (compositions), the signer (its cross-check),
//     nodes (the engine's entries cache, §7), operators (meshctl catalog
//     get) and builders (publish looks an entry up before putting it).
//   - ListEntries: operators and builders (meshctl catalog ls); the
//     composer reads entries by fingerprint only.
//   - GetBuild: the composer (parts of wants), the signer (DONE and parts,
//     §5.4), operators (meshctl catalog get) and builders (publish skips a
//     DONE build); a node takes its parts from its want (§7), never a build.
//   - GetModule, ListModules: the composer, operators and builders
//     (meshctl catalog modules); the signer judges entries and builds, not
//     registrations (§5.4), and nodes hear registrations through manifests.
//   - WatchModules: the composer (its catalog view) and operators (meshctl
//     catalog watch).
//   - DownloadArtifact: everyone; artifacts are not secret.
func Policy() authz.Policy {
	// The catalog never calls itself: its own role is allowed nothing.
	const (
		signer   = identity.RoleSigner
		composer = identity.RoleComposer
		node     = identity.RoleNode
		operator = identity.RoleOperator
		builder  = identity.RoleBuilder
	)
	return authz.Policy{
		catalogv1.CatalogService_PutEntry_FullMethodName:         authz.Allow(builder, operator),
		catalogv1.CatalogService_GetEntry_FullMethodName:         authz.Allow(composer, signer, node, operator, builder),
		catalogv1.CatalogService_ListEntries_FullMethodName:      authz.Allow(operator, builder),
		catalogv1.CatalogService_PutBuild_FullMethodName:         authz.Allow(builder),
		catalogv1.CatalogService_GetBuild_FullMethodName:         authz.Allow(composer, signer, operator, builder),
		catalogv1.CatalogService_UploadArtifact_FullMethodName:   authz.Allow(builder),
		catalogv1.CatalogService_DownloadArtifact_FullMethodName: authz.AnyAuthenticated(),
		catalogv1.CatalogService_RegisterModule_FullMethodName:   authz.Allow(builder, operator),
		catalogv1.CatalogService_GetModule_FullMethodName:        authz.Allow(composer, operator, builder),
		catalogv1.CatalogService_ListModules_FullMethodName:      authz.Allow(composer, operator, builder),
		catalogv1.CatalogService_WatchModules_FullMethodName:     authz.Allow(composer, operator),
	}
}

// Catalog is a catalog built from a Config, ready to serve.
type Catalog struct {
	// Service is the gRPC service; Store its persistence.
	Service *service.Server
	Store   *store.Store

	server *grpcserver.Server
	log    *slog.Logger
	// nats is the JetStream the catalog opened (nil when one was given).
	nats *natsx.Opened
	js   jetstream.JetStream
}

// New connects to JetStream (or starts the embedded server), creates or
// updates the catalog's buckets, repairs registration history keys a
// crash left unwritten and builds the gRPC server. Close releases what it
// opened when Serve is not called.
func New(ctx context.Context, cfg Config, opts Options) (_ *Catalog, err error) {
	cfg.Defaults()
	log := opts.Logger
	if log == nil {
		log = slog.Default()
	}
	c := &Catalog{log: log}
	defer func() {
		if err != nil {
			c.Close()
		}
	}()

	serverTLS := opts.ServerTLS
	if serverTLS == nil {
		if err := config.Required([2]string{"cert_file", cfg.CertFile}, [2]string{"key_file", cfg.KeyFile}, [2]string{"ca_file", cfg.CAFile}); err != nil {
			return nil, err
		}
		if serverTLS, err = pki.ServerTLS(cfg.CertFile, cfg.KeyFile, cfg.CAFile); err != nil {
			return nil, fmt.Errorf("server tls: %w", err)
		}
	}

	ctx, cancel := context.WithTimeout(ctx, connectTimeout)
	defer cancel()
	c.js = opts.JetStream
	if c.js == nil {
		if err := cfg.validateNATS(); err != nil {
			return nil, err
		}
		opened, err := cfg.NATS.Connect(ctx, "mesh-catalog", log)
		if err != nil {
			return nil, err
		}
		c.nats, c.js = opened, opened.JetStream
	}
	c.Store, err = store.Open(ctx, c.js, store.Config{
		Replicas: cfg.NATS.Replicas, EntryCacheBytes: cfg.EntryCacheBytes,
		TracerProvider: opts.TracerProvider, Logger: log,
	})
	if err != nil {
		return nil, fmt.Errorf("catalog store: %w", err)
	}
	if n, err := c.Store.RepairHistory(ctx); err != nil {
		return nil, fmt.Errorf("repair registration history: %w", err)
	} else if n > 0 {
		log.Warn("wrote registration history keys a stop had left unwritten", "keys", n)
	}

	c.Service, err = service.New(service.Config{
		Store: c.Store, UploadIdleTimeout: time.Duration(cfg.UploadIdleTimeout),
		TracerProvider: opts.TracerProvider, MeterProvider: opts.MeterProvider, Logger: log,
	})
	if err != nil {
		return nil, err
	}
	c.server, err = grpcserver.Build(grpcserver.Config{
		Addr: cfg.Listen, Listener: opts.Listener, TLS: serverTLS, Policy: Policy(), Logger: log,
		TracerProvider: opts.TracerProvider, MeterProvider: opts.MeterProvider,
		ServerOptions: opts.ServerOptions,
	}, c.Service.Register)
	if err != nil {
		return nil, err
	}
	where := "in-process connection"
	if c.nats != nil {
		where = c.nats.Description
	}
	log.Info("catalog ready", "replicas", cfg.NATS.Replicas, "nats", where)
	return c, nil
}

// Embedded returns the embedded NATS server, nil when the catalog connects
// to another one; the other services of one machine connect to its
// ClientURL.
func (c *Catalog) Embedded() *natsx.Embedded {
	if c.nats == nil {
		return nil
	}
	return c.nats.Embedded
}

// JetStream returns the catalog's JetStream context.
func (c *Catalog) JetStream() jetstream.JetStream { return c.js }

// Serve serves until ctx is done, sweeping the chunks of unfinished uploads
// and reporting NOT_SERVING while NATS is unreachable, then ends the watch
// streams, stops gracefully and closes what New opened.
func (c *Catalog) Serve(ctx context.Context, ready func(net.Addr)) error {
	defer c.Close()
	bg, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		<-ctx.Done()
		// Watch streams never end on their own; a graceful stop would wait
		// for them until its grace period ran out.
		c.Service.Stop()
	}()
	go c.sweep(bg)
	go c.health(bg)
	return c.server.Run(ctx, ready)
}

// sweep purges the chunks of uploads that died with their catalog, at start
// and every sweepInterval. Only chunks older than twice the longest upload
// go, so another replica's running upload is never touched.
func (c *Catalog) sweep(ctx context.Context) {
	t := time.NewTicker(sweepInterval)
	defer t.Stop()
	for {
		if n, err := c.Store.SweepOrphanChunks(ctx, 2*service.MaxUploadDuration); err != nil && ctx.Err() == nil {
			c.log.Warn("sweep of unfinished artifact uploads failed", "error", err)
		} else if n > 0 {
			c.log.Info("swept unfinished artifact uploads", "objects", n)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// health reports the catalog NOT_SERVING while its NATS connection is down,
// so that clients watching health go elsewhere.
func (c *Catalog) health(ctx context.Context) {
	nc := c.js.Conn()
	t := time.NewTicker(healthInterval)
	defer t.Stop()
	serving := true
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		up := nc.IsConnected()
		if up == serving {
			continue
		}
		serving = up
		st := healthgrpc.HealthCheckResponse_SERVING
		if !up {
			st = healthgrpc.HealthCheckResponse_NOT_SERVING
			c.log.Warn("nats connection down; reporting NOT_SERVING")
		} else {
			c.log.Info("nats connection back; reporting SERVING")
		}
		c.server.Health().SetServingStatus("", st)
		c.server.Health().SetServingStatus(catalogv1.CatalogService_ServiceDesc.ServiceName, st)
	}
}

// Close closes the NATS connection and stops the embedded server. It may be
// called more than once.
func (c *Catalog) Close() {
	if c.nats != nil {
		c.nats.Close()
		c.nats = nil
	}
}

// Run builds the catalog and serves until ctx is done.
func Run(ctx context.Context, cfg Config, opts Options) error {
	c, err := New(ctx, cfg, opts)
	if err != nil {
		return err
	}
	return c.Serve(ctx, opts.Ready)
}
