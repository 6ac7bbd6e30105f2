package compose

import (
	"slices"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	"mesh.dev/internal/lint"
	"mesh.dev/internal/names"
	composerv1 "mesh.dev/proto/mesh/composer/v1"
	typev1 "mesh.dev/proto/mesh/type/v1"
)

var (
	fpSSHD = names.FingerprintPrefix + strings.Repeat("aa", 32)
	fpDB   = names.FingerprintPrefix + strings.Repeat("bb", 32)
	fpIdle = names.FingerprintPrefix + strings.Repeat("cc", 32)
)

const (
	file = typev1.ResourceType_RESOURCE_TYPE_FILE
	dir  = typev1.ResourceType_RESOURCE_TYPE_DIRECTORY
)

func text(s string) *typev1.ResourceTemplate_Text { return &typev1.ResourceTemplate_Text{Text: s} }

func sshdManifest() *typev1.ModuleManifest {
	return &typev1.ModuleManifest{Module: "sshd", Version: "1.0", Resources: []*typev1.ResourceTemplate{
		{Name: "dir", Type: dir, Path: "/etc/ssh", Mode: 0o755},
		{Name: "config", Type: file, Path: "/etc/ssh/sshd_config", Mode: 0o600, Content: text("ListenAddress {{ .Facts.ip }}\nPort {{ .Params.port }}\n# {{ .Node }}\n")},
	}}
}

func dbManifest() *typev1.ModuleManifest {
	return &typev1.ModuleManifest{Module: "db", Version: "2.1", DataPaths: []string{"/var/lib/db"}, Resources: []*typev1.ResourceTemplate{
		{Name: "conf", Type: file, Path: "/etc/db.conf", Content: text("data=/var/lib/db\n")},
		{Name: "data", Type: dir, Path: "/var/lib/db", Mode: 0o700},
	}}
}

func spec(t *testing.T) *composerv1.NodeSpec {
	t.Helper()
	facts, _ := structpb.NewStruct(map[string]any{"ip": "10.0.0.7"})
	params, _ := structpb.NewStruct(map[string]any{"port": 2222})
	return &composerv1.NodeSpec{
		Node: "ace", Facts: facts,
		Modules: []*composerv1.PlacedModule{{Module: "sshd", Params: params}, {Module: "db"}, {Module: "idle"}},
	}
}

func modulesOf() map[string]Module {
	return map[string]Module{
		"sshd": {Fingerprint: fpSSHD, Manifest: sshdManifest()},
		"db":   {Fingerprint: fpDB, Manifest: dbManifest()},
		"idle": {Fingerprint: fpIdle, Manifest: &typev1.ModuleManifest{Module: "idle", Version: "1"}},
	}
}

func TestDeclare(t *testing.T) {
	t.Parallel()
	d, err := Declare(spec(t), modulesOf())
	if err != nil {
		t.Fatal(err)
	}
	var cfg *typev1.Resource
	for _, r := range d.GetResources() {
		if r.GetId() == "sshd:config" {
			cfg = r
		}
	}
	if got := string(cfg.GetInline()); got != "ListenAddress 10.0.0.7\nPort 2222\n# ace\n" {
		t.Errorf("rendered %q", got)
	}
	if cfg.GetModule() != "sshd" || !slices.Equal(d.GetRuns(), []string{"db", "idle", "sshd"}) || d.GetFingerprints()["sshd"] != fpSSHD {
		t.Errorf("declaration %v", d)
	}
	for i := 1; i < len(d.GetResources()); i++ {
		if d.GetResources()[i-1].GetPath() > d.GetResources()[i].GetPath() {
			t.Error("resources are not sorted by path")
		}
	}
}

