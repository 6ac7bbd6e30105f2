package lint

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	typev1 "mesh.dev/proto/mesh/type/v1"
)

// goodManifest is a module manifest using every kind of resource.
func goodManifest() *typev1.ModuleManifest {
	return &typev1.ModuleManifest{
		Module:  "sshd",
		Version: "9.6.1",
		Resources: []*typev1.ResourceTemplate{
			{Name: "dir", Type: typev1.ResourceType_RESOURCE_TYPE_DIRECTORY, Path: "/etc/ssh/sshd_config.d", Mode: 0o755, Owner: "root", Group: "root"},
			{Name: "config", Type: typev1.ResourceType_RESOURCE_TYPE_FILE, Path: "/etc/ssh/sshd_config", Mode: 0o600,
				Content: &typev1.ResourceTemplate_Text{Text: "ListenAddress {{ .Facts.ip }}\nPort {{ .Params.port }}\n# {{ .Node }}\n" +
					"{{ range $k, $v := .Params.extra }}{{ $k }} {{ $v }}\n{{ end }}{{ with .Params.banner }}Banner {{ . }}{{ end }}{{ $.Node }}\n"}},
			{Name: "per-node", Type: typev1.ResourceType_RESOURCE_TYPE_FILE, Path: "/etc/ssh/sshd_config.d/{{ .Node }}.conf", Mode: 0o644,
				Content: &typev1.ResourceTemplate_Raw{Raw: []byte{0, 1, 2}}},
			{Name: "bin", Type: typev1.ResourceType_RESOURCE_TYPE_FILE, Path: "/usr/local/bin/sshd-helper", Mode: 0o755,
				Content: &typev1.ResourceTemplate_Artifact{Artifact: "binary:sshd-helper"}},
			{Name: "link", Type: typev1.ResourceType_RESOURCE_TYPE_SYMLINK, Path: "/etc/ssh/current", Target: "/etc/ssh/sshd_config"},
			{Name: "users", Type: typev1.ResourceType_RESOURCE_TYPE_FILE, Path: "/etc/ssh/allowed_users", UserList: true,
				Content: &typev1.ResourceTemplate_Text{Text: "{{ range .Params.users }}{{ . }}\n{{ end }}"}},
		},
		DataPaths: []string{"/var/lib/sshd"},
		Upgrade:   &typev1.Policy{Policy: typev1.UpgradePolicy_UPGRADE_POLICY_AUTO},
		Needs: []*typev1.Need{{Module: "users", Cap: 8, MinVersion: "1.2",
			Selector: &typev1.LabelSelector{MatchLabels: map[string]string{"role": "bastion", "example.com/zone": "a"}}}},
	}
}

func text(s string) *typev1.ResourceTemplate_Text { return &typev1.ResourceTemplate_Text{Text: s} }

