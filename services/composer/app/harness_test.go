package app_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	"mesh.dev/internal/canonical"
	"mesh.dev/internal/identity"
	"mesh.dev/internal/keyfile"
	"mesh.dev/internal/names"
	"mesh.dev/internal/natsx"
	"mesh.dev/internal/testutil"
	"mesh.dev/internal/verify"
	catalogv1 "mesh.dev/proto/mesh/catalog/v1"
	composerv1 "mesh.dev/proto/mesh/composer/v1"
	typev1 "mesh.dev/proto/mesh/type/v1"
	catalogapp "mesh.dev/services/catalog/app"
	"mesh.dev/services/composer/app"
	"mesh.dev/services/composer/internal/pass"
	signerapp "mesh.dev/services/signer/app"
)

func testLogger(t testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn}))
}

type testWriter struct{ t testing.TB }

func (w testWriter) Write(b []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(b)))
	return len(b), nil
}

// world is a catalog, a signer and a shared embedded JetStream over real
// mTLS, for composers to run against.
type world struct {
	t       testing.TB
	pki     *testutil.PKI
	trust   *testutil.Trust
	js      jetstream.JetStream
	dir     string
	catalog catalogv1.CatalogServiceClient
	// catalogAddr and signerAddr are where the services listen.
	catalogAddr, signerAddr string
	roots                   *typev1.TrustRoots

	mu     sync.Mutex
	passes map[string]int
	// lastPass holds each node's last pass result.
	lastPass map[string]*pass.Result
	lastErr  map[string]error
}

func listen(t testing.TB) net.Listener {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return lis
}

func serve(t testing.TB, name string, run func(ctx context.Context) error) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("%s: %v", name, err)
		}
	})
}

