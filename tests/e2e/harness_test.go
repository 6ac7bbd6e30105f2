// Package e2e runs the whole mesh on one machine, in this process, over real
// mTLS (cmd/meshctl/onebox): an embedded JetStream, the catalog, the signer,
// the composer and node engines, each applying into its own root dir, and
// checks what the engines report and what lands on disk.
package e2e

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"

	"mesh.dev/cmd/meshctl/onebox"
	"mesh.dev/internal/grpcclient"
	"mesh.dev/internal/identity"
	"mesh.dev/internal/pki"
	catalogv1 "mesh.dev/proto/mesh/catalog/v1"
	composerv1 "mesh.dev/proto/mesh/composer/v1"
	nodeenginev1 "mesh.dev/proto/mesh/nodeengine/v1"
	typev1 "mesh.dev/proto/mesh/type/v1"
	"mesh.dev/services/catalog/publish"
)

// Bounds of the waits; a 2-CPU CI machine converges 3 nodes in seconds.
const (
	convergeTimeout = 90 * time.Second
	pollEvery       = 25 * time.Millisecond
)

const (
	stateApplied = composerv1.AttemptState_ATTEMPT_STATE_APPLIED
	entryAnswer  = nodeenginev1.EntryState_ENTRY_STATE_ANSWERED
)

// repoRoot is the checkout this test runs in (tests/e2e is two below).
func repoRoot(t testing.TB) string {
	t.Helper()
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		t.Fatal("no caller")
	}
	return filepath.Clean(filepath.Join(filepath.Dir(file), "..", ".."))
}

// world is a running one-process mesh and clients of its services.
type world struct {
	t        *testing.T
	m        *onebox.Mesh
	dir      string
	logPath  string
	composer composerv1.ComposerServiceClient
	catalog  catalogv1.CatalogServiceClient

	stopFn func()

	mu     sync.Mutex
	admins map[string]nodeenginev1.NodeEngineServiceClient
}

// startMesh starts a mesh with nodes engines in a temp dir; it stops at the
// end of the test, and a failed test gets the tail of the mesh's log.
func startMesh(t *testing.T, nodes int) *world {
	t.Helper()
	dir := t.TempDir()
	return startMeshIn(t, dir, onebox.Options{Nodes: nodes})
}

// startMeshIn starts (or restarts) the mesh kept in dir.
func startMeshIn(t *testing.T, dir string, opts onebox.Options) *world {
	t.Helper()
	w := &world{t: t, dir: dir, logPath: filepath.Join(dir, "mesh.log"), admins: map[string]nodeenginev1.NodeEngineServiceClient{}}
	logFile, err := os.OpenFile(w.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	opts.DataDir = filepath.Join(dir, "mesh")
	opts.LogOutput = logFile
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	m, err := onebox.Start(ctx, opts)
	if err != nil {
		logFile.Close()
		t.Fatalf("start the mesh: %v", err)
	}
	w.m = m
	stopped := false
	stop := func() {
		if stopped {
			return
		}
		stopped = true
		m.Stop()
		if err := m.Err(); err != nil {
			t.Errorf("the mesh's services ended with: %v", err)
		}
		logFile.Close()
	}
	t.Cleanup(func() {
		stop()
		if t.Failed() {
			w.dumpLog(80)
		}
	})
	w.stopFn = stop
	conn, err := m.Dial(m.Composer, identity.RoleOperator, "admin")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	w.composer = composerv1.NewComposerServiceClient(conn)
	cconn, err := m.Dial(m.Catalog, identity.RoleBuilder, "ci")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cconn.Close() })
	w.catalog = catalogv1.NewCatalogServiceClient(cconn)
	return w
}

// stop stops the mesh before the end of the test (a restart test).
func (w *world) stop() { w.stopFn() }

// dumpLog logs the last lines of the mesh's log.
func (w *world) dumpLog(n int) { dumpLog(w.t, w.logPath, n) }

// dumpLog logs the last n lines of a log file.
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
	t.Logf("last %d lines of %s:\n%s", len(lines), path, strings.Join(lines, "\n"))
}

// logger returns a logger writing JSON lines to <name>.log in the test's
// dir (dumped when the test fails).
func (w *world) logger(name string) *slog.Logger {
	w.t.Helper()
	p := filepath.Join(w.dir, name+".log")
	f, err := os.OpenFile(p, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		w.t.Fatal(err)
	}
	w.t.Cleanup(func() {
		f.Close()
		if w.t.Failed() {
			dumpLog(w.t, p, 40)
		}
	})
	return slog.New(slog.NewJSONHandler(f, nil)).With("service", name)
}

