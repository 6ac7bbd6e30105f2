package app_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/grpc/status"

	"mesh.dev/internal/identity"
	"mesh.dev/internal/keyfile"
	"mesh.dev/internal/names"
	"mesh.dev/internal/testutil"
	catalogv1 "mesh.dev/proto/mesh/catalog/v1"
	signerv1 "mesh.dev/proto/mesh/signer/v1"
	typev1 "mesh.dev/proto/mesh/type/v1"
	"mesh.dev/services/signer/app"
	"mesh.dev/services/signer/internal/crosscheck/crosschecktest"
	"mesh.dev/services/signer/internal/keysource"
)

// world is the ground a signer stands on in a test: a PKI, a chain of trust
// with files on disk, a catalog and a state dir.
type world struct {
	pki      *testutil.PKI
	trust    *testutil.Trust
	catalog  *crosschecktest.Catalog
	dir      string
	stateDir string
	cfg      app.Config
}

func newWorld(t testing.TB) *world {
	t.Helper()
	w := &world{pki: testutil.NewPKI(t), trust: testutil.NewTrust(t, 1, 1), catalog: crosschecktest.New(), dir: t.TempDir()}
	w.stateDir = filepath.Join(w.dir, "state")
	rootsFile := filepath.Join(w.dir, "roots.json")
	keysetFile := filepath.Join(w.dir, "keyset.json")
	if err := keyfile.WriteJSON(rootsFile, w.trust.Roots, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := keyfile.WriteJSON(keysetFile, w.trust.KeysetEnvelope, 0o644); err != nil {
		t.Fatal(err)
	}
	signingKey := filepath.Join(w.dir, "signer-key.pem")
	if err := keyfile.Write(signingKey, w.trust.SigningKey); err != nil {
		t.Fatal(err)
	}
	cert, key, ca := w.pki.Files(t, w.pki.Identity(identity.RoleSigner, ""))
	w.cfg = app.Config{
		Listen: "127.0.0.1:0", CertFile: cert, KeyFile: key, CAFile: ca,
		SigningKeyFile: signingKey, KeysetFile: keysetFile, RootsFile: rootsFile, StateDir: w.stateDir,
		OwnPrefixes: []string{"/etc/mesh", "/etc/wireguard"}, CatalogAddr: "127.0.0.1:1",
	}
	return w
}

// running is a signer serving on loopback.
type running struct {
	addr   string
	signer *app.Signer
	stop   func()
}

// start runs a signer over real mTLS until stop (or the test's end).
func (w *world) start(t testing.TB) *running {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s, err := app.New(context.Background(), w.cfg, app.Options{
		Logger: testLogger(t), Listener: lis, Catalog: w.catalog, Key: keysource.Memory(w.trust.SigningKey),
	})
	if err != nil {
		lis.Close()
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx, nil) }()
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
	return &running{addr: lis.Addr().String(), signer: s, stop: stop}
}

func testLogger(t testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn}))
}

type testWriter struct{ t testing.TB }

func (w testWriter) Write(b []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(b)))
	return len(b), nil
}

func (w *world) client(t testing.TB, r *running, role identity.Role, name string) signerv1.SignerServiceClient {
	t.Helper()
	conn := testutil.Dial(t, w.pki, r.addr, w.pki.Identity(role, name))
	return signerv1.NewSignerServiceClient(conn)
}

func (w *world) composer(t testing.TB, r *running) signerv1.SignerServiceClient {
	return w.client(t, r, identity.RoleComposer, "")
}

func fence(t testing.TB, c signerv1.SignerServiceClient) uint64 {
	t.Helper()
	resp, err := c.Fence(context.Background(), &signerv1.FenceRequest{Holder: "test"})
	if err != nil {
		t.Fatal(err)
	}
	return resp.GetEpoch()
}

