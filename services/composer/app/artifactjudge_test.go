package app_test

import (
	"testing"
	"time"

	composerv1 "mesh.dev/proto/mesh/composer/v1"
	typev1 "mesh.dev/proto/mesh/type/v1"
	ct "mesh.dev/services/composer/internal/composertest"
)

// TestManualHoldsAnArtifactOnlyChange: a MANUAL module whose new build
// changes only an artifact's bytes (same manifest, so the same composition
// resources; other parts) does not move without an approval: the node
// would run another binary. The judgement compares the bytes the builds'
// parts name, not only the artifact refs.
func TestManualHoldsAnArtifactOnlyChange(t *testing.T) {
	t.Parallel()
	w := ct.New(t)
	c := w.StartManual(t, "one")
	tool := &typev1.ModuleManifest{Module: "tool", Version: "1.0",
		Upgrade: ct.Policy(typev1.UpgradePolicy_UPGRADE_POLICY_MANUAL, "operators approve new binaries"),
		Resources: []*typev1.ResourceTemplate{{Name: "bin", Type: ct.File, Path: "/usr/local/bin/tool", Mode: 0o755,
			Content: &typev1.ResourceTemplate_Artifact{Artifact: "binary:tool"}}}}
	fp1 := w.Publish(t, tool, map[string][]byte{"binary:tool": []byte("tool v1")}, ct.PublishOptions{Register: true})
	ct.WaitFor(t, "registration seen", 10*time.Second, func() (bool, string) {
		r, ok := c.View.Registration("tool")
		return ok && r.GetFingerprint() == fp1, "not yet"
	})
	// The first placement is let through by the node's own policy; then
	// the manifest's MANUAL applies.
	first := ct.Spec("ace", "tool")
	first.Policies = map[string]*typev1.Policy{"tool": ct.Auto}
	c.PutNode(t, first)
	if res := c.Pass(t, "ace"); res.Err != nil || !res.Committed {
		t.Fatalf("first pass: %v", res.Err)
	}
	a1, _, err := w.Assignment(t, "ace")
	ct.Must(t, err)
	if ct.Want(a1, "tool").GetFingerprint() != fp1 {
		t.Fatalf("first wants %v", a1.GetWants())
	}
	applyAll(t, w, a1)
	c.PutNode(t, ct.Spec("ace", "tool"))
	if res := c.Pass(t, "ace"); res.Err != nil {
		t.Fatal(res.Err)
	}

	// A new source snapshot: same manifest, new binary bytes.
	fp2 := w.Publish(t, tool, map[string][]byte{"binary:tool": []byte("tool v2, unreviewed")},
		ct.PublishOptions{Register: true, Repository: "git.example/infra-next"})
	if fp2 == fp1 {
		t.Fatal("same fingerprint")
	}
	ct.WaitFor(t, "registration seen", 10*time.Second, func() (bool, string) {
		r, ok := c.View.Registration("tool")
		return ok && r.GetFingerprint() == fp2, "not yet"
	})
	res := c.Pass(t, "ace")
	if res.Err != nil {
		t.Fatal(res.Err)
	}
	for _, cp := range res.Compositions {
		if cp.Module == "tool" {
			t.Logf("tool judged %v %q", cp.Judged.Judgement, cp.Judged.Words)
		}
	}
	a2, _, err := w.Assignment(t, "ace")
	ct.Must(t, err)
	want := ct.Want(a2, "tool")
	if want.GetFingerprint() != fp1 {
		t.Errorf("MANUAL module moved without approval to %s (parts %v), want held at %s", want.GetFingerprint(), want.GetParts(), fp1)
	}
	held := false
	for _, h := range a2.GetHolds() {
		held = held || (h.GetModule() == "tool" && h.GetJudgement() != composerv1.Judgement_JUDGEMENT_SAME)
	}
	if !held {
		t.Errorf("no hold of tool: %v", a2.GetHolds())
	}
}

// reviewApplyAll plays the engine: it reports every want of an assignment
// applied, straight into bucket haves.
