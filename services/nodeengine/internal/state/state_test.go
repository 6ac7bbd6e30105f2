package state

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
	"google.golang.org/protobuf/proto"

	"mesh.dev/internal/canonical"
	"mesh.dev/internal/names"
	catalogv1 "mesh.dev/proto/mesh/catalog/v1"
	typev1 "mesh.dev/proto/mesh/type/v1"
)

func open(t *testing.T) (*DB, string) {
	t.Helper()
	p := filepath.Join(t.TempDir(), "engine.db")
	db, err := Open(p)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db, p
}

func entryOf(t *testing.T, module string) *catalogv1.Entry {
	t.Helper()
	b, err := canonical.Marshal(&typev1.ModuleManifest{Module: module, Version: "1.0"})
	if err != nil {
		t.Fatal(err)
	}
	e := &catalogv1.Entry{Module: module, Repository: "r", Path: module, SourceDigest: names.Digest([]byte(module)), Manifest: b, ManifestDigest: names.Digest(b)}
	e.Fingerprint = names.ComputeFingerprint(e.Module, e.Repository, e.Path, e.SourceDigest, e.ManifestDigest)
	return e
}

func fpOf(c byte) string { return names.FingerprintFromHex(strings.Repeat(string([]byte{c}), 64)) }

// filled writes something into every section.
func filled(t *testing.T, db *DB) {
	t.Helper()
	e := entryOf(t, "web")
	since := time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)
	must(t, db.PutEntry(e.GetFingerprint(), KeptEntry{Entry: e, Since: since}))
	must(t, db.PutWant("web", KeptWant{Want: &typev1.Want{Module: "web", Fingerprint: e.GetFingerprint()}, Since: since}))
	env := &typev1.Envelope{PayloadType: typev1.PayloadType_PAYLOAD_TYPE_MANIFEST, Payload: []byte("m")}
	must(t, db.Commit(&Commit{
		LedgerPut:    []*LedgerRecord{{Path: "/etc/app/a", Type: TypeFile, Module: "web", Digest: names.Digest([]byte("a")), Created: true}},
		Manifest:     env,
		Compositions: map[string]*typev1.Envelope{"web": {PayloadType: typev1.PayloadType_PAYLOAD_TYPE_COMPOSITION, Payload: []byte("c")}},
	}))
	must(t, db.PutHighWater(HighWater{Revision: 7, Digest: names.Digest([]byte("m"))}))
	must(t, db.PutKeyset(&typev1.Envelope{PayloadType: typev1.PayloadType_PAYLOAD_TYPE_KEYSET, Payload: []byte("k")}))
	must(t, db.PutJournal(&Journal{ID: "j", Revision: 7}))
	must(t, db.PutReportSeq(42))
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// present reports whether Load read the content filled wrote into s.
func present(k *Kept, s Section) bool {
	switch s {
	case SectionEntries:
		return len(k.Entries) == 1
	case SectionWants:
		return k.Wants["web"].Want != nil
	case SectionApplied:
		return k.Applied.Manifest != nil && k.Applied.Compositions["web"] != nil
	case SectionLedger:
		return k.Ledger["/etc/app/a"] != nil
	case SectionHighWater:
		return k.HighWater.Revision == 7
	case SectionKeyset:
		return k.Keyset != nil
	case SectionJournal:
		return k.Journal != nil && k.Journal.ID == "j"
	case SectionReport:
		return k.ReportSeq == 42
	}
	return false
}

