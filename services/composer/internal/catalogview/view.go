// Package catalogview is the composer's view of the catalog: registrations
// kept current by one WatchModules stream (resumed from the last revision
// after any break, and made exactly what the catalog holds again when its
// store went back to an older state), entries cached by fingerprint (they
// are immutable) and builds cached once DONE (then immutable too).
package catalogview

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"mesh.dev/internal/canonical"
	"mesh.dev/internal/flight"
	"mesh.dev/internal/names"
	catalogv1 "mesh.dev/proto/mesh/catalog/v1"
	typev1 "mesh.dev/proto/mesh/type/v1"
	"mesh.dev/services/composer/internal/pass"
)

// Client is the part of the catalog the composer calls.
type Client interface {
	GetEntry(ctx context.Context, in *catalogv1.GetEntryRequest, opts ...grpc.CallOption) (*catalogv1.GetEntryResponse, error)
	GetBuild(ctx context.Context, in *catalogv1.GetBuildRequest, opts ...grpc.CallOption) (*catalogv1.GetBuildResponse, error)
	WatchModules(ctx context.Context, in *catalogv1.WatchModulesRequest, opts ...grpc.CallOption) (grpc.ServerStreamingClient[catalogv1.WatchModulesResponse], error)
}

// View is the cached catalog.
type View struct {
	client Client
	log    *slog.Logger
	// onChange is called for every registration that changed, after the
	// view holds it.
	onChange func(reg *catalogv1.Registration)

	mu       sync.RWMutex
	regs     map[string]*catalogv1.Registration
	revision uint64
	caughtUp bool
	// healthy is set while the watch stream is up and caught up.
	healthy   bool
	lastEvent time.Time
	// endStream ends the watch stream running now; resync is set when
	// Resync ended it (the watch is resumed at once).
	endStream context.CancelFunc
	resync    bool

	cacheMu sync.Mutex
	entries map[string]*pass.Release
	builds  map[string]*catalogv1.Build
	// askingEntries and askingBuilds hold the catalog calls in flight.
	askingEntries flight.Group[string, *pass.Release]
	askingBuilds  flight.Group[string, *catalogv1.Build]
}

var _ pass.Catalog = (*View)(nil)

// New returns a view; Run keeps it current.
func New(client Client, log *slog.Logger, onChange func(*catalogv1.Registration)) *View {
	if log == nil {
		log = slog.Default()
	}
	return &View{client: client, log: log, onChange: onChange, regs: map[string]*catalogv1.Registration{},
		entries: map[string]*pass.Release{}, builds: map[string]*catalogv1.Build{}}
}

// Run watches registrations until ctx is done, resuming from the last
// revision seen after any break, with jittered backoff.
func (v *View) Run(ctx context.Context) error {
	backoff := time.Second
	for ctx.Err() == nil {
		err := v.watch(ctx)
		v.mu.Lock()
		v.healthy = false
		resync := v.resync
		v.resync = false
		v.mu.Unlock()
		if ctx.Err() != nil {
			return nil
		}
		if resync {
			continue
		}
		v.log.Warn("catalog watch broke; resuming", "error", err, "from_revision", v.Revision(), "in", backoff)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(backoff/2 + rand.N(backoff/2+1)):
		}
		backoff = min(backoff*2, 30*time.Second)
	}
	return nil
}

// Resync makes the view read every registration the catalog holds again
// before a pass uses it (CaughtUp is false meanwhile): the composer's own
// buckets went back to an older state, and the catalog's, in the same
// JetStream, most likely did too. The watch is resumed at once from the
// view's revision, which the catalog then counts as 0 if its store no
// longer reaches it.
func (v *View) Resync() {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.caughtUp = false
	if v.endStream != nil {
		v.resync = true
		v.endStream()
	}
}

