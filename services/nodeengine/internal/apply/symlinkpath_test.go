package apply

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"mesh.dev/internal/names"
	typev1 "mesh.dev/proto/mesh/type/v1"
	"mesh.dev/services/nodeengine/internal/state"
)

// swapForSymlink moves the directory at host path dir aside and puts a
// symlink to target in its place: what a local user owning its parent can
// do at any time.
func swapForSymlink(t *testing.T, dir, target string) {
	t.Helper()
	if err := os.Rename(dir, dir+".moved"); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(target, dir); err != nil {
		t.Fatal(err)
	}
}

// TestPrepareRefusesAPathThroughASymlink: no managed path may pass through
// a symlink, not even a relative one that stays in the prefix. os.Root
// follows one, so a local user owning /srv/app could make conf ->
// ../other and the engine (root) would drift-correct, write and later
// delete /srv/other/x, keyed in its ledger as /srv/app/conf/x; and a
// managed symlink /srv/here -> . let a symlink /srv/here/l ->
// ../etc/shadow be judged from its declared path while it landed at
// /srv/l, outside every prefix.
func TestPrepareRefusesAPathThroughASymlink(t *testing.T) {
	for _, tt := range []struct {
		name string
		// first is applied, then break changes the disk, then second is
		// prepared and must be refused.
		first, second []*typev1.Resource
		breakIt       func(t *testing.T, root string)
		words         string
	}{
		{
			name:    "a directory swapped for a symlink, drift corrected",
			first:   []*typev1.Resource{fileRes("node:x", "/srv/app/conf/x", "managed\n")},
			second:  []*typev1.Resource{fileRes("node:x", "/srv/app/conf/x", "managed\n")},
			breakIt: func(t *testing.T, root string) { swapForSymlink(t, filepath.Join(root, "srv/app/conf"), "../other") },
			words:   "node:x: /srv/app/conf/x passes through the symlink /srv/app/conf -> ../other: a path through a symlink would name another path",
		},
		{
			name:   "a managed symlink to its own directory",
			first:  []*typev1.Resource{linkRes("node:here", "/srv/here", ".")},
			second: []*typev1.Resource{linkRes("node:here", "/srv/here", "."), linkRes("node:l", "/srv/here/l", "../etc/shadow")},
			words:  "node:l: /srv/here/l passes through the symlink /srv/here -> .: a path through a symlink would name another path",
		},
	} {
		t.Run(tt.name, func(t *testing.T) {
			a, root := testApplier(t)
			writeFile(t, filepath.Join(root, "srv/other/x"), "precious\n")
			ledger, _ := applyPlan(t, a, map[string]*state.LedgerRecord{}, true, nodeComposition(tt.first))
			if tt.breakIt != nil {
				tt.breakIt(t, root)
			}
			before := tree(t, root)
			prep := a.Prepare(Plan{Compositions: []*Composition{nodeComposition(tt.second)}, Ledger: ledger, Removals: true})
			if len(prep.Failures) == 0 {
				// Not refused: show what the apply does.
				a.Stage(context.Background(), prep, noFetch{})
				a.Execute(context.Background(), prep, ledger, memStore{}, Meta{})
			}
			sameTree(t, "the apply", before, tree(t, root))
			wantFailure(t, "prepare", prep.Failures[names.NodeModule], codeThroughSymlink, tt.words)
			if got := readFile(t, filepath.Join(root, "srv/other/x")); got != "precious\n" {
				t.Errorf("/srv/other/x holds %q", got)
			}
		})
	}
}

