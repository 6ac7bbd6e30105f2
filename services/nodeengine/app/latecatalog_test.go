package app_test

import (
	"fmt"
	"testing"

	"mesh.dev/internal/names"
)

// TestEntriesAnsweredLate: the catalog answers nothing while the engine's
// first passes run (a catalog slow to start), a newer manifest comes while
// the asks are in flight, and then every answer comes at once, racing the
// pass they ask for. No answer is lost and no wake-up dropped: the newer
// manifest is applied with nothing held. (Run with -race.)
func TestEntriesAnsweredLate(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	gate := make(chan struct{})
	w.catalog.gate = gate
	r := w.start(t)
	modules := []string{"ca-bundle", "motd", "sshd", "web"}
	comps := func(version string) []comp {
		out := []comp{nodeComp(file("node", "own", "/etc/app/own", version))}
		for _, m := range modules {
			fp := w.release(m, version, nil)
			out = append(out, moduleComp(m, fp, file(m, "conf", "/etc/app/"+m+".conf", m+" "+version)))
		}
		return out
	}
	w.publish(manifestOpts{}, comps("1.0.0")...)
	eventually(t, "every module held, its entry asked", func() (bool, string) {
		s := r.status(t)
		return len(s.GetHolds()) == len(modules), fmt.Sprint(s.GetHolds())
	})
	m2 := w.publish(manifestOpts{}, comps("1.0.1")...)
	eventually(t, "the entries of the newer manifest asked", func() (bool, string) {
		n := 0
		for _, m := range modules {
			if w.catalog.timesAsked(fpOf(w, m, "1.0.1")) > 0 {
				n++
			}
		}
		return n == len(modules), fmt.Sprintf("%d of %d asked", n, len(modules))
	})
	close(gate)
	r.waitApplied(t, m2)
	if s := r.status(t); len(s.GetHolds()) > 0 {
		t.Errorf("applied with holds %v", s.GetHolds())
	}
	for _, row := range r.status(t).GetHaves() {
		if row.GetModule() == names.NodeModule {
			continue
		}
		if row.GetApplied().GetFingerprint() != fpOf(w, row.GetModule(), "1.0.1") {
			t.Errorf("%s applied at %s", row.GetModule(), row.GetApplied().GetFingerprint())
		}
	}
}

// fpOf is the fingerprint w.release gives a module at a version.
func fpOf(w *world, module, version string) string {
	w.catalog.mu.Lock()
	defer w.catalog.mu.Unlock()
	for fp, e := range w.catalog.entries {
		if e.GetModule() == module && e.GetSourceDigest() == names.Digest([]byte(module+version)) {
			return fp
		}
	}
	return ""
}
