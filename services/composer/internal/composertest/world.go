// Package composertest is the composer's integration harness: a real
// catalog, a real signer cross-checking against it and one embedded
// JetStream, all over real mTLS in the test's process, for composers to run
// against — in the same process (full or manual, passes called by the test)
// or as child processes of the test binary (see child.go). It is shared by
// the tests of app, pass and syncsvc.
package composertest

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	"mesh.dev/internal/canonical"
	"mesh.dev/internal/config"
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
	signerapp "mesh.dev/services/signer/app"
)

// OwnPrefixes are the signer's own-prefixes in a World unless Options say
// otherwise: a node's own composition may write only under them.
var OwnPrefixes = []string{"/etc", "/opt", "/var/lib"}

// Options change a World.
type Options struct {
	// TracerProvider is given to the catalog and the signer (and, by
	// StartComposer, to composers).
	TracerProvider trace.TracerProvider
	// OwnPrefixes replace the signer's own-prefixes.
	OwnPrefixes []string
	// ManifestLifetime is the signer's manifest lifetime (default 24h).
	ManifestLifetime time.Duration
	// SyncAlways fsyncs every JetStream write, as the embedded default does.
	SyncAlways bool
	// SignerServerOptions are added to the signer's gRPC server (their
	// interceptors run inside authorization, before the handler).
	SignerServerOptions []grpc.ServerOption
}

// World is a catalog, a signer and an embedded JetStream over real mTLS.
type World struct {
	T        testing.TB
	PKI      *testutil.PKI
	Trust    *testutil.Trust
	Embedded *natsx.Embedded
	NC       *nats.Conn
	JS       jetstream.JetStream
	Dir      string
	// Catalog is a builder's client of the catalog.
	Catalog                 catalogv1.CatalogServiceClient
	CatalogAddr, SignerAddr string
	// RootsFile and SignerDir are the pinned roots and the signer's state
	// directory (its audit log is SignerDir/audit.log).
	RootsFile, SignerDir string
	Roots                *typev1.TrustRoots
	opts                 Options
	stopCatalog          func()

	mu       sync.Mutex
	passes   map[string]int
	lastPass map[string]PassRecord
	cond     *sync.Cond
}

// PassRecord is what the last pass of a node reported.
type PassRecord struct {
	Committed bool
	Changes   bool
	Err       error
}

// Logger logs warnings and errors to the test's log, and nothing after the
// test ended.
func Logger(t testing.TB) *slog.Logger {
	w := &logWriter{t: t}
	t.Cleanup(w.close)
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelWarn}))
}

type logWriter struct {
	t      testing.TB
	mu     sync.Mutex
	closed bool
}

func (w *logWriter) Write(b []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.closed {
		w.t.Log(strings.TrimSpace(string(b)))
	}
	return len(b), nil
}

func (w *logWriter) close() {
	w.mu.Lock()
	w.closed = true
	w.mu.Unlock()
}

// Listen returns a listener on a free loopback port.
func Listen(t testing.TB) net.Listener {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return lis
}

// serve runs run until the test ends or the returned stop is called.
func serve(t testing.TB, name string, run func(ctx context.Context) error) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
				t.Errorf("%s: %v", name, err)
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

