// Package enginekill kills a node engine with SIGKILL in the middle of its
// applies and checks that, restarted, every module is fully at the
// composition it had or fully at the new one, never half (DESIGN.md §7: "a
// crash mid-apply is finished or rolled back on restart, never left half").
//
// The engine runs as a child process: this test binary, re-executed with
// childEnv naming a config file. The catalog, signer and composer run in the
// test process (onebox with no engines of its own), over real mTLS.
package enginekill

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	"mesh.dev/cmd/meshctl/onebox"
	"mesh.dev/internal/config"
	"mesh.dev/internal/envelope"
	"mesh.dev/internal/grpcclient"
	"mesh.dev/internal/identity"
	"mesh.dev/internal/names"
	"mesh.dev/internal/natsx"
	"mesh.dev/internal/pki"
	composerv1 "mesh.dev/proto/mesh/composer/v1"
	nodeenginev1 "mesh.dev/proto/mesh/nodeengine/v1"
	typev1 "mesh.dev/proto/mesh/type/v1"
	nodeengineapp "mesh.dev/services/nodeengine/app"
)

// Environment of a child: the config file, and "replay" to only open the
// engine (which finishes a journal a kill left) and close it.
const (
	childEnv     = "MESH_ENGINEKILL_CHILD_CONFIG"
	childModeEnv = "MESH_ENGINEKILL_CHILD_MODE"
	// longEnv set to 1 runs many more kills (as -long does).
	longEnv = "MESH_LONG_TESTS"
	// seedEnv replays the kill moments of an earlier run.
	seedEnv = "MESH_ENGINEKILL_SEED"
)

var long = flag.Bool("long", false, "kill the engine many more times ("+longEnv+"=1 does the same)")

func TestMain(m *testing.M) {
	if path := os.Getenv(childEnv); path != "" {
		os.Exit(runChild(path, os.Getenv(childModeEnv)))
	}
	os.Exit(m.Run())
}

// runChild runs a node engine from a config file until it is killed; in
// replay mode it only opens it (finishing a journal left by a kill) and
// closes it.
func runChild(path, mode string) int {
	var cfg nodeengineapp.Config
	if err := config.Load(path, &cfg); err != nil {
		fmt.Fprintln(os.Stderr, "child config:", err)
		return 2
	}
	log := slog.New(slog.NewJSONHandler(os.Stderr, nil))
	if mode == "replay" {
		a, err := nodeengineapp.New(context.Background(), cfg, nodeengineapp.Options{Logger: log})
		if err != nil {
			fmt.Fprintln(os.Stderr, "child:", err)
			return 1
		}
		a.Close()
		return 0
	}
	addrFile := path + ".addr"
	err := nodeengineapp.Run(context.Background(), cfg, nodeengineapp.Options{
		Logger: log, SyncBackoffBase: 50 * time.Millisecond, SyncBackoffMax: 500 * time.Millisecond,
		Ready: func(a net.Addr) {
			os.WriteFile(addrFile+".tmp", []byte(a.String()), 0o600)
			os.Rename(addrFile+".tmp", addrFile)
		},
	})
	fmt.Fprintln(os.Stderr, "child:", err)
	return 1
}

const (
	node = "crash-1"
	// files is how many files the bulk module declares at most; about one
	// in nine is left out of each generation, so paths also come and go.
	files    = 280
	fileSize = 1200
	blobSize = 4 << 20
)

