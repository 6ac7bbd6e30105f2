package lint

import (
	"bytes"
	"errors"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	"mesh.dev/internal/names"
	typev1 "mesh.dev/proto/mesh/type/v1"
)

var fp = names.FingerprintPrefix + strings.Repeat("0a", 32)

func file(id, path string, content []byte) *typev1.Resource {
	return &typev1.Resource{Id: id, Module: names.ModuleOfID(id), Type: typev1.ResourceType_RESOURCE_TYPE_FILE, Path: path, Mode: 0o644,
		Content: &typev1.Resource_Inline{Inline: content}}
}

func good() *typev1.Composition {
	return &typev1.Composition{
		Node: "ace", Module: "sshd", Fingerprint: fp,
		Resources: []*typev1.Resource{
			{Id: "sshd:dir", Module: "sshd", Type: typev1.ResourceType_RESOURCE_TYPE_DIRECTORY, Path: "/etc/ssh", Mode: 0o755},
			file("sshd:config", "/etc/ssh/sshd_config", []byte("Port 22\n")),
			{Id: "sshd:link", Module: "sshd", Type: typev1.ResourceType_RESOURCE_TYPE_SYMLINK, Path: "/etc/ssh/z", Target: "/etc/ssh/sshd_config"},
		},
		Filled: []string{"/etc/ssh/host_key"},
	}
}

func TestCheckComposition(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name   string
		mutate func(c *typev1.Composition)
		field  string
	}{
		{"good", func(*typev1.Composition) {}, ""},
		{"bad node", func(c *typev1.Composition) { c.Node = "Ace" }, "node"},
		{"module node with fingerprint", func(c *typev1.Composition) { c.Module = "node" }, "fingerprint"},
		{"no fingerprint", func(c *typev1.Composition) { c.Fingerprint = "" }, "fingerprint"},
		{"relative path", func(c *typev1.Composition) { c.Resources[1].Path = "etc/x" }, "resources[1].path"},
		{"dotdot path", func(c *typev1.Composition) { c.Resources[1].Path = "/etc/ssh/../../x" }, "resources[1].path"},
		{"root path", func(c *typev1.Composition) { c.Resources[0].Path = "/" }, "resources[0].path"},
		{"mode too large", func(c *typev1.Composition) { c.Resources[1].Mode = 0o17777 }, "resources[1].mode"},
		{"owner with space", func(c *typev1.Composition) { c.Resources[1].Owner = "ro ot" }, "resources[1].owner"},
		{"file without content", func(c *typev1.Composition) { c.Resources[1].Content = nil }, "resources[1].content"},
		{"directory with content", func(c *typev1.Composition) { c.Resources[0].Content = &typev1.Resource_Inline{} }, "resources[0]"},
		{"symlink without target", func(c *typev1.Composition) { c.Resources[2].Target = "" }, "resources[2].target"},
		{"unspecified type", func(c *typev1.Composition) { c.Resources[1].Type = 0 }, "resources[1].type"},
		{"duplicate path", func(c *typev1.Composition) { c.Resources[2].Path = "/etc/ssh/sshd_config" }, "resources[2].path"},
		{"unsorted", func(c *typev1.Composition) { c.Resources[0], c.Resources[1] = c.Resources[1], c.Resources[0] }, "resources[1].path"},
		{"resource of another module", func(c *typev1.Composition) { c.Resources[1].Id = "motd:x" }, "resources[1]"},
		{"bad id", func(c *typev1.Composition) { c.Resources[1].Id = "sshd" }, "resources[1].id"},
		{"inline over 64 KiB", func(c *typev1.Composition) {
			c.Resources[1].Content = &typev1.Resource_Inline{Inline: bytes.Repeat([]byte("x"), MaxInlineContent+1)}
		}, "resources[1].inline"},
		{"bad object digest", func(c *typev1.Composition) {
			c.Resources[1].Content = &typev1.Resource_Object{Object: &typev1.ObjectRef{Digest: "sha256:zz", Size: 1}}
		}, "resources[1].object.digest"},
		{"bad artifact ref", func(c *typev1.Composition) { c.Resources[1].Content = &typev1.Resource_Artifact{Artifact: "bin"} }, "resources[1].artifact"},
		{"unsorted filled", func(c *typev1.Composition) { c.Filled = []string{"/b", "/a"} }, "filled[1]"},
		{"adoption on a module", func(c *typev1.Composition) { c.Adoption = []string{"/etc/x"} }, "adoption"},
		{"data flag without paths", func(c *typev1.Composition) { c.Data = true }, "data"},
		{"user list on a directory", func(c *typev1.Composition) { c.Resources[0].UserList = true }, "resources[0].user_list"},
		{"too large", func(c *typev1.Composition) {
			c.Resources = nil
			for i := 0; i < 5; i++ {
				c.Resources = append(c.Resources, file("sshd:f"+string(rune('a'+i)), "/etc/f"+string(rune('a'+i)), bytes.Repeat([]byte("y"), MaxInlineContent)))
			}
		}, "composition"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			comp := good()
			c.mutate(comp)
			err := CheckComposition(comp)
			if c.field == "" {
				if err != nil {
					t.Fatalf("CheckComposition: %v", err)
				}
				return
			}
			var le *Error
			if !errors.As(err, &le) || le.Field != c.field {
				t.Fatalf("CheckComposition = %v, want an error on field %q", err, c.field)
			}
		})
	}
}

