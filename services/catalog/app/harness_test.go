package app_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"mesh.dev/internal/canonical"
	"mesh.dev/internal/identity"
	"mesh.dev/internal/lint"
	"mesh.dev/internal/names"
	"mesh.dev/internal/natsx"
	"mesh.dev/internal/testutil"
	catalogv1 "mesh.dev/proto/mesh/catalog/v1"
	typev1 "mesh.dev/proto/mesh/type/v1"
	"mesh.dev/services/catalog/app"
)

// world is what a catalog stands on in a test: a PKI and an embedded
// JetStream.
type world struct {
	pki  *testutil.PKI
	nats *natsx.Embedded
	js   jetstream.JetStream
	cfg  app.Config
	opts app.Options
}

func newWorld(t testing.TB) *world {
	t.Helper()
	w := &world{pki: testutil.NewPKI(t)}
	w.nats = testutil.StartJetStream(t)
	_, w.js = testutil.ConnectJetStream(t, w.nats)
	w.cfg = app.Config{Listen: "127.0.0.1:0", MetricsListen: app.MetricsOff}
	return w
}

// restartJetStream restarts the NATS server on its data dir and connects
// anew; catalogs started afterwards use the new connection.
func (w *world) restartJetStream(t testing.TB) {
	t.Helper()
	w.nats = testutil.RestartJetStream(t, w.nats)
	_, w.js = testutil.ConnectJetStream(t, w.nats)
}

// running is a catalog serving on loopback over real mTLS.
type running struct {
	addr    string
	catalog *app.Catalog
	stop    func()
}

// start runs a catalog until stop (or the test's end).
func (w *world) start(t testing.TB) *running {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	opts := w.opts
	if opts.Logger == nil {
		opts.Logger = testLogger(t)
	}
	opts.Listener = lis
	if opts.ServerTLS == nil {
		opts.ServerTLS = w.pki.ServerTLS(t, w.pki.Identity(identity.RoleCatalog, ""))
	}
	if opts.JetStream == nil && w.cfg.NATS.EmbeddedDir == "" && w.cfg.NATS.URL == "" {
		opts.JetStream = w.js
	}
	c, err := app.New(context.Background(), w.cfg, opts)
	if err != nil {
		lis.Close()
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Serve(ctx, nil) }()
	stopped := false
	stop := func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("serve: %v", err)
		}
	}
	t.Cleanup(stop)
	return &running{addr: lis.Addr().String(), catalog: c, stop: stop}
}

func (w *world) client(t testing.TB, r *running, role identity.Role, name string) catalogv1.CatalogServiceClient {
	t.Helper()
	return catalogv1.NewCatalogServiceClient(testutil.Dial(t, w.pki, r.addr, w.pki.Identity(role, name)))
}

func (w *world) builder(t testing.TB, r *running) catalogv1.CatalogServiceClient {
	return w.client(t, r, identity.RoleBuilder, "ci")
}

func (w *world) operator(t testing.TB, r *running) catalogv1.CatalogServiceClient {
	return w.client(t, r, identity.RoleOperator, "admin")
}

func testLogger(t testing.TB) *slog.Logger {
	w := &testWriter{t: t}
	t.Cleanup(func() {
		w.mu.Lock()
		w.done = true
		w.mu.Unlock()
	})
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelWarn}))
}

// testWriter logs to the test until it ends; later lines (a watch ending
// after the test) are dropped, since logging to a finished test panics.
type testWriter struct {
	t    testing.TB
	mu   sync.Mutex
	done bool
}

func (w *testWriter) Write(b []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.done {
		w.t.Log(strings.TrimSpace(string(b)))
	}
	return len(b), nil
}

// manifest is a typical module manifest: a directory, a templated config,
// a binary artifact and a symlink.
func manifest(module, version string) *typev1.ModuleManifest {
	return &typev1.ModuleManifest{
		Module: module, Version: version,
		Resources: []*typev1.ResourceTemplate{
			{Name: "dir", Type: typev1.ResourceType_RESOURCE_TYPE_DIRECTORY, Path: "/etc/" + module, Mode: 0o755},
			{Name: "config", Type: typev1.ResourceType_RESOURCE_TYPE_FILE, Path: "/etc/" + module + "/config", Mode: 0o600,
				Content: &typev1.ResourceTemplate_Text{Text: "Port {{ .Params.port }}\n"}},
			{Name: "bin", Type: typev1.ResourceType_RESOURCE_TYPE_FILE, Path: "/usr/local/bin/" + module, Mode: 0o755,
				Content: &typev1.ResourceTemplate_Artifact{Artifact: "binary:" + module}},
			{Name: "link", Type: typev1.ResourceType_RESOURCE_TYPE_SYMLINK, Path: "/etc/" + module + "/current", Target: "/etc/" + module + "/config"},
		},
		Upgrade: &typev1.Policy{Policy: typev1.UpgradePolicy_UPGRADE_POLICY_AUTO},
	}
}