func (v *View) watch(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	v.mu.Lock()
	v.endStream = cancel
	v.mu.Unlock()
	from := v.Revision()
	stream, err := v.client.WatchModules(ctx, &catalogv1.WatchModulesRequest{FromRevision: from})
	if err != nil {
		return err
	}
	// sent are the modules the stream sent before its first caught_up
	// marker: when that marker says everything was sent again, a module
	// not among them is registered no more.
	sent := map[string]bool{}
	first := true
	for {
		msg, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return errors.New("catalog closed the watch")
		}
		if err != nil {
			return err
		}
		v.mu.Lock()
		v.lastEvent = time.Now()
		if msg.GetCaughtUp() {
			var gone []*catalogv1.Registration
			// A caught_up marker after the first one in a stream, or a
			// first one below from_revision, follows everything sent again
			// because the catalog's store went back: entries and builds it
			// held may be lost too.
			if !first || (from > 0 && msg.GetRevision() < from) {
				v.dropCaches()
			}
			if first && from > 0 && msg.GetRevision() < from {
				// The catalog's store holds less than this view saw (it
				// went back to an older state): it sent every current
				// registration, and the view becomes exactly that.
				for m := range v.regs {
					if !sent[m] {
						delete(v.regs, m)
						gone = append(gone, &catalogv1.Registration{Module: m})
					}
				}
				v.log.Warn("the catalog's registrations went back to an older state; the view follows",
					"from_revision", from, "caught_up_revision", msg.GetRevision(), "modules_gone", len(gone))
			}
			// The marker names where to resume from: after the store went
			// back it is lower than what was seen before.
			v.revision = msg.GetRevision()
			v.caughtUp, v.healthy = true, true
			first, sent = false, nil
			v.mu.Unlock()
			for _, reg := range gone {
				if v.onChange != nil {
					v.onChange(reg)
				}
			}
			continue
		}
		reg := msg.GetRegistration()
		old := v.regs[reg.GetModule()]
		// Whatever the catalog sends replaces what the view holds, even an
		// older registration (its store went back).
		v.regs[reg.GetModule()] = reg
		if msg.GetRevision() > 0 {
			// The revision of the last change, not the largest seen: after
			// the catalog's store went back it starts lower again.
			v.revision = msg.GetRevision()
		}
		if sent != nil {
			sent[reg.GetModule()] = true
		}
		v.mu.Unlock()
		if old == nil || old.GetFingerprint() != reg.GetFingerprint() || old.GetSeq() != reg.GetSeq() {
			// Registrations change rarely; each one heard is said, so a
			// node not composed at a new fingerprint shows whether this
			// replica ever heard of it.
			v.log.Info("catalog registration heard", "module", reg.GetModule(), "fingerprint", reg.GetFingerprint(),
				"seq", reg.GetSeq(), "previous", old.GetFingerprint(), "revision", msg.GetRevision())
			if v.onChange != nil {
				v.onChange(reg)
			}
		}
	}
}

// dropCaches forgets the entries and builds cached.
func (v *View) dropCaches() {
	v.cacheMu.Lock()
	defer v.cacheMu.Unlock()
	v.entries = map[string]*pass.Release{}
	v.builds = map[string]*catalogv1.Build{}
}

// Revision is the last store revision the view has seen.
func (v *View) Revision() uint64 {
	v.mu.RLock()
	defer v.mu.RUnlock()
	return v.revision
}

// Healthy reports whether the watch is up and has caught up.
func (v *View) Healthy() bool {
	v.mu.RLock()
	defer v.mu.RUnlock()
	return v.healthy
}

// CaughtUp reports whether the view has held every registration once.
func (v *View) CaughtUp() bool {
	v.mu.RLock()
	defer v.mu.RUnlock()
	return v.caughtUp
}

// Registration returns a module's registration.
func (v *View) Registration(module string) (*catalogv1.Registration, bool) {
	v.mu.RLock()
	defer v.mu.RUnlock()
	r, ok := v.regs[module]
	return r, ok
}