func TestCheckModuleManifest(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name   string
		mutate func(m *typev1.ModuleManifest)
		field  string
		msg    string
	}{
		{"good", func(*typev1.ModuleManifest) {}, "", ""},
		{"bad module", func(m *typev1.ModuleManifest) { m.Module = "SSH" }, "module", `module: module "SSH" is not a DNS label`},
		{"reserved module", func(m *typev1.ModuleManifest) { m.Module = "node" }, "module", `module name "node" is reserved`},
		{"no version", func(m *typev1.ModuleManifest) { m.Version = "" }, "version", "version: is required"},
		{"version with letters", func(m *typev1.ModuleManifest) { m.Version = "1.2-rc1" }, "version", `version: "1.2-rc1" is not dot-separated numbers`},
		{"version with empty part", func(m *typev1.ModuleManifest) { m.Version = "1..2" }, "version", "not dot-separated numbers"},
		{"version part too long", func(m *typev1.ModuleManifest) { m.Version = "1234567890" }, "version", "1 to 9 digits"},
		{"version too long", func(m *typev1.ModuleManifest) { m.Version = strings.Repeat("1.", 32) + "1" }, "version", `version: "` + strings.Repeat("1.", 32) + `1" is longer than 64 characters`},
		{"too many resources", func(m *typev1.ModuleManifest) {
			for i := len(m.Resources); i <= MaxResources; i++ {
				m.Resources = append(m.Resources, &typev1.ResourceTemplate{Name: fmt.Sprintf("d%d", i), Type: typev1.ResourceType_RESOURCE_TYPE_DIRECTORY, Path: fmt.Sprintf("/srv/d%d", i)})
			}
		}, "resources", "resources: 4097 resources, over the limit of 4096"},
		{"bad resource name", func(m *typev1.ModuleManifest) { m.Resources[0].Name = "a b" }, "resources[0].name", "holds a space"},
		{"empty resource name", func(m *typev1.ModuleManifest) { m.Resources[0].Name = "" }, "resources[0].name", "must be 1 to 253 characters"},
		{"duplicate name", func(m *typev1.ModuleManifest) { m.Resources[1].Name = "dir" }, "resources[1].name", `"dir" is also the name of resources[0]`},
		{"unspecified type", func(m *typev1.ModuleManifest) { m.Resources[0].Type = 0 }, "resources[0].type", "is not FILE, DIRECTORY or SYMLINK"},
		{"relative path", func(m *typev1.ModuleManifest) { m.Resources[1].Path = "etc/ssh/sshd_config" }, "resources[1].path", `resources[1].path "etc/ssh/sshd_config" is not absolute`},
		{"unclean path", func(m *typev1.ModuleManifest) { m.Resources[1].Path = "/etc/ssh/../shadow" }, "resources[1].path", `is not clean (want "/etc/shadow")`},
		{"empty path", func(m *typev1.ModuleManifest) { m.Resources[1].Path = "" }, "resources[1].path", "resources[1].path is empty"},
		{"root path", func(m *typev1.ModuleManifest) { m.Resources[0].Path = "/" }, "resources[0].path", "the root directory cannot be a resource"},
		{"long path", func(m *typev1.ModuleManifest) { m.Resources[1].Path = "/" + strings.Repeat("a", 4096) }, "resources[1].path", "over the limit of 4096"},
		{"templated relative path", func(m *typev1.ModuleManifest) { m.Resources[2].Path = "{{ .Node }}/x" }, "resources[2].path", "does not start with a literal /"},
		{"templated traversal", func(m *typev1.ModuleManifest) { m.Resources[2].Path = "/etc/{{ .Params.d }}/../shadow" }, "resources[2].path", "is not clean once each action stands for one path segment"},
		{"templated double slash", func(m *typev1.ModuleManifest) { m.Resources[2].Path = "/etc//{{ .Node }}" }, "resources[2].path", "is not clean"},
		{"path template syntax", func(m *typev1.ModuleManifest) { m.Resources[2].Path = "/etc/{{ .Node " }, "resources[2].path", "template does not parse: line 1: unclosed action"},
		{"path unknown function", func(m *typev1.ModuleManifest) { m.Resources[2].Path = "/etc/{{ upper .Node }}" }, "resources[2].path", `function "upper" not defined`},
		{"text unknown function", func(m *typev1.ModuleManifest) { m.Resources[1].Content = text("{{ env \"HOME\" }}") }, "resources[1].text", `function "env" not defined`},
		{"text syntax", func(m *typev1.ModuleManifest) { m.Resources[1].Content = text("{{ if .Node }}x") }, "resources[1].text", "template does not parse"},
		{"text unknown key", func(m *typev1.ModuleManifest) { m.Resources[1].Content = text("{{ .Param.port }}") }, "resources[1].text", "{{ .Param.port }} reads .Param: templates see only .Node, .Facts and .Params"},
		{"text unknown key via $", func(m *typev1.ModuleManifest) {
			m.Resources[1].Content = text("{{ range .Params.l }}{{ $.Fact.ip }}{{ end }}")
		}, "resources[1].text", "reads .Fact"},
		{"text unknown key in if", func(m *typev1.ModuleManifest) { m.Resources[1].Content = text("{{ if .Nodes }}x{{ end }}") }, "resources[1].text", "reads .Nodes"},
		{"text field of node", func(m *typev1.ModuleManifest) { m.Resources[1].Content = text("{{ .Node.name }}") }, "resources[1].text", ".Node is the node's name"},
		{"text not utf8", func(m *typev1.ModuleManifest) { m.Resources[1].Content = text("\xff") }, "resources[1].text", "not valid UTF-8"},
		{"mode too large", func(m *typev1.ModuleManifest) { m.Resources[1].Mode = 0o10000 }, "resources[1].mode", "10000 is over 7777"},
		{"bad owner", func(m *typev1.ModuleManifest) { m.Resources[1].Owner = "Root" }, "resources[1].owner", "is not a user or group name"},
		{"bad group", func(m *typev1.ModuleManifest) { m.Resources[1].Group = "-wheel" }, "resources[1].group", "is not a user or group name"},
		{"owner too long", func(m *typev1.ModuleManifest) { m.Resources[1].Owner = strings.Repeat("o", 33) }, "resources[1].owner", `resources[1].owner: "` + strings.Repeat("o", 33) + `" is longer than 32 characters`},
		{"group too long", func(m *typev1.ModuleManifest) { m.Resources[1].Group = strings.Repeat("g", 33) }, "resources[1].group", "is longer than 32 characters"},
		{"file without content", func(m *typev1.ModuleManifest) { m.Resources[1].Content = nil }, "resources[1].content", "a file needs text, raw or artifact content"},
		{"file with target", func(m *typev1.ModuleManifest) { m.Resources[1].Target = "/x" }, "resources[1].target", "a file has no target"},
		{"directory with content", func(m *typev1.ModuleManifest) { m.Resources[0].Content = text("x") }, "resources[0].content", "a directory has no content"},
		{"directory with target", func(m *typev1.ModuleManifest) { m.Resources[0].Target = "/x" }, "resources[0].target", "a directory has no target"},
		{"symlink with content", func(m *typev1.ModuleManifest) { m.Resources[4].Content = text("x") }, "resources[4].content", "a symlink has no content"},
		{"symlink without target", func(m *typev1.ModuleManifest) { m.Resources[4].Target = "" }, "resources[4].target", "a symlink needs a target"},
		{"symlink unclean target", func(m *typev1.ModuleManifest) { m.Resources[4].Target = "/etc/./x" }, "resources[4].target", "is not clean"},
		{"symlink target too long", func(m *typev1.ModuleManifest) { m.Resources[4].Target = "/" + strings.Repeat("t", 4096) }, "resources[4].target", "resources[4].target: is 4097 bytes, over the limit of 4096"},
		{"symlink target with NUL", func(m *typev1.ModuleManifest) { m.Resources[4].Target = "../sshd_config\x00" }, "resources[4].target", "resources[4].target: holds a NUL byte"},
		{"templated symlink target with NUL", func(m *typev1.ModuleManifest) { m.Resources[4].Target = "/etc/{{ .Node }}\x00x" }, "resources[4].target", "holds a NUL byte"},
		{"symlink target syntax", func(m *typev1.ModuleManifest) { m.Resources[4].Target = "{{ .Node" }, "resources[4].target", "template does not parse"},
		{"bad artifact ref", func(m *typev1.ModuleManifest) {
			m.Resources[3].Content = &typev1.ResourceTemplate_Artifact{Artifact: "sshd-helper"}
		}, "resources[3].artifact", "is not kind:name"},
		{"user list on a directory", func(m *typev1.ModuleManifest) { m.Resources[0].UserList = true }, "resources[0].user_list", "only a file can be a user list"},
		{"two resources on one path", func(m *typev1.ModuleManifest) { m.Resources[5].Path = "/etc/ssh/sshd_config" }, "resources[5].path", "2 resources declare /etc/ssh/sshd_config: sshd:config, sshd:users"},
		{"relative data path", func(m *typev1.ModuleManifest) { m.DataPaths = []string{"var/lib/sshd"} }, "data_paths[0]", "is not absolute"},
		{"unsorted data paths", func(m *typev1.ModuleManifest) { m.DataPaths = []string{"/var/lib/b", "/var/lib/a"} }, "data_paths[1]", "is not sorted and unique"},
		{"root data path", func(m *typev1.ModuleManifest) { m.DataPaths = []string{"/"} }, "data_paths[0]", "the root directory cannot be a data path"},
		{"templated data path", func(m *typev1.ModuleManifest) { m.DataPaths = []string{"/var/lib/{{.Node}}"} }, "data_paths[0]", "data paths are not templates"},
		{"too many data paths", func(m *typev1.ModuleManifest) {
			m.DataPaths = nil
			for i := range MaxDataPaths + 1 {
				m.DataPaths = append(m.DataPaths, fmt.Sprintf("/var/lib/sshd/%03d", i))
			}
		}, "data_paths", "data_paths: 257 data paths, over the limit of 256"},
		{"no upgrade policy", func(m *typev1.ModuleManifest) { m.Upgrade = nil }, "upgrade", "upgrade: is required (AUTO, MANUAL or PINNED)"},
		{"unspecified policy", func(m *typev1.ModuleManifest) { m.Upgrade.Policy = 0 }, "upgrade.policy", "is not AUTO, MANUAL or PINNED"},
		{"manual without why", func(m *typev1.ModuleManifest) { m.Upgrade.Policy = typev1.UpgradePolicy_UPGRADE_POLICY_MANUAL }, "upgrade.why", "UPGRADE_POLICY_MANUAL needs a why"},
		{"pinned with blank why", func(m *typev1.ModuleManifest) {
			m.Upgrade = &typev1.Policy{Policy: typev1.UpgradePolicy_UPGRADE_POLICY_PINNED, Why: "  "}
		}, "upgrade.why", "UPGRADE_POLICY_PINNED needs a why"},
		{"why too long", func(m *typev1.ModuleManifest) { m.Upgrade.Why = strings.Repeat("w", MaxWhyLen+1) }, "upgrade.why", "over the limit of 1024"},
		{"need bad module", func(m *typev1.ModuleManifest) { m.Needs[0].Module = "Users" }, "needs[0].module", "is not a DNS label"},
		{"need itself", func(m *typev1.ModuleManifest) { m.Needs[0].Module = "sshd" }, "needs[0].module", `module "sshd" cannot need itself`},
		{"need twice", func(m *typev1.ModuleManifest) { m.Needs = append(m.Needs, &typev1.Need{Module: "users"}) }, "needs[1].module", `"users" is also needed by needs[0]`},
		{"need cap too large", func(m *typev1.ModuleManifest) { m.Needs[0].Cap = MaxNeedCap + 1 }, "needs[0].cap", "257 is over the limit of 256"},
		{"need bad min version", func(m *typev1.ModuleManifest) { m.Needs[0].MinVersion = "v1" }, "needs[0].min_version", "is not dot-separated numbers"},
		{"need bad selector key", func(m *typev1.ModuleManifest) { m.Needs[0].Selector.MatchLabels["a b"] = "x" }, "needs[0].selector", `label key "a b"`},
		{"need bad selector value", func(m *typev1.ModuleManifest) { m.Needs[0].Selector.MatchLabels["role"] = "a/b" }, "needs[0].selector", `label role value "a/b"`},
		{"need min version too long", func(m *typev1.ModuleManifest) { m.Needs[0].MinVersion = strings.Repeat("1.", 40) + "1" }, "needs[0].min_version", "is longer than 64 characters"},
		{"too many selector labels", func(m *typev1.ModuleManifest) {
			for i := len(m.Needs[0].Selector.MatchLabels); i <= MaxSelectorLabels; i++ {
				m.Needs[0].Selector.MatchLabels[fmt.Sprintf("k%d", i)] = "v"
			}
		}, "needs[0].selector", "needs[0].selector: 17 labels, over the limit of 16"},
		{"need selector key too long", func(m *typev1.ModuleManifest) {
			m.Needs[0].Selector.MatchLabels[strings.Repeat("k", MaxLabelLen+1)] = "x"
		}, "needs[0].selector", "is not 1 to 63 characters"},
		{"need selector value too long", func(m *typev1.ModuleManifest) {
			m.Needs[0].Selector.MatchLabels["role"] = strings.Repeat("v", MaxLabelLen+1)
		}, "needs[0].selector", "is not up to 63 characters"},
		{"why with control character", func(m *typev1.ModuleManifest) {
			m.Upgrade = &typev1.Policy{Policy: typev1.UpgradePolicy_UPGRADE_POLICY_MANUAL, Why: "ask\x1b[2J"}
		}, "upgrade.why", "upgrade.why: holds the control character U+001B"},
		{"too many needs", func(m *typev1.ModuleManifest) {
			m.Needs = nil
			for i := 0; i <= MaxNeeds; i++ {
				m.Needs = append(m.Needs, &typev1.Need{Module: "m" + strings.Repeat("a", i%50) + string(rune('a'+i%26)) + string(rune('a'+i/26))})
			}
		}, "needs", "65 needs, over the limit of 64"},
		{"manifest too large", func(m *typev1.ModuleManifest) {
			m.Resources[2].Content = &typev1.ResourceTemplate_Raw{Raw: make([]byte, MaxManifestSize)}
		}, "manifest", "over the limit of 524288"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			m := goodManifest()
			c.mutate(m)
			err := CheckModuleManifest(m)
			if c.field == "" {
				if err != nil {
					t.Fatalf("CheckModuleManifest: %v", err)
				}
				return
			}
			var le *Error
			if !errors.As(err, &le) || le.Field != c.field {
				t.Fatalf("CheckModuleManifest = %v, want an error on field %q", err, c.field)
			}
			if !strings.HasPrefix(err.Error(), c.field) || !strings.Contains(err.Error(), c.msg) {
				t.Fatalf("error %q does not start with %q and say %q", err, c.field, c.msg)
			}
		})
	}
}