// entryOf builds a consistent entry of m: canonical manifest bytes and
// their digest, the manifest's needs and artifacts, and the fingerprint.
func entryOf(t testing.TB, m *typev1.ModuleManifest) *catalogv1.Entry {
	t.Helper()
	b, err := canonical.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	e := &catalogv1.Entry{
		Module: m.GetModule(), Repository: "https://git.example/infra.git", Path: "modules/" + m.GetModule(),
		SourceDigest: names.Digest([]byte(m.GetModule() + m.GetVersion())), Commit: strings.Repeat("ab", 20),
		Manifest: b, ManifestDigest: names.Digest(b), Needs: m.GetNeeds(), Verdict: catalogv1.Verdict_VERDICT_PASS,
	}
	for _, ref := range lint.ArtifactRefs(m) {
		kind, _, _ := strings.Cut(ref, ":")
		e.Artifacts = append(e.Artifacts, &catalogv1.ArtifactDecl{Ref: ref, Kind: kind})
	}
	refingerprint(e)
	return e
}

func refingerprint(e *catalogv1.Entry) {
	e.Fingerprint = names.ComputeFingerprint(e.GetModule(), e.GetRepository(), e.GetPath(), e.GetSourceDigest(), e.GetManifestDigest())
}

// putEntry stores an entry of module at version and returns it.
func putEntry(t testing.TB, c catalogv1.CatalogServiceClient, module, version string) *catalogv1.Entry {
	t.Helper()
	e := entryOf(t, manifest(module, version))
	if _, err := c.PutEntry(context.Background(), &catalogv1.PutEntryRequest{Entry: e}); err != nil {
		t.Fatal(err)
	}
	return e
}

// upload stores content as an artifact and returns its descriptor.
func upload(t testing.TB, c catalogv1.CatalogServiceClient, ref string, content []byte) *typev1.Artifact {
	t.Helper()
	digest := names.Digest(content)
	stream, err := c.UploadArtifact(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	send(t, stream, header(digest, int64(len(content))))
	for off := 0; off < len(content); off += 100 << 10 {
		send(t, stream, chunk(content[off:min(off+100<<10, len(content))]))
	}
	resp, err := stream.CloseAndRecv()
	if err != nil {
		t.Fatal(err)
	}
	if resp.GetDigest() != digest || resp.GetSize() != int64(len(content)) {
		t.Fatalf("upload answered %v", resp)
	}
	return &typev1.Artifact{Ref: ref, Digest: digest, Size: int64(len(content))}
}

func header(digest string, size int64) *catalogv1.UploadArtifactRequest {
	return &catalogv1.UploadArtifactRequest{Msg: &catalogv1.UploadArtifactRequest_Header{Header: &catalogv1.ArtifactHeader{Digest: digest, Size: size}}}
}

func chunk(b []byte) *catalogv1.UploadArtifactRequest {
	return &catalogv1.UploadArtifactRequest{Msg: &catalogv1.UploadArtifactRequest_Chunk{Chunk: b}}
}

func send(t testing.TB, stream interface {
	Send(*catalogv1.UploadArtifactRequest) error
}, m *catalogv1.UploadArtifactRequest) {
	t.Helper()
	if err := stream.Send(m); err != nil {
		t.Fatalf("send: %v", err)
	}
}

// release puts an entry of module, uploads its artifact, records its DONE
// build and returns the entry.
func release(t testing.TB, c catalogv1.CatalogServiceClient, module, version string) *catalogv1.Entry {
	t.Helper()
	e := putEntry(t, c, module, version)
	art := upload(t, c, "binary:"+module, []byte(module+" "+version+" binary"))
	if _, err := c.PutBuild(context.Background(), &catalogv1.PutBuildRequest{Build: &catalogv1.Build{
		Fingerprint: e.GetFingerprint(), State: catalogv1.BuildState_BUILD_STATE_DONE, Artifacts: []*typev1.Artifact{art},
	}}); err != nil {
		t.Fatal(err)
	}
	return e
}

// mustCode fails unless err has the code and its message contains every
// string of contains.
func mustCode(t testing.TB, err error, want fmt.Stringer, contains ...string) {
	t.Helper()
	if err == nil {
		t.Fatalf("got no error, want %v", want)
	}
	got := status.Code(err)
	if got.String() != want.String() {
		t.Fatalf("code %v (%v), want %v", got, err, want)
	}
	for _, c := range contains {
		if !strings.Contains(status.Convert(err).Message(), c) {
			t.Fatalf("message %q does not contain %q", status.Convert(err).Message(), c)
		}
	}
}

// eventually waits for cond with a deadline, polling: for states that
// settle after a stream ends on the server's side.
func eventually(t testing.TB, what string, cond func() (bool, error)) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		ok, err := cond()
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 10s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func statusMessage(err error) string { return status.Convert(err).Message() }

func codeOf(err error) codes.Code { return status.Code(err) }
