// Package compose holds the pure rules of the composer (DESIGN.md §4, §5.1,
// §5.3): rendering a node's declaration, splitting it into compositions,
// judging a composition against what the node applied, and the assigner's
// policy decisions. Nothing here reads or writes storage, so every rule is
// tested as a function.
package compose

import (
	"bytes"
	"errors"
	"fmt"
	"slices"
	"sort"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	"mesh.dev/internal/lint"
	"mesh.dev/internal/names"
	composerv1 "mesh.dev/proto/mesh/composer/v1"
	typev1 "mesh.dev/proto/mesh/type/v1"
)

// MaxRenderedContent bounds what one template may render, so a hostile
// template (nested ranges over large params) cannot exhaust memory.
const MaxRenderedContent = 8 << 20

// Module is a placed module at its registered fingerprint, with its decoded
// manifest.
type Module struct {
	Fingerprint string
	Manifest    *typev1.ModuleManifest
}

// RenderError names the node, module and resource a declaration failed on.
type RenderError struct {
	Node, Module, Resource string
	Err                    error
}

func (e *RenderError) Error() string {
	return fmt.Sprintf("node %s, module %s, resource %s: %v", e.Node, e.Module, e.Resource, e.Err)
}

func (e *RenderError) Unwrap() error { return e.Err }

// ErrPathConflict is wrapped when two resources declare one path.
var ErrPathConflict = errors.New("path declared twice")

// templateData is what templates see: .Node (the node name), .Labels,
// .Facts and .Params. Facts and params are never secrets (DESIGN.md §4).
type templateData struct {
	Node   string
	Labels map[string]string
	Facts  map[string]any
	Params map[string]any
}

// render executes one template source through lint.RenderTemplate: no
// functions that reach outside the data, missing keys are errors, and the
// work of a template is bounded (range iterations, template calls, the
// strings it builds and its output), so a hostile template stored before
// the catalog checked it cannot hang or exhaust a pass.
func render(name, src string, data *templateData) (string, error) {
	if lint.Literal(src) && len(src) <= MaxRenderedContent {
		// Text without an action renders as itself; most paths are
		// such, and a pass renders every resource of every module.
		return src, nil
	}
	return lint.RenderTemplate(name, src, data, MaxRenderedContent)
}

func structMap(s *structpb.Struct) map[string]any {
	if s == nil {
		return map[string]any{}
	}
	return s.AsMap()
}

