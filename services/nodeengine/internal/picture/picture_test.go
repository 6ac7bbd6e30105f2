package picture

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	"mesh.dev/internal/names"
	catalogv1 "mesh.dev/proto/mesh/catalog/v1"
	composerv1 "mesh.dev/proto/mesh/composer/v1"
	nodeenginev1 "mesh.dev/proto/mesh/nodeengine/v1"
	typev1 "mesh.dev/proto/mesh/type/v1"
)

const self = "ace"

func fp(c byte) string { return names.FingerprintFromHex(strings.Repeat(string([]byte{c}), 64)) }

var (
	fpWebA, fpWebB = fp('a'), fp('b')
	fpDB1, fpDB2   = fp('1'), fp('2')
	fpUnheld       = fp('9')
)

func digest(s string) string { return names.Digest([]byte(s)) }

// answered is an entry held for a fingerprint.
func answered(module, fingerprint, version string, needs []*typev1.Need, artifacts ...string) Entry {
	e := &catalogv1.Entry{Fingerprint: fingerprint, Module: module}
	for _, a := range artifacts {
		kind, _, _ := strings.Cut(a, ":")
		e.Artifacts = append(e.Artifacts, &catalogv1.ArtifactDecl{Ref: a, Kind: kind})
	}
	return Entry{State: nodeenginev1.EntryState_ENTRY_STATE_ANSWERED, Entry: e,
		Manifest: &typev1.ModuleManifest{Module: module, Version: version, Needs: needs}}
}

func lookupOf(entries map[string]Entry) Lookup {
	return func(f string) (Entry, bool) {
		e, ok := entries[f]
		return e, ok
	}
}

func heardOf(mods ...*composerv1.HeardModule) *composerv1.Heard {
	return &composerv1.Heard{Modules: mods}
}

func heardModule(module string, nodes ...*composerv1.HeardNode) *composerv1.HeardModule {
	return &composerv1.HeardModule{Module: module, Nodes: nodes}
}

func running(node, f string) *composerv1.HeardNode {
	return &composerv1.HeardNode{Node: node, Fingerprint: f}
}

func stopped(node, f string) *composerv1.HeardNode {
	return &composerv1.HeardNode{Node: node, Fingerprint: f, Stopped: true}
}

func want(module, f string, parts ...*typev1.Artifact) *typev1.Want {
	return &typev1.Want{Module: module, Fingerprint: f, Parts: parts, CompositionDigest: digest(module + f)}
}

func nodeWant() *typev1.Want {
	return &typev1.Want{Module: names.NodeModule, CompositionDigest: digest("own")}
}

// words renders a picture as "module@version fp-letter [nodes] (wanted)".
func words(pic []*nodeenginev1.PictureModule) []string {
	var out []string
	for _, r := range pic {
		s := fmt.Sprintf("%s@%s %s %v", r.GetModule(), r.GetVersion(), names.FingerprintHex(r.GetFingerprint())[:1], r.GetNodes())
		if r.GetWanted() {
			s += " wanted"
		}
		out = append(out, s)
	}
	return out
}

// TestNeeded: the fingerprints the wants name and those heard running, not
// stopped; sorted, unique; never the node's own want.
func TestNeeded(t *testing.T) {
	t.Parallel()
	got := Needed(
		[]*typev1.Want{want("web", fpWebA), nodeWant(), want("bad", "fp1:nope")},
		heardOf(heardModule("db", running("bob", fpDB2), stopped("cat", fpDB1), running("dan", fpWebA), running("eve", "not-a-fingerprint"))))
	if want := []string{fpDB2, fpWebA}; !slices.Equal(got, want) {
		t.Errorf("Needed = %v, want %v", got, want)
	}
}