// TestPrepareRefusesAPathUnderADeclaredSymlink: a directory today that a
// new version declares a symlink, with a path under it: once applied, the
// path would pass through the symlink. Prepare refused this only when the
// directory was missing; an existing one was replaced by the symlink (its
// op running first) before the op under it failed.
func TestPrepareRefusesAPathUnderADeclaredSymlink(t *testing.T) {
	a, root := testApplier(t)
	ledger, _ := applyPlan(t, a, map[string]*state.LedgerRecord{}, true, nodeComposition([]*typev1.Resource{dirRes("node:here", "/srv/here", 0o755)}))
	before := tree(t, root)
	second := []*typev1.Resource{linkRes("node:here", "/srv/here", "."), linkRes("node:l", "/srv/here/l", "../etc/shadow")}
	prep := a.Prepare(Plan{Compositions: []*Composition{nodeComposition(second)}, Ledger: ledger, Removals: true})
	if len(prep.Failures) == 0 {
		a.Stage(context.Background(), prep, noFetch{})
		a.Execute(context.Background(), prep, ledger, memStore{}, Meta{})
	}
	sameTree(t, "the apply", before, tree(t, root))
	wantFailure(t, "prepare", prep.Failures[names.NodeModule], codeWrite, "node:l: /srv/here is declared as a symlink by node:here, yet /srv/here/l lies under it")
}

// TestRemovalThroughASymlinkLeavesItInPlace: a managed path whose
// directory became a symlink is forgotten when it leaves, not removed
// through the symlink (which removed /srv/other/x).
func TestRemovalThroughASymlinkLeavesItInPlace(t *testing.T) {
	a, root := testApplier(t)
	writeFile(t, filepath.Join(root, "srv/other/x"), "precious\n")
	ledger, _ := applyPlan(t, a, map[string]*state.LedgerRecord{}, true, nodeComposition([]*typev1.Resource{fileRes("node:x", "/srv/app/conf/x", "managed\n")}))
	swapForSymlink(t, filepath.Join(root, "srv/app/conf"), "../other")
	before := tree(t, root)
	prep := prepareStaged(t, a, Plan{Compositions: []*Composition{nodeComposition(nil)}, Ledger: ledger, Removals: true})
	res, err := a.Execute(context.Background(), prep, ledger, memStore{}, Meta{})
	if err != nil || len(res.Failed) > 0 {
		t.Fatalf("execute: %v %v", err, res.Failed)
	}
	sameTree(t, "the removal", before, tree(t, root))
	if _, ok := res.Ledger["/srv/app/conf/x"]; ok {
		t.Errorf("/srv/app/conf/x is still in the ledger")
	}
	want := "/srv/app/conf/x now passes through the symlink /srv/app/conf -> ../other; left in place"
	found := false
	for _, n := range prep.Notes[names.NodeModule] {
		found = found || n == want
	}
	if !found {
		t.Errorf("notes %q do not say %q", prep.Notes[names.NodeModule], want)
	}
}