// TestDeclareLargeOwnContent checks that a node's own file over the inline
// limit is declared: writing moves it to the object store (DESIGN.md §5.2
// step 1), as it does for a module's.
func TestDeclareLargeOwnContent(t *testing.T) {
	t.Parallel()
	s := spec(t)
	s.Resources = []*typev1.Resource{{Id: "local:big", Type: file, Path: "/etc/big", Content: &typev1.Resource_Inline{Inline: make([]byte, lint.MaxInlineContent+1)}}}
	d, err := Declare(s, modulesOf())
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range d.GetResources() {
		if r.GetId() == "local:big" && len(r.GetInline()) != lint.MaxInlineContent+1 {
			t.Errorf("content %d bytes", len(r.GetInline()))
		}
	}
}

func TestDeclareErrors(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name   string
		mutate func(s *composerv1.NodeSpec, m map[string]Module)
		want   []string
	}{
		{"missing key names node, module and resource", func(s *composerv1.NodeSpec, m map[string]Module) {
			s.Modules[0].Params = nil
		}, []string{"node ace", "module sshd", "resource sshd:config", "port"}},
		{"bad template", func(s *composerv1.NodeSpec, m map[string]Module) {
			m["sshd"].Manifest.Resources[1].Content = text("{{ .Params.port ")
		}, []string{"resource sshd:config"}},
		{"rendered path not clean", func(s *composerv1.NodeSpec, m map[string]Module) {
			m["sshd"].Manifest.Resources[1].Path = "/etc/ssh/{{ .Node }}/../../shadow"
		}, []string{"resource sshd:config", "not clean"}},
		{"template reaching for a function", func(s *composerv1.NodeSpec, m map[string]Module) {
			m["sshd"].Manifest.Resources[1].Content = text(`{{ env "HOME" }}`)
		}, []string{"resource sshd:config", `function "env" not defined`}},
		{"two resources on one path", func(s *composerv1.NodeSpec, m map[string]Module) {
			s.Resources = []*typev1.Resource{{Id: "local:cfg", Type: file, Path: "/etc/db.conf", Content: &typev1.Resource_Inline{}}}
		}, []string{"2 resources declare /etc/db.conf", "db:conf", "local:cfg"}},
		{"own resource naming a built module", func(s *composerv1.NodeSpec, m map[string]Module) {
			s.Resources = []*typev1.Resource{{Id: "sshd:extra", Module: "sshd", Type: file, Path: "/etc/extra", Content: &typev1.Resource_Inline{}}}
		}, []string{"sshd:extra", "placed with a build"}},
		{"huge render", func(s *composerv1.NodeSpec, m map[string]Module) {
			big, _ := structpb.NewList(make([]any, 5000))
			s.Modules[0].Params.Fields["rows"] = structpb.NewListValue(big)
			m["sshd"].Manifest.Resources[1].Content = text(`{{ range .Params.rows }}{{ range $.Params.rows }}xxxxxxxx{{ end }}{{ end }}`)
		}, []string{"resource sshd:config", "template does too much work"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			s, m := spec(t), modulesOf()
			c.mutate(s, m)
			_, err := Declare(s, m)
			if err == nil {
				t.Fatal("Declare succeeded")
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not name %q", err, w)
				}
			}
		})
	}
}

func res(id, module, path string) *typev1.Resource {
	return &typev1.Resource{Id: id, Module: module, Type: file, Path: path, Content: &typev1.Resource_Inline{Inline: []byte(id)}}
}

func keyOf(module, fp string) string {
	return names.Key{Node: "ace", Module: module, Fingerprint: fp}.String()
}

