// Package entries is the node engine's entries cache over the catalog's
// GetEntry (DESIGN.md §7): Need asks once and answers ASKED, ANSWERED or
// NOT_FOUND; a failure leaves the row ASKED and is re-asked with jittered
// exponential backoff; NOT_FOUND is asked again only by Again or a restart.
// Every answer is checked (fingerprint recomputed, manifest digest, manifest
// decoded) before it is kept, and each answer asks for a pass.
package entries

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sort"
	"sync"
	"time"

	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"mesh.dev/internal/canonical"
	"mesh.dev/internal/names"
	catalogv1 "mesh.dev/proto/mesh/catalog/v1"
	nodeenginev1 "mesh.dev/proto/mesh/nodeengine/v1"
	typev1 "mesh.dev/proto/mesh/type/v1"
)

// Catalog is the one catalog call the cache makes.
type Catalog interface {
	GetEntry(ctx context.Context, in *catalogv1.GetEntryRequest, opts ...grpc.CallOption) (*catalogv1.GetEntryResponse, error)
}

// Defaults of Config.
const (
	DefaultDeadline    = 30 * time.Second
	DefaultBackoffBase = time.Second
	DefaultBackoffMax  = 5 * time.Minute
)

// The states of a row, as the admin API names them.
const (
	Asked    = nodeenginev1.EntryState_ENTRY_STATE_ASKED
	Answered = nodeenginev1.EntryState_ENTRY_STATE_ANSWERED
	NotFound = nodeenginev1.EntryState_ENTRY_STATE_NOT_FOUND
)

// Row is one fingerprint of the cache.
type Row struct {
	Fingerprint string
	State       nodeenginev1.EntryState
	// Since is when the row was answered (or loaded), or first asked.
	Since time.Time
	// Error is the last failure while asking, if any.
	Error string
	// Entry and Manifest are set when ANSWERED.
	Entry    *catalogv1.Entry
	Manifest *typev1.ModuleManifest
}

// Module returns the entry's module, "" when not answered.
func (r Row) Module() string { return r.Entry.GetModule() }

// Config is what a Cache needs.
type Config struct {
	Catalog Catalog
	// Deadline bounds each GetEntry (DefaultDeadline when zero).
	Deadline time.Duration
	// BackoffBase and BackoffMax bound the re-asking of failures.
	BackoffBase, BackoffMax time.Duration
	Now                     func() time.Time
	// Keep is called with each ANSWERED answer before the row shows it; the
	// engine keeps the entry in its state (a failure there is the engine's
	// to retry, the row is answered anyway).
	Keep func(row Row)
	// Poke asks the engine for a pass after each answer.
	Poke   func()
	Logger *slog.Logger
}

type row struct {
	Row
	gen    uint64
	cancel context.CancelFunc
}

// Cache is the entries cache. It is safe for concurrent use.
type Cache struct {
	cfg    Config
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	// keepMu is held by an answer from the check that its row is still
	// current until the row shows it, across Keep. Release and Again first
	// make the row not current, then wait for keepMu: once they return, no
	// answer of the earlier ask is being kept or will be (it would bring
	// back an entry the engine has just dropped). Order: keepMu, then mu.
	keepMu sync.Mutex
	mu     sync.Mutex
	rows   map[string]*row
	gen    uint64
}

