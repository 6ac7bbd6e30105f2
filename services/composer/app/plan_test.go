package app_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"mesh.dev/internal/names"
	"mesh.dev/internal/natsx"
	composerv1 "mesh.dev/proto/mesh/composer/v1"
	typev1 "mesh.dev/proto/mesh/type/v1"
	ct "mesh.dev/services/composer/internal/composertest"
)

var allBuckets = []string{natsx.BucketCompositions, natsx.BucketComposed, natsx.BucketAssignments, natsx.BucketStatus,
	natsx.BucketHaves, natsx.BucketApprovals, natsx.BucketNodes}

// TestPlanApply covers Plan and Apply: a plan says per node what a pass
// would write (keys, digests, judgements, words, holds, wants) and the input
// revisions it read, and writes nothing; Apply commits each node whose
// inputs did not move and names the others.
func TestPlanApply(t *testing.T) {
	t.Parallel()
	w := ct.New(t)
	c := w.StartManual(t, "one")
	op := c.Operator(t)
	ctx := context.Background()
	motd := w.Release(t, ct.Motd("1.0"), nil)
	waitFingerprint(t, c, "motd", motd)
	aceRev := c.PutNode(t, ct.Spec("ace", "motd"))
	c.PutNode(t, ct.Spec("bob", "motd"))
	rec := w.RecordWrites(t, allBuckets...)
	resp, err := op.Plan(ctx, &composerv1.PlanRequest{Selector: &typev1.LabelSelector{MatchLabels: map[string]string{"zone": "a"}}})
	ct.Must(t, err)
	if got := rec.All(); len(got) != 0 {
		t.Fatalf("Plan wrote %v", got)
	}
	if len(resp.GetNodes()) != 2 || resp.GetNodes()[0].GetNode() != "ace" || resp.GetNodes()[1].GetNode() != "bob" {
		t.Fatalf("plan nodes %v", resp.GetNodes())
	}
	ace := resp.GetNodes()[0]
	key := "ace.motd." + names.FingerprintHex(motd)
	if ace.GetError() != "" || !ace.GetChanges() || len(ace.GetCompositions()) != 2 {
		t.Fatalf("plan of ace %v", ace)
	}
	cp := ace.GetCompositions()[0]
	if cp.GetKey() != key || !names.ValidDigest(cp.GetDigest()) || !cp.GetWrite() ||
		cp.GetJudgement() != composerv1.Judgement_JUDGEMENT_NEW || cp.GetWords() != "new: 1 path" {
		t.Errorf("planned composition %v", cp)
	}
	if ace.GetCompositions()[1].GetKey() != "ace.node" {
		t.Errorf("the node's own composition is not planned last: %v", ace.GetCompositions())
	}
	in := ace.GetInputs()
	if in.GetSpecRevision() != aceRev || in.GetFingerprints()["motd"] != motd || in.GetAssignmentRevision() != 0 || in.GetHavesRevision() != 0 {
		t.Errorf("inputs %v", in)
	}
	if ct.Want(ace, "motd").GetCompositionDigest() != cp.GetDigest() {
		t.Errorf("planned wants %v", ace.GetWants())
	}

	// bob's spec moves after the plan: only ace is applied.
	s := ct.Spec("bob", "motd")
	s.Labels["rack"] = "r1"
	c.PutNode(t, s)
	applied, err := op.Apply(ctx, &composerv1.ApplyRequest{Nodes: resp.GetNodes()})
	ct.Must(t, err)
	if len(applied.GetApplied()) != 1 || applied.GetApplied()[0] != "ace" || len(applied.GetStale()) != 1 ||
		applied.GetStale()[0].GetNode() != "bob" || !strings.Contains(applied.GetStale()[0].GetReason(), "inputs moved") {
		t.Fatalf("Apply: %v", applied)
	}
	a, _, err := w.Assignment(t, "ace")
	ct.Must(t, err)
	if ct.Want(a, "motd").GetCompositionDigest() != cp.GetDigest() {
		t.Errorf("applied %v, planned %s", a.GetWants(), cp.GetDigest())
	}
	if _, _, err := w.Assignment(t, "bob"); err == nil {
		t.Error("a stale plan was applied")
	}
	// A plan applied twice: the assignment it read moved.
	again, err := op.Apply(ctx, &composerv1.ApplyRequest{Nodes: resp.GetNodes()[:1]})
	ct.Must(t, err)
	if len(again.GetStale()) != 1 || !strings.Contains(again.GetStale()[0].GetReason(), "assignment r0") {
		t.Errorf("Apply of a used plan: %v", again)
	}
	if _, err := op.Apply(ctx, &composerv1.ApplyRequest{Nodes: []*composerv1.NodePlan{{Node: "ace"}}}); status.Code(err) != codes.InvalidArgument {
		t.Errorf("Apply without inputs: %v", err)
	}
	// The node's haves move after a plan (its engine reported): the plan is
	// stale and nothing of it is applied.
	fresh := mustPlan(t, op, "ace")
	asgBefore, asgRev, err := w.Assignment(t, "ace")
	ct.Must(t, err)
	w.Put(t, natsx.BucketHaves, "ace", &composerv1.HaveRecord{Node: "ace", ReportSeq: 1,
		Applied: &composerv1.ManifestRef{Revision: asgBefore.GetManifestRevision(), Digest: asgBefore.GetManifestDigest()}, HighWater: asgBefore.GetManifestRevision()})
	movedHaves, err := op.Apply(ctx, &composerv1.ApplyRequest{Nodes: fresh})
	ct.Must(t, err)
	if len(movedHaves.GetApplied()) != 0 || len(movedHaves.GetStale()) != 1 || !strings.Contains(movedHaves.GetStale()[0].GetReason(), "haves r0") {
		t.Errorf("Apply after the haves moved: %v", movedHaves)
	}
	if _, rev, _ := w.Assignment(t, "ace"); rev != asgRev {
		t.Errorf("a stale plan rewrote the assignment (r%d → r%d)", asgRev, rev)
	}

	t.Run("an approval the plan counted on is revoked", func(t *testing.T) {
		s := ct.Spec("ace", "motd")
		s.Policies = map[string]*typev1.Policy{"motd": ct.Policy(typev1.UpgradePolicy_UPGRADE_POLICY_MANUAL, "")}
		c.PutNode(t, s)
		c.Pass(t, "ace")
		v2 := w.Release(t, ct.Motd("2.0"), nil)
		waitFingerprint(t, c, "motd", v2)
		cp, np := planned(t, op, "ace", "motd")
		if len(np.GetHolds()) != 1 {
			t.Fatalf("holds %v", np.GetHolds())
		}
		ap, err := op.Approve(ctx, &composerv1.ApproveRequest{Module: "motd", Digests: []string{cp.GetDigest()}})
		ct.Must(t, err)
		ct.WaitFor(t, "approval seen", 10*time.Second, func() (bool, string) {
			return len(c.Reconciler.Approvals()) == 1, "not yet"
		})
		_, np = planned(t, op, "ace", "motd")
		if len(np.GetHolds()) != 0 || len(np.GetInputs().GetApprovals()) != 1 {
			t.Fatalf("plan with the approval: holds %v inputs %v", np.GetHolds(), np.GetInputs())
		}
		_, err = op.RevokeApproval(ctx, &composerv1.RevokeApprovalRequest{Id: ap.GetApproval().GetId()})
		ct.Must(t, err)
		ct.WaitFor(t, "revocation seen", 10*time.Second, func() (bool, string) {
			return len(c.Reconciler.Approvals()) == 0, "not yet"
		})
		rec := w.RecordWrites(t, allBuckets...)
		resp, err := op.Apply(ctx, &composerv1.ApplyRequest{Nodes: []*composerv1.NodePlan{np}})
		ct.Must(t, err)
		if len(resp.GetStale()) != 1 || !strings.Contains(resp.GetStale()[0].GetReason(), "approvals") {
			t.Errorf("Apply after the approval went: %v", resp)
		}
		// Stale before anything is written: the new composition the plan
		// showed is not signed or written, nor its record, nor status.
		if got := rec.All(); len(got) != 0 {
			t.Errorf("a stale Apply wrote %v", got)
		}
		a, _, _ := w.Assignment(t, "ace")
		if ct.Want(a, "motd").GetFingerprint() == v2 {
			t.Error("the move went without its approval")
		}

		// The other way: a plan showed the move held, then an approval
		// lets it through. Applying the plan would commit what it did not
		// show: stale, nothing written.
		_, held := planned(t, op, "ace", "motd")
		if len(held.GetHolds()) != 1 {
			t.Fatalf("holds %v", held.GetHolds())
		}
		_, err = op.Approve(ctx, &composerv1.ApproveRequest{Module: "motd", Digests: []string{cp.GetDigest()}})
		ct.Must(t, err)
		ct.WaitFor(t, "approval seen", 10*time.Second, func() (bool, string) {
			return len(c.Reconciler.Approvals()) == 1, "not yet"
		})
		mark := rec.Mark()
		resp, err = op.Apply(ctx, &composerv1.ApplyRequest{Nodes: []*composerv1.NodePlan{held}})
		ct.Must(t, err)
		if len(resp.GetStale()) != 1 || !strings.Contains(resp.GetStale()[0].GetReason(), "planned with approvals [], now [ap-") {
			t.Errorf("Apply of a plan made before an approval: %v", resp)
		}
		if got := rec.Since(mark); len(got) != 0 {
			t.Errorf("a stale Apply wrote %v", got)
		}
	})

	t.Run("a replica without the lease does not apply", func(t *testing.T) {
		other := w.StartComposer(t, "two")
		ct.WaitFor(t, "the holder seen", 10*time.Second, func() (bool, string) {
			return other.Lease.Holder() == "one", other.Lease.Holder()
		})
		_, err := other.Operator(t).Apply(ctx, &composerv1.ApplyRequest{Nodes: resp.GetNodes()[:1]})
		if status.Code(err) != codes.Unavailable || !strings.Contains(fmt.Sprint(err), `"one"`) {
			t.Errorf("Apply on a replica without the lease: %v", err)
		}
	})
}

