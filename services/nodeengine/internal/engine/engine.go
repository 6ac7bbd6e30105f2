// Package engine is the node engine's core (DESIGN.md §7): the kept state
// read whole at start, the entries cache, and the pass that verifies what the
// composer sent, lays the module picture, holds what cannot be applied and
// applies the rest, and reports the haves.
//
// Everything that changes the engine's view (a manifest, a keyset, heard
// nodes, an entry answered, a timer) asks for a pass; passes run one at a
// time in Run, so one manifest is applied at a time.
package engine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"mesh.dev/internal/envelope"
	"mesh.dev/internal/names"
	"mesh.dev/internal/verify"
	catalogv1 "mesh.dev/proto/mesh/catalog/v1"
	composerv1 "mesh.dev/proto/mesh/composer/v1"
	nodeenginev1 "mesh.dev/proto/mesh/nodeengine/v1"
	typev1 "mesh.dev/proto/mesh/type/v1"
	"mesh.dev/services/nodeengine/internal/apply"
	"mesh.dev/services/nodeengine/internal/entries"
	"mesh.dev/services/nodeengine/internal/picture"
	"mesh.dev/services/nodeengine/internal/state"
)

// Defaults of Config.
const (
	DefaultFetchDeadline = 5 * time.Minute
	DefaultDriftInterval = time.Minute
	// DefaultCompositionDeadline bounds a composition's fetch: one unary
	// call of at most 256 KiB, which a composer answers from one read.
	DefaultCompositionDeadline = 30 * time.Second
	// DefaultFetchStall cuts an object or artifact stream that has sent
	// nothing for that long, well before its FetchDeadline.
	DefaultFetchStall = 30 * time.Second
	// DefaultFetchRetryBase is the first delay before a pass in which a
	// fetch failed runs again; it doubles up to the drift interval.
	DefaultFetchRetryBase = time.Second
	// MaxOffers bounds the manifests waiting for a pass; older ones go.
	MaxOffers = 8
)

// Config is what an Engine needs.
type Config struct {
	// Node is the engine's node, from its certificate.
	Node string
	// Roots are the pinned root keys.
	Roots *typev1.TrustRoots
	Store state.Store
	// Applier writes under the allowed prefixes; the engine closes it.
	Applier  *apply.Applier
	Composer Composer
	Catalog  Catalog
	// EngineVersion is sent in Hello.
	EngineVersion string
	Now           func() time.Time
	// Logger receives the engine's logs; the caller names the node in it.
	Logger *slog.Logger
	Tracer trace.TracerProvider
	// EntryDeadline bounds each GetEntry; EntryBackoffBase/Max its retries.
	EntryDeadline, EntryBackoffBase, EntryBackoffMax time.Duration
	// FetchDeadline bounds each object or artifact fetch, FetchStall the
	// time one may go without data, CompositionDeadline each composition
	// fetch. A pass waits for its fetches, so each bound is also how long
	// a composer or catalog that never answers holds every later manifest.
	FetchDeadline, FetchStall, CompositionDeadline time.Duration
	// FetchRetryBase is the first delay before a pass in which a fetch
	// failed runs again (doubling, jittered, up to DriftInterval).
	FetchRetryBase time.Duration
	// DriftInterval is how often a pass runs with nothing asking for one,
	// to find and correct drift and judge expiry.
	DriftInterval time.Duration
}

// live is the newest manifest that passed verification in this run.
type live struct {
	env      *typev1.Envelope
	manifest *typev1.Manifest
	digest   string
	keyID    string
	// ring is the keyring that verified it (with keyID).
	ring *verify.Keyring
}

// refusal is why the last manifest or keyset offered was refused.
type refusal struct {
	code   composerv1.ReasonCode
	reason string
	at     time.Time
}

// verified is a composition that passed verification, by digest: under
// ring, signed by the key of id keyID.
type verified struct {
	env   *typev1.Envelope
	comp  *typev1.Composition
	ring  *verify.Keyring
	keyID string
}

