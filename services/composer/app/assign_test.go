package app_test

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"mesh.dev/internal/names"
	"mesh.dev/internal/natsx"
	catalogv1 "mesh.dev/proto/mesh/catalog/v1"
	composerv1 "mesh.dev/proto/mesh/composer/v1"
	typev1 "mesh.dev/proto/mesh/type/v1"
	ct "mesh.dev/services/composer/internal/composertest"
)

// appManifest is module app at a version with the given files (path →
// content) under /etc/app and its data path /var/lib/app.
func appManifest(version string, files map[string]string, extra ...*typev1.ResourceTemplate) *typev1.ModuleManifest {
	m := &typev1.ModuleManifest{Module: "app", Version: version, Upgrade: ct.Auto, DataPaths: []string{"/var/lib/app"}, Resources: []*typev1.ResourceTemplate{
		{Name: "dir", Type: ct.Dir, Path: "/etc/app", Mode: 0o755},
		{Name: "data", Type: ct.Dir, Path: "/var/lib/app", Mode: 0o700},
	}}
	for _, name := range []string{"a", "b", "c"} {
		if content, ok := files[name]; ok {
			m.Resources = append(m.Resources, &typev1.ResourceTemplate{Name: name, Type: ct.File, Path: "/etc/app/" + name + ".conf", Mode: 0o644, Content: ct.Text(content)})
		}
	}
	m.Resources = append(m.Resources, extra...)
	return m
}

// planned returns the plan of a node's composition of a module.
func planned(t testing.TB, op composerv1.ComposerServiceClient, node, module string) (*composerv1.CompositionPlan, *composerv1.NodePlan) {
	t.Helper()
	plans := mustPlan(t, op, node)
	if len(plans) != 1 {
		t.Fatalf("plan of %s: %v", node, plans)
	}
	for _, cp := range plans[0].GetCompositions() {
		k, err := names.ParseCompositionKey(cp.GetKey())
		ct.Must(t, err)
		if k.Module == module {
			return cp, plans[0]
		}
	}
	t.Fatalf("plan of %s has no composition of %s: %v (error %q)", node, module, plans[0].GetCompositions(), plans[0].GetError())
	return nil, nil
}

