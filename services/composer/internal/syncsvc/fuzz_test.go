package syncsvc

import (
	"context"
	"encoding/binary"
	"errors"
	"io"
	"log/slog"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"mesh.dev/internal/identity"
	"mesh.dev/internal/lint"
	"mesh.dev/internal/names"
	"mesh.dev/internal/testutil"
	"mesh.dev/internal/verify"
	catalogv1 "mesh.dev/proto/mesh/catalog/v1"
	composerv1 "mesh.dev/proto/mesh/composer/v1"
	typev1 "mesh.dev/proto/mesh/type/v1"
	"mesh.dev/services/composer/internal/pass"
	"mesh.dev/services/composer/internal/store"
)

// fuzzStream is one Sync stream of FuzzSyncRequests: it hands the
// server the input's messages, then io.EOF, and keeps what it is sent.
type fuzzStream struct {
	grpc.ServerStream
	ctx  context.Context
	reqs []*composerv1.SyncRequest

	mu   sync.Mutex
	sent []*composerv1.SyncResponse
}

func (s *fuzzStream) Context() context.Context { return s.ctx }

func (s *fuzzStream) Recv() (*composerv1.SyncRequest, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.reqs) == 0 {
		return nil, io.EOF
	}
	r := s.reqs[0]
	s.reqs = s.reqs[1:]
	return r, nil
}

func (s *fuzzStream) Send(m *composerv1.SyncResponse) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.sent = append(s.sent, m)
	return nil
}

type fixedKeysets struct{ ring *verify.Keyring }

func (k fixedKeysets) Keyring() *verify.Keyring { return k.ring }

// noCatalog answers no entry: Heard is computed from none.
type noCatalog struct{}

func (noCatalog) Registration(string) (*catalogv1.Registration, bool) { return nil, false }
func (noCatalog) Entry(context.Context, string) (*pass.Release, error) {
	return nil, pass.ErrNoEntry
}
func (noCatalog) Build(context.Context, string) (*catalogv1.Build, error) {
	return nil, pass.ErrNoBuild
}

// syncFuzzWorld is a real store on an embedded JetStream with a running
// hub: node specs of ace and cat, assignments of ace and bob, and a haves
// record of bob (who has no spec).
type syncFuzzWorld struct {
	st      *store.Store
	srv     *Server
	trust   *testutil.Trust
	bobRev  uint64
	lastSeq uint64
}

func newSyncFuzzWorld(f *testing.F) *syncFuzzWorld {
	ctx := context.Background()
	_, js := testutil.ConnectJetStream(f, testutil.StartJetStream(f))
	st, err := store.Open(ctx, js, 1, 10*time.Second, nil)
	if err != nil {
		f.Fatal(err)
	}
	log := slog.New(slog.DiscardHandler)
	tr := testutil.FixedTrust(f, "sync-fuzz", 1, 1, time.Now())
	ring, err := verify.Keyset(tr.Roots, tr.KeysetEnvelope)
	if err != nil {
		f.Fatal(err)
	}
	for _, node := range []string{"ace", "cat"} {
		if _, err := st.PutSpec(ctx, &composerv1.NodeSpec{Node: node}, 0, true); err != nil {
			f.Fatal(err)
		}
	}
	fp := names.FingerprintPrefix + strings.Repeat("7a", 32)
	for _, a := range []struct {
		node string
		rev  uint64
	}{{"ace", 5}, {"bob", 9}} {
		key, _ := names.CompositionKey(a.node, "web", fp)
		wants := []*typev1.Want{{Module: "web", Fingerprint: fp, CompositionKey: key, CompositionDigest: names.Digest([]byte(a.node))}}
		env, _ := tr.Sign(f, typev1.PayloadType_PAYLOAD_TYPE_MANIFEST, &typev1.Manifest{Node: a.node, Revision: a.rev,
			IssuedAt: timestamppb.Now(), ExpiresAt: timestamppb.New(time.Now().Add(time.Hour)), Wants: wants})
		if _, err := st.WriteAssignment(ctx, &composerv1.Assignment{Node: a.node, Wants: wants, Manifest: env, ManifestRevision: a.rev}, 0); err != nil {
			f.Fatal(err)
		}
	}
	b, _ := proto.Marshal(&composerv1.HaveRecord{Node: "bob", ReportSeq: 3})
	bobRev, err := st.Haves.Create(ctx, "bob", b)
	if err != nil {
		f.Fatal(err)
	}
	hub := NewHub(st, log)
	hctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- hub.Run(hctx) }()
	f.Cleanup(func() {
		cancel()
		<-done
	})
	deadline := time.Now().Add(10 * time.Second)
	for !hub.Healthy() {
		if time.Now().After(deadline) {
			f.Fatal("the hub did not catch up within 10s")
		}
		time.Sleep(5 * time.Millisecond)
	}
	srv := New(Config{Hub: hub, Store: st, Keysets: fixedKeysets{ring}, Catalog: noCatalog{}, Logger: log, HeardEvery: time.Millisecond})
	return &syncFuzzWorld{st: st, srv: srv, trust: tr, bobRev: bobRev}
}

