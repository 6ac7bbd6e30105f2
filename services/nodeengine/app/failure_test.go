package app_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"mesh.dev/internal/names"
	composerv1 "mesh.dev/proto/mesh/composer/v1"
	nodeenginev1 "mesh.dev/proto/mesh/nodeengine/v1"
	"mesh.dev/services/nodeengine/internal/state"
)

// TestStateFailurePolicy checks each section's failure policy: a failed
// high-water write blocks the apply; a failed ledger commit leaves the
// journal, finished by the next start; a failed entry write is retried
// without blocking; an unreadable ledger applies nothing and says why.
func TestStateFailurePolicy(t *testing.T) {
	t.Parallel()
	t.Run("high-water write blocks the apply", func(t *testing.T) {
		t.Parallel()
		w := newWorld(t)
		var faulty *state.Faulty
		r := w.start(t, options{wrap: func(s state.Store) state.Store { faulty = state.NewFaulty(s); return faulty }})
		eventually(t, "hello sent", func() (bool, string) {
			w.composer.mu.Lock()
			defer w.composer.mu.Unlock()
			return len(w.composer.hellos) > 0, ""
		})
		// The keyset, sent after the hello, is kept with the high-water
		// marks: the failure goes in once it is, or the keyset fails
		// instead and the manifest waits for one (KEYSET_INVALID).
		eventually(t, "keyset taken", func() (bool, string) {
			s := r.status(t)
			return s.GetKeysetVersion() == 1, s.String()
		})
		faulty.Fail(state.SectionHighWater, true)
		m := w.publish(manifestOpts{}, nodeComp(file("node", "a", "/etc/app/a", "a")))
		r.waitAttempt(t, names.NodeModule, stateFailed, composerv1.ReasonCode_REASON_CODE_WRITE_FAILED)
		if _, err := os.Stat(w.path("/etc/app/a")); !os.IsNotExist(err) {
			t.Fatalf("applied while its high-water mark was not kept: %v", err)
		}
		faulty.Fail(state.SectionHighWater, false)
		r.eng.Engine.Pass(context.Background())
		r.waitApplied(t, m)
	})
	t.Run("failed commit is finished by the next start", func(t *testing.T) {
		t.Parallel()
		w := newWorld(t)
		var faulty *state.Faulty
		r := w.start(t, options{wrap: func(s state.Store) state.Store { faulty = state.NewFaulty(s); return faulty }})
		faulty.Fail(state.SectionLedger, true)
		w.publish(manifestOpts{}, nodeComp(file("node", "a", "/etc/app/a", "a"), file("node", "b", "/etc/app/b", "b")))
		r.waitAttempt(t, names.NodeModule, stateFailed, composerv1.ReasonCode_REASON_CODE_WRITE_FAILED)
		r.stop()
		w.cfg.ComposerAddr = "127.0.0.1:1"
		r = w.start(t)
		eventually(t, "journal finished", func() (bool, string) {
			s := r.status(t)
			return s.GetApplied().GetRevision() == 1 && haveOf(s, names.NodeModule).GetApplied() != nil, s.String()
		})
		if readFile(t, w.path("/etc/app/a")) != "a" || readFile(t, w.path("/etc/app/b")) != "b" {
			t.Error("not fully applied")
		}
	})
	t.Run("failed entry write is retried without blocking", func(t *testing.T) {
		t.Parallel()
		w := newWorld(t)
		var faulty *state.Faulty
		r := w.start(t, options{wrap: func(s state.Store) state.Store { faulty = state.NewFaulty(s); return faulty }})
		faulty.Fail(state.SectionEntries, true)
		fp := w.release("web", "1.0.0", nil)
		w.publish(manifestOpts{}, moduleComp("web", fp, file("web", "conf", "/opt/app/conf", "x")), nodeComp())
		r.waitAttempt(t, "web", stateApplied, 0)
		n := faulty.Attempts(state.SectionEntries)
		r.eng.Engine.Pass(context.Background())
		if faulty.Attempts(state.SectionEntries) <= n {
			t.Error("the entry write was not retried by the next pass")
		}
		faulty.Fail(state.SectionEntries, false)
		r.eng.Engine.Pass(context.Background())
		r.stop()
		db, err := state.Open(w.cfg.StateDir + "/engine.db")
		if err != nil {
			t.Fatal(err)
		}
		kept, err := db.Load()
		db.Close()
		if err != nil || kept.Entries[fp].Entry == nil {
			t.Fatalf("entry not kept after recovery: %v", err)
		}
		if kept.Wants["web"].Since.IsZero() || time.Since(kept.Wants["web"].Since) > time.Minute {
			t.Errorf("want since %v", kept.Wants["web"].Since)
		}
	})
	t.Run("unreadable high-water: connects, says why, applies nothing", func(t *testing.T) {
		t.Parallel()
		w := newWorld(t)
		r := w.start(t)
		m := w.publish(manifestOpts{}, nodeComp(file("node", "a", "/etc/app/a", "a")))
		r.waitApplied(t, m)
		r.stop()
		db, err := bolt.Open(w.cfg.StateDir+"/engine.db", 0o600, nil)
		if err != nil {
			t.Fatal(err)
		}
		db.Update(func(tx *bolt.Tx) error {
			return tx.Bucket([]byte(state.SectionHighWater)).Put([]byte("marks"), []byte("{garbage"))
		})
		db.Close()
		w.composer.mu.Lock()
		hellos, reports := len(w.composer.hellos), len(w.composer.reports)
		w.composer.mu.Unlock()
		r = w.start(t)
		w.publish(manifestOpts{}, nodeComp(file("node", "a", "/etc/app/a", "changed")))
		const why = "kept high-water marks unreadable, nothing is applied until it is repaired"
		a := r.waitAttempt(t, names.NodeModule, stateFailed, composerv1.ReasonCode_REASON_CODE_STATE_UNREADABLE)
		if !strings.HasPrefix(a.GetReason(), why) {
			t.Errorf("reason %q, want it to start %q", a.GetReason(), why)
		}
		// The admin API says it too.
		if st, err := r.admin.GetStatus(context.Background(), &nodeenginev1.GetStatusRequest{}); err != nil || !strings.HasPrefix(st.GetBlocked(), why) {
			t.Errorf("GetStatus blocked %q (%v), want it to start %q", st.GetBlocked(), err, why)
		}
		// The composer hears it: the engine said Hello and reports the
		// reason, although report_seq can no longer be read from the
		// high-water section.
		eventually(t, "the composer told why", func() (bool, string) {
			w.composer.mu.Lock()
			defer w.composer.mu.Unlock()
			var sent [][]*composerv1.Have
			for _, h := range w.composer.hellos[hellos:] {
				sent = append(sent, h.GetHaves())
			}
			for _, r := range w.composer.reports[reports:] {
				sent = append(sent, r.GetHaves())
			}
			for _, haves := range sent {
				for _, h := range haves {
					if h.GetModule() == names.NodeModule && strings.HasPrefix(h.GetAttempt().GetReason(), why) {
						return true, ""
					}
				}
			}
			return false, fmt.Sprintf("%d hellos and reports since the restart: %v", len(sent), sent)
		})
		if got := readFile(t, w.path("/etc/app/a")); got != "a" {
			t.Errorf("applied with unreadable high-water marks: %q", got)
		}
		if s := r.status(t); s.GetStale() != "" || !s.GetConnected() {
			t.Errorf("status stale %q (not stale: nothing expired), connected %v", s.GetStale(), s.GetConnected())
		}
	})
	t.Run("failed report_seq write: reports go on", func(t *testing.T) {
		t.Parallel()
		w := newWorld(t)
		var faulty *state.Faulty
		r := w.start(t, options{wrap: func(s state.Store) state.Store {
			faulty = state.NewFaulty(s)
			faulty.Fail(state.SectionReport, true)
			return faulty
		}})
		m := w.publish(manifestOpts{}, nodeComp(file("node", "a", "/etc/app/a", "a")))
		r.waitApplied(t, m)
		w.waitReportedApplied(t, m)
		w.composer.mu.Lock()
		defer w.composer.mu.Unlock()
		last := w.composer.hellos[0].GetReportSeq()
		for _, rep := range w.composer.reports {
			if rep.GetReportSeq() <= last {
				t.Errorf("report_seq %d after %d", rep.GetReportSeq(), last)
			}
			last = rep.GetReportSeq()
		}
		if faulty.Attempts(state.SectionReport) < 2 {
			t.Errorf("report_seq written %d times", faulty.Attempts(state.SectionReport))
		}
	})
	t.Run("unreadable ledger applies nothing", func(t *testing.T) {
		t.Parallel()
		w := newWorld(t)
		r := w.start(t)
		m := w.publish(manifestOpts{}, nodeComp(file("node", "a", "/etc/app/a", "a")))
		r.waitApplied(t, m)
		r.stop()
		db, err := bolt.Open(w.cfg.StateDir+"/engine.db", 0o600, nil)
		if err != nil {
			t.Fatal(err)
		}
		db.Update(func(tx *bolt.Tx) error {
			return tx.Bucket([]byte(state.SectionLedger)).Put([]byte("path./etc/app/a"), []byte("{garbage"))
		})
		db.Close()
		r = w.start(t)
		w.publish(manifestOpts{}, nodeComp(file("node", "a", "/etc/app/a", "changed")))
		a := r.waitAttempt(t, names.NodeModule, stateFailed, composerv1.ReasonCode_REASON_CODE_STATE_UNREADABLE)
		if !strings.Contains(a.GetReason(), "ledger unreadable") {
			t.Errorf("reason %q", a.GetReason())
		}
		if got := readFile(t, w.path("/etc/app/a")); got != "a" {
			t.Errorf("applied with an unreadable ledger: %q", got)
		}
	})
}
