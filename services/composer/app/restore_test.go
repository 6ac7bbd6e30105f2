package app_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/structpb"

	"mesh.dev/internal/natsx"
	"mesh.dev/internal/testutil"
	catalogv1 "mesh.dev/proto/mesh/catalog/v1"
	composerv1 "mesh.dev/proto/mesh/composer/v1"
	ct "mesh.dev/services/composer/internal/composertest"
	"mesh.dev/services/composer/internal/pass"
)

// reachable waits until the world's NATS connection (the catalog's, the
// signer's and the composers' alike) serves JetStream again after a
// restart.
func reachable(t testing.TB, w *ct.World) {
	t.Helper()
	ct.WaitFor(t, "jetstream reachable", 30*time.Second, func() (bool, string) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_, err := w.JS.AccountInfo(ctx)
		if err != nil {
			return false, err.Error()
		}
		_, err = w.Catalog.ListModules(ctx, &catalogv1.ListModulesRequest{})
		return err == nil, "catalog: " + errString(err)
	})
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// TestConvergesAfterTheStoreWentBack: nats-server's store goes back to an
// older snapshot under a running composer (a registration, an assignment
// and the compositions written since are lost; the catalog's and the
// composer's watches see sequences handed out again). The composer ends
// where the store says, the older module, and once the engine reports the
// lost manifest applied, at a manifest revision above it, with every
// composition the manifest names held; then on the change registered
// again.
func TestConvergesAfterTheStoreWentBack(t *testing.T) {
	t.Parallel()
	w := ct.New(t)
	c := w.StartComposer(t, "one")
	motd1 := w.Release(t, ct.Motd("1.0"), nil)
	c.PutNode(t, ct.Spec("a", "motd"))
	w.Converged(t, "a", map[string]string{"motd": motd1})

	var snap string
	w.Embedded, snap = testutil.SnapshotJetStream(t, w.Embedded)
	reachable(t, w)
	motd2 := w.Release(t, ct.Motd("2.0"), nil)
	lost := w.Converged(t, "a", map[string]string{"motd": motd2})

	w.Embedded = testutil.RollbackJetStream(t, w.Embedded, snap)
	reachable(t, w)
	// The store itself holds the assignment of motd 1.0 again, at its old
	// revision, which the engine that applied the lost one refuses; it
	// reports what it applied (its high-water), as its Hello does, and the
	// composer signs again above it.
	w.Converged(t, "a", map[string]string{"motd": motd1})
	applyAll(t, w, lost)
	var back *composerv1.Assignment
	ct.WaitFor(t, "a assigned motd 1.0 above the lost revision", 30*time.Second, func() (bool, string) {
		back = w.Converged(t, "a", map[string]string{"motd": motd1})
		return back.GetManifestRevision() > lost.GetManifestRevision(), fmt.Sprintf("manifest revision %d, the lost one %d (last pass %+v)",
			back.GetManifestRevision(), lost.GetManifestRevision(), w.LastPass("a"))
	})
	if _, err := w.CheckAssignment(t, back); err != nil {
		t.Error(err)
	}
	if reg, ok := c.View.Registration("motd"); !ok || reg.GetFingerprint() != motd1 {
		t.Errorf("the catalog view holds motd at %s (%v), the catalog %s", reg.GetFingerprint(), ok, motd1)
	}

	// Published again: its entry, build and registration were lost too.
	if fp := w.Release(t, ct.Motd("2.0"), nil); fp != motd2 {
		t.Fatalf("motd 2.0 published again has fingerprint %s, not %s", fp, motd2)
	}
	again := w.Converged(t, "a", map[string]string{"motd": motd2})
	if again.GetManifestRevision() <= back.GetManifestRevision() {
		t.Errorf("motd 2.0 again at manifest revision %d, not above %d", again.GetManifestRevision(), back.GetManifestRevision())
	}
	if _, err := w.CheckAssignment(t, again); err != nil {
		t.Error(err)
	}
}

