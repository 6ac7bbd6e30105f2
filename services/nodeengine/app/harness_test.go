package app_test

import (
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	"mesh.dev/internal/authz"
	"mesh.dev/internal/canonical"
	"mesh.dev/internal/envelope"
	"mesh.dev/internal/identity"
	"mesh.dev/internal/keyfile"
	"mesh.dev/internal/names"
	"mesh.dev/internal/testutil"
	catalogv1 "mesh.dev/proto/mesh/catalog/v1"
	composerv1 "mesh.dev/proto/mesh/composer/v1"
	nodeenginev1 "mesh.dev/proto/mesh/nodeengine/v1"
	typev1 "mesh.dev/proto/mesh/type/v1"
	"mesh.dev/services/nodeengine/app"
	"mesh.dev/services/nodeengine/internal/state"
)

const node = "ace"

// fakeComposer serves Sync, GetComposition and GetObject from memory, as
// the composer will; a test pushes keysets and manifests into it.
type fakeComposer struct {
	composerv1.UnimplementedComposerServiceServer
	composerv1.UnimplementedSyncServiceServer

	mu       sync.Mutex
	keyset   *typev1.Envelope
	manifest *typev1.Envelope
	comps    map[string]*typev1.Envelope
	objects  map[string][]byte
	hellos   []*composerv1.Hello
	reports  []*composerv1.Report
	streams  map[chan *composerv1.SyncResponse]bool
	// refuse, when set, ends every Sync at once with this error.
	refuse error
	// faults make the calls for a composition key or an object digest
	// fail, until the test deletes the fault (see meet).
	faults map[string]error
}

// errHang, as a fault, makes a call hang without answering until its caller
// gives up: a server whose own read lost its reply.
var errHang = errors.New("hang")

// meet plays the fault of key, if any: every call fails with it, or hangs.
func meet(ctx context.Context, mu *sync.Mutex, faults map[string]error, key string) error {
	mu.Lock()
	err := faults[key]
	mu.Unlock()
	if err != errHang {
		return err
	}
	<-ctx.Done()
	return status.FromContextError(ctx.Err()).Err()
}

func newFakeComposer() *fakeComposer {
	return &fakeComposer{comps: map[string]*typev1.Envelope{}, objects: map[string][]byte{}, streams: map[chan *composerv1.SyncResponse]bool{},
		faults: map[string]error{}}
}

func (f *fakeComposer) Sync(st grpc.BidiStreamingServer[composerv1.SyncRequest, composerv1.SyncResponse]) error {
	first, err := st.Recv()
	if err != nil {
		return err
	}
	hello := first.GetHello()
	if hello == nil {
		return status.Error(codes.InvalidArgument, "the first message is not Hello")
	}
	if err := authz.CheckSelf(st.Context(), hello.GetNode()); err != nil {
		return err
	}
	ch := make(chan *composerv1.SyncResponse, 64)
	f.mu.Lock()
	if f.refuse != nil {
		err := f.refuse
		f.mu.Unlock()
		return err
	}
	f.hellos = append(f.hellos, hello)
	if f.keyset != nil {
		ch <- &composerv1.SyncResponse{Msg: &composerv1.SyncResponse_Keyset{Keyset: f.keyset}}
	}
	if f.manifest != nil {
		ch <- &composerv1.SyncResponse{Msg: &composerv1.SyncResponse_Manifest{Manifest: f.manifest}}
	}
	f.streams[ch] = true
	f.mu.Unlock()
	defer func() {
		f.mu.Lock()
		delete(f.streams, ch)
		f.mu.Unlock()
	}()
	errc := make(chan error, 1)
	go func() {
		for {
			m, err := st.Recv()
			if err != nil {
				errc <- err
				return
			}
			if r := m.GetReport(); r != nil {
				f.mu.Lock()
				f.reports = append(f.reports, r)
				f.mu.Unlock()
			}
		}
	}()
	for {
		select {
		case m := <-ch:
			if err := st.Send(m); err != nil {
				return err
			}
		case err := <-errc:
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		case <-st.Context().Done():
			return st.Context().Err()
		}
	}
}

