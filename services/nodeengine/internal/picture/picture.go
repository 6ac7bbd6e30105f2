// Package picture holds the pure parts of a node engine's pass (DESIGN.md
// §7 "Each pass"): the fingerprints needed, the module picture, the holds of
// wanted modules with their words, and the build records and artifact
// references derived from an entry and a want.
package picture

import (
	"fmt"
	"sort"
	"strconv"
	"strings"

	"mesh.dev/internal/names"
	catalogv1 "mesh.dev/proto/mesh/catalog/v1"
	composerv1 "mesh.dev/proto/mesh/composer/v1"
	nodeenginev1 "mesh.dev/proto/mesh/nodeengine/v1"
	typev1 "mesh.dev/proto/mesh/type/v1"
)

// Entry is what the pass knows of one fingerprint's catalog entry.
type Entry struct {
	State    nodeenginev1.EntryState
	Entry    *catalogv1.Entry
	Manifest *typev1.ModuleManifest
	// Error is the last failure asking for it.
	Error string
}

// Lookup returns what is known of a fingerprint's entry.
type Lookup func(fp string) (Entry, bool)

// Needed returns the fingerprints a pass needs, sorted and unique: those the
// wants name (the node's own want names none) and those heard running (not
// stopped).
func Needed(wants []*typev1.Want, heard *composerv1.Heard) []string {
	set := map[string]bool{}
	for _, w := range wants {
		if w.GetModule() != names.NodeModule && names.HasFingerprint(w.GetFingerprint()) {
			set[w.GetFingerprint()] = true
		}
	}
	for _, m := range heard.GetModules() {
		for _, n := range m.GetNodes() {
			if !n.GetStopped() && names.HasFingerprint(n.GetFingerprint()) {
				set[n.GetFingerprint()] = true
			}
		}
	}
	out := make([]string, 0, len(set))
	for fp := range set {
		out = append(out, fp)
	}
	sort.Strings(out)
	return out
}

// VersionUnknown is the version of a module whose entry is not held.
const VersionUnknown = "0"

// Lay returns the module picture: which module runs at which fingerprint on
// which nodes. Heard nodes are laid in name order, then this node's wants,
// which win (a want replaces what was heard of this node for its module).
// One row per module and fingerprint, sorted by module then fingerprint; a
// module whose entry is not held has version "0".
func Lay(node string, wants []*typev1.Want, heard *composerv1.Heard, lookup Lookup) []*nodeenginev1.PictureModule {
	// module → node → fingerprint
	runs := map[string]map[string]string{}
	type heardNode struct{ module, node, fp string }
	var hs []heardNode
	for _, m := range heard.GetModules() {
		for _, n := range m.GetNodes() {
			if n.GetStopped() || names.CheckModule(m.GetModule()) != nil {
				continue
			}
			hs = append(hs, heardNode{m.GetModule(), n.GetNode(), n.GetFingerprint()})
		}
	}
	sort.SliceStable(hs, func(i, j int) bool { return hs[i].node < hs[j].node })
	for _, h := range hs {
		if runs[h.module] == nil {
			runs[h.module] = map[string]string{}
		}
		runs[h.module][h.node] = h.fp
	}
	wanted := map[string]string{}
	for _, w := range wants {
		if w.GetModule() == names.NodeModule {
			continue
		}
		if runs[w.GetModule()] == nil {
			runs[w.GetModule()] = map[string]string{}
		}
		runs[w.GetModule()][node] = w.GetFingerprint()
		wanted[w.GetModule()] = w.GetFingerprint()
	}
	var out []*nodeenginev1.PictureModule
	for module, byNode := range runs {
		rows := map[string]*nodeenginev1.PictureModule{}
		for n, fp := range byNode {
			r := rows[fp]
			if r == nil {
				r = &nodeenginev1.PictureModule{Module: module, Fingerprint: fp, Version: VersionUnknown}
				if e, ok := lookup(fp); ok && e.State == nodeenginev1.EntryState_ENTRY_STATE_ANSWERED && e.Manifest.GetVersion() != "" {
					r.Version = e.Manifest.GetVersion()
				}
				rows[fp] = r
			}
			r.Nodes = append(r.Nodes, n)
			if n == node && wanted[module] == fp {
				r.Wanted = true
			}
		}
		for _, r := range rows {
			sort.Strings(r.Nodes)
			out = append(out, r)
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].GetModule() != out[j].GetModule() {
			return out[i].GetModule() < out[j].GetModule()
		}
		return out[i].GetFingerprint() < out[j].GetFingerprint()
	})
	return out
}

