// Package state keeps the node engine's state in a bbolt file in its state
// dir (DESIGN.md §7): kept entries and wants, the applied manifest and
// compositions, the path ledger, the high-water marks, the keyset, the
// intent journal of an apply in progress and the last report_seq sent.
//
// Each section is its own bucket and is read whole at start by Load, which
// reports a section it cannot read instead of failing: what the engine does
// then differs per section (see PolicyOf). The engine uses the store through
// the Store interface so tests can inject a failure per section.
package state

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"sort"
	"strings"
	"time"

	bolt "go.etcd.io/bbolt"
	"google.golang.org/protobuf/proto"

	"mesh.dev/internal/names"
	catalogv1 "mesh.dev/proto/mesh/catalog/v1"
	typev1 "mesh.dev/proto/mesh/type/v1"
)

// Section names one bucket of the state file.
type Section string

// The sections of the state file.
const (
	SectionEntries   Section = "entries"
	SectionWants     Section = "wants"
	SectionApplied   Section = "applied"
	SectionLedger    Section = "ledger"
	SectionHighWater Section = "highwater"
	SectionKeyset    Section = "keyset"
	SectionJournal   Section = "journal"
	// SectionReport holds the last report_seq sent. It is not a high-water
	// mark: losing it costs nothing that the clock cannot give back (see
	// NextReportSeq), so it never stops the engine from reporting.
	SectionReport Section = "report"
)

// Sections lists every section in a fixed order.
func Sections() []Section {
	return []Section{SectionEntries, SectionWants, SectionApplied, SectionLedger, SectionHighWater, SectionKeyset, SectionJournal, SectionReport}
}

// Words names a section as the engine's messages say it.
func (s Section) Words() string {
	switch s {
	case SectionEntries:
		return "entries"
	case SectionWants:
		return "wants"
	case SectionApplied:
		return "applied state"
	case SectionLedger:
		return "ledger"
	case SectionHighWater:
		return "high-water marks"
	case SectionKeyset:
		return "keyset"
	case SectionJournal:
		return "apply journal"
	case SectionReport:
		return "report sequence"
	}
	return string(s)
}

// Policy is what the engine does with a section Load cannot read
// (DESIGN.md §7).
type Policy int

const (
	// AskAfresh: the section only keeps what the catalog and the composer
	// hold (entries, wants); it is emptied and its content asked again.
	AskAfresh Policy = iota + 1
	// ApplyNothing: without the section revisions, paths or trust cannot
	// be judged (high-water marks, ledger, applied state, keyset, apply
	// journal); nothing is applied until it is repaired, and the engine
	// still connects and says why in every report.
	ApplyNothing
	// Reseed: report_seq starts again from the clock (NextReportSeq), above
	// anything sent before; reports go on.
	Reseed
)

// PolicyOf returns the policy of a section.
func PolicyOf(s Section) Policy {
	switch s {
	case SectionEntries, SectionWants:
		return AskAfresh
	case SectionReport:
		return Reseed
	}
	return ApplyNothing
}

// NextReportSeq returns the report_seq to send after last: max(last + 1,
// the clock in unix milliseconds). The clock term keeps report_seq above
// every one sent before even when the report section was lost, unreadable
// or not written (a wiped state dir, a failed write): the composer drops a
// lower report_seq, so a sequence that restarted at 1 would silence the
// engine until it caught up. The kept term keeps it monotonic when the
// clock steps back.
func NextReportSeq(last uint64, now time.Time) uint64 {
	seq := last + 1
	if ms := now.UnixMilli(); ms > 0 && uint64(ms) > seq {
		seq = uint64(ms)
	}
	return seq
}

// Key prefixes and fixed keys inside the sections.
const (
	entryPrefix       = "entry."
	wantPrefix        = "want."
	compositionPrefix = "composition."
	pathPrefix        = "path."
	keyManifest       = "manifest"
	keyMarks          = "marks"
	keyCurrent        = "current"
	keyIntent         = "intent"
	// keyIntentManifest and intentCompositionPrefix hold a version 2
	// journal's envelopes beside its intent.
	keyIntentManifest       = "intent.manifest"
	intentCompositionPrefix = "intent.composition."
	keySeq                  = "seq"
	// keyRollback holds, in the journal section, the modules an apply left
	// part-way until they are rolled back (Rollback).
	keyRollback = "rollback"
)

// version is the v field of every record; a record of another version is
// unreadable, never guessed at.
const version = 1

// KeptEntry is an answered catalog entry kept under entry.<fp hex>.
type KeptEntry struct {
	Entry *catalogv1.Entry
	// Since is when the catalog answered.
	Since time.Time
}

// KeptWant is a want kept under want.<module>.
type KeptWant struct {
	Want *typev1.Want
	// Since is when this node first kept a want of the module at this
	// fingerprint.
	Since time.Time
}

