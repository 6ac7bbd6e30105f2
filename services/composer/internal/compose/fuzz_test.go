package compose

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	"mesh.dev/internal/lint"
	"mesh.dev/internal/names"
	"mesh.dev/internal/testutil"
	composerv1 "mesh.dev/proto/mesh/composer/v1"
	typev1 "mesh.dev/proto/mesh/type/v1"
)

func mustMarshal(t testing.TB, m proto.Message) []byte {
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// fuzzSpecOf is the node spec FuzzDeclare renders: sshd placed with the
// fuzzed params, db placed without, idle placed with no fingerprint, and
// the own resources, filled and adoption of own.
func fuzzSpecOf(node string, params []byte, own *composerv1.NodeSpec) *composerv1.NodeSpec {
	var pm map[string]any
	if json.Unmarshal(params, &pm) != nil {
		pm = nil
	}
	ps, err := structpb.NewStruct(pm)
	if err != nil {
		ps = nil
	}
	facts, _ := structpb.NewStruct(map[string]any{"ip": "10.0.0.7", "disks": []any{"sda", "sdb"}})
	return &composerv1.NodeSpec{
		Node: node, Facts: facts, Labels: map[string]string{"role": "web"},
		Modules:   []*composerv1.PlacedModule{{Module: "sshd", Params: ps}, {Module: "db"}, {Module: "nofp"}},
		Resources: own.GetResources(), Filled: own.GetFilled(), Adoption: own.GetAdoption(), ProvisionerAccount: own.GetProvisionerAccount(),
	}
}

// fuzzModules returns the placed modules' manifests, sshd's carrying a
// resource of the fuzzed type, path, content and target.
func fuzzModules(typ uint8, path, content, target string) map[string]Module {
	m := sshdManifest()
	rt := &typev1.ResourceTemplate{Name: "fuzzed", Type: typev1.ResourceType(typ % 4), Path: path, Mode: 0o644}
	switch rt.GetType() {
	case typev1.ResourceType_RESOURCE_TYPE_FILE:
		rt.Content = text(content)
	case typev1.ResourceType_RESOURCE_TYPE_SYMLINK:
		rt.Target = target
	}
	m.Resources = append(m.Resources, rt)
	m.Upgrade = &typev1.Policy{Policy: typev1.UpgradePolicy_UPGRADE_POLICY_AUTO}
	db := dbManifest()
	db.Upgrade = m.Upgrade
	return map[string]Module{
		"sshd": {Fingerprint: fpSSHD, Manifest: m},
		"db":   {Fingerprint: fpDB, Manifest: db},
		"nofp": {Fingerprint: "not a fingerprint", Manifest: &typev1.ModuleManifest{Module: "nofp", Version: "1"}},
	}
}

// FuzzDeclare renders node declarations from arbitrary templates (as far
// as the catalog accepts them: Declare only sees manifests of entries),
// params and own resources: it never panics, its output is bounded, an
// error names node, module and resource (or both resources of a path
// declared twice), and a declaration it returns holds only valid resources
// on unique sorted paths.
func FuzzDeclare(f *testing.F) {
	seeds := testutil.NewFuzzSeeds(f)
	empty := mustMarshal(f, &composerv1.NodeSpec{})
	params := `{"port": 22, "d": "x", "users": ["ann", "bob"], "list": [1, 2]}`
	ownGood := mustMarshal(f, &composerv1.NodeSpec{Resources: []*typev1.Resource{
		{Id: "wg:conf", Module: "wg", Type: typev1.ResourceType_RESOURCE_TYPE_FILE, Path: "/etc/wg.conf", Content: &typev1.Resource_Inline{Inline: []byte("x")}},
		{Id: "net:hosts", Type: typev1.ResourceType_RESOURCE_TYPE_FILE, Path: "/etc/hosts", Content: &typev1.Resource_Inline{Inline: []byte("127.0.0.1 localhost\n")}},
	}, Filled: []string{"/etc/wg.key", "/etc/wg.conf"}, Adoption: []string{"/etc/hosts"}, ProvisionerAccount: "prov"})
	ownClash := mustMarshal(f, &composerv1.NodeSpec{Resources: []*typev1.Resource{
		{Id: "net:conf", Type: typev1.ResourceType_RESOURCE_TYPE_FILE, Path: "/etc/ssh/sshd_config", Content: &typev1.Resource_Inline{Inline: []byte("x")}},
	}})
	ownBuilt := mustMarshal(f, &composerv1.NodeSpec{Resources: []*typev1.Resource{
		{Id: "sshd:extra", Module: "sshd", Type: typev1.ResourceType_RESOURCE_TYPE_FILE, Path: "/etc/extra", Content: &typev1.Resource_Inline{Inline: []byte("x")}},
	}})
	for _, s := range []struct {
		node                  string
		typ                   uint8
		path, content, target string
		params                string
		own                   []byte
	}{
		{"ace", 1, "/etc/ssh/{{ .Node }}.conf", "Port {{ .Params.port }}\n{{ range .Params.users }}{{ . }}\n{{ end }}", "", params, ownGood},
		{"ace", 1, "/etc/ssh/{{ .Params.d }}", "{{ .Params.missing }}", "", params, empty},
		{"ace", 1, "/etc/ssh/{{ .Params.d }}", "x", "", `{"d": "../../etc/shadow"}`, empty},
		{"ace", 1, "/etc/ssh/{{ .Params.d }}", "x", "", `{"d": ""}`, empty},
		{"ace", 3, "/etc/ssh/link", "", "{{ .Params.d }}", `{"d": "/etc/shadow"}`, empty},
		{"ace", 3, "/etc/ssh/link", "", "{{ .Params.d }}", `{"d": "a\u0000b"}`, empty},
		{"ace", 2, "/etc/ssh", "", "", params, empty},
		{"ace", 1, "/etc/ssh/x", `{{ printf "%0999999d" 1 }}{{ printf "%0999999d" 1 }}`, "", params, empty},
		{"ace", 1, "/etc/ssh/x", `{{ range .Params.list }}{{ range $.Params.list }}{{ . }}{{ end }}{{ end }}`, "", params, empty},
		{"ace", 1, "/etc/ssh/x", "{{ range 1000000000000 }}{{ end }}", "", params, empty},
		{"ace", 1, "/etc/ssh/x", `{{ $x := "a" }}{{ range .Params.list }}{{ $x = print $x $x }}{{ end }}`, "", params, empty},
		{"ace", 1, "/etc/ssh/x", "x", "", params, ownClash},
		{"ace", 1, "/etc/ssh/x", "x", "", params, ownBuilt},
		{"BAD", 1, "/etc/ssh/x", "{{ .Node }}", "", "{}", empty},
		{"ace", 0, "/etc/ssh/x", "x", "", "not json", empty},
	} {
		seeds.Add(s.node, s.typ, s.path, s.content, s.target, []byte(s.params), s.own)
	}
	f.Fuzz(func(t *testing.T, node string, typ uint8, path, content, target string, params, ownBytes []byte) {
		own := &composerv1.NodeSpec{}
		if proto.Unmarshal(ownBytes, own) != nil {
			return
		}
		modules := fuzzModules(typ, path, content, target)
		if lint.CheckModuleManifest(modules["sshd"].Manifest) != nil {
			return // the catalog refuses it: no entry carries it
		}
		spec := fuzzSpecOf(node, params, own)
		d, err := Declare(spec, modules)
		if err != nil {
			var re *RenderError
			switch {
			case errors.As(err, &re):
				ownRes := slices.ContainsFunc(spec.GetResources(), func(r *typev1.Resource) bool { return r.GetId() == re.Resource })
				// An own resource whose id is what is wrong is named by its
				// index instead (PutNode refuses such a spec before it is
				// stored).
				unnamed := re.Resource == "" && ownRes && strings.Contains(err.Error(), "resources[")
				if re.Node != node || (re.Resource == "" && !unnamed) || (re.Module == "" && !ownRes) {
					t.Fatalf("render error %q names node %q, module %q, resource %q", err, re.Node, re.Module, re.Resource)
				}
				if !strings.Contains(err.Error(), re.Resource) || !strings.Contains(err.Error(), "node "+node) {
					t.Fatalf("render error %q does not say node and resource", err)
				}
			case errors.Is(err, ErrPathConflict):
				if !strings.Contains(err.Error(), "2 resources declare") || !strings.Contains(err.Error(), "node "+node) {
					t.Fatalf("path conflict %q does not name the node and both ids", err)
				}
			default:
				t.Fatalf("error %q (%T) is neither a render error nor a path conflict", err, err)
			}
			return
		}
		if d.GetNode() != node || !slices.IsSorted(d.GetRuns()) {
			t.Fatalf("declaration of %q runs %q", d.GetNode(), d.GetRuns())
		}
		for m, fp := range d.GetFingerprints() {
			if !names.HasFingerprint(fp) || modules[m].Fingerprint != fp {
				t.Fatalf("declaration names fingerprint %q of %s", fp, m)
			}
		}
		for i, r := range d.GetResources() {
			if in, ok := r.GetContent().(*typev1.Resource_Inline); ok && len(in.Inline) > MaxRenderedContent {
				t.Fatalf("%s renders %d bytes, over %d", r.GetId(), len(in.Inline), MaxRenderedContent)
			}
			if err := lint.CheckResource(fmt.Sprintf("resources[%d]", i), inlineChecked(r)); err != nil {
				t.Fatalf("declared an invalid resource: %v", err)
			}
			if m := r.GetModule(); m != "" && names.ModuleOfID(r.GetId()) != m {
				t.Fatalf("resource %s carries module %q", r.GetId(), m)
			}
			if i > 0 && d.GetResources()[i-1].GetPath() >= r.GetPath() {
				t.Fatalf("paths %q, %q are not sorted and unique", d.GetResources()[i-1].GetPath(), r.GetPath())
			}
		}
		if !slices.IsSorted(d.GetFilled()) || !slices.IsSorted(d.GetAdoption()) {
			t.Fatalf("filled %q adoption %q", d.GetFilled(), d.GetAdoption())
		}
	})
}

// splitManifests returns a manifest for each module with a fingerprint; a
// module whose name has an even length declares data paths.
func splitManifests(d *composerv1.Declaration) map[string]*typev1.ModuleManifest {
	out := map[string]*typev1.ModuleManifest{}
	for m := range d.GetFingerprints() {
		mm := &typev1.ModuleManifest{Module: m}
		if len(m)%2 == 0 {
			mm.DataPaths = []string{"/var/lib/" + m + "/b", "/var/lib/" + m + "/a"}
		}
		out[m] = mm
	}
	return out
}

// FuzzSplitDeclaration splits arbitrary declarations (DESIGN.md §5.1) and
// checks the split's invariants: every resource lands in exactly one
// composition; the node's own is always produced, carries adoption and
// provisioner account and has no data flag; filled lists are sorted and
// unique and each filled path lands once; resources of modules without a
// fingerprint move to the node's own with their module cleared and the
// module listed in moved, sorted, once; a module composition holds only
// its module's resources at its registered fingerprint, with the data
// flag its manifest says; every run module with a fingerprint has one.
func FuzzSplitDeclaration(f *testing.F) {
	seeds := testutil.NewFuzzSeeds(f)
	for _, d := range splitFuzzSeeds(f) {
		seeds.Add(mustMarshal(f, d))
	}
	seeds.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		d := &composerv1.Declaration{}
		if proto.Unmarshal(b, d) != nil {
			return
		}
		in := SplitInput{Declaration: d, Fingerprints: d.GetFingerprints(), Manifests: splitManifests(d), Runs: d.GetRuns()}
		s := SplitDeclaration(in)
		checkSplit(t, in, s)
	})
}

