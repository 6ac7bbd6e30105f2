package app_test

import (
	"context"
	"testing"

	"mesh.dev/internal/natsx"
	typev1 "mesh.dev/proto/mesh/type/v1"
	ct "mesh.dev/services/composer/internal/composertest"
)

// TestHeldCompositionRebuilt loses the composition a held want names (as a
// restore of the truth buckets alone does, DESIGN.md §9: derived data is
// rebuilt by recomposing): the next pass renders the module again at the
// wanted fingerprint, signs and writes the very same composition, and the
// node keeps wanting it instead of dropping the module.
func TestHeldCompositionRebuilt(t *testing.T) {
	t.Parallel()
	w := ct.New(t)
	c := w.StartManual(t, "one")
	v1 := w.Release(t, svc("1.0", "c1", "alice\n"), nil)
	waitFingerprint(t, c, "svc", v1)
	s := ct.Spec("ace", "svc")
	c.PutNode(t, s)
	if res := c.Pass(t, "ace"); res.Err != nil || !res.Committed {
		t.Fatalf("first pass: %v", res.Err)
	}
	a, _, _ := w.Assignment(t, "ace")
	applyAll(t, w, a)
	held := ct.Want(a, "svc")
	s.Policies = map[string]*typev1.Policy{"svc": ct.Policy(typev1.UpgradePolicy_UPGRADE_POLICY_MANUAL, "review")}
	c.PutNode(t, s)

	v2 := w.Release(t, svc("2.0", "c2", "alice\n"), nil)
	waitFingerprint(t, c, "svc", v2)
	if res := c.Pass(t, "ace"); res.Err != nil {
		t.Fatal(res.Err)
	}
	a, _, _ = w.Assignment(t, "ace")
	if got := ct.Want(a, "svc"); got.GetCompositionDigest() != held.GetCompositionDigest() || len(a.GetHolds()) != 1 {
		t.Fatalf("the move was not held: want %v holds %v", got, a.GetHolds())
	}

	// The held composition is lost.
	if err := w.KV(t, natsx.BucketCompositions).Purge(context.Background(), held.GetCompositionKey()); err != nil {
		t.Fatal(err)
	}
	if res := c.Pass(t, "ace"); res.Err != nil {
		t.Fatal(res.Err)
	}
	a, _, _ = w.Assignment(t, "ace")
	got := ct.Want(a, "svc")
	if got.GetCompositionDigest() != held.GetCompositionDigest() {
		t.Fatalf("after the loss the node wants %v, want the held %v (holds %v)", got, held, a.GetHolds())
	}
	if _, err := w.Composition(t, "ace", held); err != nil {
		t.Fatalf("the held composition was not rebuilt: %v", err)
	}
}