// TestKillDuringApply kills the engine with SIGKILL at random moments while
// it applies a new generation of a module of ~250 files (some inline, some
// moved to the object store, one 4 MiB artifact), several times over. After
// each kill: an engine opened alone finishes any journal the kill left, and
// every module on disk is then exactly at the composition it had applied or
// exactly at the new one (each declared path's type, mode and content
// digest; no path of the other one left over; no temp file left); started
// with the composer down, the engine reports no drift and that very
// composition applied; started normally, it converges to the new one.
func TestKillDuringApply(t *testing.T) {
	if testing.Short() {
		t.Skip("starts and kills processes")
	}
	kills := 3
	if *long || os.Getenv(longEnv) == "1" {
		kills = 20
	}
	ctx := context.Background()
	dir := t.TempDir()
	m := startMesh(t, dir)
	k := &killer{t: t, m: m, dir: dir, modules: filepath.Join(dir, "modules")}
	fp0 := k.setup(ctx)
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv(seedEnv); s != "" {
		fmt.Sscan(s, &seed)
	}
	rng := rand.New(rand.NewPCG(seed, 1))
	t.Logf("kill moments drawn with %s=%d", seedEnv, seed)

	// Generation 1 with no kill measures how long an apply takes.
	child := k.start(m.Composer)
	k.waitConverged(ctx, child, fp0)
	start := time.Now()
	fp := k.publish(ctx, 1)
	published := time.Since(start)
	firstWrite := k.waitFirstWrite(ctx, 1, 2*time.Minute)
	k.waitConverged(ctx, child, fp)
	total := time.Since(start)
	ops := time.Since(firstWrite)
	t.Logf("generation 1: published in %s, first file written after %s, converged after %s", published, firstWrite.Sub(start), total)

	outcomes := map[string]int{}
	for gen := 2; gen < 2+kills; gen++ {
		prev := k.applied(ctx, "")
		start := time.Now()
		fp := k.publish(ctx, gen)
		var why string
		if gen%2 == 0 {
			// Somewhere in the ops: after the first new file is written.
			k.waitFirstWrite(ctx, gen, 2*time.Minute)
			d := randDuration(rng, ops*6/5)
			why = fmt.Sprintf("%s after its first file was written", d)
			time.Sleep(d) // the kill's moment, not a synchronisation
		} else {
			// Anywhere from the registration to past the end of the apply.
			d := randDuration(rng, total*3/2)
			why = fmt.Sprintf("%s after the registration", d)
			time.Sleep(d - min(d, time.Since(start)))
		}
		child.kill()
		next := k.applied(ctx, fp)

		// The kill may leave a journal: opening the engine finishes it.
		k.replay()
		state := map[string]string{}
		for module := range union(prev, next) {
			at, diff := k.judge(prev[module], next[module])
			if at == "" {
				t.Fatalf("generation %d, killed %s: %s is half applied:\n%s", gen, why, module, strings.Join(diff, "\n"))
			}
			state[module] = at
		}
		if left := tempFiles(t, k.root()); len(left) > 0 {
			t.Errorf("generation %d, killed %s: temp files left under the root: %v", gen, why, left)
		}
		outcomes[state["bulk"]]++
		t.Logf("generation %d: killed %s; bulk %s, replayed a journal: %v", gen, why, state["bulk"], k.replayed())

		// With the composer down, the engine holds what is on disk.
		down := k.start(closedAddr(t))
		k.checkKept(ctx, down, prev, next, state)
		down.kill()

		// Back with the composer: it converges to the new generation.
		child = k.start(m.Composer)
		k.waitConverged(ctx, child, fp)
		for module, c := range k.applied(ctx, fp) {
			if at, diff := k.judge(c, c); at == "" {
				t.Fatalf("generation %d converged, but %s is not on disk:\n%s", gen, module, strings.Join(diff, "\n"))
			}
		}
	}
	child.kill()
	t.Logf("after %d kills: bulk was found at the previous composition %d times, at the new one %d times", kills, outcomes["previous"], outcomes["new"])
}

func randDuration(rng *rand.Rand, max time.Duration) time.Duration {
	if max <= 0 {
		return 0
	}
	return time.Duration(rng.Int64N(int64(max)))
}

// startMesh starts the catalog, signer and composer with no engine.
func startMesh(t *testing.T, dir string) *onebox.Mesh {
	t.Helper()
	logFile, err := os.Create(filepath.Join(dir, "mesh.log"))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	m, err := onebox.Start(ctx, onebox.Options{DataDir: filepath.Join(dir, "mesh"), Nodes: 0, LogOutput: logFile})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		m.Stop()
		if err := m.Err(); err != nil {
			t.Errorf("the mesh's services ended with: %v", err)
		}
		logFile.Close()
		if t.Failed() {
			dumpLog(t, logFile.Name(), 40)
		}
	})
	return m
}

