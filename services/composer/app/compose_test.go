package app_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"mesh.dev/internal/names"
	"mesh.dev/internal/natsx"
	composerv1 "mesh.dev/proto/mesh/composer/v1"
	typev1 "mesh.dev/proto/mesh/type/v1"
)

// converged waits until the node's assignment wants exactly the given
// fingerprints (module → fp) and returns it.
func (w *world) converged(t testing.TB, node string, fps map[string]string) *composerv1.Assignment {
	t.Helper()
	var a *composerv1.Assignment
	waitFor(t, node+" assigned", 20*time.Second, func() (bool, string) {
		var err error
		a, _, err = w.assignment(t, node)
		if err != nil {
			w.mu.Lock()
			defer w.mu.Unlock()
			return false, fmt.Sprintf("no assignment: %v (last pass: %v)", err, w.lastErr[node])
		}
		got := map[string]string{}
		for _, want := range a.GetWants() {
			if want.GetModule() != names.NodeModule {
				got[want.GetModule()] = want.GetFingerprint()
			}
		}
		if fmt.Sprint(got) != fmt.Sprint(fps) {
			return false, fmt.Sprintf("wants %v, holds %v", got, a.GetHolds())
		}
		return true, ""
	})
	return a
}

func TestComposeSignAndCommit(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	c := w.startComposer(t, "one")
	op := w.operator(t, c)
	ctx := context.Background()
	sshdFP := w.release(t, sshd("1.0", ""), nil)
	motdFP := w.release(t, motd("1.0"), nil)
	if _, err := op.PutNode(ctx, &composerv1.PutNodeRequest{Spec: spec(t, "ace", "sshd", "motd")}); err != nil {
		t.Fatal(err)
	}
	a := w.converged(t, "ace", map[string]string{"sshd": sshdFP, "motd": motdFP})
	m, digest, err := w.keyring(t).Manifest(a.GetManifest(), "ace", time.Now())
	if err != nil {
		t.Fatalf("manifest does not verify: %v", err)
	}
	if digest != a.GetManifestDigest() || m.GetRevision() != a.GetManifestRevision() || len(m.GetWants()) != 3 {
		t.Fatalf("manifest %v vs assignment %v", m, a)
	}
	for _, want := range m.GetWants() {
		comp := w.composition(t, "ace", want)
		if want.GetModule() == "motd" && string(comp.GetResources()[0].GetInline()) != "Welcome to ace (1.0)\n" {
			t.Errorf("motd rendered %q", comp.GetResources()[0].GetInline())
		}
	}
	// A second pass with no change writes nothing.
	kv, _ := natsx.OpenKV(ctx, w.js, natsx.BucketAssignments)
	before, _ := kv.Get(ctx, "ace")
	if _, err := op.Apply(ctx, &composerv1.ApplyRequest{Nodes: mustPlan(t, op, "ace")}); err != nil {
		t.Fatal(err)
	}
	after, _ := kv.Get(ctx, "ace")
	if after.Revision != before.Revision {
		t.Errorf("a pass with no change rewrote the assignment (%d → %d)", before.Revision, after.Revision)
	}
	_ = errors.New
	_ = typev1.Want{}
}

func mustPlan(t testing.TB, op composerv1.ComposerServiceClient, nodes ...string) []*composerv1.NodePlan {
	t.Helper()
	resp, err := op.Plan(context.Background(), &composerv1.PlanRequest{Nodes: nodes})
	if err != nil {
		t.Fatal(err)
	}
	return resp.GetNodes()
}
