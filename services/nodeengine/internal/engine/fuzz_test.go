package engine

import (
	"context"
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"mesh.dev/internal/canonical"
	"mesh.dev/internal/envelope"
	"mesh.dev/internal/lint"
	"mesh.dev/internal/names"
	"mesh.dev/internal/testutil"
	"mesh.dev/internal/verify"
	catalogv1 "mesh.dev/proto/mesh/catalog/v1"
	composerv1 "mesh.dev/proto/mesh/composer/v1"
	typev1 "mesh.dev/proto/mesh/type/v1"
	"mesh.dev/services/nodeengine/internal/apply"
	"mesh.dev/services/nodeengine/internal/state"
)

// fuzzNow is the engine's clock in FuzzSyncResponses: fixed, so that the
// committed corpus of signed manifests keeps its meaning.
var fuzzNow = time.Date(2026, 6, 1, 12, 0, 0, 0, time.UTC)

var fuzzPrefixes = []string{"/srv", "/etc/app"}

// Frames of a FuzzSyncResponses input: a tag byte, a uvarint length and
// that many bytes.
const (
	frameSync        = 0 // a SyncResponse, handed to the engine as the Sync client does
	frameComposition = 1 // an Envelope the fake composer serves as a composition
	framePass        = 2 // run a pass now
)

func frame(tag byte, m proto.Message) []byte {
	var b []byte
	if m != nil {
		var err error
		opts := proto.MarshalOptions{Deterministic: true}
		if b, err = opts.Marshal(m); err != nil {
			panic(err)
		}
	}
	out := append([]byte{tag}, binary.AppendUvarint(nil, uint64(len(b)))...)
	return append(out, b...)
}

// fuzzComposer serves the compositions the input gave it.
type fuzzComposer struct {
	comps map[string]*typev1.Envelope
}

func (c *fuzzComposer) GetComposition(_ context.Context, in *composerv1.GetCompositionRequest, _ ...grpc.CallOption) (*composerv1.GetCompositionResponse, error) {
	env, ok := c.comps[in.GetKey()]
	if !ok {
		return nil, status.Errorf(codes.NotFound, "no composition %s", in.GetKey())
	}
	return &composerv1.GetCompositionResponse{Composition: env}, nil
}

func (c *fuzzComposer) GetObject(context.Context, *composerv1.GetObjectRequest, ...grpc.CallOption) (grpc.ServerStreamingClient[composerv1.GetObjectResponse], error) {
	return nil, status.Error(codes.Unavailable, "no objects in this test")
}

// fuzzCatalog knows one entry, of module web.
type fuzzCatalog struct{ entry *catalogv1.Entry }

func (c fuzzCatalog) GetEntry(_ context.Context, in *catalogv1.GetEntryRequest, _ ...grpc.CallOption) (*catalogv1.GetEntryResponse, error) {
	if in.GetFingerprint() == c.entry.GetFingerprint() {
		return &catalogv1.GetEntryResponse{Entry: c.entry}, nil
	}
	return nil, status.Errorf(codes.NotFound, "no entry of fingerprint %s", in.GetFingerprint())
}

func (c fuzzCatalog) DownloadArtifact(context.Context, *catalogv1.DownloadArtifactRequest, ...grpc.CallOption) (grpc.ServerStreamingClient[catalogv1.DownloadArtifactResponse], error) {
	return nil, status.Error(codes.Unavailable, "no artifacts in this test")
}

