package compose

import (
	"slices"
	"sort"

	"google.golang.org/protobuf/proto"

	"mesh.dev/internal/names"
	composerv1 "mesh.dev/proto/mesh/composer/v1"
	typev1 "mesh.dev/proto/mesh/type/v1"
)

// SplitInput is what the split reads.
type SplitInput struct {
	Declaration *composerv1.Declaration
	// Fingerprints maps a module to its registered fingerprint; a module
	// absent, or with a value that is not a fingerprint, has none.
	Fingerprints map[string]string
	// Manifests holds the manifest of each module with a fingerprint.
	Manifests map[string]*typev1.ModuleManifest
	// Runs are the modules placed on the node.
	Runs []string
}

// Split is the split's result: compositions by key and the modules whose
// resources moved into the node's own composition.
type Split struct {
	Compositions map[string]*typev1.Composition
	Moved        []string
}

// SplitDeclaration splits a declaration into one composition per module with
// a fingerprint plus the node's own (DESIGN.md §5.1):
//  1. a resource whose module has a fingerprint goes to that module's
//     composition at that fingerprint;
//  2. a resource with no module goes to the node's own;
//  3. a resource whose module has no fingerprint goes to the node's own with
//     its module cleared (its id keeps the module name), and the module is
//     listed in Moved once;
//  4. a filled path of a moved module's FILE resource goes to the node's own
//     filled list, of another FILE resource to the composition holding it,
//     of no FILE resource to the node's own; filled lists are sorted;
//  5. the node's own carries adoption and provisioner account and is always
//     produced, even empty, with its data flag false;
//  6. every run module with a fingerprint and no resources gets an empty
//     composition at it;
//  7. a module composition's data flag is true when its manifest declares
//     data paths (and the data paths travel with it).
func SplitDeclaration(in SplitInput) Split {
	d := in.Declaration
	node := d.GetNode()
	out := Split{Compositions: map[string]*typev1.Composition{}}
	own := &typev1.Composition{
		Node: node, Module: names.NodeModule,
		Adoption:           slices.Clone(d.GetAdoption()),
		ProvisionerAccount: d.GetProvisionerAccount(),
	}
	moduleComp := func(module, fp string) *typev1.Composition {
		key := names.Key{Node: node, Module: module, Fingerprint: fp}.String()
		c, ok := out.Compositions[key]
		if !ok {
			c = &typev1.Composition{Node: node, Module: module, Fingerprint: fp}
			if dp := in.Manifests[module].GetDataPaths(); len(dp) > 0 {
				c.Data = true
				c.DataPaths = sortedUnique(dp)
			}
			out.Compositions[key] = c
		}
		return c
	}
	fingerprint := func(module string) string {
		if fp := in.Fingerprints[module]; names.HasFingerprint(fp) {
			return fp
		}
		return ""
	}
	moved := map[string]bool{}
	// holder maps the path of every FILE resource to the composition that
	// holds it, and whether it belongs to a moved module.
	type holding struct {
		comp  *typev1.Composition
		moved bool
	}
	files := map[string]holding{}
	for _, r := range d.GetResources() {
		r = proto.Clone(r).(*typev1.Resource)
		var c *typev1.Composition
		isMoved := false
		switch m := r.GetModule(); {
		case m == "":
			c = own
		case fingerprint(m) != "":
			c = moduleComp(m, fingerprint(m))
		default:
			r.Module = ""
			moved[m] = true
			isMoved = true
			c = own
		}
		c.Resources = append(c.Resources, r)
		if r.GetType() == typev1.ResourceType_RESOURCE_TYPE_FILE {
			files[r.GetPath()] = holding{comp: c, moved: isMoved}
		}
	}
	for _, p := range d.GetFilled() {
		h, ok := files[p]
		switch {
		case ok && h.moved, !ok:
			own.Filled = append(own.Filled, p)
		default:
			h.comp.Filled = append(h.comp.Filled, p)
		}
	}
	for _, m := range in.Runs {
		if fp := fingerprint(m); fp != "" {
			moduleComp(m, fp)
		}
	}
	out.Compositions[names.NodeKey(node)] = own
	for _, c := range out.Compositions {
		sort.SliceStable(c.Resources, func(i, j int) bool { return c.Resources[i].GetPath() < c.Resources[j].GetPath() })
		c.Filled = sortedUnique(c.Filled)
		c.Adoption = sortedUnique(c.Adoption)
	}
	for m := range moved {
		out.Moved = append(out.Moved, m)
	}
	slices.Sort(out.Moved)
	return out
}