// New returns a cache whose asks run until Close.
func New(cfg Config) *Cache {
	if cfg.Deadline <= 0 {
		cfg.Deadline = DefaultDeadline
	}
	if cfg.BackoffBase <= 0 {
		cfg.BackoffBase = DefaultBackoffBase
	}
	if cfg.BackoffMax <= 0 {
		cfg.BackoffMax = DefaultBackoffMax
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Keep == nil {
		cfg.Keep = func(Row) {}
	}
	if cfg.Poke == nil {
		cfg.Poke = func() {}
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &Cache{cfg: cfg, ctx: ctx, cancel: cancel, rows: map[string]*row{}}
}

// Close stops every ask and waits for them.
func (c *Cache) Close() {
	c.cancel()
	c.wg.Wait()
}

// Preload puts a kept entry in the cache as ANSWERED, as read at start. The
// caller has checked it (see Check).
func (c *Cache) Preload(e *catalogv1.Entry, m *typev1.ModuleManifest, since time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.gen++
	c.rows[e.GetFingerprint()] = &row{Row: Row{Fingerprint: e.GetFingerprint(), State: Answered, Since: since, Entry: e, Manifest: m}, gen: c.gen}
}

// Need returns the state of fp, asking the catalog the first time.
func (c *Cache) Need(fp string) nodeenginev1.EntryState {
	return c.NeedFrom(context.Background(), fp)
}

// NeedFrom is Need whose ask, when it starts one, continues the trace of
// ctx (the pass of the manifest that first wants fp), so the catalog's
// answer joins the trace from a registration to the apply it enables. Only
// the span context is taken: the ask outlives ctx.
func (c *Cache) NeedFrom(ctx context.Context, fp string) nodeenginev1.EntryState {
	c.mu.Lock()
	defer c.mu.Unlock()
	if r, ok := c.rows[fp]; ok {
		return r.State
	}
	c.askLocked(trace.SpanContextFromContext(ctx), fp)
	return Asked
}

// askLocked (re)starts asking for fp, as a child of parent when it is
// valid; c.mu is held.
func (c *Cache) askLocked(parent trace.SpanContext, fp string) {
	if old, ok := c.rows[fp]; ok && old.cancel != nil {
		old.cancel()
	}
	c.gen++
	r := &row{Row: Row{Fingerprint: fp, State: Asked, Since: c.cfg.Now()}, gen: c.gen}
	c.rows[fp] = r
	c.startLocked(parent, r)
}

// startLocked starts the ask of a row; c.mu is held.
func (c *Cache) startLocked(parent trace.SpanContext, r *row) {
	ctx, cancel := context.WithCancel(c.ctx)
	if parent.IsValid() {
		ctx = trace.ContextWithSpanContext(ctx, parent)
	}
	r.cancel = cancel
	c.wg.Add(1)
	go c.ask(ctx, r.Fingerprint, r.gen)
}

// Get returns the row of fp.
func (c *Cache) Get(fp string) (Row, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	r, ok := c.rows[fp]
	if !ok {
		return Row{}, false
	}
	return r.Row, true
}

// Rows returns every row, by fingerprint.
func (c *Cache) Rows() []Row {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]Row, 0, len(c.rows))
	for _, r := range c.rows {
		out = append(out, r.Row)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Fingerprint < out[j].Fingerprint })
	return out
}

// Release forgets fp and stops asking for it. When it returns, no answer
// of fp is being kept or will be, so the caller may drop the kept entry.
func (c *Cache) Release(fp string) {
	c.mu.Lock()
	r, ok := c.rows[fp]
	if ok {
		if r.cancel != nil {
			r.cancel()
		}
		delete(c.rows, fp)
	}
	c.mu.Unlock()
	if ok {
		// Wait out an answer being kept.
		c.keepMu.Lock()
		c.keepMu.Unlock()
	}
}