// sshdManifest is a typical module manifest: a directory, a templated
// config, a binary artifact and a symlink.
func sshdManifest(module string) *typev1.ModuleManifest {
	return &typev1.ModuleManifest{
		Module: module, Version: "1.2.0",
		Resources: []*typev1.ResourceTemplate{
			{Name: "dir", Type: typev1.ResourceType_RESOURCE_TYPE_DIRECTORY, Path: "/etc/" + module, Mode: 0o755},
			{Name: "config", Type: typev1.ResourceType_RESOURCE_TYPE_FILE, Path: "/etc/" + module + "/config", Mode: 0o600,
				Owner: "root", Group: "root", Content: &typev1.ResourceTemplate_Text{Text: "Port {{ .Params.port }}\n"}},
			{Name: "bin", Type: typev1.ResourceType_RESOURCE_TYPE_FILE, Path: "/usr/local/bin/" + module, Mode: 0o755,
				Content: &typev1.ResourceTemplate_Artifact{Artifact: "binary:" + module}},
			{Name: "link", Type: typev1.ResourceType_RESOURCE_TYPE_SYMLINK, Path: "/etc/" + module + "/current", Target: "/etc/" + module + "/config"},
		},
	}
}

// release puts a module's DONE, PASS entry in the catalog and returns its
// fingerprint and the build's artifacts.
func (w *world) release(module string) (string, []*typev1.Artifact) {
	arts := []*typev1.Artifact{{Ref: "binary:" + module, Digest: names.Digest([]byte(module)), Size: int64(len(module))}}
	return w.catalog.Release(sshdManifest(module), catalogv1.BuildState_BUILD_STATE_DONE, catalogv1.Verdict_VERDICT_PASS, arts...), arts
}

// moduleComposition renders sshdManifest for a node, with a config of about
// size bytes (a typical composition is a few KiB to 12 KiB).
func moduleComposition(node, module, fp string, size int) *typev1.Composition {
	config := []byte("Port 22\n" + strings.Repeat("# padding to a typical size\n", size/28))
	return &typev1.Composition{
		Node: node, Module: module, Fingerprint: fp,
		Resources: []*typev1.Resource{
			{Id: module + ":dir", Module: module, Type: typev1.ResourceType_RESOURCE_TYPE_DIRECTORY, Path: "/etc/" + module, Mode: 0o755},
			{Id: module + ":config", Module: module, Type: typev1.ResourceType_RESOURCE_TYPE_FILE, Path: "/etc/" + module + "/config", Mode: 0o600,
				Owner: "root", Group: "root", Content: &typev1.Resource_Inline{Inline: config}},
			{Id: module + ":link", Module: module, Type: typev1.ResourceType_RESOURCE_TYPE_SYMLINK, Path: "/etc/" + module + "/current", Target: "/etc/" + module + "/config"},
			{Id: module + ":bin", Module: module, Type: typev1.ResourceType_RESOURCE_TYPE_FILE, Path: "/usr/local/bin/" + module, Mode: 0o755,
				Content: &typev1.Resource_Artifact{Artifact: "binary:" + module}},
		},
	}
}

func nodeComposition(node string) *typev1.Composition {
	return &typev1.Composition{
		Node: node, Module: names.NodeModule,
		Resources: []*typev1.Resource{
			{Id: "wireguard:conf", Type: typev1.ResourceType_RESOURCE_TYPE_FILE, Path: "/etc/wireguard/wg0.conf", Mode: 0o600,
				Content: &typev1.Resource_Inline{Inline: []byte("[Interface]\n")}},
		},
		Filled:             []string{"/etc/wireguard/private.key"},
		ProvisionerAccount: "provisioner",
	}
}

func wantOf(t testing.TB, node, module, fp string, parts []*typev1.Artifact, digest string) *typev1.Want {
	t.Helper()
	key, err := names.CompositionKey(node, module, fp)
	if err != nil {
		t.Fatal(err)
	}
	return &typev1.Want{Module: module, Fingerprint: fp, Parts: parts, CompositionKey: key, CompositionDigest: digest}
}

func nodeWant(t testing.TB, node string) *typev1.Want {
	return wantOf(t, node, names.NodeModule, "", nil, names.Digest([]byte(node)))
}

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
		if !strings.Contains(err.Error(), c) {
			t.Fatalf("error %q does not contain %q", err, c)
		}
	}
}
