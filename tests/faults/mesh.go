// Package faults is mesh's fault harness (issue "Faults, fuzzing and
// hostile input"): the whole mesh as separate processes — a real
// nats-server with JetStream fsyncing every write, the catalog, the signer,
// one or two composers and the node engines, each a child process over real
// mTLS on loopback — a recorder of every write JetStream acknowledged and
// every commit an engine made, named fault scenarios, and a checker of four
// invariants over what was recorded:
//
//  1. nothing a current manifest names is ever missing (its compositions and
//     the objects they name are held, with the digests it says);
//  2. no engine applies a lower manifest revision, or another digest at the
//     same revision;
//  3. no engine applies anything failing keyset, signature, node, expiry or
//     digest checks, judged apart from the engine against the pinned roots;
//  4. the fleet converges within ConvergeBound after the fault is healed.
//
// Each scenario is randomized by a seed it prints (MESH_FAULTS_SEED replays
// one), runs CIIterations times, or LongIterations with -long or
// MESH_LONG_TESTS=1.
package faults

import (
	"context"
	"crypto/ed25519"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.yaml.in/yaml/v3"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/encoding/protojson"

	"mesh.dev/internal/config"
	"mesh.dev/internal/identity"
	"mesh.dev/internal/keyfile"
	"mesh.dev/internal/natsx"
	"mesh.dev/internal/testutil"
	catalogv1 "mesh.dev/proto/mesh/catalog/v1"
	composerv1 "mesh.dev/proto/mesh/composer/v1"
	nodeenginev1 "mesh.dev/proto/mesh/nodeengine/v1"
	catalogapp "mesh.dev/services/catalog/app"
	composerapp "mesh.dev/services/composer/app"
	nodeengineapp "mesh.dev/services/nodeengine/app"
	signerapp "mesh.dev/services/signer/app"
	"mesh.dev/tests/internal/procmesh"
)

// Prefixes are the engines' allowed prefixes and the signer's own-prefixes.
var Prefixes = []string{"/etc", "/opt", "/srv", "/usr/local", "/var/lib"}

// startTimeout bounds how long a process has to become ready.
const startTimeout = 60 * time.Second

// LeaseTTL of the composers: short, so that a takeover after a kill is
// quick (DESIGN.md §5.2.9: within the TTL).
const LeaseTTL = 4 * time.Second

// Options shape a mesh.
type Options struct {
	// Nodes run an engine each (default ace, bay, cod).
	Nodes []string
	// Composers is the number of composer replicas (default 1).
	Composers int
	// ClockOffset skews an engine's clock.
	ClockOffset map[string]time.Duration
	// SmallWindows gives the engines' connections HTTP/2 windows of 64 KiB
	// (fixed) instead of mesh's 1 MiB stream and 4 MiB connection windows,
	// so a stopped engine's stream fills within a few changes.
	SmallWindows bool
	// ManifestLifetime is the signer's manifest lifetime (its default, 24h,
	// when 0).
	ManifestLifetime time.Duration
}

// Mesh is a running multi-process mesh and its recorder.
type Mesh struct {
	t    *testing.T
	Dir  string
	opts Options

	PKI   *testutil.PKI
	Trust *testutil.Trust
	// SigningKey is the signer's current online key; Keyset the keyset it
	// serves.
	SigningKey ed25519.PrivateKey
	Keyset     *Keyset
	RootsFile  string

	NATS      *NATSServer
	Catalog   *Service
	Signer    *Service
	Composers []*Service
	Engines   []*Engine

	nc  *nats.Conn
	JS  jetstream.JetStream
	Rec *Recorder

	catalogClient  catalogv1.CatalogServiceClient
	composerClient composerv1.ComposerServiceClient
}

// Engine is one node engine and the proxy it reaches the composers through.
type Engine struct {
	*Service
	Node    string
	Root    string
	Commits string
	Proxy   *Proxy
	Offset  time.Duration
	admin   nodeenginev1.NodeEngineServiceClient
}

