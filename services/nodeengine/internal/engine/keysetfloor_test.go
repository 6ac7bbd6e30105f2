package engine

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"mesh.dev/internal/names"
)

// The keyset floor also covers a manifest newer than the applied one whose
// apply a stop left half done (its journal is replayed right after a
// keyset lifts the block): a rollback keyset older than the one that
// manifest was taken under is refused, and a manifest by a key the newer
// keyset revoked is not applied.
func TestKeysetFloorCoversAnUnfinishedApply(t *testing.T) {
	w := newUnitWorld(t)
	_, own1 := w.composition(names.NodeModule, "", true, revFile("net:a", "", "/srv/net/a", "one\n"))
	w.offer(own1) // r1 under keyset 1
	k1, _ := w.revokeSigningKey()
	w.e.Pass(context.Background())
	if v := w.e.Status().GetKeysetVersion(); v != 2 {
		t.Fatalf("keyset %d", v)
	}
	// Restart with a stop in the middle of r2's apply (signed under keyset 2).
	w.restartStoppingAfter(1)
	_, own2 := w.composition(names.NodeModule, "", true, revFile("net:a", "", "/srv/net/a", "two\n"), revFile("net:b", "", "/srv/net/b", "b\n"))
	w.offerStopped(own2)
	w.after = nil
	w.restartWithKeysetUnreadable()
	// Rollback keyset v1 offered, then a manifest by k1 (revoked in v2).
	w.e.OfferKeyset(w.tr.KeysetEnvelope)
	w.tr.SigningKey, w.ks = k1, 1
	_, own3 := w.composition(names.NodeModule, "", true, revFile("net:a", "", "/srv/net/a", "by a revoked key\n"))
	w.offer(own3)
	b, _ := os.ReadFile(filepath.Join(w.root, "srv", "net", "a"))
	if string(b) == "by a revoked key\n" {
		t.Fatalf("rollback keyset v1 taken (keyset %d, blocked %q): a manifest by the key version 2 revoked applied", w.e.Status().GetKeysetVersion(), w.e.Status().GetBlocked())
	}
}