func checkSplit(t *testing.T, in SplitInput, s Split) {
	d := in.Declaration
	node := d.GetNode()
	own, ok := s.Compositions[names.NodeKey(node)]
	if !ok {
		t.Fatalf("no %s among %d compositions", names.NodeKey(node), len(s.Compositions))
	}
	if own.GetModule() != names.NodeModule || own.GetData() || own.GetFingerprint() != "" || own.GetProvisionerAccount() != d.GetProvisionerAccount() {
		t.Fatalf("the node's own is %v", own)
	}
	if want := sortedUnique(d.GetAdoption()); !slices.Equal(own.GetAdoption(), want) && !(len(want) == 0 && len(own.GetAdoption()) == 0) {
		t.Fatalf("own adoption %q, want %q", own.GetAdoption(), want)
	}
	hasFP := func(m string) bool { return names.HasFingerprint(in.Fingerprints[m]) }
	// Every resource lands once: count (id, path, type) on both sides.
	type res struct{ id, path string }
	count := map[res]int{}
	for _, r := range d.GetResources() {
		count[res{r.GetId(), r.GetPath()}]++
	}
	moved := map[string]bool{}
	filledSeen := map[string]int{}
	for key, c := range s.Compositions {
		if c.GetNode() != node {
			t.Fatalf("composition %s is of node %q", key, c.GetNode())
		}
		if !slices.IsSorted(c.GetFilled()) || len(slices.Compact(slices.Clone(c.GetFilled()))) != len(c.GetFilled()) {
			t.Fatalf("%s: filled %q not sorted and unique", key, c.GetFilled())
		}
		for _, p := range c.GetFilled() {
			filledSeen[p]++
		}
		if !sort.SliceIsSorted(c.GetResources(), func(i, j int) bool { return c.GetResources()[i].GetPath() < c.GetResources()[j].GetPath() }) {
			t.Fatalf("%s: resources not sorted by path", key)
		}
		isOwn := key == names.NodeKey(node)
		if !isOwn {
			m := c.GetModule()
			if !hasFP(m) || c.GetFingerprint() != in.Fingerprints[m] || key != (names.Key{Node: node, Module: m, Fingerprint: c.GetFingerprint()}).String() {
				t.Fatalf("composition %s of %s at %q (registered %q)", key, m, c.GetFingerprint(), in.Fingerprints[m])
			}
			if wantData := len(in.Manifests[m].GetDataPaths()) > 0; c.GetData() != wantData || !slices.IsSorted(c.GetDataPaths()) {
				t.Fatalf("%s: data %v paths %q", key, c.GetData(), c.GetDataPaths())
			}
			if len(c.GetAdoption()) > 0 || c.GetProvisionerAccount() != "" {
				t.Fatalf("%s carries the node's own adoption or account", key)
			}
		}
		for _, r := range c.GetResources() {
			k := res{r.GetId(), r.GetPath()}
			count[k]--
			if count[k] < 0 {
				t.Fatalf("resource %s on %s lands more than once", r.GetId(), r.GetPath())
			}
			switch {
			case !isOwn && r.GetModule() != c.GetModule():
				t.Fatalf("%s holds %s of module %q", key, r.GetId(), r.GetModule())
			case isOwn && r.GetModule() != "":
				t.Fatalf("the node's own holds %s with module %q", r.GetId(), r.GetModule())
			}
		}
	}
	for k, n := range count {
		if n != 0 {
			t.Fatalf("resource %s on %s landed in no composition", k.id, k.path)
		}
	}
	for _, r := range d.GetResources() {
		if m := r.GetModule(); m != "" && !hasFP(m) {
			moved[m] = true
		}
	}
	if want := slices.Sorted(func(yield func(string) bool) {
		for m := range moved {
			if !yield(m) {
				return
			}
		}
	}); !slices.Equal(s.Moved, want) && !(len(want) == 0 && len(s.Moved) == 0) {
		t.Fatalf("moved %q, want %q", s.Moved, want)
	}
	for _, p := range d.GetFilled() {
		if filledSeen[p] != 1 {
			t.Fatalf("filled path %s lands in %d compositions", p, filledSeen[p])
		}
	}
	for _, m := range in.Runs {
		if hasFP(m) {
			if _, ok := s.Compositions[names.Key{Node: node, Module: m, Fingerprint: in.Fingerprints[m]}.String()]; !ok {
				t.Fatalf("run module %s with a fingerprint has no composition", m)
			}
		}
	}
}

