package app_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"mesh.dev/internal/natsx"
	composerv1 "mesh.dev/proto/mesh/composer/v1"
	typev1 "mesh.dev/proto/mesh/type/v1"
	ct "mesh.dev/services/composer/internal/composertest"
)

// TestStatus covers the node status of DESIGN.md §5.3 (bucket status,
// GetStatus, ListStatus): the last compose error naming node, module and
// resource, holds, the manifest's revision and expiry, wanted against
// applied digests, and last seen (persisted at most every 5 minutes).
func TestStatus(t *testing.T) {
	t.Parallel()
	w := ct.New(t)
	c := w.StartManual(t, "one")
	op := c.Operator(t)
	ctx := context.Background()
	motd := w.Release(t, ct.Motd("1.0"), nil)
	sshd := w.Release(t, ct.SSHD("1.0", ""), nil)
	waitFingerprint(t, c, "motd", motd)
	waitFingerprint(t, c, "sshd", sshd)
	get := func(node string) *composerv1.NodeStatus {
		t.Helper()
		resp, err := op.GetStatus(ctx, &composerv1.GetStatusRequest{Node: node})
		ct.Must(t, err)
		return resp.GetStatus()
	}

	broken := ct.Spec("ace", "motd", "sshd")
	broken.Modules[1].Params = nil
	c.PutNode(t, broken)
	c.Pass(t, "ace")
	st := get("ace")
	if !strings.Contains(st.GetLastError(), "node ace, module sshd, resource sshd:config") || st.GetLastErrorAt() == nil || st.GetConverged() {
		t.Errorf("status after a failing pass: %v", st)
	}

	spec := ct.Spec("ace", "motd", "sshd")
	c.PutNode(t, spec)
	c.Pass(t, "ace")
	a, _, _ := w.Assignment(t, "ace")
	st = get("ace")
	if st.GetLastError() != "" || st.GetManifestRevision() != a.GetManifestRevision() || !st.GetManifestExpiresAt().AsTime().Equal(a.GetManifestExpiresAt().AsTime()) {
		t.Errorf("status after a clean pass: %v", st)
	}
	if len(st.GetModules()) != 3 {
		t.Fatalf("modules %v", st.GetModules())
	}
	for _, m := range st.GetModules() {
		if m.GetWantedDigest() != ct.Want(a, m.GetModule()).GetCompositionDigest() || m.GetAppliedDigest() != "" {
			t.Errorf("module status %v", m)
		}
	}

	// The engine applies everything and is connected; sshd is then pinned
	// and a new version held.
	applyAll(t, w, a)
	e := w.Dial(t, c.Addr, "ace", &composerv1.Hello{Node: "ace", KeysetVersion: 1, ReportSeq: 1})
	recvManifest(t, e)
	spec.Policies = map[string]*typev1.Policy{"sshd": ct.Policy(typev1.UpgradePolicy_UPGRADE_POLICY_PINNED, "")}
	c.PutNode(t, spec)
	sshd2 := w.Release(t, ct.SSHD("2.0", ""), nil)
	waitFingerprint(t, c, "sshd", sshd2)
	c.Pass(t, "ace")
	a, _, _ = w.Assignment(t, "ace")
	st = get("ace")
	if len(st.GetHolds()) != 1 || st.GetHolds()[0].GetModule() != "sshd" || st.GetLastSeen() == nil || time.Since(st.GetLastSeen().AsTime()) > time.Minute {
		t.Errorf("status with a hold and a connected engine: holds %v last seen %v", st.GetHolds(), st.GetLastSeen())
	}
	for _, m := range st.GetModules() {
		if m.GetAppliedDigest() != m.GetWantedDigest() || m.GetState() != composerv1.AttemptState_ATTEMPT_STATE_APPLIED {
			t.Errorf("module status %v", m)
		}
		if (m.GetModule() == "sshd") != (m.GetHold() != nil) {
			t.Errorf("module %s hold %v", m.GetModule(), m.GetHold())
		}
	}
	// A held move changes the assignment, not the manifest: the node runs
	// what it must.
	if !st.GetConverged() || st.GetManifestRevision() != st.GetAppliedRevision() {
		t.Errorf("not converged: manifest r%d applied r%d", st.GetManifestRevision(), st.GetAppliedRevision())
	}
	// A pass with nothing new writes no status, though the engine is
	// still seen: last seen is persisted at most every 5 minutes.
	rec := w.RecordWrites(t, natsx.BucketStatus)
	c.Pass(t, "ace")
	if got := rec.All(); len(got) != 0 {
		t.Errorf("a pass with nothing new wrote %v", got)
	}
	// What a status read says, though, is the hub's last seen (now, while
	// the engine streams), not the one persisted.
	first := get("ace").GetLastSeen().AsTime()
	time.Sleep(1100 * time.Millisecond)
	if next := get("ace").GetLastSeen().AsTime(); next.Sub(first) < time.Second {
		t.Errorf("last seen of a streaming engine read %s, then %s a second later", first, next)
	}
	// The hold is lifted: a new manifest the engine has not applied.
	spec.Policies = nil
	c.PutNode(t, spec)
	c.Pass(t, "ace")
	if st := get("ace"); st.GetConverged() || len(st.GetHolds()) != 0 {
		t.Errorf("converged before the engine applied the new manifest: %v", st)
	}
	a, _, _ = w.Assignment(t, "ace")
	applyAll(t, w, a)
	c.Pass(t, "ace")
	if st := get("ace"); !st.GetConverged() || st.GetAppliedRevision() != a.GetManifestRevision() {
		t.Errorf("status once the engine applied the manifest: %v", st)
	}

	c.PutNode(t, ct.Spec("bob", "motd"))
	c.Pass(t, "bob")
	list, err := op.ListStatus(ctx, &composerv1.ListStatusRequest{})
	ct.Must(t, err)
	if len(list.GetStatuses()) != 2 || list.GetStatuses()[0].GetNode() != "ace" || list.GetStatuses()[1].GetNode() != "bob" {
		t.Errorf("ListStatus %v", list.GetStatuses())
	}
	if _, err := op.GetStatus(ctx, &composerv1.GetStatusRequest{Node: "zed"}); status.Code(err) != codes.NotFound {
		t.Errorf("GetStatus of a node with none: %v", err)
	}
}
