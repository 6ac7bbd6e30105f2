package apply

import (
	"os"
	"path/filepath"
	"testing"

	typev1 "mesh.dev/proto/mesh/type/v1"
	"mesh.dev/services/nodeengine/internal/state"
)

// An adopted directory that another composition's file lies under, and that
// vanished from disk (rm -rf by an operator), is made again as a missing
// parent of that file, and the ledger keeps it adopted (the declared
// directory's own prepare is skipped: the parent op's record is its
// record): when the resources leave, the operator's directory is restored,
// not removed (DESIGN §7: adoption keeps the prior and restores it).
func TestAdoptedDirKeptWhenRemadeAsAParent(t *testing.T) {
	a, root := testApplier(t)
	app := filepath.Join(root, "srv", "app")
	if err := os.Mkdir(app, 0o750); err != nil {
		t.Fatal(err)
	}
	fp := "fp1:" + "0000000000000000000000000000000000000000000000000000000000000001"
	web := &Composition{Module: "web", Key: "ace.web." + fp[4:], Env: &typev1.Envelope{},
		Comp: &typev1.Composition{Node: "ace", Module: "web", Fingerprint: fp,
			Resources: []*typev1.Resource{fileRes("web:conf", "/srv/app/web.conf", "listen 80\n")}}}
	node := nodeComposition([]*typev1.Resource{dirRes("node:app", "/srv/app", 0o755)}, "/srv/app")

	ledger, res := applyPlan(t, a, map[string]*state.LedgerRecord{}, true, web, node)
	if len(res.Failed) > 0 || ledger["/srv/app"].Adopted == nil {
		t.Fatalf("first apply: failed %v, /srv/app record %+v", res.Failed, ledger["/srv/app"])
	}
	// Drift: the directory and what is in it are removed.
	if err := os.RemoveAll(app); err != nil {
		t.Fatal(err)
	}
	ledger, res = applyPlan(t, a, ledger, true, web, node)
	if len(res.Failed) > 0 {
		t.Fatalf("drift correction failed: %v", res.Failed)
	}
	if r := ledger["/srv/app"]; r.Adopted == nil {
		t.Errorf("after drift correction the ledger forgot that /srv/app was adopted: %+v", *r)
	}
	// Both resources leave: the adopted directory must come back, not go.
	applyPlan(t, a, ledger, true, nodeComposition(nil, "/srv/app"))
	if fi, err := os.Lstat(app); err != nil || !fi.IsDir() {
		t.Fatalf("the operator's adopted directory /srv/app was removed, not restored: %v", err)
	}
}