func syncFrame(m *composerv1.SyncRequest) []byte {
	b, err := proto.Marshal(m)
	if err != nil {
		panic(err)
	}
	return append(binary.AppendUvarint(nil, uint64(len(b))), b...)
}

func hello(node string, seq uint64, haves ...*composerv1.Have) *composerv1.SyncRequest {
	return &composerv1.SyncRequest{Msg: &composerv1.SyncRequest_Hello{Hello: &composerv1.Hello{Node: node, EngineVersion: "fuzz", ReportSeq: seq, Haves: haves,
		Applied: &composerv1.ManifestRef{Revision: 4, Digest: names.Digest([]byte("m"))}, HighWater: 4}}}
}

func report(seq uint64, haves ...*composerv1.Have) *composerv1.SyncRequest {
	return &composerv1.SyncRequest{Msg: &composerv1.SyncRequest_Report{Report: &composerv1.Report{ReportSeq: seq, Haves: haves, HighWater: 5}}}
}

func syncSeeds() [][]byte {
	fp := names.FingerprintPrefix + strings.Repeat("7a", 32)
	have := func(node, module string) *composerv1.Have {
		key, _ := names.CompositionKey(node, module, fp)
		if module == names.NodeModule {
			key = names.NodeKey(node)
		}
		return &composerv1.Have{Module: module, Applied: &composerv1.AppliedRef{Fingerprint: fp, Key: key, Digest: names.Digest([]byte(key))},
			Attempt: &composerv1.Attempt{Key: key, State: composerv1.AttemptState_ATTEMPT_STATE_APPLIED}}
	}
	cat := func(caller byte, msgs ...*composerv1.SyncRequest) []byte {
		out := []byte{caller}
		for _, m := range msgs {
			out = append(out, syncFrame(m)...)
		}
		return out
	}
	return [][]byte{
		cat(0, hello("ace", 10, have("ace", "web")), report(11, have("ace", "web"), have("ace", "node")), report(12)),
		cat(0, hello("ace", 20), report(21, have("ace", "web")), report(15, have("ace", "db"))),
		cat(0, hello("bob", 1)),
		cat(1, hello("bob", 1)),
		cat(2, hello("eve", 1)),
		cat(0, report(1, have("ace", "web"))),
		cat(0, &composerv1.SyncRequest{}),
		cat(0, hello("ace", 30, have("bob", "web"))),
		cat(0, hello("ace", 31), report(32, have("bob", "web"))),
		cat(0, hello("ace", 33), hello("ace", 34)),
		cat(0, hello("ace", 35, &composerv1.Have{Module: "../etc"})),
		cat(0, hello("ace", 36, &composerv1.Have{Module: "web", Attempt: &composerv1.Attempt{Key: "ace.web", State: composerv1.AttemptState(42)}})),
		cat(0, hello("ACE", 37)),
		cat(0, hello("ace", 38, &composerv1.Have{Module: "web", Attempt: &composerv1.Attempt{Reason: strings.Repeat("x", 2<<20)}})),
		{0, 0xff, 0xff, 0x03},
	}
}

