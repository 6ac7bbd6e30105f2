package engine

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"mesh.dev/internal/names"
	typev1 "mesh.dev/proto/mesh/type/v1"
	"mesh.dev/services/nodeengine/internal/state"
)

// A kept keyset that reads but no longer verifies against the pinned roots
// (one bit of a root signature flipped on disk; bbolt checksums nothing)
// leaves the engine with no keyset, as an unreadable one does: an older
// keyset than the newest it took is refused, so a manifest by a key that
// newer keyset revoked is not applied.
func TestKeptKeysetNotSignedByTheRootsKeepsTheFloor(t *testing.T) {
	w := newUnitWorld(t)
	_, own1 := w.composition(names.NodeModule, "", true, revFile("net:conf", "", "/srv/net/conf", "one\n"))
	w.offer(own1)
	k1, _ := w.revokeSigningKey()
	_, own2 := w.composition(names.NodeModule, "", true, revFile("net:conf", "", "/srv/net/conf", "two\n"))
	w.offer(own2)
	if v := w.e.Status().GetKeysetVersion(); v != 2 {
		t.Fatalf("keyset version %d, want 2", v)
	}
	w.restartEditing(func(tx *bolt.Tx) error {
		b := tx.Bucket([]byte(state.SectionKeyset))
		env := &typev1.Envelope{}
		if err := proto.Unmarshal(b.Get([]byte("current")), env); err != nil {
			return err
		}
		env.Signatures[0].Signature[0] ^= 1
		v, err := proto.Marshal(env)
		if err != nil {
			return err
		}
		return b.Put([]byte("current"), v)
	})
	w.e.OfferKeyset(w.tr.KeysetEnvelope) // version 1 again
	w.tr.SigningKey = k1
	_, own3 := w.composition(names.NodeModule, "", true, revFile("net:conf", "", "/srv/net/conf", "by a revoked key\n"))
	w.offer(own3)
	b, _ := os.ReadFile(filepath.Join(w.root, "srv", "net", "conf"))
	if string(b) == "by a revoked key\n" || w.e.Status().GetKeysetVersion() == 1 {
		t.Fatalf("rollback keyset taken (version %d) after the kept version 2 stopped verifying; disk holds %q", w.e.Status().GetKeysetVersion(), b)
	}
	w.e.mu.Lock()
	refused := w.e.keysetRefused
	w.e.mu.Unlock()
	if want := "keyset refused: version 1 is older than version 2 (the newest this engine took; the kept keyset does not verify against the pinned roots: "; len(refused) < len(want) || refused[:len(want)] != want {
		t.Errorf("refusal %q, want it to start %q", refused, want)
	}
}

// A marks record that is not there reads as none kept: the engine raises
// its high-water mark to the applied manifest's, so a replay of an older
// manifest (validly signed, unexpired, its composition served again) is
// refused, REVISION_CONFLICT, and the node does not go back.
func TestLostMarksRaisedToTheAppliedManifest(t *testing.T) {
	w := newUnitWorld(t)
	env1, own1 := w.composition(names.NodeModule, "", true, revFile("net:conf", "", "/srv/net/conf", "one\n"))
	old, _ := w.tr.Sign(t, typev1.PayloadType_PAYLOAD_TYPE_MANIFEST, &typev1.Manifest{Node: "ace", Revision: 1,
		IssuedAt: timestamppb.New(w.now), ExpiresAt: timestamppb.New(w.now.Add(24 * time.Hour)), KeysetVersion: 1, Wants: []*typev1.Want{own1}})
	w.e.OfferManifest(old)
	w.e.Pass(context.Background())
	w.rev = 1
	_, own2 := w.composition(names.NodeModule, "", true, revFile("net:conf", "", "/srv/net/conf", "two\n"))
	w.offer(own2) // revision 2
	if b, _ := os.ReadFile(filepath.Join(w.root, "srv", "net", "conf")); string(b) != "two\n" {
		t.Fatalf("revision 2 not applied: %q", b)
	}
	w.restartEditing(func(tx *bolt.Tx) error {
		return tx.Bucket([]byte(state.SectionHighWater)).Delete([]byte("marks"))
	})
	w.e.OfferKeyset(w.tr.KeysetEnvelope)
	w.comp.comps[own1.GetCompositionKey()] = env1
	w.e.OfferManifest(old)
	w.e.Pass(context.Background())
	if b, _ := os.ReadFile(filepath.Join(w.root, "srv", "net", "conf")); string(b) != "two\n" {
		t.Fatalf("the marks record lost, the replayed revision 1 was applied over the applied revision 2: disk holds %q", b)
	}
	st := w.e.Status()
	if st.GetHighWater() != 2 {
		t.Errorf("high-water %d, want 2 (the applied manifest's)", st.GetHighWater())
	}
	w.e.mu.Lock()
	code := w.e.refused.code
	w.e.mu.Unlock()
	if code.String() != "REASON_CODE_REVISION_CONFLICT" {
		t.Errorf("replay refused with %s, want REVISION_CONFLICT", code)
	}
}

// Keysets offered faster than passes take them are bounded as manifests
// are: a stream cannot make the engine hold an unbounded queue of
// unverified payloads.
func TestKeysetOffersBounded(t *testing.T) {
	w := newUnitWorld(t)
	junk := make([]byte, 64<<10)
	for range 1000 {
		w.e.OfferKeyset(&typev1.Envelope{PayloadType: typev1.PayloadType_PAYLOAD_TYPE_KEYSET, Payload: junk})
	}
	w.e.mu.Lock()
	n := len(w.e.keysetOffers)
	w.e.mu.Unlock()
	if n > MaxOffers {
		t.Fatalf("%d keysets queued for a pass, want at most %d", n, MaxOffers)
	}
}