// Start runs a mesh until the test ends.
func Start(t *testing.T, opts Options) *Mesh {
	t.Helper()
	if len(opts.Nodes) == 0 {
		opts.Nodes = []string{"ace", "bay", "cod"}
	}
	if opts.Composers == 0 {
		opts.Composers = 1
	}
	dir := t.TempDir()
	m := &Mesh{t: t, Dir: dir, opts: opts, PKI: testutil.NewPKI(t), Trust: testutil.NewTrust(t, 1, 1)}
	for _, d := range []string{"logs", "config", "nats", "signer", "snapshots"} {
		must(t, os.MkdirAll(filepath.Join(dir, d), 0o700))
	}
	t.Cleanup(m.stopAll)

	// Trust: pinned roots, the signer's key and the keyset v1 the roots
	// sign for it.
	m.RootsFile = filepath.Join(dir, "roots.json")
	must(t, keyfile.WriteJSON(m.RootsFile, m.Trust.Roots, 0o644))
	m.SigningKey = m.Trust.SigningKey
	m.Keyset = &Keyset{Version: 1, Keys: []KeysetKey{{Key: m.SigningKey, State: KeyActive}}}
	m.writeSignerKey()

	m.NATS = m.startNATS()
	m.connectNATS()
	m.Rec = NewRecorder(t, m)

	m.Catalog = m.newService("catalog", roleCatalog, catalogapp.Config{
		Listen: freeAddr(t), MetricsListen: catalogapp.MetricsOff,
		CertFile: m.cert(identity.RoleCatalog, ""), KeyFile: m.key(identity.RoleCatalog, ""), CAFile: m.PKI.CAFile(),
		NATS: natsx.ServiceConfig{URL: m.NATS.URL},
	}, childSpec{})
	m.Catalog.Start()

	m.Signer = m.newService("signer", roleSigner, signerapp.Config{
		Listen:   freeAddr(t),
		CertFile: m.cert(identity.RoleSigner, ""), KeyFile: m.key(identity.RoleSigner, ""), CAFile: m.PKI.CAFile(),
		SigningKeyFile: m.signingKeyFile(), KeysetFile: m.keysetFile(), RootsFile: m.RootsFile,
		StateDir: filepath.Join(dir, "signer", "state"), OwnPrefixes: Prefixes, CatalogAddr: m.Catalog.Addr,
		KeysetReload: config.Duration(200 * time.Millisecond), ManifestLifetime: config.Duration(opts.ManifestLifetime),
	}, childSpec{Faults: filepath.Join(dir, "signer", "faults.json")})
	m.Signer.Start()

	var composerAddrs []string
	for i := 1; i <= opts.Composers; i++ {
		c := m.newService(fmt.Sprintf("composer-%d", i), roleComposer, composerapp.Config{
			Listen: freeAddr(t), MetricsListen: "",
			CertFile: m.cert(identity.RoleComposer, ""), KeyFile: m.key(identity.RoleComposer, ""), CAFile: m.PKI.CAFile(),
			RootsFile: m.RootsFile, SignerAddr: m.Signer.Addr, CatalogAddr: m.Catalog.Addr,
			NATS: natsx.ServiceConfig{URL: m.NATS.URL}, LeaseTTL: config.Duration(LeaseTTL),
			Workers: 8, Holder: fmt.Sprintf("composer-%d", i),
		}, childSpec{})
		c.Start()
		m.Composers = append(m.Composers, c)
		composerAddrs = append(composerAddrs, c.Addr)
	}
	m.catalogClient = catalogv1.NewCatalogServiceClient(m.dial(m.Catalog.Addr, identity.RoleBuilder, "ci"))
	// Operator calls go to the replicas in turn (any replica serves reads;
	// writes the holder takes: see composerCall).
	m.composerClient = composerv1.NewComposerServiceClient(m.dial(m.Composers[0].Addr, identity.RoleOperator, "admin"))

	for _, node := range opts.Nodes {
		m.Engines = append(m.Engines, m.newEngine(node, composerAddrs))
	}
	for _, e := range m.Engines {
		e.Start()
	}
	return m
}