// FuzzSyncRequests feeds arbitrary Sync streams (the engine's side:
// Hello, Reports, garbage) to the real SyncService on a real store and
// hub: it never panics and always returns; its codes are those DESIGN.md
// §6 names; it never sends a node another node's manifest; it never
// touches another node's haves; and the caller's haves record, when
// written, names only the caller's keys and never goes back in report_seq.
func FuzzSyncRequests(f *testing.F) {
	w := newSyncFuzzWorld(f)
	seeds := testutil.NewFuzzSeeds(f)
	for _, s := range syncSeeds() {
		seeds.Add(s)
	}
	callers := []identity.Identity{
		{TrustDomain: testutil.TrustDomain, Role: identity.RoleNode, Name: "ace"},
		{TrustDomain: testutil.TrustDomain, Role: identity.RoleNode, Name: "bob"},
		{TrustDomain: testutil.TrustDomain, Role: identity.RoleNode, Name: "cat"},
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) == 0 {
			return
		}
		caller := callers[int(data[0])%len(callers)]
		var reqs []*composerv1.SyncRequest
		for rest := data[1:]; len(rest) > 0 && len(reqs) < 32; {
			n, k := binary.Uvarint(rest)
			if k <= 0 || n > uint64(len(rest)-k) {
				break
			}
			m := &composerv1.SyncRequest{}
			if proto.Unmarshal(rest[k:k+int(n)], m) == nil {
				reqs = append(reqs, m)
			}
			rest = rest[k+int(n):]
		}
		ctx, cancel := context.WithTimeout(identity.NewContext(context.Background(), caller), 20*time.Second)
		defer cancel()
		stream := &fuzzStream{ctx: ctx, reqs: reqs}
		done := make(chan error, 1)
		go func() { done <- w.srv.Sync(stream) }()
		var err error
		select {
		case err = <-done:
		case <-time.After(30 * time.Second):
			buf := make([]byte, 1<<20)
			t.Fatalf("Sync did not return within 30s:\n%s", buf[:runtime.Stack(buf, true)])
		}
		switch status.Code(err) {
		case codes.Unknown:
			if !errors.Is(err, io.EOF) { // the engine closed before Hello
				t.Fatalf("Sync ended with %v", err)
			}
		case codes.OK, codes.InvalidArgument, codes.PermissionDenied, codes.Unavailable:
		default:
			t.Fatalf("Sync ended with %v", err)
		}
		if err != nil && errors.Is(ctx.Err(), context.DeadlineExceeded) {
			t.Fatalf("Sync ran until its deadline: %v", err)
		}
		stream.mu.Lock()
		for _, m := range stream.sent {
			if env := m.GetManifest(); env != nil {
				man := &typev1.Manifest{}
				if err := proto.Unmarshal(env.GetPayload(), man); err != nil || man.GetNode() != caller.Name {
					t.Fatalf("sent %s a manifest of %q", caller.Name, man.GetNode())
				}
			}
		}
		stream.mu.Unlock()

		bob, err := w.st.Haves.Get(context.Background(), "bob")
		if err != nil || bob.Revision != w.bobRev {
			t.Fatalf("bob's haves changed (revision %d, was %d): %v", bob.Revision, w.bobRev, err)
		}
		for _, node := range []string{"ace", "cat"} {
			rec, _, err := w.st.Have(context.Background(), node)
			if err != nil {
				continue
			}
			if rec.GetNode() != node {
				t.Fatalf("the haves of %s are recorded as %q's", node, rec.GetNode())
			}
			if node == "ace" {
				if rec.GetReportSeq() < w.lastSeq {
					t.Fatalf("ace's report_seq went back from %d to %d", w.lastSeq, rec.GetReportSeq())
				}
				w.lastSeq = rec.GetReportSeq()
			}
			if len(rec.GetHaves()) > 512 || proto.Size(rec) > lint.MaxKVValue {
				t.Fatalf("%s's record holds %d haves, %d bytes", node, len(rec.GetHaves()), proto.Size(rec))
			}
			for i, h := range rec.GetHaves() {
				for _, key := range []string{h.GetApplied().GetKey(), h.GetAttempt().GetKey()} {
					if key == "" {
						continue
					}
					k, err := names.ParseCompositionKey(key)
					if err != nil || k.Node != node {
						t.Fatalf("%s's haves[%d] names key %q", node, i, key)
					}
				}
				if h.GetModule() != names.NodeModule && names.CheckModule(h.GetModule()) != nil {
					t.Fatalf("%s's haves[%d] names module %q", node, i, h.GetModule())
				}
			}
		}
	})
}
