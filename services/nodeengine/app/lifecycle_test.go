package app_test

import (
	"context"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"mesh.dev/internal/names"
	composerv1 "mesh.dev/proto/mesh/composer/v1"
	nodeenginev1 "mesh.dev/proto/mesh/nodeengine/v1"
	typev1 "mesh.dev/proto/mesh/type/v1"
	"mesh.dev/services/nodeengine/app"
	"mesh.dev/services/nodeengine/internal/state"
)

func ino(t testing.TB, p string) uint64 {
	t.Helper()
	fi, err := os.Lstat(p)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Sys().(*syscall.Stat_t).Ino
}

// waitApplied waits until the engine reports the manifest applied.
func (r *running) waitApplied(t testing.TB, env *typev1.Envelope) {
	t.Helper()
	digest := names.Digest(env.GetPayload())
	eventually(t, "manifest applied", func() (bool, string) {
		s := r.status(t)
		if s.GetApplied().GetDigest() != digest {
			return false, s.String()
		}
		for _, h := range s.GetHaves() {
			if a := h.GetAttempt(); a != nil && a.GetState() != stateApplied {
				return false, s.String()
			}
		}
		return true, ""
	})
}

// TestApplyLifecycle applies, moves a module's file into the node's own
// composition (relabelled, never recreated), adopts and restores a path,
// keeps data paths, corrects drift and removes what leaves.
func TestApplyLifecycle(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	mkdirAll(t, w.path("/etc/app"))
	if err := os.WriteFile(w.path("/etc/app/adopted"), []byte("prior"), 0o600); err != nil {
		t.Fatal(err)
	}
	r := w.start(t)
	fp := w.release("web", "1.0.0", nil)
	web := moduleComp("web", fp,
		dir("web", "dir", "/opt/app/web"),
		file("web", "conf", "/opt/app/web/conf", "listen 80\n"),
		file("web", "moving", "/etc/app/moving", "moves\n"),
		dir("web", "data", "/var/lib/app/web"),
		&typev1.Resource{Id: "web:link", Module: "web", Type: typev1.ResourceType_RESOURCE_TYPE_SYMLINK, Path: "/opt/app/current", Target: "/opt/app/web"},
	)
	web.c.Data, web.c.DataPaths = true, []string{"/var/lib/app/web"}
	own := nodeComp(file("node", "adopted", "/etc/app/adopted", "ours"))
	own.c.Adoption = []string{"/etc/app/adopted"}
	m1 := w.publish(manifestOpts{}, web, own)
	r.waitApplied(t, m1)
	if got := readFile(t, w.path("/opt/app/web/conf")); got != "listen 80\n" {
		t.Fatalf("conf = %q", got)
	}
	if got := readFile(t, w.path("/etc/app/adopted")); got != "ours" {
		t.Fatalf("adopted = %q", got)
	}
	if target, _ := os.Readlink(w.path("/opt/app/current")); target != "/opt/app/web" {
		t.Fatalf("link -> %q", target)
	}
	fi, _ := os.Stat(w.path("/opt/app/web/conf"))
	if fi.Mode().Perm() != 0o640 {
		t.Errorf("conf mode %o", fi.Mode().Perm())
	}
	if err := os.WriteFile(w.path("/var/lib/app/web/db"), []byte("precious"), 0o600); err != nil {
		t.Fatal(err)
	}
	movingIno := ino(t, w.path("/etc/app/moving"))

	// Drift: the engine corrects what someone changed.
	if err := os.WriteFile(w.path("/opt/app/web/conf"), []byte("tampered"), 0o640); err != nil {
		t.Fatal(err)
	}
	r.eng.Engine.Pass(context.Background())
	if got := readFile(t, w.path("/opt/app/web/conf")); got != "listen 80\n" {
		t.Fatalf("drift not corrected: %q", got)
	}
	if s := r.status(t); len(s.GetDrift()) != 1 || s.GetDrift()[0] != "/opt/app/web/conf" {
		t.Errorf("drift reported %v", s.GetDrift())
	}

	// The module leaves; its moving file goes to the node's own
	// composition in the same manifest (DESIGN.md §5.1 rule 3).
	moved := file("web", "moving", "/etc/app/moving", "moves\n")
	moved.Module = ""
	own2 := nodeComp(file("node", "adopted", "/etc/app/adopted", "ours"), moved)
	own2.c.Adoption = []string{"/etc/app/adopted"}
	m2 := w.publish(manifestOpts{}, own2)
	r.waitApplied(t, m2)
	if got := ino(t, w.path("/etc/app/moving")); got != movingIno {
		t.Error("the moved file was removed and recreated, not relabelled")
	}
	for _, gone := range []string{"/opt/app/web/conf", "/opt/app/web", "/opt/app/current"} {
		if _, err := os.Lstat(w.path(gone)); !os.IsNotExist(err) {
			t.Errorf("%s still there (%v)", gone, err)
		}
	}
	if got := readFile(t, w.path("/var/lib/app/web/db")); got != "precious" {
		t.Errorf("data path content %q", got)
	}
	s := r.status(t)
	if h := haveOf(s, "web"); h != nil {
		t.Errorf("web still has a have: %v", h)
	}

	// The adopted resource leaves: its prior content comes back.
	m3 := w.publish(manifestOpts{}, nodeComp(moved))
	r.waitApplied(t, m3)
	if got := readFile(t, w.path("/etc/app/adopted")); got != "prior" {
		t.Errorf("adopted path restored to %q", got)
	}
	// Reports carry the manifest's trace (the report follows the status
	// the engine serves: wait for it).
	eventually(t, "revision 3 reported with its trace", func() (bool, string) {
		rep := w.composer.lastReport()
		return rep.GetApplied().GetRevision() == 3 && strings.HasPrefix(rep.GetTraceparent(), "00-4bf92f3577b34da6a3ce929d0e0e4736-"), rep.String()
	})
	w.composer.mu.Lock()
	var last uint64
	for _, rep := range w.composer.reports {
		if rep.GetReportSeq() <= last {
			t.Errorf("report_seq %d after %d", rep.GetReportSeq(), last)
		}
		last = rep.GetReportSeq()
	}
	w.composer.mu.Unlock()
}