// TestUnreadableSection damages one section at a time: Load reports that
// section only, naming it and the key, leaves its content empty and reads
// every other; each section has the policy DESIGN.md §7 gives it, and only
// a section that is asked afresh can be reset, which heals it.
func TestUnreadableSection(t *testing.T) {
	t.Parallel()
	tests := []struct {
		section Section
		policy  Policy
	}{
		{SectionEntries, AskAfresh},
		{SectionWants, AskAfresh},
		{SectionApplied, ApplyNothing},
		{SectionLedger, ApplyNothing},
		{SectionHighWater, ApplyNothing},
		{SectionKeyset, ApplyNothing},
		{SectionJournal, ApplyNothing},
		{SectionReport, Reseed},
	}
	if len(tests) != len(Sections()) {
		t.Fatalf("%d cases for %d sections", len(tests), len(Sections()))
	}
	for _, tt := range tests {
		t.Run(string(tt.section), func(t *testing.T) {
			t.Parallel()
			if got := PolicyOf(tt.section); got != tt.policy {
				t.Errorf("PolicyOf(%s) = %d, want %d", tt.section, got, tt.policy)
			}
			db, _ := open(t)
			filled(t, db)
			must(t, db.Bolt().Update(func(tx *bolt.Tx) error {
				return tx.Bucket([]byte(tt.section)).Put([]byte("zz.damaged"), []byte("{garbage"))
			}))
			k, err := db.Load()
			must(t, err)
			for _, s := range Sections() {
				err := k.Err(s)
				if s != tt.section {
					if err != nil || !present(k, s) {
						t.Errorf("section %s with %s damaged: error %v, content read %v", s, tt.section, err, present(k, s))
					}
					continue
				}
				if !errors.Is(err, ErrUnreadable) || !strings.Contains(err.Error(), string(s)+` key "zz.damaged"`) {
					t.Errorf("damaged section %s: error %v, want ErrUnreadable naming the section and key", s, err)
				}
				if present(k, s) {
					t.Errorf("damaged section %s: some of its content was kept", s)
				}
			}

			err = db.Reset(tt.section)
			if tt.policy != AskAfresh {
				if err == nil {
					t.Fatalf("Reset(%s) emptied a section whose content cannot be asked again", tt.section)
				}
				if k, _ := db.Load(); k.Err(tt.section) == nil {
					t.Errorf("a refused Reset(%s) changed it", tt.section)
				}
				return
			}
			must(t, err)
			k, err = db.Load()
			must(t, err)
			for _, s := range Sections() {
				if k.Err(s) != nil || present(k, s) != (s != tt.section) {
					t.Errorf("after Reset(%s), section %s: error %v, content %v", tt.section, s, k.Err(s), present(k, s))
				}
			}
		})
	}
}

// TestReportSeq checks that report_seq has its own section (a high-water
// section that cannot be read or written does not stop it), that the field
// high-water records held before is still read as a floor, and that the
// next report_seq is max(last + 1, the clock in ms).
func TestReportSeq(t *testing.T) {
	t.Parallel()
	t.Run("own section, legacy floor", func(t *testing.T) {
		t.Parallel()
		db, _ := open(t)
		must(t, db.Bolt().Update(func(tx *bolt.Tx) error {
			return tx.Bucket([]byte(SectionHighWater)).Put([]byte(keyMarks), []byte(`{"v":1,"revision":3,"report_seq":90}`))
		}))
		k, err := db.Load()
		must(t, err)
		if k.HighWaterErr != nil || k.HighWater.Revision != 3 || k.ReportSeq != 90 {
			t.Errorf("a high-water record with report_seq: revision %d, report_seq %d, error %v", k.HighWater.Revision, k.ReportSeq, k.HighWaterErr)
		}
		must(t, db.PutReportSeq(95))
		must(t, db.PutHighWater(HighWater{Revision: 4}))
		k, err = db.Load()
		must(t, err)
		if k.ReportSeq != 95 || k.HighWater.Revision != 4 {
			t.Errorf("report_seq %d, revision %d", k.ReportSeq, k.HighWater.Revision)
		}
		must(t, db.Bolt().Update(func(tx *bolt.Tx) error {
			return tx.Bucket([]byte(SectionHighWater)).Put([]byte(keyMarks), []byte("{garbage"))
		}))
		k, err = db.Load()
		must(t, err)
		if k.HighWaterErr == nil || k.ReportSeqErr != nil || k.ReportSeq != 95 {
			t.Errorf("high-water unreadable: report_seq %d (error %v), high-water error %v", k.ReportSeq, k.ReportSeqErr, k.HighWaterErr)
		}
	})
	t.Run("next", func(t *testing.T) {
		t.Parallel()
		now := time.UnixMilli(1_700_000_000_000)
		tests := []struct {
			name string
			last uint64
			now  time.Time
			want uint64
		}{
			{"first ever: the clock", 0, now, 1_700_000_000_000},
			{"state lost: the clock, above what was sent", 41, now, 1_700_000_000_000},
			{"faster than the clock: last + 1", 1_700_000_000_000, now, 1_700_000_000_001},
			{"clock stepped back: last + 1", 1_800_000_000_000, now, 1_800_000_000_001},
			{"clock before 1970: last + 1", 5, time.Unix(-10, 0), 6},
		}
		for _, tt := range tests {
			if got := NextReportSeq(tt.last, tt.now); got != tt.want {
				t.Errorf("%s: NextReportSeq(%d) = %d, want %d", tt.name, tt.last, got, tt.want)
			}
		}
	})
}

