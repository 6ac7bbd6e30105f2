package engine

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"mesh.dev/internal/envelope"
	"mesh.dev/internal/names"
	composerv1 "mesh.dev/proto/mesh/composer/v1"
	typev1 "mesh.dev/proto/mesh/type/v1"
	"mesh.dev/services/nodeengine/internal/state"
)

// crashStore panics (as a kill would) at the PutJournal after armed.
type crashStore struct {
	*state.DB
	armed *bool
}

func (s crashStore) PutJournal(j *state.Journal) error {
	if *s.armed {
		panic(stopApply{})
	}
	return s.DB.PutJournal(j)
}

// restart stops the engine and starts it again (with w.after, w.syncFault
// and w.wrapStore as set now), offering it the keyset.
func (w *unitWorld) restart() {
	w.e.Close()
	w.db.Close()
	w.start()
	w.e.OfferKeyset(w.tr.KeysetEnvelope)
}

// foreignAt makes the next start's applies write a foreign file at rel
// (under the root) once, after their op n: something appearing on a path
// while an apply runs.
func (w *unitWorld) foreignAt(n int, rel string) {
	done := false
	w.after = func(op, _ int) {
		if op == n && !done {
			done = true
			w.writeForeign(rel)
		}
	}
}

func (w *unitWorld) writeForeign(rel string) {
	p := filepath.Join(w.root, rel)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		w.t.Error(err)
	}
	if err := os.WriteFile(p, []byte("foreign\n"), 0o644); err != nil {
		w.t.Error(err)
	}
}

func (w *unitWorld) read(rel string) string {
	b, _ := os.ReadFile(filepath.Join(w.root, rel))
	return string(b)
}

// A stop after the commit of an apply that left a module part-way, before
// its rollback wrote anything: the commit kept the rollback record, so the
// start rolls the module back (what the apply created is removed).
func TestStopBeforeTheRollbackRollsBackAtStart(t *testing.T) {
	w := newUnitWorld(t)
	w.netV1()
	armed := false
	w.after = func(done, _ int) {
		if done == 2 { // a and aa written
			w.writeForeign("srv/net/c")
			armed = true // the next PutJournal is the rollback's
		}
	}
	w.wrapStore = func(db *state.DB) state.Store { return crashStore{DB: db, armed: &armed} }
	w.restart()
	w.wrapStore = nil
	v2 := w.netV2()
	w.offerStopped(v2)
	w.after = nil
	w.restart()
	w.rev--
	w.offer(v2)
	w.e.Pass(context.Background())
	if got := w.read("srv/net/aa"); got != "" {
		t.Errorf("/srv/net/aa, created by the half apply, is still there (%q) after a restart and two passes; attempt: %v",
			got, w.have(names.NodeModule).GetAttempt().GetReason())
	}
}

// Two modules left part-way; one cannot be rolled back (a path of the
// composition it had applied moved to another module, which applied
// whole): the other is rolled back all the same, and each says what
// happened to it.
func TestOneModulesRefusedRollbackLeavesTheOthers(t *testing.T) {
	w := newUnitWorld(t, "a", "x", "y")
	w.placeAXY()
	if w.read("srv/y/1") != "y1\n" || w.read("srv/x/p") != "p1\n" {
		t.Fatal("v1 not applied")
	}
	w.after = func(done, _ int) {
		if done == 1 {
			w.writeForeign("srv/x/r")
			w.writeForeign("srv/y/n")
		}
	}
	w.restart()
	_, y2 := w.composition("y", w.fps["y"], true, revFile("y:1", "y", "/srv/y/1", "y2\n"), revFile("y:n", "y", "/srv/y/n", "n2\n"))
	w.offerXPathToA(y2)
	if got := w.read("srv/y/1"); got != "y1\n" {
		t.Errorf("y is left half (/srv/y/1 holds %q): its rollback was refused because of x's path", got)
	}
	if r := w.have("y").GetAttempt().GetReason(); !strings.Contains(r, "; rolled back to the composition it had applied") {
		t.Errorf("y: %s", r)
	}
	if r := w.have("x").GetAttempt().GetReason(); !strings.Contains(r, "rolling it back failed: /srv/x/p, declared by the composition it had applied, is now a's; tried again each pass") {
		t.Errorf("x: %s", r)
	}
}

