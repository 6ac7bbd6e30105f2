package apply

import (
	"os"
	"path/filepath"
	"slices"
	"testing"

	typev1 "mesh.dev/proto/mesh/type/v1"
	"mesh.dev/services/nodeengine/internal/state"
)

// Drift (DESIGN §7: "reported and corrected"): a managed file whose group
// was changed on disk is corrected (an OpMeta) and reported in the pass's
// Drift (GetStatus.drift, the "drift found and corrected" log and span),
// as an owner or mode change is.
func TestGroupDriftReported(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (the engine runs as root)")
	}
	a, root := testApplier(t)
	f := &typev1.Resource{Id: "net:conf", Type: typev1.ResourceType_RESOURCE_TYPE_FILE, Path: "/srv/conf", Mode: 0o640, Owner: "0", Group: "0",
		Content: &typev1.Resource_Inline{Inline: []byte("secret=1\n")}}
	comp := nodeComposition([]*typev1.Resource{f})
	ledger, _ := applyPlan(t, a, map[string]*state.LedgerRecord{}, true, comp)
	// Someone gives the group-readable file to another group.
	if err := os.Chown(filepath.Join(root, "srv", "conf"), 0, 12345); err != nil {
		t.Fatal(err)
	}
	prep := a.Prepare(Plan{Compositions: []*Composition{comp}, Ledger: ledger, Removals: true})
	corrected := false
	for _, op := range prep.Ops() {
		if op.Path == "/srv/conf" && op.Kind == state.OpMeta {
			corrected = true
		}
	}
	if !corrected {
		t.Fatalf("group drift not corrected: ops %+v", prep.Ops())
	}
	if !slices.Contains(prep.Drift, "/srv/conf") {
		t.Errorf("the group of /srv/conf drifted (0 -> 12345) and is corrected, but not reported: Drift %v", prep.Drift)
	}
}
