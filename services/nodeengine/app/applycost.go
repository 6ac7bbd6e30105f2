package app

import (
	"fmt"
	"os"
	"path/filepath"
	"time"

	"mesh.dev/services/nodeengine/internal/apply"
	"mesh.dev/services/nodeengine/internal/state"
)

// ApplyCost returns the mean time of an engine's apply of a change of
// every file of a module of files files (480 bytes each): Prepare, Stage,
// Execute with its journal and commit in a real state file, the root and
// state under dir (put it where the engines' roots are), over at least n
// applies and at least d. It is the work an engine cannot skip once it
// holds a verified composition: each file written to a temp file, fsynced
// and renamed, its directory fsynced, the journal kept before and the
// ledger committed after.
func ApplyCost(dir string, files, n int, d time.Duration) (time.Duration, error) {
	dir, err := os.MkdirTemp(dir, "mesh-apply-cost-")
	if err != nil {
		return 0, err
	}
	defer os.RemoveAll(dir)
	db, err := state.Open(filepath.Join(dir, "engine.db"))
	if err != nil {
		return 0, err
	}
	defer db.Close()
	f, err := apply.NewChangeFixture(dir, files, db)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	if err := f.Apply(); err != nil {
		return 0, fmt.Errorf("first apply: %w", err)
	}
	start := time.Now()
	applies := 0
	for applies < n || time.Since(start) < d {
		if err := f.Apply(); err != nil {
			return 0, err
		}
		applies++
	}
	return time.Since(start) / time.Duration(applies), nil
}
