package app_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	"mesh.dev/internal/names"
	"mesh.dev/internal/natsx"
	composerv1 "mesh.dev/proto/mesh/composer/v1"
	typev1 "mesh.dev/proto/mesh/type/v1"
	ct "mesh.dev/services/composer/internal/composertest"
)

func TestComposeSignAndCommit(t *testing.T) {
	t.Parallel()
	w := ct.New(t)
	c := w.StartComposer(t, "one")
	op := c.Operator(t)
	ctx := context.Background()
	sshdFP := w.Release(t, ct.SSHD("1.0", ""), nil)
	motdFP := w.Release(t, ct.Motd("1.0"), nil)
	c.PutNode(t, ct.Spec("ace", "sshd", "motd"))
	a := w.Converged(t, "ace", map[string]string{"sshd": sshdFP, "motd": motdFP})
	m, err := w.CheckAssignment(t, a)
	if err != nil {
		t.Fatal(err)
	}
	if len(m.GetWants()) != 3 {
		t.Fatalf("manifest wants %v", m.GetWants())
	}
	for _, want := range m.GetWants() {
		comp, err := w.Composition(t, "ace", want)
		if err != nil {
			t.Fatal(err)
		}
		if want.GetModule() == "motd" && string(comp.GetResources()[0].GetInline()) != "Welcome to ace (1.0)\n" {
			t.Errorf("motd rendered %q", comp.GetResources()[0].GetInline())
		}
	}
	// The node's own want: module node, no fingerprint, key <node>.node.
	own := ct.Want(a, names.NodeModule)
	if own == nil || own.GetFingerprint() != "" || own.GetCompositionKey() != "ace.node" || len(own.GetParts()) != 0 {
		t.Errorf("the node's own want is %v", own)
	}
	// Applying a fresh plan with no change writes nothing.
	rec := w.RecordWrites(t, natsx.BucketCompositions, natsx.BucketComposed, natsx.BucketAssignments, natsx.BucketStatus)
	if _, err := op.Apply(ctx, &composerv1.ApplyRequest{Nodes: mustPlan(t, op, "ace")}); err != nil {
		t.Fatal(err)
	}
	if got := rec.All(); len(got) != 0 {
		t.Errorf("a pass with no change wrote %v", got)
	}
}

func mustPlan(t testing.TB, op composerv1.ComposerServiceClient, nodes ...string) []*composerv1.NodePlan {
	t.Helper()
	resp, err := op.Plan(context.Background(), &composerv1.PlanRequest{Nodes: nodes})
	if err != nil {
		t.Fatal(err)
	}
	return resp.GetNodes()
}