// Applied is what the engine last applied: the manifest and one composition
// per module (the node's own under "node").
type Applied struct {
	// Manifest is the signed manifest applied; nil before the first apply.
	Manifest *typev1.Envelope
	// Compositions are the signed compositions applied, by module.
	Compositions map[string]*typev1.Envelope
}

// HighWater holds the marks that must never go backwards.
type HighWater struct {
	// Revision is the highest manifest revision accepted and Digest its
	// digest (an equal revision with another digest is refused).
	Revision uint64 `json:"revision"`
	Digest   string `json:"digest,omitempty"`
	// KeysetVersion is the highest keyset version taken (and under which
	// a manifest was accepted): kept apart from the keyset section, it is
	// the floor a keyset must reach to repair that section when it cannot
	// be read (an older one may list keys a later one revoked). State
	// written before it was kept holds 0.
	KeysetVersion uint64 `json:"keyset_version,omitempty"`
}

// Record types of the ledger.
const (
	TypeFile    = "file"
	TypeDir     = "dir"
	TypeSymlink = "symlink"
)

// Prior is what was on an adopted path before the engine took it over; it is
// put back when the resource is removed.
type Prior struct {
	Type string `json:"type"`
	// Digest of the prior file content, kept in the state dir's adopted/.
	Digest string `json:"digest,omitempty"`
	Target string `json:"target,omitempty"`
	Mode   uint32 `json:"mode"`
	UID    int    `json:"uid"`
	GID    int    `json:"gid"`
}

// LedgerRecord is one path the engine manages (DESIGN.md §7): what it put
// there, for which resource of which composition.
type LedgerRecord struct {
	Path string `json:"path"`
	Type string `json:"type"`
	// Module is the owning composition's module ("node" for the node's own).
	Module string `json:"module"`
	// ID is the resource id; empty for an implicit parent directory.
	ID string `json:"id,omitempty"`
	// Key is the composition key that declares the path.
	Key string `json:"key,omitempty"`
	// Digest is the file content's digest, or a symlink's target.
	Digest string `json:"digest,omitempty"`
	// Size is a file's content size (so content can be fetched again).
	Size  int64  `json:"size,omitempty"`
	Mode  uint32 `json:"mode"`
	Owner string `json:"owner,omitempty"`
	Group string `json:"group,omitempty"`
	// Created is set when the engine created the path; a path it did not
	// create (adopted, filled) is never removed by it.
	Created bool `json:"created"`
	// Adopted holds the prior content of an adopted path.
	Adopted *Prior `json:"adopted,omitempty"`
	// Filled marks a file whose content an external provisioner writes.
	Filled bool `json:"filled,omitempty"`
	// Data marks a path under a data path: never removed.
	Data bool `json:"data,omitempty"`
	// Implicit marks a parent directory the engine created so a resource
	// could be written; it goes when empty and nothing declared lies under it.
	Implicit bool `json:"implicit,omitempty"`
	// Retained marks a path no composition declares any more that stays on
	// disk (a data path, or a directory not empty); it is still the
	// engine's, so a later declaration takes it over.
	Retained bool `json:"retained,omitempty"`
}

// Op kinds of the intent journal.
const (
	OpWrite   = "write"   // write a file from staged content
	OpMkdir   = "mkdir"   // create a directory
	OpSymlink = "symlink" // create or replace a symlink
	OpMeta    = "meta"    // set mode and owner only
	OpRemove  = "remove"  // remove a path the engine created
	OpRestore = "restore" // put an adopted path's prior content back
	OpForget  = "forget"  // change the ledger only (relabel, retain, drop)
)

// Op is one step of an apply, written to the journal before disk is
// touched so a crash can be finished on restart. Every op is idempotent.
type Op struct {
	Kind string `json:"kind"`
	Path string `json:"path"`
	// Module is the module whose attempt the op belongs to ("" for
	// removals of paths no composition declares).
	Module string `json:"module,omitempty"`
	// Record is the ledger record once the op is done; nil deletes it.
	Record *LedgerRecord `json:"record,omitempty"`
	// Prev is the ledger record before the op (nil when none).
	Prev *LedgerRecord `json:"prev,omitempty"`
	// Stage is the digest of the content a write or restore puts in place:
	// staged under the state dir, or carried by the op itself (InJournal).
	Stage string `json:"stage,omitempty"`
	// InJournal says a write's content is Inline (possibly empty), the
	// composition's inline bytes kept in the journal with the op: nothing
	// is staged for it, and a replay after a crash writes it from here.
	InJournal bool   `json:"in_journal,omitempty"`
	Inline    []byte `json:"inline,omitempty"`
	// FromComposition says Inline is the inline content of the resource at
	// Path in the journal's composition of Module: the journal keeps it
	// there only, and Load takes it back from the composition (checked
	// against Stage).
	FromComposition bool `json:"from_composition,omitempty"`
}