// A path that moved to a module in the apply that left it part-way stays
// with it (the manifest declares it there; its previous owner applied
// whole without it), and the words say so.
func TestRollbackKeepsWhatMovedToTheModule(t *testing.T) {
	w := newUnitWorld(t, "a", "b")
	_, a1 := w.composition("a", w.fps["a"], true, revFile("a:k", "a", "/srv/a/k", "k\n"), revFile("a:p", "a", "/srv/s/p", "pa\n"))
	_, b1 := w.composition("b", w.fps["b"], true, revFile("b:1", "b", "/srv/b/1", "b1\n"))
	w.offer(a1, b1)
	w.foreignAt(1, "srv/b/n")
	w.restart()
	_, a2 := w.composition("a", w.fps["a"], true, revFile("a:k", "a", "/srv/a/k", "k\n"))
	_, b2 := w.composition("b", w.fps["b"], true, revFile("b:1", "b", "/srv/b/1", "b2\n"), revFile("b:n", "b", "/srv/b/n", "n\n"), revFile("b:p", "b", "/srv/s/p", "pb\n"))
	w.offer(a2, b2)
	reason := w.have("b").GetAttempt().GetReason()
	if !strings.Contains(reason, "rolled back to the composition it had applied") ||
		!strings.Contains(reason, "what moved to it in that apply stays, as the manifest declares: /srv/s/p (from a)") {
		t.Errorf("b: %s", reason)
	}
	if w.read("srv/b/1") != "b1\n" || w.read("srv/s/p") != "pb\n" {
		t.Errorf("/srv/b/1 %q, /srv/s/p %q", w.read("srv/b/1"), w.read("srv/s/p"))
	}
}

// A directory that does not sync, all ops done: the module is not left
// part-way. It is not rolled back, and the next pass records it applied
// without writing again (a rollback each pass flipped its files forever).
func TestDirectoryFsyncFailureIsNotRolledBack(t *testing.T) {
	w := newUnitWorld(t)
	w.netV1()
	ops := 0
	w.after = func(int, int) { ops++ }
	w.syncFault = netSyncFails
	w.restart()
	v2 := w.netV2()
	w.offer(v2)
	if r := w.have(names.NodeModule).GetAttempt().GetReason(); r != "fsync of directory /srv/net: EIO" {
		t.Errorf("first pass: %q", r)
	}
	w.wantFiles("after the first pass", map[string]string{"a": "a2\n", "aa": "aa2\n"})
	w.syncFault = nil
	for i := 2; i <= 3; i++ {
		ops = 0
		w.e.Pass(context.Background())
		if ops > 0 {
			t.Errorf("pass %d wrote %d ops again", i, ops)
		}
	}
	if at := w.have(names.NodeModule).GetAttempt(); at.GetReason() != "" {
		t.Errorf("not recorded applied: %v", at)
	}
}

// A module's rollback plans without the node's own composition, which
// alone carries the adoption list: the list is given to the plan, so a
// path the module adopted stays adoptable and the rollback goes through.
func TestRollbackKeepsTheNodesAdoptions(t *testing.T) {
	w := newUnitWorld(t, "m")
	w.writeForeign("srv/m/conf")
	ownWant := w.adopting("/srv/m/conf")
	_, m1 := w.composition("m", w.fps["m"], true, revFile("m:conf", "m", "/srv/m/conf", "m1\n"), revFile("m:k", "m", "/srv/m/k", "k1\n"))
	w.offer(m1, ownWant)
	if w.read("srv/m/conf") != "m1\n" {
		t.Fatalf("not adopted: %v", w.have("m").GetAttempt())
	}
	w.foreignAt(1, "srv/m/n")
	w.restart()
	_, m2 := w.composition("m", w.fps["m"], true, revFile("m:k", "m", "/srv/m/k", "k2\n"), revFile("m:n", "m", "/srv/m/n", "n\n"))
	w.offer(m2, ownWant)
	if r := w.have("m").GetAttempt().GetReason(); !strings.Contains(r, "rolled back to the composition it had applied") {
		t.Errorf("m: %s", r)
	}
	if w.read("srv/m/k") != "k1\n" || w.read("srv/m/conf") != "m1\n" {
		t.Errorf("m left half: k holds %q, conf %q", w.read("srv/m/k"), w.read("srv/m/conf"))
	}
}