// TestJudgements covers the six judgements of DESIGN.md §5.3 and their
// words, judged against the composition the node has applied (reported in
// bucket haves, as an engine would), not the one it is told to want.
func TestJudgements(t *testing.T) {
	t.Parallel()
	w := ct.New(t)
	c := w.StartManual(t, "one")
	op := c.Operator(t)
	v1 := w.Release(t, appManifest("1.0", map[string]string{"a": "a1", "b": "b1"}), nil)
	waitFingerprint(t, c, "app", v1)
	c.PutNode(t, ct.Spec("ace", "app"))
	res := c.Pass(t, "ace")
	if res.Err != nil || res.Compositions[0].Judged.Judgement != composerv1.Judgement_JUDGEMENT_NEW || res.Compositions[0].Judged.Words != "new: 4 paths" {
		t.Fatalf("first pass: %+v %v", res.Compositions[0].Judged, res.Err)
	}
	a1, _, _ := w.Assignment(t, "ace")
	applied := ct.Want(a1, "app").GetCompositionDigest()
	applyAll(t, w, a1)
	// The want moves on (AUTO), the engine does not apply it: judgements
	// stay against what it applied.
	moved := w.Release(t, appManifest("1.5", map[string]string{"a": "a0", "b": "b1"}), nil)
	waitFingerprint(t, c, "app", moved)
	if res := c.Pass(t, "ace"); res.Err != nil || !res.Committed {
		t.Fatalf("pass to 1.5: %v", res.Err)
	}

	data := &typev1.ResourceTemplate{Name: "seed", Type: ct.File, Path: "/var/lib/app/seed", Mode: 0o600, Content: ct.Text("x")}
	cases := []struct {
		name     string
		manifest *typev1.ModuleManifest
		want     composerv1.Judgement
		words    string
	}{
		{"SAME", appManifest("2.0", map[string]string{"a": "a1", "b": "b1"}), composerv1.Judgement_JUDGEMENT_SAME, "same resources"},
		{"ADDS", appManifest("2.1", map[string]string{"a": "a1", "b": "b1", "c": "c1"}), composerv1.Judgement_JUDGEMENT_ADDS, "adds /etc/app/c.conf"},
		{"REMOVES", appManifest("2.2", map[string]string{"a": "a1"}), composerv1.Judgement_JUDGEMENT_REMOVES, "removes /etc/app/b.conf"},
		{"CHANGES", appManifest("2.3", map[string]string{"a": "a2", "b": "b1"}), composerv1.Judgement_JUDGEMENT_CHANGES, "changes /etc/app/a.conf (content)"},
		{"DATA", appManifest("2.4", map[string]string{"a": "a1", "b": "b1"}, data), composerv1.Judgement_JUDGEMENT_DATA, "touches data path /var/lib/app; adds /var/lib/app/seed"},
	}
	for _, tc := range cases {
		fp := w.Release(t, tc.manifest, nil)
		waitFingerprint(t, c, "app", fp)
		cp, _ := planned(t, op, "ace", "app")
		if cp.GetJudgement() != tc.want || cp.GetWords() != tc.words {
			t.Errorf("%s: judged %v %q, want %v %q", tc.name, cp.GetJudgement(), cp.GetWords(), tc.want, tc.words)
		}
	}
	res = c.Pass(t, "ace")
	if res.Err != nil {
		t.Fatal(res.Err)
	}
	rec := &composerv1.JudgementRecord{}
	_, err := w.Get(t, natsx.BucketComposed, res.Compositions[0].Key, rec)
	ct.Must(t, err)
	if rec.GetJudgement() != composerv1.Judgement_JUDGEMENT_DATA || rec.GetAgainst() != applied || rec.GetPolicyFrom() != "manifest" {
		t.Errorf("judgement record %v (against %s)", rec, applied)
	}

	t.Run("against the node's own resources naming the module", func(t *testing.T) {
		// bob runs wg as own resources (no build); the engine applied
		// that; wg is then placed with a build of the same resources.
		spec := ct.Spec("bob")
		spec.Resources = []*typev1.Resource{{Id: "wg:conf", Module: "wg", Type: ct.File, Path: "/etc/wg.conf", Mode: 0o600, Content: &typev1.Resource_Inline{Inline: []byte("k")}}}
		c.PutNode(t, spec)
		if res := c.Pass(t, "bob"); res.Err != nil {
			t.Fatal(res.Err)
		}
		a, _, _ := w.Assignment(t, "bob")
		applyAll(t, w, a)
		wg := &typev1.ModuleManifest{Module: "wg", Version: "1.0", Upgrade: ct.Auto, Resources: []*typev1.ResourceTemplate{
			{Name: "conf", Type: ct.File, Path: "/etc/wg.conf", Mode: 0o600, Content: ct.Text("k")}}}
		fp := w.Release(t, wg, nil)
		waitFingerprint(t, c, "wg", fp)
		c.PutNode(t, ct.Spec("bob", "wg"))
		cp, _ := planned(t, op, "bob", "wg")
		own := ct.Want(a, names.NodeModule).GetCompositionDigest()
		if cp.GetJudgement() != composerv1.Judgement_JUDGEMENT_SAME || cp.GetWords() != "same resources" {
			t.Errorf("wg judged %v %q, want SAME against the own composition %s", cp.GetJudgement(), cp.GetWords(), own)
		}
	})
}

// svc is module svc at a version: a config, a user list and a data path.
func svc(version, conf, users string, extra ...*typev1.ResourceTemplate) *typev1.ModuleManifest {
	m := &typev1.ModuleManifest{Module: "svc", Version: version, Upgrade: ct.Auto, DataPaths: []string{"/var/lib/svc"}, Resources: []*typev1.ResourceTemplate{
		{Name: "conf", Type: ct.File, Path: "/etc/svc.conf", Mode: 0o644, Content: ct.Text(conf)},
		{Name: "users", Type: ct.File, Path: "/etc/svc.users", Mode: 0o644, UserList: true, Content: ct.Text(users)},
		{Name: "data", Type: ct.Dir, Path: "/var/lib/svc", Mode: 0o700},
	}}
	m.Resources = append(m.Resources, extra...)
	return m
}

