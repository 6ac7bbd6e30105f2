// Package app runs the signer: Config (read from a strict YAML file and
// flags) and Run, used by mesh-signer's main and by tests and the one-process
// dev mesh.
package app

import (
	"context"
	"crypto/tls"
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

	"mesh.dev/internal/authz"
	"mesh.dev/internal/config"
	"mesh.dev/internal/grpcclient"
	"mesh.dev/internal/grpcserver"
	"mesh.dev/internal/identity"
	"mesh.dev/internal/pki"
	"mesh.dev/internal/verify"
	catalogv1 "mesh.dev/proto/mesh/catalog/v1"
	signerv1 "mesh.dev/proto/mesh/signer/v1"
	"mesh.dev/services/signer/internal/audit"
	"mesh.dev/services/signer/internal/crosscheck"
	"mesh.dev/services/signer/internal/keysource"
	"mesh.dev/services/signer/internal/service"
	"mesh.dev/services/signer/internal/state"
)

// Default addresses of the signer.
const (
	DefaultListen        = "127.0.0.1:7402"
	DefaultMetricsListen = "127.0.0.1:9402"
)

// Config is the signer's configuration file (YAML, unknown keys refused).
type Config struct {
	// Listen is the gRPC address.
	Listen string `yaml:"listen"`
	// MetricsListen serves Prometheus /metrics; "" disables it.
	MetricsListen string `yaml:"metrics_listen"`
	// CertFile, KeyFile and CAFile are the signer's mTLS certificate
	// (URI SAN spiffe://<td>/service/signer), its key and the CA.
	CertFile string `yaml:"cert_file"`
	KeyFile  string `yaml:"key_file"`
	CAFile   string `yaml:"ca_file"`
	// SigningKeyFile is the online ed25519 key (PKCS#8 PEM, mode 0600).
	SigningKeyFile string `yaml:"signing_key_file"`
	// KeysetFile is the root-signed keyset to serve (protojson Envelope);
	// it is reloaded when it changes.
	KeysetFile string `yaml:"keyset_file"`
	// RootsFile pins the root keys the keyset must verify against.
	RootsFile string `yaml:"roots_file"`
	// StateDir holds the revisions, the fencing epoch and the audit log.
	StateDir string `yaml:"state_dir"`
	// ManifestLifetime is how long a manifest is valid (default 24h, at
	// most 7 days).
	ManifestLifetime config.Duration `yaml:"manifest_lifetime"`
	// OwnPrefixes are the only paths a node's own composition may write.
	OwnPrefixes []string `yaml:"own_prefixes"`
	// CatalogAddr is the catalog the signer cross-checks against.
	CatalogAddr string `yaml:"catalog_addr"`
	// KeysetReload is how often the keyset file is checked (default 30s).
	KeysetReload config.Duration `yaml:"keyset_reload"`
}

// Defaults fills in unset optional values.
func (c *Config) Defaults() {
	if c.Listen == "" {
		c.Listen = DefaultListen
	}
	if c.ManifestLifetime == 0 {
		c.ManifestLifetime = config.Duration(service.DefaultManifestLifetime)
	}
	if c.KeysetReload == 0 {
		c.KeysetReload = config.Duration(30 * time.Second)
	}
}