// A stop in the middle of the rollback: its journal is replayed at start,
// and the module is fully its previous composition.
func TestStopDuringTheRollbackIsReplayed(t *testing.T) {
	w := newUnitWorld(t)
	env1 := w.netV1()
	n := 0
	w.after = func(done, total int) {
		n++
		if n == 2 {
			w.writeForeign("srv/net/c")
		}
		if n == 5 {
			t.Logf("stopping in op %d of %d", done, total)
			panic(stopApply{})
		}
	}
	w.restart()
	v2 := w.netV2()
	w.offerStopped(v2)
	w.e.Close()
	w.db.Close()
	w.after = nil
	w.start()
	w.wantFiles("after the start", map[string]string{"a": "a1\n", "aa": "", "b": "b1\n", "c": "foreign\n"})
	kept, err := w.db.Load()
	if err != nil {
		t.Fatal(err)
	}
	if kept.Journal != nil || kept.Rollback != nil || kept.Ledger["/srv/net/aa"] != nil ||
		envelope.Digest(kept.Applied.Compositions[names.NodeModule]) != envelope.Digest(env1) {
		t.Errorf("kept: journal %v, rollback %+v, aa %+v, applied v1 %v", kept.Journal != nil, kept.Rollback, kept.Ledger["/srv/net/aa"],
			envelope.Digest(kept.Applied.Compositions[names.NodeModule]) == envelope.Digest(env1))
	}
}

// A module leaving whose removal fails part-way (an adopted file's prior
// content lost) is not rolled back: it is no longer applied, and its next
// pass removes again. Its words say nothing of a rollback.
func TestLeavingModuleWhoseRemovalFailsIsNotRolledBack(t *testing.T) {
	w := newUnitWorld(t, "l", "k")
	w.writeForeign("srv/l/z")
	ownWant := w.adopting("/srv/l/z")
	_, l1 := w.composition("l", w.fps["l"], true, revFile("l:y", "l", "/srv/l/y", "y\n"), revFile("l:z", "l", "/srv/l/z", "z\n"))
	_, k1 := w.composition("k", w.fps["k"], true, revFile("k:1", "k", "/srv/k/1", "1\n"))
	w.offer(k1, l1, ownWant)
	if w.read("srv/l/z") != "z\n" {
		t.Fatalf("not adopted: %v %v", w.have("l").GetAttempt(), w.have(names.NodeModule).GetAttempt())
	}
	ents, _ := os.ReadDir(filepath.Join(w.dir, "state", "adopted"))
	for _, e := range ents {
		os.Remove(filepath.Join(w.dir, "state", "adopted", e.Name()))
	}
	w.offer(k1, ownWant)
	kept, err := w.db.Load()
	if err != nil {
		t.Fatal(err)
	}
	if kept.Rollback != nil || strings.Contains(w.logs.String(), "rolled back") {
		t.Errorf("a leaving module was taken for one left part-way: %+v", kept.Rollback)
	}
	if kept.Ledger["/srv/l/z"] == nil {
		t.Error("the adopted path whose restore failed left the ledger")
	}
}

// A new module that adopted a path and wrote into a data path, left
// part-way: the adopted file gets its prior content back, the data stays.
func TestRollbackRestoresAdoptedAndKeepsData(t *testing.T) {
	w := newUnitWorld(t, "m")
	w.writeForeign("srv/m/conf")
	ownWant := w.adopting("/srv/m/conf")
	w.offer(ownWant)
	w.foreignAt(2, "srv/m/z")
	w.restart()
	c := &typev1.Composition{Node: "ace", Module: "m", Fingerprint: w.fps["m"], Data: true, DataPaths: []string{"/srv/m/data"}, Resources: []*typev1.Resource{
		revFile("m:conf", "m", "/srv/m/conf", "m\n"), revFile("m:d", "m", "/srv/m/data/f", "d\n"), revFile("m:z", "m", "/srv/m/z", "z\n")}}
	menv, _ := w.tr.Sign(t, typev1.PayloadType_PAYLOAD_TYPE_COMPOSITION, c)
	mkey, _ := names.CompositionKey("ace", "m", w.fps["m"])
	w.comp.comps[mkey] = menv
	w.offer(&typev1.Want{Module: "m", Fingerprint: w.fps["m"], CompositionKey: mkey, CompositionDigest: envelope.Digest(menv)}, ownWant)
	if r := w.have("m").GetAttempt().GetReason(); !strings.Contains(r, "rolled back: it had nothing applied, what the apply created is removed") {
		t.Errorf("m: %s", r)
	}
	if w.read("srv/m/conf") != "foreign\n" || w.read("srv/m/data/f") != "d\n" || w.read("srv/m/z") != "foreign\n" {
		t.Errorf("conf %q data/f %q z %q", w.read("srv/m/conf"), w.read("srv/m/data/f"), w.read("srv/m/z"))
	}
}

