package pass_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/structpb"

	"mesh.dev/internal/natsx"
	composerv1 "mesh.dev/proto/mesh/composer/v1"
	typev1 "mesh.dev/proto/mesh/type/v1"
	ct "mesh.dev/services/composer/internal/composertest"
	"mesh.dev/services/composer/internal/pass"
)

// An approval that arrives in the middle of a pass, after the write of the
// move it approves was deferred and before the assigner decides: the pass
// decides both on the approvals it began with, so its want names what the
// key holds, and the next pass moves.
func TestApprovalMidPassIsDecidedOnce(t *testing.T) {
	w := ct.New(t)
	c := w.StartManual(t, "one")
	released(t, w, c, ct.SSHD("1.0", ""), ct.Motd("1.0"))
	spec := ct.Spec("ace", "motd", "sshd")
	a1 := placedAndApplied(t, w, c, spec)
	held := ct.Want(a1, "sshd")
	spec.Policies = map[string]*typev1.Policy{"sshd": ct.Policy(typev1.UpgradePolicy_UPGRADE_POLICY_MANUAL, "review")}
	for _, pm := range spec.Modules {
		if pm.GetModule() == "sshd" {
			pm.Params.Fields["port"] = structpb.NewNumberValue(2222)
		}
	}
	c.PutNode(t, spec)
	res := c.Pass(t, "ace")
	a2, _, err := w.Assignment(t, "ace")
	ct.Must(t, err)
	var newDigest string
	for _, h := range a2.GetHolds() {
		if h.GetModule() == "sshd" {
			newDigest = h.GetCompositionDigest()
		}
	}
	if newDigest == "" || ct.Want(a2, "sshd").GetCompositionDigest() != held.GetCompositionDigest() {
		t.Fatalf("setup: pass 2 err %v holds %v wants %v", res.Err, a2.GetHolds(), a2.GetWants())
	}
	// Motd moves in the next pass, so something is signed after sshd was deferred.
	released(t, w, c, ct.Motd("2.0"))
	pass.SetHooks(c.Passer, pass.Hooks{BeforeSign: func(keys []string) {
		_, err := c.Operator(t).Approve(context.Background(), &composerv1.ApproveRequest{Module: "sshd", Digests: []string{newDigest}})
		ct.Must(t, err)
		ct.WaitFor(t, "approval seen", 10*time.Second, func() (bool, string) {
			return len(c.Reconciler.Approvals()) > 0, "no"
		})
	}})
	res = c.Pass(t, "ace")
	pass.SetHooks(c.Passer, pass.Hooks{})
	a3, _, err := w.Assignment(t, "ace")
	ct.Must(t, err)
	want := ct.Want(a3, "sshd")
	e, err := w.KV(t, natsx.BucketCompositions).Get(context.Background(), want.GetCompositionKey())
	ct.Must(t, err)
	heldNow := digestOf(t, e.Value)
	t.Logf("pass 3 committed=%v err=%v; sshd want %s; key holds %s (old %s new %s)", res.Committed, res.Err, want.GetCompositionDigest(), heldNow, held.GetCompositionDigest(), newDigest)
	if heldNow != want.GetCompositionDigest() {
		t.Fatalf("the assignment wants %s at %s but the compositions bucket holds %s", want.GetCompositionKey(), want.GetCompositionDigest(), heldNow)
	}
	if want.GetCompositionDigest() != held.GetCompositionDigest() {
		t.Fatalf("the pass moved sshd on an approval it did not begin with: wants %s", want.GetCompositionDigest())
	}
	res = c.Pass(t, "ace")
	a4, _, err := w.Assignment(t, "ace")
	ct.Must(t, err)
	want = ct.Want(a4, "sshd")
	e, err = w.KV(t, natsx.BucketCompositions).Get(context.Background(), want.GetCompositionKey())
	ct.Must(t, err)
	if res.Err != nil || want.GetCompositionDigest() != newDigest || digestOf(t, e.Value) != newDigest {
		t.Fatalf("the pass after the approval: err %v, sshd wants %s, the key holds %s; want %s", res.Err, want.GetCompositionDigest(), digestOf(t, e.Value), newDigest)
	}
}

func dirModule(name string) *typev1.ModuleManifest {
	return &typev1.ModuleManifest{Module: name, Version: "1", Upgrade: ct.Auto, Resources: []*typev1.ResourceTemplate{
		{Name: "f", Type: ct.File, Path: "/srv/{{ .Params.dir }}/f", Mode: 0o644, Content: ct.Text(name + "\n")},
	}}
}

