package app

import (
	"fmt"
	"os"
	"path/filepath"

	"mesh.dev/services/nodeengine/internal/apply"
	"mesh.dev/services/nodeengine/internal/state"
)

// ChangeApplies sets up, under a new dir in dir (put it where the engines'
// roots are), an engine's applier and state file with a module of files
// files (480 bytes each) already applied, and returns next, which applies
// a change of every one of them: Prepare, Stage, Execute with its journal
// and commit in the state file. It is the work an engine cannot skip once
// it holds a verified composition (each file written to a temp file,
// fsynced and renamed, its directory fsynced, the journal kept before and
// the ledger committed after), for `meshctl bench converge` to time. done
// removes it all.
func ChangeApplies(dir string, files int) (next func() error, done func(), err error) {
	dir, err = os.MkdirTemp(dir, "mesh-apply-cost-")
	if err != nil {
		return nil, nil, err
	}
	var undo []func()
	done = func() {
		for i := len(undo) - 1; i >= 0; i-- {
			undo[i]()
		}
	}
	undo = append(undo, func() { os.RemoveAll(dir) })
	db, err := state.Open(filepath.Join(dir, "engine.db"))
	if err != nil {
		done()
		return nil, nil, err
	}
	undo = append(undo, func() { db.Close() })
	f, err := apply.NewChangeFixture(dir, files, db)
	if err != nil {
		done()
		return nil, nil, err
	}
	undo = append(undo, f.Close)
	if err := f.Apply(); err != nil {
		done()
		return nil, nil, fmt.Errorf("first apply: %w", err)
	}
	return f.Apply, done, nil
}
