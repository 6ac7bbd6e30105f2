package procmesh

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"mesh.dev/internal/grpcclient"
	"mesh.dev/internal/pki"
	"mesh.dev/internal/testutil"
	"mesh.dev/tests/internal/natsconf"
)

// TrustDomain of the test mesh's certificates.
const TrustDomain = "mesh.test"

// Prefixes are the paths the engines may write under (inside their root
// dirs) and the signer's own-prefixes; every example module's paths lie
// under them.
var Prefixes = []string{"/etc", "/opt", "/srv", "/usr/local", "/var/lib"}

// DefaultNodes are the nodes a mesh runs unless Options names others.
var DefaultNodes = []string{"ace", "bay", "cod"}

// startTimeout bounds how long a process has to become ready.
const startTimeout = 90 * time.Second

// commandTimeout bounds one meshctl (or mesh-signer init) command; a
// variable for this package's own test.
var commandTimeout = 2 * time.Minute

// Options configure a multi-process mesh.
type Options struct {
	// Nodes names the node engines (default DefaultNodes).
	Nodes []string
	// Env is added to the environment of every service process (OTEL_*).
	Env []string
	// NodeEnv, when set, adds to the environment of one node's engine.
	NodeEnv func(node string) []string
}

// Engine is one running node engine.
type Engine struct {
	Node    string
	Admin   string
	Metrics string
	Root    string
	State   string
	Config  string
}

// Mesh is a running multi-process mesh.
type Mesh struct {
	Bin *Binaries
	// Dir holds everything: certs/, keys/, the signer's key and state,
	// nats/, config/, nodes/<name>/{root,state}, specs/ and logs/.
	Dir      string
	CertsDir string
	KeysDir  string
	// NATSURL is the nats-server's client URL (tls://, a client
	// certificate mapped to a NATS user of deploy/nats required);
	// NATSMonitor its monitoring address.
	NATSURL     string
	NATSMonitor string
	Catalog     string
	Signer      string
	Composer    string
	// Metrics is each service's Prometheus address, by process name.
	Metrics map[string]string
	Engines []Engine
	// Procs are the running processes in start order.
	Procs []*Proc

	t    testing.TB
	opts Options
	// natsServers name the nats-server processes StartNATS started.
	natsServers []string
}