// killer drives the child engine of one node.
type killer struct {
	t       *testing.T
	m       *onebox.Mesh
	dir     string
	modules string
	cfg     nodeengineapp.Config
	op      composerv1.ComposerServiceClient
	logs    int
	lastLog string
}

func (k *killer) root() string { return filepath.Join(k.dir, "node", "root") }

// setup makes the node's certificate and dirs, publishes motd and puts the
// node's spec (bulk and motd); it returns bulk's first fingerprint.
func (k *killer) setup(ctx context.Context) string {
	t := k.t
	cert, key, ca, err := k.m.NodeIdentity(node)
	if err != nil {
		t.Fatal(err)
	}
	k.cfg = nodeengineapp.Config{
		Root: k.root(), StateDir: filepath.Join(k.dir, "node", "state"), RootsFile: k.m.RootsFile(), AllowPrefixes: onebox.Prefixes,
		CatalogAddr: k.m.Catalog, AdminListen: "127.0.0.1:0", CertFile: cert, KeyFile: key, CAFile: ca,
	}
	if err := os.MkdirAll(k.root(), 0o755); err != nil {
		t.Fatal(err)
	}
	_, file, _, _ := runtime.Caller(0)
	motd := filepath.Join(filepath.Dir(file), "..", "..", "examples", "modules", "motd")
	copyDir(t, motd, filepath.Join(k.modules, "motd"))
	conn := k.dial(k.m.Composer)
	k.op = composerv1.NewComposerServiceClient(conn)
	fp := k.publish(ctx, 0)
	spec := &composerv1.NodeSpec{Node: node, Labels: map[string]string{"role": "crash"},
		Modules: []*composerv1.PlacedModule{{Module: "bulk"}, {Module: "motd"}}}
	if _, err := k.op.PutNode(ctx, &composerv1.PutNodeRequest{Spec: spec}); err != nil {
		t.Fatal(err)
	}
	return fp
}

func (k *killer) dial(addr string) *grpc.ClientConn {
	k.t.Helper()
	id := identity.Identity{TrustDomain: onebox.TrustDomain, Role: identity.RoleOperator, Name: "admin"}
	cert, key := pki.Paths(k.m.CertsDir, pki.Basename(id))
	cfg, err := pki.ClientTLS(cert, key, filepath.Join(k.m.CertsDir, pki.CACertFile))
	if err != nil {
		k.t.Fatal(err)
	}
	conn, err := grpcclient.Dial(addr, cfg)
	if err != nil {
		k.t.Fatal(err)
	}
	k.t.Cleanup(func() { conn.Close() })
	return conn
}

// bulkFile is file n of generation gen, and whether the generation has it.
func bulkFile(gen, n int) ([]byte, bool) {
	if (n+gen)%9 == 0 {
		return nil, false
	}
	seed := sha256.Sum256(fmt.Appendf(nil, "%d/%d", gen, n))
	var b strings.Builder
	fmt.Fprintf(&b, "# generation %d, file %d\n", gen, n)
	for b.Len() < fileSize {
		b.WriteString(hex.EncodeToString(seed[:]))
		b.WriteByte('\n')
	}
	return []byte(b.String()[:fileSize]), true
}

