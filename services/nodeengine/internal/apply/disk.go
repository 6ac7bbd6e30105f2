package apply

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/user"
	"path"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"mesh.dev/internal/names"
	"mesh.dev/services/nodeengine/internal/state"
)

// disk is what lies on a path.
type disk struct {
	exists  bool
	typ     string // state.TypeFile, TypeDir, TypeSymlink, or "" for a special file
	special string // "device", "FIFO", "socket" when the path holds one
	digest  string // a file's content digest (when hashed)
	target  string // a symlink's target
	mode    uint32 // permission bits (07777)
	uid     int
	gid     int
	size    int64
}

// openFlags open an existing path for reading without following a final
// symlink and without blocking on a FIFO that appeared since it was checked.
const openFlags = os.O_RDONLY | syscall.O_NOFOLLOW | syscall.O_NONBLOCK | syscall.O_CLOEXEC

// typeOf names a file's type, or returns the special kind.
func typeOf(m fs.FileMode) (typ, special string) {
	switch {
	case m.IsRegular():
		return state.TypeFile, ""
	case m.IsDir():
		return state.TypeDir, ""
	case m&fs.ModeSymlink != 0:
		return state.TypeSymlink, ""
	case m&fs.ModeNamedPipe != 0:
		return "", "FIFO"
	case m&fs.ModeSocket != 0:
		return "", "socket"
	case m&fs.ModeDevice != 0 || m&fs.ModeCharDevice != 0:
		return "", "device"
	}
	return "", "irregular file"
}

func statIDs(fi fs.FileInfo) (mode uint32, uid, gid int) {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return st.Mode & 0o7777, int(st.Uid), int(st.Gid)
	}
	return uint32(fi.Mode().Perm()), -1, -1
}

// look reads what lies on rel inside root, hashing a file's content when
// hash is set and its size is one of sizes (any size when none is given).
// Content of another size cannot have a digest the caller compares with,
// and a file grown huge — a sparse one costs whoever can write it nothing
// — is not read whole to find that out. A missing path is not an error.
func look(root *os.Root, rel string, hash bool, sizes ...int64) (disk, error) {
	fi, err := root.Lstat(rel)
	if errors.Is(err, fs.ErrNotExist) {
		return disk{}, nil
	}
	if err != nil {
		return disk{}, err
	}
	d := disk{exists: true, size: fi.Size()}
	d.typ, d.special = typeOf(fi.Mode())
	d.mode, d.uid, d.gid = statIDs(fi)
	switch d.typ {
	case state.TypeSymlink:
		if d.target, err = root.Readlink(rel); err != nil {
			return d, err
		}
	case state.TypeFile:
		if hash && (len(sizes) == 0 || slices.Contains(sizes, fi.Size())) {
			f, err := root.OpenFile(rel, openFlags, 0)
			if err != nil {
				return d, err
			}
			defer f.Close()
			if d.digest, err = hashFile(f); err != nil {
				return d, err
			}
		}
	}
	return d, nil
}

// hashFile checks that f is a regular file and returns its digest.
func hashFile(f *os.File) (string, error) {
	fi, err := f.Stat()
	if err != nil {
		return "", err
	}
	if !fi.Mode().IsRegular() {
		return "", fmt.Errorf("%s is not a regular file", f.Name())
	}
	h := sha256.New()
	if _, err := copyBuffered(h, f); err != nil {
		return "", err
	}
	return names.DigestOfSum(h.Sum(nil)), nil
}

// copyBufs are the buffers of copyBuffered: an apply hashes and copies
// every file it writes, and a fleet-wide change makes every engine do it at
// once.
var copyBufs = sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}

// copyBuffered is io.Copy through a pooled buffer (io.Copy from an
// *os.File to a hash allocates one per call).
func copyBuffered(dst io.Writer, src io.Reader) (int64, error) {
	buf := copyBufs.Get().(*[]byte)
	defer copyBufs.Put(buf)
	// Hiding src's WriterTo makes io.CopyBuffer use the buffer.
	return io.CopyBuffer(dst, struct{ io.Reader }{src}, *buf)
}

// ids resolves owners and groups to numeric ids, once per pass.
type ids struct {
	users  map[string]int
	groups map[string]int
}

func newIDs() *ids { return &ids{users: map[string]int{}, groups: map[string]int{}} }

// user returns the uid of a user name or number; -1 for "" (leave as is).
func (c *ids) user(name string) (int, error) {
	if name == "" {
		return -1, nil
	}
	if id, ok := c.users[name]; ok {
		return id, nil
	}
	id, err := strconv.Atoi(name)
	if err != nil {
		u, lerr := user.Lookup(name)
		if lerr != nil {
			return 0, fmt.Errorf("owner %q is not a user of this machine", name)
		}
		if id, err = strconv.Atoi(u.Uid); err != nil {
			return 0, fmt.Errorf("owner %q has uid %q", name, u.Uid)
		}
	}
	c.users[name] = id
	return id, nil
}

// group returns the gid of a group name or number; -1 for "".
func (c *ids) group(name string) (int, error) {
	if name == "" {
		return -1, nil
	}
	if id, ok := c.groups[name]; ok {
		return id, nil
	}
	id, err := strconv.Atoi(name)
	if err != nil {
		g, lerr := user.LookupGroup(name)
		if lerr != nil {
			return 0, fmt.Errorf("group %q is not a group of this machine", name)
		}
		if id, err = strconv.Atoi(g.Gid); err != nil {
			return 0, fmt.Errorf("group %q has gid %q", name, g.Gid)
		}
	}
	c.groups[name] = id
	return id, nil
}

// hasDotDot reports whether a slash-separated path holds a ".." segment.
func hasDotDot(p string) bool {
	for _, s := range strings.Split(p, "/") {
		if s == ".." {
			return true
		}
	}
	return false
}

// ancestors returns the relative paths of every directory between the
// prefix and rel, outermost first ("a", "a/b" for "a/b/c").
func ancestors(rel string) []string {
	if rel == "." {
		return nil
	}
	var out []string
	dir := path.Dir(rel)
	for dir != "." {
		out = append(out, dir)
		dir = path.Dir(dir)
	}
	for i, j := 0, len(out)-1; i < j; i, j = i+1, j-1 {
		out[i], out[j] = out[j], out[i]
	}
	return out
}