// TestRevisionsNeverGoBack refuses an older manifest and an equal revision
// with another digest, also after a restart, and reports the high-water.
func TestRevisionsNeverGoBack(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	r := w.start(t)
	m5 := w.publish(manifestOpts{revision: 5}, nodeComp(file("node", "a", "/etc/app/a", "five"), dir("node", "d", "/etc/app/d"),
		&typev1.Resource{Id: "node:l", Type: typev1.ResourceType_RESOURCE_TYPE_SYMLINK, Path: "/etc/app/l", Target: "/etc/app/a"}))
	r.waitApplied(t, m5)
	// What revision 5 applied, the whole tree: nothing a refused
	// manifest declares or leaves out may change it.
	applied := snapshot(t, w.root)

	w.publish(manifestOpts{revision: 4}, nodeComp(file("node", "a", "/etc/app/a", "four")))
	a := r.waitAttempt(t, names.NodeModule, stateFailed, composerv1.ReasonCode_REASON_CODE_REVISION_CONFLICT)
	if !strings.HasPrefix(a.GetReason(), "manifest revision 4 (") || !strings.Contains(a.GetReason(), ") refused: the high-water mark is revision 5 (") {
		t.Errorf("reason %q", a.GetReason())
	}
	r.eng.Engine.Pass(t.Context())
	sameTree(t, applied, snapshot(t, w.root))
	if s := r.status(t); s.GetHighWater() != 5 {
		t.Errorf("high water %d", s.GetHighWater())
	}
	eventually(t, "report with high water", func() (bool, string) {
		rep := w.composer.lastReport()
		return rep.GetHighWater() == 5 && haveAttemptCode(rep.GetHaves(), names.NodeModule) == composerv1.ReasonCode_REASON_CODE_REVISION_CONFLICT, rep.String()
	})
	w.publish(manifestOpts{revision: 5}, nodeComp(file("node", "a", "/etc/app/a", "other five")))
	// The attempt before says the same state and code, of revision 4:
	// wait for the one of this manifest.
	eventually(t, "revision 5 of another digest refused", func() (bool, string) {
		a = haveOf(r.status(t), names.NodeModule).GetAttempt()
		return a.GetState() == stateFailed && a.GetReasonCode() == composerv1.ReasonCode_REASON_CODE_REVISION_CONFLICT &&
			strings.HasPrefix(a.GetReason(), "manifest revision 5 ("), a.String()
	})
	if !strings.Contains(a.GetReason(), ") refused: the high-water mark is revision 5 (") {
		t.Errorf("reason %q", a.GetReason())
	}
	r.eng.Engine.Pass(t.Context())
	sameTree(t, applied, snapshot(t, w.root))
	seq := w.composer.lastReport().GetReportSeq()

	// After a restart, with the composer sending the old manifest first.
	r.stop()
	w.composer.manifest = w.manifest(manifestOpts{revision: 3}, nodeComp(file("node", "a", "/etc/app/a", "three")))
	r = w.start(t)
	a = r.waitAttempt(t, names.NodeModule, stateFailed, composerv1.ReasonCode_REASON_CODE_REVISION_CONFLICT)
	if !strings.HasPrefix(a.GetReason(), "manifest revision 3 (") || !strings.Contains(a.GetReason(), ") refused: the high-water mark is revision 5 (") {
		t.Errorf("after restart, reason %q", a.GetReason())
	}
	r.eng.Engine.Pass(t.Context())
	sameTree(t, applied, snapshot(t, w.root))
	w.composer.mu.Lock()
	hello := w.composer.hellos[len(w.composer.hellos)-1]
	w.composer.mu.Unlock()
	if hello.GetHighWater() != 5 || hello.GetApplied().GetRevision() != 5 || hello.GetReportSeq() <= seq || hello.GetNode() != node {
		t.Errorf("hello after restart %v (report_seq before %d)", hello, seq)
	}
	m6 := w.publish(manifestOpts{revision: 6}, nodeComp(file("node", "a", "/etc/app/a", "six")))
	r.waitApplied(t, m6)
}

