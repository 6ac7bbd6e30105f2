// Package badinput sends hostile input through the real services over
// mTLS — catalog, composer, signer, and a node engine fed signed but
// hostile content by a compromised composer — and checks that every case
// is refused with a code and words naming what is wrong, and changes
// nothing: the buckets, the signer's signatures, the engine's root dir and
// applied state stay as they were. Each class logs its figures for
// RELIABILITY.md.
package badinput

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"mesh.dev/internal/canonical"
	"mesh.dev/internal/lint"
	"mesh.dev/internal/names"
	"mesh.dev/internal/natsx"
	catalogv1 "mesh.dev/proto/mesh/catalog/v1"
	typev1 "mesh.dev/proto/mesh/type/v1"
	"mesh.dev/tests/internal/rig"

	"mesh.dev/internal/testutil"
)

// seed makes the generated cases the same in every run; a failure names
// its case, which names what it sent.
const seed = 20260601

func newRand() *rand.Rand { return rand.New(rand.NewPCG(seed, seed>>3)) }

// badCase is one hostile request: call sends it, want is how it must be
// refused, state reads what it must not change.
type badCase struct {
	name  string
	call  func(ctx context.Context) error
	code  codes.Code
	words []string
	state func(t *testing.T) string
	// bug names a reported bug that gives this case another code than
	// the one wanted: the case must still be refused and change nothing,
	// and the wrong code is reported under the bug (a failing subtest)
	// until it is fixed.
	bug string
}

// knownBugs collects the cases refused with the wrong code, by bug.
var (
	knownBugsMu sync.Mutex
	knownBugs   = map[string][]string{}
	bugsFixed   = map[string]int{}
)

// tally is a class's figures.
type tally struct {
	class, proves  string
	cases, refused int
	// wrongCode counts refused cases answered with the code of a known bug.
	wrongCode int
}

var (
	talliesMu sync.Mutex
	tallies   []tally
)

// runClass sends every case of a class, checking each one's refusal and
// that the state it names did not change.
func runClass(t *testing.T, class, proves string, cases []badCase) {
	t.Helper()
	t.Run(class, func(t *testing.T) {
		refused, wrongCode := 0, 0
		for _, c := range cases {
			knownBugsMu.Lock()
			bugsBefore := len(knownBugs[c.bug])
			knownBugsMu.Unlock()
			problems := checkCase(t, c)
			for _, p := range problems {
				t.Error(p)
			}
			if len(problems) == 0 {
				refused++
				knownBugsMu.Lock()
				if c.bug != "" && len(knownBugs[c.bug]) > bugsBefore {
					wrongCode++
				}
				knownBugsMu.Unlock()
			}
		}
		t.Logf("%s: %d cases, %d refused with nothing changed (%d of them with the wrong code of a known bug), %d violations",
			class, len(cases), refused, wrongCode, len(cases)-refused)
		talliesMu.Lock()
		tallies = append(tallies, tally{class: class, proves: proves, cases: len(cases), refused: refused, wrongCode: wrongCode})
		talliesMu.Unlock()
	})
}

