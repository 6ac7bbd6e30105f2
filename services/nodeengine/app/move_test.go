package app_test

import (
	"os"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	composerv1 "mesh.dev/proto/mesh/composer/v1"
)

// TestMoveBackWhileEntryAsked moves a module's file into the node's own
// composition and back. Moving back, the module's entry is not answered yet
// (the engine released it when the module left): the module holds
// ENTRY_ASKED, and its path, which the manifest still declares, stays where
// it is, labelled as it was, until the module applies and takes it over — it
// is never removed and recreated.
func TestMoveBackWhileEntryAsked(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	r := w.start(t)
	fp := w.release("web", "1.0.0", nil)
	web := func() comp { return moduleComp("web", fp, file("web", "moving", "/etc/app/moving", "moves\n")) }
	m1 := w.publish(manifestOpts{}, web(), nodeComp())
	r.waitApplied(t, m1)
	ino0 := ino(t, w.path("/etc/app/moving"))

	moved := file("web", "moving", "/etc/app/moving", "moves\n")
	moved.Module = ""
	m2 := w.publish(manifestOpts{}, nodeComp(moved))
	r.waitApplied(t, m2)
	if got := ino(t, w.path("/etc/app/moving")); got != ino0 {
		t.Fatal("moving into the node's own composition recreated the file")
	}

	// Back to web while the catalog cannot answer web's entry.
	w.catalog.mu.Lock()
	w.catalog.fail = status.Error(codes.Unavailable, "catalog down")
	w.catalog.mu.Unlock()
	m3 := w.publish(manifestOpts{}, web(), nodeComp())
	r.waitAttempt(t, "web", stateHeld, composerv1.ReasonCode_REASON_CODE_ENTRY_ASKED)
	r.eng.Engine.Pass(t.Context())
	fi, err := os.Lstat(w.path("/etc/app/moving"))
	if err != nil {
		t.Fatalf("the path the held module declares was removed: %v", err)
	}
	if got := ino(t, w.path("/etc/app/moving")); got != ino0 {
		t.Fatalf("the path the held module declares was recreated (%v)", fi.ModTime())
	}

	w.catalog.mu.Lock()
	w.catalog.fail = nil
	w.catalog.mu.Unlock()
	r.waitApplied(t, m3)
	if got := ino(t, w.path("/etc/app/moving")); got != ino0 {
		t.Error("moving back to web recreated the file")
	}
	if got := readFile(t, w.path("/etc/app/moving")); got != "moves\n" {
		t.Errorf("content %q", got)
	}
}