// TestDeclarations covers GetDeclaration (DESIGN.md §4): templates over
// node, facts and params, ids prefixed with the module; a missing key names
// node, module and resource; two resources on one path name both ids.
func TestDeclarations(t *testing.T) {
	t.Parallel()
	w := ct.New(t)
	c := w.StartManual(t, "one")
	op := c.Operator(t)
	ctx := context.Background()
	m := &typev1.ModuleManifest{Module: "app", Version: "1.0", Upgrade: ct.Auto, Resources: []*typev1.ResourceTemplate{
		{Name: "conf", Type: ct.File, Path: "/etc/app/{{ .Node }}.conf", Mode: 0o640, Content: ct.Text("ip={{ .Facts.ip }} port={{ .Params.port }} node={{ .Node }}\n")},
	}}
	fp := w.Release(t, m, nil)
	ct.WaitFor(t, "registration seen", 10*time.Second, func() (bool, string) {
		r, ok := c.View.Registration("app")
		return ok && r.GetFingerprint() == fp, "not yet"
	})
	facts, _ := structpb.NewStruct(map[string]any{"ip": "10.0.0.7"})
	good := ct.Spec("ace", "app")
	good.Facts = facts
	good.Resources = []*typev1.Resource{{Id: "local:hosts", Type: ct.File, Path: "/etc/hosts", Mode: 0o644, Content: &typev1.Resource_Inline{Inline: []byte("127.0.0.1 localhost\n")}}}
	missing := ct.Spec("bob", "app")
	missing.Facts = facts
	missing.Modules[0].Params = nil
	clash := ct.Spec("cat", "app")
	clash.Facts = facts
	clash.Resources = []*typev1.Resource{{Id: "local:app", Type: ct.File, Path: "/etc/app/cat.conf", Content: &typev1.Resource_Inline{}}}
	for _, s := range []*composerv1.NodeSpec{good, missing, clash} {
		c.PutNode(t, s)
	}

	cases := []struct {
		name  string
		node  string
		code  codes.Code
		words []string
	}{
		{"rendered", "ace", codes.OK, nil},
		{"missing key names node, module and resource", "bob", codes.FailedPrecondition, []string{"node bob", "module app", "resource app:conf", "port"}},
		{"two resources on one path name both ids", "cat", codes.FailedPrecondition, []string{"2 resources declare /etc/app/cat.conf", "app:conf", "local:app"}},
		{"no spec", "dan", codes.NotFound, []string{"no node spec of dan"}},
		{"bad name", "Dan!", codes.InvalidArgument, []string{"node"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			resp, err := op.GetDeclaration(ctx, &composerv1.GetDeclarationRequest{Node: tc.node})
			if status.Code(err) != tc.code {
				t.Fatalf("GetDeclaration(%s) = %v, want %s", tc.node, err, tc.code)
			}
			for _, word := range tc.words {
				if !strings.Contains(status.Convert(err).Message(), word) {
					t.Errorf("error %q does not name %q", status.Convert(err).Message(), word)
				}
			}
			if tc.code != codes.OK {
				return
			}
			d := resp.GetDeclaration()
			if d.GetFingerprints()["app"] != fp || len(d.GetResources()) != 2 {
				t.Fatalf("declaration %v", d)
			}
			r := d.GetResources()[0]
			if r.GetId() != "app:conf" || r.GetModule() != "app" || r.GetPath() != "/etc/app/ace.conf" ||
				string(r.GetInline()) != "ip=10.0.0.7 port=22 node=ace\n" {
				t.Errorf("rendered %v", r)
			}
		})
	}
	// A pass over a node whose declaration fails writes nothing and says why.
	res := c.Pass(t, "bob")
	if res.Err == nil || !strings.Contains(res.Err.Error(), "resource app:conf") {
		t.Errorf("pass of bob: %v", res.Err)
	}
	if _, _, err := w.Assignment(t, "bob"); err == nil {
		t.Error("a node whose declaration fails got an assignment")
	}
}

// TestModuleMovedIntoOwn covers DESIGN.md §5.1 rule 3 end to end: a module
// taken out of its own composition into the node's own (no longer placed,
// the node's own resources naming it) drops its want in the same manifest
// that carries the moved resources, and no path is ever declared by two
// compositions of one manifest.
func TestModuleMovedIntoOwn(t *testing.T) {
	t.Parallel()
	w := ct.New(t)
	c := w.StartManual(t, "one")
	wg := &typev1.ModuleManifest{Module: "wg", Version: "1.0", Upgrade: ct.Auto, Resources: []*typev1.ResourceTemplate{
		{Name: "dir", Type: ct.Dir, Path: "/etc/wireguard", Mode: 0o700},
		{Name: "conf", Type: ct.File, Path: "/etc/wireguard/wg0.conf", Mode: 0o600, Content: ct.Text("[Interface]\n")},
		{Name: "key", Type: ct.File, Path: "/etc/wireguard/key", Mode: 0o600, Content: ct.Text("")},
	}}
	wgFP := w.Release(t, wg, nil)
	motdFP := w.Release(t, ct.Motd("1.0"), nil)
	ct.WaitFor(t, "registrations seen", 10*time.Second, func() (bool, string) {
		_, a := c.View.Registration("wg")
		_, b := c.View.Registration("motd")
		return a && b, "not yet"
	})
	spec := ct.Spec("ace", "wg", "motd")
	spec.Filled = []string{"/etc/wireguard/key"}
	c.PutNode(t, spec)
	if res := c.Pass(t, "ace"); res.Err != nil || !res.Committed {
		t.Fatalf("first pass: %v", res.Err)
	}
	before, _, err := w.Assignment(t, "ace")
	ct.Must(t, err)
	if ct.Want(before, "wg").GetFingerprint() != wgFP || ct.Want(before, "motd").GetFingerprint() != motdFP {
		t.Fatalf("wants %v", before.GetWants())
	}
	// The engine applied it.
	applyAll(t, w, before)

	// wg leaves: the node's own resources name it now, as a module with no
	// build.
	moved := ct.Spec("ace", "motd")
	moved.Filled = spec.Filled
	moved.Resources = []*typev1.Resource{
		{Id: "wg:dir", Module: "wg", Type: ct.Dir, Path: "/etc/wireguard", Mode: 0o700},
		{Id: "wg:conf", Module: "wg", Type: ct.File, Path: "/etc/wireguard/wg0.conf", Mode: 0o600, Content: &typev1.Resource_Inline{Inline: []byte("[Interface]\n")}},
		{Id: "wg:key", Module: "wg", Type: ct.File, Path: "/etc/wireguard/key", Mode: 0o600, Content: &typev1.Resource_Inline{}},
	}
	c.PutNode(t, moved)
	rec := w.RecordWrites(t, natsx.BucketAssignments)
	res := c.Pass(t, "ace")
	if res.Err != nil || !res.Committed {
		t.Fatalf("pass after the move: %v", res.Err)
	}
	if n := len(rec.All()); n != 1 {
		t.Fatalf("the move took %d assignment writes, want one manifest", n)
	}
	after, _, err := w.Assignment(t, "ace")
	ct.Must(t, err)
	if ct.Want(after, "wg") != nil {
		t.Errorf("the manifest carrying the moved resources still wants wg: %v", after.GetWants())
	}
	if len(after.GetMoved()) != 1 || after.GetMoved()[0] != "wg" {
		t.Errorf("moved %v", after.GetMoved())
	}
	m, err := w.CheckAssignment(t, after)
	ct.Must(t, err)
	paths := map[string]string{}
	for _, want := range m.GetWants() {
		comp, err := w.Composition(t, "ace", want)
		ct.Must(t, err)
		for _, r := range comp.GetResources() {
			if other, ok := paths[r.GetPath()]; ok {
				t.Errorf("%s is declared by %s and %s in one manifest", r.GetPath(), other, want.GetCompositionKey())
			}
			paths[r.GetPath()] = want.GetCompositionKey()
		}
		if want.GetModule() == names.NodeModule {
			if len(comp.GetResources()) != 3 || comp.GetResources()[0].GetModule() != "" || names.ModuleOfID(comp.GetResources()[0].GetId()) != "wg" {
				t.Errorf("own composition %v", comp.GetResources())
			}
			if len(comp.GetFilled()) != 1 || comp.GetFilled()[0] != "/etc/wireguard/key" {
				t.Errorf("the moved module's filled path is not in the node's own: %v", comp.GetFilled())
			}
		}
	}
	if paths["/etc/wireguard/wg0.conf"] != "ace.node" {
		t.Errorf("paths %v", paths)
	}
	// The own composition is judged against the applied own composition;
	// nothing of the module's content changed.
	for _, cp := range res.Compositions {
		if cp.Key == "ace.node" && cp.Judged.Judgement != composerv1.Judgement_JUDGEMENT_ADDS {
			t.Errorf("own judged %v %q", cp.Judged.Judgement, cp.Judged.Words)
		}
	}
}