// TestPlanWants checks a kept want's since (DESIGN.md §7): when this node
// first kept a want at that fingerprint, kept across changes at the same
// fingerprint, reset when it changes; a record rewritten only when the want
// changed or its last write failed; the node's own want never kept.
func TestPlanWants(t *testing.T) {
	t.Parallel()
	then := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	now := then.Add(48 * time.Hour)
	fpA, fpB := fpOf('a'), fpOf('b')
	want := func(module, fp, digest string) *typev1.Want {
		return &typev1.Want{Module: module, Fingerprint: fp, CompositionDigest: names.Digest([]byte(digest))}
	}
	tests := []struct {
		name      string
		kept      map[string]KeptWant
		wants     []*typev1.Want
		unwritten []string
		since     map[string]time.Time
		put, del  []string
	}{
		{
			name:  "a new want: since now, written",
			wants: []*typev1.Want{want("web", fpA, "1")},
			since: map[string]time.Time{"web": now}, put: []string{"web"},
		},
		{
			name:  "unchanged: since kept, not written",
			kept:  map[string]KeptWant{"web": {Want: want("web", fpA, "1"), Since: then}},
			wants: []*typev1.Want{want("web", fpA, "1")},
			since: map[string]time.Time{"web": then},
		},
		{
			name:  "another composition at the same fingerprint: since kept, written",
			kept:  map[string]KeptWant{"web": {Want: want("web", fpA, "1"), Since: then}},
			wants: []*typev1.Want{want("web", fpA, "2")},
			since: map[string]time.Time{"web": then}, put: []string{"web"},
		},
		{
			name:  "another fingerprint: since reset, written",
			kept:  map[string]KeptWant{"web": {Want: want("web", fpA, "1"), Since: then}},
			wants: []*typev1.Want{want("web", fpB, "1")},
			since: map[string]time.Time{"web": now}, put: []string{"web"},
		},
		{
			name:  "kept without a since: since now, written",
			kept:  map[string]KeptWant{"web": {Want: want("web", fpA, "1")}},
			wants: []*typev1.Want{want("web", fpA, "1")},
			since: map[string]time.Time{"web": now}, put: []string{"web"},
		},
		{
			name:      "unchanged but its last write failed: written again",
			kept:      map[string]KeptWant{"web": {Want: want("web", fpA, "1"), Since: then}},
			wants:     []*typev1.Want{want("web", fpA, "1")},
			unwritten: []string{"web"},
			since:     map[string]time.Time{"web": then}, put: []string{"web"},
		},
		{
			name:  "gone and the node's own: deleted, never kept",
			kept:  map[string]KeptWant{"db": {Want: want("db", fpA, "1"), Since: then}, "web": {Want: want("web", fpA, "1"), Since: then}},
			wants: []*typev1.Want{want("web", fpA, "1"), {Module: names.NodeModule, CompositionDigest: names.Digest([]byte("n"))}},
			since: map[string]time.Time{"web": then}, del: []string{"db"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			c := PlanWants(tt.kept, tt.wants, now, func(m string) bool { return slices.Contains(tt.unwritten, m) })
			if len(c.Next) != len(tt.since) {
				t.Errorf("next wants %v, want modules of %v", c.Next, tt.since)
			}
			for m, since := range tt.since {
				if k := c.Next[m]; !k.Since.Equal(since) || k.Want == nil {
					t.Errorf("%s: since %v, want %v", m, k.Since, since)
				}
			}
			if !slices.Equal(c.Put, tt.put) || !slices.Equal(c.Delete, tt.del) {
				t.Errorf("put %v delete %v, want put %v delete %v", c.Put, c.Delete, tt.put, tt.del)
			}
		})
	}
}

// recording is a Store that logs the writes of wants in order.
type recording struct {
	Store
	ops     []string
	failPut string
}

func (r *recording) PutWant(m string, w KeptWant) error {
	r.ops = append(r.ops, "put "+m)
	if m == r.failPut {
		return ErrInjected
	}
	return r.Store.PutWant(m, w)
}

