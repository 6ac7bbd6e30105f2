package apply

import (
	"os"
	"path"
)

// dirRoots opens each directory an apply works in once, as an os.Root of
// its own beneath its prefix's root: an op on a file in it is then one
// syscall on a single name, not a walk from the prefix (an openat and a
// close per directory on the way, twice for a rename). A root opened in a
// root is as confined as it (os.Root.OpenRoot: the walk to it follows the
// same rules), and a directory that cannot be opened so (not there, a
// symlink that leaves the prefix) is worked on through the prefix's root,
// as without this, whose error then says why.
//
// A directory root holds the directory it opened: an op that removes,
// replaces or makes directories must reset the cache first (see runOp).
type dirRoots struct {
	m map[dirKey]*os.Root
}

func newDirRoots() *dirRoots { return &dirRoots{m: map[dirKey]*os.Root{}} }

// at returns the root and the name to work on rel (relative to pr's root)
// through.
func (d *dirRoots) at(pr *prefix, rel string) (*os.Root, string) {
	dir := path.Dir(rel)
	if dir == "." {
		return pr.root, rel
	}
	k := dirKey{prefix: pr, dir: dir}
	r, ok := d.m[k]
	if !ok {
		var err error
		if r, err = pr.root.OpenRoot(dir); err != nil {
			r = nil
		}
		d.m[k] = r
	}
	if r == nil {
		return pr.root, rel
	}
	return r, path.Base(rel)
}

// reset closes every directory root.
func (d *dirRoots) reset() {
	for k, r := range d.m {
		if r != nil {
			r.Close()
		}
		delete(d.m, k)
	}
}
