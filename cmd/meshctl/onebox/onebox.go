package onebox

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"google.golang.org/grpc"

	"mesh.dev/internal/config"
	"mesh.dev/internal/grpcclient"
	"mesh.dev/internal/identity"
	"mesh.dev/internal/natsx"
	"mesh.dev/internal/pki"
	"mesh.dev/internal/telemetry"
	nodeenginev1 "mesh.dev/proto/mesh/nodeengine/v1"
	catalogapp "mesh.dev/services/catalog/app"
	composerapp "mesh.dev/services/composer/app"
	nodeengineapp "mesh.dev/services/nodeengine/app"
	signerapp "mesh.dev/services/signer/app"
)

// Prefixes are the paths the dev mesh's engines may write under (inside
// their root dirs) and the signer's own-prefixes.
var Prefixes = []string{"/etc", "/opt", "/srv", "/usr/local", "/var/lib"}

// Options configure a one-process mesh.
type Options struct {
	// DataDir holds certificates, keys, JetStream, the signer's state and
	// each node's root and state; a second start reuses it.
	DataDir string
	// Nodes is how many node engines run, named NodeName(i); zero runs
	// none (the catalog, signer and composer only: tests that run their
	// own engines, composer benchmarks). meshctl dev defaults it to 3.
	Nodes int
	// NodesDir holds each node's root and state dir (default
	// DataDir/nodes); benchmarks put it on a tmpfs.
	NodesDir string
	// BasePort places the services on fixed loopback ports: catalog
	// BasePort+1, signer +2, composer +3, engine i +10+i, NATS +22, and
	// metrics +100... Zero picks free ports (tests).
	BasePort int
	// LogOutput receives every service's JSON log lines (default: discard).
	LogOutput io.Writer
	// SpanExporter, when set, receives every service's spans (tests); the
	// OTEL_* variables configure export otherwise.
	SpanExporter sdktrace.SpanExporter
	// DriftInterval of the engines (default the engine's).
	DriftInterval time.Duration
	// LazySync runs the embedded JetStream with the server's default
	// periodic fsync instead of sync_interval always (DESIGN.md §9's
	// one-machine default); benchmarks compare the two.
	LazySync bool
	// ComposerWorkers is how many nodes the composer composes at once
	// (default the composer's).
	ComposerWorkers int
}

// NodeName names the i-th node (from 1).
func NodeName(i int) string { return "dev-" + strconv.Itoa(i) }

// Engine is one running node engine.
type Engine struct {
	Node  string
	Admin string
	Root  string
	State string
	// Status, FirstViews and Changed read the running engine in this
	// process without the admin API (benchmarks, tests): what GetStatus
	// and FirstViews answer, and a channel closed at the next change of
	// its haves.
	Status     func() *nodeenginev1.GetStatusResponse
	FirstViews func() *nodeenginev1.FirstViewsResponse
	Changed    func() <-chan struct{}
}

// Mesh is a running one-process mesh.
type Mesh struct {
	Dir      string
	CertsDir string
	NATSURL  string
	Catalog  string
	Signer   string
	Composer string
	Engines  []Engine
	// JetStream is a client of the embedded server.
	JetStream jetstream.JetStream
	// Composers are the running composer (tests reach into it).
	ComposerApp *composerapp.Composer

	l      layout
	cancel context.CancelFunc
	wg     sync.WaitGroup
	mu     sync.Mutex
	errs   []error
	closer []func()
	nc     *nats.Conn
	tels   []*telemetry.Telemetry
}

func (m *Mesh) fail(name string, err error) {
	if err == nil || errors.Is(err, context.Canceled) {
		return
	}
	m.mu.Lock()
	m.errs = append(m.errs, fmt.Errorf("%s: %w", name, err))
	m.mu.Unlock()
}

// Err returns the errors services ended with.
func (m *Mesh) Err() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	return errors.Join(m.errs...)
}

// Stop stops every service and waits for them.
func (m *Mesh) Stop() {
	m.cancel()
	m.wg.Wait()
	for i := len(m.closer) - 1; i >= 0; i-- {
		m.closer[i]()
	}
	m.closer = nil
}

func (m *Mesh) run(name string, f func(ctx context.Context) error, ctx context.Context) {
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		m.fail(name, f(ctx))
	}()
}

// listener opens a loopback listener on base+offset, or a free port.
func listener(base, offset int) (net.Listener, error) {
	addr := "127.0.0.1:0"
	if base > 0 {
		addr = "127.0.0.1:" + strconv.Itoa(base+offset)
	}
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w (another meshctl dev running? pass --base-port)", addr, err)
	}
	return lis, nil
}

// identityOf returns a dev identity.
func identityOf(role identity.Role, name string) identity.Identity {
	if role.IsService() {
		name = string(role)
	}
	return identity.Identity{TrustDomain: TrustDomain, Role: role, Name: name}
}