// Engine is one node's engine.
type Engine struct {
	cfg    Config
	log    *slog.Logger
	tracer trace.Tracer
	cache  *entries.Cache
	src    *source
	poke   chan struct{}

	// passMu makes passes run one at a time; mu guards what other
	// goroutines read or hand in.
	passMu sync.Mutex
	mu     sync.Mutex
	// Kept state and why a section could not be read.
	keyring      *verify.Keyring
	hw           state.HighWater
	hwErr        error
	ledger       map[string]*state.LedgerRecord
	ledgerErr    error
	applied      state.Applied
	appliedComps map[string]*typev1.Composition
	appliedErr   error
	keysetErr    error
	// keysetNotRoots is why the kept keyset was not taken though it was
	// read: it does not verify against the pinned roots ("" otherwise).
	keysetNotRoots string
	// reportSeq is the last report_seq sent (state.NextReportSeq), and
	// reportSeqCeiling the ceiling kept in the state (reportSeqReserve).
	reportSeq        uint64
	reportSeqCeiling uint64
	keptWants        map[string]state.KeptWant
	keptEntries      map[string]bool
	pending          *state.Journal // ops ran, commit failed: replayed by the next pass
	// heldJournal is the journal of an apply a stop left half done, kept
	// while a section blocks the engine: replayed once nothing does.
	heldJournal *state.Journal
	// rollback is the kept record of the modules applies left part-way,
	// rolled back first thing each pass until they are (rollBack).
	rollback *state.Rollback
	// retryRolledBack are the wanted compositions rolled back after their
	// apply failed part-way, held back until their time (passes only).
	retryRolledBack map[string]*rolledBackWant
	// Writes of entries and wants that failed, retried each pass; said
	// once per key.
	dirtyEntries map[string]entries.Row
	dirtyWants   map[string]bool
	said         map[string]bool

	live         *live
	offers       []*typev1.Envelope
	keysetOffers []*typev1.Envelope
	heard        *composerv1.Heard
	refused      *refusal
	// keysetRefused is why the last keyset offered was refused, said with
	// the manifests that wait for a keyset.
	keysetRefused string
	compCache     map[string]*verified

	// What the last pass found.
	wants      []*typev1.Want
	holds      []*nodeenginev1.EngineHold
	picture    []*nodeenginev1.PictureModule
	attempts   map[string]*composerv1.Attempt
	drift      []string
	notes      map[string][]string
	stale      string
	staleSince time.Time
	// blocked says why nothing is applied (a kept section unreadable);
	// every report carries it (see publishLocked).
	blocked string
	// block is the last pass's reason for applying nothing: blocked, or a
	// ledger commit that failed; nil when the pass could apply.
	block  *outcome
	passes uint64

	// pokes counts Poke calls and answers the entries cache's answers
	// (each is counted before it wakes Run); lastPokes and lastAnswers are
	// what the last pass had seen of each. A wake-up of Run with neither
	// moved since asks for nothing that pass did not take (the answers a
	// pass waited for wake Run once more), so it is skipped.
	pokes, answers, lastPokes, lastAnswers atomic.Uint64
	// answered is signalled at each answer, for a pass waiting for them.
	answered chan struct{}

	// Reports.
	haves       []*composerv1.Have
	reportVer   uint64
	changed     chan struct{}
	traceparent string
	tracestate  string

	// Connection, set by the Sync client.
	connected bool
	connErr   string
	lastSync  time.Time
}