func (r *recording) DeleteWants(ms []string) error {
	r.ops = append(r.ops, "delete "+strings.Join(ms, ","))
	return r.Store.DeleteWants(ms)
}

// TestKeepWantsPutsBeforeDeletes writes every put before the deletes, so a
// stop in between leaves a superset of the wants; a failed put is returned
// by module and does not keep the deletes from being written.
func TestKeepWantsPutsBeforeDeletes(t *testing.T) {
	t.Parallel()
	db, _ := open(t)
	then := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	kept := map[string]KeptWant{}
	for _, m := range []string{"a", "b"} {
		kept[m] = KeptWant{Want: &typev1.Want{Module: m, Fingerprint: fpOf('a')}, Since: then}
		must(t, db.PutWant(m, kept[m]))
	}
	rec := &recording{Store: db, failPut: "d"}
	c := PlanWants(kept, []*typev1.Want{{Module: "c", Fingerprint: fpOf('c')}, {Module: "d", Fingerprint: fpOf('d')}}, then.Add(time.Hour), nil)
	failed := KeepWants(rec, c)
	if want := []string{"put c", "put d", "delete a,b"}; !slices.Equal(rec.ops, want) {
		t.Errorf("writes %v, want %v", rec.ops, want)
	}
	if len(failed) != 1 || !errors.Is(failed["d"], ErrInjected) {
		t.Errorf("failed %v, want d only", failed)
	}
	k, err := db.Load()
	must(t, err)
	got := slices.Sorted(func(yield func(string) bool) {
		for m := range k.Wants {
			if !yield(m) {
				return
			}
		}
	})
	if !slices.Equal(got, []string{"c"}) || !proto.Equal(k.Wants["c"].Want, c.Next["c"].Want) {
		t.Errorf("kept wants %v", got)
	}
}