// Must fails the test on an error.
func Must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// New starts the world.
func New(t testing.TB, opts ...Options) *World {
	t.Helper()
	var o Options
	if len(opts) > 0 {
		o = opts[0]
	}
	if o.OwnPrefixes == nil {
		o.OwnPrefixes = OwnPrefixes
	}
	w := &World{T: t, PKI: testutil.NewPKI(t), Trust: testutil.NewTrust(t, 1, 1), Dir: t.TempDir(), opts: o,
		passes: map[string]int{}, lastPass: map[string]PassRecord{}}
	w.cond = sync.NewCond(&w.mu)
	w.Roots = w.Trust.Roots
	var jsOpts []testutil.JetStreamOption
	if o.SyncAlways {
		jsOpts = append(jsOpts, testutil.WithSyncAlways())
	}
	w.Embedded = testutil.StartJetStream(t, jsOpts...)
	w.NC, w.JS = testutil.ConnectJetStream(t, w.Embedded)

	clis := Listen(t)
	w.CatalogAddr = clis.Addr().String()
	w.startCatalog(t, clis)

	w.RootsFile = filepath.Join(w.Dir, "roots.json")
	keysetFile := filepath.Join(w.Dir, "keyset.json")
	Must(t, keyfile.WriteJSON(w.RootsFile, w.Trust.Roots, 0o644))
	Must(t, keyfile.WriteJSON(keysetFile, w.Trust.KeysetEnvelope, 0o644))
	signingKey := filepath.Join(w.Dir, "signer-key.pem")
	Must(t, keyfile.Write(signingKey, w.Trust.SigningKey))
	slis := Listen(t)
	w.SignerAddr = slis.Addr().String()
	w.SignerDir = filepath.Join(w.Dir, "signer")
	signerCatalog := catalogv1.NewCatalogServiceClient(testutil.Dial(t, w.PKI, w.CatalogAddr, w.PKI.Identity(identity.RoleSigner, "")))
	scfg := signerapp.Config{
		Listen: w.SignerAddr, SigningKeyFile: signingKey, KeysetFile: keysetFile, RootsFile: w.RootsFile,
		StateDir: w.SignerDir, OwnPrefixes: o.OwnPrefixes, CatalogAddr: w.CatalogAddr,
		ManifestLifetime: config.Duration(o.ManifestLifetime),
	}
	sig, err := signerapp.New(context.Background(), scfg, signerapp.Options{Logger: Logger(t), Listener: slis, TracerProvider: o.TracerProvider,
		ServerTLS: w.PKI.ServerTLS(t, w.PKI.Identity(identity.RoleSigner, "")), Catalog: signerCatalog, ServerOptions: o.SignerServerOptions})
	Must(t, err)
	serve(t, "signer", func(ctx context.Context) error { return sig.Serve(ctx, nil) })

	w.Catalog = catalogv1.NewCatalogServiceClient(testutil.Dial(t, w.PKI, w.CatalogAddr, w.PKI.Identity(identity.RoleBuilder, "ci")))
	return w
}

// startCatalog runs the world's catalog on lis until the test ends or
// RestartCatalog.
func (w *World) startCatalog(t testing.TB, lis net.Listener) {
	t.Helper()
	cat, err := catalogapp.New(context.Background(), catalogapp.Config{Listen: w.CatalogAddr, MetricsListen: catalogapp.MetricsOff},
		catalogapp.Options{Logger: Logger(t), JetStream: w.JS, Listener: lis, TracerProvider: w.opts.TracerProvider,
			ServerTLS: w.PKI.ServerTLS(t, w.PKI.Identity(identity.RoleCatalog, ""))})
	Must(t, err)
	w.stopCatalog = serve(t, "catalog", func(ctx context.Context) error { return cat.Serve(ctx, nil) })
}

// StopCatalog stops the catalog (its watches end); StartCatalog starts it
// again on the same address.
func (w *World) StopCatalog(t testing.TB) { w.stopCatalog() }

// StartCatalog starts the catalog again after StopCatalog.
func (w *World) StartCatalog(t testing.TB) {
	t.Helper()
	lis, err := net.Listen("tcp", w.CatalogAddr)
	Must(t, err)
	w.startCatalog(t, lis)
}

// As dials addr as role/name over mTLS.
func (w *World) As(t testing.TB, addr string, role identity.Role, name string) *grpc.ClientConn {
	return testutil.Dial(t, w.PKI, addr, w.PKI.Identity(role, name))
}

// onPass counts a pass and keeps its outcome.
func (w *World) onPass(node string, committed, changes bool, err error) {
	w.mu.Lock()
	w.passes[node]++
	w.lastPass[node] = PassRecord{Committed: committed, Changes: changes, Err: err}
	w.cond.Broadcast()
	w.mu.Unlock()
}

// Passes returns how many passes each node had.
func (w *World) Passes() map[string]int {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := make(map[string]int, len(w.passes))
	for k, v := range w.passes {
		out[k] = v
	}
	return out
}

// LastPass returns a node's last pass.
func (w *World) LastPass(node string) PassRecord {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.lastPass[node]
}