func haveAttemptCode(hs []*composerv1.Have, module string) composerv1.ReasonCode {
	for _, h := range hs {
		if h.GetModule() == module {
			return h.GetAttempt().GetReasonCode()
		}
	}
	return 0
}

// appliedOnce runs an engine until it applied a first manifest naming the
// node's own composition of one file.
func appliedOnce(t *testing.T) (*world, *running) {
	t.Helper()
	w := newWorld(t)
	r := w.start(t)
	r.waitApplied(t, w.publish(manifestOpts{}, nodeComp(file("node", "a", "/etc/app/a", "one"))))
	return w, r
}

// TestComposerDownAtStart starts an engine with its composer unreachable:
// it applies nothing new, reports its kept state and says it is not
// connected.
func TestComposerDownAtStart(t *testing.T) {
	t.Parallel()
	w, r := appliedOnce(t)
	r.stop()
	before := snapshot(t, w.root)

	w.cfg.ComposerAddr = "127.0.0.1:1"
	w.cfg.CatalogAddr = "127.0.0.1:1"
	r = w.start(t)
	eventually(t, "not connected, kept state reported", func() (bool, string) {
		s := r.status(t)
		h := haveOf(s, names.NodeModule)
		return !s.GetConnected() && s.GetConnectionError() != "" && s.GetApplied().GetRevision() == 1 &&
			h.GetApplied().GetDigest() != "", s.String()
	})
	r.eng.Engine.Pass(context.Background())
	sameTree(t, before, snapshot(t, w.root))
}