// Journal is the intent of one apply: its ops and what to commit when they
// are done.
type Journal struct {
	ID string
	// Revision is the manifest revision being applied.
	Revision uint64
	Ops      []Op
	// Manifest is the manifest envelope (proto bytes) to record as applied.
	Manifest []byte
	// Compositions are the envelopes (proto bytes) to record as applied, by
	// module, once every op of that module is done.
	Compositions map[string][]byte
	// Drop lists modules whose applied composition goes.
	Drop []string
	// Traceparent continues the apply's trace after a restart.
	Traceparent string
	// Settle are the modules that leave the kept rollback when none of
	// their ops fails: each then holds whole what the apply records.
	Settle []string
}

// journalRecord is the journal's intent record. Version 2 keeps the
// manifest and compositions as raw proto bytes under keys of their own
// beside it (intent.manifest, intent.composition.<module>) and the inline
// content of writes only in those compositions (Op.FromComposition);
// version 1 carried all of it in the JSON, in base64, and is still read.
type journalRecord struct {
	V        int    `json:"v"`
	ID       string `json:"id"`
	Revision uint64 `json:"revision"`
	Ops      []Op   `json:"ops"`
	// Manifest and Compositions are version 1's only.
	Manifest     []byte            `json:"manifest,omitempty"`
	Compositions map[string][]byte `json:"compositions,omitempty"`
	Drop         []string          `json:"drop,omitempty"`
	Traceparent  string            `json:"traceparent,omitempty"`
	Settle       []string          `json:"settle,omitempty"`
}

// journalVersion is the v of the intent record written now.
const journalVersion = 2

// Commit is the end of an apply, written in one transaction: ledger changes,
// the applied manifest and compositions, and the journal cleared.
type Commit struct {
	LedgerPut    []*LedgerRecord
	LedgerDelete []string
	// Manifest, when set, becomes the applied manifest.
	Manifest *typev1.Envelope
	// Compositions become the applied composition of their module.
	Compositions map[string]*typev1.Envelope
	// Drop removes modules' applied compositions.
	Drop []string
	// ClearJournal removes the intent once its ops are all accounted for.
	ClearJournal bool
	// Rollback adds the modules this apply left part-way to the kept
	// rollback (see Rollback.Merge); Settled are modules now recorded
	// applied whole (by this apply or by their rollback): they leave it.
	Rollback *Rollback
	Settled  []string
}

// Rollback is what must be put back of the modules applies left part-way
// (an op failed after others of the module were done): kept in the
// journal section, with the commit of the apply that left them so, until
// each module is rolled back to its applied composition or applied whole.
type Rollback struct {
	// Modules are the modules left part-way, each with the words of the
	// failure that left it so.
	Modules map[string]string `json:"modules"`
	// Paths are the paths those applies' ops changed, each with the
	// module and its ledger record before the first of them (nil: the
	// path was not in the ledger, the apply created it).
	Paths map[string]RollbackPath `json:"paths"`
}

// RollbackPath is one path of a Rollback.
type RollbackPath struct {
	Module string        `json:"module"`
	Before *LedgerRecord `json:"before,omitempty"`
}

// Empty reports whether nothing is to be rolled back.
func (r *Rollback) Empty() bool { return r == nil || len(r.Modules) == 0 }

// Holds reports whether module m is to be rolled back.
func (r *Rollback) Holds(m string) bool {
	if r == nil {
		return false
	}
	_, ok := r.Modules[m]
	return ok
}

// Merge returns r with settled modules taken out and add's put in. A path
// already held keeps its record before: it is the one before the first
// apply that left it part-way (a rollback that failed part-way in turn
// must not take the half state for the previous one).
func (r *Rollback) Merge(add *Rollback, settled []string) *Rollback {
	out := &Rollback{Modules: map[string]string{}, Paths: map[string]RollbackPath{}}
	if r != nil {
		maps.Copy(out.Modules, r.Modules)
		maps.Copy(out.Paths, r.Paths)
	}
	for _, m := range settled {
		delete(out.Modules, m)
	}
	for p, rp := range out.Paths {
		if _, ok := out.Modules[rp.Module]; !ok {
			delete(out.Paths, p)
		}
	}
	if add != nil {
		maps.Copy(out.Modules, add.Modules)
		for p, rp := range add.Paths {
			if _, ok := out.Paths[p]; !ok {
				out.Paths[p] = rp
			}
		}
	}
	if len(out.Modules) == 0 {
		return nil
	}
	return out
}

