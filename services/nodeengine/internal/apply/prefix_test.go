package apply

import (
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// prefixLink makes root (0755) and in it the directory real-etc and the
// symlink link -> target (OUTSIDE in target: dir/outside, a directory
// outside root).
func prefixLink(t *testing.T, link, target string) (dir, root, resolved string) {
	t.Helper()
	dir = t.TempDir()
	root = filepath.Join(dir, "root")
	outside := filepath.Join(dir, "outside")
	for _, d := range []string{outside, filepath.Join(root, "real-etc")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chmod(root, 0o755); err != nil {
		t.Fatal(err)
	}
	resolved = strings.Replace(target, "OUTSIDE", outside, 1)
	if err := os.Symlink(resolved, filepath.Join(root, link)); err != nil {
		t.Fatal(err)
	}
	return dir, root, resolved
}

// TestNewRefusesAPrefixThroughAnotherUsersSymlink: New once made and
// opened a prefix with os.MkdirAll and os.OpenRoot, both following
// symlinks, so a prefix whose path below the root passes through one put
// every write of the engine wherever it points. A symlink that is not the
// administrator's — in a directory others can write, or owned by another
// user — is refused, naming the prefix and the symlink, and nothing is made
// where it points.
func TestNewRefusesAPrefixThroughAnotherUsersSymlink(t *testing.T) {
	for _, untrusted := range []string{"directory writable by others", "symlink of another user"} {
		for _, tt := range []struct {
			name, prefix, link, target string
		}{
			{"the prefix itself, absolute", "/srv", "srv", "OUTSIDE"},
			{"the prefix itself, relative", "/srv", "srv", "../outside"},
			{"a directory above it", "/etc/app", "etc", "OUTSIDE"},
			{"a directory above it, inside the root", "/etc/app", "etc", "real-etc"},
		} {
			t.Run(untrusted+"/"+tt.name, func(t *testing.T) {
				dir, root, target := prefixLink(t, tt.link, tt.target)
				if untrusted == "directory writable by others" {
					if err := os.Chmod(root, 0o777); err != nil {
						t.Fatal(err)
					}
				} else if err := os.Lchown(filepath.Join(root, tt.link), 4242, 4242); err != nil {
					t.Skipf("give the symlink to another user: %v", err)
				}
				outside := filepath.Join(dir, "outside")
				before, beforeOutside := tree(t, root), tree(t, outside)
				a, err := New(Config{Root: root, Prefixes: []string{"/var/lib/x", tt.prefix}, StateDir: filepath.Join(dir, "state"), Logger: slog.New(slog.DiscardHandler)})
				want := "apply: prefix " + tt.prefix + " passes through the symlink " + filepath.Join(root, tt.link) + " -> " + target +
					", which is not the administrator's (it or its directory owned by another user, or that directory writable by others): the engine's writes would land where it points"
				if err == nil {
					a.Close()
					t.Fatalf("New opened prefix %s through the symlink %s -> %s", tt.prefix, tt.link, target)
				} else if err.Error() != want {
					t.Errorf("New: %q, want %q", err, want)
				}
				after := tree(t, root)
				// The prefix before it in the list is made: nothing else.
				for p := range after {
					if strings.HasPrefix(p, filepath.Join(root, "var")) {
						delete(after, p)
					}
				}
				sameTree(t, "New", before, after)
				sameTree(t, "New", beforeOutside, tree(t, outside))
			})
		}
	}
}

// TestNewFollowsTheAdministratorsSymlinkInsideTheRoot: an OS layout puts
// symlinks on the way to the usual prefixes (/opt -> var/opt on image-based
// systems). One the administrator made (it and its directory root's or the
// engine's, the directory writable by its owner alone) is followed, its
// target resolved inside the root (an absolute one from the root, one
// climbing out stops at it): the prefix is the directory it points at there.
func TestNewFollowsTheAdministratorsSymlinkInsideTheRoot(t *testing.T) {
	for _, tt := range []struct {
		name, prefix, link, target, lands string
	}{
		{"relative", "/etc/app", "etc", "real-etc", "real-etc/app"},
		{"absolute, from the root", "/opt/x", "opt", "/var/opt", "var/opt/x"},
		{"climbing out, stopped at the root", "/srv", "srv", "../../outside", "outside"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			dir, root, _ := prefixLink(t, tt.link, tt.target)
			a, err := New(Config{Root: root, Prefixes: []string{tt.prefix}, StateDir: filepath.Join(dir, "state"), Logger: slog.New(slog.DiscardHandler)})
			if err != nil {
				t.Fatalf("New: %v", err)
			}
			defer a.Close()
			if err := a.prefixes[0].root.WriteFile("f", []byte("x"), 0o644); err != nil {
				t.Fatal(err)
			}
			if b, err := os.ReadFile(filepath.Join(root, tt.lands, "f")); err != nil || string(b) != "x" {
				t.Errorf("a write in prefix %s: %q, %v at %s; want it there", tt.prefix, b, err, tt.lands)
			}
			if _, err := os.Stat(filepath.Join(dir, "outside", "f")); err == nil {
				t.Errorf("a write in prefix %s landed outside the root", tt.prefix)
			}
		})
	}
}

// TestNewResolvesDotDotAsTheKernelDoes: a ".." in the administrator's
// symlink goes to the parent of the directory the link reached, not of
// its name: /opt -> data/../opt-real with /data -> mnt/disk/data is
// /mnt/disk/opt-real, as every other program sees it.
func TestNewResolvesDotDotAsTheKernelDoes(t *testing.T) {
	dir, root, _ := prefixLink(t, "data", "mnt/disk/data")
	for _, d := range []string{"mnt/disk/data", "mnt/disk/opt-real"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink("data/../opt-real", filepath.Join(root, "opt")); err != nil {
		t.Fatal(err)
	}
	a, err := New(Config{Root: root, Prefixes: []string{"/opt"}, StateDir: filepath.Join(dir, "state"), Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	defer a.Close()
	got, err := a.prefixes[0].root.Stat(".")
	if err != nil {
		t.Fatal(err)
	}
	want, err := os.Stat(filepath.Join(root, "opt") + "/")
	if err != nil {
		t.Fatal(err)
	}
	if !os.SameFile(got, want) || a.prefixes[0].real != "/mnt/disk/opt-real" {
		t.Errorf("prefix /opt opened at %s; want the directory the kernel resolves, /mnt/disk/opt-real", a.prefixes[0].real)
	}
	if _, err := os.Stat(filepath.Join(root, "opt-real")); err == nil {
		t.Errorf("New made %s/opt-real, resolving the .. by the link's name", root)
	}
}

// TestNewRefusesALoopOfSymlinks: the administrator's own symlinks in a
// loop stop the start saying so, not that they are another user's.
func TestNewRefusesALoopOfSymlinks(t *testing.T) {
	dir, root, _ := prefixLink(t, "a", "a")
	_, err := New(Config{Root: root, Prefixes: []string{"/a/x"}, StateDir: filepath.Join(dir, "state"), Logger: slog.New(slog.DiscardHandler)})
	if err == nil || !strings.Contains(err.Error(), "apply: prefix /a/x: ") || !strings.Contains(err.Error(), "more than 40 symlinks on the way (a loop?)") {
		t.Fatalf("New: %v; want the loop named", err)
	}
}

// TestNewRefusesPrefixesThatAreOneDirectory: with /opt -> var/opt, the
// prefixes /opt and /var (or /var/opt) are one directory under two
// declared paths, which the ledger would key as two files. The start is
// refused, naming both and where they lie.
func TestNewRefusesPrefixesThatAreOneDirectory(t *testing.T) {
	for _, other := range []string{"/var/opt", "/var"} {
		t.Run(other, func(t *testing.T) {
			dir, root, _ := prefixLink(t, "opt", "var/opt")
			_, err := New(Config{Root: root, Prefixes: []string{other, "/opt"}, StateDir: filepath.Join(dir, "state"), Logger: slog.New(slog.DiscardHandler)})
			want := "apply: prefix /opt is /var/opt on this machine and prefix " + other + " is " + other +
				": one directory under two prefixes would be managed under two paths; allow one of them"
			if err == nil || err.Error() != want {
				t.Fatalf("New: %v; want %q", err, want)
			}
		})
	}
	// Prefixes nested as declared are fine.
	dir, root, _ := prefixLink(t, "opt", "var/opt")
	a, err := New(Config{Root: root, Prefixes: []string{"/opt", "/opt/app"}, StateDir: filepath.Join(dir, "state"), Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatalf("New with /opt and /opt/app: %v", err)
	}
	a.Close()
}
