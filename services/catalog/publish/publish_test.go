package publish_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"mesh.dev/internal/canonical"
	"mesh.dev/internal/identity"
	"mesh.dev/internal/lint"
	"mesh.dev/internal/names"
	"mesh.dev/internal/testutil"
	catalogv1 "mesh.dev/proto/mesh/catalog/v1"
	typev1 "mesh.dev/proto/mesh/type/v1"
	"mesh.dev/services/catalog/app"
	"mesh.dev/services/catalog/publish"
)

// examples is the directory of the example modules.
var examples = filepath.Join("..", "..", "..", "examples", "modules")

func exampleDirs(t testing.TB) []string {
	t.Helper()
	entries, err := os.ReadDir(examples)
	if err != nil {
		t.Fatal(err)
	}
	var dirs []string
	for _, e := range entries {
		if e.IsDir() {
			dirs = append(dirs, filepath.Join(examples, e.Name()))
		}
	}
	if len(dirs) < 5 {
		t.Fatalf("only %d example modules", len(dirs))
	}
	return dirs
}

// catalog starts a catalog over real mTLS on an embedded JetStream and
// returns clients as a builder and as an operator.
func catalog(t testing.TB) (builder, operator catalogv1.CatalogServiceClient) {
	t.Helper()
	p := testutil.NewPKI(t)
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
		if err := <-done; err != nil {
			t.Errorf("serve: %v", err)
		}
	})
	dial := func(role identity.Role, name string) catalogv1.CatalogServiceClient {
		return catalogv1.NewCatalogServiceClient(testutil.Dial(t, p, lis.Addr().String(), p.Identity(role, name)))
	}
	return dial(identity.RoleBuilder, "ci"), dial(identity.RoleOperator, "admin")
}

func opts(dir string) publish.Options {
	return publish.Options{NoGit: true, Repository: "https://git.example/mesh.git", Path: "examples/modules/" + filepath.Base(dir)}
}

func TestLoadExamples(t *testing.T) {
	t.Parallel()
	mods := map[string]*publish.Module{}
	for _, dir := range exampleDirs(t) {
		m, err := publish.Load(dir, nil)
		if err != nil {
			t.Fatal(err)
		}
		if len(m.Warnings) > 0 {
			t.Errorf("%s: warnings %v", dir, m.Warnings)
		}
		mods[m.Manifest.GetModule()] = m
	}
	resource := func(module, name string) *typev1.ResourceTemplate {
		for _, r := range mods[module].Manifest.GetResources() {
			if r.GetName() == name {
				return r
			}
		}
		t.Fatalf("%s has no resource %s", module, name)
		return nil
	}
	if !strings.Contains(resource("sshd", "config").GetText(), "ListenAddress {{ .Facts.ip }}") ||
		!strings.Contains(resource("sshd", "config").GetText(), "Port {{ .Params.port }}") {
		t.Error("sshd config is not templated per node")
	}
	if resource("sshd", "config-dir").GetType() != typev1.ResourceType_RESOURCE_TYPE_DIRECTORY {
		t.Error("sshd has no drop-in directory")
	}
	if !strings.Contains(resource("motd", "motd").GetText(), "{{ .Node }}") {
		t.Error("motd is not templated with .Node")
	}
	if resource("node-exporter", "binary").GetArtifact() != "binary:node-exporter" || len(mods["node-exporter"].Artifacts) != 1 {
		t.Error("node-exporter has no binary artifact")
	}
	if !resource("users", "allowed").GetUserList() {
		t.Error("the users file is not a user list")
	}
	if n := len(resource("ca-bundle", "bundle").GetRaw()); n <= lint.MaxInlineContent {
		t.Errorf("ca-bundle file is %d bytes, not over 64 KiB", n)
	}
	pg := mods["postgres"].Manifest
	if len(pg.GetDataPaths()) == 0 || pg.GetUpgrade().GetPolicy() != typev1.UpgradePolicy_UPGRADE_POLICY_MANUAL || pg.GetUpgrade().GetWhy() == "" {
		t.Errorf("postgres: data paths %v, upgrade %v", pg.GetDataPaths(), pg.GetUpgrade())
	}
	if needs := mods["backup"].Manifest.GetNeeds(); len(needs) != 1 || needs[0].GetModule() != "postgres" {
		t.Errorf("backup needs %v", needs)
	}
	// Engines apply into a root dir under a few prefixes.
	for name, m := range mods {
		for _, r := range m.Manifest.GetResources() {
			if !slices.ContainsFunc([]string{"/etc/", "/usr/local/bin/", "/var/lib/", "/opt/"}, func(p string) bool { return strings.HasPrefix(r.GetPath(), p) }) {
				t.Errorf("%s:%s path %s is outside /etc, /usr/local/bin, /var/lib and /opt", name, r.GetName(), r.GetPath())
			}
		}
	}
}