// Kept is the whole state as Load read it. A section that could not be read
// has its error set and its content empty.
type Kept struct {
	Entries    map[string]KeptEntry
	EntriesErr error
	Wants      map[string]KeptWant
	WantsErr   error
	Applied    Applied
	AppliedErr error
	Ledger     map[string]*LedgerRecord
	LedgerErr  error
	HighWater  HighWater
	// HighWaterErr set means revisions cannot be judged: apply nothing.
	HighWaterErr error
	Keyset       *typev1.Envelope
	KeysetErr    error
	Journal      *Journal
	// Rollback is read with the journal (JournalErr covers it).
	Rollback   *Rollback
	JournalErr error
	// ReportSeq is at least the last report_seq sent on the Sync stream:
	// the engine keeps a ceiling above the ones it sends.
	ReportSeq    uint64
	ReportSeqErr error
}

// Err returns the error of a section Load could not read, nil otherwise.
func (k *Kept) Err(s Section) error {
	switch s {
	case SectionEntries:
		return k.EntriesErr
	case SectionWants:
		return k.WantsErr
	case SectionApplied:
		return k.AppliedErr
	case SectionLedger:
		return k.LedgerErr
	case SectionHighWater:
		return k.HighWaterErr
	case SectionKeyset:
		return k.KeysetErr
	case SectionJournal:
		return k.JournalErr
	case SectionReport:
		return k.ReportSeqErr
	}
	return nil
}

// Store is what the engine needs of its state; DB implements it on bbolt
// and tests wrap it to inject failures. Every write is durable (fsynced)
// when it returns nil.
type Store interface {
	// Load reads every section.
	Load() (*Kept, error)
	PutEntry(fp string, e KeptEntry) error
	DeleteEntries(fps []string) error
	PutWant(module string, w KeptWant) error
	DeleteWants(modules []string) error
	PutHighWater(hw HighWater) error
	PutReportSeq(seq uint64) error
	PutKeyset(env *typev1.Envelope) error
	PutKeysetAndMarks(env *typev1.Envelope, hw HighWater) error
	PutJournal(j *Journal) error
	Commit(c *Commit) error
	// Reset empties a section whose policy is AskAfresh, so an unreadable
	// one heals instead of failing every start.
	Reset(s Section) error
	Close() error
}

// ErrUnreadable wraps the error of a section that cannot be read.
var ErrUnreadable = errors.New("state section unreadable")

// DB is the bbolt state file.
type DB struct {
	db *bolt.DB
}

var _ Store = (*DB)(nil)

// Open opens or creates the state file and its sections.
func Open(path string) (*DB, error) {
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: 5 * time.Second})
	if err != nil {
		return nil, fmt.Errorf("open engine state %s: %w", path, err)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		for _, s := range Sections() {
			if _, err := tx.CreateBucketIfNotExists([]byte(s)); err != nil {
				return fmt.Errorf("section %s: %w", s, err)
			}
		}
		return nil
	})
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("init engine state: %w", err)
	}
	return &DB{db: db}, nil
}

// Close closes the file.
func (d *DB) Close() error { return d.db.Close() }

// Bolt returns the underlying database, for tests that damage a section.
func (d *DB) Bolt() *bolt.DB { return d.db }

type entryRecord struct {
	V     int       `json:"v"`
	Since time.Time `json:"since"`
	Entry []byte    `json:"entry"`
}

type wantRecord struct {
	V     int       `json:"v"`
	Since time.Time `json:"since"`
	Want  []byte    `json:"want"`
}

type marksRecord struct {
	V int `json:"v"`
	HighWater
	// LegacyReportSeq is where report_seq was kept before it had a section
	// of its own: read as a floor, never written.
	LegacyReportSeq uint64 `json:"report_seq,omitempty"`
}

type reportRecord struct {
	V   int    `json:"v"`
	Seq uint64 `json:"seq"`
}

func unreadable(s Section, key string, err error) error {
	return fmt.Errorf("%w: %s key %q: %v", ErrUnreadable, s, key, err)
}

