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

// TestFreshPathThatAppearedIsNotReplaced: a path that was new when the
// apply was planned (not in the ledger, absent, not adopted) may have
// something on it when its op runs: put there between Prepare and Execute
// (Stage can take minutes fetching), or while the engine was down before
// it replays its journal. Ops once overwrote it (and mkdir removed a
// non-directory where a missing parent was to be made). Now the module
// fails and what appeared stays, but for what the engine itself put there
// before a crash: a file of the op's content, a directory, the same
// symlink, from which the replay goes on.
func TestFreshPathThatAppearedIsNotReplaced(t *testing.T) {
	const appeared = " appeared since the apply was planned and is not managed by this engine"
	for _, tt := range []struct {
		name string
		res  []*typev1.Resource
		// appear puts things on the disk after Prepare.
		appear func(t *testing.T, root string)
		// replay: the journal is replayed after a crash before its ops;
		// else Execute runs after the disk changed.
		replay bool
		// refused is the path named, "" when the apply goes on.
		refused string
		// check, when set, checks the disk after an apply that went on.
		check func(t *testing.T, root string)
	}{
		{
			name:    "a file, before Execute",
			res:     []*typev1.Resource{fileRes("node:new", "/srv/new.conf", "ours\n")},
			appear:  func(t *testing.T, root string) { writeFile(t, filepath.Join(root, "srv/new.conf"), "theirs\n") },
			refused: "/srv/new.conf",
		},
		{
			name:    "a file, before a replay",
			res:     []*typev1.Resource{fileRes("node:new", "/srv/new.conf", "ours\n")},
			appear:  func(t *testing.T, root string) { writeFile(t, filepath.Join(root, "srv/new.conf"), "theirs\n") },
			replay:  true,
			refused: "/srv/new.conf",
		},
		{
			name: "a directory where a file is to be written",
			res:  []*typev1.Resource{fileRes("node:new", "/srv/new.conf", "ours\n")},
			appear: func(t *testing.T, root string) {
				if err := os.Mkdir(filepath.Join(root, "srv/new.conf"), 0o755); err != nil {
					t.Fatal(err)
				}
			},
			replay:  true,
			refused: "/srv/new.conf",
		},
		{
			name:   "the engine's own file, written before a crash",
			res:    []*typev1.Resource{fileRes("node:new", "/srv/new.conf", "ours\n")},
			appear: func(t *testing.T, root string) { writeFile(t, filepath.Join(root, "srv/new.conf"), "ours\n") },
			replay: true,
			check: func(t *testing.T, root string) {
				if fi, err := os.Stat(filepath.Join(root, "srv/new.conf")); err != nil || fi.Mode().Perm() != 0o644 {
					t.Errorf("/srv/new.conf: %v %v, want mode 0644", fi.Mode(), err)
				}
			},
		},
		{
			name:    "a file where a missing parent directory is to be made",
			res:     []*typev1.Resource{dirRes("node:e", "/srv/d/e", 0o755)},
			appear:  func(t *testing.T, root string) { writeFile(t, filepath.Join(root, "srv/d"), "theirs-d\n") },
			replay:  true,
			refused: "/srv/d",
		},
		{
			name:    "a symlink where a directory is to be made",
			res:     []*typev1.Resource{dirRes("node:d", "/srv/d", 0o755)},
			appear:  func(t *testing.T, root string) { os.Symlink("other", filepath.Join(root, "srv/d")) },
			refused: "/srv/d",
		},
		{
			name: "a directory where a directory is to be made",
			res:  []*typev1.Resource{dirRes("node:e", "/srv/d/e", 0o750)},
			appear: func(t *testing.T, root string) {
				if err := os.MkdirAll(filepath.Join(root, "srv/d/e"), 0o700); err != nil {
					t.Fatal(err)
				}
			},
			replay: true,
			check: func(t *testing.T, root string) {
				if fi, err := os.Stat(filepath.Join(root, "srv/d/e")); err != nil || fi.Mode().Perm() != 0o750 {
					t.Errorf("/srv/d/e: %v %v, want its mode set, 0750", fi.Mode(), err)
				}
			},
		},
		{
			name:    "a symlink of another target",
			res:     []*typev1.Resource{linkRes("node:l", "/srv/l", "new.conf")},
			appear:  func(t *testing.T, root string) { os.Symlink("elsewhere", filepath.Join(root, "srv/l")) },
			replay:  true,
			refused: "/srv/l",
		},
		{
			name:    "a file where a symlink is to be made",
			res:     []*typev1.Resource{linkRes("node:l", "/srv/l", "new.conf")},
			appear:  func(t *testing.T, root string) { writeFile(t, filepath.Join(root, "srv/l"), "theirs\n") },
			refused: "/srv/l",
		},
		{
			name:   "the same symlink",
			res:    []*typev1.Resource{linkRes("node:l", "/srv/l", "new.conf")},
			appear: func(t *testing.T, root string) { os.Symlink("new.conf", filepath.Join(root, "srv/l")) },
			replay: true,
		},
	} {
		t.Run(tt.name, func(t *testing.T) {
			a, root := testApplier(t)
			prep := prepareStaged(t, a, Plan{Compositions: []*Composition{nodeComposition(tt.res)}, Ledger: map[string]*state.LedgerRecord{}})
			var res *Result
			if tt.replay {
				var k keptJournal
				if _, err := a.Execute(context.Background(), prep, nil, &k, Meta{}); err == nil || k.j == nil {
					t.Fatalf("execute: %v, journal %v", err, k.j)
				}
				tt.appear(t, root)
				before := tree(t, root)
				res = a.Replay(context.Background(), k.j, nil, memStore{})
				if tt.refused != "" {
					sameTree(t, "the replay", before, tree(t, root))
				}
			} else {
				tt.appear(t, root)
				before := tree(t, root)
				var err error
				if res, err = a.Execute(context.Background(), prep, nil, memStore{}, Meta{}); err != nil {
					t.Fatal(err)
				}
				if tt.refused != "" {
					sameTree(t, "Execute", before, tree(t, root))
				}
			}
			if tt.refused == "" {
				if len(res.Failed) > 0 {
					t.Fatalf("what the engine put there itself was refused: %v", res.Failed)
				}
				for _, r := range tt.res {
					if res.Ledger[r.GetPath()] == nil {
						t.Errorf("%s is not in the ledger", r.GetPath())
					}
				}
				if tt.check != nil {
					tt.check(t, root)
				}
				return
			}
			wantFailure(t, "apply", res.Failed[names.NodeModule], codeUnmanaged, tt.refused+appeared)
			for _, r := range tt.res {
				if res.Ledger[r.GetPath()] != nil {
					t.Errorf("%s is in the ledger", r.GetPath())
				}
			}
		})
	}
}