// writeBulk writes generation gen of the bulk module's directory.
func (k *killer) writeBulk(gen int) {
	t := k.t
	dir := filepath.Join(k.modules, "bulk")
	os.RemoveAll(dir)
	if err := os.MkdirAll(filepath.Join(dir, "files"), 0o755); err != nil {
		t.Fatal(err)
	}
	var y strings.Builder
	fmt.Fprintf(&y, "module: bulk\nversion: 1.0.%d\nupgrade:\n  policy: AUTO\nresources:\n", gen)
	fmt.Fprintf(&y, "  - {name: top, type: directory, path: /opt/bulk, mode: \"0755\", owner: root, group: root}\n")
	for d := 0; d < 4; d++ {
		fmt.Fprintf(&y, "  - {name: d%d, type: directory, path: /opt/bulk/d%d, mode: \"0755\", owner: root, group: root}\n", d, d)
	}
	for n := 0; n < files; n++ {
		b, ok := bulkFile(gen, n)
		if !ok {
			continue
		}
		name := fmt.Sprintf("f%03d", n)
		if err := os.WriteFile(filepath.Join(dir, "files", name), b, 0o644); err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(&y, "  - {name: %s, type: file, path: /opt/bulk/d%d/%s, mode: \"0644\", owner: root, group: root, source: files/%s, render: false}\n", name, n%4, name, name)
	}
	fmt.Fprintf(&y, "  - {name: blob, type: file, path: /opt/bulk/blob.bin, mode: \"0600\", owner: root, group: root, artifact: \"blob:data\"}\n")
	fmt.Fprintf(&y, "artifacts:\n  - {ref: \"blob:data\", file: blob.bin}\n")
	if err := os.WriteFile(filepath.Join(dir, "module.yaml"), []byte(y.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	blob := make([]byte, blobSize)
	r := rand.NewChaCha8(sha256.Sum256(fmt.Appendf(nil, "blob %d", gen)))
	r.Read(blob)
	if err := os.WriteFile(filepath.Join(dir, "blob.bin"), blob, 0o644); err != nil {
		t.Fatal(err)
	}
}

// publish publishes generation gen of bulk and returns its fingerprint.
func (k *killer) publish(ctx context.Context, gen int) string {
	k.t.Helper()
	k.writeBulk(gen)
	res, err := k.m.PublishModules(ctx, k.modules)
	if err != nil {
		k.t.Fatal(err)
	}
	for _, r := range res {
		if r.Module == "bulk" {
			if !r.Registered {
				k.t.Fatalf("generation %d of bulk was not registered", gen)
			}
			return r.Fingerprint
		}
	}
	k.t.Fatal("bulk was not published")
	return ""
}

// want is a composition of the node's assignment with its want.
type want struct {
	want *typev1.Want
	comp *typev1.Composition
}

// applied waits until the node's assignment wants bulk at fp ("": any)
// and returns its compositions by module, read from the composer's buckets.
func (k *killer) applied(ctx context.Context, fp string) map[string]want {
	k.t.Helper()
	js := k.m.JetStream
	as, err := js.KeyValue(ctx, natsx.BucketAssignments)
	if err != nil {
		k.t.Fatal(err)
	}
	cs, err := js.KeyValue(ctx, natsx.BucketCompositions)
	if err != nil {
		k.t.Fatal(err)
	}
	var out map[string]want
	waitFor(k.t, time.Minute, "the assignment of "+node, func() (bool, string) {
		e, err := as.Get(ctx, node)
		if err != nil {
			return false, err.Error()
		}
		a := &composerv1.Assignment{}
		if err := proto.Unmarshal(e.Value(), a); err != nil {
			return false, err.Error()
		}
		out = map[string]want{}
		for _, w := range a.GetWants() {
			if w.GetModule() == "bulk" && fp != "" && w.GetFingerprint() != fp {
				return false, "bulk wanted at " + w.GetFingerprint()
			}
			ce, err := cs.Get(ctx, w.GetCompositionKey())
			if err != nil {
				return false, err.Error()
			}
			env := &typev1.Envelope{}
			c := &typev1.Composition{}
			if err := proto.Unmarshal(ce.Value(), env); err != nil {
				return false, err.Error()
			}
			if envelope.Digest(env) != w.GetCompositionDigest() {
				return false, w.GetCompositionKey() + " holds another digest"
			}
			if err := envelope.Open(env, typev1.PayloadType_PAYLOAD_TYPE_COMPOSITION, c); err != nil {
				return false, err.Error()
			}
			out[w.GetModule()] = want{want: w, comp: c}
		}
		return true, ""
	})
	return out
}

// expected returns what a composition puts on disk, by absolute path.
func expected(w want) map[string]string {
	out := map[string]string{}
	parts := map[string]string{}
	for _, p := range w.want.GetParts() {
		parts[p.GetRef()] = p.GetDigest()
	}
	for _, r := range w.comp.GetResources() {
		switch r.GetType() {
		case typev1.ResourceType_RESOURCE_TYPE_FILE:
			mode := r.GetMode()
			if mode == 0 {
				mode = 0o644
			}
			var digest string
			switch c := r.GetContent().(type) {
			case *typev1.Resource_Inline:
				digest = names.Digest(c.Inline)
			case *typev1.Resource_Object:
				digest = c.Object.GetDigest()
			case *typev1.Resource_Artifact:
				digest = parts[c.Artifact]
			}
			out[r.GetPath()] = fmt.Sprintf("file %o %s", mode, digest)
		case typev1.ResourceType_RESOURCE_TYPE_DIRECTORY:
			mode := r.GetMode()
			if mode == 0 {
				mode = 0o755
			}
			out[r.GetPath()] = fmt.Sprintf("dir %o", mode)
		case typev1.ResourceType_RESOURCE_TYPE_SYMLINK:
			out[r.GetPath()] = "symlink " + r.GetTarget()
		}
	}
	return out
}

// onDisk returns what lies on an absolute path under the root ("" when
// nothing does).
func (k *killer) onDisk(p string) string {
	fp := filepath.Join(k.root(), filepath.FromSlash(p))
	fi, err := os.Lstat(fp)
	if errors.Is(err, fs.ErrNotExist) {
		return ""
	}
	if err != nil {
		return "error " + err.Error()
	}
	switch {
	case fi.Mode()&fs.ModeSymlink != 0:
		target, _ := os.Readlink(fp)
		return "symlink " + target
	case fi.IsDir():
		return fmt.Sprintf("dir %o", fi.Mode().Perm())
	case fi.Mode().IsRegular():
		return fmt.Sprintf("file %o %s", fi.Mode()&fs.ModePerm|fi.Mode()&(fs.ModeSetuid|fs.ModeSetgid|fs.ModeSticky), digestOf(k.t, fp))
	}
	return "special " + fi.Mode().String()
}

// judge says whether the disk holds prev exactly ("previous") or next
// exactly ("new"); otherwise "" and how the disk differs from each.
func (k *killer) judge(prev, next want) (string, []string) {
	var pe, ne map[string]string
	if prev.comp != nil {
		pe = expected(prev)
	}
	if next.comp != nil {
		ne = expected(next)
	}
	paths := map[string]bool{}
	for p := range pe {
		paths[p] = true
	}
	for p := range ne {
		paths[p] = true
	}
	var diffs [2][]string
	for p := range paths {
		got := k.onDisk(p)
		for i, exp := range []map[string]string{pe, ne} {
			if want := exp[p]; got != want {
				diffs[i] = append(diffs[i], fmt.Sprintf("  %s: %q on disk, %q declared", p, got, want))
			}
		}
	}
	switch {
	case prev.comp != nil && len(diffs[0]) == 0:
		return "previous", nil
	case next.comp != nil && len(diffs[1]) == 0:
		return "new", nil
	}
	sort.Strings(diffs[0])
	sort.Strings(diffs[1])
	out := append([]string{fmt.Sprintf("%d paths differ from the previous composition:", len(diffs[0]))}, head(diffs[0], 10)...)
	out = append(out, fmt.Sprintf("%d paths differ from the new composition:", len(diffs[1])))
	return "", append(out, head(diffs[1], 10)...)
}

func head(s []string, n int) []string { return s[:min(n, len(s))] }

// checkKept checks an engine started with the composer down: no drift,
// and each module's applied composition is the one found on disk.
func (k *killer) checkKept(ctx context.Context, c *child, prev, next map[string]want, state map[string]string) {
	t := k.t
	var s *nodeenginev1.GetStatusResponse
	waitFor(t, time.Minute, "the engine's kept state with the composer down", func() (bool, string) {
		var err error
		s, err = c.admin.GetStatus(ctx, &nodeenginev1.GetStatusRequest{})
		switch {
		case err != nil:
			return false, err.Error()
		case s.GetConnected() || s.GetConnectionError() == "" || s.GetConnectionError() == "not connected to a composer yet":
			return false, "connected"
		case len(s.GetHaves()) == 0:
			return false, "no haves yet"
		case len(s.GetWants()) == 0:
			// The haves are reported from the moment the engine is open;
			// the wants, and the drift checked here, once its first pass ran.
			return false, "no wants yet (no pass ran)"
		}
		return true, ""
	})
	if len(s.GetDrift()) > 0 {
		t.Errorf("after the kill the engine finds drift: %v", s.GetDrift())
	}
	for module, at := range state {
		w := prev[module]
		if at == "new" {
			w = next[module]
		}
		var have *composerv1.Have
		for _, h := range s.GetHaves() {
			if h.GetModule() == module {
				have = h
			}
		}
		if got := have.GetApplied().GetDigest(); got != w.want.GetCompositionDigest() {
			t.Errorf("%s is on disk at the %s composition %s, the engine says %s is applied", module, at, w.want.GetCompositionDigest(), got)
		}
	}
}

// waitConverged waits until the engine applied bulk at fp, whole.
func (k *killer) waitConverged(ctx context.Context, c *child, fp string) {
	k.t.Helper()
	waitFor(k.t, 2*time.Minute, "bulk applied at "+fp, func() (bool, string) {
		s, err := c.admin.GetStatus(ctx, &nodeenginev1.GetStatusRequest{})
		if err != nil {
			return false, err.Error()
		}
		if s.GetPending() != nil || s.GetApplied() == nil {
			return false, "pending"
		}
		ok := false
		for _, w := range s.GetWants() {
			if w.GetModule() == "bulk" && w.GetFingerprint() == fp {
				ok = true
			}
		}
		if !ok {
			return false, "bulk not wanted at " + fp
		}
		for _, h := range s.GetHaves() {
			for _, w := range s.GetWants() {
				if w.GetModule() == h.GetModule() && (h.GetApplied().GetDigest() != w.GetCompositionDigest() ||
					h.GetAttempt().GetState() != composerv1.AttemptState_ATTEMPT_STATE_APPLIED) {
					return false, fmt.Sprintf("%s: %v", h.GetModule(), h)
				}
			}
		}
		return true, ""
	})
}

// waitFirstWrite waits until the first file of generation gen (in apply
// order) is on disk, and returns when it saw it.
func (k *killer) waitFirstWrite(ctx context.Context, gen int, timeout time.Duration) time.Time {
	k.t.Helper()
	n := 0
	for ; n < files; n++ {
		if _, ok := bulkFile(gen, n); ok && n%4 == 0 {
			break
		}
	}
	b, _ := bulkFile(gen, n)
	p := filepath.Join(k.root(), "opt", "bulk", "d0", fmt.Sprintf("f%03d", n))
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		if got, err := os.ReadFile(p); err == nil && string(got) == string(b) {
			return time.Now()
		}
		time.Sleep(time.Millisecond)
	}
	k.t.Fatalf("generation %d: %s not written within %s", gen, p, timeout)
	return time.Time{}
}

// child is a node engine process.
type child struct {
	cmd   *exec.Cmd
	admin nodeenginev1.NodeEngineServiceClient
	done  chan struct{}
}

func (c *child) kill() {
	c.cmd.Process.Signal(syscall.SIGKILL)
	<-c.done
}

// writeConfig writes the engine's config (JSON is YAML) with the composer
// at composer.
func (k *killer) writeConfig(composer string) string {
	cfg := k.cfg
	cfg.ComposerAddr = composer
	b, err := json.Marshal(map[string]any{
		"root": cfg.Root, "state_dir": cfg.StateDir, "roots_file": cfg.RootsFile, "allow_prefixes": cfg.AllowPrefixes,
		"composer_addr": cfg.ComposerAddr, "catalog_addr": cfg.CatalogAddr, "admin_listen": cfg.AdminListen,
		"cert_file": cfg.CertFile, "key_file": cfg.KeyFile, "ca_file": cfg.CAFile, "drift_interval": "1h",
	})
	if err != nil {
		k.t.Fatal(err)
	}
	p := filepath.Join(k.dir, "engine.json")
	if err := os.WriteFile(p, b, 0o600); err != nil {
		k.t.Fatal(err)
	}
	os.Remove(p + ".addr")
	return p
}

// run starts a child with the config; its log goes to a file of its own.
func (k *killer) run(path, mode string) (*exec.Cmd, chan struct{}) {
	k.t.Helper()
	k.logs++
	k.lastLog = filepath.Join(k.dir, fmt.Sprintf("engine-%02d-%s.log", k.logs, mode))
	logFile, err := os.Create(k.lastLog)
	if err != nil {
		k.t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"="+path, childModeEnv+"="+mode)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		k.t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		cmd.Wait()
		logFile.Close()
		close(done)
	}()
	k.t.Cleanup(func() {
		cmd.Process.Kill()
		<-done
		if k.t.Failed() {
			dumpLog(k.t, logFile.Name(), 15)
		}
	})
	return cmd, done
}

