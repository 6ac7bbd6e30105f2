package engine

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
	"google.golang.org/protobuf/types/known/timestamppb"

	"mesh.dev/internal/names"
	"mesh.dev/internal/testutil"
	typev1 "mesh.dev/proto/mesh/type/v1"
	"mesh.dev/services/nodeengine/internal/state"
)

// The keyset floor also covers a manifest newer than the applied one whose
// apply a stop left half done (its journal is replayed right after a
// keyset lifts the block): a rollback keyset older than the one that
// manifest was taken under is refused, and a manifest by a key the newer
// keyset revoked is not applied.
func TestKeysetFloorCoversAnUnfinishedApply(t *testing.T) {
	w := newUnitWorld(t)
	k1 := w.tr.SigningKey
	_, own1 := w.composition(names.NodeModule, "", true, revFile("net:a", "", "/srv/net/a", "one\n"))
	w.offer(own1) // r1 under keyset 1
	k2 := testutil.NewKey(t)
	ks := &typev1.Keyset{Version: 2, IssuedAt: timestamppb.New(w.now), ExpiresAt: timestamppb.New(w.now.Add(24 * time.Hour)),
		Keys: []*typev1.KeysetKey{
			testutil.KeysetKeyOf(k1, typev1.KeyState_KEY_STATE_REVOKED, w.now.Add(-time.Hour), w.now.Add(time.Hour)),
			testutil.KeysetKeyOf(k2, typev1.KeyState_KEY_STATE_ACTIVE, w.now.Add(-time.Hour), w.now.Add(24*time.Hour)),
		}}
	w.e.OfferKeyset(w.tr.SignKeyset(t, ks, w.tr.RootKeys...))
	w.e.Pass(context.Background())
	if v := w.e.Status().GetKeysetVersion(); v != 2 {
		t.Fatalf("keyset %d", v)
	}
	w.tr.SigningKey, w.ks = k2, 2
	// Restart with a stop in the middle of r2's apply (signed under keyset 2).
	type stop struct{}
	w.e.Close()
	w.db.Close()
	w.after = func(done, total int) {
		if done == 1 {
			panic(stop{})
		}
	}
	w.start()
	_, own2 := w.composition(names.NodeModule, "", true, revFile("net:a", "", "/srv/net/a", "two\n"), revFile("net:b", "", "/srv/net/b", "b\n"))
	func() {
		defer func() {
			if p := recover(); p != nil {
				if _, ok := p.(stop); !ok {
					panic(p)
				}
			}
		}()
		w.offer(own2)
		t.Fatal("not stopped")
	}()
	w.e.Close()
	if err := w.db.Bolt().Update(func(tx *bolt.Tx) error {
		return tx.Bucket([]byte(state.SectionKeyset)).Put([]byte(state.SectionKeyset), []byte("garbage"))
	}); err != nil {
		t.Fatal(err)
	}
	w.db.Close()
	w.after = nil
	w.start()
	// Rollback keyset v1 offered, then a manifest by k1 (revoked in v2).
	w.e.OfferKeyset(w.tr.KeysetEnvelope)
	w.tr.SigningKey, w.ks = k1, 1
	_, own3 := w.composition(names.NodeModule, "", true, revFile("net:a", "", "/srv/net/a", "by a revoked key\n"))
	w.offer(own3)
	b, _ := os.ReadFile(filepath.Join(w.root, "srv", "net", "a"))
	t.Logf("keyset %d blocked=%q disk=%q", w.e.Status().GetKeysetVersion(), w.e.Status().GetBlocked(), b)
	if string(b) == "by a revoked key\n" {
		t.Fatalf("BUG: keyset v1 taken (floor from applied r1, not from the held journal's r2 under v2); manifest signed by revoked k1 applied")
	}
}
