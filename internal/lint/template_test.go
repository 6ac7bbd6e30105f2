package lint

import (
	"bytes"
	"errors"
	"strings"
	"testing"
	"text/template"
	"time"
)

// hostileTemplates do unbounded work when rendered by text/template as it
// is: each must be refused when a manifest is checked, and bounded when
// rendered by RenderTemplate.
var hostileTemplates = []struct {
	name, src, msg string
}{
	{"range over a huge integer", `{{ range 1000000000000 }}{{ end }}`, "range only over .Params, .Facts"},
	{"range over an integer variable", `{{ $n := 1000000000000 }}{{ range $n }}{{ end }}`, "range only over .Params, .Facts"},
	{"range over a function's result", `{{ range (slice .Params.list 0) }}{{ end }}`, "range only over .Params, .Facts"},
	{"string doubling", `{{ $x := "aaaaaaaaaaaaaaaa" }}{{ range .Params.a }}{{ $x = print $x $x }}{{ end }}{{ len $x }}`, "cannot be reassigned"},
	{"recursion", `{{ define "r" }}{{ template "r" . }}{{ template "r" . }}{{ end }}{{ template "r" . }}`, "may not define or call other templates"},
	{"block", `{{ block "b" . }}x{{ end }}`, "may not define or call other templates"},
	{"deep ranges", `{{ range .Params.a }}{{ range $.Params.a }}{{ range $.Params.a }}x{{ end }}{{ end }}{{ end }}`, "nested 3 deep"},
	{"shadowed data variable", `{{ $v := .Params.list }}{{ $v := 1000000000 }}{{ range $v }}{{ end }}`, "range only over .Params, .Facts"},
}

func TestTemplateWorkRefused(t *testing.T) {
	t.Parallel()
	for _, tc := range hostileTemplates {
		t.Run(tc.name, func(t *testing.T) {
			m := goodManifest()
			m.Resources[1].Content = text(tc.src)
			err := CheckModuleManifest(m)
			var le *Error
			if !errors.As(err, &le) || le.Field != "resources[1].text" || !strings.Contains(err.Error(), tc.msg) {
				t.Fatalf("CheckModuleManifest = %v, want resources[1].text: ...%s...", err, tc.msg)
			}
		})
	}
	for _, ok := range []string{
		`{{ range $i, $u := .Params.users }}{{ $i }} {{ $u.name }}{{ range $u.keys }} {{ . }}{{ end }}{{ end }}`,
		`{{ with $c := .Params.clients }}{{ range $c }}{{ . }}{{ end }}{{ end }}`,
		`{{ range .Facts.disks }}{{ . }}{{ else }}none{{ end }}`,
		`{{ $x := .Params.list }}{{ range $x }}{{ . }}{{ end }}`,
		`{{ range (.Params.list) }}{{ . }}{{ end }}`,
	} {
		m := goodManifest()
		m.Resources[1].Content = text(ok)
		if err := CheckModuleManifest(m); err != nil {
			t.Errorf("%s: %v", ok, err)
		}
	}
}

func TestRenderTemplateBoundsWork(t *testing.T) {
	t.Parallel()
	data := map[string]any{"Node": "ace", "Params": map[string]any{"list": []any{1, 2, 3}, "a": make([]any, 200)}}
	for _, tc := range hostileTemplates {
		t.Run(tc.name, func(t *testing.T) {
			start := time.Now()
			out, err := RenderTemplate("x", tc.src, data, 1<<20)
			if tc.name == "block" || tc.name == "range over a function's result" {
				// Bounded by the data: refused only at put time.
				if err != nil {
					t.Fatalf("RenderTemplate = %q, %v", out, err)
				}
				return
			}
			if err == nil {
				t.Fatalf("rendered %d bytes, want a refusal", len(out))
			}
			if !errors.Is(err, ErrTemplateWork) && !strings.Contains(err.Error(), "maximum template depth") {
				t.Fatalf("error %v, want ErrTemplateWork", err)
			}
			if d := time.Since(start); d > 10*time.Second {
				t.Fatalf("took %s", d)
			}
		})
	}
}

func TestRenderTemplateMatchesTextTemplate(t *testing.T) {
	t.Parallel()
	data := map[string]any{"Node": "ace", "Facts": map[string]any{"ip": "10.0.0.1"},
		"Params": map[string]any{"port": 22.0, "users": []any{"ann", "bob"}, "extra": map[string]any{"b": "2", "a": "1"}}}
	for _, src := range []string{
		"Port {{ .Params.port }} on {{ .Facts.ip }} of {{ .Node }}\n",
		`{{ range $k, $v := .Params.extra }}{{ $k }}={{ $v }};{{ end }}`,
		`{{ range .Params.users }}{{ printf "%q" . }} {{ print . 1 }} {{ println . }}{{ end }}`,
		`{{ .Params.users | len }} {{ html "<a>" }} {{ js "'" }} {{ urlquery "a b" }} {{ index .Params.users 1 }}`,
		`{{ if eq .Node "ace" }}yes{{ else }}no{{ end }}{{ with .Params.port }}{{ . }}{{ else }}none{{ end }}`,
	} {
		want := new(bytes.Buffer)
		if err := template.Must(ParseTemplate("x", src)).Execute(want, data); err != nil {
			t.Fatal(err)
		}
		got, err := RenderTemplate("x", src, data, 1<<20)
		if err != nil || got != want.String() {
			t.Errorf("%s: RenderTemplate = %q, %v; text/template gives %q", src, got, err, want.String())
		}
	}
	if _, err := RenderTemplate("x", `{{ .Params.nothing }}`, data, 1<<20); err == nil || !strings.Contains(err.Error(), "nothing") {
		t.Errorf("a missing key: %v", err)
	}
	if _, err := RenderTemplate("x", `{{ range .Params.users }}{{ . }}{{ end }}`, data, 4); !errors.Is(err, ErrTemplateWork) {
		t.Errorf("output over the limit: %v", err)
	}
}