// TestSplitRules has one case per rule of DESIGN.md §5.1.
func TestSplitRules(t *testing.T) {
	t.Parallel()
	own := names.NodeKey("ace")
	base := func() SplitInput {
		return SplitInput{
			Declaration:  &composerv1.Declaration{Node: "ace"},
			Fingerprints: map[string]string{"sshd": fpSSHD, "db": fpDB, "idle": fpIdle, "broken": "fp1:nothex"},
			Manifests:    map[string]*typev1.ModuleManifest{"sshd": sshdManifest(), "db": dbManifest(), "idle": {Module: "idle"}},
		}
	}
	t.Run("1 a module with a fingerprint gets its composition", func(t *testing.T) {
		in := base()
		in.Declaration.Resources = []*typev1.Resource{res("sshd:config", "sshd", "/etc/ssh/sshd_config")}
		out := SplitDeclaration(in)
		c := out.Compositions[keyOf("sshd", fpSSHD)]
		if c == nil || len(c.GetResources()) != 1 || c.GetFingerprint() != fpSSHD || c.GetResources()[0].GetModule() != "sshd" {
			t.Fatalf("compositions %v", out.Compositions)
		}
		if len(out.Compositions[own].GetResources()) != 0 {
			t.Error("the resource also landed in the node's own")
		}
	})
	t.Run("2 a resource with no module goes to the node's own", func(t *testing.T) {
		in := base()
		in.Declaration.Resources = []*typev1.Resource{res("local:hosts", "", "/etc/hosts")}
		out := SplitDeclaration(in)
		if r := out.Compositions[own].GetResources(); len(r) != 1 || r[0].GetId() != "local:hosts" || len(out.Moved) != 0 {
			t.Fatalf("own %v moved %v", out.Compositions[own], out.Moved)
		}
	})
	t.Run("3 a module with no fingerprint moves into the node's own, module cleared, listed once", func(t *testing.T) {
		in := base()
		in.Declaration.Resources = []*typev1.Resource{
			res("wireguard:conf", "wireguard", "/etc/wireguard/wg0.conf"),
			res("wireguard:key", "wireguard", "/etc/wireguard/key"),
			res("broken:x", "broken", "/etc/broken"),
		}
		out := SplitDeclaration(in)
		r := out.Compositions[own].GetResources()
		if len(r) != 3 {
			t.Fatalf("own holds %v", r)
		}
		for _, x := range r {
			if x.GetModule() != "" || names.ModuleOfID(x.GetId()) == "" {
				t.Errorf("moved resource %v: module not cleared or id lost its module", x)
			}
		}
		if !slices.Equal(out.Moved, []string{"broken", "wireguard"}) {
			t.Errorf("moved %v", out.Moved)
		}
		if in.Declaration.Resources[0].GetModule() != "wireguard" {
			t.Error("the split changed its input")
		}
	})
	t.Run("4 filled paths go where their file is, sorted", func(t *testing.T) {
		in := base()
		in.Declaration.Resources = []*typev1.Resource{
			res("sshd:key", "sshd", "/etc/ssh/host_key"),
			res("wireguard:key", "wireguard", "/etc/wireguard/key"),
			{Id: "sshd:dir", Module: "sshd", Type: dir, Path: "/etc/ssh"},
		}
		in.Declaration.Filled = []string{"/etc/zz-unknown", "/etc/wireguard/key", "/etc/ssh/host_key", "/etc/ssh", "/etc/aa-unknown"}
		out := SplitDeclaration(in)
		if got := out.Compositions[keyOf("sshd", fpSSHD)].GetFilled(); !slices.Equal(got, []string{"/etc/ssh/host_key"}) {
			t.Errorf("sshd filled %v", got)
		}
		// The moved module's file, the directory (not a FILE) and paths no
		// FILE declares all land in the node's own list, sorted.
		want := []string{"/etc/aa-unknown", "/etc/ssh", "/etc/wireguard/key", "/etc/zz-unknown"}
		if got := out.Compositions[own].GetFilled(); !slices.Equal(got, want) {
			t.Errorf("own filled %v, want %v", got, want)
		}
	})
	t.Run("5 the node's own is always produced with adoption and provisioner", func(t *testing.T) {
		in := base()
		in.Declaration.Adoption = []string{"/etc/resolv.conf"}
		in.Declaration.ProvisionerAccount = "prov"
		out := SplitDeclaration(in)
		c, ok := out.Compositions[own]
		if !ok || c.GetModule() != "node" || c.GetFingerprint() != "" || c.GetData() ||
			!slices.Equal(c.GetAdoption(), []string{"/etc/resolv.conf"}) || c.GetProvisionerAccount() != "prov" {
			t.Fatalf("own %v", c)
		}
		empty := SplitDeclaration(base())
		if _, ok := empty.Compositions[own]; !ok || len(empty.Compositions) != 1 {
			t.Fatalf("an empty declaration gave %v", empty.Compositions)
		}
	})
	t.Run("6 a run module with a fingerprint and no resources gets an empty composition", func(t *testing.T) {
		in := base()
		in.Runs = []string{"idle", "unregistered"}
		out := SplitDeclaration(in)
		c, ok := out.Compositions[keyOf("idle", fpIdle)]
		if !ok || len(c.GetResources()) != 0 || c.GetFingerprint() != fpIdle {
			t.Fatalf("idle %v", c)
		}
		if len(out.Compositions) != 2 {
			t.Errorf("a run module without a fingerprint got a composition: %v", out.Compositions)
		}
	})
	t.Run("7 the data flag follows the manifest's data paths", func(t *testing.T) {
		in := base()
		in.Runs = []string{"db", "sshd"}
		out := SplitDeclaration(in)
		db, sshd := out.Compositions[keyOf("db", fpDB)], out.Compositions[keyOf("sshd", fpSSHD)]
		if !db.GetData() || !slices.Equal(db.GetDataPaths(), []string{"/var/lib/db"}) || sshd.GetData() {
			t.Fatalf("db %v sshd %v", db, sshd)
		}
	})
}

