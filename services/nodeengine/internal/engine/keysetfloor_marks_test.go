package engine

import (
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

// The keyset floor is the newest keyset version taken, kept with the
// high-water marks, not the applied manifest's (which lags whenever one
// want of a newer manifest fails: it is recorded only when applied
// whole): after the keyset section is damaged, a rollback keyset is
// refused and a manifest by a key the newer keyset revoked is not applied.
func TestKeysetFloorKeptWithTheMarks(t *testing.T) {
	w := newUnitWorld(t, "x")
	k1 := w.tr.SigningKey
	_, own1 := w.composition(names.NodeModule, "", true, revFile("net:a", "", "/srv/net/a", "one\n"))
	w.offer(own1) // r1 under keyset 1, applied whole
	k2 := testutil.NewKey(t)
	ks := &typev1.Keyset{Version: 2, IssuedAt: timestamppb.New(w.now), ExpiresAt: timestamppb.New(w.now.Add(24 * time.Hour)),
		Keys: []*typev1.KeysetKey{
			testutil.KeysetKeyOf(k1, typev1.KeyState_KEY_STATE_REVOKED, w.now.Add(-time.Hour), w.now.Add(time.Hour)),
			testutil.KeysetKeyOf(k2, typev1.KeyState_KEY_STATE_ACTIVE, w.now.Add(-time.Hour), w.now.Add(24*time.Hour)),
		}}
	w.e.OfferKeyset(w.tr.SignKeyset(t, ks, w.tr.RootKeys...))
	w.tr.SigningKey, w.ks = k2, 2
	// r2 under keyset 2: the node's own applies, x's composition is not served.
	_, own2 := w.composition(names.NodeModule, "", true, revFile("net:a", "", "/srv/net/a", "two\n"))
	_, xWant := w.composition("x", w.fps["x"], false, revFile("x:conf", "x", "/srv/x/conf", "x\n"))
	w.offer(own2, xWant)
	if b, _ := os.ReadFile(filepath.Join(w.root, "srv", "net", "a")); string(b) != "two\n" {
		t.Fatalf("r2's own composition not applied: %q", b)
	}
	w.e.Close()
	if err := w.db.Bolt().Update(func(tx *bolt.Tx) error {
		return tx.Bucket([]byte(state.SectionKeyset)).Put([]byte(state.SectionKeyset), []byte("garbage"))
	}); err != nil {
		t.Fatal(err)
	}
	w.db.Close()
	w.start()
	w.e.OfferKeyset(w.tr.KeysetEnvelope) // v1 again
	w.tr.SigningKey, w.ks = k1, 1
	_, own3 := w.composition(names.NodeModule, "", true, revFile("net:a", "", "/srv/net/a", "by a revoked key\n"))
	w.offer(own3)
	b, _ := os.ReadFile(filepath.Join(w.root, "srv", "net", "a"))
	t.Logf("keyset %d blocked=%q disk=%q", w.e.Status().GetKeysetVersion(), w.e.Status().GetBlocked(), b)
	if string(b) == "by a revoked key\n" {
		t.Fatalf("BUG: rollback keyset v1 taken (floor = applied r1's keyset, though r2 under v2 was accepted and partly applied); manifest by revoked k1 applied")
	}
}