// TestUnknownNodeNamed: a node named that has no spec is NOT_FOUND naming
// it, in Plan (not an answer that leaves it out) and in ListCompositions
// of a node with nothing kept (not an empty list).
func TestUnknownNodeNamed(t *testing.T) {
	t.Parallel()
	w := ct.New(t)
	c := w.StartManual(t, "one")
	op := c.Operator(t)
	ctx := context.Background()
	motd := w.Release(t, ct.Motd("1.0"), nil)
	waitFingerprint(t, c, "motd", motd)
	c.PutNode(t, ct.Spec("ace", "motd"))
	_, err := op.Plan(ctx, &composerv1.PlanRequest{Nodes: []string{"ace", "nosuch", "zed"}})
	if status.Code(err) != codes.NotFound || !strings.Contains(status.Convert(err).Message(), "no node spec of nosuch, zed") {
		t.Errorf("Plan of unknown nodes: %v", err)
	}
	if _, err := op.Plan(ctx, &composerv1.PlanRequest{Nodes: []string{"ace"}}); err != nil {
		t.Errorf("Plan of ace: %v", err)
	}
	_, err = op.ListCompositions(ctx, &composerv1.ListCompositionsRequest{Node: "nosuch"})
	if status.Code(err) != codes.NotFound || !strings.Contains(status.Convert(err).Message(), "no node spec of nosuch") {
		t.Errorf("ListCompositions of an unknown node: %v", err)
	}
}
