// Package lease keeps the composer lease (DESIGN.md §5.2 step 9): one key,
// leader, in the composer-lease bucket whose TTL expires it unless the holder
// renews it. Only the holder writes compositions and assignments; on taking
// the lease it gets a fencing epoch from the signer, and every sign request
// carries it, so a paused old leader cannot sign after another took over.
package lease

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"mesh.dev/internal/natsx"
)

// Fencer hands out fencing epochs (the signer's Fence).
type Fencer interface {
	Fence(ctx context.Context, holder string) (uint64, error)
}

// ErrNotHolder is returned by Check when this composer may not write.
var ErrNotHolder = errors.New("not the lease holder")

// record is the lease value.
type record struct {
	Holder   string    `json:"holder"`
	Epoch    uint64    `json:"epoch"`
	Renewed  time.Time `json:"renewed"`
	TTLMilli int64     `json:"ttl_ms"`
}

// Lease takes and renews the lease.
type Lease struct {
	kv     *natsx.KV
	holder string
	ttl    time.Duration
	fencer Fencer
	log    *slog.Logger
	now    func() time.Time

	mu      sync.Mutex
	held    bool
	rev     uint64
	epoch   uint64
	expires time.Time
	// renewed is the time this composer wrote in the lease key last.
	renewed time.Time
	// holderName is the holder last seen (for operator messages).
	holderName string
}

// New returns a Lease for a holder id (unique per composer process).
func New(kv *natsx.KV, holder string, ttl time.Duration, fencer Fencer, log *slog.Logger) *Lease {
	if log == nil {
		log = slog.Default()
	}
	return &Lease{kv: kv, holder: holder, ttl: ttl, fencer: fencer, log: log, now: time.Now}
}

// RenewInterval is how often the holder renews: a third of the TTL.
func (l *Lease) RenewInterval() time.Duration { return l.ttl / 3 }

// Check returns the fencing epoch of the current tenure when this composer
// holds the lease with at least margin left before it expires, and
// ErrNotHolder otherwise. The epoch names the tenure: a pass keeps the one
// it started under and signs with it, so when the lease was lost and taken
// again meanwhile its requests carry the old epoch and the signer refuses
// them.
func (l *Lease) Check(margin time.Duration) (uint64, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.held {
		return 0, fmt.Errorf("%w (held by %q)", ErrNotHolder, l.holderName)
	}
	if left := l.expires.Sub(l.now()); left < margin {
		return 0, fmt.Errorf("%w: %s of the lease left, need %s", ErrNotHolder, left.Round(time.Millisecond), margin)
	}
	return l.epoch, nil
}

// Held reports whether this composer holds the lease.
func (l *Lease) Held() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.held
}

// Holder returns the holder last seen.
func (l *Lease) Holder() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.holderName
}

// Epoch returns the fencing epoch of the current tenure.
func (l *Lease) Epoch() uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.epoch
}

// Run contends for the lease until ctx is done. onAcquire runs (in its own
// goroutine) with a context cancelled when the lease is lost or ctx ends.
// The holder renews every RenewInterval; a composer without the lease tries
// again as soon as the holder's key expires (its server timestamp plus the
// TTL), so a killed holder is replaced within the TTL of its last renewal.
// When ctx ends the lease is still held until it expires or Release gives
// it back (a graceful stop releases; a process that dies does not).
func (l *Lease) Run(ctx context.Context, onAcquire func(ctx context.Context)) error {
	interval := l.RenewInterval()
	var tenure context.CancelFunc
	endTenure := func() {
		if tenure != nil {
			tenure()
			tenure = nil
		}
	}
	lose := func(why string, err error) {
		l.mu.Lock()
		was := l.held
		l.held, l.rev = false, 0
		l.mu.Unlock()
		endTenure()
		if was {
			l.log.Warn("composer lease lost", "holder", l.holder, "why", why, "error", err)
		}
	}
	defer endTenure()
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		wait := interval
		if l.Held() {
			if err := l.renew(ctx); err != nil {
				lose("renewal failed", err)
				wait = 0
			}
		} else if ok, expires, err := l.acquire(ctx); err != nil {
			l.log.Warn("composer lease: acquire", "error", err)
		} else if ok {
			tctx, cancel := context.WithCancel(ctx)
			tenure = cancel
			l.log.Info("composer lease taken", "holder", l.holder, "epoch", l.Epoch())
			go onAcquire(tctx)
		} else if !expires.IsZero() {
			// Try again right after the holder's key expires.
			wait = min(interval, max(time.Until(expires), 0)+expiryMargin)
		}
		t.Reset(wait)
	}
}