// TestPublishExamples publishes every example module, then publishes them
// again: the second pass changes nothing.
func TestPublishExamples(t *testing.T) {
	t.Parallel()
	builder, operator := catalog(t)
	ctx := context.Background()
	fps := map[string]string{}
	for _, dir := range exampleDirs(t) {
		res, err := publish.Dir(ctx, builder, dir, opts(dir))
		if err != nil {
			t.Fatal(err)
		}
		if !res.EntryCreated || !res.BuildRecorded || !res.Registered || res.Registration.GetSeq() != 1 {
			t.Errorf("%s: first publish %+v", dir, res)
		}
		if wantUploads := len(res.Entry.GetArtifacts()); res.Uploaded != wantUploads {
			t.Errorf("%s: %d uploads, want %d", dir, res.Uploaded, wantUploads)
		}
		if res.Entry.GetVerdict() != catalogv1.Verdict_VERDICT_PASS {
			t.Errorf("%s: verdict %v", dir, res.Entry.GetVerdict())
		}
		fps[res.Module] = res.Fingerprint
	}
	for _, dir := range exampleDirs(t) {
		res, err := publish.Dir(ctx, builder, dir, opts(dir))
		if err != nil {
			t.Fatal(err)
		}
		if res.Changed() || res.Fingerprint != fps[res.Module] {
			t.Errorf("%s: second publish changed something: %+v", dir, res)
		}
	}
	for module, fp := range fps {
		m, err := operator.GetModule(ctx, &catalogv1.GetModuleRequest{Module: module, History: true})
		if err != nil || m.GetRegistration().GetFingerprint() != fp || len(m.GetHistory()) != 1 {
			t.Errorf("%s: %v, %v", module, m, err)
		}
		e, err := operator.GetEntry(ctx, &catalogv1.GetEntryRequest{Fingerprint: fp})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := lint.CheckEntry(e.GetEntry()); err != nil {
			t.Errorf("%s: the stored entry does not check: %v", module, err)
		}
	}

	// The artifact downloads as the local file.
	b, err := builder.GetBuild(ctx, &catalogv1.GetBuildRequest{Fingerprint: fps["node-exporter"]})
	if err != nil || b.GetBuild().GetState() != catalogv1.BuildState_BUILD_STATE_DONE {
		t.Fatalf("node-exporter build: %v, %v", b, err)
	}
	want, err := os.ReadFile(filepath.Join(examples, "node-exporter", "bin", "node-exporter"))
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "node-exporter")
	if _, err := publish.DownloadFile(ctx, operator, b.GetBuild().GetArtifacts()[0].GetDigest(), out, false); err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(out); !bytes.Equal(got, want) {
		t.Error("downloaded artifact differs from the local file")
	}

	// A change to a module makes a new fingerprint and registration.
	dir := copyDir(t, filepath.Join(examples, "motd"))
	appendFile(t, filepath.Join(dir, "files", "motd"), "  Backups run nightly.\n")
	res, err := publish.Dir(ctx, builder, dir, opts(dir))
	if err != nil {
		t.Fatal(err)
	}
	if res.Fingerprint == fps["motd"] || !res.Registered || res.Registration.GetSeq() != 2 {
		t.Errorf("changed motd: %+v", res)
	}
}