// A move at the same key (a change of params) that the assigner reverts,
// because a path it declares is still declared by a held composition, is
// not written: the module keeps wanting the composition its key holds,
// and says why it waits.
func TestRevertedSameKeyMoveKeepsTheWantedComposition(t *testing.T) {
	w := ct.New(t)
	c := w.StartManual(t, "one")
	released(t, w, c, dirModule("alpha"), dirModule("beta"))
	spec := ct.Spec("ace", "alpha", "beta")
	setDir := func(m, d string) {
		for _, pm := range spec.Modules {
			if pm.GetModule() == m {
				pm.Params.Fields["dir"] = structpb.NewStringValue(d)
			}
		}
	}
	setDir("alpha", "z")
	setDir("beta", "p")
	a1 := placedAndApplied(t, w, c, spec)
	spec.Policies = map[string]*typev1.Policy{"beta": ct.Policy(typev1.UpgradePolicy_UPGRADE_POLICY_MANUAL, "review")}
	setDir("alpha", "p")
	setDir("beta", "q")
	c.PutNode(t, spec)
	res := c.Pass(t, "ace")
	a2, _, err := w.Assignment(t, "ace")
	ct.Must(t, err)
	t.Logf("pass 2: committed %v err %v\nwants %v\nholds %v", res.Committed, res.Err, a2.GetWants(), a2.GetHolds())
	before, now := ct.Want(a1, "alpha"), ct.Want(a2, "alpha")
	if before == nil || now == nil {
		t.Fatalf("alpha, wanted before (%v), is no longer wanted: its held composition was overwritten by a move the assigner then reverted", before)
	}
	e, err := w.KV(t, natsx.BucketCompositions).Get(context.Background(), now.GetCompositionKey())
	ct.Must(t, err)
	if now.GetCompositionDigest() != before.GetCompositionDigest() || digestOf(t, e.Value) != before.GetCompositionDigest() {
		t.Fatalf("alpha wants %s, the key holds %s; want both %s", now.GetCompositionDigest(), digestOf(t, e.Value), before.GetCompositionDigest())
	}
	var why string
	for _, h := range a2.GetHolds() {
		if h.GetModule() == "alpha" {
			why = h.GetReason()
		}
	}
	if !strings.Contains(why, "path /srv/p/f is still declared by ace.beta.") {
		t.Fatalf("alpha's hold says %q; want the path still declared by beta", why)
	}
}

// An approval revoked while a pass writes the move it approves: the pass
// decided on the approvals it began with, but the move is not committed.
// An Apply of a plan that counted on it is stale; a pass of its own fails
// and the next decides without it.
func TestApprovalRevokedMidPassIsNotCommitted(t *testing.T) {
	for _, apply := range []bool{true, false} {
		t.Run(fmt.Sprintf("apply=%v", apply), func(t *testing.T) {
			w := ct.New(t)
			c := w.StartManual(t, "one")
			released(t, w, c, ct.Motd("1.0"))
			spec := ct.Spec("ace", "motd")
			spec.Policies = map[string]*typev1.Policy{"motd": ct.Policy(typev1.UpgradePolicy_UPGRADE_POLICY_MANUAL, "review")}
			c.PutNode(t, spec)
			if res := c.Pass(t, "ace"); res.Err != nil || !res.Committed {
				t.Fatalf("first pass: %v", res.Err)
			}
			fpM2 := released(t, w, c, ct.Motd("2.0"))["motd"]
			ctx := context.Background()
			plan, err := c.Passer.Run(ctx, "ace", pass.Plan, nil)
			ct.Must(t, err)
			if len(plan.Holds) != 1 {
				t.Fatalf("plan holds %v; want motd held", plan.Holds)
			}
			res, err := approvedThenRevokedWhileSigning(t, c, "motd", plan, apply)
			a, _, aerr := w.Assignment(t, "ace")
			ct.Must(t, aerr)
			if got := ct.Want(a, "motd").GetFingerprint(); got == fpM2 {
				t.Fatalf("motd moved to %s on an approval revoked mid-pass", got)
			}
			switch {
			case apply && !errors.Is(err, pass.ErrStale):
				t.Fatalf("Apply: %v; want stale", err)
			case !apply && (res == nil || res.Committed || res.Err == nil || !strings.Contains(res.Err.Error(), "was revoked while it wrote: not committed")):
				t.Fatalf("pass: %v (%v); want it failed, not committed, saying the approval was revoked", res, err)
			}
		})
	}
}

