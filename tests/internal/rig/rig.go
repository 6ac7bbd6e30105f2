// Package rig starts the real mesh in a test's process for hostile-input
// and certificate tests: an embedded JetStream, the catalog, the signer and
// the composer over real mTLS, node engines on their own root dirs, and a
// hostile composer that feeds an engine signed content of the test's
// choosing. Handler invocations of the catalog, the signer and the engines
// are counted by interceptors that run inside authorization.
package rig

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/grpc"

	"mesh.dev/internal/config"
	"mesh.dev/internal/identity"
	"mesh.dev/internal/keyfile"
	"mesh.dev/internal/natsx"
	"mesh.dev/internal/testutil"
	catalogapp "mesh.dev/services/catalog/app"
	composerapp "mesh.dev/services/composer/app"
	nodeengineapp "mesh.dev/services/nodeengine/app"
	signerapp "mesh.dev/services/signer/app"
)

// OwnPrefixes are the signer's own-prefixes and the engines' allowed
// prefixes.
var OwnPrefixes = []string{"/etc", "/opt", "/srv"}

// Counter counts handler invocations by full method. Its interceptors are
// given as grpcserver ServerOptions, which run inside authorization: a call
// refused by authentication or authorization never reaches them.
type Counter struct {
	mu    sync.Mutex
	calls map[string]int
}

// NewCounter returns an empty counter.
func NewCounter() *Counter { return &Counter{calls: map[string]int{}} }

// Add counts one invocation of method.
func (c *Counter) Add(method string) {
	c.mu.Lock()
	c.calls[method]++
	c.mu.Unlock()
}

// ServerOptions are the counting interceptors.
func (c *Counter) ServerOptions() []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.ChainUnaryInterceptor(func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
			c.Add(info.FullMethod)
			return h(ctx, req)
		}),
		grpc.ChainStreamInterceptor(func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
			c.Add(info.FullMethod)
			return h(srv, ss)
		}),
	}
}

// Total returns how many handler invocations were counted, leaving out the
// health service (which every client may call).
func (c *Counter) Total() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for m, k := range c.calls {
		if !strings.HasPrefix(m, "/grpc.health.") && !strings.HasPrefix(m, "/grpc.reflection.") {
			n += k
		}
	}
	return n
}

// Of returns the invocations of one method.
func (c *Counter) Of(method string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.calls[method]
}

// Mesh is a running catalog, signer and composer.
type Mesh struct {
	PKI   *testutil.PKI
	Trust *testutil.Trust
	Dir   string
	JS    jetstream.JetStream
	NATS  *natsx.Embedded

	CatalogAddr, SignerAddr, ComposerAddr string
	// CatalogCalls and SignerCalls count the handler invocations of the
	// catalog and the signer.
	CatalogCalls, SignerCalls *Counter
	Composer                  *composerapp.Composer
	RootsFile, KeysetFile     string
	SigningKeyFile            string
}

// Options change what Start runs.
type Options struct {
	// NoComposer starts only the catalog and the signer.
	NoComposer bool
}

// Logger logs warnings and errors to the test until it ends.
func Logger(t testing.TB) *slog.Logger {
	w := &logWriter{t: t}
	t.Cleanup(func() {
		w.mu.Lock()
		w.done = true
		w.mu.Unlock()
	})
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelError}))
}

type logWriter struct {
	t    testing.TB
	mu   sync.Mutex
	done bool
}

func (w *logWriter) Write(b []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.done {
		w.t.Log(strings.TrimSpace(string(b)))
	}
	return len(b), nil
}

// Listen opens a loopback listener on a free port.
func Listen(t testing.TB) net.Listener {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return lis
}

// serve runs fn until the test ends, then stops it and waits.
func serve(t testing.TB, name string, fn func(ctx context.Context) error) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- fn(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("%s: %v", name, err)
		}
	})
}

// Must fails the test on an error.
func Must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// Start runs the mesh until the test ends.
func Start(t testing.TB, o Options) *Mesh {
	t.Helper()
	m := &Mesh{PKI: testutil.NewPKI(t), Trust: testutil.NewTrust(t, 1, 1), Dir: t.TempDir(),
		CatalogCalls: NewCounter(), SignerCalls: NewCounter()}
	m.NATS = testutil.StartJetStream(t)
	_, m.JS = testutil.ConnectJetStream(t, m.NATS)

	m.CatalogAddr = m.StartCatalog(t, m.CatalogCalls)

	m.RootsFile = filepath.Join(m.Dir, "roots.json")
	m.KeysetFile = filepath.Join(m.Dir, "keyset.json")
	m.SigningKeyFile = filepath.Join(m.Dir, "signer-key.pem")
	Must(t, keyfile.WriteJSON(m.RootsFile, m.Trust.Roots, 0o644))
	Must(t, keyfile.WriteJSON(m.KeysetFile, m.Trust.KeysetEnvelope, 0o644))
	Must(t, keyfile.Write(m.SigningKeyFile, m.Trust.SigningKey))
	m.SignerAddr, _ = m.StartSigner(t, m.SignerCalls)

	if !o.NoComposer {
		m.ComposerAddr, m.Composer = m.StartComposer(t, "rig")
	}
	return m
}

