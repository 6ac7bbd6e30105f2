package apply

import (
	"os"
	"path/filepath"
	"testing"

	"mesh.dev/services/nodeengine/internal/state"
)

// shmDir is a new dir on /dev/shm when it exists (where bench converge
// puts the engines' roots), else a test temp dir.
func shmDir(tb testing.TB) string {
	if fi, err := os.Stat("/dev/shm"); err == nil && fi.IsDir() {
		d, err := os.MkdirTemp("/dev/shm", "mesh-apply-bench-")
		if err != nil {
			tb.Fatal(err)
		}
		tb.Cleanup(func() { os.RemoveAll(d) })
		return d
	}
	return tb.TempDir()
}

// BenchmarkApplyChange applies a change of every file of a module of 24
// files of 480 bytes (the composition bench converge changes, ~12 KB):
// Prepare, Stage and Execute, on /dev/shm when it exists (where bench
// converge puts the engines' roots), so the figure is the applier's own
// CPU and syscalls, not the disk's. With store=memory the journal and the
// commit are not written; with store=bbolt they go to an engine's state
// file beside the root, as in an engine.
func BenchmarkApplyChange(b *testing.B) {
	b.Run("store=memory", func(b *testing.B) { benchApplyChange(b, func(string) Store { return memStore{} }) })
	b.Run("store=bbolt", func(b *testing.B) {
		benchApplyChange(b, func(dir string) Store {
			db, err := state.Open(filepath.Join(dir, "engine.db"))
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { db.Close() })
			return db
		})
	})
}

// BenchmarkApplyChange applies a change of every file of a module of 24
// files of 480 bytes (the composition bench converge changes, ~12 KB):
// Prepare, Stage and Execute, on /dev/shm when it exists (where bench
// converge puts the engines' roots), so the figure is the applier's own
// CPU and syscalls, not the disk's.
func benchApplyChange(b *testing.B, storeAt func(dir string) Store) {
	dir := shmDir(b)
	f, err := NewChangeFixture(dir, 24, storeAt(dir))
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	if err := f.Apply(); err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		if err := f.Apply(); err != nil {
			b.Fatal(err)
		}
	}
}
