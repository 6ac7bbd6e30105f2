package pass_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/structpb"

	"mesh.dev/internal/natsx"
	composerv1 "mesh.dev/proto/mesh/composer/v1"
	typev1 "mesh.dev/proto/mesh/type/v1"
	ct "mesh.dev/services/composer/internal/composertest"
)

// A params change of a MANUAL module at the same fingerprint is a held
// move (DESIGN.md §5.3): the node keeps wanting the composition it had,
// and that composition stays held — the new one has the same key
// (<node>.<module>.<fp>) and is not written over it (it once was, and the
// module then left the wants, so the engine would have removed its
// files). Approved, the move goes through.
func TestHeldParamsChangeKeepsTheWant(t *testing.T) {
	t.Parallel()
	w := ct.New(t)
	c := w.StartManual(t, "one")
	released(t, w, c, ct.SSHD("1.0", ""))
	spec := ct.Spec("ace", "sshd")
	c.PutNode(t, spec)
	if res := c.Pass(t, "ace"); res.Err != nil || !res.Committed {
		t.Fatalf("first pass: %v", res.Err)
	}
	a1, _, err := w.Assignment(t, "ace")
	ct.Must(t, err)
	held := ct.Want(a1, "sshd")
	if held == nil {
		t.Fatal("the first pass does not want sshd")
	}
	// The engine applied it.
	w.Put(t, natsx.BucketHaves, "ace", &composerv1.HaveRecord{Node: "ace", ReportSeq: 1, HighWater: a1.GetManifestRevision(),
		Applied: &composerv1.ManifestRef{Revision: a1.GetManifestRevision(), Digest: a1.GetManifestDigest()},
		Haves:   []*composerv1.Have{{Module: "sshd", Applied: &composerv1.AppliedRef{Fingerprint: held.GetFingerprint(), Key: held.GetCompositionKey(), Digest: held.GetCompositionDigest()}}}})
	spec.Policies = map[string]*typev1.Policy{"sshd": ct.Policy(typev1.UpgradePolicy_UPGRADE_POLICY_MANUAL, "review")}

	spec.Modules[0].Params.Fields["port"] = structpb.NewNumberValue(2222)
	c.PutNode(t, spec)
	res := c.Pass(t, "ace")
	a2, _, err := w.Assignment(t, "ace")
	ct.Must(t, err)
	got := ct.Want(a2, "sshd")
	if got.GetCompositionDigest() != held.GetCompositionDigest() {
		t.Errorf("pass (committed %v, err %v): sshd wanted at %v, want the held %s kept; holds %v", res.Committed, res.Err, got, held.GetCompositionDigest(), a2.GetHolds())
	}
	e, err := w.KV(t, natsx.BucketCompositions).Get(context.Background(), held.GetCompositionKey())
	if err == nil && digestOf(t, e.Value) != held.GetCompositionDigest() {
		t.Errorf("the wanted composition %s was overwritten by a move MANUAL holds", held.GetCompositionKey())
	}
	var hold *composerv1.Hold
	for _, h := range a2.GetHolds() {
		if h.GetModule() == "sshd" {
			hold = h
		}
	}
	if hold == nil || hold.GetCompositionDigest() == held.GetCompositionDigest() || hold.GetCompositionKey() != held.GetCompositionKey() {
		t.Fatalf("no hold of the new sshd composition at its key: %v", a2.GetHolds())
	}
	// Approved, the next pass writes it and wants it.
	_, err = c.Operator(t).Approve(context.Background(), &composerv1.ApproveRequest{Module: "sshd", Digests: []string{hold.GetCompositionDigest()}})
	ct.Must(t, err)
	ct.WaitFor(t, "the approved move", 10*time.Second, func() (bool, string) {
		c.Pass(t, "ace")
		a3, _, err := w.Assignment(t, "ace")
		if err != nil {
			return false, err.Error()
		}
		return ct.Want(a3, "sshd").GetCompositionDigest() == hold.GetCompositionDigest(), fmt.Sprintf("wants %v holds %v", a3.GetWants(), a3.GetHolds())
	})
	e, err = w.KV(t, natsx.BucketCompositions).Get(context.Background(), held.GetCompositionKey())
	ct.Must(t, err)
	if digestOf(t, e.Value) != hold.GetCompositionDigest() {
		t.Errorf("the approved composition is not the one held at %s", held.GetCompositionKey())
	}
}