// New reads the kept state whole (before anything is asked), applies each
// section's failure policy, finishes an apply a crash left half done, and
// returns an engine ready to Run.
func New(ctx context.Context, cfg Config) (*Engine, error) {
	switch {
	case cfg.Node == "":
		return nil, errors.New("engine: no node")
	case cfg.Roots == nil:
		return nil, errors.New("engine: no trust roots")
	case cfg.Store == nil:
		return nil, errors.New("engine: no state store")
	case cfg.Applier == nil:
		return nil, errors.New("engine: no applier")
	}
	if err := names.CheckNode(cfg.Node); err != nil {
		return nil, fmt.Errorf("engine: %w", err)
	}
	if err := verify.CheckRoots(cfg.Roots); err != nil {
		return nil, fmt.Errorf("engine: %w", err)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Tracer == nil {
		cfg.Tracer = noop.NewTracerProvider()
	}
	if cfg.FetchDeadline <= 0 {
		cfg.FetchDeadline = DefaultFetchDeadline
	}
	if cfg.FetchStall <= 0 {
		cfg.FetchStall = DefaultFetchStall
	}
	if cfg.CompositionDeadline <= 0 {
		cfg.CompositionDeadline = DefaultCompositionDeadline
	}
	if cfg.FetchRetryBase <= 0 {
		cfg.FetchRetryBase = DefaultFetchRetryBase
	}
	if cfg.DriftInterval <= 0 {
		cfg.DriftInterval = DefaultDriftInterval
	}
	e := &Engine{
		cfg: cfg, log: cfg.Logger,
		tracer: cfg.Tracer.Tracer("mesh.dev/services/nodeengine"),
		src:    &source{composer: cfg.Composer, catalog: cfg.Catalog, deadline: cfg.FetchDeadline, stall: cfg.FetchStall},
		poke:   make(chan struct{}, 1), changed: make(chan struct{}), answered: make(chan struct{}, 1),
		dirtyEntries: map[string]entries.Row{}, dirtyWants: map[string]bool{}, said: map[string]bool{},
		compCache: map[string]*verified{}, attempts: map[string]*composerv1.Attempt{}, notes: map[string][]string{},
		keptEntries: map[string]bool{}, appliedComps: map[string]*typev1.Composition{}, retryRolledBack: map[string]*rolledBackWant{},
	}
	kept, err := cfg.Store.Load()
	if err != nil {
		return nil, err
	}
	e.loadKept(kept)
	for _, sec := range state.Sections() {
		if kept.Err(sec) != nil && state.PolicyOf(sec) == state.AskAfresh {
			// Only a cache of what the catalog and composer hold: emptied,
			// so the next start reads it again instead of failing on it.
			if err := cfg.Store.Reset(sec); err != nil {
				e.log.Warn("unreadable section not emptied; it is asked afresh at every start", slog.String("section", string(sec)), slog.Any("error", err))
			}
		}
	}
	var catalog entries.Catalog = unreachableCatalog{}
	if cfg.Catalog != nil {
		catalog = cfg.Catalog
	}
	e.cache = entries.New(entries.Config{
		Catalog: catalog, Deadline: cfg.EntryDeadline, BackoffBase: cfg.EntryBackoffBase, BackoffMax: cfg.EntryBackoffMax,
		Now: cfg.Now, Keep: e.keepEntry, Poke: e.entryAnswered, Logger: e.log,
	})
	now := cfg.Now()
	for fp, k := range kept.Entries {
		m, err := entries.Check(fp, k.Entry)
		if err == nil {
			for _, w := range kept.Wants {
				if w.Want.GetFingerprint() == fp && w.Want.GetModule() != k.Entry.GetModule() {
					err = fmt.Errorf("entry %s is of module %q, the kept want of %q", fp, k.Entry.GetModule(), w.Want.GetModule())
				}
			}
		}
		if err != nil {
			// A kept entry that no longer checks out is asked afresh.
			e.log.Warn("kept entry dropped", slog.String("fingerprint", fp), slog.Any("error", err))
			if derr := cfg.Store.DeleteEntries([]string{fp}); derr != nil {
				e.log.Warn("delete kept entry failed", slog.String("fingerprint", fp), slog.Any("error", derr))
			}
			continue
		}
		// After a restart an entry's since is its load time.
		e.cache.Preload(k.Entry, m, now)
		e.keptEntries[fp] = true
	}
	switch {
	case kept.Journal != nil && e.blocked == "":
		e.log.Warn("finishing an apply a stop left half done", slog.Uint64("revision", kept.Journal.Revision), slog.Int("ops", len(kept.Journal.Ops)))
		e.replay(ctx, kept.Journal)
	case kept.Journal != nil:
		// Finished by the first pass after the block lifts (a keyset
		// repairing an unreadable keyset section), before anything else.
		e.log.Warn("an apply a stop left half done waits until nothing blocks", slog.Uint64("revision", kept.Journal.Revision), slog.String("blocked", e.blocked))
		e.heldJournal = kept.Journal
	default:
		cfg.Applier.ClearStage()
		if e.blocked == "" {
			// A stop after an apply left a module part-way, before it
			// was rolled back (replay rolls back after itself).
			e.rollBack(ctx)
		}
	}
	// Until the first pass has judged anything, the haves say what the
	// kept state holds applied: a Hello the Sync client sends before that
	// pass ends (it may wait on fetches) does not tell the composer the
	// node holds nothing, and the admin API answers the same.
	e.mu.Lock()
	e.publishLocked(nil, nil, now)
	e.mu.Unlock()
	return e, nil
}

// unreachableCatalog answers every ask with an error, for an engine started
// without a catalog connection.
type unreachableCatalog struct{}

func (unreachableCatalog) GetEntry(context.Context, *catalogv1.GetEntryRequest, ...grpc.CallOption) (*catalogv1.GetEntryResponse, error) {
	return nil, status.Error(codes.Unavailable, "the engine has no catalog connection")
}

func (e *Engine) loadKept(k *state.Kept) {
	e.keptWants = k.Wants
	e.hw, e.hwErr = k.HighWater, k.HighWaterErr
	e.ledger, e.ledgerErr = k.Ledger, k.LedgerErr
	e.rollback = k.Rollback
	e.applied, e.appliedErr = k.Applied, k.AppliedErr
	e.keysetErr = k.KeysetErr
	e.reportSeq, e.reportSeqCeiling = k.ReportSeq, k.ReportSeq
	if k.JournalErr != nil && e.ledgerErr == nil {
		// A journal that cannot be read may hide a half-done apply: the
		// ledger cannot be trusted until someone looks.
		e.ledgerErr = fmt.Errorf("apply journal: %w", k.JournalErr)
	}
	for _, sec := range state.Sections() {
		err := k.Err(sec)
		if err == nil {
			continue
		}
		switch state.PolicyOf(sec) {
		case state.AskAfresh:
			e.log.Warn("kept state unreadable: asked afresh", slog.String("section", string(sec)), slog.Any("error", err))
		case state.Reseed:
			e.log.Warn("kept report_seq unreadable: it starts again from the clock", slog.Any("error", err))
		case state.ApplyNothing:
			e.log.Error("kept state unreadable: applying nothing", slog.String("section", string(sec)), slog.Any("error", err))
			if e.blocked == "" {
				e.blocked = fmt.Sprintf("kept %s unreadable, nothing is applied until it is repaired: %v", sec.Words(), err)
			}
		}
	}
	for m, env := range e.applied.Compositions {
		c := &typev1.Composition{}
		if err := envelope.Open(env, typev1.PayloadType_PAYLOAD_TYPE_COMPOSITION, c); err != nil {
			// Counted as the applied section's (a keyset that lifts
			// another block does not lift this one).
			if e.appliedErr == nil {
				e.appliedErr = fmt.Errorf("applied composition of %s unreadable: %w", m, err)
			}
			if e.blocked == "" {
				e.blocked = fmt.Sprintf("applied composition of %s unreadable: %v", m, err)
			}
			continue
		}
		e.appliedComps[m] = c
	}
	if k.Keyset != nil {
		ring, err := verify.Keyset(e.cfg.Roots, k.Keyset)
		if err != nil {
			// The roots changed under a kept keyset, or its bytes did:
			// wait for one they sign, no older than the newest taken
			// (takeKeysets).
			e.keysetNotRoots = err.Error()
			e.log.Warn("kept keyset does not verify against the pinned roots", slog.Any("error", err))
		} else {
			e.keyring = ring
		}
	}
	if e.hwErr == nil {
		e.raiseMarks(k)
	}
}

// raiseMarks raises the high-water marks to the manifests the kept state
// shows were accepted (each was marked before anything of it was applied):
// the applied manifest and that of an unfinished apply. Marks below them
// were lost — a marks record that is not there reads as none kept — and a
// replayed manifest between the two would pass. Raised in memory: the next
// manifest taken keeps them.
func (e *Engine) raiseMarks(k *state.Kept) {
	raise := func(env *typev1.Envelope, what string) {
		m := &typev1.Manifest{}
		if env == nil || envelope.Open(env, typev1.PayloadType_PAYLOAD_TYPE_MANIFEST, m) != nil {
			return
		}
		if m.GetRevision() > e.hw.Revision {
			e.log.Warn("kept high-water mark below "+what+": raised to it",
				slog.Uint64("kept", e.hw.Revision), slog.Uint64("revision", m.GetRevision()))
			e.hw.Revision, e.hw.Digest = m.GetRevision(), envelope.Digest(env)
		}
		e.hw.KeysetVersion = max(e.hw.KeysetVersion, m.GetKeysetVersion())
	}
	raise(e.applied.Manifest, "the applied manifest")
	raise(journalManifest(k.Journal), "the manifest of an unfinished apply")
}

// Close stops the entries cache and closes the applier.
func (e *Engine) Close() {
	e.cache.Close()
	e.cfg.Applier.Close()
}

// Node returns the engine's node.
func (e *Engine) Node() string { return e.cfg.Node }

// Poke asks for a pass.
func (e *Engine) Poke() {
	e.pokes.Add(1)
	e.wake()
}

// entryAnswered is told of each answer of the entries cache, once its row
// shows it: it asks for a pass, and wakes a pass waiting for answers.
func (e *Engine) entryAnswered() {
	e.answers.Add(1)
	select {
	case e.answered <- struct{}{}:
	default:
	}
	e.wake()
}

func (e *Engine) wake() {
	select {
	case e.poke <- struct{}{}:
	default:
	}
}

// Run runs passes until ctx is done: one at once, then whenever asked and
// at least every DriftInterval; after a pass in which a fetch failed, again
// after a jittered backoff from FetchRetryBase up to DriftInterval, so a
// composer or catalog that failed once is not waited for until the next
// drift pass.
func (e *Engine) Run(ctx context.Context) error {
	t := time.NewTicker(e.cfg.DriftInterval)
	defer t.Stop()
	retry := time.NewTimer(e.cfg.DriftInterval)
	retry.Stop()
	defer retry.Stop()
	failed := 0
	e.Poke()
	for {
		woken := false
		select {
		case <-ctx.Done():
			return nil
		case <-e.poke:
			woken = true
		case <-t.C:
		case <-retry.C:
		}
		if woken && e.pokes.Load() == e.lastPokes.Load() && e.answers.Load() == e.lastAnswers.Load() {
			// Only answers the last pass already took woke it.
			continue
		}
		e.Pass(ctx)
		fetches := e.failedFetches()
		if len(fetches) == 0 {
			failed = 0
			retry.Stop()
			continue
		}
		d := entries.Backoff(failed, e.cfg.FetchRetryBase, e.cfg.DriftInterval)
		failed++
		retry.Reset(d)
		e.log.Warn("fetching for the apply failed; the pass runs again", slog.Duration("retry_in", d), slog.Any("failed", fetches))
	}
}

// failedFetches returns, by module, why the last pass could not fetch what
// a module's want names (its composition, an object or an artifact).
func (e *Engine) failedFetches() map[string]string {
	e.mu.Lock()
	defer e.mu.Unlock()
	var out map[string]string
	for m, a := range e.attempts {
		if a.GetState() == composerv1.AttemptState_ATTEMPT_STATE_FAILED && a.GetReasonCode() == composerv1.ReasonCode_REASON_CODE_FETCH_FAILED {
			if out == nil {
				out = map[string]string{}
			}
			out[m] = a.GetReason()
		}
	}
	return out
}

// OfferKeyset hands the engine a keyset received on the Sync stream.
func (e *Engine) OfferKeyset(env *typev1.Envelope) {
	e.mu.Lock()
	// Bounded as manifests are: a stream may send keysets faster than
	// passes take them, and only the highest version is ever taken.
	e.keysetOffers = append(e.keysetOffers, env)
	if len(e.keysetOffers) > MaxOffers {
		e.keysetOffers = e.keysetOffers[len(e.keysetOffers)-MaxOffers:]
	}
	e.mu.Unlock()
	e.Poke()
}

// OfferManifest hands the engine a manifest received on the Sync stream.
func (e *Engine) OfferManifest(env *typev1.Envelope) {
	e.mu.Lock()
	e.offers = append(e.offers, env)
	if len(e.offers) > MaxOffers {
		e.offers = e.offers[len(e.offers)-MaxOffers:]
	}
	e.mu.Unlock()
	e.Poke()
}

// SetHeard replaces what the engine heard of the nodes running needed
// modules.
func (e *Engine) SetHeard(h *composerv1.Heard) {
	e.mu.Lock()
	e.heard = h
	e.mu.Unlock()
	e.Poke()
}

// SetConnection records whether the Sync stream is up, and why not.
func (e *Engine) SetConnection(connected bool, err error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.connected = connected
	e.connErr = ""
	if err != nil {
		e.connErr = err.Error()
	}
}

// Synced records that a message came from the composer.
func (e *Engine) Synced() {
	e.mu.Lock()
	e.lastSync = e.cfg.Now()
	e.mu.Unlock()
}

// keepEntry keeps an answer of the cache; a failure is said once and the
// write retried by each pass.
func (e *Engine) keepEntry(r entries.Row) {
	err := e.cfg.Store.PutEntry(r.Fingerprint, state.KeptEntry{Entry: r.Entry, Since: r.Since})
	e.mu.Lock()
	defer e.mu.Unlock()
	e.noteWrite("entry "+r.Fingerprint, err)
	if err != nil {
		e.dirtyEntries[r.Fingerprint] = r
		return
	}
	delete(e.dirtyEntries, r.Fingerprint)
	e.keptEntries[r.Fingerprint] = true
}

// noteWrite says a failed write of a key once, and its recovery.
func (e *Engine) noteWrite(key string, err error) {
	switch {
	case err != nil && !e.said[key]:
		e.said[key] = true
		e.log.Warn("keeping state failed; retried each pass", slog.String("key", key), slog.Any("error", err))
	case err == nil && e.said[key]:
		delete(e.said, key)
		e.log.Info("kept state written after failures", slog.String("key", key))
	}
}

// EntryAgain drops the kept entry of fp and asks the catalog again; false
// when fp is neither kept nor in the cache. The kept entry is dropped inside
// the cache's Again, after an answer in flight is kept or discarded and
// before the new ask can keep one, so no earlier answer comes back.
func (e *Engine) EntryAgain(fp string) bool {
	e.mu.Lock()
	_, inCache := e.cache.Get(fp)
	_, dirty := e.dirtyEntries[fp]
	known := inCache || e.keptEntries[fp] || dirty
	e.mu.Unlock()
	if !known {
		return false
	}
	e.cache.Again(fp, func() {
		e.mu.Lock()
		defer e.mu.Unlock()
		delete(e.dirtyEntries, fp)
		if !e.keptEntries[fp] {
			return
		}
		if err := e.cfg.Store.DeleteEntries([]string{fp}); err != nil {
			e.log.Warn("drop kept entry failed", slog.String("fingerprint", fp), slog.Any("error", err))
		}
		delete(e.keptEntries, fp)
	})
	e.Poke()
	return true
}

// Changed returns a channel closed at the next change of the report.
func (e *Engine) Changed() <-chan struct{} {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.changed
}

// Report returns the current report with a new report_seq and the version
// of the haves it carries. It never fails: report_seq is kept before it is
// returned when the state allows (state.NextReportSeq keeps it above every
// one sent before when it does not), so an engine whose kept state is
// damaged still says why it applies nothing.
func (e *Engine) Report() (*composerv1.Report, uint64) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return &composerv1.Report{
		ReportSeq: e.nextSeqLocked(), Applied: e.appliedRefLocked(), HighWater: e.hw.Revision,
		Haves: cloneHaves(e.haves), Traceparent: e.traceparent, Tracestate: e.tracestate,
	}, e.reportVer
}