// Load reads every section; a section that does not decode gets its error
// and is left empty, and the other sections are still read.
func (d *DB) Load() (*Kept, error) {
	k := &Kept{
		Entries: map[string]KeptEntry{}, Wants: map[string]KeptWant{},
		Applied: Applied{Compositions: map[string]*typev1.Envelope{}},
		Ledger:  map[string]*LedgerRecord{},
	}
	err := d.db.View(func(tx *bolt.Tx) error {
		k.EntriesErr = eachKey(tx, SectionEntries, func(key string, v []byte) error {
			fp := names.FingerprintFromHex(strings.TrimPrefix(key, entryPrefix))
			if !strings.HasPrefix(key, entryPrefix) || fp == "" {
				return errors.New("not entry.<fp hex>")
			}
			var r entryRecord
			if err := strictJSON(v, &r); err != nil {
				return err
			}
			e := &catalogv1.Entry{}
			if err := proto.Unmarshal(r.Entry, e); err != nil {
				return err
			}
			k.Entries[fp] = KeptEntry{Entry: e, Since: r.Since}
			return nil
		})
		if k.EntriesErr != nil {
			k.Entries = map[string]KeptEntry{}
		}
		k.WantsErr = eachKey(tx, SectionWants, func(key string, v []byte) error {
			module, ok := strings.CutPrefix(key, wantPrefix)
			if !ok || names.CheckModule(module) != nil {
				return errors.New("not want.<module>")
			}
			var r wantRecord
			if err := strictJSON(v, &r); err != nil {
				return err
			}
			w := &typev1.Want{}
			if err := proto.Unmarshal(r.Want, w); err != nil {
				return err
			}
			if w.GetModule() != module {
				return fmt.Errorf("holds a want of module %q", w.GetModule())
			}
			k.Wants[module] = KeptWant{Want: w, Since: r.Since}
			return nil
		})
		if k.WantsErr != nil {
			k.Wants = map[string]KeptWant{}
		}
		k.AppliedErr = eachKey(tx, SectionApplied, func(key string, v []byte) error {
			env := &typev1.Envelope{}
			if err := proto.Unmarshal(v, env); err != nil {
				return err
			}
			if key == keyManifest {
				k.Applied.Manifest = env
				return nil
			}
			module, ok := strings.CutPrefix(key, compositionPrefix)
			if !ok {
				return errors.New("unknown key")
			}
			k.Applied.Compositions[module] = env
			return nil
		})
		if k.AppliedErr != nil {
			k.Applied = Applied{Compositions: map[string]*typev1.Envelope{}}
		}
		k.LedgerErr = eachKey(tx, SectionLedger, func(key string, v []byte) error {
			p, ok := strings.CutPrefix(key, pathPrefix)
			if !ok {
				return errors.New("not path.<path>")
			}
			r := &LedgerRecord{}
			if err := strictJSON(v, r); err != nil {
				return err
			}
			if r.Path != p || names.CheckPath("path", p) != nil {
				return fmt.Errorf("record of path %q", r.Path)
			}
			k.Ledger[p] = r
			return nil
		})
		if k.LedgerErr != nil {
			k.Ledger = map[string]*LedgerRecord{}
		}
		k.HighWaterErr = eachKey(tx, SectionHighWater, func(key string, v []byte) error {
			if key != keyMarks {
				return errors.New("unknown key")
			}
			var r marksRecord
			if err := strictJSON(v, &r); err != nil {
				return err
			}
			if r.V != version {
				return fmt.Errorf("version %d", r.V)
			}
			k.HighWater = r.HighWater
			k.ReportSeq = max(k.ReportSeq, r.LegacyReportSeq)
			return nil
		})
		if k.HighWaterErr != nil {
			k.HighWater = HighWater{}
		}
		k.KeysetErr = eachKey(tx, SectionKeyset, func(key string, v []byte) error {
			if key != keyCurrent {
				return errors.New("unknown key")
			}
			env := &typev1.Envelope{}
			if err := proto.Unmarshal(v, env); err != nil {
				return err
			}
			k.Keyset = env
			return nil
		})
		if k.KeysetErr != nil {
			k.Keyset = nil
		}
		k.Journal, k.Rollback, k.JournalErr = loadJournal(tx)
		legacy := k.ReportSeq
		k.ReportSeqErr = eachKey(tx, SectionReport, func(key string, v []byte) error {
			if key != keySeq {
				return errors.New("unknown key")
			}
			var r reportRecord
			if err := strictJSON(v, &r); err != nil {
				return err
			}
			if r.V != version {
				return fmt.Errorf("version %d", r.V)
			}
			k.ReportSeq = max(legacy, r.Seq)
			return nil
		})
		if k.ReportSeqErr != nil {
			k.ReportSeq = legacy
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("read engine state: %w", err)
	}
	return k, nil
}

// eachKey calls fn for every key of a section and returns the first failure
// wrapped in ErrUnreadable, naming the section and key.
func eachKey(tx *bolt.Tx, s Section, fn func(key string, v []byte) error) error {
	b := tx.Bucket([]byte(s))
	if b == nil {
		return fmt.Errorf("%w: section %s is missing", ErrUnreadable, s)
	}
	return b.ForEach(func(k, v []byte) error {
		if v == nil {
			return unreadable(s, string(k), errors.New("a nested bucket"))
		}
		if err := fn(string(k), v); err != nil {
			return unreadable(s, string(k), err)
		}
		return nil
	})
}

func strictJSON(b []byte, v any) error {
	dec := json.NewDecoder(strings.NewReader(string(b)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return err
	}
	switch r := v.(type) {
	case *entryRecord:
		if r.V != version {
			return fmt.Errorf("version %d", r.V)
		}
	case *wantRecord:
		if r.V != version {
			return fmt.Errorf("version %d", r.V)
		}
	}
	return nil
}

func (d *DB) put(s Section, key string, v []byte) error {
	return d.db.Update(func(tx *bolt.Tx) error {
		return tx.Bucket([]byte(s)).Put([]byte(key), v)
	})
}

func (d *DB) deleteKeys(s Section, keys []string) error {
	if len(keys) == 0 {
		return nil
	}
	return d.db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket([]byte(s))
		for _, k := range keys {
			if err := b.Delete([]byte(k)); err != nil {
				return err
			}
		}
		return nil
	})
}

// EntryKey returns the key of a kept entry: entry.<fp hex>.
func EntryKey(fp string) string { return entryPrefix + names.FingerprintHex(fp) }

// WantKey returns the key of a kept want: want.<module>.
func WantKey(module string) string { return wantPrefix + module }

// PutEntry keeps an answered entry.
func (d *DB) PutEntry(fp string, e KeptEntry) error {
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(e.Entry)
	if err != nil {
		return fmt.Errorf("keep entry %s: %w", fp, err)
	}
	v, err := json.Marshal(entryRecord{V: version, Since: e.Since.UTC(), Entry: b})
	if err != nil {
		return err
	}
	if err := d.put(SectionEntries, EntryKey(fp), v); err != nil {
		return fmt.Errorf("keep entry %s: %w", fp, err)
	}
	return nil
}

// DeleteEntries deletes kept entries.
func (d *DB) DeleteEntries(fps []string) error {
	keys := make([]string, len(fps))
	for i, fp := range fps {
		keys[i] = EntryKey(fp)
	}
	if err := d.deleteKeys(SectionEntries, keys); err != nil {
		return fmt.Errorf("delete kept entries: %w", err)
	}
	return nil
}

// PutWant keeps a want.
func (d *DB) PutWant(module string, w KeptWant) error {
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(w.Want)
	if err != nil {
		return fmt.Errorf("keep want %s: %w", module, err)
	}
	v, err := json.Marshal(wantRecord{V: version, Since: w.Since.UTC(), Want: b})
	if err != nil {
		return err
	}
	if err := d.put(SectionWants, WantKey(module), v); err != nil {
		return fmt.Errorf("keep want %s: %w", module, err)
	}
	return nil
}

// DeleteWants deletes kept wants.
func (d *DB) DeleteWants(modules []string) error {
	keys := make([]string, len(modules))
	for i, m := range modules {
		keys[i] = WantKey(m)
	}
	if err := d.deleteKeys(SectionWants, keys); err != nil {
		return fmt.Errorf("delete kept wants: %w", err)
	}
	return nil
}

// PutHighWater persists the high-water marks.
func (d *DB) PutHighWater(hw HighWater) error {
	v, err := json.Marshal(marksRecord{V: version, HighWater: hw})
	if err != nil {
		return err
	}
	if err := d.put(SectionHighWater, keyMarks, v); err != nil {
		return fmt.Errorf("persist high-water marks: %w", err)
	}
	return nil
}

// PutReportSeq persists the last report_seq sent.
func (d *DB) PutReportSeq(seq uint64) error {
	v, err := json.Marshal(reportRecord{V: version, Seq: seq})
	if err != nil {
		return err
	}
	if err := d.put(SectionReport, keySeq, v); err != nil {
		return fmt.Errorf("persist report_seq: %w", err)
	}
	return nil
}

// Reset empties a section whose policy is AskAfresh; any other section is
// refused (its content cannot be asked for again).
func (d *DB) Reset(s Section) error {
	if PolicyOf(s) != AskAfresh {
		return fmt.Errorf("section %s is not reset: its content cannot be asked for again", s)
	}
	err := d.db.Update(func(tx *bolt.Tx) error {
		if tx.Bucket([]byte(s)) != nil {
			if err := tx.DeleteBucket([]byte(s)); err != nil {
				return err
			}
		}
		_, err := tx.CreateBucket([]byte(s))
		return err
	})
	if err != nil {
		return fmt.Errorf("reset section %s: %w", s, err)
	}
	return nil
}

// PutKeyset persists the keyset envelope.
func (d *DB) PutKeyset(env *typev1.Envelope) error {
	v, err := proto.MarshalOptions{Deterministic: true}.Marshal(env)
	if err != nil {
		return err
	}
	if err := d.put(SectionKeyset, keyCurrent, v); err != nil {
		return fmt.Errorf("persist keyset: %w", err)
	}
	return nil
}

// PutKeysetAndMarks persists a keyset and the high-water marks (whose
// KeysetVersion records it) in one transaction: the floor never lags the
// keyset it guards.
func (d *DB) PutKeysetAndMarks(env *typev1.Envelope, hw HighWater) error {
	ks, err := proto.MarshalOptions{Deterministic: true}.Marshal(env)
	if err != nil {
		return err
	}
	marks, err := json.Marshal(marksRecord{V: version, HighWater: hw})
	if err != nil {
		return err
	}
	if err := d.db.Update(func(tx *bolt.Tx) error {
		if err := tx.Bucket([]byte(SectionKeyset)).Put([]byte(keyCurrent), ks); err != nil {
			return err
		}
		return tx.Bucket([]byte(SectionHighWater)).Put([]byte(keyMarks), marks)
	}); err != nil {
		return fmt.Errorf("persist keyset and high-water marks: %w", err)
	}
	return nil
}

// PutJournal writes the intent of an apply, in one transaction: the intent
// record, and its manifest and compositions as raw bytes beside it (see
// journalRecord). Whatever an earlier journal left goes.
func (d *DB) PutJournal(j *Journal) error {
	rec := journalRecord{V: journalVersion, ID: j.ID, Revision: j.Revision, Ops: j.Ops, Drop: j.Drop, Traceparent: j.Traceparent, Settle: j.Settle}
	// The content of a write by reference stays in its composition; the
	// caller's ops keep theirs.
	cloned := false
	for i, op := range j.Ops {
		if op.FromComposition && op.Inline != nil {
			if !cloned {
				rec.Ops, cloned = append([]Op(nil), j.Ops...), true
			}
			rec.Ops[i].Inline = nil
		}
	}
	v, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	err = d.db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket([]byte(SectionJournal))
		if err := clearIntent(b); err != nil {
			return err
		}
		if len(j.Manifest) > 0 {
			if err := b.Put([]byte(keyIntentManifest), j.Manifest); err != nil {
				return err
			}
		}
		for m, env := range j.Compositions {
			if err := b.Put([]byte(intentCompositionPrefix+m), env); err != nil {
				return err
			}
		}
		return b.Put([]byte(keyIntent), v)
	})
	if err != nil {
		return fmt.Errorf("write apply journal: %w", err)
	}
	return nil
}