// TestPoliciesAndApprovals covers the assigner (DESIGN.md §5.3): AUTO moves
// unless DATA, MANUAL holds unless SAME or user-list only, PINNED never
// moves; node-spec overrides (policy_from node-spec); ListHolds; approvals
// bound to module and digests (and a selector) let a held move go, and
// outlive a restart.
func TestPoliciesAndApprovals(t *testing.T) {
	t.Parallel()
	w := ct.New(t)
	c := w.StartManual(t, "one")
	op := c.Operator(t)
	v1 := w.Release(t, svc("1.0", "c1", "alice\n"), nil)
	waitFingerprint(t, c, "svc", v1)
	policies := map[string]typev1.UpgradePolicy{
		"n-manual": typev1.UpgradePolicy_UPGRADE_POLICY_MANUAL,
		"n-pinned": typev1.UpgradePolicy_UPGRADE_POLICY_PINNED,
	}
	nodes := []string{"n-auto", "n-manual", "n-pinned"}
	for _, n := range nodes {
		c.PutNode(t, ct.Spec(n, "svc"))
		if res := c.Pass(t, n); res.Err != nil || !res.Committed {
			t.Fatalf("%s: %v", n, res.Err)
		}
		a, _, _ := w.Assignment(t, n)
		applyAll(t, w, a)
		if p, ok := policies[n]; ok {
			s := ct.Spec(n, "svc")
			s.Policies = map[string]*typev1.Policy{"svc": ct.Policy(p, "ops review")}
			c.PutNode(t, s)
		}
	}
	const move = ""
	seed := &typev1.ResourceTemplate{Name: "seed", Type: ct.File, Path: "/var/lib/svc/seed", Content: ct.Text("s")}
	steps := []struct {
		name     string
		manifest *typev1.ModuleManifest
		// want is per node: move, or words the hold's reason contains.
		want map[string]string
	}{
		{"CHANGES", svc("2.0", "c2", "alice\n"), map[string]string{"n-auto": move,
			"n-manual": "policy MANUAL (from node-spec) holds CHANGES until approved: ops review",
			"n-pinned": "policy PINNED (from node-spec) holds CHANGES (pinned: change the policy to move): ops review"}},
		{"SAME", svc("2.1", "c1", "alice\n"), map[string]string{"n-auto": move, "n-manual": move,
			"n-pinned": "policy PINNED (from node-spec) holds SAME"}},
		{"user list only", svc("2.2", "c1", "alice\nbob\n"), map[string]string{"n-auto": move, "n-manual": move,
			"n-pinned": "policy PINNED (from node-spec) holds CHANGES"}},
		{"DATA", svc("2.3", "c1", "alice\n", seed), map[string]string{
			"n-auto":   "policy AUTO (from manifest) holds a change touching data until approved",
			"n-manual": "policy MANUAL (from node-spec) holds DATA until approved",
			"n-pinned": "policy PINNED (from node-spec) holds DATA"}},
	}
	// dataDigests are the DATA compositions' digests of every node (each
	// node's composition is its own).
	var dataDigests []string
	for _, step := range steps {
		fp := w.Release(t, step.manifest, nil)
		waitFingerprint(t, c, "svc", fp)
		for _, n := range nodes {
			res := c.Pass(t, n)
			if res.Err != nil {
				t.Fatalf("%s %s: %v", step.name, n, res.Err)
			}
			a, _, _ := w.Assignment(t, n)
			got := ct.Want(a, "svc")
			want := step.want[n]
			switch {
			case want == move && got.GetFingerprint() != fp:
				t.Errorf("%s: %s did not move (holds %v)", step.name, n, a.GetHolds())
			case want != move && got.GetFingerprint() == fp:
				t.Errorf("%s: %s moved, want held with %q", step.name, n, want)
			case want != move:
				if len(a.GetHolds()) != 1 || !strings.Contains(a.GetHolds()[0].GetReason(), want) {
					t.Errorf("%s: %s holds %v, want %q", step.name, n, a.GetHolds(), want)
					continue
				}
				h := a.GetHolds()[0]
				wantFrom := "node-spec"
				if n == "n-auto" {
					wantFrom = "manifest"
				}
				if h.GetPolicyFrom() != wantFrom || h.GetCompositionDigest() == "" {
					t.Errorf("%s: %s hold %v", step.name, n, h)
				}
				if step.name == "DATA" {
					dataDigests = append(dataDigests, h.GetCompositionDigest())
				}
			}
		}
	}

	holds, err := op.ListHolds(context.Background(), &composerv1.ListHoldsRequest{})
	ct.Must(t, err)
	var held []string
	for _, nh := range holds.GetNodes() {
		held = append(held, nh.GetNode())
	}
	if strings.Join(held, ",") != "n-auto,n-manual,n-pinned" {
		t.Errorf("ListHolds: %v", holds.GetNodes())
	}
	// Asked for one node, ListHolds names only that node.
	one, err := op.ListHolds(context.Background(), &composerv1.ListHoldsRequest{Node: "n-manual"})
	ct.Must(t, err)
	if len(one.GetNodes()) != 1 || one.GetNodes()[0].GetNode() != "n-manual" || len(one.GetNodes()[0].GetHolds()) == 0 {
		t.Errorf("ListHolds of n-manual: %v", one.GetNodes())
	}
	// The DATA move is approved: bound to the module and digests a plan
	// showed, optionally a selector.
	approve := func(module string, digests []string, sel map[string]string) {
		t.Helper()
		req := &composerv1.ApproveRequest{Module: module, Digests: digests, Note: "checked"}
		if sel != nil {
			req.Selector = &typev1.LabelSelector{MatchLabels: sel}
		}
		resp, err := op.Approve(context.Background(), req)
		ct.Must(t, err)
		ct.WaitFor(t, "approval seen", 10*time.Second, func() (bool, string) {
			for _, a := range c.Reconciler.Approvals() {
				if a.GetId() == resp.GetApproval().GetId() {
					return true, ""
				}
			}
			return false, "not yet"
		})
	}
	dataDigestsOf := func(n string) string {
		a, _, _ := w.Assignment(t, n)
		return ct.Want(a, "svc").GetCompositionDigest()
	}
	before := map[string]string{}
	for _, n := range nodes {
		before[n] = dataDigestsOf(n)
	}
	approve("other", dataDigests, nil)
	approve("svc", []string{"sha256:" + strings.Repeat("0", 64)}, nil)
	approve("svc", dataDigests, map[string]string{"zone": "b"})
	for _, n := range nodes {
		c.Pass(t, n)
		if got := dataDigestsOf(n); got != before[n] {
			t.Errorf("%s moved on an approval not binding it", n)
		}
	}
	if _, err := op.Approve(context.Background(), &composerv1.ApproveRequest{Module: "svc"}); status.Code(err) != codes.InvalidArgument {
		t.Errorf("an approval naming no digest: %v", err)
	}
	approve("svc", dataDigests, map[string]string{"zone": "a"})
	// A new composer (a restart) reads the approvals back.
	c.Stop()
	c2 := w.StartManual(t, "two")
	ct.WaitFor(t, "approvals read back", 10*time.Second, func() (bool, string) {
		return len(c2.Reconciler.Approvals()) == 4, "not yet"
	})
	for _, n := range nodes {
		res := c2.Pass(t, n)
		moved := slices.Contains(dataDigests, dataDigestsOf(n))
		if n == "n-pinned" {
			if moved {
				t.Error("an approval moved a PINNED node")
			}
			continue
		}
		if !moved {
			t.Errorf("%s did not move on its approval: holds %v", n, res.Holds)
		}
	}
	list, err := c2.Operator(t).ListApprovals(context.Background(), &composerv1.ListApprovalsRequest{Module: "svc"})
	ct.Must(t, err)
	if len(list.GetApprovals()) != 3 || list.GetApprovals()[0].GetApprovedBy() == "" {
		t.Errorf("ListApprovals: %v", list.GetApprovals())
	}
}