// files reads the files under /srv/net of w's root, by name ("" for one
// that is not there).
func (w *unitWorld) files(names ...string) map[string]string {
	out := map[string]string{}
	for _, n := range names {
		b, err := os.ReadFile(filepath.Join(w.root, "srv", "net", n))
		if err != nil && !os.IsNotExist(err) {
			w.t.Fatal(err)
		}
		out[n] = string(b)
	}
	return out
}

func (w *unitWorld) wantFiles(when string, want map[string]string) {
	w.t.Helper()
	var keys []string
	for k := range want {
		keys = append(keys, k)
	}
	got := w.files(keys...)
	for k, v := range want {
		if got[k] != v {
			w.t.Errorf("%s: /srv/net/%s holds %q, want %q", when, k, got[k], v)
		}
	}
}

// netV1 offers v1 of the node's own composition (/srv/net/a and b) and
// returns it.
func (w *unitWorld) netV1() *typev1.Envelope {
	env, v1 := w.composition(names.NodeModule, "", true,
		revFile("net:a", "", "/srv/net/a", "a1\n"), revFile("net:b", "", "/srv/net/b", "b1\n"))
	w.offer(v1)
	return env
}

// adopting serves the node's own composition adopting paths and returns
// its want.
func (w *unitWorld) adopting(paths ...string) *typev1.Want {
	c := &typev1.Composition{Node: "ace", Module: names.NodeModule, Adoption: paths}
	env, _ := w.tr.Sign(w.t, typev1.PayloadType_PAYLOAD_TYPE_COMPOSITION, c)
	key, err := names.CompositionKey("ace", names.NodeModule, "")
	if err != nil {
		w.t.Fatal(err)
	}
	w.comp.comps[key] = env
	return &typev1.Want{Module: names.NodeModule, CompositionKey: key, CompositionDigest: envelope.Digest(env)}
}

// v2 of the node's own composition: a and b change, aa and c are new.
func (w *unitWorld) netV2() *typev1.Want {
	_, v2 := w.composition(names.NodeModule, "", true,
		revFile("net:a", "", "/srv/net/a", "a2\n"), revFile("net:aa", "", "/srv/net/aa", "aa2\n"),
		revFile("net:b", "", "/srv/net/b", "b2\n"), revFile("net:c", "", "/srv/net/c", "c2\n"))
	return v2
}

