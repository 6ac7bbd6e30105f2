package apply

import (
	"log/slog"
	"testing"
)

// TestCheckPathRefusesUncleanPaths: CheckPath is the first judgement of a
// declared path (DESIGN.md §7: "absolute clean path"). It once accepted a
// path that was not clean as long as it held no ".." segment and started
// with a prefix; Prepare then planned it: "/srv//x" lies in prefix /srv
// with the relative part "/x", and ancestors("/x") never reaches "." —
// path.Dir of "/" is "/" — so Prepare looped forever, growing a slice
// until the engine ran out of memory (found by FuzzApply). The engine was
// safe only because it lints a composition before planning it.
func TestCheckPathRefusesUncleanPaths(t *testing.T) {
	t.Parallel()
	a, err := New(Config{Root: t.TempDir(), Prefixes: []string{"/srv", "/etc/app"}, StateDir: t.TempDir(), Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	for _, p := range []string{"/srv//x", "/srv/./x", "/srv/x/", "/srv/x/.", "/etc/app//", "/srv/a//b"} {
		if f := a.CheckPath(p); f == nil {
			t.Errorf("CheckPath(%q) accepts a path that is not clean (Prepare would loop forever on it)", p)
		}
	}
}
