package engine

import (
	"os"
	"path/filepath"
	"testing"

	"mesh.dev/internal/names"
)

// The keyset floor is the newest keyset version taken, kept with the
// high-water marks, not the applied manifest's (which lags whenever one
// want of a newer manifest fails: it is recorded only when applied
// whole): after the keyset section is damaged, a rollback keyset is
// refused and a manifest by a key the newer keyset revoked is not applied.
func TestKeysetFloorKeptWithTheMarks(t *testing.T) {
	w := newUnitWorld(t, "x")
	_, own1 := w.composition(names.NodeModule, "", true, revFile("net:a", "", "/srv/net/a", "one\n"))
	w.offer(own1) // r1 under keyset 1, applied whole
	k1, _ := w.revokeSigningKey()
	// r2 under keyset 2: the node's own applies, x's composition is not served.
	_, own2 := w.composition(names.NodeModule, "", true, revFile("net:a", "", "/srv/net/a", "two\n"))
	_, xWant := w.composition("x", w.fps["x"], false, revFile("x:conf", "x", "/srv/x/conf", "x\n"))
	w.offer(own2, xWant)
	if b, _ := os.ReadFile(filepath.Join(w.root, "srv", "net", "a")); string(b) != "two\n" {
		t.Fatalf("r2's own composition not applied: %q", b)
	}
	w.restartWithKeysetUnreadable()
	w.e.OfferKeyset(w.tr.KeysetEnvelope) // v1 again
	w.tr.SigningKey, w.ks = k1, 1
	_, own3 := w.composition(names.NodeModule, "", true, revFile("net:a", "", "/srv/net/a", "by a revoked key\n"))
	w.offer(own3)
	b, _ := os.ReadFile(filepath.Join(w.root, "srv", "net", "a"))
	if string(b) == "by a revoked key\n" {
		t.Fatalf("rollback keyset v1 taken (keyset %d, blocked %q): a manifest by the key version 2 revoked applied", w.e.Status().GetKeysetVersion(), w.e.Status().GetBlocked())
	}
}