// TestKeptHavesBeforeTheFirstPass opens an engine that applied a
// composition before and runs no pass: its status and the Hello it would
// send already say what is applied, not nothing.
func TestKeptHavesBeforeTheFirstPass(t *testing.T) {
	t.Parallel()
	w, r := appliedOnce(t)
	applied := haveOf(r.status(t), names.NodeModule).GetApplied().GetDigest()
	r.stop()
	if applied == "" {
		t.Fatal("no applied composition of the node's own module before the restart")
	}

	eng, err := app.New(context.Background(), w.cfg, app.Options{Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer eng.Close()
	if got := haveOf(eng.Engine.Status(), names.NodeModule).GetApplied().GetDigest(); got != applied {
		t.Errorf("status before the first pass: %s applied, want %s", got, applied)
	}
	hello, _ := eng.Engine.Hello()
	if got := haveIn(hello.GetHaves(), names.NodeModule).GetApplied().GetDigest(); got != applied {
		t.Errorf("hello before the first pass: %s applied, want %s (haves %v)", got, applied, hello.GetHaves())
	}
}

// TestFirstViewsAndEntryAgain lists entries in every state and kept wants,
// and asks an entry again only when it is known.
func TestFirstViewsAndEntryAgain(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	r := w.start(t)
	fp := w.release("web", "1.0.0", nil)
	missing := names.FingerprintFromHex(strings.Repeat("ab", 32))
	m := w.publish(manifestOpts{}, moduleComp("web", fp, file("web", "conf", "/opt/app/conf", "x")), moduleComp("gone", missing), nodeComp())
	eventually(t, "first views", func() (bool, string) {
		v, err := r.admin.FirstViews(context.Background(), &nodeenginev1.FirstViewsRequest{})
		if err != nil {
			return false, err.Error()
		}
		states := map[string]nodeenginev1.EntryState{}
		for _, e := range v.GetEntries() {
			states[e.GetFingerprint()] = e.GetState()
		}
		return states[fp] == nodeenginev1.EntryState_ENTRY_STATE_ANSWERED && states[missing] == nodeenginev1.EntryState_ENTRY_STATE_NOT_FOUND &&
			len(v.GetWants()) == 2 && v.GetWants()[0].GetModule() == "gone" && v.GetWants()[1].GetSince() != nil, v.String()
	})
	a := r.waitAttempt(t, "gone", stateHeld, composerv1.ReasonCode_REASON_CODE_ENTRY_MISSING)
	if a.GetReason() != "the catalog holds no entry of fingerprint "+missing {
		t.Errorf("words %q", a.GetReason())
	}
	r.waitAttempt(t, "web", stateApplied, 0)
	if s := r.status(t); s.GetApplied().GetDigest() != names.Digest(m.GetPayload()) {
		t.Errorf("applied %v", s.GetApplied())
	}

	_, err := r.admin.EntryAgain(context.Background(), &nodeenginev1.EntryAgainRequest{Fingerprint: names.FingerprintFromHex(strings.Repeat("cd", 32))})
	if status.Code(err) != codes.NotFound || !strings.Contains(status.Convert(err).Message(), "no entry of fp1:cdcd") || !strings.HasSuffix(status.Convert(err).Message(), "is kept") {
		t.Errorf("EntryAgain of an unknown fingerprint: %v", err)
	}
	asked := w.catalog.timesAsked(missing)
	if _, err := r.admin.EntryAgain(context.Background(), &nodeenginev1.EntryAgainRequest{Fingerprint: missing}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "asked again", func() (bool, string) { return w.catalog.timesAsked(missing) > asked, "" })
	asked = w.catalog.timesAsked(fp)
	if _, err := r.admin.EntryAgain(context.Background(), &nodeenginev1.EntryAgainRequest{Fingerprint: fp}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "kept entry asked again", func() (bool, string) { return w.catalog.timesAsked(fp) > asked, "" })
	if _, err := r.admin.EntryAgain(context.Background(), &nodeenginev1.EntryAgainRequest{Fingerprint: "fp1:nope"}); status.Code(err) != codes.InvalidArgument {
		t.Errorf("malformed fingerprint: %v", err)
	}
}

// TestReportSeqAboveEverySentWithAStoppedClock: with the engine's clock
// standing still (so only what it kept keeps report_seq going up), the
// Hello after a restart carries a report_seq above all sent before, and
// the engine kept one ceiling for them, not one write each.
func TestReportSeqAboveEverySentWithAStoppedClock(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	at := time.Now()
	clock := func() time.Time { return at }
	var faulty *state.Faulty
	r := w.start(t, options{now: clock, wrap: func(s state.Store) state.Store {
		faulty = state.NewFaulty(s)
		return faulty
	}})
	m := w.publish(manifestOpts{}, nodeComp(file("node", "a", "/etc/app/a", "a")))
	r.waitApplied(t, m)
	w.waitReportedApplied(t, m)
	r.stop()
	seqs := func() []uint64 {
		w.composer.mu.Lock()
		defer w.composer.mu.Unlock()
		var out []uint64
		for _, h := range w.composer.hellos {
			out = append(out, h.GetReportSeq())
		}
		for _, rep := range w.composer.reports {
			out = append(out, rep.GetReportSeq())
		}
		return out
	}
	before := seqs()
	if len(before) < 2 {
		t.Fatalf("report_seqs sent %v, want a hello and reports", before)
	}
	// One ceiling kept above them all, not one write per report_seq.
	if n := faulty.Attempts(state.SectionReport); n != 1 {
		t.Errorf("report_seq kept %d times for %d report_seqs sent, want once: a ceiling above them", n, len(before))
	}

	hellos := len(w.composer.hellos)
	r = w.start(t, options{now: clock})
	var hello uint64
	eventually(t, "a hello after the restart", func() (bool, string) {
		w.composer.mu.Lock()
		defer w.composer.mu.Unlock()
		if len(w.composer.hellos) == hellos {
			return false, "no hello yet"
		}
		hello = w.composer.hellos[hellos].GetReportSeq()
		return true, ""
	})
	for _, s := range before {
		if hello <= s {
			t.Errorf("report_seq %d after the restart, %d sent before it", hello, s)
		}
	}
	r.stop()
}