func TestJudge(t *testing.T) {
	t.Parallel()
	comp := func(module string, rs ...*typev1.Resource) *typev1.Composition {
		return &typev1.Composition{Node: "ace", Module: module, Fingerprint: fpDB, Resources: rs, DataPaths: []string{"/var/lib/db"}, Data: true}
	}
	a := res("db:a", "db", "/etc/a")
	b := res("db:b", "db", "/etc/b")
	b2 := proto.Clone(b).(*typev1.Resource)
	b2.Content = &typev1.Resource_Inline{Inline: []byte("changed")}
	data := res("db:data", "db", "/var/lib/db/init")
	users := res("db:users", "db", "/etc/users")
	users.UserList = true
	users2 := proto.Clone(users).(*typev1.Resource)
	users2.Content = &typev1.Resource_Inline{Inline: []byte("alice\nbob\n")}
	moved := proto.Clone(a).(*typev1.Resource)
	moved.Module = ""

	cases := []struct {
		name     string
		next     *typev1.Composition
		applied  Applied
		want     composerv1.Judgement
		userOnly bool
		words    string
		against  string
	}{
		{"NEW", comp("db", a), Applied{}, composerv1.Judgement_JUDGEMENT_NEW, false, "new: 1 path", ""},
		{"SAME", comp("db", a, b), Applied{Module: comp("db", b, a), ModuleDigest: "D1"}, composerv1.Judgement_JUDGEMENT_SAME, false, "same", "D1"},
		{"ADDS", comp("db", a, b), Applied{Module: comp("db", a), ModuleDigest: "D1"}, composerv1.Judgement_JUDGEMENT_ADDS, false, "adds /etc/b", "D1"},
		{"REMOVES", comp("db", a), Applied{Module: comp("db", a, b), ModuleDigest: "D1"}, composerv1.Judgement_JUDGEMENT_REMOVES, false, "removes /etc/b", "D1"},
		{"CHANGES", comp("db", a, b2), Applied{Module: comp("db", a, b), ModuleDigest: "D1"}, composerv1.Judgement_JUDGEMENT_CHANGES, false, "changes /etc/b (content)", "D1"},
		{"adds and removes is CHANGES", comp("db", b), Applied{Module: comp("db", a), ModuleDigest: "D1"}, composerv1.Judgement_JUDGEMENT_CHANGES, false, "adds /etc/b; removes /etc/a", "D1"},
		{"DATA", comp("db", a, data), Applied{Module: comp("db", a), ModuleDigest: "D1"}, composerv1.Judgement_JUDGEMENT_DATA, false, "touches data path /var/lib/db", "D1"},
		{"user list only", comp("db", a, users2), Applied{Module: comp("db", a, users), ModuleDigest: "D1"}, composerv1.Judgement_JUDGEMENT_CHANGES, true, "changes /etc/users (content)", "D1"},
		{"a file becoming a user list is not user list only", comp("db", a, users2), Applied{Module: comp("db", a, res("db:users", "db", "/etc/users")), ModuleDigest: "D1"},
			composerv1.Judgement_JUDGEMENT_CHANGES, false, "changes /etc/users (", "D1"},
		{"data path added, resources the same", withData(comp("db", a), "/var/lib/db", "/var/lib/db2"), Applied{Module: comp("db", a), ModuleDigest: "D1"},
			composerv1.Judgement_JUDGEMENT_DATA, false, "data paths: adds /var/lib/db2", "D1"},
		{"data path dropped, resources the same", withData(comp("db", a, data)), Applied{Module: comp("db", a, data), ModuleDigest: "D1"},
			composerv1.Judgement_JUDGEMENT_DATA, false, "data paths: removes /var/lib/db", "D1"},
		{"a user list change beside a data path change", withData(comp("db", a, users2), "/srv/db"), Applied{Module: comp("db", a, users), ModuleDigest: "D1"},
			composerv1.Judgement_JUDGEMENT_DATA, false, "data paths: adds /srv/db, removes /var/lib/db", "D1"},
		{"removes what was under a data path no longer declared", withData(comp("db", a)), Applied{Module: comp("db", a, data), ModuleDigest: "D1"},
			composerv1.Judgement_JUDGEMENT_DATA, false, "touches data path /var/lib/db", "D1"},
		{"against the node's own when leaving it", comp("db", a), Applied{Own: &typev1.Composition{Module: "node", Resources: []*typev1.Resource{moved, res("other:x", "", "/etc/x")}}, OwnDigest: "OWN"},
			composerv1.Judgement_JUDGEMENT_SAME, false, "same", "OWN"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			got := Judge(c.next, c.applied)
			if got.Judgement != c.want || got.UserListOnly != c.userOnly || !strings.Contains(got.Words, c.words) || got.Against != c.against {
				t.Fatalf("Judge = %+v, want %v userListOnly=%v words~%q against %q", got, c.want, c.userOnly, c.words, c.against)
			}
		})
	}
}

