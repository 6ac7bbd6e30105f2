package lint

import (
	"errors"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	"mesh.dev/internal/canonical"
	"mesh.dev/internal/names"
	"mesh.dev/internal/testutil"
	catalogv1 "mesh.dev/proto/mesh/catalog/v1"
	typev1 "mesh.dev/proto/mesh/type/v1"
)

func mustMarshal(t testing.TB, m proto.Message) []byte {
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// checkNamed fails unless err is a lint *Error naming a field: every
// refusal must say what is wrong and where.
func checkNamed(t *testing.T, err error) {
	t.Helper()
	var le *Error
	if !errors.As(err, &le) || le.Field == "" || le.Error() == "" {
		t.Fatalf("refusal %q (%T) names no field", err, err)
	}
}

func sortedUnique(list []string) bool {
	for i := 1; i < len(list); i++ {
		if list[i-1] >= list[i] {
			return false
		}
	}
	return true
}

// manifestSeeds are the good manifest and variants with one problem each,
// hostile templates among them.
func manifestSeeds() []*typev1.ModuleManifest {
	var out []*typev1.ModuleManifest
	add := func(mutate func(m *typev1.ModuleManifest)) {
		m := goodManifest()
		mutate(m)
		out = append(out, m)
	}
	add(func(*typev1.ModuleManifest) {})
	for _, h := range hostileTemplates {
		add(func(m *typev1.ModuleManifest) { m.Resources[1].Content = text(h.src) })
	}
	add(func(m *typev1.ModuleManifest) { m.Resources[1].Path = "/etc/{{ .Params.d }}/../shadow" })
	add(func(m *typev1.ModuleManifest) { m.Resources[1].Path = "/etc/{{ .Secrets.key }}" })
	add(func(m *typev1.ModuleManifest) { m.Resources[4].Target = "../../../etc/shadow" })
	add(func(m *typev1.ModuleManifest) { m.Resources[0].Type = typev1.ResourceType(42) })
	add(func(m *typev1.ModuleManifest) { m.Upgrade.Policy = typev1.UpgradePolicy(42) })
	add(func(m *typev1.ModuleManifest) { m.Resources[1].Mode = 0o170000 })
	add(func(m *typev1.ModuleManifest) { m.Resources[2].Path = m.Resources[0].Path })
	add(func(m *typev1.ModuleManifest) { m.DataPaths = []string{"/var/lib/b", "/var/lib/a"} })
	add(func(m *typev1.ModuleManifest) { m.Needs[0].Module = m.Module })
	add(func(m *typev1.ModuleManifest) { m.Resources[1].Content = text("{{ .Params.x ") })
	return out
}

// FuzzCheckModuleManifest feeds arbitrary bytes, and mutations of good and
// bad manifests, to CheckModuleManifest: it never panics, every refusal
// names its field, and an accepted manifest has valid names, parseable
// templates, clean literal paths and sorted data paths, and renders with
// bounded work.
func FuzzCheckModuleManifest(f *testing.F) {
	seeds := testutil.NewFuzzSeeds(f)
	for _, m := range manifestSeeds() {
		seeds.Add(mustMarshal(f, m))
	}
	seeds.Add([]byte{})
	seeds.Add([]byte("\x0a\x04sshd\x12\x011\x1a\x00"))
	data := map[string]any{"Node": "ace", "Facts": map[string]any{"ip": "10.0.0.1"},
		"Params": map[string]any{"port": 22.0, "users": []any{"a", "b"}, "list": []any{1.0}, "a": []any{"x"}, "d": "x", "banner": "hi"}}
	f.Fuzz(func(t *testing.T, b []byte) {
		m := &typev1.ModuleManifest{}
		if proto.Unmarshal(b, m) != nil {
			return
		}
		err := CheckModuleManifest(m)
		if err != nil {
			checkNamed(t, err)
			return
		}
		if names.CheckModule(m.GetModule()) != nil || canonical.Size(m) > MaxManifestSize {
			t.Fatalf("accepted module %q of %d bytes", m.GetModule(), canonical.Size(m))
		}
		for i, r := range m.GetResources() {
			if names.CheckResourceName(r.GetName()) != nil || r.GetMode() > MaxMode {
				t.Fatalf("resources[%d]: accepted name %q mode %o", i, r.GetName(), r.GetMode())
			}
			srcs := []string{r.GetPath(), r.GetTarget(), r.GetText()}
			for _, src := range srcs {
				if src == "" {
					continue
				}
				if _, err := ParseTemplate("x", src); err != nil {
					t.Fatalf("resources[%d]: accepted a template that does not parse: %v", i, err)
				}
				// Bounded whatever it is: this returns.
				_, _ = RenderTemplate("x", src, data, 1<<20)
			}
			if !strings.Contains(r.GetPath(), "{{") && (names.CheckPath("p", r.GetPath()) != nil || r.GetPath() == "/") {
				t.Fatalf("resources[%d]: accepted literal path %q", i, r.GetPath())
			}
		}
		if !sortedUnique(m.GetDataPaths()) {
			t.Fatalf("accepted unsorted data paths %q", m.GetDataPaths())
		}
		if m.GetUpgrade() == nil {
			t.Fatal("accepted no upgrade policy")
		}
	})
}

// entrySeeds are the good entry and variants with one problem each.
func entrySeeds(t testing.TB) []*catalogv1.Entry {
	var out []*catalogv1.Entry
	add := func(mutate func(e *catalogv1.Entry)) {
		e := entryOf(t, goodManifest())
		mutate(e)
		out = append(out, e)
	}
	add(func(*catalogv1.Entry) {})
	add(func(e *catalogv1.Entry) { e.Fingerprint = names.FingerprintPrefix + strings.Repeat("0", 64) })
	add(func(e *catalogv1.Entry) { e.ManifestDigest = names.Digest([]byte("other")) })
	add(func(e *catalogv1.Entry) { e.Verdict = catalogv1.Verdict(42) })
	add(func(e *catalogv1.Entry) { e.Verdict, e.Problems = catalogv1.Verdict_VERDICT_PASS, []string{"broken"} })
	add(func(e *catalogv1.Entry) { e.Path = "../outside"; refingerprint(e) })
	add(func(e *catalogv1.Entry) { e.Path = "/abs"; refingerprint(e) })
	add(func(e *catalogv1.Entry) { e.Module = "SSH" })
	add(func(e *catalogv1.Entry) { e.Artifacts = nil })
	add(func(e *catalogv1.Entry) { e.Manifest = append(e.Manifest, 0xf8, 0x3e, 0x01); refingerprint(e) })
	add(func(e *catalogv1.Entry) {
		remanifest(t, e, func(m *typev1.ModuleManifest) { m.Resources[1].Content = text(`{{ range 100000000000 }}{{ end }}`) })
	})
	return out
}

// FuzzCheckEntry feeds arbitrary bytes, and mutations of good and bad
// entries, to CheckEntry: it never panics, every refusal names its field,
// and an accepted entry has the fingerprint recomputed from its parts and
// a canonical manifest of its module whose digest it carries.
func FuzzCheckEntry(f *testing.F) {
	seeds := testutil.NewFuzzSeeds(f)
	for _, e := range entrySeeds(f) {
		seeds.Add(mustMarshal(f, e))
	}
	seeds.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		e := &catalogv1.Entry{}
		if proto.Unmarshal(b, e) != nil {
			return
		}
		m, err := CheckEntry(e)
		if err != nil {
			checkNamed(t, err)
			return
		}
		if want := names.ComputeFingerprint(e.GetModule(), e.GetRepository(), e.GetPath(), e.GetSourceDigest(), e.GetManifestDigest()); e.GetFingerprint() != want {
			t.Fatalf("accepted fingerprint %s, recomputed %s", e.GetFingerprint(), want)
		}
		again, err := canonical.Marshal(m)
		if err != nil || string(again) != string(e.GetManifest()) || names.Digest(again) != e.GetManifestDigest() || m.GetModule() != e.GetModule() {
			t.Fatalf("accepted a manifest that is not the canonical bytes of its module's manifest (%v)", err)
		}
		if CheckModuleManifest(m) != nil {
			t.Fatal("accepted an entry whose manifest does not check")
		}
	})
}