// StartCatalog runs a catalog on the mesh's JetStream (another replica
// when the mesh already runs one), counting its handler invocations, and
// returns its address.
func (m *Mesh) StartCatalog(t testing.TB, calls *Counter) string {
	t.Helper()
	lis := Listen(t)
	var opts []grpc.ServerOption
	if calls != nil {
		opts = calls.ServerOptions()
	}
	cat, err := catalogapp.New(context.Background(), catalogapp.Config{Listen: lis.Addr().String(), MetricsListen: catalogapp.MetricsOff},
		catalogapp.Options{Logger: Logger(t), JetStream: m.JS, Listener: lis, ServerOptions: opts,
			ServerTLS: m.PKI.ServerTLS(t, m.PKI.Identity(identity.RoleCatalog, ""))})
	Must(t, err)
	serve(t, "catalog", func(ctx context.Context) error { return cat.Serve(ctx, nil) })
	return lis.Addr().String()
}

// StartSigner runs a signer with the mesh's key and keyset and a state dir
// of its own, counting its handler invocations; it returns its address and
// state dir. A second signer lets a test fence and sign as the composer
// without disturbing the mesh's composer.
func (m *Mesh) StartSigner(t testing.TB, calls *Counter) (addr, stateDir string) {
	t.Helper()
	lis := Listen(t)
	stateDir = filepath.Join(t.TempDir(), "signer")
	var opts []grpc.ServerOption
	if calls != nil {
		opts = calls.ServerOptions()
	}
	id := m.PKI.Identity(identity.RoleSigner, "")
	sig, err := signerapp.New(context.Background(), signerapp.Config{
		Listen: lis.Addr().String(), SigningKeyFile: m.SigningKeyFile, KeysetFile: m.KeysetFile, RootsFile: m.RootsFile,
		StateDir: stateDir, OwnPrefixes: OwnPrefixes, CatalogAddr: m.CatalogAddr,
	}, signerapp.Options{Logger: Logger(t), Listener: lis, ServerTLS: m.PKI.ServerTLS(t, id), ClientTLS: m.PKI.ClientTLS(t, id), ServerOptions: opts})
	Must(t, err)
	serve(t, "signer", func(ctx context.Context) error { return sig.Serve(ctx, nil) })
	return lis.Addr().String(), stateDir
}

// StartComposer runs a whole composer against the mesh.
func (m *Mesh) StartComposer(t testing.TB, holder string) (string, *composerapp.Composer) {
	t.Helper()
	lis := Listen(t)
	id := m.PKI.Identity(identity.RoleComposer, "")
	c, err := composerapp.New(context.Background(), composerapp.Config{Listen: lis.Addr().String(), SignerAddr: m.SignerAddr,
		CatalogAddr: m.CatalogAddr, Holder: holder, Workers: 4, LeaseTTL: config.Duration(5 * time.Second)},
		composerapp.Options{Logger: Logger(t), JetStream: m.JS, Listener: lis, Roots: m.Trust.Roots,
			ServerTLS: m.PKI.ServerTLS(t, id), ClientTLS: m.PKI.ClientTLS(t, id)})
	Must(t, err)
	serve(t, "composer", func(ctx context.Context) error { return c.Serve(ctx, nil) })
	return lis.Addr().String(), c
}

// Dial connects to addr as role/name over mTLS.
func (m *Mesh) Dial(t testing.TB, addr string, role identity.Role, name string) *grpc.ClientConn {
	t.Helper()
	return testutil.Dial(t, m.PKI, addr, m.PKI.Identity(role, name))
}

// Engine is a running node engine.
type Engine struct {
	Node, Admin, Root, State string
	// Calls counts the admin API's handler invocations.
	Calls *Counter
}

// StartEngine runs the engine of node against composerAddr (the mesh's
// composer or a hostile one) and the mesh's catalog, applying under
// OwnPrefixes inside a root dir of its own.
func (m *Mesh) StartEngine(t testing.TB, node, composerAddr string) *Engine {
	t.Helper()
	dir := t.TempDir()
	e := &Engine{Node: node, Root: filepath.Join(dir, "root"), State: filepath.Join(dir, "state"), Calls: NewCounter()}
	Must(t, os.MkdirAll(e.Root, 0o755))
	lis := Listen(t)
	e.Admin = lis.Addr().String()
	id := m.PKI.Identity(identity.RoleNode, node)
	app, err := nodeengineapp.New(context.Background(), nodeengineapp.Config{Root: e.Root, StateDir: e.State, RootsFile: m.RootsFile,
		AllowPrefixes: OwnPrefixes, ComposerAddr: composerAddr, CatalogAddr: m.CatalogAddr, AdminListen: e.Admin},
		nodeengineapp.Options{Logger: Logger(t), AdminListener: lis, ServerTLS: m.PKI.ServerTLS(t, id), ClientTLS: m.PKI.ClientTLS(t, id),
			ServerOptions: e.Calls.ServerOptions(), EntryBackoffBase: 50 * time.Millisecond,
			SyncBackoffBase: 50 * time.Millisecond, SyncBackoffMax: 500 * time.Millisecond})
	Must(t, err)
	serve(t, "node engine "+node, app.Run)
	return e
}

// Eventually polls cond until it holds or the deadline passes: a wait on a
// condition, not a sleep standing in for synchronisation.
func Eventually(t testing.TB, within time.Duration, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		ok, last := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s (last: %s)", what, within, last)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