// withData sets a composition's data paths.
func withData(c *typev1.Composition, paths ...string) *typev1.Composition {
	c.DataPaths, c.Data = paths, len(paths) > 0
	return c
}

func TestDecide(t *testing.T) {
	t.Parallel()
	j := func(x composerv1.Judgement) Judged { return Judged{Judgement: x} }
	pol := func(p typev1.UpgradePolicy) Policy {
		return Policy{Policy: p, From: PolicyFromManifest, Why: "ops review"}
	}
	auto, manual, pinned := pol(typev1.UpgradePolicy_UPGRADE_POLICY_AUTO), pol(typev1.UpgradePolicy_UPGRADE_POLICY_MANUAL), pol(typev1.UpgradePolicy_UPGRADE_POLICY_PINNED)
	cases := []struct {
		name string
		m    Move
		move bool
		why  string
	}{
		{"AUTO moves CHANGES", Move{Judged: j(composerv1.Judgement_JUDGEMENT_CHANGES), Policy: auto}, true, ""},
		{"AUTO holds DATA", Move{Judged: j(composerv1.Judgement_JUDGEMENT_DATA), Policy: auto}, false, "touching data"},
		{"AUTO moves approved DATA", Move{Judged: j(composerv1.Judgement_JUDGEMENT_DATA), Policy: auto, Approved: true}, true, ""},
		{"MANUAL holds CHANGES", Move{Judged: j(composerv1.Judgement_JUDGEMENT_CHANGES), Policy: manual}, false, "policy MANUAL (from manifest) holds CHANGES until approved: ops review"},
		{"MANUAL moves SAME", Move{Judged: j(composerv1.Judgement_JUDGEMENT_SAME), Policy: manual}, true, ""},
		{"MANUAL moves a user list change", Move{Judged: Judged{Judgement: composerv1.Judgement_JUDGEMENT_CHANGES, UserListOnly: true}, Policy: manual}, true, ""},
		{"MANUAL moves approved", Move{Judged: j(composerv1.Judgement_JUDGEMENT_CHANGES), Policy: manual, Approved: true}, true, ""},
		{"PINNED holds even approved", Move{Judged: j(composerv1.Judgement_JUDGEMENT_CHANGES), Policy: pinned, Approved: true}, false, "PINNED"},
		// SAME resources at another fingerprint may run other artifacts.
		{"PINNED holds SAME", Move{Judged: j(composerv1.Judgement_JUDGEMENT_SAME), Policy: pinned}, false, "holds SAME"},
		{"PINNED holds an approved SAME", Move{Judged: j(composerv1.Judgement_JUDGEMENT_SAME), Policy: pinned, Approved: true}, false, "holds SAME"},
		{"AUTO moves NEW", Move{Judged: j(composerv1.Judgement_JUDGEMENT_NEW), Policy: auto, Placed: true}, true, ""},
		{"MANUAL holds DATA", Move{Judged: j(composerv1.Judgement_JUDGEMENT_DATA), Policy: manual}, false, "holds DATA until approved"},
		{"PINNED first placement needs approval", Move{Judged: j(composerv1.Judgement_JUDGEMENT_NEW), Policy: pinned, Placed: true}, false, "first placement"},
		{"PINNED first placement approved", Move{Judged: j(composerv1.Judgement_JUDGEMENT_NEW), Policy: pinned, Placed: true, Approved: true}, true, ""},
	}
	for _, c := range cases {
		move, why := Decide(c.m)
		if move != c.move || !strings.Contains(why, c.why) {
			t.Errorf("%s: Decide = %v %q", c.name, move, why)
		}
	}
}