// TestCatalogViewFollowsTheCatalogAfterTheStoreWentBack: the catalog is
// down while nats-server's store goes back to an older snapshot, so the
// composer's catalog view resumes its watch from a revision the store no
// longer reaches; the catalog sends every registration again. The view
// becomes exactly what the catalog holds — a module registered only since
// the snapshot is registered no more — and resumes from the catalog's
// revision, not the lost one.
func TestCatalogViewFollowsTheCatalogAfterTheStoreWentBack(t *testing.T) {
	t.Parallel()
	w := ct.New(t)
	c := w.StartComposer(t, "one")
	motd1 := w.Release(t, ct.Motd("1.0"), nil)
	c.PutNode(t, ct.Spec("a", "motd", "sshd"))
	w.Converged(t, "a", map[string]string{"motd": motd1})

	var snap string
	w.Embedded, snap = testutil.SnapshotJetStream(t, w.Embedded)
	reachable(t, w)
	sshd1 := w.Release(t, ct.SSHD("1.0", ""), nil)
	lost := w.Converged(t, "a", map[string]string{"motd": motd1, "sshd": sshd1})

	w.StopCatalog(t)
	w.Embedded = testutil.RollbackJetStream(t, w.Embedded, snap)
	w.StartCatalog(t)
	reachable(t, w)
	applyAll(t, w, lost)
	ct.WaitFor(t, "a assigned motd alone above the lost revision", 30*time.Second, func() (bool, string) {
		a, _, err := w.Assignment(t, "a")
		if err != nil {
			return false, err.Error()
		}
		got := map[string]string{}
		for _, want := range a.GetWants() {
			got[want.GetModule()] = want.GetFingerprint()
		}
		return a.GetManifestRevision() > lost.GetManifestRevision() && got["motd"] == motd1 && got["sshd"] == "",
			fmt.Sprintf("wants %v at manifest revision %d, the lost one %d (last pass %+v)", got, a.GetManifestRevision(), lost.GetManifestRevision(), w.LastPass("a"))
	})
	if reg, ok := c.View.Registration("sshd"); ok && reg.GetFingerprint() != "" {
		t.Errorf("the catalog view still registers sshd at %s", reg.GetFingerprint())
	}
	kv := w.KV(t, natsx.BucketCatalogModules)
	last, err := kv.LastSequence(context.Background())
	ct.Must(t, err)
	if got := c.View.Revision(); got > last {
		t.Errorf("the catalog view resumes from revision %d, beyond the store's last %d", got, last)
	}
}

// TestSpecRevisionHandedOutAgain: after nats-server's store went back to an
// older snapshot, a node spec written anew gets the revision a lost spec had;
// the pass composes the spec the store holds, not the one a cache kept
// under that revision.
func TestSpecRevisionHandedOutAgain(t *testing.T) {
	t.Parallel()
	w := ct.New(t)
	c := w.StartManual(t, "one")
	motd := w.Release(t, ct.Motd("1.0"), nil)
	sshd := w.Release(t, ct.SSHD("1.0", ""), nil)
	c.PutNode(t, ct.Spec("a", "motd"))
	c.Pass(t, "a")

	var snap string
	w.Embedded, snap = testutil.SnapshotJetStream(t, w.Embedded)
	reachable(t, w)
	lostRev := c.PutNode(t, ct.Spec("a", "motd", "sshd"))
	if res := c.Pass(t, "a"); res.Err != nil {
		t.Fatal(res.Err)
	}

	w.Embedded = testutil.RollbackJetStream(t, w.Embedded, snap)
	reachable(t, w)
	spec := ct.Spec("a", "motd", "sshd")
	params, err := structpb.NewStruct(map[string]any{"port": 2222})
	ct.Must(t, err)
	spec.Modules[1].Params = params
	ct.WaitFor(t, "the spec written anew", 30*time.Second, func() (bool, string) {
		_, err := c.Operator(t).PutNode(context.Background(), &composerv1.PutNodeRequest{Spec: spec})
		return err == nil, errString(err)
	})
	_, rev, err := c.Store.Spec(context.Background(), "a")
	ct.Must(t, err)
	if rev != lostRev {
		t.Fatalf("the spec written anew has revision %d, the lost one had %d: the test needs them equal", rev, lostRev)
	}
	ct.WaitFor(t, "a pass under the lease", 30*time.Second, func() (bool, string) {
		if !c.Lease.Held() {
			return false, "lease not held"
		}
		// Refused while the catalog view reads the registrations again.
		res, err := c.Passer.Run(context.Background(), "a", pass.Write, nil)
		return err == nil && res.Committed, fmt.Sprint(err)
	})
	a := w.Converged(t, "a", map[string]string{"motd": motd, "sshd": sshd})
	comp, err := w.Composition(t, "a", ct.Want(a, "sshd"))
	ct.Must(t, err)
	for _, r := range comp.GetResources() {
		if r.GetPath() == "/etc/ssh/sshd_config" && !strings.Contains(string(r.GetInline()), "Port 2222") {
			t.Errorf("sshd_config says %q, the spec asks for port 2222", r.GetInline())
		}
	}
}
