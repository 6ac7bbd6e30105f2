// Package objects sweeps the object store `objects` (DESIGN.md §5.2 step 8):
// content no held composition names is deleted once it has stayed unnamed
// for the grace period (24 h), by the lease holder. Marks live in memory: a
// restart starts the grace again, which only ever keeps objects longer.
package objects

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"mesh.dev/internal/envelope"
	"mesh.dev/internal/natsx"
	typev1 "mesh.dev/proto/mesh/type/v1"
	"mesh.dev/services/composer/internal/store"
)

// DefaultGrace is how long an object must stay unnamed before it goes.
const DefaultGrace = 24 * time.Hour

// touchWindow is how long an object a pass made sure of stays safe from
// the sweep: longer than any pass takes between that check and writing the
// composition naming it.
const touchWindow = 10 * time.Minute

// Sweeper marks and sweeps.
type Sweeper struct {
	store *store.Store
	grace time.Duration
	log   *slog.Logger
	now   func() time.Time
	// marks holds when each unnamed object was first seen unnamed.
	marks map[string]time.Time

	// sweeping serialises sweeps (a tenure's sweep may overlap the next's).
	sweeping sync.Mutex
	mu       sync.Mutex
	// touched holds when a pass of this process last made sure an object
	// was held: the composition naming it may not be written yet when the
	// sweep reads compositions.
	touched map[string]time.Time
}

// Touch records that a pass is about to name an object (pass.Config's
// ObjectTouched).
func (s *Sweeper) Touch(digest string) {
	now := s.now()
	s.mu.Lock()
	defer s.mu.Unlock()
	s.touched[digest] = now
	if len(s.touched) > 4096 {
		for d, at := range s.touched {
			if now.Sub(at) > touchWindow {
				delete(s.touched, d)
			}
		}
	}
}

func (s *Sweeper) touchedSince(digest string, at time.Time) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	t, ok := s.touched[digest]
	return ok && !t.Before(at)
}

// New returns a Sweeper.
func New(st *store.Store, grace time.Duration, log *slog.Logger, now func() time.Time) *Sweeper {
	if grace <= 0 {
		grace = DefaultGrace
	}
	if log == nil {
		log = slog.Default()
	}
	if now == nil {
		now = time.Now
	}
	return &Sweeper{store: st, grace: grace, log: log, now: now, marks: map[string]time.Time{}, touched: map[string]time.Time{}}
}

// Named returns every object digest a held composition names. A value that
// cannot be read fails the sweep: deleting on a partial view could remove
// content a composition still names.
func (s *Sweeper) Named(ctx context.Context) (map[string]bool, error) {
	keys, err := s.store.Compositions.ListKeys(ctx)
	if err != nil {
		return nil, err
	}
	named := map[string]bool{}
	for _, k := range keys {
		env, rev, _, err := s.store.Composition(ctx, k)
		switch {
		case errors.Is(err, natsx.ErrNotFound):
			continue
		case err != nil && rev != 0:
			// A value that does not decode names nothing an engine could
			// use; the next pass replaces it.
			continue
		case err != nil:
			return nil, fmt.Errorf("read %s: %w", k, err)
		}
		c := &typev1.Composition{}
		if envelope.Open(env, typev1.PayloadType_PAYLOAD_TYPE_COMPOSITION, c) != nil {
			continue
		}
		for _, r := range c.GetResources() {
			if o := r.GetObject(); o != nil {
				named[o.GetDigest()] = true
			}
		}
	}
	return named, nil
}

// Sweep marks unnamed objects and deletes those unnamed for the grace
// period, except one a pass of this process made sure of since shortly
// before the sweep began. It returns how many it deleted.
func (s *Sweeper) Sweep(ctx context.Context) (int, error) {
	s.sweeping.Lock()
	defer s.sweeping.Unlock()
	start := s.now()
	// Objects are listed before compositions are read, so an object put by
	// a pass during the sweep is either named by what is read or not listed.
	infos, err := s.store.Objects.List(ctx)
	if errors.Is(err, jetstream.ErrNoObjectsFound) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("list objects: %w", err)
	}
	named, err := s.Named(ctx)
	if err != nil {
		return 0, err
	}
	now := s.now()
	deleted := 0
	present := map[string]bool{}
	for _, info := range infos {
		d := info.Name
		present[d] = true
		if named[d] {
			delete(s.marks, d)
			continue
		}
		first, ok := s.marks[d]
		if !ok {
			s.marks[d] = now
			continue
		}
		if now.Sub(first) < s.grace {
			continue
		}
		if s.touchedSince(d, start.Add(-touchWindow)) {
			// A pass is naming it again; the next sweep sees that.
			delete(s.marks, d)
			continue
		}
		if err := s.store.Objects.Delete(ctx, d); err != nil && !errors.Is(err, jetstream.ErrObjectNotFound) {
			s.log.Warn("sweep an object", "digest", d, "error", err)
			continue
		}
		delete(s.marks, d)
		deleted++
	}
	for d := range s.marks {
		if !present[d] {
			delete(s.marks, d)
		}
	}
	return deleted, nil
}

// Run sweeps every interval until ctx is done (the lease tenure).
func (s *Sweeper) Run(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			n, err := s.Sweep(ctx)
			if err != nil {
				s.log.Warn("object sweep", "error", err)
			} else if n > 0 {
				s.log.Info("object sweep", "deleted", n)
			}
		}
	}
}