func TestResolvePolicyAndApprovals(t *testing.T) {
	t.Parallel()
	s := &composerv1.NodeSpec{Labels: map[string]string{"zone": "a"}, Policies: map[string]*typev1.Policy{"db": {Policy: typev1.UpgradePolicy_UPGRADE_POLICY_PINNED, Why: "freeze"}}}
	if p := ResolvePolicy(s, "db", dbManifest()); p.From != PolicyFromNodeSpec || p.Policy != typev1.UpgradePolicy_UPGRADE_POLICY_PINNED {
		t.Errorf("override: %+v", p)
	}
	m := dbManifest()
	m.Upgrade = &typev1.Policy{Policy: typev1.UpgradePolicy_UPGRADE_POLICY_MANUAL, Why: "schema"}
	if p := ResolvePolicy(s, "other", m); p.From != PolicyFromManifest || p.Why != "schema" {
		t.Errorf("manifest: %+v", p)
	}
	if p := ResolvePolicy(s, "other", nil); p.From != PolicyFromDefault || p.Policy != typev1.UpgradePolicy_UPGRADE_POLICY_AUTO {
		t.Errorf("default: %+v", p)
	}
	a := &composerv1.Approval{Module: "db", Digests: []string{"D2"}, Selector: &typev1.LabelSelector{MatchLabels: map[string]string{"zone": "a"}}}
	if !Approves(a, "db", "D2", s.GetLabels()) || Approves(a, "db", "D3", s.GetLabels()) || Approves(a, "db", "D2", map[string]string{"zone": "b"}) || Approves(a, "sshd", "D2", s.GetLabels()) {
		t.Error("Approves matched wrongly")
	}
}