// fuzzWeb is module web's manifest and entry.
func fuzzWeb(t testing.TB) (*typev1.ModuleManifest, *catalogv1.Entry) {
	m := &typev1.ModuleManifest{Module: "web", Version: "1.0", Upgrade: &typev1.Policy{Policy: typev1.UpgradePolicy_UPGRADE_POLICY_AUTO},
		Resources: []*typev1.ResourceTemplate{
			{Name: "dir", Type: typev1.ResourceType_RESOURCE_TYPE_DIRECTORY, Path: "/srv/web", Mode: 0o755},
			{Name: "conf", Type: typev1.ResourceType_RESOURCE_TYPE_FILE, Path: "/srv/web/conf", Content: &typev1.ResourceTemplate_Text{Text: "listen {{ .Params.port }}\n"}},
		}}
	b, err := canonical.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	e := &catalogv1.Entry{Module: "web", Repository: "https://git.example/infra", Path: "web", SourceDigest: names.Digest([]byte("web")),
		Manifest: b, ManifestDigest: names.Digest(b), Verdict: catalogv1.Verdict_VERDICT_PASS}
	e.Fingerprint = names.ComputeFingerprint(e.Module, e.Repository, e.Path, e.SourceDigest, e.ManifestDigest)
	if _, err := lint.CheckEntry(e); err != nil {
		t.Fatal(err)
	}
	return m, e
}

// seedWorld signs the seeds' envelopes.
type seedWorld struct {
	t     testing.TB
	trust *testutil.Trust
	webFP string
}

func (w *seedWorld) sign(pt typev1.PayloadType, m proto.Message) *typev1.Envelope {
	env, _ := w.trust.Sign(w.t, pt, m)
	return env
}

func (w *seedWorld) composition(module string, res ...*typev1.Resource) (*typev1.Envelope, *typev1.Want) {
	c := &typev1.Composition{Node: "ace", Module: module, Resources: res}
	if module != names.NodeModule {
		c.Fingerprint = w.webFP
	}
	env := w.sign(typev1.PayloadType_PAYLOAD_TYPE_COMPOSITION, c)
	key, _ := names.CompositionKey("ace", module, c.GetFingerprint())
	return env, &typev1.Want{Module: module, Fingerprint: c.GetFingerprint(), CompositionKey: key, CompositionDigest: envelope.Digest(env)}
}

func (w *seedWorld) manifest(node string, rev uint64, issued time.Time, wants ...*typev1.Want) *typev1.Envelope {
	return w.sign(typev1.PayloadType_PAYLOAD_TYPE_MANIFEST, &typev1.Manifest{Node: node, Revision: rev, IssuedAt: timestamppb.New(issued),
		ExpiresAt: timestamppb.New(issued.Add(24 * time.Hour)), KeysetVersion: 1, Wants: wants})
}

func syncKeyset(env *typev1.Envelope) []byte {
	return frame(frameSync, &composerv1.SyncResponse{Msg: &composerv1.SyncResponse_Keyset{Keyset: env}})
}

func syncManifest(env *typev1.Envelope) []byte {
	return frame(frameSync, &composerv1.SyncResponse{Msg: &composerv1.SyncResponse_Manifest{Manifest: env}})
}

func fileRes(id, p, content string) *typev1.Resource {
	return &typev1.Resource{Id: id, Module: moduleOfRes(id), Type: typev1.ResourceType_RESOURCE_TYPE_FILE, Path: p, Mode: 0o644,
		Content: &typev1.Resource_Inline{Inline: []byte(content)}}
}

func moduleOfRes(id string) string {
	if m := names.ModuleOfID(id); m == "web" {
		return m
	}
	return ""
}