// TestLay checks the module picture (DESIGN.md §7): heard nodes laid in
// name order, then this node's wants, which win; a stopped node is left
// out; a module whose entry is not held appears by name at version 0; one
// row per module and fingerprint, sorted.
func TestLay(t *testing.T) {
	t.Parallel()
	entries := map[string]Entry{
		fpWebA: answered("web", fpWebA, "1.0", nil),
		fpWebB: answered("web", fpWebB, "2.0", nil),
		fpDB1:  answered("db", fpDB1, "14.1", nil),
		fpDB2:  {State: nodeenginev1.EntryState_ENTRY_STATE_ASKED},
	}
	tests := []struct {
		name  string
		wants []*typev1.Want
		heard *composerv1.Heard
		want  []string
	}{
		{
			name:  "heard nodes in name order, grouped by fingerprint",
			heard: heardOf(heardModule("db", running("cat", fpDB1), running("bob", fpDB1), running("dan", fpDB2))),
			want:  []string{"db@14.1 1 [bob cat]", "db@0 2 [dan]"},
		},
		{
			name:  "a stopped node is not in the picture",
			heard: heardOf(heardModule("db", running("bob", fpDB1), stopped("cat", fpDB1))),
			want:  []string{"db@14.1 1 [bob]"},
		},
		{
			name:  "the want wins over what was heard of this node",
			wants: []*typev1.Want{want("web", fpWebB)},
			heard: heardOf(heardModule("web", running(self, fpWebA), running("bob", fpWebA))),
			want:  []string{"web@1.0 a [bob]", "web@2.0 b [ace] wanted"},
		},
		{
			name:  "a placed module whose entry is not held: by name, version 0",
			wants: []*typev1.Want{want("cache", fpUnheld), want("db", fpDB2), nodeWant()},
			want:  []string{"cache@0 9 [ace] wanted", "db@0 2 [ace] wanted"},
		},
		{
			name:  "modules sorted, then fingerprints",
			wants: []*typev1.Want{want("web", fpWebB)},
			heard: heardOf(heardModule("web", running("bob", fpWebA)), heardModule("db", running("bob", fpDB1))),
			want:  []string{"db@14.1 1 [bob]", "web@1.0 a [bob]", "web@2.0 b [ace] wanted"},
		},
		{
			name:  "a heard module with a malformed name is left out",
			heard: heardOf(heardModule("../db", running("bob", fpDB1))),
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got := words(Lay(self, tt.wants, tt.heard, lookupOf(entries)))
			if !slices.Equal(got, tt.want) {
				t.Errorf("picture\n got %q\nwant %q", got, tt.want)
			}
		})
	}
}

// TestHolds checks each hold and its words, the first that applies, and
// that the node's own want is never held.
func TestHolds(t *testing.T) {
	t.Parallel()
	sel := &typev1.LabelSelector{MatchLabels: map[string]string{"zone": "a", "role": "db"}}
	entries := map[string]Entry{
		fp('3'): {State: nodeenginev1.EntryState_ENTRY_STATE_ASKED},
		fp('4'): {State: nodeenginev1.EntryState_ENTRY_STATE_ASKED, Error: "rpc error: code = Unavailable desc = catalog down"},
		fp('5'): {State: nodeenginev1.EntryState_ENTRY_STATE_NOT_FOUND},
		fp('6'): answered("web", fp('6'), "1.0", nil, "bin:web", "tar:assets", "bin:cli"),
		fp('7'): answered("web", fp('7'), "1.0", []*typev1.Need{{Module: "db", MinVersion: "14.2"}, {Module: "queue", Selector: sel}, {Module: "cache"}}),
		fp('8'): answered("web", fp('8'), "1.0", []*typev1.Need{{Module: "db", MinVersion: "14.0"}, {Module: "cache"}}),
		fp('c'): answered("cache", fp('c'), "1.0", nil),
		fp('d'): answered("db", fp('d'), "14.1", nil),
		fp('e'): answered("db", fp('e'), "14.1", []*typev1.Need{{Module: "cache", Selector: sel}}),
	}
	tests := []struct {
		name  string
		wants []*typev1.Want
		heard *composerv1.Heard
		code  composerv1.ReasonCode
		words string
	}{
		{
			name: "entry asked, not answered", wants: []*typev1.Want{want("web", fp('3'))},
			code: EntryAsked, words: "entry " + fp('3') + " asked of the catalog, not answered",
		},
		{
			name: "entry asked, with the last failure", wants: []*typev1.Want{want("web", fp('4'))},
			code: EntryAsked, words: "entry " + fp('4') + " asked of the catalog, not answered: rpc error: code = Unavailable desc = catalog down",
		},
		{
			name: "entry not yet in the cache", wants: []*typev1.Want{want("web", fpUnheld)},
			code: EntryAsked, words: "entry " + fpUnheld + " asked of the catalog, not answered",
		},
		{
			name: "entry missing", wants: []*typev1.Want{want("web", fp('5'))},
			code: EntryMissing, words: "the catalog holds no entry of fingerprint " + fp('5'),
		},
		{
			name:  "parts missing, named sorted",
			wants: []*typev1.Want{want("web", fp('6'), &typev1.Artifact{Ref: "tar:assets", Digest: "not a digest"}, &typev1.Artifact{Ref: "bin:web", Digest: digest("w")})},
			code:  PartMissing, words: "the want gives no digest for bin:cli, tar:assets",
		},
		{
			name:  "a fingerprint of another module",
			wants: []*typev1.Want{want("db", fp('6'))},
			code:  composerv1.ReasonCode_REASON_CODE_WANT_MISMATCH, words: `fingerprint ` + fp('6') + ` is an entry of module "web", not "db"`,
		},
		{
			name:  "needs unmet: version too low, selector, absent",
			wants: []*typev1.Want{want("web", fp('7'))},
			heard: heardOf(heardModule("db", running("bob", fp('d')))),
			code:  NeedUnmet, words: "needs db >= 14.2; needs queue on nodes role=db,zone=a; needs cache: no module of the picture meets it",
		},
		{
			name:  "needs met by heard nodes and by this node's own want",
			wants: []*typev1.Want{want("web", fp('8')), want("cache", fp('c'))},
			heard: heardOf(heardModule("db", running("bob", fp('d')))),
		},
		{
			name:  "a stopped node meets no need",
			wants: []*typev1.Want{want("web", fp('8')), want("cache", fp('c'))},
			heard: heardOf(heardModule("db", stopped("bob", fp('d')))),
			code:  NeedUnmet, words: "needs db >= 14.0: no module of the picture meets it",
		},
		{
			name:  "this node's own module does not meet a need with a selector",
			wants: []*typev1.Want{want("db", fp('e')), want("cache", fp('c'))},
			code:  NeedUnmet, words: "needs cache on nodes role=db,zone=a: no module of the picture meets it",
		},
		{
			name:  "the node's own want is never held",
			wants: []*typev1.Want{nodeWant()},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			lookup := lookupOf(entries)
			pic := Lay(self, tt.wants, tt.heard, lookup)
			holds := Holds(self, tt.wants, pic, lookup)
			first := tt.wants[0].GetModule()
			var got *nodeenginev1.EngineHold
			for _, h := range holds {
				if h.GetModule() == first {
					got = h
				} else {
					t.Errorf("module %s held too: %v", h.GetModule(), h)
				}
			}
			if tt.code == composerv1.ReasonCode_REASON_CODE_UNSPECIFIED {
				if got != nil {
					t.Errorf("held: %v", got)
				}
				return
			}
			if got.GetCode() != tt.code || got.GetWords() != tt.words {
				t.Errorf("hold %v %q\nwant %v %q", got.GetCode(), got.GetWords(), tt.code, tt.words)
			}
		})
	}
}