// checkCase sends one case and returns what is wrong with its outcome: not
// refused, refused with another code or without the words, or a change of
// the state it names.
func checkCase(t *testing.T, c badCase) []string {
	var problems []string
	before := c.state(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	err := c.call(ctx)
	cancel()
	after := c.state(t)
	msg := status.Convert(err).Message()
	switch {
	case c.bug != "" && err != nil && (status.Code(err) != c.code || !containsAll(msg, c.words)):
		knownBugsMu.Lock()
		knownBugs[c.bug] = append(knownBugs[c.bug], fmt.Sprintf("%s: %v (want %v naming %q)", c.name, err, c.code, c.words))
		knownBugsMu.Unlock()
	case c.bug != "" && err != nil:
		knownBugsMu.Lock()
		bugsFixed[c.bug]++
		knownBugsMu.Unlock()
	case err == nil || status.Code(err) != c.code:
		problems = append(problems, fmt.Sprintf("%s: %v (code %v), want %v", c.name, err, status.Code(err), c.code))
	default:
		for _, w := range c.words {
			if !strings.Contains(msg, w) {
				problems = append(problems, fmt.Sprintf("%s: message %q does not say %q", c.name, msg, w))
				break
			}
		}
	}
	if before != after {
		problems = append(problems, fmt.Sprintf("%s: the refused request changed state:\nbefore %s\nafter  %s", c.name, before, after))
	}
	return problems
}

func containsAll(s string, words []string) bool {
	for _, w := range words {
		if !strings.Contains(s, w) {
			return false
		}
	}
	return true
}

// streamSeqs reads the last sequence of JetStream streams: any write to a
// bucket or object store moves it.
func streamSeqs(t *testing.T, js jetstream.JetStream, streams ...string) string {
	t.Helper()
	var parts []string
	for _, s := range streams {
		st, err := js.Stream(context.Background(), s)
		if err != nil {
			t.Fatalf("stream %s: %v", s, err)
		}
		info, err := st.Info(context.Background())
		if err != nil {
			t.Fatalf("stream %s: %v", s, err)
		}
		if strings.HasPrefix(s, "OBJ_") {
			// An upload writes its chunks before it knows their digest
			// and purges them when refused: what is held counts, not the
			// sequence.
			parts = append(parts, fmt.Sprintf("%s=%d msgs/%d bytes", s, info.State.Msgs, info.State.Bytes))
			continue
		}
		parts = append(parts, fmt.Sprintf("%s=%d/%d", s, info.State.LastSeq, info.State.Msgs))
	}
	return strings.Join(parts, " ")
}

func kv(bucket string) string  { return "KV_" + bucket }
func obj(bucket string) string { return "OBJ_" + bucket }

// catalogState is what a refused catalog write must leave: entries,
// builds, registrations and artifacts.
func catalogState(js jetstream.JetStream) func(t *testing.T) string {
	return func(t *testing.T) string {
		return streamSeqs(t, js, kv(natsx.BucketCatalogEntries), kv(natsx.BucketCatalogBuilds), kv(natsx.BucketCatalogModules),
			obj(natsx.ObjectStoreArtifacts))
	}
}

// composerState is what a refused composer request must leave: the
// operators' intent (nodes, approvals) and what nodes run (assignments,
// compositions, objects).
func composerState(js jetstream.JetStream) func(t *testing.T) string {
	return func(t *testing.T) string {
		return streamSeqs(t, js, kv(natsx.BucketNodes), kv(natsx.BucketApprovals), kv(natsx.BucketAssignments),
			kv(natsx.BucketCompositions), obj(natsx.ObjectStoreObjects))
	}
}

// signerState is what a refused signing request must leave: the signed
// records of its audit log (a refusal appends a refused record only).
func signerState(stateDir string) func(t *testing.T) string {
	return func(t *testing.T) string {
		b, err := os.ReadFile(filepath.Join(stateDir, "audit.log"))
		if err != nil {
			t.Fatal(err)
		}
		return fmt.Sprintf("signed records: %d", strings.Count(string(b), `"kind":"signed"`))
	}
}

// treeState describes every entry under a directory (not following
// symlinks): type, mode, owner, content digest, link target.
func treeState(dir string) func(t *testing.T) string {
	return func(t *testing.T) string {
		var lines []string
		for p, desc := range testutil.Tree(t, dir, "") {
			lines = append(lines, strings.TrimPrefix(p, dir)+" "+desc)
		}
		sort.Strings(lines)
		return strings.Join(lines, "; ")
	}
}

// both joins two state readers.
func both(a, b func(t *testing.T) string) func(t *testing.T) string {
	return func(t *testing.T) string { return a(t) + " | " + b(t) }
}

// rawMsg carries bytes a raw codec sends as they are.
type rawMsg struct{ b []byte }

// rawCodec sends rawMsg bytes without encoding them, so the server has to
// decode whatever they are.
type rawCodec struct{}

func (rawCodec) Marshal(v any) ([]byte, error) { return v.(*rawMsg).b, nil }
func (rawCodec) Unmarshal(b []byte, v any) error {
	if m, ok := v.(*rawMsg); ok {
		m.b = append([]byte(nil), b...)
	}
	return nil
}
func (rawCodec) Name() string { return "proto" }

// invokeRaw sends raw bytes as a unary request.
func invokeRaw(conn *grpc.ClientConn, method string, b []byte) func(ctx context.Context) error {
	return func(ctx context.Context) error {
		return conn.Invoke(ctx, method, &rawMsg{b}, &rawMsg{}, grpc.ForceCodec(rawCodec{}))
	}
}

// streamRaw sends raw bytes as the messages of a client stream.
func streamRaw(conn *grpc.ClientConn, method string, msgs ...[]byte) func(ctx context.Context) error {
	return func(ctx context.Context) error {
		st, err := conn.NewStream(ctx, &grpc.StreamDesc{ClientStreams: true}, method, grpc.ForceCodec(rawCodec{}))
		if err != nil {
			return err
		}
		for _, m := range msgs {
			if err := st.SendMsg(&rawMsg{m}); err != nil {
				break
			}
		}
		_ = st.CloseSend()
		return st.RecvMsg(&rawMsg{})
	}
}

// malformed returns n byte strings that do not decode as m's type: random
// bytes, m's encoding cut short, a wire type changed, overlong varints, a
// string field holding invalid UTF-8, a length running past the end and an
// unterminated group. Only those proto.Unmarshal refuses are kept.
func malformed(r *rand.Rand, m proto.Message, n int) [][]byte {
	good, err := proto.MarshalOptions{Deterministic: true}.Marshal(m)
	if err != nil {
		panic(err)
	}
	refused := func(b []byte) bool {
		return proto.Unmarshal(b, m.ProtoReflect().New().Interface()) != nil
	}
	var out [][]byte
	add := func(b []byte) {
		if refused(b) {
			out = append(out, b)
		}
	}
	add([]byte{0x0a, 0x05, 0xff, 0xfe, 0xfd, 0xfc, 0xfb})                                                  // field 1 (a string) of invalid UTF-8
	add([]byte{0x0a, 0x7f, 'x'})                                                                           // a length past the end
	add([]byte{0x0b})                                                                                      // a group that never ends
	add(append([]byte{0x08}, []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01}...)) // an overlong varint
	add([]byte{0x00})                                                                                      // field number 0
	add([]byte{0x0f})                                                                                      // wire type 7
	for tries := 0; len(out) < n && tries < 50*n; tries++ {
		switch tries % 4 {
		case 0:
			b := make([]byte, 1+r.IntN(64))
			for i := range b {
				b[i] = byte(r.UintN(256))
			}
			add(b)
		case 1:
			if len(good) > 1 {
				add(good[:1+r.IntN(len(good)-1)])
			}
		case 2:
			if len(good) > 0 {
				b := append([]byte(nil), good...)
				i := r.IntN(len(b))
				b[i] = b[i]&^7 | byte(3+r.IntN(5)) // a wire type that breaks it
				add(b)
			}
		case 3:
			b := append([]byte(nil), good...)
			add(append(b, 0x0a, byte(1+r.IntN(100))))
		}
	}
	if len(out) > n {
		out = out[:n]
	}
	return out
}