func cat(parts ...[]byte) []byte {
	var out []byte
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

// engineSeeds are Sync conversations: good ones that apply, and hostile
// ones (signed by the genuine key but escaping the prefixes, another
// node's, replayed, expired, unsigned, a stranger's keyset, a revoked key).
func engineSeeds(t testing.TB, tr *testutil.Trust, webFP string) [][]byte {
	w := &seedWorld{t: t, trust: tr, webFP: webFP}
	ks := syncKeyset(tr.KeysetEnvelope)
	own, ownWant := w.composition(names.NodeModule,
		&typev1.Resource{Id: "net:dir", Type: typev1.ResourceType_RESOURCE_TYPE_DIRECTORY, Path: "/srv/net", Mode: 0o755},
		fileRes("net:conf", "/srv/net/conf", "mtu 1400\n"),
		&typev1.Resource{Id: "net:link", Type: typev1.ResourceType_RESOURCE_TYPE_SYMLINK, Path: "/srv/net/current", Target: "conf"},
	)
	web, webWant := w.composition("web",
		&typev1.Resource{Id: "web:dir", Module: "web", Type: typev1.ResourceType_RESOURCE_TYPE_DIRECTORY, Path: "/srv/web", Mode: 0o755},
		fileRes("web:conf", "/srv/web/conf", "listen 80\n"))
	good := w.manifest("ace", 5, fuzzNow.Add(-time.Minute), ownWant, webWant)
	pass := frame(framePass, nil)

	var out [][]byte
	// A good conversation, then a newer manifest that drops the module.
	own2, ownWant2 := w.composition(names.NodeModule, fileRes("net:conf", "/srv/net/conf", "mtu 9000\n"))
	out = append(out, cat(ks, frame(frameComposition, own), frame(frameComposition, web), syncManifest(good), pass, pass))
	out = append(out, cat(ks, frame(frameComposition, own), syncManifest(w.manifest("ace", 5, fuzzNow, ownWant)), pass,
		frame(frameComposition, own2), syncManifest(w.manifest("ace", 6, fuzzNow, ownWant2)), pass))
	// Signed but hostile compositions of the node's own.
	for _, res := range [][]*typev1.Resource{
		{fileRes("x:shadow", "/etc/shadow", "pwned\n")},
		{fileRes("x:up", "/srv/../etc/shadow", "pwned\n")},
		{fileRes("x:dbl", "/srv//x", "pwned\n")},
		{{Id: "x:l", Type: typev1.ResourceType_RESOURCE_TYPE_SYMLINK, Path: "/srv/l", Target: "/etc/shadow"}},
		{{Id: "x:l", Type: typev1.ResourceType_RESOURCE_TYPE_SYMLINK, Path: "/srv/l", Target: "../../../../etc"}},
		{{Id: "x:l", Type: typev1.ResourceType_RESOURCE_TYPE_SYMLINK, Path: "/srv/l", Target: "/etc/app"}, fileRes("x:f", "/srv/l/f", "through\n")},
		{fileRes("x:a", "/srv/a", "1"), fileRes("x:b", "/srv/a", "2")},
		{{Id: "x:big", Type: typev1.ResourceType_RESOURCE_TYPE_FILE, Path: "/srv/big", Content: &typev1.Resource_Object{Object: &typev1.ObjectRef{Digest: names.Digest([]byte("x")), Size: 1 << 40}}}},
		{{Id: "x:m", Type: typev1.ResourceType_RESOURCE_TYPE_FILE, Path: "/srv/m", Mode: 0o170777, Content: &typev1.Resource_Inline{Inline: []byte("x")}}},
		{{Id: "x:t", Type: typev1.ResourceType(9), Path: "/srv/t"}},
	} {
		env, want := w.composition(names.NodeModule, res...)
		out = append(out, cat(ks, frame(frameComposition, env), syncManifest(w.manifest("ace", 7, fuzzNow, want)), pass))
	}
	// A composition whose bytes are not the ones the manifest names.
	_, otherWant := w.composition(names.NodeModule, fileRes("net:conf", "/srv/net/conf", "other\n"))
	out = append(out, cat(ks, frame(frameComposition, own), syncManifest(w.manifest("ace", 8, fuzzNow, otherWant)), pass))
	// Another node's manifest, an expired one, one issued far ahead, a
	// replay of a lower revision after a higher one, a manifest before any
	// keyset, a stranger's signature, a stranger's keyset.
	out = append(out, cat(ks, frame(frameComposition, own), syncManifest(w.manifest("bob", 9, fuzzNow, ownWant)), pass))
	out = append(out, cat(ks, frame(frameComposition, own), syncManifest(w.manifest("ace", 9, fuzzNow.Add(-72*time.Hour), ownWant)), pass))
	out = append(out, cat(ks, frame(frameComposition, own), syncManifest(w.manifest("ace", 9, fuzzNow.Add(48*time.Hour), ownWant)), pass))
	out = append(out, cat(ks, frame(frameComposition, own), syncManifest(w.manifest("ace", 9, fuzzNow, ownWant)), pass,
		syncManifest(w.manifest("ace", 3, fuzzNow, ownWant2)), frame(frameComposition, own2), pass))
	out = append(out, cat(frame(frameComposition, own), syncManifest(good), pass, ks, pass))
	stranger := testutil.FixedKey("engine-fuzz stranger")
	forged, _, _ := envelope.Seal(typev1.PayloadType_PAYLOAD_TYPE_MANIFEST, &typev1.Manifest{Node: "ace", Revision: 10,
		IssuedAt: timestamppb.New(fuzzNow), ExpiresAt: timestamppb.New(fuzzNow.Add(time.Hour)), Wants: []*typev1.Want{ownWant}})
	_ = envelope.SignWith(forged, stranger)
	out = append(out, cat(ks, frame(frameComposition, own), syncManifest(forged), pass))
	strangerKs := proto.Clone(tr.Keyset).(*typev1.Keyset)
	strangerKs.Version = 2
	strangerKs.Keys = []*typev1.KeysetKey{testutil.KeysetKeyOf(stranger, typev1.KeyState_KEY_STATE_ACTIVE, fuzzNow.Add(-time.Hour), fuzzNow.Add(time.Hour))}
	out = append(out, cat(ks, syncKeyset(tr.SignKeyset(t, strangerKs, stranger)), frame(frameComposition, own), syncManifest(forged), pass))
	// A keyset revoking the signing key after a manifest was applied.
	revoked := proto.Clone(tr.Keyset).(*typev1.Keyset)
	revoked.Version = 3
	revoked.Keys[0].State = typev1.KeyState_KEY_STATE_REVOKED
	out = append(out, cat(ks, frame(frameComposition, own), syncManifest(w.manifest("ace", 5, fuzzNow, ownWant)), pass,
		syncKeyset(tr.SignKeyset(t, revoked, tr.RootKeys...)), frame(frameComposition, own2), syncManifest(w.manifest("ace", 6, fuzzNow, ownWant2)), pass))
	// Heard of other nodes, garbage and an unknown message.
	out = append(out, cat(ks, frame(frameSync, &composerv1.SyncResponse{Msg: &composerv1.SyncResponse_Heard{Heard: &composerv1.Heard{
		Modules: []*composerv1.HeardModule{{Module: "web", Nodes: []*composerv1.HeardNode{{Node: "bob", Fingerprint: webFP}, {Node: "../x", Fingerprint: "fp1:zz"}}}}}}}), pass))
	out = append(out, []byte{0, 3, 0xff, 0xff, 0xff, 1, 2, 0x0a, 0x00, 2, 0})
	return out
}

// fuzzHost is the engine's machine for one input.
type fuzzHost struct {
	dir, root, stateDir string
}

func (h *fuzzHost) snapshot(t *testing.T) map[string]string {
	out := map[string]string{}
	err := filepath.WalkDir(h.dir, func(p string, e fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if p == h.stateDir {
			return filepath.SkipDir
		}
		fi, err := os.Lstat(p)
		if err != nil {
			return err
		}
		kind := "o"
		switch {
		case fi.Mode().IsRegular():
			kind = "f"
		case fi.IsDir():
			kind = "d"
		case fi.Mode()&fs.ModeSymlink != 0:
			kind = "l"
		}
		desc := fmt.Sprintf("%s %o", kind, fi.Sys().(*syscall.Stat_t).Mode&0o7777)
		switch {
		case fi.Mode().IsRegular():
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			sum := sha256.Sum256(b)
			desc += " " + hex.EncodeToString(sum[:])
		case fi.Mode()&fs.ModeSymlink != 0:
			target, _ := os.Readlink(p)
			desc += " -> " + target
		}
		out[p] = desc
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// genuine reports whether env carries a valid signature by key over its
// payload: the fuzzer cannot forge one, so only seeds' envelopes have it.
func genuine(env *typev1.Envelope, pub ed25519.PublicKey) bool {
	input, err := envelope.SigningInput(env.GetPayloadType(), env.GetPayload())
	if err != nil {
		return false
	}
	for _, s := range env.GetSignatures() {
		if ed25519.Verify(pub, input, s.GetSignature()) {
			return true
		}
	}
	return false
}

// FuzzSyncResponses hands arbitrary Sync messages (keysets, manifests,
// heard) and compositions to a real engine on a real state file and a
// temporary root, running passes between them: it never panics, and all
// it keeps and applies bears a genuine signature — a keyset of the pinned
// roots, a manifest and compositions of the signing key, of node ace —
// while everything on disk outside the prefixes stays as it was and every
// path the engine put in them is one an applied composition declares (or a
// directory on the way to one).
func FuzzSyncResponses(f *testing.F) {
	tr := testutil.FixedTrust(f, "engine-fuzz", 1, 1, fuzzNow)
	_, webEntry := fuzzWeb(f)
	seeds := testutil.NewFuzzSeeds(f)
	for _, s := range engineSeeds(f, tr, webEntry.GetFingerprint()) {
		seeds.Add(s)
	}
	signingPub := tr.SigningKey.Public().(ed25519.PublicKey)
	f.Fuzz(func(t *testing.T, data []byte) {
		// The fuzzing engine does not report an input that hangs: this
		// does, with every goroutine's stack.
		watchdog := time.AfterFunc(10*time.Second, func() {
			buf := make([]byte, 1<<20)
			panic(fmt.Sprintf("FuzzSyncResponses: an input ran for a minute:\n%s", buf[:runtime.Stack(buf, true)]))
		})
		defer watchdog.Stop()
		dir := t.TempDir()
		h := &fuzzHost{dir: dir, root: filepath.Join(dir, "root"), stateDir: filepath.Join(dir, "state")}
		outside := filepath.Join(dir, "outside")
		if err := os.MkdirAll(outside, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(outside, "secret"), []byte("secret\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.MkdirAll(filepath.Join(h.root, "etc"), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(h.root, "etc", "shadow"), []byte("root:*:\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.MkdirAll(h.stateDir, 0o700); err != nil {
			t.Fatal(err)
		}
		db, err := state.Open(filepath.Join(h.stateDir, "engine.db"))
		if err != nil {
			t.Fatal(err)
		}
		log := slog.New(slog.DiscardHandler)
		a, err := apply.New(apply.Config{Root: h.root, Prefixes: fuzzPrefixes, StateDir: h.stateDir, Logger: log})
		if err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(outside, filepath.Join(h.root, "srv", "out")); err != nil {
			t.Fatal(err)
		}
		start := h.snapshot(t)
		comp := &fuzzComposer{comps: map[string]*typev1.Envelope{}}
		e, err := New(context.Background(), Config{Node: "ace", Roots: tr.Roots, Store: db, Applier: a, Composer: comp,
			Catalog: fuzzCatalog{entry: webEntry}, Now: func() time.Time { return fuzzNow }, Logger: log,
			EntryBackoffBase: time.Millisecond, EntryBackoffMax: time.Millisecond, FetchDeadline: 5 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		defer func() {
			e.Close()
			db.Close()
		}()
		ctx := context.Background()
		for frames := 0; len(data) > 0 && frames < 64; frames++ {
			tag := data[0] % 3
			n, k := binary.Uvarint(data[1:])
			if k <= 0 || n > uint64(len(data)-1-k) {
				break
			}
			body := data[1+k : 1+k+int(n)]
			data = data[1+k+int(n):]
			switch tag {
			case frameSync:
				m := &composerv1.SyncResponse{}
				if proto.Unmarshal(body, m) != nil {
					continue
				}
				e.Synced()
				switch x := m.GetMsg().(type) {
				case *composerv1.SyncResponse_Keyset:
					e.OfferKeyset(x.Keyset)
				case *composerv1.SyncResponse_Manifest:
					e.OfferManifest(x.Manifest)
				case *composerv1.SyncResponse_Heard:
					e.SetHeard(x.Heard)
				}
			case frameComposition:
				env := &typev1.Envelope{}
				c := &typev1.Composition{}
				if proto.Unmarshal(body, env) != nil || proto.Unmarshal(env.GetPayload(), c) != nil {
					continue
				}
				if key, err := names.CompositionKey(c.GetNode(), c.GetModule(), c.GetFingerprint()); err == nil {
					comp.comps[key] = env
				}
			case framePass:
				e.Pass(ctx)
			}
		}
		e.Pass(ctx)
		e.Status()
		e.FirstViews()
		e.Hello()
		e.Report()

		kept, err := db.Load()
		if err != nil {
			t.Fatal(err)
		}
		if kept.Keyset != nil {
			if _, err := verify.Keyset(tr.Roots, kept.Keyset); err != nil {
				t.Fatalf("kept a keyset the roots did not sign: %v", err)
			}
		}
		if env := kept.Applied.Manifest; env != nil {
			m := &typev1.Manifest{}
			if !genuine(env, signingPub) || envelope.Open(env, typev1.PayloadType_PAYLOAD_TYPE_MANIFEST, m) != nil || m.GetNode() != "ace" {
				t.Fatalf("applied a manifest that is not a genuine one of ace: %v", m)
			}
		}
		declared := map[string]*typev1.Resource{}
		for module, env := range kept.Applied.Compositions {
			c := &typev1.Composition{}
			if !genuine(env, signingPub) || envelope.Open(env, typev1.PayloadType_PAYLOAD_TYPE_COMPOSITION, c) != nil {
				t.Fatalf("applied a composition of %s that is not genuine", module)
			}
			if c.GetNode() != "ace" || c.GetModule() != module || lint.CheckComposition(c) != nil {
				t.Fatalf("applied composition of %s is %s/%s (%v)", module, c.GetNode(), c.GetModule(), lint.CheckComposition(c))
			}
			for _, r := range c.GetResources() {
				declared[r.GetPath()] = r
			}
		}
		for p := range kept.Ledger {
			if !a.Within(p) {
				t.Fatalf("the ledger holds %s, outside the prefixes", p)
			}
		}
		now := h.snapshot(t)
		for p, desc := range start {
			if now[p] != desc && !h.inPrefix(p) {
				t.Fatalf("changed %s outside the prefixes: %q became %q", p, desc, now[p])
			}
		}
		for p, desc := range now {
			if start[p] == desc {
				continue
			}
			if !h.inPrefix(p) {
				t.Fatalf("created %s (%s) outside the prefixes", p, desc)
			}
			rel := "/" + filepath.ToSlash(strings.TrimPrefix(p, h.root+"/"))
			r, ok := declared[rel]
			if !ok {
				if strings.HasPrefix(desc, "d ") && underDeclared(rel, declared) {
					continue // a directory on the way to a declared path
				}
				if rec, ok := kept.Ledger[rel]; ok && rec.Retained {
					continue
				}
				t.Fatalf("%s (%s) is on disk, yet no applied composition declares it", rel, desc)
			}
			if in, ok := r.GetContent().(*typev1.Resource_Inline); ok && strings.HasPrefix(desc, "f ") {
				sum := sha256.Sum256(in.Inline)
				if !strings.HasSuffix(desc, hex.EncodeToString(sum[:])) {
					t.Fatalf("%s holds other content than its composition declares", rel)
				}
			}
		}
	})
}

func (h *fuzzHost) inPrefix(p string) bool {
	for _, pr := range fuzzPrefixes {
		dir := filepath.Join(h.root, filepath.FromSlash(pr))
		if p == dir || strings.HasPrefix(p, dir+"/") {
			return true
		}
	}
	return false
}

func underDeclared(dir string, declared map[string]*typev1.Resource) bool {
	for p := range declared {
		if strings.HasPrefix(p, dir+"/") {
			return true
		}
	}
	return false
}