// PublishOptions change what Publish puts in the catalog.
type PublishOptions struct {
	// State of the build (DONE when unset); none is put with NoBuild.
	State   catalogv1.BuildState
	NoBuild bool
	// Verdict of the entry (PASS when unset).
	Verdict catalogv1.Verdict
	// Register makes the module run at the new fingerprint.
	Register bool
	// Repository distinguishes entries of identical manifests.
	Repository string
}

// Publish puts a module manifest in the catalog as a builder would: its
// artifacts, the entry and (unless NoBuild) a build; with Register, the
// registration. It returns the fingerprint.
func (w *World) Publish(t testing.TB, m *typev1.ModuleManifest, artifacts map[string][]byte, o PublishOptions) string {
	t.Helper()
	ctx := context.Background()
	b, err := canonical.Marshal(m)
	Must(t, err)
	repo := o.Repository
	if repo == "" {
		repo = "git.example/infra"
	}
	src := names.Digest([]byte(fmt.Sprintf("%s/%s/%d/%s", m.GetModule(), m.GetVersion(), len(b), repo)))
	fp := names.ComputeFingerprint(m.GetModule(), repo, "modules/"+m.GetModule(), src, names.Digest(b))
	verdict := o.Verdict
	if verdict == catalogv1.Verdict_VERDICT_UNSPECIFIED {
		verdict = catalogv1.Verdict_VERDICT_PASS
	}
	entry := &catalogv1.Entry{Fingerprint: fp, Module: m.GetModule(), Repository: repo, Path: "modules/" + m.GetModule(),
		SourceDigest: src, Commit: "0123456789abcdef0123456789abcdef01234567", Manifest: b, ManifestDigest: names.Digest(b),
		Needs: m.GetNeeds(), Verdict: verdict}
	if verdict == catalogv1.Verdict_VERDICT_FAIL {
		entry.Problems = []string{"a test says so"}
	}
	var built []*typev1.Artifact
	refs := make([]string, 0, len(artifacts))
	for ref := range artifacts {
		refs = append(refs, ref)
	}
	slices.Sort(refs)
	for _, ref := range refs {
		content := artifacts[ref]
		kind, _, _ := strings.Cut(ref, ":")
		entry.Artifacts = append(entry.Artifacts, &catalogv1.ArtifactDecl{Ref: ref, Kind: kind})
		built = append(built, &typev1.Artifact{Ref: ref, Digest: names.Digest(content), Size: int64(len(content))})
		if o.NoBuild || (o.State != 0 && o.State != catalogv1.BuildState_BUILD_STATE_DONE) {
			continue
		}
		up, err := w.Catalog.UploadArtifact(ctx)
		Must(t, err)
		Must(t, up.Send(&catalogv1.UploadArtifactRequest{Msg: &catalogv1.UploadArtifactRequest_Header{Header: &catalogv1.ArtifactHeader{Digest: names.Digest(content), Size: int64(len(content))}}}))
		Must(t, up.Send(&catalogv1.UploadArtifactRequest{Msg: &catalogv1.UploadArtifactRequest_Chunk{Chunk: content}}))
		if _, err := up.CloseAndRecv(); err != nil && !errors.Is(err, io.EOF) {
			t.Fatal(err)
		}
	}
	if _, err := w.Catalog.PutEntry(ctx, &catalogv1.PutEntryRequest{Entry: entry}); err != nil {
		t.Fatalf("PutEntry %s: %v", m.GetModule(), err)
	}
	if !o.NoBuild {
		state := o.State
		if state == catalogv1.BuildState_BUILD_STATE_UNSPECIFIED {
			state = catalogv1.BuildState_BUILD_STATE_DONE
		}
		build := &catalogv1.Build{Fingerprint: fp, State: state, Reason: "built by a test"}
		if state == catalogv1.BuildState_BUILD_STATE_DONE {
			build.Artifacts = built
		}
		if _, err := w.Catalog.PutBuild(ctx, &catalogv1.PutBuildRequest{Build: build}); err != nil {
			t.Fatalf("PutBuild %s: %v", m.GetModule(), err)
		}
	}
	if o.Register {
		w.Register(t, m.GetModule(), fp)
	}
	return fp
}