func TestParseTemplateRendersStrictly(t *testing.T) {
	t.Parallel()
	tmpl, err := ParseTemplate("t", "Port {{ .Params.port }}")
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	err = tmpl.Execute(&b, map[string]any{"Node": "ace", "Facts": map[string]any{}, "Params": map[string]any{}})
	if err == nil || !strings.Contains(err.Error(), `map has no entry for key "port"`) {
		t.Fatalf("a missing key rendered: %q, %v", b.String(), err)
	}
}

func TestArtifactRefs(t *testing.T) {
	t.Parallel()
	m := goodManifest()
	m.Resources = append(m.Resources,
		&typev1.ResourceTemplate{Name: "b2", Type: typev1.ResourceType_RESOURCE_TYPE_FILE, Path: "/usr/local/bin/b2", Content: &typev1.ResourceTemplate_Artifact{Artifact: "binary:sshd-helper"}},
		&typev1.ResourceTemplate{Name: "a", Type: typev1.ResourceType_RESOURCE_TYPE_FILE, Path: "/usr/local/bin/a", Content: &typev1.ResourceTemplate_Artifact{Artifact: "binary:a"}})
	got := ArtifactRefs(m)
	if strings.Join(got, ",") != "binary:a,binary:sshd-helper" {
		t.Fatalf("ArtifactRefs = %v", got)
	}
}
