package apply

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"runtime/debug"
	"testing"

	"mesh.dev/internal/names"
	typev1 "mesh.dev/proto/mesh/type/v1"
	"mesh.dev/services/nodeengine/internal/state"
)

// TestAdoptingAPathOfAnotherType: the node's own composition adopts a path
// that holds a file while declaring a directory or a symlink there (found
// by FuzzApply, corpus entry crash-adopt-file-declared-directory). Prepare
// hashes what lies on a path only when a file is declared, so the adopted
// file's prior content gets no digest, and Stage's keepPrior panics slicing
// the empty digest (adoptedPath): the pass panics, the engine's supervisor
// stops it, and it panics again on every start — a crash loop an
// operator's adoption list can cause.
//
// It fails until an adopted file is hashed whatever type is declared (or
// the adoption is refused, naming the path and both types); either way
// nothing may panic and a kept prior must carry a valid digest.
func TestAdoptingAPathOfAnotherType(t *testing.T) {
	t.Parallel()
	for _, typ := range []typev1.ResourceType{typev1.ResourceType_RESOURCE_TYPE_DIRECTORY, typev1.ResourceType_RESOURCE_TYPE_SYMLINK} {
		t.Run(typ.String(), func(t *testing.T) {
			dir := t.TempDir()
			root := filepath.Join(dir, "root")
			if err := os.MkdirAll(filepath.Join(root, "srv"), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(root, "srv", "x"), []byte("the operator's file\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			a, err := New(Config{Root: root, Prefixes: []string{"/srv"}, StateDir: filepath.Join(dir, "state"), Logger: slog.New(slog.DiscardHandler)})
			if err != nil {
				t.Fatal(err)
			}
			defer a.Close()
			r := &typev1.Resource{Id: "net:x", Type: typ, Path: "/srv/x"}
			if typ == typev1.ResourceType_RESOURCE_TYPE_SYMLINK {
				r.Target = "y"
			}
			comp := &typev1.Composition{Node: "ace", Module: names.NodeModule, Resources: []*typev1.Resource{r}, Adoption: []string{"/srv/x"}}
			defer func() {
				if p := recover(); p != nil {
					t.Fatalf("adopting a file declared as a %v panics: %v\n%s", typ, p, debug.Stack())
				}
			}()
			prep := a.Prepare(Plan{Compositions: []*Composition{{Module: names.NodeModule, Key: "ace.node", Comp: comp, Env: &typev1.Envelope{}}},
				Ledger: map[string]*state.LedgerRecord{}})
			if len(prep.Failures) > 0 {
				return // refused: acceptable
			}
			if fails := a.Stage(context.Background(), prep, noFetch{}); len(fails) > 0 {
				return
			}
			for _, op := range prep.Ops() {
				if op.Record != nil && op.Record.Adopted != nil && op.Record.Adopted.Type == state.TypeFile && !names.ValidDigest(op.Record.Adopted.Digest) {
					t.Errorf("the adopted file's prior content is kept with digest %q", op.Record.Adopted.Digest)
				}
			}
		})
	}
}

// TestAdoptedPriorKeptWhileARecordHoldsIt: the prior content of an
// adopted file is kept by digest and removed after its restore. It was
// removed after every restore op, done or failed, and whoever else held
// it: a restore that failed (its record kept, to be tried again) and
// another adopted path of the same content lost their prior for good.
func TestAdoptedPriorKeptWhileARecordHoldsIt(t *testing.T) {
	a, root := testApplier(t)
	for _, n := range []string{"a", "b"} {
		writeFile(t, filepath.Join(root, "srv", n), "the same default\n")
	}
	prior := a.adoptedPath(names.Digest([]byte("the same default\n")))
	both := []*typev1.Resource{fileRes("node:a", "/srv/a", "ours\n"), fileRes("node:b", "/srv/b", "ours\n")}
	ledger, _ := applyPlan(t, a, map[string]*state.LedgerRecord{}, true, nodeComposition(both, "/srv/a", "/srv/b"))
	// a leaves: restored; b still holds the prior.
	ledger, _ = applyPlan(t, a, ledger, true, nodeComposition(both[1:]))
	if got := readFile(t, filepath.Join(root, "srv", "a")); got != "the same default\n" {
		t.Fatalf("/srv/a restored as %q", got)
	}
	if _, err := os.Stat(prior); err != nil {
		t.Fatalf("the prior /srv/b still holds is gone after /srv/a's restore: %v", err)
	}
	// b leaves too: restored, and the prior goes.
	applyPlan(t, a, ledger, true, nodeComposition(nil))
	if got := readFile(t, filepath.Join(root, "srv", "b")); got != "the same default\n" {
		t.Errorf("/srv/b restored as %q", got)
	}
	if _, err := os.Stat(prior); !os.IsNotExist(err) {
		t.Errorf("the prior is kept after its last restore: %v", err)
	}
}