// Again drops what the cache holds of fp, in any state, and asks afresh.
// drop, when set, runs once no answer of an earlier ask can be kept any
// more and before the new ask can keep one: the engine drops its kept entry
// there. drop must not call the cache.
func (c *Cache) Again(fp string, drop func()) {
	c.mu.Lock()
	if old, ok := c.rows[fp]; ok && old.cancel != nil {
		old.cancel()
	}
	// A new row of its own generation: an earlier ask's answer is no
	// longer current. Its ask starts once drop ran.
	c.gen++
	gen := c.gen
	c.rows[fp] = &row{Row: Row{Fingerprint: fp, State: Asked, Since: c.cfg.Now()}, gen: gen}
	c.mu.Unlock()

	c.keepMu.Lock()
	defer c.keepMu.Unlock()
	if drop != nil {
		drop()
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if r, ok := c.rows[fp]; ok && r.gen == gen {
		c.startLocked(trace.SpanContext{}, r)
	}
}

// NotFoundMessage is the catalog's exact words for an unknown fingerprint.
func NotFoundMessage(fp string) string { return "no entry of fingerprint " + fp }

func (c *Cache) ask(ctx context.Context, fp string, gen uint64) {
	defer c.wg.Done()
	log := c.cfg.Logger.With(slog.String("fingerprint", fp))
	for attempt := 0; ; attempt++ {
		actx, cancel := context.WithTimeout(ctx, c.cfg.Deadline)
		resp, err := c.cfg.Catalog.GetEntry(actx, &catalogv1.GetEntryRequest{Fingerprint: fp})
		cancel()
		if ctx.Err() != nil {
			return
		}
		var answer Row
		switch {
		case err == nil:
			m, cerr := Check(fp, resp.GetEntry())
			if cerr != nil {
				err = cerr
				break
			}
			answer = Row{Fingerprint: fp, State: Answered, Since: c.cfg.Now(), Entry: resp.GetEntry(), Manifest: m}
		case status.Code(err) == codes.NotFound && status.Convert(err).Message() == NotFoundMessage(fp):
			answer = Row{Fingerprint: fp, State: NotFound, Since: c.cfg.Now()}
		}
		if answer.State != nodeenginev1.EntryState_ENTRY_STATE_UNSPECIFIED {
			if c.answer(fp, gen, answer) {
				log.Debug("entry answered", slog.String("state", answer.State.String()))
				c.cfg.Poke()
			}
			return
		}
		c.mu.Lock()
		if r, ok := c.rows[fp]; ok && r.gen == gen {
			r.Error = err.Error()
		}
		c.mu.Unlock()
		delay := Backoff(attempt, c.cfg.BackoffBase, c.cfg.BackoffMax)
		log.Warn("asking the catalog for an entry failed", slog.Int("attempt", attempt+1), slog.Duration("retry_in", delay), slog.Any("error", err))
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}

// answer takes the answer of the ask of generation gen when its row is
// still that ask's: an ANSWERED one is kept first (before the row shows it
// and before the pass it asks for). It reports whether it was taken.
func (c *Cache) answer(fp string, gen uint64, answer Row) bool {
	c.keepMu.Lock()
	defer c.keepMu.Unlock()
	if !c.current(fp, gen) {
		return false
	}
	if answer.State == Answered {
		c.cfg.Keep(answer)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	r, ok := c.rows[fp]
	if !ok || r.gen != gen {
		// Released or asked again while it was kept: the caller of
		// Release or Again is waiting for keepMu and drops it after.
		return false
	}
	r.Row = answer
	r.cancel = nil
	return true
}

// current reports whether fp's row is still the one of generation gen.
func (c *Cache) current(fp string, gen uint64) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	r, ok := c.rows[fp]
	return ok && r.gen == gen
}

// Backoff returns the jittered exponential delay before retry attempt+1:
// uniformly between half and all of min(max, base·2^attempt), so a fleet of
// engines that failed together does not ask again together.
func Backoff(attempt int, base, max time.Duration) time.Duration {
	d := base
	for i := 0; i < attempt && d < max; i++ {
		d *= 2
	}
	if d > max {
		d = max
	}
	half := d / 2
	return half + rand.N(d-half+1)
}

// Check verifies an entry answered for fp: its fingerprint is fp and is
// recomputed from module, repository, path, source digest and the digest of
// the manifest bytes; manifest_digest is that digest; the manifest decodes
// (unknown fields refused) and names the entry's module. It returns the
// decoded manifest.
func Check(fp string, e *catalogv1.Entry) (*typev1.ModuleManifest, error) {
	if e == nil {
		return nil, fmt.Errorf("entry %s: the catalog answered no entry", fp)
	}
	if e.GetFingerprint() != fp {
		return nil, fmt.Errorf("entry %s: the catalog answered the entry of %s", fp, e.GetFingerprint())
	}
	md := names.Digest(e.GetManifest())
	if e.GetManifestDigest() != md {
		return nil, fmt.Errorf("entry %s: manifest_digest %s is not the digest of its manifest (%s)", fp, e.GetManifestDigest(), md)
	}
	if got := names.ComputeFingerprint(e.GetModule(), e.GetRepository(), e.GetPath(), e.GetSourceDigest(), md); got != fp {
		return nil, fmt.Errorf("entry %s: its fields compute fingerprint %s", fp, got)
	}
	m := &typev1.ModuleManifest{}
	if err := canonical.Decode(e.GetManifest(), m); err != nil {
		return nil, fmt.Errorf("entry %s: manifest: %w", fp, err)
	}
	if m.GetModule() != e.GetModule() {
		return nil, fmt.Errorf("entry %s: the manifest is of module %q, the entry of %q", fp, m.GetModule(), e.GetModule())
	}
	return m, nil
}