// TestHoldsSortedByModule: one hold per held module, in module order.
func TestHoldsSortedByModule(t *testing.T) {
	t.Parallel()
	wants := []*typev1.Want{want("web", fp('3')), want("api", fp('3')), want("db", fp('3'))}
	var got []string
	for _, h := range Holds(self, wants, nil, lookupOf(nil)) {
		got = append(got, h.GetModule())
	}
	if want := []string{"api", "db", "web"}; !slices.Equal(got, want) {
		t.Errorf("holds of %v", got)
	}
}

// TestCompareVersions compares dot-separated numbers numerically.
func TestCompareVersions(t *testing.T) {
	t.Parallel()
	tests := []struct {
		a, b string
		want int
	}{
		{"1.10", "1.9", 1}, {"1.2", "1.2.0", 0}, {"1.2", "1.3", -1}, {"2", "10", -1}, {"1.x", "1.0", 0}, {"0", "", 0},
	}
	for _, tt := range tests {
		if got := CompareVersions(tt.a, tt.b); got != tt.want {
			t.Errorf("CompareVersions(%q, %q) = %d, want %d", tt.a, tt.b, got, tt.want)
		}
	}
}

// TestBuild: a build record comes from the entry's artifact declarations
// and the want's parts only: a declared artifact without a valid digest in
// the want is left out, a part the entry does not declare is ignored, and
// each artifact's reference is artifact-store://<module>/<name>/blobs/<digest>.
func TestBuild(t *testing.T) {
	t.Parallel()
	e := answered("web", fpWebA, "1.0", nil, "binary:web", "tarball:assets", "binary:cli").Entry
	e.Artifacts[0].Kind = "" // the kind then comes from the ref
	w := want("web", fpWebA,
		&typev1.Artifact{Ref: "tarball:assets", Digest: digest("assets"), Size: 6},
		&typev1.Artifact{Ref: "binary:web", Digest: digest("web"), Size: 3},
		&typev1.Artifact{Ref: "binary:cli", Digest: "sha256:short"},
		&typev1.Artifact{Ref: "binary:undeclared", Digest: digest("x"), Size: 1})
	before := proto.Clone(w)
	got := Build(e, w)
	want := BuildRecord{Module: "web", Fingerprint: fpWebA, Artifacts: []ArtifactRef{
		{Ref: "binary:web", Kind: "binary", Name: "web", Digest: digest("web"), Size: 3, URL: "artifact-store://web/web/blobs/" + digest("web")},
		{Ref: "tarball:assets", Kind: "tarball", Name: "assets", Digest: digest("assets"), Size: 6, URL: "artifact-store://web/assets/blobs/" + digest("assets")},
	}}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("Build\n got %+v\nwant %+v", got, want)
	}
	if !proto.Equal(w, before) {
		t.Error("Build changed the want")
	}
	if got := ArtifactURL("web", "noKind", digest("x")); got != "artifact-store://web/noKind/blobs/"+digest("x") {
		t.Errorf("ArtifactURL of a ref without a kind: %s", got)
	}
}
