package apply

import (
	"os"
	"path/filepath"
	"slices"
	"testing"

	typev1 "mesh.dev/proto/mesh/type/v1"
	"mesh.dev/services/nodeengine/internal/state"
)

// A managed file grown huge (a sparse one costs whoever can write it
// nothing: truncate -s 1T) is not read whole to find it is not the
// declared content: its size already says so. Prepare reports the drift
// and plans the write without hashing it.
func TestPrepareDoesNotHashAFileOfAnotherSize(t *testing.T) {
	a, root := testApplier(t)
	comp := nodeComposition([]*typev1.Resource{fileRes("net:conf", "/srv/conf", "listen 80\n")})
	ledger, _ := applyPlan(t, a, map[string]*state.LedgerRecord{}, true, comp)
	p := filepath.Join(root, "srv", "conf")
	if err := os.Truncate(p, 1<<40); err != nil {
		t.Fatal(err)
	}
	r, err := os.OpenRoot(filepath.Join(root, "srv"))
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	rec := ledger["/srv/conf"]
	hash, sizes := contentSizes(rec, rec, false)
	dk, err := look(r, "conf", hash, sizes...)
	if err != nil || dk.digest != "" || dk.size != 1<<40 {
		t.Fatalf("look of a 1 TiB file for sizes %v: digest %q, size %d, %v (want it not hashed)", sizes, dk.digest, dk.size, err)
	}
	prep := a.Prepare(Plan{Compositions: []*Composition{comp}, Ledger: ledger, Removals: true})
	if len(prep.Failures) > 0 || !slices.Contains(prep.Drift, "/srv/conf") {
		t.Fatalf("failures %v, drift %v", prep.Failures, prep.Drift)
	}
	if i := slices.IndexFunc(prep.Ops(), func(op state.Op) bool { return op.Path == "/srv/conf" }); i < 0 || prep.Ops()[i].Kind != state.OpWrite {
		t.Fatalf("ops %+v, want a write of /srv/conf", prep.Ops())
	}
	// Of the declared size, it is hashed: content in place is found so.
	if err := os.WriteFile(p, []byte("listen 80\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if dk, _ := look(r, "conf", hash, sizes...); dk.digest != rec.Digest {
		t.Fatalf("a file of the declared size and content: digest %q, want %q", dk.digest, rec.Digest)
	}
}