// Validate names the first missing or invalid value.
func (c *Config) Validate() error {
	if err := config.Required(
		[2]string{"listen", c.Listen},
		[2]string{"cert_file", c.CertFile}, [2]string{"key_file", c.KeyFile}, [2]string{"ca_file", c.CAFile},
		[2]string{"signing_key_file", c.SigningKeyFile}, [2]string{"keyset_file", c.KeysetFile},
		[2]string{"roots_file", c.RootsFile}, [2]string{"state_dir", c.StateDir},
		[2]string{"catalog_addr", c.CatalogAddr},
	); err != nil {
		return err
	}
	if lt := time.Duration(c.ManifestLifetime); lt < time.Minute || lt > service.MaxManifestLifetime {
		return fmt.Errorf("config: manifest_lifetime %s is outside 1m..%s", lt, service.MaxManifestLifetime)
	}
	if len(c.OwnPrefixes) == 0 {
		return errors.New("config: own_prefixes is required (the only paths a node's own composition may write)")
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
	// ServerTLS and ClientTLS replace the certificate files.
	ServerTLS, ClientTLS *tls.Config
	// Key replaces SigningKeyFile.
	Key keysource.Source
	// Catalog replaces dialing CatalogAddr.
	Catalog crosscheck.Catalog
	// Ready is called with the server's address once it listens.
	Ready func(net.Addr)
	// ServerOptions are passed to the gRPC server after its own; their
	// interceptors run inside authorization (tests count handler calls).
	ServerOptions []grpc.ServerOption
}

// Policy is the signer's authorization table: only the composer signs and
// fences; any authenticated role reads the keyset.
func Policy() authz.Policy {
	return authz.Policy{
		signerv1.SignerService_SignCompositions_FullMethodName: authz.Allow(identity.RoleComposer),
		signerv1.SignerService_SignManifests_FullMethodName:    authz.Allow(identity.RoleComposer),
		signerv1.SignerService_Fence_FullMethodName:            authz.Allow(identity.RoleComposer),
		signerv1.SignerService_GetKeyset_FullMethodName:        authz.AnyAuthenticated(),
	}
}

// Signer is a signer built from a Config, ready to serve.
type Signer struct {
	Service *service.Server
	server  *grpcserver.Server
	log     *slog.Logger
	audit   *audit.Log
	state   *state.Store
	conn    *grpc.ClientConn
	reload  time.Duration
}

// New opens the state and audit log, loads the key and keyset (refusing to
// start when the key is not ACTIVE in it), connects to the catalog and builds
// the gRPC server. Close releases what it opened when Serve is not called.
func New(ctx context.Context, cfg Config, opts Options) (_ *Signer, err error) {
	cfg.Defaults()
	log := opts.Logger
	if log == nil {
		log = slog.Default()
	}
	s := &Signer{log: log, reload: time.Duration(cfg.KeysetReload)}
	defer func() {
		if err != nil {
			s.Close()
		}
	}()

	key := opts.Key
	if key == nil {
		if key, err = keysource.File(cfg.SigningKeyFile); err != nil {
			return nil, fmt.Errorf("signing key: %w", err)
		}
	}
	roots, err := verify.LoadRoots(cfg.RootsFile)
	if err != nil {
		return nil, err
	}
	keysets, err := service.LoadKeysets(cfg.KeysetFile, roots, key.KeyID(), time.Now())
	if err != nil {
		return nil, fmt.Errorf("refusing to start: %w", err)
	}
	if err := os.MkdirAll(cfg.StateDir, 0o700); err != nil {
		return nil, fmt.Errorf("state dir: %w", err)
	}
	if s.state, err = state.Open(filepath.Join(cfg.StateDir, "signer.db")); err != nil {
		return nil, err
	}
	var torn bool
	if s.audit, torn, err = audit.Open(filepath.Join(cfg.StateDir, "audit.log")); err != nil {
		return nil, err
	}
	if torn {
		log.Warn("audit log ended in a torn record (a write never acknowledged); it was cut off")
	}

	serverTLS, clientTLS := opts.ServerTLS, opts.ClientTLS
	if serverTLS == nil {
		if serverTLS, err = pki.ServerTLS(cfg.CertFile, cfg.KeyFile, cfg.CAFile); err != nil {
			return nil, fmt.Errorf("server tls: %w", err)
		}
	}
	catalog := opts.Catalog
	if catalog == nil {
		if clientTLS == nil {
			if clientTLS, err = pki.ClientTLS(cfg.CertFile, cfg.KeyFile, cfg.CAFile); err != nil {
				return nil, fmt.Errorf("client tls: %w", err)
			}
		}
		if s.conn, err = grpcclient.Dial(cfg.CatalogAddr, pki.RequireService(clientTLS, identity.RoleCatalog), grpcclient.WithTracerProvider(opts.TracerProvider)); err != nil {
			return nil, fmt.Errorf("catalog client: %w", err)
		}
		catalog = catalogv1.NewCatalogServiceClient(s.conn)
	}

	s.Service, err = service.New(service.Config{
		Key: key, State: s.state, Audit: s.audit, Keysets: keysets, Checker: crosscheck.New(catalog),
		OwnPrefixes: cfg.OwnPrefixes, ManifestLifetime: time.Duration(cfg.ManifestLifetime),
		TracerProvider: opts.TracerProvider, MeterProvider: opts.MeterProvider, Logger: log,
	})
	if err != nil {
		return nil, err
	}
	if _, err := s.audit.Append(audit.Record{Kind: audit.KindStart, KeyID: key.KeyID(), Reason: fmt.Sprintf("keyset version %d", keysets.Current().Version())}); err != nil {
		return nil, fmt.Errorf("audit start: %w", err)
	}
	s.server, err = grpcserver.Build(grpcserver.Config{
		Addr: cfg.Listen, Listener: opts.Listener, TLS: serverTLS, Policy: Policy(), Logger: log,
		TracerProvider: opts.TracerProvider, MeterProvider: opts.MeterProvider,
		ServerOptions: opts.ServerOptions,
	}, s.Service.Register)
	if err != nil {
		return nil, err
	}
	log.Info("signer ready", "key_id", key.KeyID(), "keyset_version", keysets.Current().Version(), "state_dir", cfg.StateDir)
	return s, nil
}

// Serve serves until ctx is done, reloading the keyset file meanwhile, then
// stops gracefully and closes the state.
func (s *Signer) Serve(ctx context.Context, ready func(net.Addr)) error {
	defer s.Close()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go s.Service.WatchKeyset(ctx, s.reload)
	return s.server.Run(ctx, ready)
}

// Close releases the state, the audit log and the catalog connection.
func (s *Signer) Close() {
	if s.conn != nil {
		s.conn.Close()
	}
	if s.audit != nil {
		s.audit.Close()
	}
	if s.state != nil {
		s.state.Close()
	}
}

// Run builds the signer and serves until ctx is done.
func Run(ctx context.Context, cfg Config, opts Options) error {
	s, err := New(ctx, cfg, opts)
	if err != nil {
		return err
	}
	return s.Serve(ctx, opts.Ready)
}

// AuditReport is what VerifyAudit found.
type AuditReport struct {
	Records int
	// Torn is set when the last line is a write never acknowledged.
	Torn bool
}

// VerifyAudit checks the hash chain of the audit log in a signer's state
// dir (what `mesh-signer audit verify` runs); the error names the line where
// the chain breaks.
func VerifyAudit(stateDir string) (AuditReport, error) {
	rep, err := audit.Verify(filepath.Join(stateDir, "audit.log"))
	return AuditReport{Records: rep.Records, Torn: rep.Torn}, err
}