// admin returns a client of an engine's admin API, as the operator.
func (w *world) admin(node string) nodeenginev1.NodeEngineServiceClient {
	w.t.Helper()
	w.mu.Lock()
	defer w.mu.Unlock()
	if c, ok := w.admins[node]; ok {
		return c
	}
	e := w.engine(node)
	conn, err := w.m.Dial(e.Admin, identity.RoleOperator, "admin")
	if err != nil {
		w.t.Fatal(err)
	}
	w.t.Cleanup(func() { conn.Close() })
	c := nodeenginev1.NewNodeEngineServiceClient(conn)
	w.admins[node] = c
	return c
}

func (w *world) engine(node string) onebox.Engine {
	for _, e := range w.m.Engines {
		if e.Node == node {
			return e
		}
	}
	w.t.Fatalf("no engine %s", node)
	return onebox.Engine{}
}

// status asks an engine's admin API for its status.
func (w *world) status(ctx context.Context, node string) (*nodeenginev1.GetStatusResponse, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	return w.admin(node).GetStatus(ctx, &nodeenginev1.GetStatusRequest{})
}

// publishExamples publishes examples/modules.
func (w *world) publishExamples(ctx context.Context) []*publish.Result {
	w.t.Helper()
	res, err := w.m.PublishModules(ctx, filepath.Join(repoRoot(w.t), "examples", "modules"))
	if err != nil {
		w.t.Fatalf("publish the example modules: %v", err)
	}
	return res
}

// publishDir publishes the modules under dir and returns their results by
// module.
func (w *world) publishDir(ctx context.Context, dir string) map[string]*publish.Result {
	w.t.Helper()
	res, err := w.m.PublishModules(ctx, dir)
	if err != nil {
		w.t.Fatalf("publish %s: %v", dir, err)
	}
	out := map[string]*publish.Result{}
	for _, r := range res {
		out[r.Module] = r
	}
	return out
}

// converge publishes the examples, puts the dev specs, approves the first
// placements and waits until every engine applied its assignment.
func (w *world) converge(ctx context.Context) {
	w.t.Helper()
	w.publishExamples(ctx)
	if err := w.m.PutDevNodes(ctx); err != nil {
		w.t.Fatal(err)
	}
	actx, cancel := context.WithTimeout(ctx, convergeTimeout)
	defer cancel()
	if _, err := w.m.ApproveFirstPlacements(actx); err != nil {
		w.t.Fatalf("approve first placements: %v", err)
	}
	w.waitConverged(ctx, nil)
}

// waitConverged waits until the composer holds every engine's node
// converged and each engine reports its wanted manifest applied whole; also
// must hold for each engine's status when set.
func (w *world) waitConverged(ctx context.Context, also func(node string, s *nodeenginev1.GetStatusResponse) (bool, string)) map[string]*nodeenginev1.GetStatusResponse {
	w.t.Helper()
	out := map[string]*nodeenginev1.GetStatusResponse{}
	waitFor(w.t, convergeTimeout, "every engine converged", func() (bool, string) {
		sts, err := w.m.Status(ctx)
		if err != nil {
			return false, err.Error()
		}
		held := map[string]*composerv1.NodeStatus{}
		for _, st := range sts {
			held[st.GetNode()] = st
		}
		for _, e := range w.m.Engines {
			st := held[e.Node]
			if st == nil || !st.GetConverged() {
				return false, fmt.Sprintf("composer: %s not converged: %v", e.Node, st)
			}
			s, err := w.status(ctx, e.Node)
			if err != nil {
				return false, err.Error()
			}
			if ok, why := engineConverged(s); !ok {
				return false, e.Node + ": " + why
			}
			if s.GetApplied().GetRevision() != st.GetManifestRevision() {
				return false, fmt.Sprintf("%s applied revision %d, the composer holds %d", e.Node, s.GetApplied().GetRevision(), st.GetManifestRevision())
			}
			if also != nil {
				if ok, why := also(e.Node, s); !ok {
					return false, e.Node + ": " + why
				}
			}
			out[e.Node] = s
		}
		return true, ""
	})
	return out
}

