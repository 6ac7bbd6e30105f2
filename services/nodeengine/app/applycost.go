package app

import (
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"mesh.dev/services/nodeengine/internal/apply"
	"mesh.dev/services/nodeengine/internal/state"
)

// ApplyCost returns the mean time and the mean CPU time (user and system,
// of the whole process: call it while nothing else runs) of an engine's
// apply of a change of every file of a module of files files (480 bytes
// each): Prepare, Stage,
// Execute with its journal and commit in a real state file, the root and
// state under dir (put it where the engines' roots are), over at least n
// applies and at least d. It is the work an engine cannot skip once it
// holds a verified composition: each file written to a temp file, fsynced
// and renamed, its directory fsynced, the journal kept before and the
// ledger committed after.
func ApplyCost(dir string, files, n int, d time.Duration) (wall, cpu time.Duration, err error) {
	dir, err = os.MkdirTemp(dir, "mesh-apply-cost-")
	if err != nil {
		return 0, 0, err
	}
	defer os.RemoveAll(dir)
	db, err := state.Open(filepath.Join(dir, "engine.db"))
	if err != nil {
		return 0, 0, err
	}
	defer db.Close()
	f, err := apply.NewChangeFixture(dir, files, db)
	if err != nil {
		return 0, 0, err
	}
	defer f.Close()
	if err := f.Apply(); err != nil {
		return 0, 0, fmt.Errorf("first apply: %w", err)
	}
	cpu0, start := processCPU(), time.Now()
	applies := 0
	for applies < n || time.Since(start) < d {
		if err := f.Apply(); err != nil {
			return 0, 0, err
		}
		applies++
	}
	return time.Since(start) / time.Duration(applies), (processCPU() - cpu0) / time.Duration(applies), nil
}

// processCPU is the CPU time (user and system) the process used so far.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