// Hello returns the opening message of a Sync stream, with a new
// report_seq, and the version of the haves it carries; like Report it never
// fails.
func (e *Engine) Hello() (*composerv1.Hello, uint64) {
	e.mu.Lock()
	defer e.mu.Unlock()
	var ksv uint64
	if e.keyring != nil {
		ksv = e.keyring.Version()
	}
	return &composerv1.Hello{
		Node: e.cfg.Node, EngineVersion: e.cfg.EngineVersion, Applied: e.appliedRefLocked(),
		HighWater: e.hw.Revision, KeysetVersion: ksv, Haves: cloneHaves(e.haves), ReportSeq: e.nextSeqLocked(),
	}, e.reportVer
}

// reportSeqReserve is how far above the report_seq it sends the engine
// keeps a ceiling in its state: the ceiling is written when a report_seq
// passes it, not at every report (a bbolt commit, two fsyncs, per Hello
// and per report), and the engine's first report_seq after a restart is
// above it, so above every one sent before. report_seq follows the clock
// in ms (state.NextReportSeq): about one write per 10 minutes of reports.
const reportSeqReserve = 10 * 60 * 1000

// nextSeqLocked takes the next report_seq, keeping a new ceiling first
// when it passes the one kept; a failed write is said once and the
// sequence goes on in memory (the clock keeps it above every one sent).
func (e *Engine) nextSeqLocked() uint64 {
	e.reportSeq = state.NextReportSeq(e.reportSeq, e.cfg.Now())
	if e.reportSeq > e.reportSeqCeiling {
		ceiling := e.reportSeq + reportSeqReserve
		err := e.cfg.Store.PutReportSeq(ceiling)
		if err == nil {
			e.reportSeqCeiling = ceiling
		}
		e.noteWrite("report_seq", err)
	}
	return e.reportSeq
}