func (m *Mesh) newEngine(node string, composers []string) *Engine {
	t := m.t
	p, err := NewProxy(composers)
	must(t, err)
	t.Cleanup(p.Close)
	dir := filepath.Join(m.Dir, "nodes", node)
	root := filepath.Join(dir, "root")
	must(t, os.MkdirAll(root, 0o755))
	admin := freeAddr(t)
	svc := m.newService("engine-"+node, roleEngine, nodeengineapp.Config{
		Root: root, StateDir: filepath.Join(dir, "state"), RootsFile: m.RootsFile, AllowPrefixes: Prefixes,
		ComposerAddr: p.Addr(), CatalogAddr: m.Catalog.Addr, AdminListen: admin,
		CertFile: m.cert(identity.RoleNode, node), KeyFile: m.key(identity.RoleNode, node), CAFile: m.PKI.CAFile(),
	}, childSpec{ClockOffset: m.opts.ClockOffset[node], Commits: filepath.Join(dir, "commits.jsonl"), Faults: filepath.Join(dir, "faults.json"), SmallWindows: m.opts.SmallWindows})
	svc.Addr = admin
	e := &Engine{Service: svc, Node: node, Root: root, Commits: svc.spec.Commits, Proxy: p, Offset: m.opts.ClockOffset[node]}
	e.admin = nodeenginev1.NewNodeEngineServiceClient(m.dial(admin, identity.RoleOperator, "admin"))
	m.Rec.watchEngine(e)
	return e
}

// Engine returns the engine of a node.
func (m *Mesh) Engine(node string) *Engine {
	for _, e := range m.Engines {
		if e.Node == node {
			return e
		}
	}
	m.t.Fatalf("no engine of node %s", node)
	return nil
}

func (m *Mesh) cert(role identity.Role, name string) string {
	c, _, _ := m.PKI.Files(m.t, m.PKI.Identity(role, name))
	return c
}

func (m *Mesh) key(role identity.Role, name string) string {
	_, k, _ := m.PKI.Files(m.t, m.PKI.Identity(role, name))
	return k
}

func (m *Mesh) signingKeyFile() string { return filepath.Join(m.Dir, "signer", "signing-key.pem") }
func (m *Mesh) keysetFile() string     { return filepath.Join(m.Dir, "signer", "keyset.json") }

// writeSignerKey writes the signer's current key and keyset files.
func (m *Mesh) writeSignerKey() {
	must(m.t, os.RemoveAll(m.signingKeyFile()))
	must(m.t, keyfile.Write(m.signingKeyFile(), m.SigningKey))
	m.writeKeyset()
}

// writeKeyset signs m.Keyset with the roots and writes it where the signer
// reloads it from (atomically: the signer never reads half a file).
func (m *Mesh) writeKeyset() {
	env := m.Keyset.Sign(m.t, m.Trust)
	tmp := m.keysetFile() + ".tmp"
	must(m.t, keyfile.WriteJSON(tmp, env, 0o644))
	must(m.t, os.Rename(tmp, m.keysetFile()))
}

func (m *Mesh) dial(addr string, role identity.Role, name string) *grpc.ClientConn {
	return testutil.Dial(m.t, m.PKI, addr, m.PKI.Identity(role, name))
}

// Service is one child process of the mesh.
type Service struct {
	Name string
	// Addr is its gRPC address (fixed across restarts).
	Addr     string
	m        *Mesh
	spec     childSpec
	specFile string
	logPath  string
	proc     *procmesh.Proc
}

func (m *Mesh) newService(name, role string, cfg any, spec childSpec) *Service {
	t := m.t
	b, err := yaml.Marshal(cfg)
	must(t, err)
	cfgFile := filepath.Join(m.Dir, "config", name+".yaml")
	must(t, os.WriteFile(cfgFile, b, 0o600))
	spec.Role, spec.Config = role, cfgFile
	spec.Ready = filepath.Join(m.Dir, "config", name+".ready")
	specFile := filepath.Join(m.Dir, "config", name+".spec.json")
	sb, err := json.Marshal(spec)
	must(t, err)
	must(t, os.WriteFile(specFile, sb, 0o600))
	var addr string
	var probe struct {
		Listen string `yaml:"listen"`
	}
	if yaml.Unmarshal(b, &probe) == nil {
		addr = probe.Listen
	}
	return &Service{Name: name, Addr: addr, m: m, spec: spec, specFile: specFile, logPath: filepath.Join(m.Dir, "logs", name+".log")}
}