// A stop in the middle of an apply, and while the engine was down a file
// appeared on a path the apply was to create: the replay at the next start
// cannot finish the module. It is not left half (DESIGN.md §7): at once,
// before any pass, its previous composition is back and what the apply
// created is gone; the foreign file is untouched. The next pass then says
// why the wanted composition is not applied.
func TestReplayThatCannotFinishRollsTheModuleBack(t *testing.T) {
	w := newUnitWorld(t)
	env1 := w.netV1()
	w.restartStoppingAfter(1) // ops: a, aa, b, c
	w.e.OfferKeyset(w.tr.KeysetEnvelope)
	v2 := w.netV2()
	w.offerStopped(v2)
	w.wantFiles("stopped", map[string]string{"a": "a2\n", "aa": "", "b": "b1\n"})
	if err := os.WriteFile(filepath.Join(w.root, "srv", "net", "c"), []byte("foreign\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	w.after = nil
	w.e.Close()
	w.db.Close()
	w.start()

	back := map[string]string{"a": "a1\n", "aa": "", "b": "b1\n", "c": "foreign\n"}
	w.wantFiles("after the replay", back)
	kept, err := w.db.Load()
	if err != nil {
		t.Fatal(err)
	}
	if kept.Journal != nil {
		t.Errorf("a journal is left: %d ops", len(kept.Journal.Ops))
	}
	for _, p := range []string{"/srv/net/aa", "/srv/net/c"} {
		if r, ok := kept.Ledger[p]; ok {
			t.Errorf("the ledger still holds %s: %+v", p, r)
		}
	}
	if r := kept.Ledger["/srv/net/a"]; r == nil || r.Digest != names.Digest([]byte("a1\n")) {
		t.Errorf("the ledger's /srv/net/a is %+v, want a1's digest", r)
	}
	if got := w.have(names.NodeModule).GetApplied().GetDigest(); got != envelope.Digest(env1) {
		t.Errorf("applied %s, want v1 %s", got, envelope.Digest(env1))
	}

	w.e.OfferKeyset(w.tr.KeysetEnvelope)
	w.rev-- // the same manifest as before the stop
	w.offer(v2)
	w.wantFiles("after a pass", back)
	at := w.have(names.NodeModule).GetAttempt()
	if at.GetReasonCode() != composerv1.ReasonCode_REASON_CODE_UNMANAGED_PATH || !strings.Contains(at.GetReason(), "/srv/net/c exists and is not managed by this engine") {
		t.Errorf("attempt %v, want UNMANAGED_PATH naming /srv/net/c", at)
	}
}

// An op that fails in the middle of a pass's apply (here a file appears
// on a new path after the apply was planned) rolls its module back in the
// same pass, and the failure says so.
func TestApplyFailingPartWayRollsTheModuleBack(t *testing.T) {
	w := newUnitWorld(t)
	env1 := w.netV1()
	w.foreignAt(2, "srv/net/c")
	w.restart()
	w.offer(w.netV2())
	w.wantFiles("after the pass", map[string]string{"a": "a1\n", "aa": "", "b": "b1\n", "c": "foreign\n"})
	at := w.have(names.NodeModule).GetAttempt()
	if at.GetReasonCode() != composerv1.ReasonCode_REASON_CODE_UNMANAGED_PATH ||
		!strings.Contains(at.GetReason(), "appeared since the apply was planned") ||
		!strings.Contains(at.GetReason(), "rolled back to the composition it had applied ("+envelope.Digest(env1)+")") {
		t.Errorf("attempt %v, want UNMANAGED_PATH saying what appeared and that it was rolled back", at)
	}
	if got := w.have(names.NodeModule).GetApplied().GetDigest(); got != envelope.Digest(env1) {
		t.Errorf("applied %s, want v1 %s", got, envelope.Digest(env1))
	}
}

// A module with nothing applied before that fails part-way loses what its
// apply created.
func TestNewModuleFailingPartWayLeavesNothing(t *testing.T) {
	w := newUnitWorld(t)
	w.foreignAt(2, "srv/net/c")
	w.restart()
	w.offer(w.netV2())
	w.wantFiles("after the pass", map[string]string{"a": "", "aa": "", "b": "", "c": "foreign\n"})
	at := w.have(names.NodeModule).GetAttempt()
	if !strings.Contains(at.GetReason(), "rolled back: it had nothing applied, what the apply created is removed") {
		t.Errorf("attempt %v, want it rolled back", at)
	}
	if _, err := os.Lstat(filepath.Join(w.root, "srv", "net")); err == nil {
		// The directory the apply made holds the foreign file: it stays.
	} else {
		t.Errorf("/srv/net: %v", err)
	}
}

// failRollbackStore fails the journal write of a rollback (no revision,
// modules to settle) while *fail: a rollback that fails for a while (as an
// object the composer cannot serve for a while would).
type failRollbackStore struct {
	*state.DB
	fail *bool
}

func (s failRollbackStore) PutJournal(j *state.Journal) error {
	if *s.fail && j.Revision == 0 && len(j.Settle) > 0 {
		return errors.New("injected: no space left on device")
	}
	return s.DB.PutJournal(j)
}

// A path the apply that left m part-way created, which another module n
// took over (a later manifest moved it) while m's rollback kept failing, is
// n's: m's rollback, when it goes through, leaves it (it once removed n's
// file and its ledger record).
func TestRollbackLeavesAPathAnotherModuleTookOver(t *testing.T) {
	w := newUnitWorld(t, "m", "n")
	_, m1 := w.composition("m", w.fps["m"], true, revFile("m:a", "m", "/srv/m/a", "a1\n"))
	w.offer(m1)
	w.e.Close()
	w.db.Close()
	fail := true
	once := false
	w.after = func(done, total int) {
		if done == 2 && total == 3 && !once { // a and s written, r next
			once = true
			w.writeForeign("srv/m/c")
		}
	}
	wrap := func(db *state.DB) state.Store { return failRollbackStore{DB: db, fail: &fail} }
	w.startWrapped(wrap)
	w.e.OfferKeyset(w.tr.KeysetEnvelope)
	_, m2 := w.composition("m", w.fps["m"], true, revFile("m:a", "m", "/srv/m/a", "a2\n"), revFile("m:b", "m", "/srv/m/b", "b2\n"), revFile("m:c", "m", "/srv/m/c", "c2\n"))
	w.offer(m2)
	kept, _ := w.db.Load()
	if kept.Rollback == nil || kept.Rollback.Paths["/srv/m/b"].Module != "m" {
		t.Fatalf("no record of m's s: %+v (m: %v)", kept.Rollback, w.have("m").GetAttempt())
	}
	// n takes /srv/m/b over while m's rollback still fails.
	_, n1 := w.composition("n", w.fps["n"], true, revFile("n:b", "n", "/srv/m/b", "n\n"))
	_, m3 := w.composition("m", w.fps["m"], true, revFile("m:a", "m", "/srv/m/a", "a3\n"), revFile("m:c", "m", "/srv/m/c", "c3\n"))
	w.offer(m3, n1)
	if w.read("srv/m/b") != "n\n" {
		t.Fatalf("n did not take s: %q; n: %v", w.read("srv/m/b"), w.have("n").GetAttempt())
	}
	kept, _ = w.db.Load()
	// The rollback goes through at the next start.
	fail = false
	w.e.Close()
	w.db.Close()
	w.startWrapped(wrap)
	kept, _ = w.db.Load()
	if got := w.read("srv/m/b"); got != "n\n" {
		t.Errorf("n's /srv/m/b removed by m's rollback: disk %q, ledger %+v", got, kept.Ledger["/srv/m/b"])
	}
}

// m still in the record at the start of a pass (its rollback failed in the
// previous one): the start rolls it back, the pass's apply leaves it
// part-way again and rolls it back again; the words of the last rollback
// are said, once.
func TestRollbackWordsSaidOnce(t *testing.T) {
	w := newUnitWorld(t, "m")
	fail := true
	// At every apply of m2 (3 ops), not at the rollbacks (2).
	w.mLeftHalf(func(done, total int) {
		if done == 2 && total == 3 {
			w.writeForeign("srv/m/c")
		}
	}, func(db *state.DB) state.Store { return failRollbackStore{DB: db, fail: &fail} })
	fail = false
	os.Remove(filepath.Join(w.root, "srv/m/c")) // the operator clears it; it appears again mid-apply
	w.e.Pass(context.Background())
	r := w.have("m").GetAttempt().GetReason()
	if strings.Count(r, "rolled back to the composition it had applied") > 1 {
		t.Errorf("words said twice: %s", r)
	}
}

// failCommitStore fails the next Commit while *fail, once.
type failCommitStore struct {
	failRollbackStore
	failCommit *bool
}

func (s failCommitStore) Commit(c *state.Commit) error {
	if *s.failCommit {
		*s.failCommit = false
		return errors.New("injected: commit failed")
	}
	return s.DB.Commit(c)
}

// A rollback at the start of a pass whose commit fails blocks the apply
// as any other commit's failure does: the pass applied over the
// uncommitted ledger once, and its journal erased the rollback's.
func TestRollbackCommitFailureBlocksTheApply(t *testing.T) {
	w := newUnitWorld(t, "m")
	fail, failCommit := true, false
	w.mLeftHalf(nil, func(db *state.DB) state.Store {
		return failCommitStore{failRollbackStore: failRollbackStore{DB: db, fail: &fail}, failCommit: &failCommit}
	})
	// Next pass: the rollback's journal is written, its ops run, its commit fails.
	fail, failCommit = false, true
	ops := 0
	w.after = func(int, int) { ops++ }
	w.e.Pass(context.Background())
	w.e.mu.Lock()
	pending := w.e.pending
	w.e.mu.Unlock()
	kept, _ := w.db.Load()
	if pending != nil && (kept.Journal == nil || kept.Journal.ID != pending.ID) {
		t.Errorf("the pending rollback's journal is no longer on disk (a stop now loses it); the pass applied anyway (%d ops)", ops)
	}
}

// The rollback at the start of a pass goes through (it had failed in the
// previous pass) and the module's wanted composition then applies whole:
// the record is empty (the pass once panicked reading it for the words).
func TestRolledBackAtPassStartThenAppliedWhole(t *testing.T) {
	w := newUnitWorld(t, "m")
	fail := true
	w.mLeftHalf(nil, func(db *state.DB) state.Store { return failRollbackStore{DB: db, fail: &fail} })
	fail = false
	os.Remove(filepath.Join(w.root, "srv/m/c")) // the operator clears it
	defer func() {
		if p := recover(); p != nil {
			t.Fatalf("the pass panicked: %v", p)
		}
	}()
	w.e.Pass(context.Background())
	if w.read("srv/m/c") != "c2\n" {
		t.Errorf("m2 not applied: %v", w.have("m").GetAttempt())
	}
	if kept, err := w.db.Load(); err != nil || kept.Rollback != nil {
		t.Errorf("kept rollback %+v (%v)", kept.Rollback, err)
	}
}

// TestOneModulesRefusedRollbackLeavesTheOthers, then the operator removes
// the foreign /srv/x/r: the next pass refuses x's rollback again, applies
// x's wanted composition whole, and x leaves the record.
func TestRefusedRollbackThenAppliedWhole(t *testing.T) {
	w := newUnitWorld(t, "a", "x", "y")
	y1 := w.placeAXY()
	w.e.Close()
	w.db.Close()
	w.foreignAt(1, "srv/x/r")
	w.start()
	w.e.OfferKeyset(w.tr.KeysetEnvelope)
	w.offerXPathToA(y1)
	os.Remove(filepath.Join(w.root, "srv/x/r"))
	defer func() {
		if p := recover(); p != nil {
			t.Fatalf("the pass panicked: %v", p)
		}
	}()
	w.e.Pass(context.Background())
	if w.read("srv/x/r") != "r2\n" || w.read("srv/x/q") != "q2\n" {
		t.Errorf("x2 not applied: %v", w.have("x").GetAttempt())
	}
	if kept, err := w.db.Load(); err != nil || kept.Rollback != nil {
		t.Errorf("kept rollback %+v (%v)", kept.Rollback, err)
	}
}

// placeAXY applies modules a (/srv/a/k), x (/srv/x/p, q) and y
// (/srv/y/1) and returns y's want.
func (w *unitWorld) placeAXY() *typev1.Want {
	_, a1 := w.composition("a", w.fps["a"], true, revFile("a:k", "a", "/srv/a/k", "k\n"))
	_, x1 := w.composition("x", w.fps["x"], true, revFile("x:p", "x", "/srv/x/p", "p1\n"), revFile("x:q", "x", "/srv/x/q", "q1\n"))
	_, y1 := w.composition("y", w.fps["y"], true, revFile("y:1", "y", "/srv/y/1", "y1\n"))
	w.offer(a1, x1, y1)
	return y1
}

// offerXPathToA offers the manifest that moves /srv/x/p from x to a (x
// gets /srv/x/r), with y's want y.
func (w *unitWorld) offerXPathToA(y *typev1.Want) {
	_, a2 := w.composition("a", w.fps["a"], true, revFile("a:k", "a", "/srv/a/k", "k\n"), revFile("a:p", "a", "/srv/x/p", "p2\n"))
	_, x2 := w.composition("x", w.fps["x"], true, revFile("x:q", "x", "/srv/x/q", "q2\n"), revFile("x:r", "x", "/srv/x/r", "r2\n"))
	w.offer(a2, x2, y)
}

// netSyncFails fails the fsync of /srv/net.
func netSyncFails(dir string) error {
	if strings.HasSuffix(dir, "/srv/net") {
		return errors.New("EIO")
	}
	return nil
}

// startWrapped starts the engine on the state wrapped by wrap.
func (w *unitWorld) startWrapped(wrap func(*state.DB) state.Store) {
	w.wrapStore = wrap
	w.start()
	w.wrapStore = nil
}

// mLeftHalf places m at a1, restarts the engine on the state wrap makes
// (one that fails the rollback, say) and offers m2 (a2, b2, c2) while a
// foreign file appears at /srv/m/c: after the apply's second op once, or
// as after says. m is left part-way.
func (w *unitWorld) mLeftHalf(after func(done, total int), wrap func(*state.DB) state.Store) {
	_, m1 := w.composition("m", w.fps["m"], true, revFile("m:a", "m", "/srv/m/a", "a1\n"))
	w.offer(m1)
	w.foreignAt(2, "srv/m/c")
	if after != nil {
		w.after = after
	}
	w.wrapStore = wrap
	w.restart()
	w.wrapStore = nil
	_, m2 := w.composition("m", w.fps["m"], true, revFile("m:a", "m", "/srv/m/a", "a2\n"), revFile("m:b", "m", "/srv/m/b", "b2\n"), revFile("m:c", "m", "/srv/m/c", "c2\n"))
	w.offer(m2)
}

// A rollback whose only failure is a directory's fsync put the module
// back: it leaves the record, and its words say rolled back, with the
// fsync's failure (the next pass syncs), not that the rollback failed.
func TestRollbackFsyncFailureStillRolledBack(t *testing.T) {
	w := newUnitWorld(t)
	env1 := w.netV1()
	w.foreignAt(2, "srv/net/c")
	w.syncFault = netSyncFails
	w.restart()
	w.offer(w.netV2())
	w.wantFiles("after the pass", map[string]string{"a": "a1\n", "aa": "", "b": "b1\n", "c": "foreign\n"})
	r := w.have(names.NodeModule).GetAttempt().GetReason()
	if !strings.Contains(r, "; rolled back to the composition it had applied ("+envelope.Digest(env1)+") (fsync of directory /srv/net: EIO)") ||
		strings.Contains(r, "rolling it back failed") {
		t.Errorf("reason %q", r)
	}
	if kept, err := w.db.Load(); err != nil || kept.Rollback != nil {
		t.Errorf("kept rollback %+v (%v)", kept.Rollback, err)
	}
}

// A wanted composition rolled back after its apply failed part-way is not
// written again at the next pass (a lasting failure would flip the node's
// files at every pass): it waits rollbackRetryBase, saying until when, and
// is then applied.
func TestRolledBackCompositionTriedAgainAfterAWait(t *testing.T) {
	w := newUnitWorld(t)
	w.netV1()
	ops := 0
	w.foreignAt(2, "srv/net/c")
	foreign := w.after
	w.after = func(done, total int) { ops++; foreign(done, total) }
	w.restart()
	w.offer(w.netV2())
	w.wantFiles("rolled back", map[string]string{"a": "a1\n", "aa": "", "c": "foreign\n"})
	if err := os.Remove(filepath.Join(w.root, "srv", "net", "c")); err != nil {
		t.Fatal(err)
	}
	ops = 0
	w.e.Pass(context.Background())
	at := w.have(names.NodeModule).GetAttempt()
	if ops != 0 || !strings.Contains(at.GetReason(), "rolled back to the composition it had applied") ||
		!strings.Contains(at.GetReason(), "; tried again from "+w.now.Add(rollbackRetryBase).UTC().Format(time.RFC3339)) {
		t.Errorf("the pass after the rollback wrote %d ops; attempt %v", ops, at)
	}
	w.now = w.now.Add(rollbackRetryBase + time.Second)
	w.e.Pass(context.Background())
	w.wantFiles("after the wait", map[string]string{"a": "a2\n", "aa": "aa2\n", "b": "b2\n", "c": "c2\n"})
	if at := w.have(names.NodeModule).GetAttempt(); at.GetReason() != "" {
		t.Errorf("not applied after the wait: %v", at)
	}
}