// Hold codes.
const (
	EntryAsked   = composerv1.ReasonCode_REASON_CODE_ENTRY_ASKED
	EntryMissing = composerv1.ReasonCode_REASON_CODE_ENTRY_MISSING
	PartMissing  = composerv1.ReasonCode_REASON_CODE_PART_MISSING
	NeedUnmet    = composerv1.ReasonCode_REASON_CODE_NEED_UNMET
)

// Holds returns why each wanted module cannot be applied yet, by module:
// ENTRY_ASKED, ENTRY_MISSING, PART_MISSING or NEED_UNMET, the first that
// applies. The node's own want is never held.
func Holds(node string, wants []*typev1.Want, pic []*nodeenginev1.PictureModule, lookup Lookup) []*nodeenginev1.EngineHold {
	var out []*nodeenginev1.EngineHold
	for _, w := range wants {
		if w.GetModule() == names.NodeModule {
			continue
		}
		if h := holdOf(node, w, pic, lookup); h != nil {
			out = append(out, h)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].GetModule() < out[j].GetModule() })
	return out
}

func holdOf(node string, w *typev1.Want, pic []*nodeenginev1.PictureModule, lookup Lookup) *nodeenginev1.EngineHold {
	fp := w.GetFingerprint()
	e, ok := lookup(fp)
	if !ok || e.State == nodeenginev1.EntryState_ENTRY_STATE_ASKED || e.State == nodeenginev1.EntryState_ENTRY_STATE_UNSPECIFIED {
		words := fmt.Sprintf("entry %s asked of the catalog, not answered", fp)
		if e.Error != "" {
			words += ": " + e.Error
		}
		return &nodeenginev1.EngineHold{Module: w.GetModule(), Code: EntryAsked, Words: words}
	}
	if e.State == nodeenginev1.EntryState_ENTRY_STATE_NOT_FOUND {
		return &nodeenginev1.EngineHold{Module: w.GetModule(), Code: EntryMissing,
			Words: fmt.Sprintf("the catalog holds no entry of fingerprint %s", fp)}
	}
	if e.Entry.GetModule() != w.GetModule() {
		// Checked when kept; a want naming another module's fingerprint
		// is a want mismatch, never applied.
		return &nodeenginev1.EngineHold{Module: w.GetModule(), Code: composerv1.ReasonCode_REASON_CODE_WANT_MISMATCH,
			Words: fmt.Sprintf("fingerprint %s is an entry of module %q, not %q", fp, e.Entry.GetModule(), w.GetModule())}
	}
	if missing := MissingParts(e.Entry, w); len(missing) > 0 {
		return &nodeenginev1.EngineHold{Module: w.GetModule(), Code: PartMissing,
			Words: fmt.Sprintf("the want gives no digest for %s", strings.Join(missing, ", "))}
	}
	var unmet []string
	for _, n := range e.Manifest.GetNeeds() {
		if !Meets(node, n, pic) {
			s := "needs " + n.GetModule()
			if n.GetMinVersion() != "" {
				s += " >= " + n.GetMinVersion()
			}
			if len(n.GetSelector().GetMatchLabels()) > 0 {
				s += " on nodes " + selectorString(n.GetSelector())
			}
			unmet = append(unmet, s)
		}
	}
	if len(unmet) > 0 {
		return &nodeenginev1.EngineHold{Module: w.GetModule(), Code: NeedUnmet,
			Words: strings.Join(unmet, "; ") + ": no module of the picture meets it"}
	}
	return nil
}

func selectorString(s *typev1.LabelSelector) string {
	keys := make([]string, 0, len(s.GetMatchLabels()))
	for k := range s.GetMatchLabels() {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = k + "=" + s.GetMatchLabels()[k]
	}
	return strings.Join(parts, ",")
}