// Start starts the process and waits until it serves.
func (s *Service) Start() {
	t := s.m.t
	t.Helper()
	_ = os.Remove(s.spec.Ready)
	p, err := procmesh.StartProc(s.Name, s.logPath, "", []string{childEnv + "=" + s.specFile}, os.Args[0], "-test.run=^$")
	must(t, err)
	s.proc = p
	deadline := time.Now().Add(startTimeout)
	for {
		if err, ended := p.Exited(); ended {
			t.Fatalf("%s ended while starting: %v\n%s", s.Name, err, p.Output(16<<10))
		}
		if _, err := os.Stat(s.spec.Ready); err == nil && s.healthy() == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s not ready within %s: %v\n%s", s.Name, startTimeout, s.healthy(), p.Output(16<<10))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// healthy asks the service's gRPC health as an operator.
func (s *Service) healthy() error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	conn := testutil.Dial(s.m.t, s.m.PKI, s.Addr, s.m.PKI.Identity(identity.RoleOperator, "admin"))
	defer conn.Close()
	return testutil.Serving(ctx, conn)
}

// Running reports whether the process runs.
func (s *Service) Running() bool {
	if s.proc == nil {
		return false
	}
	_, ended := s.proc.Exited()
	return !ended
}

// Pid is the process id of the running process.
func (s *Service) Pid() int { return s.proc.Pid() }

// Kill kills the process with SIGKILL (a crash, a power loss of its machine
// as far as its own state goes).
func (s *Service) Kill() {
	if s.Running() {
		s.proc.Kill()
	}
}

// WaitEnded waits until the process ended (killed by someone else).
func (s *Service) WaitEnded(d time.Duration) {
	select {
	case <-s.proc.Done():
	case <-time.After(d):
		s.m.t.Fatalf("%s still runs %s after it should have ended", s.Name, d)
	}
}

// Stop stops the process with SIGTERM (graceful).
func (s *Service) Stop() {
	if s.Running() {
		if err := s.proc.Stop(); err != nil {
			s.m.t.Errorf("%s: %v", s.Name, err)
		}
	}
}

// Opened runs the engine's process only to open it — which finishes or
// rolls back a journal a kill left, and runs no pass and no stream — and
// returns its status as it stood then: its kept state after the replay
// and before anything else could touch the disk. The engine must not run.
func (e *Engine) Opened() *nodeenginev1.GetStatusResponse {
	t := e.m.t
	t.Helper()
	spec := e.spec
	spec.OpenOnly = filepath.Join(e.m.Dir, "config", e.Name+".opened.json")
	_ = os.Remove(spec.OpenOnly)
	specFile := e.specFile + ".open"
	b, err := json.Marshal(spec)
	must(t, err)
	must(t, os.WriteFile(specFile, b, 0o600))
	p, err := procmesh.StartProc(e.Name+"-open", e.logPath, "", []string{childEnv + "=" + specFile}, os.Args[0], "-test.run=^$")
	must(t, err)
	select {
	case <-p.Done():
	case <-time.After(startTimeout):
		p.Kill()
		t.Fatalf("%s: opening it alone did not end within %s\n%s", e.Name, startTimeout, p.Output(16<<10))
	}
	b, err = os.ReadFile(spec.OpenOnly)
	if err != nil {
		t.Fatalf("%s: opened alone, it wrote no status: %v\n%s", e.Name, err, p.Output(16<<10))
	}
	st := &nodeenginev1.GetStatusResponse{}
	must(t, protojson.Unmarshal(b, st))
	return st
}

// Pause stops the process in place (SIGSTOP): it holds its connections
// and reads nothing, as a process stalled by a GC storm or a VM pause.
func (s *Service) Pause() { must(s.m.t, s.proc.Signal(syscall.SIGSTOP)) }

// Resume continues a paused process.
func (s *Service) Resume() { must(s.m.t, s.proc.Signal(syscall.SIGCONT)) }

// Output is the end of the process's log.
func (s *Service) Output(n int64) string {
	if s.proc == nil {
		return ""
	}
	return s.proc.Output(n)
}

// stopAll stops everything: engines, composers, signer, catalog, NATS.
func (m *Mesh) stopAll() {
	var all []*Service
	for _, e := range m.Engines {
		all = append(all, e.Service)
	}
	all = append(all, m.Composers...)
	all = append(all, m.Signer, m.Catalog)
	for _, s := range all {
		if s == nil || s.proc == nil {
			continue
		}
		if s.Running() {
			_ = s.proc.Signal(syscall.SIGCONT)
		}
		s.Kill()
	}
	if m.Rec != nil {
		m.Rec.stop()
	}
	if m.nc != nil {
		m.nc.Close()
	}
	if m.NATS != nil {
		m.NATS.Kill()
	}
	if m.t.Failed() {
		for _, s := range all {
			if s != nil && s.proc != nil {
				m.t.Logf("=== end of the log of %s ===\n%s", s.Name, s.Output(24<<10))
			}
		}
		if m.NATS != nil && m.NATS.proc != nil {
			m.t.Logf("=== end of the log of nats-server ===\n%s", m.NATS.proc.Output(8<<10))
		}
	}
}

// NATSServer is the nats-server process, JetStream in a dir of the test's,
// every write fsynced before it is acknowledged (DESIGN.md §9).
type NATSServer struct {
	URL, Monitor, StoreDir, conf, logPath string
	bin                                   string
	proc                                  *procmesh.Proc
	t                                     *testing.T
}

func (m *Mesh) startNATS() *NATSServer {
	t := m.t
	port, mon := testutil.FreePort(t), testutil.FreePort(t)
	s := &NATSServer{URL: fmt.Sprintf("nats://127.0.0.1:%d", port), Monitor: fmt.Sprintf("127.0.0.1:%d", mon),
		StoreDir: filepath.Join(m.Dir, "nats", "store"), logPath: filepath.Join(m.Dir, "logs", "nats-server.log"),
		bin: procmesh.Tool(t, "nats-server"), t: t}
	s.conf = filepath.Join(m.Dir, "config", "nats-server.conf")
	must(t, os.WriteFile(s.conf, []byte(fmt.Sprintf(`server_name: mesh-faults
listen: "127.0.0.1:%d"
http: "127.0.0.1:%d"
max_payload: 8MB
jetstream {
  store_dir: %q
  sync_interval: always
}
`, port, mon, s.StoreDir)), 0o600))
	s.Start()
	return s
}

// Start starts nats-server and waits until JetStream answers.
func (s *NATSServer) Start() {
	must(s.t, s.start())
}

// start is Start for a goroutine other than the test's: it returns why
// nats-server did not start instead of failing the test.
func (s *NATSServer) start() error {
	p, err := procmesh.StartProc("nats-server", s.logPath, "", nil, s.bin, "-c", s.conf)
	if err != nil {
		return err
	}
	s.proc = p
	deadline := time.Now().Add(startTimeout)
	for {
		if err, ended := p.Exited(); ended {
			return fmt.Errorf("nats-server ended while starting: %v\n%s", err, p.Output(8<<10))
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_, err := procmesh.HTTPGet(ctx, "http://"+s.Monitor+"/healthz?js-enabled-only=true")
		cancel()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("nats-server not ready within %s: %v", startTimeout, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Stop stops nats-server gracefully (SIGTERM: it flushes and closes its
// stores).
func (s *NATSServer) Stop() {
	if _, ended := s.proc.Exited(); !ended {
		if err := s.proc.Stop(); err != nil {
			s.t.Errorf("nats-server: %v", err)
		}
	}
}

// Kill kills nats-server with SIGKILL.
func (s *NATSServer) Kill() {
	if s.proc != nil {
		if _, ended := s.proc.Exited(); !ended {
			s.proc.Kill()
		}
	}
}

// Snapshot copies the JetStream store of a stopped server.
func (s *NATSServer) Snapshot(dst string) {
	must(s.t, os.CopyFS(dst, os.DirFS(s.StoreDir)))
}

// Restore replaces the store of a stopped server with a snapshot: what a
// power loss does to a disk that lied about its fsyncs, or a restore of a
// machine image, and which kill -9 never does.
func (s *NATSServer) Restore(src string) {
	must(s.t, os.RemoveAll(s.StoreDir))
	must(s.t, os.CopyFS(s.StoreDir, os.DirFS(src)))
}

// connectNATS connects the test's recorder and checker to JetStream; the
// connection reconnects for ever (nats-server is restarted by scenarios).
func (m *Mesh) connectNATS() {
	nc, err := nats.Connect(m.NATS.URL, nats.Name("mesh-faults-recorder"), nats.MaxReconnects(-1),
		nats.ReconnectWait(100*time.Millisecond), nats.RetryOnFailedConnect(true))
	must(m.t, err)
	m.nc = nc
	js, err := jetstream.New(nc)
	must(m.t, err)
	m.JS = js
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func freeAddr(t testing.TB) string { return testutil.FreeAddr(t) }
