package e2e

import (
	"context"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"mesh.dev/internal/names"
	nodeenginev1 "mesh.dev/proto/mesh/nodeengine/v1"
)

// TestNewFingerprintConvergesAll publishes a new fingerprint of a module
// placed on all three nodes (a copy of examples/modules/motd with an edited
// file) and waits until every engine's applied manifest names it and the file
// changed under every root, while every other module stays as it was.
func TestNewFingerprintConvergesAll(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	w := startMesh(t, 3)
	w.converge(ctx)

	before := map[string]*nodeenginev1.GetStatusResponse{}
	motdBefore := map[string]string{}
	for _, e := range w.m.Engines {
		s, err := w.status(ctx, e.Node)
		if err != nil {
			t.Fatal(err)
		}
		before[e.Node] = s
		motdBefore[e.Node] = readFile(t, filepath.Join(e.Root, "etc", "motd"))
	}
	oldFP := wantOf(before["dev-1"].GetWants(), "motd").GetFingerprint()

	// A new snapshot of motd: one more line and a new version.
	mods := filepath.Join(t.TempDir(), "modules")
	copyDir(t, filepath.Join(repoRoot(t), "examples", "modules", "motd"), filepath.Join(mods, "motd"))
	edit(t, filepath.Join(mods, "motd", "files", "motd"), func(s string) string { return s + "  edition: e2e\n" })
	edit(t, filepath.Join(mods, "motd", "module.yaml"), func(s string) string {
		return strings.Replace(s, "version: 1.0.2", "version: 1.0.3", 1)
	})
	published := w.publishDir(ctx, mods)["motd"]
	newFP := published.Fingerprint
	if !names.HasFingerprint(newFP) || newFP == oldFP || !published.Registered {
		t.Fatalf("publishing the edited motd: fingerprint %s (was %s), registered %v", newFP, oldFP, published.Registered)
	}

	after := w.waitConverged(ctx, func(node string, s *nodeenginev1.GetStatusResponse) (bool, string) {
		if got := wantOf(s.GetWants(), "motd").GetFingerprint(); got != newFP {
			return false, "motd wanted at " + got
		}
		if got := haveOf(s, "motd").GetApplied().GetFingerprint(); got != newFP {
			return false, "motd applied at " + got
		}
		return true, ""
	})
	for _, e := range w.m.Engines {
		got := readFile(t, filepath.Join(e.Root, "etc", "motd"))
		if got == motdBefore[e.Node] || !strings.Contains(got, "edition: e2e") || !strings.Contains(got, e.Node) {
			t.Errorf("%s: /etc/motd is %q, was %q", e.Node, got, motdBefore[e.Node])
		}
		b, a := before[e.Node], after[e.Node]
		if a.GetApplied().GetRevision() <= b.GetApplied().GetRevision() {
			t.Errorf("%s: applied revision %d, not above %d", e.Node, a.GetApplied().GetRevision(), b.GetApplied().GetRevision())
		}
		if a.GetHighWater() != a.GetApplied().GetRevision() {
			t.Errorf("%s: high-water %d, applied %d", e.Node, a.GetHighWater(), a.GetApplied().GetRevision())
		}
		// Every other module of the node kept its composition.
		for _, h := range b.GetHaves() {
			if h.GetModule() == "motd" || h.GetModule() == names.NodeModule {
				continue
			}
			if got := haveOf(a, h.GetModule()).GetApplied(); !proto.Equal(got, h.GetApplied()) {
				t.Errorf("%s: %s applied %v, was %v", e.Node, h.GetModule(), got, h.GetApplied())
			}
		}
	}
}

