package engine

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	"mesh.dev/internal/canonical"
	"mesh.dev/internal/envelope"
	"mesh.dev/internal/names"
	"mesh.dev/internal/testutil"
	catalogv1 "mesh.dev/proto/mesh/catalog/v1"
	composerv1 "mesh.dev/proto/mesh/composer/v1"
	typev1 "mesh.dev/proto/mesh/type/v1"
	"mesh.dev/services/nodeengine/internal/apply"
	"mesh.dev/services/nodeengine/internal/state"
)

// unitCatalog answers entries by fingerprint.
type unitCatalog struct{ entries map[string]*catalogv1.Entry }

func (c unitCatalog) GetEntry(_ context.Context, in *catalogv1.GetEntryRequest, _ ...grpc.CallOption) (*catalogv1.GetEntryResponse, error) {
	if e, ok := c.entries[in.GetFingerprint()]; ok {
		return &catalogv1.GetEntryResponse{Entry: e}, nil
	}
	return nil, status.Errorf(codes.NotFound, "no entry of fingerprint %s", in.GetFingerprint())
}

func (c unitCatalog) DownloadArtifact(context.Context, *catalogv1.DownloadArtifactRequest, ...grpc.CallOption) (grpc.ServerStreamingClient[catalogv1.DownloadArtifactResponse], error) {
	return nil, status.Error(codes.Unavailable, "no artifacts")
}

type unitWorld struct {
	t     *testing.T
	tr    *testutil.Trust
	now   time.Time
	root  string
	cat   unitCatalog
	comp  *fuzzComposer
	db    *state.DB
	e     *Engine
	fps   map[string]string
	rev   uint64
	prefs []string
	dir   string
	after func(done, total int)
	// syncFault fails the directory fsyncs it returns an error for.
	syncFault func(dir string) error
	// wrapStore, when set, wraps the state the engine is given.
	wrapStore func(*state.DB) state.Store
	// ks is the keyset version the manifests are signed under.
	ks uint64
	// logs holds what the engines logged, as text.
	logs syncBuffer
	// catalog and composer, when set, stand in for cat and comp.
	catalog  Catalog
	composer Composer
}

// syncBuffer is a bytes.Buffer safe for the engine's goroutines.
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

func newUnitWorld(t *testing.T, modules ...string) *unitWorld {
	return newUnitWorldWith(t, nil, modules...)
}

// newUnitWorldWith is newUnitWorld with setup called before the engine
// starts (to stand in a catalog or a composer).
func newUnitWorldWith(t *testing.T, setup func(*unitWorld), modules ...string) *unitWorld {
	w := &unitWorld{t: t, tr: testutil.NewTrust(t, 1, 1), now: time.Now(), cat: unitCatalog{entries: map[string]*catalogv1.Entry{}},
		comp: &fuzzComposer{comps: map[string]*typev1.Envelope{}}, fps: map[string]string{}, prefs: []string{"/srv"}, ks: 1}
	for _, m := range modules {
		mm := &typev1.ModuleManifest{Module: m, Version: "1.0"}
		b, err := canonical.Marshal(mm)
		if err != nil {
			t.Fatal(err)
		}
		e := &catalogv1.Entry{Module: m, Repository: "https://git.example/infra", Path: m, SourceDigest: names.Digest([]byte(m)),
			Manifest: b, ManifestDigest: names.Digest(b), Verdict: catalogv1.Verdict_VERDICT_PASS}
		e.Fingerprint = names.ComputeFingerprint(e.Module, e.Repository, e.Path, e.SourceDigest, e.ManifestDigest)
		w.cat.entries[e.Fingerprint] = e
		w.fps[m] = e.Fingerprint
	}
	w.dir = t.TempDir()
	if setup != nil {
		setup(w)
	}
	w.start()
	w.e.OfferKeyset(w.tr.KeysetEnvelope)
	return w
}

