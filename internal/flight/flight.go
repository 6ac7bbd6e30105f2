// Package flight makes callers that ask for one key at the same moment
// share one call: a fleet-wide change makes every composer worker and every
// signing batch ask the catalog for the same new fingerprint at once.
package flight

import (
	"context"
	"errors"
	"sync"
)

// errPanicked is what a call whose fn panicked holds (its caller sees the
// panic); its waiters ask again.
var errPanicked = errors.New("the shared call panicked")

// Group holds the calls in flight by key. The zero value is ready to use.
type Group[K comparable, V any] struct {
	mu    sync.Mutex
	calls map[K]*call[V]
}

type call[V any] struct {
	done chan struct{}
	// waiters counts the callers waiting on it (InFlight reports it).
	waiters int
	v       V
	err     error
	// own is set when err is its caller's own: its context ended, or fn
	// panicked. Waiters then ask again rather than take it.
	own bool
}

// Do returns fn's result for key. When a call for key is already in flight
// it waits for that call instead of calling fn, and takes its result, value
// or error — unless the error is that call's caller's own (its context
// ended, or fn panicked): the waiters then ask again, sharing one new call
// among them. A waiter whose ctx ends first returns ctx's error. fn runs
// under its caller's context ctx, which it should capture itself.
func (g *Group[K, V]) Do(ctx context.Context, key K, fn func() (V, error)) (V, error) {
	g.mu.Lock()
	if c, ok := g.calls[key]; ok {
		c.waiters++
		g.mu.Unlock()
		select {
		case <-c.done:
			if c.own {
				return g.Do(ctx, key, fn)
			}
			return c.v, c.err
		case <-ctx.Done():
			var zero V
			return zero, ctx.Err()
		}
	}
	if g.calls == nil {
		g.calls = map[K]*call[V]{}
	}
	c := &call[V]{done: make(chan struct{})}
	g.calls[key] = c
	g.mu.Unlock()
	finished := false
	defer func() {
		if !finished {
			c.err, c.own = errPanicked, true
		}
		g.mu.Lock()
		delete(g.calls, key)
		g.mu.Unlock()
		close(c.done)
	}()
	c.v, c.err = fn()
	c.own = c.err != nil && ctx.Err() != nil
	finished = true
	return c.v, c.err
}

// Cached returns the value cached reports for key, or else fn's result
// shared as Do shares it. cached is asked again inside the shared call, so
// that a call which filled the cache and ended between the first look and
// this one is not made again.
func (g *Group[K, V]) Cached(ctx context.Context, key K, cached func(K) (V, bool), fn func() (V, error)) (V, error) {
	if v, ok := cached(key); ok {
		return v, nil
	}
	return g.Do(ctx, key, func() (V, error) {
		if v, ok := cached(key); ok {
			return v, nil
		}
		return fn()
	})
}

// InFlight reports whether a call for key is in flight, and how many
// callers wait on it.
func (g *Group[K, V]) InFlight(key K) (bool, int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	c, ok := g.calls[key]
	if !ok {
		return false, 0
	}
	return true, c.waiters
}