// TestOpsNeverGoThroughASymlink: the disk may change between Prepare and
// Execute (Stage can take minutes) or before a journal's replay. Every
// op reaches its directory one component at a time and refuses a symlink
// on the way: none of them writes, changes or removes what lies in
// /srv/other when /srv/app/conf became a symlink to it after Prepare.
func TestOpsNeverGoThroughASymlink(t *testing.T) {
	base := func() []*typev1.Resource {
		return []*typev1.Resource{
			fileRes("node:a", "/srv/app/conf/a", "ours\n"), // adopted
			dirRes("node:d", "/srv/app/conf/d", 0o755),
			linkRes("node:l", "/srv/app/conf/l", "x"),
			fileRes("node:x", "/srv/app/conf/x", "managed\n"),
		}
	}
	for _, tt := range []struct {
		name   string
		second func(rs []*typev1.Resource) []*typev1.Resource
		path   string
	}{
		{"write", func(rs []*typev1.Resource) []*typev1.Resource {
			rs[3] = fileRes("node:x", "/srv/app/conf/x", "changed\n")
			return rs
		}, "/srv/app/conf/x"},
		{"meta", func(rs []*typev1.Resource) []*typev1.Resource { rs[1].Mode = 0o700; return rs }, "/srv/app/conf/d"},
		{"mkdir", func(rs []*typev1.Resource) []*typev1.Resource {
			return append(rs, dirRes("node:n", "/srv/app/conf/n", 0o755))
		}, "/srv/app/conf/n"},
		{"symlink", func(rs []*typev1.Resource) []*typev1.Resource { rs[2].Target = "d"; return rs }, "/srv/app/conf/l"},
		{"remove", func(rs []*typev1.Resource) []*typev1.Resource { return rs[:3] }, "/srv/app/conf/x"},
		{"restore", func(rs []*typev1.Resource) []*typev1.Resource { return rs[1:] }, "/srv/app/conf/a"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			a, root := testApplier(t)
			writeFile(t, filepath.Join(root, "srv/app/conf/a"), "theirs\n")
			for _, n := range []string{"a", "x", "n"} {
				writeFile(t, filepath.Join(root, "srv/other", n), "precious "+n+"\n")
			}
			if err := os.Mkdir(filepath.Join(root, "srv/other/d"), 0o750); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink("a", filepath.Join(root, "srv/other/l")); err != nil {
				t.Fatal(err)
			}
			ledger, _ := applyPlan(t, a, map[string]*state.LedgerRecord{}, true, nodeComposition(base(), "/srv/app/conf/a"))
			prep := prepareStaged(t, a, Plan{Compositions: []*Composition{nodeComposition(tt.second(base()))}, Ledger: ledger, Removals: true})
			swapForSymlink(t, filepath.Join(root, "srv/app/conf"), "../other")
			before := tree(t, root)
			res, err := a.Execute(context.Background(), prep, ledger, memStore{}, Meta{})
			if err != nil {
				t.Fatal(err)
			}
			sameTree(t, "Execute", before, tree(t, root))
			wantFailure(t, "execute", res.Failed[names.NodeModule], codeThroughSymlink,
				tt.path+" passes through the symlink /srv/app/conf -> ../other: a path through a symlink would name another path")
			if res.Ledger[tt.path] != ledger[tt.path] {
				t.Errorf("the ledger record of %s changed: %+v", tt.path, res.Ledger[tt.path])
			}
			if rec := ledger[tt.path]; rec != nil && rec.Adopted != nil {
				// The restore is tried again: its prior is kept.
				if _, err := os.Stat(a.adoptedPath(rec.Adopted.Digest)); err != nil {
					t.Errorf("the prior content of %s is gone: %v", tt.path, err)
				}
			}
		})
	}
}

// TestOpsCatchADirectorySwappedWhileOpened: a directory swapped for a
// symlink between the Lstat that finds a directory and the open (which
// os.Root follows) is caught: the directory opened is not the one looked
// at. (A symlink that leaves the directory's parent is refused by
// os.Root itself; this one stays in it.)
func TestOpsCatchADirectorySwappedWhileOpened(t *testing.T) {
	a, root := testApplier(t)
	writeFile(t, filepath.Join(root, "srv/app/other/x"), "precious\n")
	ledger, _ := applyPlan(t, a, map[string]*state.LedgerRecord{}, true, nodeComposition([]*typev1.Resource{fileRes("node:x", "/srv/app/conf/x", "managed\n")}))
	prep := prepareStaged(t, a, Plan{Compositions: []*Composition{nodeComposition([]*typev1.Resource{fileRes("node:x", "/srv/app/conf/x", "changed\n")})}, Ledger: ledger, Removals: true})
	var before map[string]string
	openDirHook = func(shown string) {
		if shown == "/srv/app/conf" && before == nil {
			swapForSymlink(t, filepath.Join(root, "srv/app/conf"), "other")
			before = tree(t, root)
		}
	}
	defer func() { openDirHook = nil }()
	res, err := a.Execute(context.Background(), prep, ledger, memStore{}, Meta{})
	if err != nil {
		t.Fatal(err)
	}
	if before == nil {
		t.Fatal("the directory was never opened")
	}
	sameTree(t, "Execute", before, tree(t, root))
	wantFailure(t, "execute", res.Failed[names.NodeModule], codeWrite,
		"/srv/app/conf/x: /srv/app/conf changed while it was opened (another directory, or a symlink, was put there): not followed")
}