// Start makes (or reuses) the data dir and starts the mesh; it returns once
// every service listens.
func Start(ctx context.Context, opts Options) (_ *Mesh, err error) {
	if opts.DataDir == "" {
		return nil, errors.New("onebox: no data dir")
	}
	if opts.Nodes < 0 {
		return nil, fmt.Errorf("onebox: %d nodes", opts.Nodes)
	}
	if opts.LogOutput == nil {
		opts.LogOutput = io.Discard
	}
	natsLog := slog.New(slog.NewJSONHandler(opts.LogOutput, nil)).With("service", "meshdev-nats")
	dir, err := filepath.Abs(opts.DataDir)
	if err != nil {
		return nil, err
	}
	l := layout{dir: dir, nodes: filepath.Join(dir, "nodes")}
	if opts.NodesDir != "" {
		if l.nodes, err = filepath.Abs(opts.NodesDir); err != nil {
			return nil, err
		}
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	ids := []identity.Identity{identityOf(identity.RoleCatalog, ""), identityOf(identity.RoleSigner, ""), identityOf(identity.RoleComposer, ""),
		identityOf(identity.RoleOperator, "admin"), identityOf(identity.RoleBuilder, "ci")}
	for i := 1; i <= opts.Nodes; i++ {
		ids = append(ids, identityOf(identity.RoleNode, NodeName(i)))
	}
	if err := l.ensureCerts(ids); err != nil {
		return nil, err
	}
	if err := l.ensureTrust(time.Now()); err != nil {
		return nil, err
	}

	runCtx, cancel := context.WithCancel(context.Background())
	m := &Mesh{Dir: dir, CertsDir: l.certs(), l: l, cancel: cancel}
	defer func() {
		if err != nil {
			m.Stop()
		}
	}()

	// Telemetry: one provider per service, so each span names its service.
	tel := func(service string) (*telemetry.Telemetry, error) {
		t, err := telemetry.Setup(ctx, telemetry.Config{ServiceName: service, SpanExporter: opts.SpanExporter, LogOutput: opts.LogOutput})
		if err != nil {
			return nil, err
		}
		m.tels = append(m.tels, t)
		m.closer = append(m.closer, func() { t.Shutdown(context.Background()) })
		return t, nil
	}

	// JetStream: an embedded server with sync_interval always (unless a
	// benchmark asks for lazy sync).
	natsPort := 0
	if opts.BasePort > 0 {
		natsPort = opts.BasePort + 22
	}
	emb, err := natsx.StartEmbedded(natsx.EmbeddedConfig{DataDir: l.nats(), Port: natsPort, SyncAlways: !opts.LazySync, ServerName: "meshdev"})
	if err != nil {
		if natsPort > 0 && strings.Contains(err.Error(), "address already in use") {
			return nil, fmt.Errorf("%w (another meshctl dev? --base-port moves every port)", err)
		}
		return nil, err
	}
	m.closer = append(m.closer, emb.Shutdown)
	m.NATSURL = emb.ClientURL()
	nc, js, err := natsx.Connect(ctx, natsx.ConnConfig{Name: "meshdev", InProcess: emb.Server(), Logger: natsLog})
	if err != nil {
		return nil, err
	}
	m.closer = append(m.closer, nc.Close)
	m.nc, m.JetStream = nc, js

	// Catalog.
	clis, err := listener(opts.BasePort, 1)
	if err != nil {
		return nil, err
	}
	m.Catalog = clis.Addr().String()
	ct, err := tel("mesh-catalog")
	if err != nil {
		return nil, err
	}
	cert, key, ca := l.certFiles(identityOf(identity.RoleCatalog, ""))
	cat, err := catalogapp.New(ctx, catalogapp.Config{Listen: m.Catalog, MetricsListen: catalogapp.MetricsOff, CertFile: cert, KeyFile: key, CAFile: ca},
		catalogapp.Options{Logger: ct.Logger, TracerProvider: ct.TracerProvider, MeterProvider: ct.MeterProvider, JetStream: js, Listener: clis})
	if err != nil {
		clis.Close()
		return nil, fmt.Errorf("catalog: %w", err)
	}
	m.run("catalog", func(ctx context.Context) error { return cat.Serve(ctx, nil) }, runCtx)

	// Signer.
	slis, err := listener(opts.BasePort, 2)
	if err != nil {
		return nil, err
	}
	m.Signer = slis.Addr().String()
	st, err := tel("mesh-signer")
	if err != nil {
		return nil, err
	}
	cert, key, ca = l.certFiles(identityOf(identity.RoleSigner, ""))
	sig, err := signerapp.New(ctx, signerapp.Config{
		Listen: m.Signer, CertFile: cert, KeyFile: key, CAFile: ca, SigningKeyFile: l.signingKey(), KeysetFile: l.keyset(),
		RootsFile: l.roots(), StateDir: l.signerState(), OwnPrefixes: Prefixes, CatalogAddr: m.Catalog,
	}, signerapp.Options{Logger: st.Logger, TracerProvider: st.TracerProvider, MeterProvider: st.MeterProvider, Listener: slis})
	if err != nil {
		slis.Close()
		return nil, fmt.Errorf("signer: %w", err)
	}
	m.run("signer", func(ctx context.Context) error { return sig.Serve(ctx, nil) }, runCtx)

	// Composer.
	colis, err := listener(opts.BasePort, 3)
	if err != nil {
		return nil, err
	}
	m.Composer = colis.Addr().String()
	cot, err := tel("mesh-composer")
	if err != nil {
		return nil, err
	}
	cert, key, ca = l.certFiles(identityOf(identity.RoleComposer, ""))
	comp, err := composerapp.New(ctx, composerapp.Config{
		Listen: m.Composer, CertFile: cert, KeyFile: key, CAFile: ca, RootsFile: l.roots(),
		SignerAddr: m.Signer, CatalogAddr: m.Catalog, Holder: "meshdev", Workers: opts.ComposerWorkers,
	}, composerapp.Options{Logger: cot.Logger, TracerProvider: cot.TracerProvider, MeterProvider: cot.MeterProvider, JetStream: js, Listener: colis})
	if err != nil {
		colis.Close()
		return nil, fmt.Errorf("composer: %w", err)
	}
	m.ComposerApp = comp
	m.run("composer", func(ctx context.Context) error { return comp.Serve(ctx, nil) }, runCtx)

	// Node engines.
	for i := 1; i <= opts.Nodes; i++ {
		node := NodeName(i)
		root, state, err := l.prepareNode(node)
		if err != nil {
			return nil, err
		}
		alis, err := listener(opts.BasePort, 10+i)
		if err != nil {
			return nil, err
		}
		et, err := tel("mesh-nodeengine-" + node)
		if err != nil {
			return nil, err
		}
		cert, key, ca := l.certFiles(identityOf(identity.RoleNode, node))
		cfg := nodeengineapp.Config{Root: root, StateDir: state, RootsFile: l.roots(), AllowPrefixes: Prefixes,
			ComposerAddr: m.Composer, CatalogAddr: m.Catalog, AdminListen: alis.Addr().String(), CertFile: cert, KeyFile: key, CAFile: ca}
		if opts.DriftInterval > 0 {
			cfg.DriftInterval = config.Duration(opts.DriftInterval)
		}
		eng, err := nodeengineapp.New(ctx, cfg, nodeengineapp.Options{Logger: et.Logger, TracerProvider: et.TracerProvider,
			MeterProvider: et.MeterProvider, AdminListener: alis})
		if err != nil {
			alis.Close()
			return nil, fmt.Errorf("node engine %s: %w", node, err)
		}
		core := eng.Engine
		m.Engines = append(m.Engines, Engine{Node: node, Admin: alis.Addr().String(), Root: root, State: state,
			Status: core.Status, FirstViews: core.FirstViews, Changed: core.Changed})
		m.run("node engine "+node, eng.Run, runCtx)
	}
	sort.Slice(m.Engines, func(i, j int) bool { return m.Engines[i].Node < m.Engines[j].Node })
	return m, nil
}

// Dial connects to one of the mesh's services as an identity of the dev CA.
func (m *Mesh) Dial(addr string, role identity.Role, name string) (*grpc.ClientConn, error) {
	cert, key, ca := m.l.certFiles(identityOf(role, name))
	cfg, err := pki.ClientTLS(cert, key, ca)
	if err != nil {
		return nil, err
	}
	return grpcclient.Dial(addr, cfg)
}

// CertFiles returns the certificate, key and CA files of an identity (for
// the grpcurl commands meshctl dev prints).
func (m *Mesh) CertFiles(role identity.Role, name string) (cert, key, ca string) {
	return m.l.certFiles(identityOf(role, name))
}

// NodeIdentity makes (once) a certificate of the dev CA for a node engine
// the mesh does not run itself (a test's child process) and returns its
// certificate, key and CA files.
func (m *Mesh) NodeIdentity(node string) (cert, key, ca string, err error) {
	id := identityOf(identity.RoleNode, node)
	if err := m.l.ensureCerts([]identity.Identity{id}); err != nil {
		return "", "", "", err
	}
	cert, key, ca = m.l.certFiles(id)
	return cert, key, ca, nil
}

// RootsFile is the pinned roots file.
func (m *Mesh) RootsFile() string { return m.l.roots() }