func TestPublishFailVerdictIsNotRegistered(t *testing.T) {
	t.Parallel()
	builder, operator := catalog(t)
	dir := filepath.Join(examples, "motd")
	o := opts(dir)
	o.Problems = []string{"motd renders an empty file on nodes without a name"}
	res, err := publish.Dir(context.Background(), builder, dir, o)
	if !errors.Is(err, publish.ErrFailed) || !strings.Contains(err.Error(), "the module is not registered") {
		t.Fatalf("publish of a FAIL: %v", err)
	}
	if !res.EntryCreated || res.Entry.GetVerdict() != catalogv1.Verdict_VERDICT_FAIL || res.Registered {
		t.Fatalf("result %+v", res)
	}
	_, err = operator.GetModule(context.Background(), &catalogv1.GetModuleRequest{Module: "motd"})
	if status.Code(err) != codes.NotFound {
		t.Fatalf("a FAIL entry was registered: %v", err)
	}
}

func TestPublishWarningsMakeWarn(t *testing.T) {
	t.Parallel()
	dir := copyDir(t, filepath.Join(examples, "motd"))
	writeFile(t, filepath.Join(dir, "module.yaml"), strings.Replace(readFile(t, filepath.Join(dir, "module.yaml")), `mode: "0644"`, `mode: "0666"`, 1))
	mod, err := publish.Load(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	e, _, err := publish.NewEntry(context.Background(), mod, opts(dir))
	if err != nil {
		t.Fatal(err)
	}
	if e.GetVerdict() != catalogv1.Verdict_VERDICT_WARN || len(e.GetWarnings()) != 1 || !strings.Contains(e.GetWarnings()[0], "mode 0666 is world-writable") {
		t.Fatalf("entry %v", e)
	}
	if _, err := lint.CheckEntry(e); err != nil {
		t.Fatal(err)
	}
}

func TestLoadRefuses(t *testing.T) {
	t.Parallel()
	base := `module: demo
version: 1.0
upgrade: {policy: AUTO}
resources:
  - name: conf
    type: file
    path: /etc/demo.conf
    mode: "0644"
    source: files/demo.conf
`
	cases := []struct {
		name  string
		yaml  string
		files map[string]string
		msg   string
	}{
		{"unknown key", base + "colour: blue\n", nil, "field colour not found"},
		{"bad mode", strings.Replace(base, `"0644"`, `"0999"`, 1), nil, `mode "0999" is not octal 0 to 7777`},
		{"bad type", strings.Replace(base, "type: file", "type: pipe", 1), nil, `resources[0].type "pipe" is not file, directory or symlink`},
		{"bad policy", strings.Replace(base, "AUTO", "SOMETIMES", 1), nil, `upgrade.policy "SOMETIMES" is not AUTO, MANUAL or PINNED`},
		{"source leaves the directory", strings.Replace(base, "files/demo.conf", "../other/demo.conf", 1), nil, `resources[0].source: "../other/demo.conf" leaves the module directory`},
		{"source missing", strings.Replace(base, "files/demo.conf", "files/none.conf", 1), nil, "resources[0].source: open"},
		{"text and source", base + "    text: x\n", nil, "resources[0]: give one of text, source and artifact"},
		{"render without source", strings.Replace(base, "    source: files/demo.conf\n", "    text: x\n    render: false\n", 1), nil, "resources[0].render applies to a source only"},
		{"invalid manifest", strings.Replace(base, "/etc/demo.conf", "etc/demo.conf", 1), nil, `resources[0].path "etc/demo.conf" is not absolute`},
		{"bad template", base, map[string]string{"files/demo.conf": "{{ .Params.x "}, "resources[0].text: template does not parse"},
		{"artifact without file", base + "  - name: bin\n    type: file\n    path: /usr/local/bin/demo\n    artifact: binary:demo\n", nil,
			`artifact "binary:demo" is named by a resource but no artifacts entry gives its file`},
		{"artifact named by nothing", base + "artifacts:\n  - ref: binary:demo\n    file: files/demo.conf\n", nil, `artifacts[0].ref "binary:demo" is named by no resource`},
		{"empty", "", nil, "module.yaml is empty"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			writeFile(t, filepath.Join(dir, "module.yaml"), tc.yaml)
			writeFile(t, filepath.Join(dir, "files", "demo.conf"), "demo = 1\n")
			for name, content := range tc.files {
				writeFile(t, filepath.Join(dir, name), content)
			}
			_, err := publish.Load(dir, nil)
			if err == nil || !strings.Contains(err.Error(), tc.msg) {
				t.Fatalf("Load = %v, want %q", err, tc.msg)
			}
		})
	}
	t.Run("symlink in the directory", func(t *testing.T) {
		t.Parallel()
		dir := t.TempDir()
		writeFile(t, filepath.Join(dir, "module.yaml"), base)
		writeFile(t, filepath.Join(dir, "files", "demo.conf"), "demo = 1\n")
		if err := os.Symlink("demo.conf", filepath.Join(dir, "files", "link")); err != nil {
			t.Fatal(err)
		}
		if _, err := publish.Load(dir, nil); err == nil || !strings.Contains(err.Error(), "files/link is not a regular file") {
			t.Fatalf("Load = %v", err)
		}
	})
}

