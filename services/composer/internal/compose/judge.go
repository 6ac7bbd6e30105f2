package compose

import (
	"fmt"
	"slices"
	"strings"

	"google.golang.org/protobuf/proto"

	"mesh.dev/internal/names"
	composerv1 "mesh.dev/proto/mesh/composer/v1"
	typev1 "mesh.dev/proto/mesh/type/v1"
)

// Judged is a judgement of a composition against what the node applied.
type Judged struct {
	Judgement    composerv1.Judgement
	Words        string
	UserListOnly bool
	// Against is the digest judged against; empty when NEW.
	Against string
}

// Applied is what a node applied that a new composition is judged against.
type Applied struct {
	// Module is the node's applied composition of the same module, if any.
	Module       *typev1.Composition
	ModuleDigest string
	// Own is the node's applied own composition, if any: when the module
	// has no applied composition, its resources that name the module (a
	// module leaving <node>.node) are the base.
	Own       *typev1.Composition
	OwnDigest string
	// ModuleParts and NextParts give, by artifact ref, the digests the
	// builds of Module's and the new composition's fingerprints hold: an
	// artifact resource names its bytes by ref, so two fingerprints with
	// equal resources can still ship other bytes. Nil when not known; an
	// artifact of another fingerprint whose digest is not known on either
	// side is judged changed.
	ModuleParts, NextParts map[string]string
}

// artifactChanged reports whether the artifact resource r ships other bytes
// than o, on the same path and ref (differs compares refs only).
func artifactChanged(o, r *typev1.Resource, next *typev1.Composition, applied Applied) bool {
	oa, ok1 := o.GetContent().(*typev1.Resource_Artifact)
	ra, ok2 := r.GetContent().(*typev1.Resource_Artifact)
	if !ok1 || !ok2 || oa.Artifact != ra.Artifact || applied.Module == nil || applied.Module.GetFingerprint() == next.GetFingerprint() {
		return false
	}
	was, now := applied.ModuleParts[ra.Artifact], applied.NextParts[ra.Artifact]
	return was == "" || now == "" || was != now
}

// Judge judges next against the applied composition of its module, or else
// against the applied own composition's resources whose ids name the module,
// or else calls it NEW (DESIGN.md §5.3). A difference that touches a data path
// (of either composition) is DATA, and so is a change of the module's data
// paths themselves, even with the same resources: the engine never removes
// what is under a data path, so dropping one exposes data to removal and
// adding one changes what a later removal keeps. Otherwise only additions
// ADDS; only removals REMOVES; anything else CHANGES.
func Judge(next *typev1.Composition, applied Applied) Judged {
	var base []*typev1.Resource
	var baseFilled, baseData []string
	var against string
	switch {
	case applied.Module != nil:
		base, baseFilled, against = applied.Module.GetResources(), applied.Module.GetFilled(), applied.ModuleDigest
		baseData = applied.Module.GetDataPaths()
	case applied.Own != nil && ownNames(applied.Own, next.GetModule()):
		for _, r := range applied.Own.GetResources() {
			if names.ModuleOfID(r.GetId()) == next.GetModule() {
				base = append(base, r)
			}
		}
		// Filled paths of those resources moved with them.
		paths := map[string]bool{}
		for _, r := range base {
			paths[r.GetPath()] = true
		}
		for _, p := range applied.Own.GetFilled() {
			if paths[p] {
				baseFilled = append(baseFilled, p)
			}
		}
		against = applied.OwnDigest
	default:
		n := len(next.GetResources())
		return Judged{Judgement: composerv1.Judgement_JUDGEMENT_NEW, Words: fmt.Sprintf("new: %d %s", n, plural(n, "path"))}
	}

	old := map[string]*typev1.Resource{}
	for _, r := range base {
		old[r.GetPath()] = r
	}
	var added, removed, changed []string
	userListOnly := true
	changes := map[string][]string{}
	seen := map[string]bool{}
	for _, r := range next.GetResources() {
		p := r.GetPath()
		seen[p] = true
		o, ok := old[p]
		if !ok {
			added = append(added, p)
			userListOnly = userListOnly && r.GetUserList()
			continue
		}
		what := differs(o, r)
		if !slices.Contains(what, "content") && artifactChanged(o, r, next, applied) {
			what = append(what, "artifact "+r.GetArtifact())
		}
		if len(what) > 0 {
			changed = append(changed, p)
			changes[p] = what
			userListOnly = userListOnly && r.GetUserList() && o.GetUserList()
		}
	}
	for _, r := range base {
		if !seen[r.GetPath()] {
			removed = append(removed, r.GetPath())
			userListOnly = userListOnly && r.GetUserList()
		}
	}
	fa, fr := diffLists(baseFilled, next.GetFilled())
	for _, p := range fa {
		added = append(added, p+" (filled)")
		userListOnly = false
	}
	for _, p := range fr {
		removed = append(removed, p+" (filled)")
		userListOnly = false
	}
	// Leaving the node's own composition, the module had no data paths
	// declared: its own are judged by what they touch, not as a change.
	var da, dr []string
	if applied.Module != nil {
		da, dr = diffLists(baseData, next.GetDataPaths())
	}
	if len(added)+len(removed)+len(changed)+len(da)+len(dr) == 0 {
		return Judged{Judgement: composerv1.Judgement_JUDGEMENT_SAME, Words: "same resources", Against: against}
	}
	j := Judged{Against: against, UserListOnly: userListOnly}
	switch {
	case len(changed) == 0 && len(removed) == 0:
		j.Judgement = composerv1.Judgement_JUDGEMENT_ADDS
	case len(changed) == 0 && len(added) == 0:
		j.Judgement = composerv1.Judgement_JUDGEMENT_REMOVES
	default:
		j.Judgement = composerv1.Judgement_JUDGEMENT_CHANGES
	}
	var words []string
	if dataPath := touchesData(union(next.GetDataPaths(), baseData), added, removed, changed); dataPath != "" {
		j.Judgement = composerv1.Judgement_JUDGEMENT_DATA
		words = append(words, "touches data path "+dataPath)
	}
	if len(da)+len(dr) > 0 {
		j.Judgement, j.UserListOnly = composerv1.Judgement_JUDGEMENT_DATA, false
		var parts []string
		if len(da) > 0 {
			parts = append(parts, "adds "+listWords(da))
		}
		if len(dr) > 0 {
			parts = append(parts, "removes "+listWords(dr))
		}
		words = append(words, "data paths: "+strings.Join(parts, ", "))
	}
	if len(changed) > 0 {
		parts := make([]string, len(changed))
		for i, p := range changed {
			parts[i] = p + " (" + strings.Join(changes[p], ", ") + ")"
		}
		words = append(words, "changes "+listWords(parts))
	}
	if len(added) > 0 {
		words = append(words, "adds "+listWords(added))
	}
	if len(removed) > 0 {
		words = append(words, "removes "+listWords(removed))
	}
	j.Words = strings.Join(words, "; ")
	return j
}