// start opens the state and starts an engine on w.dir.
func (w *unitWorld) start() {
	t := w.t
	dir := w.dir
	w.root = filepath.Join(dir, "root")
	stateDir := filepath.Join(dir, "state")
	if err := os.MkdirAll(stateDir, 0o700); err != nil {
		t.Fatal(err)
	}
	db, err := state.Open(filepath.Join(stateDir, "engine.db"))
	if err != nil {
		t.Fatal(err)
	}
	w.db = db
	log := slog.New(slog.NewTextHandler(&w.logs, nil))
	a, err := apply.New(apply.Config{Root: w.root, Prefixes: w.prefs, StateDir: stateDir, Logger: log, AfterOp: w.after, DirSyncFault: w.syncFault})
	if err != nil {
		t.Fatal(err)
	}
	var cat Catalog = w.cat
	if w.catalog != nil {
		cat = w.catalog
	}
	var comp Composer = w.comp
	if w.composer != nil {
		comp = w.composer
	}
	var store state.Store = db
	if w.wrapStore != nil {
		store = w.wrapStore(db)
	}
	w.e, err = New(context.Background(), Config{Node: "ace", Roots: w.tr.Roots, Store: store, Applier: a, Composer: comp,
		Catalog: cat, Now: func() time.Time { return w.now }, Logger: log,
		EntryBackoffBase: time.Millisecond, EntryBackoffMax: time.Millisecond, FetchDeadline: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	e := w.e
	t.Cleanup(func() { e.Close(); db.Close() })
}

// composition signs a composition of module at fp and serves it under key.
func (w *unitWorld) composition(module, fp string, serve bool, res ...*typev1.Resource) (*typev1.Envelope, *typev1.Want) {
	c := &typev1.Composition{Node: "ace", Module: module, Fingerprint: fp, Resources: res}
	env, _ := w.tr.Sign(w.t, typev1.PayloadType_PAYLOAD_TYPE_COMPOSITION, c)
	key, err := names.CompositionKey("ace", module, fp)
	if err != nil {
		w.t.Fatal(err)
	}
	if serve {
		w.comp.comps[key] = env
	}
	return env, &typev1.Want{Module: module, Fingerprint: fp, CompositionKey: key, CompositionDigest: envelope.Digest(env)}
}

func (w *unitWorld) offer(wants ...*typev1.Want) {
	w.rev++
	env, _ := w.tr.Sign(w.t, typev1.PayloadType_PAYLOAD_TYPE_MANIFEST, &typev1.Manifest{Node: "ace", Revision: w.rev,
		IssuedAt: timestamppb.New(w.now), ExpiresAt: timestamppb.New(w.now.Add(24 * time.Hour)), KeysetVersion: w.ks, Wants: wants})
	w.e.OfferManifest(env)
	w.e.Pass(context.Background())
}

func (w *unitWorld) have(m string) *composerv1.Have {
	for _, h := range w.e.Status().GetHaves() {
		if h.GetModule() == m {
			return h
		}
	}
	return nil
}

// revokeSigningKey offers keyset version 2, in which the key the
// manifests were signed with so far is REVOKED and a new one ACTIVE; the new
// one signs from then on. It returns the old key and the keyset (to offer
// again).
func (w *unitWorld) revokeSigningKey() (old ed25519.PrivateKey, keyset *typev1.Envelope) {
	t := w.t
	old, next := w.tr.SigningKey, testutil.NewKey(t)
	ks := &typev1.Keyset{Version: 2, IssuedAt: timestamppb.New(w.now), ExpiresAt: timestamppb.New(w.now.Add(24 * time.Hour)),
		Keys: []*typev1.KeysetKey{
			testutil.KeysetKeyOf(old, typev1.KeyState_KEY_STATE_REVOKED, w.now.Add(-time.Hour), w.now.Add(time.Hour)),
			testutil.KeysetKeyOf(next, typev1.KeyState_KEY_STATE_ACTIVE, w.now.Add(-time.Hour), w.now.Add(24*time.Hour)),
		}}
	keyset = w.tr.SignKeyset(t, ks, w.tr.RootKeys...)
	w.e.OfferKeyset(keyset)
	w.tr.SigningKey, w.ks = next, 2
	return old, keyset
}

// restartWithKeysetUnreadable stops the engine, makes its kept keyset
// section unreadable and starts it again.
func (w *unitWorld) restartWithKeysetUnreadable() {
	w.restartEditing(func(tx *bolt.Tx) error {
		return tx.Bucket([]byte(state.SectionKeyset)).Put([]byte(state.SectionKeyset), []byte("garbage"))
	})
}

// restartEditing stops the engine, changes its state file with edit (as
// a damaged disk, or a hand, would) and starts it again.
func (w *unitWorld) restartEditing(edit func(tx *bolt.Tx) error) {
	w.e.Close()
	if err := w.db.Bolt().Update(edit); err != nil {
		w.t.Fatal(err)
	}
	w.db.Close()
	w.start()
}

// stopApply is what an engine's AfterOp panics with to stop an apply.
type stopApply struct{}

// restartStoppingAfter restarts the engine so that its applies stop (as a
// kill would) after n ops.
func (w *unitWorld) restartStoppingAfter(n int) {
	w.e.Close()
	w.db.Close()
	w.after = func(done, _ int) {
		if done == n {
			panic(stopApply{})
		}
	}
	w.start()
}

// offerStopped offers the next manifest and fails unless its apply is
// stopped (see restartStoppingAfter); the engine is then as a kill leaves
// it, journal kept.
func (w *unitWorld) offerStopped(wants ...*typev1.Want) {
	t := w.t
	defer func() {
		if p := recover(); p != nil {
			if _, ok := p.(stopApply); !ok {
				panic(p)
			}
		}
	}()
	w.offer(wants...)
	t.Fatal("the apply was not stopped")
}

func revFile(id, module, p, content string) *typev1.Resource {
	return &typev1.Resource{Id: id, Module: module, Type: typev1.ResourceType_RESOURCE_TYPE_FILE, Path: p, Mode: 0o644,
		Content: &typev1.Resource_Inline{Inline: []byte(content)}}
}

// A want of module b that names the digest of module a's composition (a
// composer bug, or a compromised composer: the signer does not tie a want's
// digest to its module) is refused WANT_MISMATCH (DESIGN §7: each
// composition's node/module/fingerprint match the want), also when the
// engine holds that composition already (cached or applied, by digest).
func TestHeldCompositionCheckedAgainstTheWant(t *testing.T) {
	w := newUnitWorld(t, "a", "b")
	_, ownWant := w.composition(names.NodeModule, "", true)
	_, aWant := w.composition("a", w.fps["a"], true, revFile("a:conf", "a", "/srv/a/conf", "a\n"))
	w.offer(aWant, ownWant)
	if h := w.have("a"); h.GetApplied().GetDigest() != aWant.GetCompositionDigest() {
		t.Fatalf("a not applied: %v", h)
	}
	// Revision 2: a leaves, b's want names a's composition.
	bWant := &typev1.Want{Module: "b", Fingerprint: w.fps["b"], CompositionKey: "ace.b." + w.fps["b"][len("fp1:"):], CompositionDigest: aWant.GetCompositionDigest()}
	w.offer(bWant, ownWant)
	kept, err := w.db.Load()
	if err != nil {
		t.Fatal(err)
	}
	if env, ok := kept.Applied.Compositions["b"]; ok {
		c := &typev1.Composition{}
		if err := envelope.Open(env, typev1.PayloadType_PAYLOAD_TYPE_COMPOSITION, c); err != nil {
			t.Fatal(err)
		}
		t.Fatalf("module b is recorded applied with a composition of module %q at %s (want mismatch never checked); have of b: %v", c.GetModule(), c.GetFingerprint(), w.have("b"))
	}
	if h := w.have("b"); h.GetAttempt().GetReasonCode() != composerv1.ReasonCode_REASON_CODE_WANT_MISMATCH {
		t.Fatalf("b's attempt is %v, want WANT_MISMATCH", h.GetAttempt())
	}
	// The log says it too, once: not again at the next pass.
	w.e.Pass(context.Background())
	if n := strings.Count(w.logs.String(), `msg="module not applied" module=b state=FAILED code=WANT_MISMATCH`); n != 1 {
		t.Errorf("the refusal was logged %d times, want once:\n%s", n, w.logs.String())
	}
}

// A module that left the manifest, whose old composition cannot be
// prepared (one of its files became a FIFO), while removals are off
// (another want's composition failed to fetch): it is put back into effect
// once, not at every turn of the apply's retry loop, so the loop does not
// run out with nothing applied — the node's own new composition, which is
// fine, is applied.
func TestLeftModuleThatCannotBePreparedDoesNotStopTheApply(t *testing.T) {
	w := newUnitWorld(t, "l", "x")
	_, own1 := w.composition(names.NodeModule, "", true, revFile("net:conf", "", "/srv/net/conf", "one\n"))
	_, lWant := w.composition("l", w.fps["l"], true, revFile("l:conf", "l", "/srv/l/conf", "l\n"))
	w.offer(lWant, own1)
	if h := w.have("l"); h.GetApplied().GetDigest() != lWant.GetCompositionDigest() {
		t.Fatalf("l not applied: %v", h)
	}
	p := filepath.Join(w.root, "srv", "l", "conf")
	if err := os.Remove(p); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mkfifo(p, 0o644); err != nil {
		t.Fatal(err)
	}
	// Revision 2: l leaves; x's composition cannot be fetched; the node's
	// own composition changes.
	_, own2 := w.composition(names.NodeModule, "", true, revFile("net:conf", "", "/srv/net/conf", "two\n"))
	_, xWant := w.composition("x", w.fps["x"], false, revFile("x:conf", "x", "/srv/x/conf", "x\n"))
	w.offer(own2, xWant)
	b, _ := os.ReadFile(filepath.Join(w.root, "srv", "net", "conf"))
	h := w.have(names.NodeModule)
	if string(b) != "two\n" {
		t.Fatalf("the node's own new composition is not applied (disk holds %q); its have: applied=%v attempt=%v; x: %v; l: %v",
			b, h.GetApplied().GetDigest() == own2.GetCompositionDigest(), h.GetAttempt(), w.have("x").GetAttempt(), w.have("l").GetAttempt())
	}
}

// A composition whose only signature is by a key the current keyset
// REVOKED ("verifies nothing") is not taken for a new manifest because the
// engine holds it applied (by digest): it is fetched again, and applied
// once the composer serves it signed by a key the keyset lists.
func TestHeldCompositionByARevokedKeyIsFetchedAgain(t *testing.T) {
	w := newUnitWorld(t)
	_, ownWant := w.composition(names.NodeModule, "", true, revFile("net:conf", "", "/srv/net/conf", "one\n"))
	w.offer(ownWant)
	if h := w.have(names.NodeModule); h.GetApplied().GetDigest() != ownWant.GetCompositionDigest() {
		t.Fatalf("not applied: %v", h)
	}
	// Keyset v2: the first key revoked, a new one active.
	w.revokeSigningKey()
	// The composer serves nothing new; a manifest by the new key names the
	// same composition digest, whose only signature is the revoked key's.
	w.comp.comps = map[string]*typev1.Envelope{}
	w.offer(ownWant)
	if h := w.have(names.NodeModule); h.GetAttempt().GetReasonCode() != composerv1.ReasonCode_REASON_CODE_FETCH_FAILED {
		t.Fatalf("the composition held by the revoked key's signature was taken: attempt %v", h.GetAttempt())
	}
	applied := func() (*typev1.Manifest, *typev1.Envelope) {
		t.Helper()
		kept, err := w.db.Load()
		if err != nil {
			t.Fatal(err)
		}
		m := &typev1.Manifest{}
		if err := envelope.Open(kept.Applied.Manifest, typev1.PayloadType_PAYLOAD_TYPE_MANIFEST, m); err != nil {
			t.Fatal(err)
		}
		return m, kept.Applied.Compositions[names.NodeModule]
	}
	if m, _ := applied(); m.GetRevision() != 1 {
		t.Fatalf("revision %d recorded applied, want 1 still", m.GetRevision())
	}
	// The composer signs it again with the new key: same payload, same
	// digest.
	_, again := w.composition(names.NodeModule, "", true, revFile("net:conf", "", "/srv/net/conf", "one\n"))
	if again.GetCompositionDigest() != ownWant.GetCompositionDigest() {
		t.Fatal("the composition signed again has another digest")
	}
	w.offer(again)
	m, env := applied()
	if m.GetRevision() != 3 {
		t.Fatalf("revision %d recorded applied, want 3 (have %v)", m.GetRevision(), w.have(names.NodeModule))
	}
	if _, err := w.e.keyring.Verify(env, typev1.PayloadType_PAYLOAD_TYPE_COMPOSITION, w.now); err != nil {
		t.Fatalf("the applied composition does not verify under keyset 2: %v", err)
	}
}

// An unreadable keyset section means "apply nothing and say why" (DESIGN
// §7), and an engine accepts a higher keyset version only: a keyset older
// than the one the applied manifest was signed under (here version 1,
// listing the key version 2 revoked) does not lift the block, so a
// manifest signed by that revoked key is not applied; version 2 again
// lifts it.
func TestOlderKeysetDoesNotRepairAnUnreadableKeysetSection(t *testing.T) {
	w := newUnitWorld(t)
	_, own1 := w.composition(names.NodeModule, "", true, revFile("net:conf", "", "/srv/net/conf", "one\n"))
	w.offer(own1)
	k1, ks := w.revokeSigningKey()
	k2 := w.tr.SigningKey
	_, own2 := w.composition(names.NodeModule, "", true, revFile("net:conf", "", "/srv/net/conf", "two\n"))
	w.offer(own2)
	if v := w.e.Status().GetKeysetVersion(); v != 2 {
		t.Fatalf("keyset version %d", v)
	}
	// Stop; the keyset section becomes unreadable; start again.
	w.restartWithKeysetUnreadable()
	// The old keyset v1 is offered again (a replay), then a manifest signed
	// by k1, which v2 revoked.
	w.e.OfferKeyset(w.tr.KeysetEnvelope)
	w.tr.SigningKey = k1
	_, own3 := w.composition(names.NodeModule, "", true, revFile("net:conf", "", "/srv/net/conf", "by a revoked key\n"))
	w.offer(own3)
	b, _ := os.ReadFile(filepath.Join(w.root, "srv", "net", "conf"))
	if string(b) == "by a revoked key\n" {
		t.Fatalf("after the keyset section was damaged the engine took keyset version %d and applied a manifest signed by the key version 2 revoked; blocked=%q",
			w.e.Status().GetKeysetVersion(), w.e.Status().GetBlocked())
	}
	if w.e.Status().GetBlocked() == "" {
		t.Fatal("the older keyset lifted the block")
	}
	// Version 2, at least as new as the applied manifest's, repairs it.
	w.e.OfferKeyset(ks)
	w.tr.SigningKey = k2
	_, own4 := w.composition(names.NodeModule, "", true, revFile("net:conf", "", "/srv/net/conf", "four\n"))
	w.offer(own4)
	if b, _ := os.ReadFile(filepath.Join(w.root, "srv", "net", "conf")); string(b) != "four\n" {
		t.Fatalf("after keyset 2 the disk holds %q; blocked=%q, keyset %d", b, w.e.Status().GetBlocked(), w.e.Status().GetKeysetVersion())
	}
}

// A stop in the middle of an apply leaves the journal; at the next start
// the keyset section is unreadable, so the engine is blocked and does not
// replay it then. When a keyset lifts the block, the first pass finishes
// the half-done apply before anything else (it was once never replayed,
// and the engine then refused its own files as unmanaged).
func TestHalfDoneApplyFinishedOnceTheBlockLifts(t *testing.T) {
	w := newUnitWorld(t)
	w.restartStoppingAfter(2)
	w.e.OfferKeyset(w.tr.KeysetEnvelope)
	_, own := w.composition(names.NodeModule, "", true,
		revFile("net:a", "", "/srv/net/a", "a\n"), revFile("net:b", "", "/srv/net/b", "b\n"))
	w.offerStopped(own)
	w.rev-- // the same manifest is offered again after the restart
	w.after = nil
	w.restartWithKeysetUnreadable()
	w.e.OfferKeyset(w.tr.KeysetEnvelope)
	w.offer(own)
	b, err := os.ReadFile(filepath.Join(w.root, "srv", "net", "b"))
	if err != nil || string(b) != "b\n" {
		t.Fatalf("the half-done apply was never finished: /srv/net/b %q (%v); node have: %v", b, err, w.have(names.NodeModule).GetAttempt())
	}
}

// signallingComposer closes fetched at its first GetComposition.
type signallingComposer struct {
	*fuzzComposer
	once    sync.Once
	fetched chan struct{}
}

func (c *signallingComposer) GetComposition(ctx context.Context, in *composerv1.GetCompositionRequest, opts ...grpc.CallOption) (*composerv1.GetCompositionResponse, error) {
	c.once.Do(func() { close(c.fetched) })
	return c.fuzzComposer.GetComposition(ctx, in, opts...)
}

// waitingCatalog answers an entry only once the composition was fetched
// (or, should it never be, after three times the wait for an answer).
type waitingCatalog struct {
	unitCatalog
	fetched <-chan struct{}
}

func (c *waitingCatalog) GetEntry(ctx context.Context, in *catalogv1.GetEntryRequest, opts ...grpc.CallOption) (*catalogv1.GetEntryResponse, error) {
	select {
	case <-c.fetched:
	case <-time.After(3 * EntryWait):
	}
	return c.unitCatalog.GetEntry(ctx, in, opts...)
}

// TestCompositionFetchedWhileTheEntryIsAsked: a manifest naming a new
// fingerprint needs its entry from the catalog and its composition from the
// composer. The catalog here answers only once the composition was fetched:
// fetched after the answer (or after the pass's wait for it), the module
// would be held ENTRY_ASKED; fetched while the entry is asked, it is applied
// in that one pass.
func TestCompositionFetchedWhileTheEntryIsAsked(t *testing.T) {
	fetched := make(chan struct{})
	w := newUnitWorldWith(t, func(w *unitWorld) {
		w.catalog = &waitingCatalog{unitCatalog: w.cat, fetched: fetched}
		w.composer = &signallingComposer{fuzzComposer: w.comp, fetched: fetched}
	}, "a")

	_, ownWant := w.composition(names.NodeModule, "", true)
	_, aWant := w.composition("a", w.fps["a"], true, revFile("a:conf", "a", "/srv/a/conf", "a\n"))
	w.offer(aWant, ownWant)
	if h := w.have("a"); h.GetApplied().GetDigest() != aWant.GetCompositionDigest() {
		t.Errorf("a not applied in the pass: %v", h)
	}
}

// countingComposer counts GetComposition calls and, while down is set,
// answers each UNAVAILABLE.
type countingComposer struct {
	*fuzzComposer
	mu    sync.Mutex
	calls int
	down  bool
}

func (c *countingComposer) GetComposition(ctx context.Context, in *composerv1.GetCompositionRequest, opts ...grpc.CallOption) (*composerv1.GetCompositionResponse, error) {
	c.mu.Lock()
	c.calls++
	down := c.down
	c.mu.Unlock()
	if down {
		return nil, status.Error(codes.Unavailable, "composer down")
	}
	return c.fuzzComposer.GetComposition(ctx, in, opts...)
}

func (c *countingComposer) take() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := c.calls
	c.calls = 0
	return n
}

// TestPrefetchFetchesOnlyWhatTheApplyTakes: a composition refused in a
// pass (here its digest is not the want's) is fetched once, not again by
// the apply; and a pass whose manifest went stale fetches nothing, as the
// apply takes nothing.
func TestPrefetchFetchesOnlyWhatTheApplyTakes(t *testing.T) {
	var counting *countingComposer
	w := newUnitWorldWith(t, func(w *unitWorld) {
		counting = &countingComposer{fuzzComposer: w.comp}
		w.composer = counting
	}, "a", "c")

	_, ownWant := w.composition(names.NodeModule, "", true)
	w.offer(ownWant)
	counting.take()
	// A want whose digest is not the composition's: refused, fetched once.
	_, aWant := w.composition("a", w.fps["a"], true, revFile("a:conf", "a", "/srv/a/conf", "a\n"))
	bad := &typev1.Want{Module: "a", Fingerprint: w.fps["a"], CompositionKey: aWant.GetCompositionKey(), CompositionDigest: names.Digest([]byte("not it"))}
	w.offer(bad, ownWant)
	if n := counting.take(); n != 1 {
		t.Errorf("a refused composition was fetched %d times in its pass, want 1", n)
	}
	if h := w.have("a"); h.GetAttempt().GetState() != composerv1.AttemptState_ATTEMPT_STATE_FAILED {
		t.Errorf("refused composition: have %v, want FAILED", h)
	}
	// The composer down, a new want: the fetch fails; the manifest then
	// expires, and the next pass fetches nothing.
	counting.mu.Lock()
	counting.down = true
	counting.mu.Unlock()
	_, cWant := w.composition("c", w.fps["c"], true, revFile("c:conf", "c", "/srv/c/conf", "c\n"))
	w.offer(cWant, ownWant)
	if n := counting.take(); n != 1 {
		t.Errorf("composer down: %d fetches in the pass, want 1", n)
	}
	counting.mu.Lock()
	counting.down = false
	counting.mu.Unlock()
	w.now = w.now.Add(48 * time.Hour) // past its expiry and the hour of skew allowed
	w.e.Pass(context.Background())
	if n := counting.take(); n != 0 {
		t.Errorf("a pass with its manifest expired fetched %d compositions; the apply takes none", n)
	}
	if h := w.have("c"); h.GetAttempt().GetState() != composerv1.AttemptState_ATTEMPT_STATE_STALE {
		t.Errorf("expired manifest: have of c %v, want STALE", h)
	}
}