// Start makes certificates and keys with the meshctl and mesh-signer
// binaries, writes each service's configuration file, starts nats-server,
// the catalog, the signer, the composer and one engine per node, each as its
// own process, and waits until every one serves. Everything is stopped when
// the test ends, and each process's output goes to the test log if it
// failed.
func Start(t testing.TB, opts Options) *Mesh {
	t.Helper()
	if len(opts.Nodes) == 0 {
		opts.Nodes = DefaultNodes
	}
	bin := Build(t)
	dir := t.TempDir()
	m := &Mesh{Bin: bin, Dir: dir, CertsDir: filepath.Join(dir, "certs"), KeysDir: filepath.Join(dir, "keys"),
		Metrics: map[string]string{}, t: t, opts: opts}
	for _, d := range []string{"logs", "config", "nats", "signer", "specs"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(m.stop)

	m.makeCertsAndKeys()

	// nats-server as deploy/ runs it (natsconf): JetStream with every write
	// fsynced, TLS 1.3 with client certificates mapped to the per-service
	// users of deploy/nats/nats-server.conf; one server, on loopback.
	m.NATSURL, m.NATSMonitor = m.StartNATS("nats-server")
	natsClient := func(basename string) string {
		return fmt.Sprintf("  url: %s\n  ca_file: %s\n  cert_file: %s\n  key_file: %s\n", m.NATSURL, m.ca(), m.cert(basename), m.key(basename))
	}

	// The catalog.
	m.Catalog = freeAddr(t)
	m.Metrics["mesh-catalog"] = freeAddr(t)
	catalogConf := m.writeFile("config/catalog.yaml", fmt.Sprintf(`listen: %s
metrics_listen: %s
cert_file: %s
key_file: %s
ca_file: %s
nats:
%s`, m.Catalog, m.Metrics["mesh-catalog"], m.cert("catalog"), m.key("catalog"), m.ca(), natsClient("catalog")))
	m.start("mesh-catalog", opts.Env, bin.Catalog, "serve", "--config", catalogConf)
	m.waitReady("mesh-catalog", m.healthy(m.Catalog))

	// The signer.
	m.Signer = freeAddr(t)
	m.Metrics["mesh-signer"] = freeAddr(t)
	signerConf := m.writeFile("config/signer.yaml", fmt.Sprintf(`listen: %s
metrics_listen: %s
cert_file: %s
key_file: %s
ca_file: %s
signing_key_file: %s
keyset_file: %s
roots_file: %s
state_dir: %s
own_prefixes: [%s]
catalog_addr: %s
`, m.Signer, m.Metrics["mesh-signer"], m.cert("signer"), m.key("signer"), m.ca(), m.signingKey(), m.keyset(), m.roots(),
		filepath.Join(dir, "signer", "state"), strings.Join(Prefixes, ", "), m.Catalog))
	m.start("mesh-signer", opts.Env, bin.Signer, "serve", "--config", signerConf)
	m.waitReady("mesh-signer", m.healthy(m.Signer))

	// The composer.
	m.Composer = freeAddr(t)
	m.Metrics["mesh-composer"] = freeAddr(t)
	composerConf := m.writeFile("config/composer.yaml", fmt.Sprintf(`listen: %s
metrics_listen: %s
cert_file: %s
key_file: %s
ca_file: %s
roots_file: %s
signer_addr: %s
catalog_addr: %s
holder: composer-1
workers: 8
nats:
%s`, m.Composer, m.Metrics["mesh-composer"], m.cert("composer"), m.key("composer"), m.ca(), m.roots(), m.Signer, m.Catalog, natsClient("composer")))
	m.start("mesh-composer", opts.Env, bin.Composer, "serve", "--config", composerConf)
	m.waitReady("mesh-composer", m.healthy(m.Composer))

	// One engine per node, each applying into its own root dir.
	for _, node := range opts.Nodes {
		e := Engine{Node: node, Admin: freeAddr(t), Metrics: freeAddr(t),
			Root: filepath.Join(dir, "nodes", node, "root"), State: filepath.Join(dir, "nodes", node, "state")}
		for _, d := range []string{e.Root, e.State} {
			if err := os.MkdirAll(d, 0o755); err != nil {
				t.Fatal(err)
			}
		}
		base := "node-" + node
		e.Config = m.writeFile("config/"+base+".yaml", fmt.Sprintf(`root: %s
state_dir: %s
roots_file: %s
allow_prefixes: [%s]
composer_addr: %s
catalog_addr: %s
admin_listen: %s
metrics_listen: %s
cert_file: %s
key_file: %s
ca_file: %s
`, e.Root, e.State, m.roots(), strings.Join(Prefixes, ", "), m.Composer, m.Catalog, e.Admin, e.Metrics,
			m.cert(base), m.key(base), m.ca()))
		env := append([]string(nil), opts.Env...)
		if opts.NodeEnv != nil {
			env = append(env, opts.NodeEnv(node)...)
		}
		m.start("mesh-nodeengine-"+node, env, bin.NodeEngine, "--config", e.Config)
		m.Metrics["mesh-nodeengine-"+node] = e.Metrics
		m.Engines = append(m.Engines, e)
	}
	for _, e := range m.Engines {
		m.waitReady("mesh-nodeengine-"+e.Node, m.healthy(e.Admin))
	}
	return m
}

// makeCertsAndKeys makes, with the binaries as an operator would: the CA
// and the certificates of the services, operator admin, builder ci and every
// node; the offline root key and the pinned roots; the signer's online key
// and the keyset the root signs for it.
func (m *Mesh) makeCertsAndKeys() {
	m.run(m.Bin.Meshctl, "certs", "init", "--dir", m.CertsDir, "--trust-domain", TrustDomain)
	for _, node := range m.opts.Nodes {
		m.run(m.Bin.Meshctl, "certs", "issue", "--dir", m.CertsDir, "--role", "node", "--name", node)
	}
	// The operators who back up and restore JetStream (NATS users of
	// deploy/nats, as deploy/compose/gen.sh issues them).
	for _, op := range []string{"backup", "restore"} {
		m.run(m.Bin.Meshctl, "certs", "issue", "--dir", m.CertsDir, "--role", "operator", "--name", op)
	}
	m.run(m.Bin.Meshctl, "keys", "root-init", "--dir", m.KeysDir, "--name", "root")
	m.run(m.Bin.Meshctl, "keys", "roots", "--threshold", "1", "--out", m.roots(), filepath.Join(m.KeysDir, "root.pub.json"))
	m.run(m.Bin.Signer, "init", "--signing-key-file", m.signingKey())
	m.run(m.Bin.Meshctl, "keys", "sign-keyset", "--version", "1", "--key", m.signingKey()+".pub.json",
		"--root-key", filepath.Join(m.KeysDir, "root-key.pem"), "--roots", m.roots(), "--out", m.keyset())
}

// StartNATS starts a nats-server process of that name (nats-server, or
// another for a second, empty JetStream) configured as deploy/ runs one
// (natsconf.SingleServer of deploy/nats/nats-server.conf in the mesh's
// trust domain, a server certificate of the mesh's CA), its store under
// nats/<name>/, and waits until JetStream serves. It returns the client URL
// (tls://) and the monitoring address.
func (m *Mesh) StartNATS(name string) (url, monitor string) {
	m.t.Helper()
	base := filepath.Join(m.Dir, "nats", name)
	ca, err := pki.LoadCA(m.ca(), filepath.Join(m.CertsDir, pki.CAKeyFile))
	if err != nil {
		m.t.Fatal(err)
	}
	if err := natsconf.WriteServerCerts(ca, filepath.Join(base, "certs")); err != nil {
		m.t.Fatal(err)
	}
	deploy, err := natsconf.Deploy()
	if err != nil {
		m.t.Fatal(err)
	}
	listen, monitor := freeAddr(m.t), freeAddr(m.t)
	conf, err := natsconf.SingleServer(deploy, natsconf.Options{ServerName: name, Listen: listen, Monitor: monitor,
		CertsDir: filepath.Join(base, "certs"), StoreDir: filepath.Join(base, "jetstream"), TrustDomain: TrustDomain})
	if err != nil {
		m.t.Fatal(err)
	}
	path := m.writeFile(filepath.Join("config", name+".conf"), string(conf))
	m.start(name, nil, Tool(m.t, "nats-server"), "-c", path)
	m.natsServers = append(m.natsServers, name)
	m.waitReady(name, func(ctx context.Context) error {
		return httpOK(ctx, "http://"+monitor+"/healthz?js-enabled-only=true")
	})
	return "tls://" + listen, monitor
}

// NATSRefusals returns the lines of the nats-servers' logs saying a client
// was refused a publish or subscription, or authorization.
func (m *Mesh) NATSRefusals() []string {
	var out []string
	for _, name := range m.natsServers {
		b, err := os.ReadFile(filepath.Join(m.Dir, "logs", name+".log"))
		if err != nil {
			out = append(out, fmt.Sprintf("%s: %v", name, err))
			continue
		}
		for _, line := range strings.Split(string(b), "\n") {
			if strings.Contains(line, "Violation") || strings.Contains(line, "Authorization Error") {
				out = append(out, name+": "+line)
			}
		}
	}
	return out
}

// NATSFlags are meshctl's flags that reach the NATS server at url as the
// NATS user of an identity's certificate (operator-backup, operator-restore).
func (m *Mesh) NATSFlags(url, basename string) []string {
	return []string{"--nats-url", url, "--nats-ca", m.ca(), "--nats-cert", m.cert(basename), "--nats-key", m.key(basename)}
}

func (m *Mesh) ca() string                  { return filepath.Join(m.CertsDir, pki.CACertFile) }
func (m *Mesh) cert(basename string) string { c, _ := pki.Paths(m.CertsDir, basename); return c }
func (m *Mesh) key(basename string) string  { _, k := pki.Paths(m.CertsDir, basename); return k }
func (m *Mesh) roots() string               { return filepath.Join(m.KeysDir, "roots.json") }
func (m *Mesh) keyset() string              { return filepath.Join(m.KeysDir, "keyset.json") }
func (m *Mesh) signingKey() string          { return filepath.Join(m.Dir, "signer", "signing-key.pem") }

// CertFiles returns the CA, certificate and key files of an identity's
// basename (operator-admin, builder-ci, node-ace, catalog, ...).
func (m *Mesh) CertFiles(basename string) (ca, cert, key string) {
	return m.ca(), m.cert(basename), m.key(basename)
}

func (m *Mesh) writeFile(rel, content string) string {
	p := filepath.Join(m.Dir, rel)
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		m.t.Fatal(err)
	}
	return p
}