// TestWantsOnlyReleasedBuilds covers DESIGN.md §5.3: a want names only a
// fingerprint whose build is DONE and whose verdict is not FAIL; a newer
// registration that is not releasable keeps the node where it was, listed
// as a hold, and a build that becomes DONE is picked up.
func TestWantsOnlyReleasedBuilds(t *testing.T) {
	t.Parallel()
	w := ct.New(t)
	c := w.StartManual(t, "one")
	v1 := w.Release(t, ct.Motd("1.0"), nil)
	waitFingerprint(t, c, "motd", v1)
	c.PutNode(t, ct.Spec("ace", "motd"))
	c.Pass(t, "ace")
	cases := []struct {
		name string
		opts ct.PublishOptions
		hold string
	}{
		{"PENDING build", ct.PublishOptions{State: catalogv1.BuildState_BUILD_STATE_PENDING, Register: true}, "the build of %s is PENDING; keeping " + v1},
		{"FAILED build", ct.PublishOptions{State: catalogv1.BuildState_BUILD_STATE_FAILED, Register: true}, "the build of %s is FAILED; keeping " + v1},
		{"verdict FAIL", ct.PublishOptions{Verdict: catalogv1.Verdict_VERDICT_FAIL, Register: true}, "entry %s has verdict FAIL; keeping " + v1},
		{"no build", ct.PublishOptions{NoBuild: true, Register: true}, "no build of %s yet; keeping " + v1},
	}
	var last string
	for i, tc := range cases {
		fp := w.Publish(t, ct.Motd("2."+string(rune('0'+i))), nil, tc.opts)
		waitFingerprint(t, c, "motd", fp)
		res := c.Pass(t, "ace")
		if res.Err != nil {
			t.Fatal(res.Err)
		}
		a, _, _ := w.Assignment(t, "ace")
		want := strings.Replace(tc.hold, "%s", fp, 1)
		if ct.Want(a, "motd").GetFingerprint() != v1 || len(a.GetHolds()) != 1 || a.GetHolds()[0].GetReason() != want || a.GetHolds()[0].GetFingerprint() != fp {
			t.Errorf("%s: wants %v holds %v, want held with %q", tc.name, a.GetWants(), a.GetHolds(), want)
		}
		last = fp
	}
	// The last one's build is done now.
	_, err := w.Catalog.PutBuild(context.Background(), &catalogv1.PutBuildRequest{Build: &catalogv1.Build{Fingerprint: last, State: catalogv1.BuildState_BUILD_STATE_DONE}})
	ct.Must(t, err)
	c.Pass(t, "ace")
	a, _, _ := w.Assignment(t, "ace")
	if ct.Want(a, "motd").GetFingerprint() != last || len(a.GetHolds()) != 0 {
		t.Errorf("after the build is done: wants %v holds %v", a.GetWants(), a.GetHolds())
	}
	// A first placement of a module whose only registration is pending:
	// no want, a hold.
	pending := w.Publish(t, ct.SSHD("1.0", ""), nil, ct.PublishOptions{State: catalogv1.BuildState_BUILD_STATE_PENDING, Register: true})
	waitFingerprint(t, c, "sshd", pending)
	c.PutNode(t, ct.Spec("ace", "motd", "sshd"))
	c.Pass(t, "ace")
	a, _, _ = w.Assignment(t, "ace")
	if ct.Want(a, "sshd") != nil || len(a.GetHolds()) != 1 || a.GetHolds()[0].GetModule() != "sshd" {
		t.Errorf("wants %v holds %v", a.GetWants(), a.GetHolds())
	}
}