// Registrations returns every registration held.
func (v *View) Registrations() []*catalogv1.Registration {
	v.mu.RLock()
	defer v.mu.RUnlock()
	out := make([]*catalogv1.Registration, 0, len(v.regs))
	for _, r := range v.regs {
		out = append(out, r)
	}
	return out
}

const callTimeout = 30 * time.Second

// Entry returns a fingerprint's entry and decoded manifest, checking that
// the fingerprint recomputes from the entry. Passes asking at once for one
// fingerprint not cached yet (every worker, at a fleet-wide change) share
// one catalog call.
func (v *View) Entry(ctx context.Context, fp string) (*pass.Release, error) {
	rel, err := v.askingEntries.Cached(ctx, fp, v.cachedEntry, func() (*pass.Release, error) { return v.fetchEntry(ctx, fp) })
	if err != nil && err == ctx.Err() {
		// It ended while waiting on another pass's call.
		return nil, fmt.Errorf("catalog GetEntry %s: %w", fp, err)
	}
	return rel, err
}

func (v *View) cachedEntry(fp string) (*pass.Release, bool) {
	v.cacheMu.Lock()
	defer v.cacheMu.Unlock()
	rel, ok := v.entries[fp]
	return rel, ok
}

func (v *View) fetchEntry(ctx context.Context, fp string) (*pass.Release, error) {
	cctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	resp, err := v.client.GetEntry(cctx, &catalogv1.GetEntryRequest{Fingerprint: fp})
	if status.Code(err) == codes.NotFound {
		return nil, fmt.Errorf("%w of fingerprint %s", pass.ErrNoEntry, fp)
	}
	if err != nil {
		return nil, fmt.Errorf("catalog GetEntry %s: %w", fp, err)
	}
	e := resp.GetEntry()
	if got := names.ComputeFingerprint(e.GetModule(), e.GetRepository(), e.GetPath(), e.GetSourceDigest(), names.Digest(e.GetManifest())); got != fp {
		return nil, fmt.Errorf("catalog entry of %s recomputes to %s", fp, got)
	}
	m := &typev1.ModuleManifest{}
	if err := canonical.Decode(e.GetManifest(), m); err != nil {
		return nil, fmt.Errorf("catalog entry %s: %w", fp, err)
	}
	rel := &pass.Release{Entry: e, Manifest: m}
	v.cacheMu.Lock()
	v.entries[fp] = rel
	v.cacheMu.Unlock()
	return rel, nil
}

// Build returns a fingerprint's build; DONE builds are cached. Passes
// asking at once share one catalog call, as for Entry.
func (v *View) Build(ctx context.Context, fp string) (*catalogv1.Build, error) {
	b, err := v.askingBuilds.Cached(ctx, fp, v.cachedBuild, func() (*catalogv1.Build, error) { return v.fetchBuild(ctx, fp) })
	if err != nil && err == ctx.Err() {
		return nil, fmt.Errorf("catalog GetBuild %s: %w", fp, err)
	}
	return b, err
}

func (v *View) cachedBuild(fp string) (*catalogv1.Build, bool) {
	v.cacheMu.Lock()
	defer v.cacheMu.Unlock()
	b, ok := v.builds[fp]
	return b, ok
}

func (v *View) fetchBuild(ctx context.Context, fp string) (*catalogv1.Build, error) {
	cctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	resp, err := v.client.GetBuild(cctx, &catalogv1.GetBuildRequest{Fingerprint: fp})
	if status.Code(err) == codes.NotFound {
		return nil, fmt.Errorf("%w of fingerprint %s", pass.ErrNoBuild, fp)
	}
	if err != nil {
		return nil, fmt.Errorf("catalog GetBuild %s: %w", fp, err)
	}
	b := resp.GetBuild()
	if b.GetState() == catalogv1.BuildState_BUILD_STATE_DONE {
		v.cacheMu.Lock()
		v.builds[fp] = b
		v.cacheMu.Unlock()
	}
	return b, nil
}