// run runs a binary to completion and fails the test when it fails.
func (m *Mesh) run(bin string, args ...string) string {
	m.t.Helper()
	out, err := runCommand(nil, "", bin, args...)
	if err != nil {
		m.t.Fatalf("%s %s: %v\n%s", filepath.Base(bin), strings.Join(args, " "), err, out)
	}
	return out
}

// runCommand runs bin with args in dir, env added to the test's, and returns
// its combined output. It runs in a process group of its own: on timeout the
// whole group is killed (a shell's children too), and output still held
// open by a straggler is given up after a few seconds, so a command never
// hangs the test.
func runCommand(env []string, dir, bin string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), commandTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Dir = dir
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.SysProcAttr = groupProcAttr()
	cmd.Cancel = func() error { return killGroup(cmd.Process) }
	cmd.WaitDelay = 5 * time.Second
	err := startCmd(cmd)
	if err == nil {
		err = cmd.Wait()
	}
	if ctx.Err() != nil {
		err = fmt.Errorf("%w (after %s)", err, commandTimeout)
	}
	return out.String(), err
}

func (m *Mesh) start(name string, env []string, bin string, args ...string) *Proc {
	m.t.Helper()
	p, err := startProc(name, filepath.Join(m.Dir, "logs", name+".log"), "", env, bin, args...)
	if err != nil {
		m.t.Fatal(err)
	}
	m.Procs = append(m.Procs, p)
	return p
}