func ownNames(own *typev1.Composition, module string) bool {
	for _, r := range own.GetResources() {
		if names.ModuleOfID(r.GetId()) == module {
			return true
		}
	}
	return false
}

// differs lists what differs between two resources on one path, ignoring
// id and module (a resource relabelled between compositions is the same).
func differs(a, b *typev1.Resource) []string {
	var what []string
	if a.GetType() != b.GetType() {
		what = append(what, "type")
	}
	if !proto.Equal(contentOf(a), contentOf(b)) {
		what = append(what, "content")
	}
	if a.GetTarget() != b.GetTarget() {
		what = append(what, "target")
	}
	if a.GetMode() != b.GetMode() {
		what = append(what, fmt.Sprintf("mode %04o→%04o", a.GetMode(), b.GetMode()))
	}
	if a.GetOwner() != b.GetOwner() || a.GetGroup() != b.GetGroup() {
		what = append(what, "owner")
	}
	if a.GetUserList() != b.GetUserList() {
		what = append(what, "user list")
	}
	return what
}

// contentOf returns a resource holding only the content, so inline bytes
// and an object of the same bytes compare by what they are.
func contentOf(r *typev1.Resource) *typev1.Resource {
	c := &typev1.Resource{}
	switch x := r.GetContent().(type) {
	case *typev1.Resource_Inline:
		// Compare inline and object content by digest: moving a file to
		// the object store is not a change.
		c.Content = &typev1.Resource_Object{Object: &typev1.ObjectRef{Digest: names.Digest(x.Inline), Size: int64(len(x.Inline))}}
	case *typev1.Resource_Object:
		c.Content = &typev1.Resource_Object{Object: &typev1.ObjectRef{Digest: x.Object.GetDigest(), Size: x.Object.GetSize()}}
	case *typev1.Resource_Artifact:
		c.Content = x
	}
	return c
}

func diffLists(old, next []string) (added, removed []string) {
	for _, p := range next {
		if !slices.Contains(old, p) {
			added = append(added, p)
		}
	}
	for _, p := range old {
		if !slices.Contains(next, p) {
			removed = append(removed, p)
		}
	}
	return added, removed
}

// union returns the sorted paths of both lists, each once.
func union(a, b []string) []string {
	out := append(append([]string(nil), a...), b...)
	slices.Sort(out)
	return slices.Compact(out)
}

func touchesData(dataPaths []string, lists ...[]string) string {
	for _, list := range lists {
		for _, p := range list {
			p = strings.TrimSuffix(p, " (filled)")
			for _, dp := range dataPaths {
				if names.Within(p, dp) || names.Within(dp, p) {
					return dp
				}
			}
		}
	}
	return ""
}

// listWords names up to three items and counts the rest.
func listWords(items []string) string {
	if len(items) <= 3 {
		return strings.Join(items, ", ")
	}
	return fmt.Sprintf("%s and %d more", strings.Join(items[:3], ", "), len(items)-3)
}

func plural(n int, word string) string {
	if n == 1 {
		return word
	}
	return word + "s"
}