// applyAll plays the engine: it reports every want of an assignment
// applied, straight into bucket haves.
func applyAll(t testing.TB, w *ct.World, a *composerv1.Assignment) {
	t.Helper()
	rec := &composerv1.HaveRecord{Node: a.GetNode(), ReportSeq: uint64(time.Now().UnixNano()),
		Applied: &composerv1.ManifestRef{Revision: a.GetManifestRevision(), Digest: a.GetManifestDigest()}, HighWater: a.GetManifestRevision()}
	for _, want := range a.GetWants() {
		rec.Haves = append(rec.Haves, &composerv1.Have{Module: want.GetModule(),
			Applied: &composerv1.AppliedRef{Fingerprint: want.GetFingerprint(), Key: want.GetCompositionKey(), Digest: want.GetCompositionDigest()},
			Attempt: &composerv1.Attempt{Fingerprint: want.GetFingerprint(), Key: want.GetCompositionKey(), Digest: want.GetCompositionDigest(),
				State: composerv1.AttemptState_ATTEMPT_STATE_APPLIED}})
	}
	w.Put(t, natsx.BucketHaves, a.GetNode(), rec)
}

// TestPutNodeValidated covers the validation of node specs: PutNode refuses
// an invalid spec with InvalidArgument naming the field, and stores nothing.
func TestPutNodeValidated(t *testing.T) {
	t.Parallel()
	w := ct.New(t)
	c := w.StartManual(t, "one")
	op := c.Operator(t)
	twice := ct.Spec("ace", "motd", "motd")
	_, err := op.PutNode(context.Background(), &composerv1.PutNodeRequest{Spec: twice})
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(status.Convert(err).Message(), "spec.modules[1].module: motd is placed twice") {
		t.Fatalf("PutNode of a spec placing motd twice: %v", err)
	}
	if _, err := op.GetNode(context.Background(), &composerv1.GetNodeRequest{Node: "ace"}); status.Code(err) != codes.NotFound {
		t.Errorf("GetNode after a refused PutNode: %v, want NotFound", err)
	}
}