// clearIntent deletes a journal's keys, the kept rollback aside.
func clearIntent(b *bolt.Bucket) error {
	var keys [][]byte
	if err := b.ForEach(func(k, _ []byte) error {
		if string(k) != keyRollback {
			keys = append(keys, bytes.Clone(k))
		}
		return nil
	}); err != nil {
		return err
	}
	for _, k := range keys {
		if err := b.Delete(k); err != nil {
			return err
		}
	}
	return nil
}

// loadJournal reads the journal section: nil when it holds no intent. The
// inline content of a version 2 journal's writes is taken back from its
// compositions, each checked against the digest the op was to write.
func loadJournal(tx *bolt.Tx) (*Journal, *Rollback, error) {
	var rb *Rollback
	j, err := loadIntent(tx, func(v []byte) (err error) {
		rb, err = decodeRollback(v)
		return err
	})
	if err != nil {
		return nil, nil, err
	}
	return j, rb, nil
}

// decodeRollback reads a kept rollback record (nil when it holds nothing):
// every path must be of a module it holds.
func decodeRollback(v []byte) (*Rollback, error) {
	rb := &Rollback{}
	if err := strictJSON(v, rb); err != nil {
		return nil, err
	}
	for p, rp := range rb.Paths {
		if !rb.Holds(rp.Module) {
			return nil, fmt.Errorf("path %s of module %q, which is not to be rolled back", p, rp.Module)
		}
	}
	if rb.Empty() {
		return nil, nil
	}
	return rb, nil
}

