package apply

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	"mesh.dev/internal/names"
	typev1 "mesh.dev/proto/mesh/type/v1"
	"mesh.dev/services/nodeengine/internal/state"
)

func testApplier(t *testing.T) (*Applier, string) {
	dir := t.TempDir()
	root := filepath.Join(dir, "root")
	if err := os.MkdirAll(filepath.Join(root, "srv"), 0o755); err != nil {
		t.Fatal(err)
	}
	a, err := New(Config{Root: root, Prefixes: []string{"/srv"}, StateDir: filepath.Join(dir, "state"), Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(a.Close)
	return a, root
}

// applyPlan prepares, stages and executes a plan and returns the ledger.
func applyPlan(t *testing.T, a *Applier, ledger map[string]*state.LedgerRecord, removals bool, comps ...*Composition) (map[string]*state.LedgerRecord, *Result) {
	t.Helper()
	prep := a.Prepare(Plan{Compositions: comps, Ledger: ledger, Removals: removals})
	if len(prep.Failures) > 0 {
		t.Fatalf("prepare: %v", prep.Failures)
	}
	if f := a.Stage(context.Background(), prep, noFetch{}); len(f) > 0 {
		t.Fatalf("stage: %v", f)
	}
	res, err := a.Execute(context.Background(), prep, ledger, memStore{}, Meta{})
	if err != nil {
		t.Fatal(err)
	}
	return res.Ledger, res
}

func nodeComposition(res []*typev1.Resource, adoption ...string) *Composition {
	return &Composition{Module: names.NodeModule, Key: "ace.node", Env: &typev1.Envelope{},
		Comp: &typev1.Composition{Node: "ace", Module: names.NodeModule, Resources: res, Adoption: adoption}}
}

// An adopted path that held a directory and is declared as a file: when
// the resource leaves, the directory comes back (DESIGN §7 "adoption keeps
// the prior content ... and restores it"), the file over it removed. (The
// restore once only set mode and owner on what was there, failing on every
// pass.)
func TestAdoptedDirectoryRestoredAfterAFileOverIt(t *testing.T) {
	a, root := testApplier(t)
	if err := os.Mkdir(filepath.Join(root, "srv", "x"), 0o750); err != nil {
		t.Fatal(err)
	}
	f := &typev1.Resource{Id: "net:x", Type: typev1.ResourceType_RESOURCE_TYPE_FILE, Path: "/srv/x", Mode: 0o644,
		Content: &typev1.Resource_Inline{Inline: []byte("ours\n")}}
	ledger, res := applyPlan(t, a, map[string]*state.LedgerRecord{}, true, nodeComposition([]*typev1.Resource{f}, "/srv/x"))
	if len(res.Failed) > 0 {
		t.Fatalf("adopting an empty directory as a file failed: %v", res.Failed)
	}
	// The resource leaves.
	_, res = applyPlan(t, a, ledger, true, nodeComposition(nil))
	fi, err := os.Lstat(filepath.Join(root, "srv", "x"))
	if err != nil || !fi.IsDir() || len(res.Failed) > 0 {
		t.Fatalf("the adopted directory is not restored: lstat %v (dir=%v), failures %v", err, err == nil && fi.IsDir(), res.Failed)
	}
}

// "Data paths are never removed" (DESIGN §7), also after a relabel: a file
// under module db's data path that moves to the node's own composition
// (§5.1 rule 3; the node's own lists no data paths) keeps its ledger
// record's Data, so when the moved resource later leaves the file stays.
func TestDataPathStaysDataAfterAMove(t *testing.T) {
	a, root := testApplier(t)
	fp := "fp1:" + "0000000000000000000000000000000000000000000000000000000000000001"
	mod := &Composition{Module: "db", Key: "ace.db." + fp[4:], Env: &typev1.Envelope{},
		Comp: &typev1.Composition{Node: "ace", Module: "db", Fingerprint: fp, Data: true, DataPaths: []string{"/srv/db"},
			Resources: []*typev1.Resource{{Id: "db:seed", Module: "db", Type: typev1.ResourceType_RESOURCE_TYPE_FILE, Path: "/srv/db/seed", Mode: 0o644,
				Content: &typev1.Resource_Inline{Inline: []byte("seed\n")}}}}}
	ledger, _ := applyPlan(t, a, map[string]*state.LedgerRecord{}, true, mod)
	if !ledger["/srv/db/seed"].Data {
		t.Fatalf("not recorded as data: %+v", ledger["/srv/db/seed"])
	}
	// The module loses its fingerprint: its resource moves to the node's own.
	moved := &typev1.Resource{Id: "db:seed", Type: typev1.ResourceType_RESOURCE_TYPE_FILE, Path: "/srv/db/seed", Mode: 0o644,
		Content: &typev1.Resource_Inline{Inline: []byte("seed\n")}}
	ledger, _ = applyPlan(t, a, ledger, true, nodeComposition([]*typev1.Resource{moved}))
	// Later the moved resource leaves the node's own composition.
	applyPlan(t, a, ledger, true, nodeComposition(nil))
	if _, err := os.Stat(filepath.Join(root, "srv", "db", "seed")); err != nil {
		t.Fatalf("a file under module db's data path was removed after a move relabelled it: %v (ledger after move: %+v)", err, ledger["/srv/db/seed"])
	}
}

// A file declared setuid with an owner lands setuid, and the next pass
// finds no drift: Linux clears S_ISUID/S_ISGID of a regular file at every
// chown (root's too), so the owner is set before the mode.
func TestSetuidKeptWithAnOwner(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (the engine runs as root)")
	}
	a, root := testApplier(t)
	f := &typev1.Resource{Id: "net:helper", Type: typev1.ResourceType_RESOURCE_TYPE_FILE, Path: "/srv/helper", Mode: 0o4755, Owner: "0", Group: "0",
		Content: &typev1.Resource_Inline{Inline: []byte("#!/bin/sh\n")}}
	ledger, _ := applyPlan(t, a, map[string]*state.LedgerRecord{}, true, nodeComposition([]*typev1.Resource{f}))
	fi, err := os.Stat(filepath.Join(root, "srv", "helper"))
	if err != nil {
		t.Fatal(err)
	}
	prep := a.Prepare(Plan{Compositions: []*Composition{nodeComposition([]*typev1.Resource{f})}, Ledger: ledger, Removals: true})
	if fi.Mode()&os.ModeSetuid == 0 {
		t.Fatalf("declared mode 4755, on disk %v; the next pass reports drift %v", fi.Mode(), prep.Drift)
	}
}