// TestJournal: a journal keeps its manifest and compositions as raw bytes
// beside its intent record and the inline content of its writes only in
// those compositions; Load gives the journal back whole, refuses one whose
// content by reference is not what the op was to write, still reads a
// version 1 journal, and a commit or the next journal leaves nothing of it.
func TestJournal(t *testing.T) {
	t.Parallel()
	content := []byte("listen 8080\n")
	comp := &typev1.Composition{Node: "ace", Module: "web", Resources: []*typev1.Resource{
		{Id: "web.conf", Type: typev1.ResourceType_RESOURCE_TYPE_FILE, Path: "/etc/web/conf", Content: &typev1.Resource_Inline{Inline: content}},
	}}
	envOf := func(c *typev1.Composition) []byte {
		payload, err := proto.Marshal(c)
		must(t, err)
		b, err := proto.Marshal(&typev1.Envelope{PayloadType: typev1.PayloadType_PAYLOAD_TYPE_COMPOSITION, Payload: payload})
		must(t, err)
		return b
	}
	manifest := []byte("manifest envelope")
	journal := func() *Journal {
		return &Journal{ID: "j1", Revision: 9, Manifest: manifest, Compositions: map[string][]byte{"web": envOf(comp)}, Traceparent: "00-tp",
			Ops: []Op{
				{Kind: OpMkdir, Path: "/etc/web", Module: "web", Record: &LedgerRecord{Path: "/etc/web", Type: TypeDir, Module: "web"}},
				{Kind: OpWrite, Path: "/etc/web/conf", Module: "web", Stage: names.Digest(content), InJournal: true, Inline: content, FromComposition: true,
					Record: &LedgerRecord{Path: "/etc/web/conf", Type: TypeFile, Module: "web", Digest: names.Digest(content)}},
				{Kind: OpWrite, Path: "/etc/web/empty", Module: "web", Stage: names.Digest(nil), InJournal: true, Inline: []byte{},
					Record: &LedgerRecord{Path: "/etc/web/empty", Type: TypeFile, Module: "web", Digest: names.Digest(nil)}},
			}}
	}
	keys := func(db *DB) map[string][]byte {
		out := map[string][]byte{}
		must(t, db.Bolt().View(func(tx *bolt.Tx) error {
			return tx.Bucket([]byte(SectionJournal)).ForEach(func(k, v []byte) error {
				out[string(k)] = append([]byte(nil), v...)
				return nil
			})
		}))
		return out
	}

	db, _ := open(t)
	j := journal()
	must(t, db.PutJournal(j))
	if string(j.Ops[1].Inline) != string(content) {
		t.Errorf("PutJournal changed the caller's op: inline %q", j.Ops[1].Inline)
	}
	stored := keys(db)
	if got := slices.Sorted(maps.Keys(stored)); !slices.Equal(got, []string{"intent", "intent.composition.web", "intent.manifest"}) {
		t.Fatalf("journal keys %v", got)
	}
	if strings.Contains(string(stored["intent"]), "listen") || strings.Contains(string(stored["intent"]), base64.StdEncoding.EncodeToString(content)) {
		t.Errorf("the intent record carries the content its composition holds: %s", stored["intent"])
	}
	if string(stored["intent.manifest"]) != string(manifest) {
		t.Errorf("manifest stored as %q", stored["intent.manifest"])
	}
	k, err := db.Load()
	must(t, err)
	if k.JournalErr != nil {
		t.Fatal(k.JournalErr)
	}
	// Compared as JSON: an empty inline content reads back as nil.
	got, _ := json.Marshal(k.Journal)
	want, _ := json.Marshal(journal())
	if string(got) != string(want) {
		t.Errorf("journal read back\n%s\nwant\n%s", got, want)
	}

	// A composition whose inline content is not what the op writes.
	tampered := proto.Clone(comp).(*typev1.Composition)
	tampered.Resources[0].Content = &typev1.Resource_Inline{Inline: []byte("listen 9999\n")}
	must(t, db.Bolt().Update(func(tx *bolt.Tx) error {
		return tx.Bucket([]byte(SectionJournal)).Put([]byte("intent.composition.web"), envOf(tampered))
	}))
	k, err = db.Load()
	must(t, err)
	if k.Journal != nil || !errors.Is(k.JournalErr, ErrUnreadable) || !strings.Contains(k.JournalErr.Error(), `/etc/web/conf: the inline content in the journal's composition of module "web" is not `+names.Digest(content)) {
		t.Errorf("tampered composition: journal %v, error %v", k.Journal != nil, k.JournalErr)
	}
	// Without the composition.
	must(t, db.Bolt().Update(func(tx *bolt.Tx) error {
		return tx.Bucket([]byte(SectionJournal)).Delete([]byte("intent.composition.web"))
	}))
	if k, _ = db.Load(); k.Journal != nil || !strings.Contains(fmt.Sprint(k.JournalErr), "no composition of the module is kept") {
		t.Errorf("composition missing: journal %v, error %v", k.Journal != nil, k.JournalErr)
	}

	// The next journal replaces every key of the last.
	next := &Journal{ID: "j2", Revision: 10, Compositions: map[string][]byte{"db": envOf(&typev1.Composition{Module: "db"})}, Ops: []Op{{Kind: OpForget, Path: "/x", Module: "db"}}}
	must(t, db.PutJournal(next))
	if got := slices.Sorted(maps.Keys(keys(db))); !slices.Equal(got, []string{"intent", "intent.composition.db"}) {
		t.Errorf("journal keys after the next journal %v", got)
	}
	must(t, db.Commit(&Commit{ClearJournal: true}))
	if got := keys(db); len(got) != 0 {
		t.Errorf("journal keys after the commit %v", slices.Sorted(maps.Keys(got)))
	}
	if k, _ = db.Load(); k.Journal != nil || k.JournalErr != nil {
		t.Errorf("after the commit: journal %v, error %v", k.Journal, k.JournalErr)
	}

	// A version 1 journal, everything in its JSON, as an earlier engine
	// wrote it.
	v1, err := json.Marshal(map[string]any{"v": 1, "id": "old", "revision": 3, "manifest": manifest,
		"compositions": map[string][]byte{"web": envOf(comp)},
		"ops":          []map[string]any{{"kind": "write", "path": "/etc/web/conf", "module": "web", "stage": names.Digest(content), "in_journal": true, "inline": content}}})
	must(t, err)
	must(t, db.Bolt().Update(func(tx *bolt.Tx) error { return tx.Bucket([]byte(SectionJournal)).Put([]byte("intent"), v1) }))
	k, err = db.Load()
	must(t, err)
	if k.JournalErr != nil || k.Journal == nil || k.Journal.ID != "old" || string(k.Journal.Ops[0].Inline) != string(content) ||
		string(k.Journal.Manifest) != string(manifest) || len(k.Journal.Compositions["web"]) == 0 {
		t.Errorf("version 1 journal: %+v, error %v", k.Journal, k.JournalErr)
	}
}

