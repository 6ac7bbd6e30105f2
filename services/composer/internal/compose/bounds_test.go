package compose

import (
	"errors"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/structpb"

	"mesh.dev/internal/lint"
	composerv1 "mesh.dev/proto/mesh/composer/v1"
	typev1 "mesh.dev/proto/mesh/type/v1"
)

// TestDeclareBoundsTemplateWork renders templates that make text/template
// do unbounded work without writing output: a range over an integer (CPU:
// 10^13 iterations would take days) and a string doubled through variable
// reassignment (memory: 2^40 bytes after 40 iterations). The catalog now
// refuses both (lint.CheckModuleManifest), but a manifest stored before
// that check, or written straight into a bucket, reaches Declare: the
// composer must bound the work itself and fail the node's declaration,
// naming node, module and resource, instead of hanging every pass.
//
// compose.render renders through lint.RenderTemplate, which bounds range
// iterations and template calls by lint.MaxTemplateSteps and every string a
// template builds by the output limit. Before it did, both templates here
// rendered without an error (the iterations are kept small enough to fail
// within seconds).
func TestDeclareBoundsTemplateWork(t *testing.T) {
	t.Parallel()
	list := make([]any, 20)
	for i := range list {
		list[i] = i
	}
	params, err := structpb.NewStruct(map[string]any{"list": list})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ name, src string }{
		{"range over an integer", `{{ range 50000000 }}{{ end }}`},
		{"string doubling", `{{ $x := "0123456789abcdef" }}{{ range .Params.list }}{{ $x = print $x $x }}{{ end }}{{ len $x }}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := &typev1.ModuleManifest{Module: "evil", Version: "1", Resources: []*typev1.ResourceTemplate{
				{Name: "conf", Type: file, Path: "/etc/evil.conf", Content: text(tc.src)},
			}}
			if err := lint.CheckModuleManifest(m); err == nil {
				t.Errorf("the catalog's check accepts %s", tc.src)
			}
			spec := &composerv1.NodeSpec{Node: "ace", Modules: []*composerv1.PlacedModule{{Module: "evil", Params: params}}}
			start := time.Now()
			_, err := Declare(spec, map[string]Module{"evil": {Fingerprint: fpSSHD, Manifest: m}})
			var re *RenderError
			if !errors.As(err, &re) || re.Module != "evil" || re.Resource != "evil:conf" || !errors.Is(err, lint.ErrTemplateWork) {
				t.Errorf("Declare = %v after %s; want a render error of evil:conf wrapping lint.ErrTemplateWork (the work of a template is not bounded)",
					err, time.Since(start).Round(time.Millisecond))
			}
		})
	}
}