// Declare renders a node's declaration from its spec and the manifests of
// its placed modules at their registered fingerprints (modules holds only
// placed modules that have a fingerprint). A template error, a missing key or
// an invalid rendered resource is a *RenderError naming node, module and
// resource; two resources on one path are an error naming both ids.
func Declare(spec *composerv1.NodeSpec, modules map[string]Module) (*composerv1.Declaration, error) {
	node := spec.GetNode()
	d := &composerv1.Declaration{Node: node, Fingerprints: map[string]string{}}
	facts := structMap(spec.GetFacts())
	for _, pm := range spec.GetModules() {
		d.Runs = append(d.Runs, pm.GetModule())
		m, ok := modules[pm.GetModule()]
		if !ok || !names.HasFingerprint(m.Fingerprint) {
			continue
		}
		d.Fingerprints[pm.GetModule()] = m.Fingerprint
		data := &templateData{Node: node, Labels: spec.GetLabels(), Facts: facts, Params: structMap(pm.GetParams())}
		for _, rt := range m.Manifest.GetResources() {
			r, err := renderResource(pm.GetModule(), rt, data)
			if err != nil {
				return nil, &RenderError{Node: node, Module: pm.GetModule(), Resource: names.ResourceID(pm.GetModule(), rt.GetName()), Err: err}
			}
			d.Resources = append(d.Resources, r)
		}
	}
	for i, r := range spec.GetResources() {
		r = proto.Clone(r).(*typev1.Resource)
		if err := lint.CheckResource(fmt.Sprintf("resources[%d]", i), inlineChecked(r)); err != nil {
			return nil, &RenderError{Node: node, Module: r.GetModule(), Resource: r.GetId(), Err: err}
		}
		if r.GetModule() != "" && names.ModuleOfID(r.GetId()) != r.GetModule() {
			return nil, &RenderError{Node: node, Module: r.GetModule(), Resource: r.GetId(),
				Err: fmt.Errorf("the id's module part is not the resource's module %q", r.GetModule())}
		}
		if _, built := d.Fingerprints[r.GetModule()]; built {
			// Its composition is checked against the entry's manifest by
			// the signer; a resource the manifest does not list would fail
			// every pass of this node.
			return nil, &RenderError{Node: node, Module: r.GetModule(), Resource: r.GetId(),
				Err: fmt.Errorf("a node's own resource cannot name module %q, which is placed with a build", r.GetModule())}
		}
		d.Resources = append(d.Resources, r)
	}
	sort.SliceStable(d.Resources, func(i, j int) bool { return d.Resources[i].GetPath() < d.Resources[j].GetPath() })
	for i := 1; i < len(d.Resources); i++ {
		a, b := d.Resources[i-1], d.Resources[i]
		if a.GetPath() == b.GetPath() {
			return nil, fmt.Errorf("%w: node %s: 2 resources declare %s: %s, %s", ErrPathConflict, node, a.GetPath(), a.GetId(), b.GetId())
		}
	}
	d.Filled = sortedUnique(spec.GetFilled())
	d.Adoption = sortedUnique(spec.GetAdoption())
	d.ProvisionerAccount = spec.GetProvisionerAccount()
	slices.Sort(d.Runs)
	return d, nil
}

func sortedUnique(in []string) []string {
	out := slices.Clone(in)
	slices.Sort(out)
	return slices.Compact(out)
}

func renderResource(module string, rt *typev1.ResourceTemplate, data *templateData) (*typev1.Resource, error) {
	id := names.ResourceID(module, rt.GetName())
	path, err := render(id+".path", rt.GetPath(), data)
	if err != nil {
		return nil, fmt.Errorf("path: %w", err)
	}
	r := &typev1.Resource{
		Id: id, Module: module, Type: rt.GetType(), Path: path, Mode: rt.GetMode(),
		Owner: rt.GetOwner(), Group: rt.GetGroup(), UserList: rt.GetUserList(),
	}
	if rt.GetTarget() != "" {
		if r.Target, err = render(id+".target", rt.GetTarget(), data); err != nil {
			return nil, fmt.Errorf("target: %w", err)
		}
	}
	switch c := rt.GetContent().(type) {
	case *typev1.ResourceTemplate_Text:
		text, err := render(id+".text", c.Text, data)
		if err != nil {
			return nil, fmt.Errorf("content: %w", err)
		}
		r.Content = &typev1.Resource_Inline{Inline: []byte(text)}
	case *typev1.ResourceTemplate_Raw:
		r.Content = &typev1.Resource_Inline{Inline: bytes.Clone(c.Raw)}
	case *typev1.ResourceTemplate_Artifact:
		r.Content = &typev1.Resource_Artifact{Artifact: c.Artifact}
	}
	if err := lint.CheckResource("resource", inlineChecked(r)); err != nil {
		return nil, err
	}
	return r, nil
}

// inlineChecked returns the resource lint should see: inline content over
// the limit is legal in a declaration, since writing moves it to the object
// store (DESIGN.md §5.2 step 1); everything else must already be valid.
func inlineChecked(r *typev1.Resource) *typev1.Resource {
	if in, ok := r.GetContent().(*typev1.Resource_Inline); ok && len(in.Inline) > lint.MaxInlineContent {
		check := proto.Clone(r).(*typev1.Resource)
		check.Content = &typev1.Resource_Inline{}
		return check
	}
	return r
}