// Release publishes a module with a DONE build and registers it.
func (w *World) Release(t testing.TB, m *typev1.ModuleManifest, artifacts map[string][]byte) string {
	t.Helper()
	return w.Publish(t, m, artifacts, PublishOptions{Register: true})
}

// Register makes a module run at a fingerprint.
func (w *World) Register(t testing.TB, module, fp string) {
	t.Helper()
	if _, err := w.Catalog.RegisterModule(context.Background(), &catalogv1.RegisterModuleRequest{Module: module, Fingerprint: fp}); err != nil {
		t.Fatalf("RegisterModule %s: %v", module, err)
	}
}

// Text is a template content.
func Text(s string) *typev1.ResourceTemplate_Text { return &typev1.ResourceTemplate_Text{Text: s} }

// Resource types.
const (
	File = typev1.ResourceType_RESOURCE_TYPE_FILE
	Dir  = typev1.ResourceType_RESOURCE_TYPE_DIRECTORY
)

// Policy returns an upgrade policy.
func Policy(p typev1.UpgradePolicy, why string) *typev1.Policy {
	return &typev1.Policy{Policy: p, Why: why}
}

// Auto is the AUTO policy.
var Auto = Policy(typev1.UpgradePolicy_UPGRADE_POLICY_AUTO, "")

// SSHD is a module with a directory and a templated config.
func SSHD(version, extra string) *typev1.ModuleManifest {
	return &typev1.ModuleManifest{Module: "sshd", Version: version, Upgrade: Auto, Resources: []*typev1.ResourceTemplate{
		{Name: "dir", Type: Dir, Path: "/etc/ssh", Mode: 0o755},
		{Name: "config", Type: File, Path: "/etc/ssh/sshd_config", Mode: 0o600, Content: Text("Port {{ .Params.port }}\n" + extra)},
	}}
}

// Motd is a module with one file naming the node.
func Motd(version string) *typev1.ModuleManifest {
	return &typev1.ModuleManifest{Module: "motd", Version: version, Upgrade: Auto, Resources: []*typev1.ResourceTemplate{
		{Name: "motd", Type: File, Path: "/etc/motd", Mode: 0o644, Content: Text("Welcome to {{ .Node }} (" + version + ")\n")},
	}}
}

// Spec returns a node spec placing modules with params {port: 22}, label
// zone=a.
func Spec(node string, modules ...string) *composerv1.NodeSpec {
	s := &composerv1.NodeSpec{Node: node, Labels: map[string]string{"zone": "a"}}
	for _, m := range modules {
		params, _ := structpb.NewStruct(map[string]any{"port": 22})
		s.Modules = append(s.Modules, &composerv1.PlacedModule{Module: m, Params: params})
	}
	return s
}