// compositionSeeds are good compositions (a module's and a node's own)
// and variants with one problem each.
func compositionSeeds() []*typev1.Composition {
	own := func() *typev1.Composition {
		return &typev1.Composition{Node: "ace", Module: "node", Resources: []*typev1.Resource{
			{Id: "wg:conf", Type: typev1.ResourceType_RESOURCE_TYPE_FILE, Path: "/etc/wg.conf", Content: &typev1.Resource_Inline{Inline: []byte("x")}},
		}, Adoption: []string{"/etc/hosts"}, ProvisionerAccount: "provisioner"}
	}
	out := []*typev1.Composition{good(), own()}
	add := func(base func() *typev1.Composition, mutate func(c *typev1.Composition)) {
		c := base()
		mutate(c)
		out = append(out, c)
	}
	add(good, func(c *typev1.Composition) { c.Resources[1].Path = "/etc/ssh/../shadow" })
	add(good, func(c *typev1.Composition) { c.Resources[1].Path = "etc/ssh/sshd_config" })
	add(good, func(c *typev1.Composition) { c.Resources[1].Path = "//etc/ssh" })
	add(good, func(c *typev1.Composition) { c.Resources[2].Target = "" })
	add(good, func(c *typev1.Composition) { c.Resources[2].Target = "a\x00b" })
	add(good, func(c *typev1.Composition) { c.Resources[1].Type = typev1.ResourceType(42) })
	add(good, func(c *typev1.Composition) { c.Resources[1].Path = c.Resources[0].Path })
	add(good, func(c *typev1.Composition) { c.Resources[0].Path = "/" })
	add(good, func(c *typev1.Composition) {
		c.Resources[1].Content = &typev1.Resource_Inline{Inline: make([]byte, MaxInlineContent+1)}
	})
	add(good, func(c *typev1.Composition) { c.Resources[1].Id = "other:config" })
	add(good, func(c *typev1.Composition) { c.Filled = []string{"/b", "/a"} })
	add(own, func(c *typev1.Composition) { c.Resources[0].Module = "wg" })
	add(own, func(c *typev1.Composition) { c.Fingerprint = fp })
	add(good, func(c *typev1.Composition) { c.Adoption = []string{"/etc/passwd"} })
	return out
}