// TestFirstViewsListWhatIsKept checks each engine's FirstViews: empty lists
// (not null) before anything is kept; once converged, an ANSWERED entry
// for every wanted fingerprint with its module and since, and one want per
// module (never "node"), with since set and the want the engine holds.
func TestFirstViewsListWhatIsKept(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	start := time.Now()
	w := startMesh(t, 3)
	for _, e := range w.m.Engines {
		fv := e.FirstViews()
		if fv.Entries == nil || fv.Wants == nil || len(fv.Entries)+len(fv.Wants) != 0 {
			t.Errorf("%s: first views before any spec: entries %v (nil %v), wants %v (nil %v)", e.Node, fv.Entries, fv.Entries == nil, fv.Wants, fv.Wants == nil)
		}
	}
	w.converge(ctx)

	for _, e := range w.m.Engines {
		s, err := w.status(ctx, e.Node)
		if err != nil {
			t.Fatal(err)
		}
		fv, err := w.admin(e.Node).FirstViews(ctx, &nodeenginev1.FirstViewsRequest{})
		if err != nil {
			t.Fatal(err)
		}
		local := e.FirstViews()
		if local.Entries == nil || local.Wants == nil {
			t.Errorf("%s: in-process first views hold a null list", e.Node)
		}
		if !proto.Equal(local, fv) {
			t.Errorf("%s: the admin API's first views differ from the engine's:\n%v\n%v", e.Node, fv, local)
		}
		checkFirstViews(t, e.Node, s, fv, start, time.Now())
	}
}

// checkFirstViews checks one engine's first views against its status.
func checkFirstViews(t *testing.T, node string, s *nodeenginev1.GetStatusResponse, fv *nodeenginev1.FirstViewsResponse, notBefore, notAfter time.Time) {
	t.Helper()
	if !sort.SliceIsSorted(fv.GetEntries(), func(i, j int) bool { return fv.GetEntries()[i].GetFingerprint() < fv.GetEntries()[j].GetFingerprint() }) {
		t.Errorf("%s: entries not sorted by fingerprint", node)
	}
	if !sort.SliceIsSorted(fv.GetWants(), func(i, j int) bool { return fv.GetWants()[i].GetModule() < fv.GetWants()[j].GetModule() }) {
		t.Errorf("%s: wants not sorted by module", node)
	}
	entries := map[string]*nodeenginev1.EntryView{}
	for _, en := range fv.GetEntries() {
		entries[en.GetFingerprint()] = en
		if en.GetState() != entryAnswer {
			t.Errorf("%s: entry %s is %v (%s)", node, en.GetFingerprint(), en.GetState(), en.GetError())
		}
	}
	views := map[string]*nodeenginev1.WantView{}
	for _, v := range fv.GetWants() {
		views[v.GetModule()] = v
	}
	wanted := 0
	for _, want := range s.GetWants() {
		if want.GetModule() == names.NodeModule {
			if _, ok := views[names.NodeModule]; ok {
				t.Errorf("%s: first views list a want of node", node)
			}
			continue
		}
		wanted++
		en := entries[want.GetFingerprint()]
		switch {
		case en == nil:
			t.Errorf("%s: no entry of %s (wanted by %s)", node, want.GetFingerprint(), want.GetModule())
		case en.GetModule() != want.GetModule() || en.GetState() != entryAnswer || en.GetSince() == nil:
			t.Errorf("%s: entry of %s: %v", node, want.GetModule(), en)
		}
		v := views[want.GetModule()]
		switch {
		case v == nil:
			t.Errorf("%s: no want view of %s", node, want.GetModule())
		case !proto.Equal(v.GetWant(), want):
			t.Errorf("%s: want view of %s is %v, the engine holds %v", node, want.GetModule(), v.GetWant(), want)
		case v.GetSince() == nil:
			t.Errorf("%s: want of %s has no since", node, want.GetModule())
		case v.GetSince().AsTime().Before(notBefore.Add(-time.Second)) || v.GetSince().AsTime().After(notAfter):
			t.Errorf("%s: want of %s since %s, outside %s..%s", node, want.GetModule(), v.GetSince().AsTime(), notBefore, notAfter)
		}
	}
	if wanted == 0 || len(fv.GetWants()) != wanted {
		t.Errorf("%s: %d want views for %d wanted modules", node, len(fv.GetWants()), wanted)
	}
}

func edit(t testing.TB, p string, f func(string) string) {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(f(string(b))), 0o644); err != nil {
		t.Fatal(err)
	}
}