// TestSourceDigest checks that the source digest follows content, names
// and the executable bit, and nothing else (not the umask of a checkout).
func TestSourceDigest(t *testing.T) {
	t.Parallel()
	load := func(dir string) *publish.Module {
		t.Helper()
		m, err := publish.Load(dir, nil)
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	orig := load(filepath.Join(examples, "backup"))
	dir := copyDir(t, filepath.Join(examples, "backup"))
	if got := load(dir); got.SourceDigest != orig.SourceDigest {
		t.Fatal("a copy has another source digest")
	}
	if err := os.Chmod(filepath.Join(dir, "files", "backup.conf"), 0o664); err != nil {
		t.Fatal(err)
	}
	if got := load(dir); got.SourceDigest != orig.SourceDigest {
		t.Error("group write permission changed the source digest")
	}
	if err := os.Chmod(filepath.Join(dir, "files", "backup.conf"), 0o755); err != nil {
		t.Fatal(err)
	}
	exec := load(dir)
	if exec.SourceDigest == orig.SourceDigest {
		t.Error("the executable bit did not change the source digest")
	}
	writeFile(t, filepath.Join(dir, "NOTES"), "not named by module.yaml, still part of the source\n")
	if got := load(dir); got.SourceDigest == exec.SourceDigest {
		t.Error("a new file did not change the source digest")
	}
	var paths []string
	for _, f := range orig.Files {
		paths = append(paths, f.Path)
	}
	if want := []string{"files/backup.conf", "files/mesh-backup", "module.yaml"}; !slices.Equal(paths, want) {
		t.Errorf("files %v, want %v", paths, want)
	}
	digest, err := names.ComputeSourceDigest(orig.Files)
	if err != nil || digest != orig.SourceDigest {
		t.Errorf("source digest %s is not names.ComputeSourceDigest of the files (%s, %v)", orig.SourceDigest, digest, err)
	}
	again, err := canonical.Marshal(orig.Manifest)
	if err != nil || !bytes.Equal(again, orig.ManifestBytes) {
		t.Error("manifest bytes are not canonical")
	}
}

// TestPublishFromGit publishes from a git checkout: the commit is recorded,
// a later commit that leaves the module alone keeps the fingerprint and the
// first commit, and uncommitted changes record none.
func TestPublishFromGit(t *testing.T) {
	t.Parallel()
	if _, err := exec.LookPath("git"); err != nil {
		t.Skip("git is not installed")
	}
	builder, _ := catalog(t)
	ctx := context.Background()
	repo := t.TempDir()
	git := func(args ...string) string {
		t.Helper()
		cmd := exec.Command("git", append([]string{"-C", repo, "-c", "user.name=ci", "-c", "user.email=ci@example.invalid", "-c", "commit.gpgsign=false"}, args...)...)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("git %v: %v\n%s", args, err, out)
		}
		return strings.TrimSpace(string(out))
	}
	git("init", "-q")
	dir := filepath.Join(repo, "modules", "motd")
	copyInto(t, filepath.Join(examples, "motd"), dir)
	git("add", ".")
	git("commit", "-q", "-m", "motd")
	first := git("rev-parse", "HEAD")

	res, err := publish.Dir(ctx, builder, dir, publish.Options{})
	if err != nil {
		t.Fatal(err)
	}
	root, _ := filepath.EvalSymlinks(repo)
	if res.Entry.GetCommit() != first || res.Entry.GetPath() != "modules/motd" || res.Entry.GetRepository() != "file://"+filepath.ToSlash(root) {
		t.Fatalf("entry from git: commit %q path %q repository %q", res.Entry.GetCommit(), res.Entry.GetPath(), res.Entry.GetRepository())
	}

	writeFile(t, filepath.Join(repo, "README"), "unrelated\n")
	git("add", ".")
	git("commit", "-q", "-m", "readme")
	again, err := publish.Dir(ctx, builder, dir, publish.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if again.Fingerprint != res.Fingerprint || again.Changed() || again.Entry.GetCommit() != first {
		t.Fatalf("after an unrelated commit: %+v", again)
	}
	if len(again.Notes) == 0 || !strings.Contains(again.Notes[0], "the first with this source") {
		t.Errorf("notes %v", again.Notes)
	}

	appendFile(t, filepath.Join(dir, "files", "motd"), "uncommitted\n")
	mod, err := publish.Load(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	e, notes, err := publish.NewEntry(ctx, mod, publish.Options{})
	if err != nil || e.GetCommit() != "" || len(notes) != 1 || !strings.Contains(notes[0], "uncommitted changes") {
		t.Fatalf("dirty: commit %q, notes %v, %v", e.GetCommit(), notes, err)
	}
}

func TestDownloadFileResumes(t *testing.T) {
	t.Parallel()
	builder, operator := catalog(t)
	ctx := context.Background()
	content := bytes.Repeat([]byte("0123456789abcdef"), 80<<10) // 1.25 MiB
	src := filepath.Join(t.TempDir(), "artifact")
	writeFile(t, src, string(content))
	up, err := publish.UploadFile(ctx, builder, src)
	if err != nil || !up.GetCreated() {
		t.Fatalf("upload: %v, %v", up, err)
	}
	if again, err := publish.UploadFile(ctx, builder, src); err != nil || again.GetCreated() {
		t.Fatalf("upload again: %v, %v", again, err)
	}
	out := filepath.Join(t.TempDir(), "out")
	writeFile(t, out+".part", string(content[:300000])) // an interrupted download
	if _, err := publish.DownloadFile(ctx, operator, up.GetDigest(), out, true); err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(out); !bytes.Equal(got, content) {
		t.Fatal("resumed download differs")
	}
	if _, err := os.Stat(out + ".part"); !os.IsNotExist(err) {
		t.Error("the .part file is left")
	}
	writeFile(t, out+".part", "garbage that is not the artifact's start")
	if _, err := publish.DownloadFile(ctx, operator, up.GetDigest(), out, true); err == nil || !strings.Contains(err.Error(), "the bytes received have digest") {
		t.Fatalf("resume over wrong bytes: %v", err)
	}
}

func TestModeYAML(t *testing.T) {
	t.Parallel()
	dir := copyDir(t, filepath.Join(examples, "motd"))
	for _, mode := range []string{"0644", `"0644"`, "0o644", "644"} {
		writeFile(t, filepath.Join(dir, "module.yaml"), strings.Replace(readFile(t, filepath.Join(examples, "motd", "module.yaml")), `mode: "0644"`, "mode: "+mode, 1))
		m, err := publish.Load(dir, nil)
		if err != nil {
			t.Fatal(err)
		}
		if got := m.Manifest.GetResources()[0].GetMode(); got != 0o644 {
			t.Errorf("mode %s read as %o", mode, got)
		}
	}
}

func readFile(t testing.TB, name string) string {
	t.Helper()
	b, err := os.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func writeFile(t testing.TB, name, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(name), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(name, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

func appendFile(t testing.TB, name, content string) {
	t.Helper()
	writeFile(t, name, readFile(t, name)+content)
}

func copyDir(t testing.TB, src string) string {
	t.Helper()
	dst := filepath.Join(t.TempDir(), filepath.Base(src))
	copyInto(t, src, dst)
	return dst
}

func copyInto(t testing.TB, src, dst string) {
	t.Helper()
	if err := os.CopyFS(dst, os.DirFS(src)); err != nil {
		t.Fatal(err)
	}
	// CopyFS writes files 0644 or 0755 as their sources are: keep modes.
	err := filepath.WalkDir(src, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		return os.Chmod(filepath.Join(dst, rel), info.Mode().Perm())
	})
	if err != nil {
		t.Fatal(err)
	}
}