func loadIntent(tx *bolt.Tx, rollback func(v []byte) error) (*Journal, error) {
	var rec *journalRecord
	var manifest []byte
	comps := map[string][]byte{}
	err := eachKey(tx, SectionJournal, func(key string, v []byte) error {
		switch {
		case key == keyRollback:
			return rollback(v)
		case key == keyIntent:
			rec = &journalRecord{}
			if err := strictJSON(v, rec); err != nil {
				return err
			}
			if rec.V != version && rec.V != journalVersion {
				return fmt.Errorf("version %d", rec.V)
			}
		case key == keyIntentManifest:
			manifest = append([]byte(nil), v...)
		case strings.HasPrefix(key, intentCompositionPrefix) && len(key) > len(intentCompositionPrefix):
			comps[strings.TrimPrefix(key, intentCompositionPrefix)] = append([]byte(nil), v...)
		default:
			return errors.New("unknown key")
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	if rec == nil {
		if manifest != nil || len(comps) > 0 {
			return nil, fmt.Errorf("%w: section %s holds a journal's envelopes without its %s record", ErrUnreadable, SectionJournal, keyIntent)
		}
		return nil, nil
	}
	j := &Journal{ID: rec.ID, Revision: rec.Revision, Ops: rec.Ops, Drop: rec.Drop, Traceparent: rec.Traceparent, Settle: rec.Settle}
	if rec.V == version {
		if manifest != nil || len(comps) > 0 {
			return nil, unreadable(SectionJournal, keyIntent, errors.New("a version 1 journal with envelopes beside it"))
		}
		j.Manifest, j.Compositions = rec.Manifest, rec.Compositions
		for _, op := range j.Ops {
			if op.FromComposition {
				return nil, unreadable(SectionJournal, keyIntent, fmt.Errorf("op %s %s: content by reference in a version 1 journal", op.Kind, op.Path))
			}
		}
		return j, nil
	}
	if rec.Manifest != nil || rec.Compositions != nil {
		return nil, unreadable(SectionJournal, keyIntent, errors.New("a version 2 journal with envelopes in its record"))
	}
	j.Manifest, j.Compositions = manifest, comps
	inline := map[string]map[string][]byte{}
	for i := range j.Ops {
		op := &j.Ops[i]
		if !op.FromComposition {
			continue
		}
		if op.Kind != OpWrite || !op.InJournal || op.Inline != nil {
			return nil, unreadable(SectionJournal, keyIntent, fmt.Errorf("op %s %s: content by reference on an op that is not an inline write", op.Kind, op.Path))
		}
		byPath, ok := inline[op.Module]
		if !ok {
			var err error
			if byPath, err = inlineContents(comps[op.Module]); err != nil {
				return nil, unreadable(SectionJournal, intentCompositionPrefix+op.Module, err)
			}
			inline[op.Module] = byPath
		}
		content, ok := byPath[op.Path]
		switch {
		case !ok:
			return nil, unreadable(SectionJournal, keyIntent, fmt.Errorf("op write %s: the journal's composition of module %q has no inline content at that path", op.Path, op.Module))
		case names.Digest(content) != op.Stage:
			return nil, unreadable(SectionJournal, keyIntent, fmt.Errorf("op write %s: the inline content in the journal's composition of module %q is not %s", op.Path, op.Module, op.Stage))
		}
		op.Inline = content
	}
	return j, nil
}

// inlineContents returns the inline content of a composition envelope's
// resources by path.
func inlineContents(b []byte) (map[string][]byte, error) {
	if b == nil {
		return nil, errors.New("no composition of the module is kept")
	}
	env := &typev1.Envelope{}
	if err := proto.Unmarshal(b, env); err != nil {
		return nil, fmt.Errorf("composition envelope: %w", err)
	}
	c := &typev1.Composition{}
	if err := proto.Unmarshal(env.GetPayload(), c); err != nil {
		return nil, fmt.Errorf("composition payload: %w", err)
	}
	out := map[string][]byte{}
	for _, r := range c.GetResources() {
		if in, ok := r.GetContent().(*typev1.Resource_Inline); ok {
			out[r.GetPath()] = in.Inline
		}
	}
	return out, nil
}

// Commit writes the end of an apply in one transaction.
func (d *DB) Commit(c *Commit) error {
	err := d.db.Update(func(tx *bolt.Tx) error {
		ledger := tx.Bucket([]byte(SectionLedger))
		for _, r := range c.LedgerPut {
			v, err := json.Marshal(r)
			if err != nil {
				return err
			}
			if err := ledger.Put([]byte(pathPrefix+r.Path), v); err != nil {
				return err
			}
		}
		for _, p := range c.LedgerDelete {
			if err := ledger.Delete([]byte(pathPrefix + p)); err != nil {
				return err
			}
		}
		applied := tx.Bucket([]byte(SectionApplied))
		if c.Manifest != nil {
			v, err := proto.MarshalOptions{Deterministic: true}.Marshal(c.Manifest)
			if err != nil {
				return err
			}
			if err := applied.Put([]byte(keyManifest), v); err != nil {
				return err
			}
		}
		modules := make([]string, 0, len(c.Compositions))
		for m := range c.Compositions {
			modules = append(modules, m)
		}
		sort.Strings(modules)
		for _, m := range modules {
			v, err := proto.MarshalOptions{Deterministic: true}.Marshal(c.Compositions[m])
			if err != nil {
				return err
			}
			if err := applied.Put([]byte(compositionPrefix+m), v); err != nil {
				return err
			}
		}
		for _, m := range c.Drop {
			if err := applied.Delete([]byte(compositionPrefix + m)); err != nil {
				return err
			}
		}
		journal := tx.Bucket([]byte(SectionJournal))
		if c.ClearJournal {
			if err := clearIntent(journal); err != nil {
				return err
			}
		}
		if c.Rollback.Empty() && len(c.Settled) == 0 {
			return nil
		}
		var kept *Rollback
		if v := journal.Get([]byte(keyRollback)); v != nil {
			var err error
			if kept, err = decodeRollback(v); err != nil {
				return unreadable(SectionJournal, keyRollback, err)
			}
		}
		next := kept.Merge(c.Rollback, c.Settled)
		if next == nil {
			return journal.Delete([]byte(keyRollback))
		}
		v, err := json.Marshal(next)
		if err != nil {
			return err
		}
		return journal.Put([]byte(keyRollback), v)
	})
	if err != nil {
		return fmt.Errorf("commit apply: %w", err)
	}
	return nil
}