// FuzzCheckComposition feeds arbitrary bytes, and mutations of good and
// bad compositions, to CheckComposition: it never panics, every refusal
// names its field, and an accepted composition only declares absolute
// clean paths other than /, sorted and unique, with valid types and
// modes, within the size limit.
func FuzzCheckComposition(f *testing.F) {
	seeds := testutil.NewFuzzSeeds(f)
	for _, c := range compositionSeeds() {
		seeds.Add(mustMarshal(f, c))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		c := &typev1.Composition{}
		if proto.Unmarshal(b, c) != nil {
			return
		}
		err := CheckComposition(c)
		if err != nil {
			checkNamed(t, err)
			return
		}
		if names.CheckNode(c.GetNode()) != nil || canonical.Size(c) > MaxCompositionSize || len(c.GetResources()) > MaxResources {
			t.Fatalf("accepted node %q, %d bytes, %d resources", c.GetNode(), canonical.Size(c), len(c.GetResources()))
		}
		var paths []string
		for i, r := range c.GetResources() {
			p := r.GetPath()
			if names.CheckPath("p", p) != nil || p == "/" || strings.Contains(p, "/../") || strings.HasSuffix(p, "/..") {
				t.Fatalf("resources[%d]: accepted path %q", i, p)
			}
			if r.GetMode() > MaxMode || r.GetType() < typev1.ResourceType_RESOURCE_TYPE_FILE || r.GetType() > typev1.ResourceType_RESOURCE_TYPE_SYMLINK {
				t.Fatalf("resources[%d]: accepted mode %o type %v", i, r.GetMode(), r.GetType())
			}
			if r.GetType() == typev1.ResourceType_RESOURCE_TYPE_SYMLINK && (r.GetTarget() == "" || strings.IndexByte(r.GetTarget(), 0) >= 0) {
				t.Fatalf("resources[%d]: accepted target %q", i, r.GetTarget())
			}
			if c.GetModule() != names.NodeModule && names.ModuleOfID(r.GetId()) != c.GetModule() {
				t.Fatalf("resources[%d]: accepted id %s in a composition of %s", i, r.GetId(), c.GetModule())
			}
			paths = append(paths, p)
		}
		for _, list := range [][]string{paths, c.GetFilled(), c.GetAdoption(), c.GetDataPaths()} {
			if !sortedUnique(list) {
				t.Fatalf("accepted unsorted or repeated paths %q", list)
			}
		}
	})
}