// expiryMargin is how long after a holder's key should have expired a
// contender tries again: the server's expiry timer needs a moment.
const expiryMargin = 20 * time.Millisecond

// value is the lease record of this holder at epoch and the time it says.
func (l *Lease) value(epoch uint64) ([]byte, time.Time) {
	now := l.now().UTC()
	b, _ := json.Marshal(record{Holder: l.holder, Epoch: epoch, Renewed: now, TTLMilli: l.ttl.Milliseconds()})
	return b, now
}

// ownOlder reports whether a lease record is one this composer wrote before
// its last write: its holder, an epoch not above the last it held and an
// older renewal time. Finding it in the key means the store went back (a
// snapshot restored): nobody took the lease since, or the key would name
// them. Another process configured with the same holder name that took the
// lease meanwhile has a higher epoch.
func (l *Lease) ownOlder(r record) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return r.Holder == l.holder && l.epoch > 0 && r.Epoch <= l.epoch && r.Renewed.Before(l.renewed)
}

// acquire creates the lease key when it is absent (expired or released),
// then fences: the tenure starts only with a fresh epoch.
// When another holds it, it returns when that holder's key expires.
//
// A key holding this composer's own older record (the store went back to
// a snapshot, see ownOlder) is taken over at once, by CAS at its revision,
// rather than waited out: the new tenure fences a higher epoch, so nothing
// the tenure that was lost could still sign.
func (l *Lease) acquire(ctx context.Context) (bool, time.Time, error) {
	e, err := l.kv.Get(ctx, natsx.KeyLeaseLeader)
	over := uint64(0)
	if err == nil {
		var r record
		if json.Unmarshal(e.Value, &r) == nil {
			l.mu.Lock()
			l.holderName = r.Holder
			l.mu.Unlock()
		}
		if !l.ownOlder(r) {
			return false, e.Created.Add(l.ttl), nil
		}
		l.log.Warn("composer lease key holds an older record of this holder (the store went back); taking it over",
			"holder", l.holder, "epoch", r.Epoch, "renewed", r.Renewed, "revision", e.Revision)
		over = e.Revision
	} else if !errors.Is(err, natsx.ErrNotFound) {
		return false, time.Time{}, err
	}
	start := l.now()
	v, _ := l.value(0)
	var rev uint64
	if over != 0 {
		rev, err = l.kv.Update(ctx, natsx.KeyLeaseLeader, v, over)
	} else {
		rev, err = l.kv.Create(ctx, natsx.KeyLeaseLeader, v)
	}
	if errors.Is(err, natsx.ErrConflict) {
		return false, time.Time{}, nil
	}
	if err != nil {
		return false, time.Time{}, err
	}
	fctx, cancel := context.WithTimeout(ctx, l.ttl/3)
	epoch, err := l.fencer.Fence(fctx, l.holder)
	cancel()
	if err != nil {
		// Without an epoch nothing can be signed: give the lease back.
		_ = l.kv.Delete(ctx, natsx.KeyLeaseLeader, natsx.LastRevision(rev))
		return false, time.Time{}, fmt.Errorf("fence: %w", err)
	}
	v, renewed := l.value(epoch)
	if rev, err = l.kv.Update(ctx, natsx.KeyLeaseLeader, v, rev); err != nil {
		return false, time.Time{}, fmt.Errorf("record epoch: %w", err)
	}
	l.mu.Lock()
	l.held, l.rev, l.epoch, l.holderName, l.renewed = true, rev, epoch, l.holder, renewed
	l.expires = start.Add(l.ttl)
	l.mu.Unlock()
	return true, time.Time{}, nil
}

func (l *Lease) renew(ctx context.Context) error {
	l.mu.Lock()
	rev, epoch := l.rev, l.epoch
	l.mu.Unlock()
	start := l.now()
	v, renewed := l.value(epoch)
	next, err := l.kv.Update(ctx, natsx.KeyLeaseLeader, v, rev)
	if err != nil {
		return err
	}
	l.mu.Lock()
	l.rev, l.expires, l.renewed = next, start.Add(l.ttl), renewed
	l.mu.Unlock()
	return nil
}

// Release gives the lease up (a graceful stop), so another composer takes
// over at once instead of after the TTL.
func (l *Lease) Release(ctx context.Context) {
	l.mu.Lock()
	held, rev := l.held, l.rev
	l.held = false
	l.mu.Unlock()
	if held {
		if err := l.kv.Delete(ctx, natsx.KeyLeaseLeader, natsx.LastRevision(rev)); err != nil {
			l.log.Warn("release the composer lease", "error", err)
		}
	}
}