// WaitFor polls cond until it holds or the deadline passes.
func WaitFor(t testing.TB, what string, d time.Duration, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(d)
	last := ""
	for {
		ok, why := cond()
		if ok {
			return
		}
		last = why
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s: %s", what, d, last)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// KV opens one of the composer's buckets.
func (w *World) KV(t testing.TB, bucket string) *natsx.KV {
	t.Helper()
	kv, err := natsx.OpenKV(context.Background(), w.JS, bucket)
	Must(t, err)
	return kv
}

// Get reads a key and decodes it into m; the revision, or an error.
func (w *World) Get(t testing.TB, bucket, key string, m proto.Message) (uint64, error) {
	t.Helper()
	e, err := w.KV(t, bucket).Get(context.Background(), key)
	if err != nil {
		return 0, err
	}
	Must(t, proto.Unmarshal(e.Value, m))
	return e.Revision, nil
}

// Put writes a record straight into a bucket, as another party would.
func (w *World) Put(t testing.TB, bucket, key string, m proto.Message) uint64 {
	t.Helper()
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(m)
	Must(t, err)
	rev, err := w.KV(t, bucket).Put(context.Background(), key, b)
	Must(t, err)
	return rev
}

// Assignment reads a node's assignment straight from JetStream.
func (w *World) Assignment(t testing.TB, node string) (*composerv1.Assignment, uint64, error) {
	t.Helper()
	a := &composerv1.Assignment{}
	rev, err := w.Get(t, natsx.BucketAssignments, node, a)
	if err != nil {
		return nil, 0, err
	}
	return a, rev, nil
}

// Keyring is the world's keyset.
func (w *World) Keyring(t testing.TB) *verify.Keyring {
	ring, err := verify.Keyset(w.Roots, w.Trust.KeysetEnvelope)
	Must(t, err)
	return ring
}

// Composition reads and verifies the composition a want names; an error
// when it is missing or does not verify.
func (w *World) Composition(t testing.TB, node string, want *typev1.Want) (*typev1.Composition, error) {
	t.Helper()
	e, err := w.KV(t, natsx.BucketCompositions).Get(context.Background(), want.GetCompositionKey())
	if err != nil {
		return nil, fmt.Errorf("%s: %w", want.GetCompositionKey(), err)
	}
	env := &typev1.Envelope{}
	if err := proto.Unmarshal(e.Value, env); err != nil {
		return nil, fmt.Errorf("%s: %w", want.GetCompositionKey(), err)
	}
	c, err := w.Keyring(t).Composition(env, node, want, time.Now())
	if err != nil {
		return nil, fmt.Errorf("%s does not verify: %w", want.GetCompositionKey(), err)
	}
	return c, nil
}

// CheckAssignment checks that a node's assignment verifies and that every
// composition its manifest names is held and verifies (nothing a manifest
// names is ever missing). It returns the manifest.
func (w *World) CheckAssignment(t testing.TB, a *composerv1.Assignment) (*typev1.Manifest, error) {
	t.Helper()
	m, digest, err := w.Keyring(t).Manifest(a.GetManifest(), a.GetNode(), time.Now())
	if err != nil {
		return nil, fmt.Errorf("manifest of %s does not verify: %w", a.GetNode(), err)
	}
	if digest != a.GetManifestDigest() || m.GetRevision() != a.GetManifestRevision() {
		return nil, fmt.Errorf("assignment of %s says digest %s revision %d, its manifest %s %d", a.GetNode(), a.GetManifestDigest(), a.GetManifestRevision(), digest, m.GetRevision())
	}
	if len(m.GetWants()) != len(a.GetWants()) {
		return nil, fmt.Errorf("assignment of %s: %d wants, its manifest %d", a.GetNode(), len(a.GetWants()), len(m.GetWants()))
	}
	for i, want := range m.GetWants() {
		if !proto.Equal(want, a.GetWants()[i]) {
			return nil, fmt.Errorf("assignment of %s: want %d differs from its manifest's", a.GetNode(), i)
		}
		if _, err := w.Composition(t, a.GetNode(), want); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// Converged waits until the node's assignment wants exactly the given
// fingerprints (module → fp, the node's own left out) and returns it.
func (w *World) Converged(t testing.TB, node string, fps map[string]string) *composerv1.Assignment {
	t.Helper()
	var a *composerv1.Assignment
	WaitFor(t, node+" assigned", 30*time.Second, func() (bool, string) {
		var err error
		a, _, err = w.Assignment(t, node)
		if err != nil {
			return false, fmt.Sprintf("no assignment: %v (last pass: %+v)", err, w.LastPass(node))
		}
		got := map[string]string{}
		for _, want := range a.GetWants() {
			if want.GetModule() != names.NodeModule {
				got[want.GetModule()] = want.GetFingerprint()
			}
		}
		if fmt.Sprint(got) != fmt.Sprint(fps) {
			return false, fmt.Sprintf("wants %v, holds %v (last pass: %+v)", got, a.GetHolds(), w.LastPass(node))
		}
		return true, ""
	})
	return a
}

// Want returns the want of a module, nil when none.
func Want(a interface{ GetWants() []*typev1.Want }, module string) *typev1.Want {
	for _, w := range a.GetWants() {
		if w.GetModule() == module {
			return w
		}
	}
	return nil
}

func dialTLS(t testing.TB, addr string, cfg *tls.Config, opts ...grpc.DialOption) *grpc.ClientConn {
	return testutil.DialTLS(t, addr, cfg, opts...)
}