// TestKeysetAndMarksTogether: the keyset and the high-water marks that
// record its version are written in one transaction and read back both.
func TestKeysetAndMarksTogether(t *testing.T) {
	db, err := Open(filepath.Join(t.TempDir(), "engine.db"))
	must(t, err)
	defer db.Close()
	must(t, db.PutHighWater(HighWater{Revision: 7, Digest: names.Digest([]byte("m"))}))
	ks := &typev1.Envelope{PayloadType: typev1.PayloadType_PAYLOAD_TYPE_KEYSET, Payload: []byte("k2")}
	must(t, db.PutKeysetAndMarks(ks, HighWater{Revision: 7, Digest: names.Digest([]byte("m")), KeysetVersion: 2}))
	k, err := db.Load()
	must(t, err)
	if string(k.Keyset.GetPayload()) != "k2" || k.HighWater.KeysetVersion != 2 || k.HighWater.Revision != 7 {
		t.Errorf("kept keyset %q, marks %+v", k.Keyset.GetPayload(), k.HighWater)
	}
}

// TestRollbackKept: the rollback record is written with the commit of the
// apply that left modules part-way, survives the next journals, keeps the
// first record before of each path, loses the modules settled, and is
// unreadable (the journal section's policy) when it does not decode.
func TestRollbackKept(t *testing.T) {
	db, path := open(t)
	was := &LedgerRecord{Path: "/srv/a", Type: TypeFile, Module: "m", Digest: "sha256:" + strings.Repeat("1", 64)}
	first := &Rollback{Modules: map[string]string{"m": "one failed", "n": "two failed"}, Paths: map[string]RollbackPath{
		"/srv/a": {Module: "m", Before: was}, "/srv/b": {Module: "m"}, "/srv/n": {Module: "n"}}}
	if err := db.Commit(&Commit{ClearJournal: true, Rollback: first}); err != nil {
		t.Fatal(err)
	}
	// The next apply's journal and a rollback that failed part-way in turn.
	if err := db.PutJournal(&Journal{ID: "j", Ops: []Op{{Kind: OpWrite, Path: "/srv/a", Module: "m"}}}); err != nil {
		t.Fatal(err)
	}
	again := &Rollback{Modules: map[string]string{"m": "three failed"}, Paths: map[string]RollbackPath{
		"/srv/a": {Module: "m", Before: &LedgerRecord{Path: "/srv/a", Type: TypeFile, Module: "m", Digest: "sha256:" + strings.Repeat("2", 64)}}}}
	if err := db.Commit(&Commit{ClearJournal: true, Rollback: again, Settled: []string{"n"}}); err != nil {
		t.Fatal(err)
	}
	k, err := db.Load()
	if err != nil || k.JournalErr != nil || k.Journal != nil {
		t.Fatalf("load: %v, %v, journal %v", err, k.JournalErr, k.Journal)
	}
	want := &Rollback{Modules: map[string]string{"m": "three failed"}, Paths: map[string]RollbackPath{"/srv/a": {Module: "m", Before: was}, "/srv/b": {Module: "m"}}}
	if !reflect.DeepEqual(k.Rollback, want) {
		t.Errorf("kept %+v, want %+v", k.Rollback, want)
	}
	if err := db.Commit(&Commit{ClearJournal: true, Settled: []string{"m"}}); err != nil {
		t.Fatal(err)
	}
	if k, _ := db.Load(); k.Rollback != nil {
		t.Errorf("settled, still kept: %+v", k.Rollback)
	}

	if err := db.Commit(&Commit{Rollback: first}); err != nil {
		t.Fatal(err)
	}
	if err := db.Bolt().Update(func(tx *bolt.Tx) error {
		return tx.Bucket([]byte(SectionJournal)).Put([]byte(keyRollback), []byte(`{"modules":{"m":"x"},"paths":{"/srv/z":{"module":"q"}}}`))
	}); err != nil {
		t.Fatal(err)
	}
	db.Close()
	db, err = Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if k, _ := db.Load(); k.JournalErr == nil || !strings.Contains(k.JournalErr.Error(), `path /srv/z of module "q", which is not to be rolled back`) {
		t.Errorf("a record naming a path of no module it holds: %v", k.JournalErr)
	}
}