func splitFuzzSeeds(t testing.TB) []*composerv1.Declaration {
	facts, _ := structpb.NewStruct(map[string]any{"ip": "10.0.0.7"})
	params, _ := structpb.NewStruct(map[string]any{"port": 2222})
	s := &composerv1.NodeSpec{
		Node: "ace", Facts: facts,
		Modules: []*composerv1.PlacedModule{{Module: "sshd", Params: params}, {Module: "db"}, {Module: "idle"}},
		Resources: []*typev1.Resource{
			{Id: "wg:conf", Module: "wg", Type: file, Path: "/etc/wg.conf", Content: &typev1.Resource_Inline{Inline: []byte("x")}},
			{Id: "net:hosts", Type: file, Path: "/etc/hosts", Content: &typev1.Resource_Inline{Inline: []byte("x")}},
		},
		Filled: []string{"/etc/wg.conf", "/etc/ssh/sshd_config", "/etc/none", "/etc/none"}, Adoption: []string{"/etc/hosts"}, ProvisionerAccount: "prov",
	}
	d, err := Declare(s, modulesOf())
	if err != nil {
		t.Fatal(err)
	}
	out := []*composerv1.Declaration{d}
	// sshd's fingerprint gone: its resources move to the node's own.
	movedSSHD := proto.Clone(d).(*composerv1.Declaration)
	delete(movedSSHD.Fingerprints, "sshd")
	out = append(out, movedSSHD)
	// Not a fingerprint counts as none.
	bogus := proto.Clone(d).(*composerv1.Declaration)
	bogus.Fingerprints["db"] = "fp1:XYZ"
	out = append(out, bogus)
	// Two resources on one path, unsorted filled, a module named node.
	odd := proto.Clone(d).(*composerv1.Declaration)
	odd.Resources = append(odd.Resources, proto.Clone(odd.Resources[0]).(*typev1.Resource))
	odd.Resources = append(odd.Resources, &typev1.Resource{Id: "node:x", Module: "node", Path: "/x"})
	odd.Filled = []string{"/z", "/a", "/z"}
	out = append(out, odd)
	out = append(out, &composerv1.Declaration{Node: "empty"})
	return out
}