func (e *Engine) appliedRefLocked() *composerv1.ManifestRef {
	if e.applied.Manifest == nil {
		return nil
	}
	m := &typev1.Manifest{}
	if err := envelope.Open(e.applied.Manifest, typev1.PayloadType_PAYLOAD_TYPE_MANIFEST, m); err != nil {
		return nil
	}
	return &composerv1.ManifestRef{Revision: m.GetRevision(), Digest: envelope.Digest(e.applied.Manifest)}
}

func cloneHaves(hs []*composerv1.Have) []*composerv1.Have {
	out := make([]*composerv1.Have, len(hs))
	for i, h := range hs {
		out[i] = proto.Clone(h).(*composerv1.Have)
	}
	return out
}

// lookupEntry reads the cache for the picture and the holds.
func (e *Engine) lookupEntry(fp string) (picture.Entry, bool) {
	r, ok := e.cache.Get(fp)
	if !ok {
		return picture.Entry{}, false
	}
	return picture.Entry{State: r.State, Entry: r.Entry, Manifest: r.Manifest, Error: r.Error}, true
}

// sortedWants returns the kept wants in module order.
func sortedWants(kept map[string]state.KeptWant) []*typev1.Want {
	out := make([]*typev1.Want, 0, len(kept))
	for _, k := range kept {
		out = append(out, k.Want)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].GetModule() < out[j].GetModule() })
	return out
}

// ReportVersion returns the version of the haves, bumped at each change.
func (e *Engine) ReportVersion() uint64 {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.reportVer
}