// FuzzCheckWants feeds arbitrary nodes and manifests' wants to CheckWants:
// it never panics, every refusal names its field, and accepted wants are
// sorted by module, unique, each naming a composition of that node with a
// valid digest and sorted parts.
func FuzzCheckWants(f *testing.F) {
	key := "ace.sshd." + names.FingerprintHex(fp)
	d := names.Digest([]byte("c"))
	ok := &typev1.Manifest{Node: "ace", Revision: 1, Wants: []*typev1.Want{
		{Module: "node", CompositionKey: "ace.node", CompositionDigest: d},
		{Module: "sshd", Fingerprint: fp, CompositionKey: key, CompositionDigest: d,
			Parts: []*typev1.Artifact{{Ref: "binary:a", Digest: d, Size: 3}, {Ref: "binary:b", Digest: d}}},
	}}
	seeds := testutil.NewFuzzSeeds(f)
	seeds.Add("ace", mustMarshal(f, ok))
	seeds.Add("bob", mustMarshal(f, ok))
	for _, mutate := range []func(m *typev1.Manifest){
		func(m *typev1.Manifest) { m.Wants[1].CompositionKey = "bob.sshd." + names.FingerprintHex(fp) },
		func(m *typev1.Manifest) { m.Wants[1].CompositionDigest = "sha256:zz" },
		func(m *typev1.Manifest) { m.Wants[1].Parts[1].Ref = "binary:a" },
		func(m *typev1.Manifest) { m.Wants[0].Fingerprint = fp },
		func(m *typev1.Manifest) { m.Wants[0], m.Wants[1] = m.Wants[1], m.Wants[0] },
		func(m *typev1.Manifest) { m.Wants[1].Parts[0].Size = -1 },
		func(m *typev1.Manifest) { m.Wants[1].Module = "../etc" },
	} {
		m := proto.Clone(ok).(*typev1.Manifest)
		mutate(m)
		seeds.Add("ace", mustMarshal(f, m))
	}
	f.Fuzz(func(t *testing.T, node string, b []byte) {
		m := &typev1.Manifest{}
		if proto.Unmarshal(b, m) != nil {
			return
		}
		err := CheckWants(node, m.GetWants())
		if err != nil {
			checkNamed(t, err)
			return
		}
		if len(m.GetWants()) > MaxWants {
			t.Fatalf("accepted %d wants", len(m.GetWants()))
		}
		for i, w := range m.GetWants() {
			k, err := names.ParseCompositionKey(w.GetCompositionKey())
			if err != nil || k.Node != node || k.Module != w.GetModule() {
				t.Fatalf("wants[%d]: accepted key %q for node %q (%v)", i, w.GetCompositionKey(), node, err)
			}
			if !names.ValidDigest(w.GetCompositionDigest()) {
				t.Fatalf("wants[%d]: accepted digest %q", i, w.GetCompositionDigest())
			}
			if i > 0 && m.GetWants()[i-1].GetModule() >= w.GetModule() {
				t.Fatalf("wants[%d]: accepted unsorted module %q", i, w.GetModule())
			}
			var refs []string
			for _, p := range w.GetParts() {
				if !names.ValidDigest(p.GetDigest()) || p.GetSize() < 0 {
					t.Fatalf("wants[%d]: accepted part %v", i, p)
				}
				refs = append(refs, p.GetRef())
			}
			if !sortedUnique(refs) {
				t.Fatalf("wants[%d]: accepted parts %q", i, refs)
			}
		}
	})
}