// start starts an engine with the composer at composer and waits for its
// admin API.
func (k *killer) start(composer string) *child {
	k.t.Helper()
	path := k.writeConfig(composer)
	cmd, done := k.run(path, "run")
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case <-done:
			k.t.Fatalf("the engine exited at start (%v)", cmd.ProcessState)
		default:
		}
		if a, err := os.ReadFile(path + ".addr"); err == nil {
			return &child{cmd: cmd, done: done, admin: nodeenginev1.NewNodeEngineServiceClient(k.dial(string(a)))}
		}
		time.Sleep(5 * time.Millisecond)
	}
	k.t.Fatal("the engine did not start within 30s")
	return nil
}

// replay opens the engine and closes it: it finishes what a kill left.
func (k *killer) replay() {
	k.t.Helper()
	cmd, done := k.run(k.writeConfig(closedAddr(k.t)), "replay")
	select {
	case <-done:
	case <-time.After(time.Minute):
		k.t.Fatal("opening the engine took over a minute")
	}
	if !cmd.ProcessState.Success() {
		k.t.Fatalf("opening the engine after the kill failed: %v", cmd.ProcessState)
	}
}

// replayed reports whether the last replay finished a journal.
func (k *killer) replayed() bool {
	b, _ := os.ReadFile(k.lastLog)
	return strings.Contains(string(b), "finishing an apply a stop left half done")
}

