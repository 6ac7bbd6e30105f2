package apply

import (
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestNewRefusesAPrefixThroughASymlink: New once made and opened a prefix
// with os.MkdirAll and os.OpenRoot, both following symlinks, so a prefix
// whose path below the root passes through one put every write of the
// engine wherever it points. It is refused, naming the prefix and the
// symlink, and nothing is made where it points.
func TestNewRefusesAPrefixThroughASymlink(t *testing.T) {
	for _, tt := range []struct {
		name, prefix, link, target string
	}{
		{"the prefix itself, absolute", "/srv", "srv", "OUTSIDE"},
		{"the prefix itself, relative", "/srv", "srv", "../outside"},
		{"a directory above it", "/etc/app", "etc", "OUTSIDE"},
		{"a directory above it, inside the root", "/etc/app", "etc", "real-etc"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			root, outside := filepath.Join(dir, "root"), filepath.Join(dir, "outside")
			for _, d := range []string{outside, filepath.Join(root, "real-etc")} {
				if err := os.MkdirAll(d, 0o755); err != nil {
					t.Fatal(err)
				}
			}
			target := strings.Replace(tt.target, "OUTSIDE", outside, 1)
			if err := os.Symlink(target, filepath.Join(root, tt.link)); err != nil {
				t.Fatal(err)
			}
			before := tree(t, root)
			beforeOutside := tree(t, outside)
			a, err := New(Config{Root: root, Prefixes: []string{"/var/lib/x", tt.prefix}, StateDir: filepath.Join(dir, "state"), Logger: slog.New(slog.DiscardHandler)})
			want := "apply: prefix " + tt.prefix + " passes through the symlink " + filepath.Join(root, tt.link) + " -> " + target + ": the engine's writes would land where it points"
			if err == nil {
				a.Close()
				t.Errorf("New opened prefix %s through the symlink %s -> %s", tt.prefix, tt.link, target)
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