func (f *fakeComposer) push(m *composerv1.SyncResponse) {
	f.mu.Lock()
	defer f.mu.Unlock()
	switch x := m.GetMsg().(type) {
	case *composerv1.SyncResponse_Keyset:
		f.keyset = x.Keyset
	case *composerv1.SyncResponse_Manifest:
		f.manifest = x.Manifest
	}
	for ch := range f.streams {
		ch <- m
	}
}

func (f *fakeComposer) lastReport() *composerv1.Report {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.reports) == 0 {
		return nil
	}
	return f.reports[len(f.reports)-1]
}

func (f *fakeComposer) GetComposition(ctx context.Context, req *composerv1.GetCompositionRequest) (*composerv1.GetCompositionResponse, error) {
	k, err := names.ParseCompositionKey(req.GetKey())
	if err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	if err := authz.CheckSelf(ctx, k.Node); err != nil {
		return nil, err
	}
	if err := meet(ctx, &f.mu, f.faults, req.GetKey()); err != nil {
		return nil, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	env, ok := f.comps[req.GetKey()]
	if !ok {
		return nil, status.Errorf(codes.NotFound, "no composition %s", req.GetKey())
	}
	return &composerv1.GetCompositionResponse{Composition: env, Digest: names.Digest(env.GetPayload())}, nil
}

func (f *fakeComposer) GetObject(req *composerv1.GetObjectRequest, st grpc.ServerStreamingServer[composerv1.GetObjectResponse]) error {
	if err := meet(st.Context(), &f.mu, f.faults, req.GetDigest()); err != nil {
		return err
	}
	f.mu.Lock()
	b, ok := f.objects[req.GetDigest()]
	f.mu.Unlock()
	if !ok {
		return status.Errorf(codes.NotFound, "no object %s", req.GetDigest())
	}
	for off := 0; off < len(b) || off == 0; off += 32 << 10 {
		end := min(off+32<<10, len(b))
		m := &composerv1.GetObjectResponse{Offset: int64(off), Chunk: b[off:end]}
		if off == 0 {
			m.Size = int64(len(b))
		}
		if err := st.Send(m); err != nil {
			return err
		}
		if end == len(b) {
			break
		}
	}
	return nil
}

// fakeCatalog serves entries and artifacts from memory.
type fakeCatalog struct {
	catalogv1.UnimplementedCatalogServiceServer
	mu        sync.Mutex
	entries   map[string]*catalogv1.Entry
	artifacts map[string][]byte
	asked     map[string]int
	downloads map[string]int
	// fail, when set, answers every GetEntry with it.
	fail error
	// faults make the downloads of an artifact digest fail (see meet).
	faults map[string]error
	// gate, when set, holds every GetEntry until it is closed (a catalog
	// slow to start) or the ask's deadline.
	gate chan struct{}
}

func newFakeCatalog() *fakeCatalog {
	return &fakeCatalog{entries: map[string]*catalogv1.Entry{}, artifacts: map[string][]byte{}, asked: map[string]int{}, downloads: map[string]int{},
		faults: map[string]error{}}
}

func (c *fakeCatalog) GetEntry(ctx context.Context, req *catalogv1.GetEntryRequest) (*catalogv1.GetEntryResponse, error) {
	c.mu.Lock()
	c.asked[req.GetFingerprint()]++
	gate := c.gate
	c.mu.Unlock()
	if gate != nil {
		select {
		case <-gate:
		case <-ctx.Done():
			return nil, status.FromContextError(ctx.Err()).Err()
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.fail != nil {
		return nil, c.fail
	}
	e, ok := c.entries[req.GetFingerprint()]
	if !ok {
		return nil, status.Errorf(codes.NotFound, "no entry of fingerprint %s", req.GetFingerprint())
	}
	return &catalogv1.GetEntryResponse{Entry: e}, nil
}

func (c *fakeCatalog) timesAsked(fp string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.asked[fp]
}

func (c *fakeCatalog) DownloadArtifact(req *catalogv1.DownloadArtifactRequest, st grpc.ServerStreamingServer[catalogv1.DownloadArtifactResponse]) error {
	if err := meet(st.Context(), &c.mu, c.faults, req.GetDigest()); err != nil {
		return err
	}
	c.mu.Lock()
	c.downloads[req.GetDigest()]++
	b, ok := c.artifacts[req.GetDigest()]
	c.mu.Unlock()
	if !ok {
		return status.Errorf(codes.NotFound, "no artifact %s", req.GetDigest())
	}
	return st.Send(&catalogv1.DownloadArtifactResponse{Size: int64(len(b)), Chunk: b})
}

// world is what an engine stands on in a test: a PKI, a chain of trust,
// a fake composer and catalog over real mTLS, a root dir and a state dir.
type world struct {
	t            testing.TB
	pki          *testutil.PKI
	trust        *testutil.Trust
	composer     *fakeComposer
	catalog      *fakeCatalog
	composerAddr string
	catalogAddr  string
	dir          string
	root         string
	cfg          app.Config
	rev          uint64
}

var prefixes = []string{"/etc/app", "/opt/app", "/var/lib/app"}

func newWorld(t testing.TB) *world {
	t.Helper()
	w := &world{t: t, pki: testutil.NewPKI(t), trust: testutil.NewTrust(t, 1, 1), composer: newFakeComposer(), catalog: newFakeCatalog(), dir: t.TempDir()}
	w.root = filepath.Join(w.dir, "root")
	rootsFile := filepath.Join(w.dir, "roots.json")
	if err := keyfile.WriteJSON(rootsFile, w.trust.Roots, 0o644); err != nil {
		t.Fatal(err)
	}
	policy := authz.Merge(denyAll(composerv1.ComposerService_ServiceDesc), denyAll(composerv1.SyncService_ServiceDesc), authz.Policy{
		composerv1.SyncService_Sync_FullMethodName:               authz.Allow(identity.RoleNode),
		composerv1.ComposerService_GetComposition_FullMethodName: authz.Allow(identity.RoleNode),
		composerv1.ComposerService_GetObject_FullMethodName:      authz.Allow(identity.RoleNode),
	})
	w.composerAddr, _ = testutil.StartServer(t, w.pki, w.pki.Identity(identity.RoleComposer, ""), policy, func(r grpc.ServiceRegistrar) {
		composerv1.RegisterSyncServiceServer(r, w.composer)
		composerv1.RegisterComposerServiceServer(r, w.composer)
	})
	catPolicy := authz.Merge(denyAll(catalogv1.CatalogService_ServiceDesc), authz.Policy{
		catalogv1.CatalogService_GetEntry_FullMethodName:         authz.Allow(identity.RoleNode),
		catalogv1.CatalogService_DownloadArtifact_FullMethodName: authz.Allow(identity.RoleNode),
	})
	w.catalogAddr, _ = testutil.StartServer(t, w.pki, w.pki.Identity(identity.RoleCatalog, ""), catPolicy, func(r grpc.ServiceRegistrar) {
		catalogv1.RegisterCatalogServiceServer(r, w.catalog)
	})
	cert, key, ca := w.pki.Files(t, w.pki.Identity(identity.RoleNode, node))
	w.cfg = app.Config{
		Root: w.root, StateDir: filepath.Join(w.dir, "state"), RootsFile: rootsFile, AllowPrefixes: prefixes,
		ComposerAddr: w.composerAddr, CatalogAddr: w.catalogAddr, AdminListen: "127.0.0.1:0",
		CertFile: cert, KeyFile: key, CAFile: ca,
	}
	w.composer.keyset = w.trust.KeysetEnvelope
	return w
}

// running is an engine serving in the test's process.
type running struct {
	eng   *app.Engine
	admin nodeenginev1.NodeEngineServiceClient
	stop  func()
}

type options struct {
	wrap func(state.Store) state.Store
	// compositionDeadline and fetchStall shorten the engine's bounds.
	compositionDeadline, fetchStall time.Duration
	// now is the engine's clock (default time.Now).
	now func() time.Time
}

func (w *world) start(t testing.TB, o ...options) *running {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	opts := app.Options{
		Logger: testLogger(t), AdminListener: lis,
		EntryBackoffBase: 10 * time.Millisecond, SyncBackoffBase: 10 * time.Millisecond, SyncBackoffMax: 100 * time.Millisecond,
	}
	for _, x := range o {
		opts.WrapStore = x.wrap
		opts.CompositionDeadline, opts.FetchStall = x.compositionDeadline, x.fetchStall
		opts.Now = x.now
	}
	eng, err := app.New(context.Background(), w.cfg, opts)
	if err != nil {
		lis.Close()
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- eng.Run(ctx) }()
	stopped := false
	stop := func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		if err := <-done; err != nil {
			t.Errorf("run: %v", err)
		}
	}
	t.Cleanup(stop)
	conn := testutil.Dial(t, w.pki, lis.Addr().String(), w.pki.Identity(identity.RoleOperator, "admin"))
	return &running{eng: eng, admin: nodeenginev1.NewNodeEngineServiceClient(conn), stop: stop}
}

func testLogger(t testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(&testWriter{t: t}, &slog.HandlerOptions{Level: slog.LevelWarn}))
}

type testWriter struct {
	mu   sync.Mutex
	t    testing.TB
	done bool
}

func (w *testWriter) Write(b []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.done {
		func() {
			defer func() {
				if recover() != nil {
					w.done = true
				}
			}()
			w.t.Log(strings.TrimSpace(string(b)))
		}()
	}
	return len(b), nil
}

// release puts an entry of module in the fake catalog and returns its
// fingerprint.
func (w *world) release(module, version string, needs []*typev1.Need, artifacts ...string) string {
	w.t.Helper()
	mm := &typev1.ModuleManifest{Module: module, Version: version, Needs: needs}
	b, err := canonical.Marshal(mm)
	if err != nil {
		w.t.Fatal(err)
	}
	e := &catalogv1.Entry{Module: module, Repository: "git.example/mods", Path: module, SourceDigest: names.Digest([]byte(module + version)),
		Manifest: b, ManifestDigest: names.Digest(b), Needs: needs, Verdict: catalogv1.Verdict_VERDICT_PASS}
	for _, a := range artifacts {
		kind, _, _ := strings.Cut(a, ":")
		e.Artifacts = append(e.Artifacts, &catalogv1.ArtifactDecl{Ref: a, Kind: kind})
	}
	e.Fingerprint = names.ComputeFingerprint(e.GetModule(), e.GetRepository(), e.GetPath(), e.GetSourceDigest(), e.GetManifestDigest())
	w.catalog.mu.Lock()
	w.catalog.entries[e.Fingerprint] = e
	w.catalog.mu.Unlock()
	return e.Fingerprint
}

func file(module, name, p, content string) *typev1.Resource {
	r := &typev1.Resource{Id: module + ":" + name, Module: module, Type: typev1.ResourceType_RESOURCE_TYPE_FILE, Path: p, Mode: 0o640,
		Owner: "root", Group: "root", Content: &typev1.Resource_Inline{Inline: []byte(content)}}
	if module == names.NodeModule {
		r.Module = ""
	}
	return r
}

func dir(module, name, p string) *typev1.Resource {
	r := &typev1.Resource{Id: module + ":" + name, Module: module, Type: typev1.ResourceType_RESOURCE_TYPE_DIRECTORY, Path: p, Mode: 0o755}
	if module == names.NodeModule {
		r.Module = ""
	}
	return r
}

// comp is one composition of a manifest to publish.
type comp struct {
	c     *typev1.Composition
	parts []*typev1.Artifact
	// digest, when set, is put in the want instead of the real one.
	digest string
	// signer, when set, signs the composition instead of the trust's key.
	signer ed25519.PrivateKey
}

func moduleComp(module, fp string, rs ...*typev1.Resource) comp {
	sort.Slice(rs, func(i, j int) bool { return rs[i].GetPath() < rs[j].GetPath() })
	return comp{c: &typev1.Composition{Node: node, Module: module, Fingerprint: fp, Resources: rs}}
}

func nodeComp(rs ...*typev1.Resource) comp {
	sort.Slice(rs, func(i, j int) bool { return rs[i].GetPath() < rs[j].GetPath() })
	return comp{c: &typev1.Composition{Node: node, Module: names.NodeModule, Resources: rs}}
}

// manifestOpts changes how publish builds a manifest.
type manifestOpts struct {
	revision  uint64
	node      string
	issued    time.Time
	expires   time.Time
	signer    ed25519.PrivateKey
	corrupt   bool
	noPublish bool
}

// manifest signs the compositions, serves them, and returns a signed
// manifest wanting them.
func (w *world) manifest(o manifestOpts, comps ...comp) *typev1.Envelope {
	w.t.Helper()
	var wants []*typev1.Want
	for _, c := range comps {
		env, digest := w.trust.Sign(w.t, typev1.PayloadType_PAYLOAD_TYPE_COMPOSITION, c.c)
		if c.signer != nil {
			env.Signatures = nil
			if err := envelope.SignWith(env, c.signer); err != nil {
				w.t.Fatal(err)
			}
		}
		key, err := names.CompositionKey(c.c.GetNode(), c.c.GetModule(), c.c.GetFingerprint())
		if err != nil {
			w.t.Fatal(err)
		}
		w.composer.mu.Lock()
		w.composer.comps[key] = env
		w.composer.mu.Unlock()
		if c.digest != "" {
			digest = c.digest
		}
		wants = append(wants, &typev1.Want{Module: c.c.GetModule(), Fingerprint: c.c.GetFingerprint(), Parts: c.parts, CompositionKey: key, CompositionDigest: digest})
	}
	sort.Slice(wants, func(i, j int) bool { return wants[i].GetModule() < wants[j].GetModule() })
	if o.revision == 0 {
		w.rev++
		o.revision = w.rev
	}
	if o.node == "" {
		o.node = node
	}
	now := time.Now()
	if o.issued.IsZero() {
		o.issued = now
	}
	if o.expires.IsZero() {
		o.expires = now.Add(24 * time.Hour)
	}
	m := &typev1.Manifest{Node: o.node, Revision: o.revision, IssuedAt: timestamppb.New(o.issued), ExpiresAt: timestamppb.New(o.expires),
		KeysetVersion: 1, Wants: wants, Traceparent: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}
	env, _ := w.trust.Sign(w.t, typev1.PayloadType_PAYLOAD_TYPE_MANIFEST, m)
	if o.signer != nil {
		env.Signatures = nil
		if err := envelope.SignWith(env, o.signer); err != nil {
			w.t.Fatal(err)
		}
	}
	if o.corrupt {
		env.Signatures[0].Signature[0] ^= 0xff
	}
	return env
}

// publish builds a manifest and sends it to the engine.
func (w *world) publish(o manifestOpts, comps ...comp) *typev1.Envelope {
	w.t.Helper()
	env := w.manifest(o, comps...)
	w.composer.push(&composerv1.SyncResponse{Msg: &composerv1.SyncResponse_Manifest{Manifest: env}})
	return env
}

// eventually waits for cond with a deadline.
func eventually(t testing.TB, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	var last string
	for time.Now().Before(deadline) {
		ok, s := cond()
		if ok {
			return
		}
		last = s
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatalf("%s: not within 20s; last: %s", what, last)
}

func (r *running) status(t testing.TB) *nodeenginev1.GetStatusResponse {
	t.Helper()
	s, err := r.admin.GetStatus(context.Background(), &nodeenginev1.GetStatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func haveOf(s *nodeenginev1.GetStatusResponse, module string) *composerv1.Have {
	return haveIn(s.GetHaves(), module)
}

// haveIn is module's have among hs, nil when none.
func haveIn(hs []*composerv1.Have, module string) *composerv1.Have {
	for _, h := range hs {
		if h.GetModule() == module {
			return h
		}
	}
	return nil
}

// waitAttempt waits until module's attempt has the state and code.
func (r *running) waitAttempt(t testing.TB, module string, st composerv1.AttemptState, code composerv1.ReasonCode, words ...string) *composerv1.Attempt {
	t.Helper()
	var got *composerv1.Attempt
	eventually(t, fmt.Sprintf("%s %v %v %q", module, st, code, words), func() (bool, string) {
		s := r.status(t)
		h := haveOf(s, module)
		got = h.GetAttempt()
		ok := got.GetState() == st && got.GetReasonCode() == code
		for _, w := range words {
			ok = ok && strings.Contains(got.GetReason(), w)
		}
		return ok, fmt.Sprintf("haves %v", s.GetHaves())
	})
	return got
}

// entry is one path of a snapshot: its type, permission and special mode
// bits, owner, and its content (a file) or target (a symlink).
type entry struct {
	Kind     string
	Mode     fs.FileMode
	UID, GID uint32
	Content  string
}

func (n entry) String() string {
	return fmt.Sprintf("%s %v %d:%d %q", n.Kind, n.Mode, n.UID, n.GID, n.Content)
}

// snapshot reads the whole tree under root, by root-relative path.
func snapshot(t testing.TB, root string) map[string]entry {
	t.Helper()
	out := map[string]entry{}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(root, p)
		if err != nil {
			return err
		}
		fi, err := os.Lstat(p)
		if err != nil {
			return err
		}
		n := entry{Mode: fi.Mode() &^ fs.ModeType}
		if st, ok := fi.Sys().(*syscall.Stat_t); ok {
			n.UID, n.GID = st.Uid, st.Gid
		}
		switch {
		case fi.Mode()&fs.ModeSymlink != 0:
			n.Kind = "link"
			if n.Content, err = os.Readlink(p); err != nil {
				return err
			}
		case fi.IsDir():
			n.Kind = "dir"
		case fi.Mode().IsRegular():
			n.Kind = "file"
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			n.Content = string(b)
		default:
			n.Kind = "special " + fi.Mode().Type().String()
		}
		out[rel] = n
		return nil
	})
	if err != nil && !os.IsNotExist(err) {
		t.Fatalf("snapshot of %s: %v", root, err)
	}
	return out
}

// sameTree fails the test for every path added, removed or changed between
// two snapshots.
func sameTree(t testing.TB, before, after map[string]entry) {
	t.Helper()
	var diffs []string
	for p, a := range after {
		b, ok := before[p]
		switch {
		case !ok:
			diffs = append(diffs, fmt.Sprintf("added %s: %v", p, a))
		case a != b:
			diffs = append(diffs, fmt.Sprintf("changed %s: %v, was %v", p, a, b))
		}
	}
	for p, b := range before {
		if _, ok := after[p]; !ok {
			diffs = append(diffs, fmt.Sprintf("removed %s: was %v", p, b))
		}
	}
	sort.Strings(diffs)
	for _, d := range diffs {
		t.Errorf("root changed: %s", d)
	}
}

func (w *world) path(p string) string { return filepath.Join(w.root, filepath.FromSlash(p)) }

func readFile(t testing.TB, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// denyAll is a policy naming every method of a service with no role, so a
// fake serving a few methods can be built.
func denyAll(sd grpc.ServiceDesc) authz.Policy {
	p := authz.Policy{}
	for _, m := range sd.Methods {
		p["/"+sd.ServiceName+"/"+m.MethodName] = authz.Allow()
	}
	for _, s := range sd.Streams {
		p["/"+sd.ServiceName+"/"+s.StreamName] = authz.Allow()
	}
	return p
}

// waitReportedApplied waits until the engine's last report says manifest m
// is applied.
func (w *world) waitReportedApplied(t testing.TB, m *typev1.Envelope) {
	t.Helper()
	eventually(t, "applied reported", func() (bool, string) {
		rep := w.composer.lastReport()
		return rep.GetApplied().GetDigest() == names.Digest(m.GetPayload()), rep.String()
	})
}
