package main

import (
	"bytes"
	"context"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protojson"

	"mesh.dev/internal/identity"
	"mesh.dev/internal/names"
	"mesh.dev/internal/pki"
	"mesh.dev/internal/testutil"
	catalogv1 "mesh.dev/proto/mesh/catalog/v1"
	typev1 "mesh.dev/proto/mesh/type/v1"
	"mesh.dev/services/catalog/app"
)

// catalogFixture is a catalog over real mTLS and the certificate files of a
// builder and an operator in one directory, as meshctl's flags expect.
type catalogFixture struct {
	addr, certsDir string
}

func startCatalog(t *testing.T) *catalogFixture {
	t.Helper()
	p := testutil.NewPKI(t)
	for _, id := range []identity.Identity{p.Identity(identity.RoleBuilder, "ci"), p.Identity(identity.RoleOperator, "admin")} {
		p.Files(t, id)
	}
	_, js := testutil.ConnectJetStream(t, testutil.StartJetStream(t))
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	c, err := app.New(context.Background(), app.Config{}, app.Options{
		Logger: slog.New(slog.DiscardHandler), Listener: lis, JetStream: js,
		ServerTLS: p.ServerTLS(t, p.Identity(identity.RoleCatalog, "")),
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Serve(ctx, nil) }()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	return &catalogFixture{addr: lis.Addr().String(), certsDir: p.Dir}
}

// syncBuffer is a buffer a running command writes while the test reads.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// run runs meshctl as identity against the fixture's catalog. The commands
// share package-level flag state, so these tests do not run in parallel.
func (f *catalogFixture) run(t *testing.T, ctx context.Context, as string, args ...string) (string, error) {
	t.Helper()
	root := newRootCmd()
	out := &syncBuffer{}
	root.SetOut(out)
	root.SetErr(out)
	root.SetArgs(append([]string{"--certs-dir", f.certsDir, "--identity", as, "--catalog", f.addr}, args...))
	err := root.ExecuteContext(ctx)
	return out.String(), err
}

func (f *catalogFixture) must(t *testing.T, as string, args ...string) string {
	t.Helper()
	out, err := f.run(t, t.Context(), as, args...)
	if err != nil {
		t.Fatalf("meshctl %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return out
}

func exampleModuleDirs(t *testing.T) []string {
	t.Helper()
	dirs, err := filepath.Glob(filepath.Join("..", "..", "examples", "modules", "*", "module.yaml"))
	if err != nil || len(dirs) < 5 {
		t.Fatalf("example modules: %v, %v", dirs, err)
	}
	for i, d := range dirs {
		dirs[i] = filepath.Dir(d)
	}
	return dirs
}

func TestCatalogPublishAndRead(t *testing.T) {
	f := startCatalog(t)
	dirs := exampleModuleDirs(t)
	args := append([]string{"catalog", "publish", "--no-git", "--repository", "https://git.example/mesh.git"}, dirs...)
	out := f.must(t, "builder-ci", args...)
	if n := strings.Count(out, "entry stored"); n != len(dirs) || strings.Count(out, "registered (1)") != len(dirs) {
		t.Fatalf("first publish:\n%s", out)
	}
	if !strings.Contains(out, "1 artifacts uploaded") {
		t.Errorf("node-exporter's artifact was not uploaded:\n%s", out)
	}
	out = f.must(t, "builder-ci", args...)
	if strings.Count(out, "unchanged") != len(dirs) {
		t.Fatalf("second publish changed something:\n%s", out)
	}
	// Operators may not upload: publish needs a builder.
	if _, err := f.run(t, t.Context(), "operator-admin", "catalog", "publish", filepath.Join("..", "..", "examples", "modules", "node-exporter")); err == nil ||
		!strings.Contains(err.Error(), "publishing needs a builder identity") {
		t.Errorf("an operator publishing: %v", err)
	}

	out = f.must(t, "operator-admin", "catalog", "modules")
	for _, d := range dirs {
		if !strings.Contains(out, filepath.Base(d)+" ") {
			t.Errorf("modules lacks %s:\n%s", filepath.Base(d), out)
		}
	}
	hist := f.must(t, "operator-admin", "catalog", "modules", "sshd", "--history", "-o", "json")
	var mod catalogv1.GetModuleResponse
	if err := protojson.Unmarshal([]byte(hist), &mod); err != nil || len(mod.GetHistory()) != 1 {
		t.Fatalf("modules sshd --history: %v\n%s", err, hist)
	}
	fp := mod.GetRegistration().GetFingerprint()

	out = f.must(t, "operator-admin", "catalog", "ls", "--module", "sshd")
	if !strings.Contains(out, fp) || strings.Count(out, "\n") != 2 {
		t.Errorf("ls --module sshd:\n%s", out)
	}
	out = f.must(t, "operator-admin", "catalog", "get", fp)
	for _, want := range []string{"fingerprint:", fp, "sshd:config", "FILE /etc/ssh/sshd_config 0600", "build:", "DONE by builder/ci"} {
		if !strings.Contains(out, want) {
			t.Errorf("get lacks %q:\n%s", want, out)
		}
	}
	// get -o json gives a file put accepts as the same entry.
	js := f.must(t, "operator-admin", "catalog", "get", fp, "-o", "json")
	file := filepath.Join(t.TempDir(), "entry.json")
	if err := os.WriteFile(file, []byte(js), 0o644); err != nil {
		t.Fatal(err)
	}
	if out := f.must(t, "operator-admin", "catalog", "put", file); !strings.Contains(out, "already held") {
		t.Errorf("put of get's output: %s", out)
	}
	out = f.must(t, "operator-admin", "catalog", "get", fp, "--manifest")
	var m typev1.ModuleManifest
	if err := protojson.Unmarshal([]byte(out), &m); err != nil || m.GetModule() != "sshd" || !strings.Contains(m.GetResources()[0].GetText(), "ListenAddress {{ .Facts.ip }}") {
		t.Errorf("get --manifest: %v\n%s", err, out)
	}

	// A missing entry reads as the catalog says it.
	missing := names.FingerprintPrefix + strings.Repeat("0", 64)
	if _, err := f.run(t, t.Context(), "operator-admin", "catalog", "get", missing); err == nil || !strings.Contains(err.Error(), "no entry of fingerprint "+missing) {
		t.Errorf("get of a missing entry: %v", err)
	}
}

// entryYAML is an entry an operator writes by hand: the manifest as an
// object, short enum names, no digests and no fingerprint.
const entryYAML = `module: demo
repository: https://git.example/ops.git
path: modules/demo
source_digest: sha256:0000000000000000000000000000000000000000000000000000000000000001
verdict: PASS
manifest:
  module: demo
  version: "1.0"
  upgrade: {policy: AUTO}
  resources:
    - name: conf
      type: FILE
      path: /etc/demo.conf
      mode: 420
      text: "demo on {{ .Node }}\n"
    - name: bin
      type: FILE
      path: /usr/local/bin/demo
      mode: 493
      artifact: binary:demo
`

func TestCatalogPutBuildUploadDownloadWatch(t *testing.T) {
	f := startCatalog(t)
	dir := t.TempDir()
	file := filepath.Join(dir, "entry.yaml")
	if err := os.WriteFile(file, []byte(entryYAML), 0o644); err != nil {
		t.Fatal(err)
	}
	out := f.must(t, "operator-admin", "catalog", "put", file, "-o", "json")
	var put catalogv1.PutEntryResponse
	if err := protojson.Unmarshal([]byte(out), &put); err != nil || !put.GetCreated() {
		t.Fatalf("put: %v\n%s", err, out)
	}
	fp := put.GetFingerprint()

	// DONE needs the artifact; build uploads it from a file.
	bin := filepath.Join(dir, "demo")
	content := []byte("#!/bin/sh\necho demo\n")
	if err := os.WriteFile(bin, content, 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := f.run(t, t.Context(), "builder-ci", "catalog", "build", fp, "--state", "done"); err == nil || !strings.Contains(err.Error(), "missing binary:demo") {
		t.Fatalf("build without the artifact: %v", err)
	}
	out = f.must(t, "builder-ci", "catalog", "build", fp, "--state", "done", "--artifact", "binary:demo="+bin)
	if !strings.Contains(out, "is DONE (1 artifacts)") {
		t.Fatalf("build: %s", out)
	}
	out = f.must(t, "builder-ci", "catalog", "upload", bin)
	digest := names.Digest(content)
	if !strings.Contains(out, digest) || !strings.Contains(out, "already held") {
		t.Fatalf("upload of a held artifact: %s", out)
	}
	got := filepath.Join(dir, "got")
	f.must(t, "operator-admin", "catalog", "download", digest, got)
	if b, err := os.ReadFile(got); err != nil || !bytes.Equal(b, content) {
		t.Fatalf("download: %q, %v", b, err)
	}

	// watch prints the current state, a caught-up line, then changes.
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	root := newRootCmd()
	out2 := &syncBuffer{}
	root.SetOut(out2)
	root.SetErr(out2)
	root.SetArgs([]string{"--certs-dir", f.certsDir, "--identity", "operator-admin", "--catalog", f.addr, "catalog", "watch"})
	done := make(chan error, 1)
	go func() { done <- root.ExecuteContext(ctx) }()
	waitFor(t, out2, "caught up")
	// The watch goroutine holds the shared flag state; register with a
	// client of its own rather than a second command.
	registerDirect(t, f, "demo", fp)
	waitFor(t, out2, "demo runs at "+fp+" (registration 1 by operator/admin)")
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("watch: %v", err)
	}
}

// registerDirect registers over a client of its own (not through meshctl's
// shared flags, which a running command holds).
func registerDirect(t *testing.T, f *catalogFixture, module, fp string) {
	t.Helper()
	certFile, keyFile := pki.Paths(f.certsDir, "operator-admin")
	cfg, err := pki.ClientTLS(certFile, keyFile, filepath.Join(f.certsDir, pki.CACertFile))
	if err != nil {
		t.Fatal(err)
	}
	cc := testutil.DialTLS(t, f.addr, cfg)
	if _, err := catalogv1.NewCatalogServiceClient(cc).RegisterModule(t.Context(), &catalogv1.RegisterModuleRequest{Module: module, Fingerprint: fp}); err != nil {
		t.Fatal(err)
	}
}

func waitFor(t *testing.T, out *syncBuffer, want string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(out.String(), want) {
		if time.Now().After(deadline) {
			t.Fatalf("no %q within 10s in:\n%s", want, out.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestCatalogRegister registers by hand: the text and JSON answers, the
// no-op of registering the fingerprint a module runs at, the catalog's
// refusals passed on with their words, and the history it leaves.
func TestCatalogRegister(t *testing.T) {
	f := startCatalog(t)
	dir := t.TempDir()
	put := func(yaml string) string {
		t.Helper()
		file := filepath.Join(dir, "entry.yaml")
		if err := os.WriteFile(file, []byte(yaml), 0o644); err != nil {
			t.Fatal(err)
		}
		var resp catalogv1.PutEntryResponse
		if err := protojson.Unmarshal([]byte(f.must(t, "operator-admin", "catalog", "put", file, "-o", "json")), &resp); err != nil {
			t.Fatal(err)
		}
		return resp.GetFingerprint()
	}
	v1 := put(entryYAML)
	v2 := put(strings.Replace(entryYAML, `version: "1.0"`, `version: "1.1"`, 1))
	other := put(strings.ReplaceAll(entryYAML, "demo", "motd"))

	if out := f.must(t, "operator-admin", "catalog", "register", "demo", v1); out != "module demo runs at "+v1+" (registration 1)\n" {
		t.Fatalf("first register: %q", out)
	}
	if out := f.must(t, "operator-admin", "catalog", "register", "demo", v1); out != "module demo already runs at "+v1+" (registration 1)\n" {
		t.Fatalf("register again: %q", out)
	}
	var resp catalogv1.RegisterModuleResponse
	out := f.must(t, "builder-ci", "catalog", "register", "demo", v2, "-o", "json")
	if err := protojson.Unmarshal([]byte(out), &resp); err != nil {
		t.Fatalf("register -o json: %v\n%s", err, out)
	}
	if r := resp.GetRegistration(); !resp.GetChanged() || r.GetSeq() != 2 || r.GetFingerprint() != v2 || r.GetRegisteredBy() != "builder/ci" {
		t.Fatalf("register -o json: %v", &resp)
	}

	missing := names.FingerprintPrefix + strings.Repeat("0", 64)
	for _, c := range []struct {
		name string
		args []string
		want string
	}{
		{"an entry of another module", []string{"demo", other}, "code = FailedPrecondition desc = fingerprint " + other + ` is an entry of module "motd", not "demo"`},
		{"no entry", []string{"demo", missing}, "code = NotFound desc = no entry of fingerprint " + missing},
		{"not a fingerprint", []string{"demo", "fp1:abc"}, `code = InvalidArgument desc = fingerprint "fp1:abc" is not a fingerprint`},
		{"a reserved module", []string{"node", v1}, `code = InvalidArgument desc = module: module name "node" is reserved`},
		{"one argument", []string{"demo"}, "accepts 2 arg(s), received 1"},
	} {
		_, err := f.run(t, t.Context(), "operator-admin", append([]string{"catalog", "register"}, c.args...)...)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want %q", c.name, err, c.want)
		}
	}

	// What register did is the module's history; the refusals left none.
	var mod catalogv1.GetModuleResponse
	hist := f.must(t, "operator-admin", "catalog", "modules", "demo", "--history", "-o", "json")
	if err := protojson.Unmarshal([]byte(hist), &mod); err != nil {
		t.Fatal(err)
	}
	h := mod.GetHistory()
	if len(h) != 2 || h[0].GetFingerprint() != v1 || h[0].GetRegisteredBy() != "operator/admin" || h[1].GetFingerprint() != v2 || mod.GetRegistration().GetSeq() != 2 {
		t.Fatalf("history: %v", &mod)
	}
}