func TestCheckNodeOwn(t *testing.T) {
	t.Parallel()
	own := &typev1.Composition{Node: "ace", Module: "node", Resources: []*typev1.Resource{
		{Id: "wg:conf", Type: typev1.ResourceType_RESOURCE_TYPE_FILE, Path: "/etc/wg.conf", Content: &typev1.Resource_Inline{Inline: []byte("x")}},
	}, Adoption: []string{"/etc/hosts"}, ProvisionerAccount: "provisioner"}
	if err := CheckComposition(own); err != nil {
		t.Fatal(err)
	}
	withModule := proto.Clone(own).(*typev1.Composition)
	withModule.Resources[0].Module = "wg"
	if err := CheckComposition(withModule); err == nil || !strings.Contains(err.Error(), "resources[0].module") {
		t.Errorf("a module on the node's own resource: %v", err)
	}
}

func TestCheckWants(t *testing.T) {
	t.Parallel()
	key := "ace.sshd." + names.FingerprintHex(fp)
	d := names.Digest([]byte("c"))
	ok := []*typev1.Want{
		{Module: "node", CompositionKey: "ace.node", CompositionDigest: d},
		{Module: "sshd", Fingerprint: fp, CompositionKey: key, CompositionDigest: d,
			Parts: []*typev1.Artifact{{Ref: "binary:a", Digest: d}, {Ref: "binary:b", Digest: d}}},
	}
	if err := CheckWants("ace", ok); err != nil {
		t.Fatal(err)
	}
	cases := map[string]func(w []*typev1.Want){
		"wants[1].composition_key":    func(w []*typev1.Want) { w[1].CompositionKey = "bob.sshd." + names.FingerprintHex(fp) },
		"wants[1].composition_digest": func(w []*typev1.Want) { w[1].CompositionDigest = "x" },
		"wants[1].parts[1].ref":       func(w []*typev1.Want) { w[1].Parts[1].Ref = "binary:a" },
		"wants[0]":                    func(w []*typev1.Want) { w[0].Fingerprint = fp },
		"wants[1].module":             func(w []*typev1.Want) { w[0], w[1] = w[1], w[0] },
	}
	for field, mutate := range cases {
		w := []*typev1.Want{proto.Clone(ok[0]).(*typev1.Want), proto.Clone(ok[1]).(*typev1.Want)}
		mutate(w)
		var le *Error
		if err := CheckWants("ace", w); !errors.As(err, &le) || le.Field != field {
			t.Errorf("%s: CheckWants = %v", field, err)
		}
	}
}
