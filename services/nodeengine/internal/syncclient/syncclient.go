// Package syncclient is the engine's end of the Sync stream (DESIGN.md §6):
// one long-lived bidirectional stream to any composer replica. It opens
// with Hello, hands the keysets, manifests and heard updates it receives to
// the engine, and sends a Report whenever the engine's haves change. A
// broken stream is opened again after a backoff of 1 s doubling to 5 min
// with full jitter, or after the delay of a RetryInfo detail in an
// UNAVAILABLE status (bounded by the same 5 min).
package syncclient

import (
	"context"
	"errors"
	"log/slog"
	"math/rand/v2"
	"sync/atomic"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	composerv1 "mesh.dev/proto/mesh/composer/v1"
	typev1 "mesh.dev/proto/mesh/type/v1"
)

// Defaults of the backoff.
const (
	DefaultBackoffBase = time.Second
	DefaultBackoffMax  = 5 * time.Minute
)

// Engine is what the Sync client feeds and reads.
type Engine interface {
	Hello() (*composerv1.Hello, uint64)
	Report() (*composerv1.Report, uint64)
	ReportVersion() uint64
	Changed() <-chan struct{}
	OfferKeyset(*typev1.Envelope)
	OfferManifest(*typev1.Envelope)
	SetHeard(*composerv1.Heard)
	SetConnection(connected bool, err error)
	Synced()
}

// Client is the one composer call the Sync client makes.
type Client interface {
	Sync(ctx context.Context, opts ...grpc.CallOption) (grpc.BidiStreamingClient[composerv1.SyncRequest, composerv1.SyncResponse], error)
}

// Config is what Run needs.
type Config struct {
	Client                  Client
	Engine                  Engine
	BackoffBase, BackoffMax time.Duration
	Logger                  *slog.Logger
	// RandN returns a uniform number in [0, n) for the jitter;
	// rand.Int64N when nil.
	RandN func(n int64) int64
	// After is the clock the backoff waits on; time.After when nil.
	After func(d time.Duration) <-chan time.Time
}

// Run keeps a Sync stream open until ctx is done.
func Run(ctx context.Context, cfg Config) error {
	if cfg.BackoffBase <= 0 {
		cfg.BackoffBase = DefaultBackoffBase
	}
	if cfg.BackoffMax <= 0 {
		cfg.BackoffMax = DefaultBackoffMax
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.RandN == nil {
		cfg.RandN = rand.Int64N
	}
	if cfg.After == nil {
		cfg.After = time.After
	}
	attempt := 0
	for {
		healthy, err := session(ctx, cfg)
		if ctx.Err() != nil {
			cfg.Engine.SetConnection(false, errors.New("stopped"))
			return nil
		}
		cfg.Engine.SetConnection(false, err)
		if healthy {
			attempt = 0
		}
		delay := Delay(err, attempt, cfg.BackoffBase, cfg.BackoffMax, cfg.RandN)
		_, honoured := RetryAfter(err)
		attempt++
		cfg.Logger.Warn("sync stream ended; opening it again", slog.Any("error", err), slog.Duration("retry_in", delay), slog.Bool("retry_info", honoured))
		select {
		case <-ctx.Done():
			cfg.Engine.SetConnection(false, errors.New("stopped"))
			return nil
		case <-cfg.After(delay):
		}
	}
}

// Delay returns how long to wait before opening the stream again after err
// ended attempt (0 for the first since the composer last sent anything):
// full jitter, raised to the delay of a RetryInfo the composer sent — a
// floor, not the whole wait, so a composer that keeps refusing for a while
// (its store down) still sees the fleet back off — and never more than
// ceiling, whatever the composer says.
func Delay(err error, attempt int, base, ceiling time.Duration, randN func(int64) int64) time.Duration {
	d := FullJitter(attempt, base, ceiling, randN)
	if ra, ok := RetryAfter(err); ok {
		d = max(d, min(ra, ceiling))
	}
	return d
}

// FullJitter returns a delay uniformly between 0 and min(max,
// base·2^attempt), randN giving a number in [0, n).
func FullJitter(attempt int, base, max time.Duration, randN func(int64) int64) time.Duration {
	d := base
	for i := 0; i < attempt && d < max; i++ {
		d *= 2
	}
	if d > max {
		d = max
	}
	return time.Duration(randN(int64(d) + 1))
}

// RetryAfter returns the delay of a RetryInfo detail in an UNAVAILABLE
// status, which the composer sends when its watch is behind or it ages a
// connection out.
func RetryAfter(err error) (time.Duration, bool) {
	st, ok := status.FromError(err)
	if !ok || st.Code() != codes.Unavailable {
		return 0, false
	}
	for _, d := range st.Details() {
		if ri, ok := d.(*errdetails.RetryInfo); ok && ri.GetRetryDelay() != nil {
			if delay := ri.GetRetryDelay().AsDuration(); delay >= 0 {
				return delay, true
			}
		}
	}
	return 0, false
}

// session runs one stream until it fails; healthy reports whether the
// composer sent anything on it (the backoff then starts over).
func session(ctx context.Context, cfg Config) (bool, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	st, err := cfg.Client.Sync(ctx)
	if err != nil {
		return false, err
	}
	hello, sent := cfg.Engine.Hello()
	if err := st.Send(&composerv1.SyncRequest{Msg: &composerv1.SyncRequest_Hello{Hello: hello}}); err != nil {
		_, rerr := st.Recv()
		return false, firstErr(rerr, err)
	}
	cfg.Engine.SetConnection(true, nil)
	var healthy atomic.Bool
	errc := make(chan error, 1)
	go func() {
		for {
			m, err := st.Recv()
			if err != nil {
				errc <- err
				return
			}
			healthy.Store(true)
			cfg.Engine.Synced()
			switch x := m.GetMsg().(type) {
			case *composerv1.SyncResponse_Keyset:
				cfg.Engine.OfferKeyset(x.Keyset)
			case *composerv1.SyncResponse_Manifest:
				cfg.Engine.OfferManifest(x.Manifest)
			case *composerv1.SyncResponse_Heard:
				cfg.Engine.SetHeard(x.Heard)
			}
		}
	}()
	for {
		changed := cfg.Engine.Changed()
		if cfg.Engine.ReportVersion() != sent {
			rep, v := cfg.Engine.Report()
			if err := st.Send(&composerv1.SyncRequest{Msg: &composerv1.SyncRequest_Report{Report: rep}}); err != nil {
				return healthy.Load(), firstErr(<-errc, err)
			}
			sent = v
		}
		select {
		case <-changed:
		case err := <-errc:
			return healthy.Load(), err
		case <-ctx.Done():
			return healthy.Load(), ctx.Err()
		}
	}
}

// firstErr prefers the stream's status (from Recv) over the send's io.EOF.
func firstErr(recv, send error) error {
	if recv != nil {
		return recv
	}
	return send
}