// An approval revoked while the pass writes the move it approves at the
// same key (a change of params): the move is written over the composition
// the node wants, then not committed. The key is put back to what the
// want names, and the next pass keeps the module wanted there, held.
func TestApprovalRevokedMidPassPutsTheWantedCompositionBack(t *testing.T) {
	for _, apply := range []bool{true, false} {
		t.Run(fmt.Sprintf("apply=%v", apply), func(t *testing.T) {
			w := ct.New(t)
			c := w.StartManual(t, "one")
			released(t, w, c, ct.SSHD("1.0", ""))
			spec := ct.Spec("ace", "sshd")
			held := ct.Want(placedAndApplied(t, w, c, spec), "sshd")
			spec.Policies = map[string]*typev1.Policy{"sshd": ct.Policy(typev1.UpgradePolicy_UPGRADE_POLICY_MANUAL, "review")}
			spec.Modules[0].Params.Fields["port"] = structpb.NewNumberValue(2222)
			c.PutNode(t, spec)
			ctx := context.Background()
			plan, err := c.Passer.Run(ctx, "ace", pass.Plan, nil)
			ct.Must(t, err)
			if len(plan.Holds) != 1 || plan.Holds[0].GetCompositionKey() != held.GetCompositionKey() {
				t.Fatalf("plan holds %v; want sshd held at its key", plan.Holds)
			}
			_, err = approvedThenRevokedWhileSigning(t, c, "sshd", plan, apply)
			if apply && !errors.Is(err, pass.ErrStale) {
				t.Fatalf("Apply: %v; want stale", err)
			}
			keyHolds := func() string {
				e, err := w.KV(t, natsx.BucketCompositions).Get(ctx, held.GetCompositionKey())
				ct.Must(t, err)
				return digestOf(t, e.Value)
			}
			if got := keyHolds(); got != held.GetCompositionDigest() {
				t.Fatalf("after the move was not committed the key holds %s; want the wanted %s put back", got, held.GetCompositionDigest())
			}
			if res := c.Pass(t, "ace"); res.Err != nil {
				t.Fatalf("the pass after: %v", res.Err)
			}
			a, _, err := w.Assignment(t, "ace")
			ct.Must(t, err)
			if got := ct.Want(a, "sshd"); got.GetCompositionDigest() != held.GetCompositionDigest() || keyHolds() != held.GetCompositionDigest() {
				t.Fatalf("the pass after: sshd wants %v, the key holds %s; want both %s", got, keyHolds(), held.GetCompositionDigest())
			}
		})
	}
}

// approvedThenRevokedWhileSigning approves the move plan holds of module,
// then runs a Write pass (with apply, the Apply of the plan made once the
// approval was seen) during which the approval is revoked, before the pass
// signs what it writes.
func approvedThenRevokedWhileSigning(t *testing.T, c *ct.Composer, module string, plan *pass.Result, apply bool) (*pass.Result, error) {
	t.Helper()
	ctx := context.Background()
	ap, err := c.Operator(t).Approve(ctx, &composerv1.ApproveRequest{Module: module, Digests: []string{plan.Holds[0].GetCompositionDigest()}})
	ct.Must(t, err)
	ct.WaitFor(t, "approval seen", 10*time.Second, func() (bool, string) { return len(c.Reconciler.Approvals()) == 1, "not yet" })
	plan, err = c.Passer.Run(ctx, "ace", pass.Plan, nil)
	ct.Must(t, err)
	pass.SetHooks(c.Passer, pass.Hooks{BeforeSign: func([]string) {
		_, err := c.Operator(t).RevokeApproval(ctx, &composerv1.RevokeApprovalRequest{Id: ap.GetApproval().GetId()})
		ct.Must(t, err)
		ct.WaitFor(t, "revocation seen", 10*time.Second, func() (bool, string) { return len(c.Reconciler.Approvals()) == 0, "not yet" })
	}})
	defer pass.SetHooks(c.Passer, pass.Hooks{})
	var expect *composerv1.AssignmentInputs
	if apply {
		expect = plan.Inputs
	}
	return c.Passer.Run(ctx, "ace", pass.Write, expect)
}

// released releases module manifests and waits until the composer sees
// each registered at its new fingerprint; it returns the fingerprints by
// module.
func released(t *testing.T, w *ct.World, c *ct.Composer, manifests ...*typev1.ModuleManifest) map[string]string {
	t.Helper()
	fps := map[string]string{}
	for _, m := range manifests {
		fps[m.GetModule()] = w.Release(t, m, nil)
	}
	ct.WaitFor(t, "releases seen", 10*time.Second, func() (bool, string) {
		for m, fp := range fps {
			if r, _ := c.View.Registration(m); r.GetFingerprint() != fp {
				return false, m + " not yet"
			}
		}
		return true, ""
	})
	return fps
}

// placedAndApplied puts a node's spec, runs its first pass and reports
// every want applied at the manifest's revision, as its engine would; it
// returns the first assignment.
func placedAndApplied(t *testing.T, w *ct.World, c *ct.Composer, spec *composerv1.NodeSpec) *composerv1.Assignment {
	t.Helper()
	node := spec.GetNode()
	c.PutNode(t, spec)
	if res := c.Pass(t, node); res.Err != nil || !res.Committed {
		t.Fatalf("first pass: committed %v, %v", res.Committed, res.Err)
	}
	a, _, err := w.Assignment(t, node)
	ct.Must(t, err)
	reported := appliedAll(a, 1)
	reported.HighWater = a.GetManifestRevision()
	w.Put(t, natsx.BucketHaves, node, reported)
	return a
}