// engineConverged reports whether an engine applied the manifest it holds
// whole: nothing pending, every want applied at its digest.
func engineConverged(s *nodeenginev1.GetStatusResponse) (bool, string) {
	if s.GetApplied() == nil {
		return false, "nothing applied yet"
	}
	if s.GetPending() != nil {
		return false, fmt.Sprintf("manifest revision %d pending", s.GetPending().GetRevision())
	}
	if len(s.GetWants()) == 0 {
		return false, "no wants"
	}
	for _, want := range s.GetWants() {
		h := haveOf(s, want.GetModule())
		if h.GetApplied().GetDigest() != want.GetCompositionDigest() || h.GetAttempt().GetState() != stateApplied {
			return false, fmt.Sprintf("%s: wanted %s, have %v", want.GetModule(), want.GetCompositionDigest(), h)
		}
	}
	return true, ""
}

func haveOf(s *nodeenginev1.GetStatusResponse, module string) *composerv1.Have {
	for _, h := range s.GetHaves() {
		if h.GetModule() == module {
			return h
		}
	}
	return nil
}

func wantOf(wants []*typev1.Want, module string) *typev1.Want {
	for _, w := range wants {
		if w.GetModule() == module {
			return w
		}
	}
	return nil
}

// waitFor polls cond until it holds or timeout passes; the failure names
// what was awaited and the last reason cond gave.
func waitFor(t testing.TB, timeout time.Duration, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	last := ""
	for {
		ok, why := cond()
		if ok {
			return
		}
		if why != "" {
			last = why
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s; last: %s", what, timeout, last)
		}
		time.Sleep(pollEvery)
	}
}

// tree returns what lies under root, by path relative to it: a file's
// mode and content digest, a directory's mode, a symlink's target.
func tree(t testing.TB, root string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		fi, err := os.Lstat(p)
		if err != nil {
			return err
		}
		switch {
		case fi.Mode()&fs.ModeSymlink != 0:
			target, err := os.Readlink(p)
			if err != nil {
				return err
			}
			out[rel] = "symlink -> " + target
		case fi.IsDir():
			out[rel] = fmt.Sprintf("dir %o", fi.Mode().Perm())
		default:
			out[rel] = fmt.Sprintf("file %o %s", fi.Mode().Perm(), fileDigest(t, p))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func fileDigest(t testing.TB, p string) string {
	t.Helper()
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		t.Fatal(err)
	}
	return "sha256:" + hex.EncodeToString(h.Sum(nil))
}

// diffTrees lists how two trees differ, sorted.
func diffTrees(a, b map[string]string) []string {
	var out []string
	for p, v := range a {
		if w, ok := b[p]; !ok {
			out = append(out, "- "+p+" "+v)
		} else if w != v {
			out = append(out, "~ "+p+" "+v+" => "+w)
		}
	}
	for p, v := range b {
		if _, ok := a[p]; !ok {
			out = append(out, "+ "+p+" "+v)
		}
	}
	sort.Strings(out)
	return out
}

// inode returns a path's inode number and link count.
func inode(t testing.TB, p string) (ino, nlink uint64) {
	t.Helper()
	fi, err := os.Lstat(p)
	if err != nil {
		t.Fatal(err)
	}
	st := fi.Sys().(*syscall.Stat_t)
	return st.Ino, uint64(st.Nlink)
}

// copyDir copies a directory tree (files and directories only).
func copyDir(t testing.TB, src, dst string) {
	t.Helper()
	err := filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		to := filepath.Join(dst, rel)
		fi, err := d.Info()
		if err != nil {
			return err
		}
		if d.IsDir() {
			return os.MkdirAll(to, fi.Mode().Perm()|0o700)
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		return os.WriteFile(to, b, fi.Mode().Perm())
	})
	if err != nil {
		t.Fatal(err)
	}
}

func readFile(t testing.TB, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// pkiPaths returns the certificate, key and CA files of an identity in a
// dev certs dir.
func pkiPaths(dir string, id identity.Identity) (cert, key, ca string) {
	cert, key = pki.Paths(dir, pki.Basename(id))
	return cert, key, filepath.Join(dir, pki.CACertFile)
}

// dialAs dials addr as an identity of a dev certs dir.
func dialAs(addr, dir string, id identity.Identity) (*grpc.ClientConn, error) {
	cert, key, ca := pkiPaths(dir, id)
	cfg, err := pki.ClientTLS(cert, key, ca)
	if err != nil {
		return nil, err
	}
	return grpcclient.Dial(addr, cfg)
}
