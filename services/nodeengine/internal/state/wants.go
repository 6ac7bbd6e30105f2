package state

import (
	"sort"
	"time"

	"google.golang.org/protobuf/proto"

	"mesh.dev/internal/names"
	typev1 "mesh.dev/proto/mesh/type/v1"
)

// WantChanges is what keeping the wants of a verified manifest changes in
// the wants section (DESIGN.md §7).
type WantChanges struct {
	// Next are the kept wants once the changes are written, by module.
	Next map[string]KeptWant
	// Put are the modules whose record is written, sorted: a want that is
	// new or changed, or whose last write failed.
	Put []string
	// Delete are the modules no want names any more, sorted.
	Delete []string
}

// PlanWants returns the changes that make wants the kept wants. A want's
// since is when this node first kept a want of its module at its
// fingerprint: kept across restarts and across changes of the want at the
// same fingerprint (new parts, a new composition), reset to now when the
// fingerprint changes. A record is rewritten only when the want or its
// since changed, or when unwritten says its last write failed. The node's
// own want is never kept.
func PlanWants(kept map[string]KeptWant, wants []*typev1.Want, now time.Time, unwritten func(module string) bool) WantChanges {
	c := WantChanges{Next: map[string]KeptWant{}}
	for _, w := range wants {
		m := w.GetModule()
		if m == names.NodeModule {
			continue
		}
		old, had := kept[m]
		since := now
		if had && old.Want.GetFingerprint() == w.GetFingerprint() && !old.Since.IsZero() {
			since = old.Since
		}
		c.Next[m] = KeptWant{Want: w, Since: since}
		if had && proto.Equal(old.Want, w) && old.Since.Equal(since) && (unwritten == nil || !unwritten(m)) {
			continue
		}
		c.Put = append(c.Put, m)
	}
	for m := range kept {
		if _, ok := c.Next[m]; !ok {
			c.Delete = append(c.Delete, m)
		}
	}
	sort.Strings(c.Put)
	sort.Strings(c.Delete)
	return c
}

// KeepWants writes the changes, every put before the deletes, so a stop in
// between leaves a superset of the wants, never a want missing. It returns
// the failed writes by module (each put on its own, the deletes together);
// the caller says each once and retries it at its next pass.
func KeepWants(s Store, c WantChanges) map[string]error {
	failed := map[string]error{}
	for _, m := range c.Put {
		if err := s.PutWant(m, c.Next[m]); err != nil {
			failed[m] = err
		}
	}
	if len(c.Delete) > 0 {
		if err := s.DeleteWants(c.Delete); err != nil {
			for _, m := range c.Delete {
				failed[m] = err
			}
		}
	}
	return failed
}