// moduleManifest is a good module manifest of one module.
func moduleManifest(module string) *typev1.ModuleManifest {
	return &typev1.ModuleManifest{
		Module: module, Version: "1.0",
		Upgrade: &typev1.Policy{Policy: typev1.UpgradePolicy_UPGRADE_POLICY_AUTO},
		Resources: []*typev1.ResourceTemplate{
			{Name: "dir", Type: typev1.ResourceType_RESOURCE_TYPE_DIRECTORY, Path: "/srv/" + module, Mode: 0o755},
			{Name: "conf", Type: typev1.ResourceType_RESOURCE_TYPE_FILE, Path: "/srv/" + module + "/conf", Mode: 0o644,
				Content: &typev1.ResourceTemplate_Text{Text: "port {{ .Params.port }}\n"}},
			{Name: "bin", Type: typev1.ResourceType_RESOURCE_TYPE_FILE, Path: "/opt/" + module + "/bin", Mode: 0o755,
				Content: &typev1.ResourceTemplate_Artifact{Artifact: "binary:" + module}},
		},
	}
}

// entryOf builds a consistent entry of m.
func entryOf(m *typev1.ModuleManifest, repo string) *catalogv1.Entry {
	b, err := canonical.Marshal(m)
	if err != nil {
		panic(err)
	}
	e := &catalogv1.Entry{Module: m.GetModule(), Repository: repo, Path: "modules/" + m.GetModule(),
		SourceDigest: names.Digest([]byte(repo + m.GetModule() + m.GetVersion())), Commit: strings.Repeat("ab", 20),
		Manifest: b, ManifestDigest: names.Digest(b), Needs: m.GetNeeds(), Verdict: catalogv1.Verdict_VERDICT_PASS}
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

// entryWith builds an entry whose manifest is m mutated, consistent in
// everything else: only the manifest's own problem shows.
func entryWith(mutate func(m *typev1.ModuleManifest)) *catalogv1.Entry {
	m := moduleManifest("evil")
	mutate(m)
	return entryOf(m, "https://git.example/evil")
}

// wait polls a condition (a wait with a deadline, not a sleep).
var wait = rig.Eventually