// Meets reports whether a module of the picture meets a need: a row of the
// needed module on some node, at or above min_version when it is set. This
// node's own rows count only for a need without a selector: the engine does
// not know its labels, and the composer bounds heard nodes by the selector.
func Meets(node string, n *typev1.Need, pic []*nodeenginev1.PictureModule) bool {
	for _, r := range pic {
		if r.GetModule() != n.GetModule() {
			continue
		}
		counts := false
		for _, on := range r.GetNodes() {
			if on != node || len(n.GetSelector().GetMatchLabels()) == 0 {
				counts = true
				break
			}
		}
		if !counts {
			continue
		}
		if n.GetMinVersion() == "" || CompareVersions(r.GetVersion(), n.GetMinVersion()) >= 0 {
			return true
		}
	}
	return false
}

// CompareVersions compares dot-separated numbers numerically ("1.10" >
// "1.9", "1.2" == "1.2.0"); a part that is not a number counts as 0.
func CompareVersions(a, b string) int {
	pa, pb := strings.Split(a, "."), strings.Split(b, ".")
	for i := 0; i < len(pa) || i < len(pb); i++ {
		var x, y uint64
		if i < len(pa) {
			x, _ = strconv.ParseUint(pa[i], 10, 64)
		}
		if i < len(pb) {
			y, _ = strconv.ParseUint(pb[i], 10, 64)
		}
		switch {
		case x < y:
			return -1
		case x > y:
			return 1
		}
	}
	return 0
}

// MissingParts returns the sorted artifact refs of an entry that the want
// gives no digest for.
func MissingParts(e *catalogv1.Entry, w *typev1.Want) []string {
	have := map[string]bool{}
	for _, p := range w.GetParts() {
		if names.ValidDigest(p.GetDigest()) {
			have[p.GetRef()] = true
		}
	}
	var missing []string
	for _, a := range e.GetArtifacts() {
		if !have[a.GetRef()] {
			missing = append(missing, a.GetRef())
		}
	}
	sort.Strings(missing)
	return missing
}

// ArtifactRef is one artifact of a build record.
type ArtifactRef struct {
	// Ref is "kind:name".
	Ref, Kind, Name string
	Digest          string
	Size            int64
	// URL is artifact-store://<module>/<name>/blobs/<digest>.
	URL string
}

// BuildRecord is what the engine knows of a module's build: made from the
// entry's artifact declarations and the want's parts only (the engine never
// asks the catalog for the build itself).
type BuildRecord struct {
	Module, Fingerprint string
	Artifacts           []ArtifactRef
}

// Build returns the build record of a want, from its entry's artifacts and
// the want's parts; an artifact the want gives no digest for is left out
// (see MissingParts).
func Build(e *catalogv1.Entry, w *typev1.Want) BuildRecord {
	parts := map[string]*typev1.Artifact{}
	for _, p := range w.GetParts() {
		parts[p.GetRef()] = p
	}
	b := BuildRecord{Module: w.GetModule(), Fingerprint: w.GetFingerprint()}
	for _, a := range e.GetArtifacts() {
		p, ok := parts[a.GetRef()]
		if !ok || !names.ValidDigest(p.GetDigest()) {
			continue
		}
		kind, name, _ := strings.Cut(a.GetRef(), ":")
		if a.GetKind() != "" {
			kind = a.GetKind()
		}
		b.Artifacts = append(b.Artifacts, ArtifactRef{
			Ref: a.GetRef(), Kind: kind, Name: name, Digest: p.GetDigest(), Size: p.GetSize(),
			URL: ArtifactURL(w.GetModule(), a.GetRef(), p.GetDigest()),
		})
	}
	sort.Slice(b.Artifacts, func(i, j int) bool { return b.Artifacts[i].Ref < b.Artifacts[j].Ref })
	return b
}

// ArtifactURL returns the reference of an artifact:
// artifact-store://<module>/<name>/blobs/<digest>, name being what follows
// "kind:" in the ref.
func ArtifactURL(module, ref, digest string) string {
	_, name, ok := strings.Cut(ref, ":")
	if !ok {
		name = ref
	}
	return "artifact-store://" + module + "/" + name + "/blobs/" + digest
}