// tempFiles lists the temp files of writes under root.
func tempFiles(t *testing.T, root string) []string {
	var out []string
	filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err == nil && strings.HasPrefix(d.Name(), ".mesh-tmp-") {
			out = append(out, p)
		}
		return nil
	})
	return out
}

func union(a, b map[string]want) map[string]bool {
	out := map[string]bool{}
	for m := range a {
		out[m] = true
	}
	for m := range b {
		out[m] = true
	}
	return out
}

func closedAddr(t *testing.T) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := lis.Addr().String()
	lis.Close()
	return addr
}

func waitFor(t testing.TB, timeout time.Duration, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	last := ""
	for {
		ok, why := cond()
		if ok {
			return
		}
		last = why
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s; last: %s", what, timeout, last)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func digestOf(t testing.TB, p string) string {
	f, err := os.Open(p)
	if err != nil {
		return "unreadable"
	}
	defer f.Close()
	h := sha256.New()
	io.Copy(h, f)
	return "sha256:" + hex.EncodeToString(h.Sum(nil))
}

func copyDir(t testing.TB, src, dst string) {
	t.Helper()
	err := filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		to := filepath.Join(dst, rel)
		if d.IsDir() {
			return os.MkdirAll(to, 0o755)
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		return os.WriteFile(to, b, 0o644)
	})
	if err != nil {
		t.Fatal(err)
	}
}

func dumpLog(t testing.TB, path string, n int) {
	f, err := os.Open(path)
	if err != nil {
		return
	}
	defer f.Close()
	var lines []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		lines = append(lines, sc.Text())
		if len(lines) > n {
			lines = lines[1:]
		}
	}
	t.Logf("last lines of %s:\n%s", path, strings.Join(lines, "\n"))
}