// Proc returns the process of a name (nats-server, mesh-catalog,
// mesh-nodeengine-ace, ...).
func (m *Mesh) Proc(name string) *Proc {
	for _, p := range m.Procs {
		if p.Name == name {
			return p
		}
	}
	return nil
}

// waitReady polls ready until it succeeds, failing the test at once when
// the process ends and after startTimeout otherwise.
func (m *Mesh) waitReady(name string, ready func(context.Context) error) {
	m.t.Helper()
	p := m.Proc(name)
	deadline := time.Now().Add(startTimeout)
	start := time.Now()
	var last error
	for {
		if err, done := p.Exited(); done {
			m.t.Fatalf("%s ended while starting: %v\n%s", name, err, p.Output(logTail))
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		last = ready(ctx)
		cancel()
		if last == nil {
			m.t.Logf("%s (pid %d) ready after %.1fs", name, p.Pid(), time.Since(start).Seconds())
			return
		}
		if time.Now().After(deadline) {
			m.t.Fatalf("%s not ready within %s: %v\n%s", name, startTimeout, last, p.Output(logTail))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// healthy checks the gRPC health of a server as operator admin, over mTLS.
func (m *Mesh) healthy(addr string) func(context.Context) error {
	return func(ctx context.Context) error {
		ca, cert, key := m.CertFiles("operator-admin")
		cfg, err := pki.ClientTLS(cert, key, ca)
		if err != nil {
			return err
		}
		conn, err := grpcclient.Dial(addr, cfg)
		if err != nil {
			return err
		}
		defer conn.Close()
		return testutil.Serving(ctx, conn)
	}
}

func httpOK(ctx context.Context, url string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s: %s", url, resp.Status, body)
	}
	return nil
}

// HTTPGet returns the body of a GET that answered 200.
func HTTPGet(ctx context.Context, url string) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return "", err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", err
	}
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return string(body), nil
}

// stop stops every process, engines first and nats-server last. A process
// that had ended before fails the test; when the test failed, every
// process's output goes to its log.
func (m *Mesh) stop() {
	var early []string
	for i := len(m.Procs) - 1; i >= 0; i-- {
		p := m.Procs[i]
		if err := p.Stop(); err != nil {
			early = append(early, err.Error())
		}
	}
	if len(early) > 0 {
		m.t.Errorf("procmesh: %s", strings.Join(early, "; "))
	}
	// A service's own traffic refused is a permission deploy/nats lacks.
	for _, line := range m.NATSRefusals() {
		if strings.Contains(line, "/service/") {
			m.t.Errorf("procmesh: NATS refused a service what deploy/nats/nats-server.conf should allow it: %s", line)
		}
	}
	if m.t.Failed() {
		for _, p := range m.Procs {
			m.t.Logf("=== output of %s (pid %d) ===\n%s", p.Name, p.Pid(), p.Output(logTail))
		}
	}
}

func freePort(t testing.TB) int { return testutil.FreePort(t) }

func freeAddr(t testing.TB) string { return testutil.FreeAddr(t) }

// Run runs bin with args in dir (the test's directory when ""), env added
// to the test's environment, and returns its combined output.
func Run(dir string, env []string, bin string, args ...string) (string, error) {
	return runCommand(env, dir, bin, args...)
}