func newWorld(t testing.TB) *world {
	t.Helper()
	w := &world{t: t, pki: testutil.NewPKI(t), trust: testutil.NewTrust(t, 1, 1), dir: t.TempDir(),
		passes: map[string]int{}, lastPass: map[string]*pass.Result{}, lastErr: map[string]error{}}
	w.roots = w.trust.Roots
	e := testutil.StartJetStream(t)
	_, w.js = testutil.ConnectJetStream(t, e)

	// Catalog.
	clis := listen(t)
	w.catalogAddr = clis.Addr().String()
	cat, err := catalogapp.New(context.Background(), catalogapp.Config{Listen: w.catalogAddr, MetricsListen: catalogapp.MetricsOff},
		catalogapp.Options{Logger: testLogger(t), JetStream: w.js, Listener: clis, ServerTLS: w.pki.ServerTLS(t, w.pki.Identity(identity.RoleCatalog, ""))})
	if err != nil {
		t.Fatal(err)
	}
	serve(t, "catalog", func(ctx context.Context) error { return cat.Serve(ctx, nil) })

	// Signer, cross-checking against the real catalog.
	rootsFile, keysetFile := filepath.Join(w.dir, "roots.json"), filepath.Join(w.dir, "keyset.json")
	must(t, keyfile.WriteJSON(rootsFile, w.trust.Roots, 0o644))
	must(t, keyfile.WriteJSON(keysetFile, w.trust.KeysetEnvelope, 0o644))
	signingKey := filepath.Join(w.dir, "signer-key.pem")
	must(t, keyfile.Write(signingKey, w.trust.SigningKey))
	slis := listen(t)
	w.signerAddr = slis.Addr().String()
	signerCatalog := catalogv1.NewCatalogServiceClient(testutil.Dial(t, w.pki, w.catalogAddr, w.pki.Identity(identity.RoleSigner, "")))
	sig, err := signerapp.New(context.Background(), signerapp.Config{
		Listen: w.signerAddr, SigningKeyFile: signingKey, KeysetFile: keysetFile, RootsFile: rootsFile,
		StateDir: filepath.Join(w.dir, "signer"), OwnPrefixes: []string{"/etc", "/opt", "/var/lib"}, CatalogAddr: w.catalogAddr,
	}, signerapp.Options{Logger: testLogger(t), Listener: slis, ServerTLS: w.pki.ServerTLS(t, w.pki.Identity(identity.RoleSigner, "")), Catalog: signerCatalog})
	if err != nil {
		t.Fatal(err)
	}
	serve(t, "signer", func(ctx context.Context) error { return sig.Serve(ctx, nil) })

	w.catalog = catalogv1.NewCatalogServiceClient(testutil.Dial(t, w.pki, w.catalogAddr, w.pki.Identity(identity.RoleBuilder, "ci")))
	return w
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// composer is one running composer process (in this test process).
type composer struct {
	c      *app.Composer
	addr   string
	stop   func()
	holder string
}

// startComposer runs a composer over real mTLS against the world.
func (w *world) startComposer(t testing.TB, holder string, mutate ...func(*app.Config)) *composer {
	t.Helper()
	lis := listen(t)
	cfg := app.Config{Listen: lis.Addr().String(), SignerAddr: w.signerAddr, CatalogAddr: w.catalogAddr, Holder: holder,
		LeaseTTL: 0, Workers: 8}
	for _, m := range mutate {
		m(&cfg)
	}
	id := w.pki.Identity(identity.RoleComposer, "")
	c, err := app.New(context.Background(), cfg, app.Options{
		Logger: testLogger(t), JetStream: w.js, Listener: lis, Roots: w.roots,
		ServerTLS: w.pki.ServerTLS(t, id), ClientTLS: w.pki.ClientTLS(t, id),
		OnPass: func(node string, res *pass.Result, err error) {
			w.mu.Lock()
			w.passes[node]++
			w.lastPass[node], w.lastErr[node] = res, err
			w.mu.Unlock()
		},
	})
	if err != nil {
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
		if err := <-done; err != nil {
			t.Errorf("composer %s: %v", holder, err)
		}
	}
	t.Cleanup(stop)
	return &composer{c: c, addr: lis.Addr().String(), stop: stop, holder: holder}
}

func (w *world) operator(t testing.TB, c *composer) composerv1.ComposerServiceClient {
	return composerv1.NewComposerServiceClient(testutil.Dial(t, w.pki, c.addr, w.pki.Identity(identity.RoleOperator, "admin")))
}

func (w *world) as(t testing.TB, addr string, role identity.Role, name string) *grpc.ClientConn {
	return testutil.Dial(t, w.pki, addr, w.pki.Identity(role, name))
}

// release publishes a module manifest to the catalog as a builder would:
// the entry, its artifacts, a DONE build, and the registration. It returns
// the fingerprint.
func (w *world) release(t testing.TB, m *typev1.ModuleManifest, artifacts map[string][]byte) string {
	t.Helper()
	ctx := context.Background()
	b, err := canonical.Marshal(m)
	must(t, err)
	src := names.Digest([]byte(fmt.Sprintf("%s/%s/%d", m.GetModule(), m.GetVersion(), len(b))))
	fp := names.ComputeFingerprint(m.GetModule(), "git.example/infra", "modules/"+m.GetModule(), src, names.Digest(b))
	entry := &catalogv1.Entry{Fingerprint: fp, Module: m.GetModule(), Repository: "git.example/infra", Path: "modules/" + m.GetModule(),
		SourceDigest: src, Commit: "0123456789abcdef0123456789abcdef01234567", Manifest: b, ManifestDigest: names.Digest(b), Needs: m.GetNeeds(), Verdict: catalogv1.Verdict_VERDICT_PASS}
	var built []*typev1.Artifact
	for ref, content := range artifacts {
		kind, _, _ := strings.Cut(ref, ":")
		entry.Artifacts = append(entry.Artifacts, &catalogv1.ArtifactDecl{Ref: ref, Kind: kind})
		built = append(built, &typev1.Artifact{Ref: ref, Digest: names.Digest(content), Size: int64(len(content))})
		up, err := w.catalog.UploadArtifact(ctx)
		must(t, err)
		must(t, up.Send(&catalogv1.UploadArtifactRequest{Msg: &catalogv1.UploadArtifactRequest_Header{Header: &catalogv1.ArtifactHeader{Digest: names.Digest(content), Size: int64(len(content))}}}))
		must(t, up.Send(&catalogv1.UploadArtifactRequest{Msg: &catalogv1.UploadArtifactRequest_Chunk{Chunk: content}}))
		if _, err := up.CloseAndRecv(); err != nil && !errors.Is(err, io.EOF) {
			t.Fatal(err)
		}
	}
	sortDecls(entry.Artifacts)
	sortArtifacts(built)
	if _, err := w.catalog.PutEntry(ctx, &catalogv1.PutEntryRequest{Entry: entry}); err != nil {
		t.Fatalf("PutEntry %s: %v", m.GetModule(), err)
	}
	if _, err := w.catalog.PutBuild(ctx, &catalogv1.PutBuildRequest{Build: &catalogv1.Build{Fingerprint: fp, State: catalogv1.BuildState_BUILD_STATE_DONE, Artifacts: built}}); err != nil {
		t.Fatalf("PutBuild %s: %v", m.GetModule(), err)
	}
	if _, err := w.catalog.RegisterModule(ctx, &catalogv1.RegisterModuleRequest{Module: m.GetModule(), Fingerprint: fp}); err != nil {
		t.Fatalf("RegisterModule %s: %v", m.GetModule(), err)
	}
	return fp
}

func sortDecls(d []*catalogv1.ArtifactDecl) {
	for i := 1; i < len(d); i++ {
		for j := i; j > 0 && d[j-1].GetRef() > d[j].GetRef(); j-- {
			d[j-1], d[j] = d[j], d[j-1]
		}
	}
}

func sortArtifacts(d []*typev1.Artifact) {
	for i := 1; i < len(d); i++ {
		for j := i; j > 0 && d[j-1].GetRef() > d[j].GetRef(); j-- {
			d[j-1], d[j] = d[j], d[j-1]
		}
	}
}

func text(s string) *typev1.ResourceTemplate_Text { return &typev1.ResourceTemplate_Text{Text: s} }

const (
	fileType = typev1.ResourceType_RESOURCE_TYPE_FILE
	dirType  = typev1.ResourceType_RESOURCE_TYPE_DIRECTORY
)

var auto = &typev1.Policy{Policy: typev1.UpgradePolicy_UPGRADE_POLICY_AUTO}

func sshd(version, extra string) *typev1.ModuleManifest {
	return &typev1.ModuleManifest{Module: "sshd", Version: version, Upgrade: auto, Resources: []*typev1.ResourceTemplate{
		{Name: "dir", Type: dirType, Path: "/etc/ssh", Mode: 0o755},
		{Name: "config", Type: fileType, Path: "/etc/ssh/sshd_config", Mode: 0o600, Content: text("Port {{ .Params.port }}\n" + extra)},
	}}
}

func motd(version string) *typev1.ModuleManifest {
	return &typev1.ModuleManifest{Module: "motd", Version: version, Upgrade: auto, Resources: []*typev1.ResourceTemplate{
		{Name: "motd", Type: fileType, Path: "/etc/motd", Mode: 0o644, Content: text("Welcome to {{ .Node }} (" + version + ")\n")},
	}}
}

func spec(t testing.TB, node string, modules ...string) *composerv1.NodeSpec {
	s := &composerv1.NodeSpec{Node: node, Labels: map[string]string{"zone": "a"}}
	for _, m := range modules {
		params, _ := structpb.NewStruct(map[string]any{"port": 22})
		s.Modules = append(s.Modules, &composerv1.PlacedModule{Module: m, Params: params})
	}
	return s
}

// waitFor polls cond until it holds or the deadline passes.
func waitFor(t testing.TB, what string, d time.Duration, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(d)
	last := ""
	for time.Now().Before(deadline) {
		ok, why := cond()
		if ok {
			return
		}
		last = why
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("%s: not within %s: %s", what, d, last)
}

// assignment reads a node's assignment straight from JetStream.
func (w *world) assignment(t testing.TB, node string) (*composerv1.Assignment, uint64, error) {
	kv, err := natsx.OpenKV(context.Background(), w.js, natsx.BucketAssignments)
	must(t, err)
	e, err := kv.Get(context.Background(), node)
	if err != nil {
		return nil, 0, err
	}
	a := &composerv1.Assignment{}
	must(t, protoUnmarshal(e.Value, a))
	return a, e.Revision, nil
}

func (w *world) keyring(t testing.TB) *verify.Keyring {
	ring, err := verify.Keyset(w.roots, w.trust.KeysetEnvelope)
	must(t, err)
	return ring
}

func protoUnmarshal(b []byte, m proto.Message) error { return proto.Unmarshal(b, m) }

// composition reads and verifies a composition a want names.
func (w *world) composition(t testing.TB, node string, want *typev1.Want) *typev1.Composition {
	t.Helper()
	kv, err := natsx.OpenKV(context.Background(), w.js, natsx.BucketCompositions)
	must(t, err)
	e, err := kv.Get(context.Background(), want.GetCompositionKey())
	if err != nil {
		t.Fatalf("%s: %v", want.GetCompositionKey(), err)
	}
	env := &typev1.Envelope{}
	must(t, protoUnmarshal(e.Value, env))
	c, err := w.keyring(t).Composition(env, node, want, time.Now())
	if err != nil {
		t.Fatalf("%s does not verify: %v", want.GetCompositionKey(), err)
	}
	return c
}
