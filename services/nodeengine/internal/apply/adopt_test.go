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
