package apply

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"syscall"
)

// dirRoots opens each directory an apply works in once, as an os.Root of
// its own beneath its prefix's root: an op on a file in it is then one
// syscall on a single name, not a walk from the prefix (an openat and a
// close per directory on the way, twice for a rename).
//
// Each directory is reached one component at a time and never through a
// symlink (openDir): os.Root follows a symlink that stays inside it, and a
// path through one would name another path than the one declared, keyed in
// the ledger by the declared one (a local user owning a directory in a
// prefix could point conf.d at ../sudoers.d). Every op works on a single
// name in the directory opened so; a directory that cannot be opened so (not
// there, not a directory, a symlink) fails the op, its error naming why.
//
// A directory root holds the directory it opened: an op that removes,
// replaces or makes directories must reset the cache first (see runOp).
type dirRoots struct {
	m map[dirKey]dirRoot
}

// dirRoot is a directory opened, or why it could not be.
type dirRoot struct {
	root *os.Root
	err  error
}

func newDirRoots() *dirRoots { return &dirRoots{m: map[dirKey]dirRoot{}} }

// dir returns the directory dir (relative to pr's root, "." for the root
// itself) opened as a root, reached without following a symlink. A missing
// directory on the way is an error that wraps fs.ErrNotExist; a symlink
// on the way is a *symlinkError.
func (d *dirRoots) dir(pr *prefix, dir string) (*os.Root, error) {
	if dir == "." {
		return pr.root, nil
	}
	k := dirKey{prefix: pr, dir: dir}
	if e, ok := d.m[k]; ok {
		return e.root, e.err
	}
	parent, err := d.dir(pr, path.Dir(dir))
	var r *os.Root
	if err == nil {
		r, err = openDir(parent, path.Base(dir), abs(pr, dir))
	}
	d.m[k] = dirRoot{root: r, err: err}
	return r, err
}

// at returns the root and the single name to work on rel (relative to pr's
// root) through: rel's directory, reached as dir does.
func (d *dirRoots) at(pr *prefix, rel string) (*os.Root, string, error) {
	dir := path.Dir(rel)
	if dir == "." {
		return pr.root, rel, nil
	}
	r, err := d.dir(pr, dir)
	if err != nil {
		return nil, "", err
	}
	return r, path.Base(rel), nil
}

// look reads what lies on rel (relative to pr's root) as look does, its
// directory reached as dir does: a path whose directory is missing is
// missing too.
func (d *dirRoots) look(pr *prefix, rel string, hash bool, sizes ...int64) (disk, error) {
	in, name, err := d.at(pr, rel)
	if errors.Is(err, fs.ErrNotExist) {
		return disk{}, nil
	}
	if err != nil {
		return disk{}, err
	}
	return look(in, name, hash, sizes...)
}

// reset closes every directory root.
func (d *dirRoots) reset() {
	for k, e := range d.m {
		if e.root != nil {
			e.root.Close()
		}
		delete(d.m, k)
	}
}

// symlinkError is a symlink found where a directory on the way to a path
// was to be opened.
type symlinkError struct {
	path   string // the symlink's path on the machine (below the root)
	target string
}

func (e *symlinkError) Error() string {
	return fmt.Sprintf("%s is a symlink -> %s: a path through a symlink would name another path", e.path, e.target)
}

// openDirHook, when set, runs between openDir's Lstat and its OpenRoot (a
// test hook: a test swaps the directory there; nil in production).
var openDirHook func(shown string)

// openDir opens the directory name (a single component) of parent as a
// root without following a symlink: the name is looked at with Lstat and
// must be a directory, and the directory opened must be the one looked at
// (os.Root.OpenRoot follows a symlink swapped in between). shown is the
// directory's path on the machine, for errors.
func openDir(parent *os.Root, name, shown string) (*os.Root, error) {
	fi, err := parent.Lstat(name)
	if err != nil {
		var pe *fs.PathError
		if errors.As(err, &pe) {
			err = pe.Err
		}
		return nil, &fs.PathError{Op: "lstat", Path: shown, Err: err}
	}
	if fi.Mode()&fs.ModeSymlink != 0 {
		target, err := parent.Readlink(name)
		if err != nil {
			target = "?"
		}
		return nil, &symlinkError{path: shown, target: target}
	}
	if !fi.IsDir() {
		return nil, &fs.PathError{Op: "open", Path: shown, Err: syscall.ENOTDIR}
	}
	if openDirHook != nil {
		openDirHook(shown)
	}
	r, err := parent.OpenRoot(name)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", shown, err)
	}
	opened, err := r.Stat(".")
	if err != nil {
		r.Close()
		return nil, err
	}
	if !os.SameFile(fi, opened) {
		r.Close()
		return nil, fmt.Errorf("%s changed while it was opened (another directory, or a symlink, was put there): not followed", shown)
	}
	return r, nil
}
