package syncclient

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	composerv1 "mesh.dev/proto/mesh/composer/v1"
	typev1 "mesh.dev/proto/mesh/type/v1"
)

// fakeEngine records what the client tells it.
type fakeEngine struct {
	mu      sync.Mutex
	changed chan struct{}
	conns   []string
	hellos  int
	heard   int
}

func newFakeEngine() *fakeEngine { return &fakeEngine{changed: make(chan struct{})} }

func (e *fakeEngine) Hello() (*composerv1.Hello, uint64) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.hellos++
	return &composerv1.Hello{Node: "ace", ReportSeq: uint64(e.hellos)}, 0
}
func (e *fakeEngine) Report() (*composerv1.Report, uint64) { return &composerv1.Report{}, 0 }
func (e *fakeEngine) ReportVersion() uint64                { return 0 }
func (e *fakeEngine) Changed() <-chan struct{}             { return e.changed }
func (e *fakeEngine) OfferKeyset(*typev1.Envelope)         {}
func (e *fakeEngine) OfferManifest(*typev1.Envelope)       {}
func (e *fakeEngine) SetHeard(*composerv1.Heard) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.heard++
}
func (e *fakeEngine) Synced() {}
func (e *fakeEngine) SetConnection(connected bool, err error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	s := "connected"
	if !connected {
		s = "down: " + err.Error()
	}
	e.conns = append(e.conns, s)
}

// play is how one Sync attempt of the fake composer goes.
type play struct {
	// open, when set, fails the Sync call itself.
	open error
	// heard messages are received before the stream ends with end.
	heard int
	end   error
}

// fakeClient plays the sessions in order.
type fakeClient struct {
	mu       sync.Mutex
	sessions []play
	calls    int
}

func (c *fakeClient) Sync(ctx context.Context, _ ...grpc.CallOption) (grpc.BidiStreamingClient[composerv1.SyncRequest, composerv1.SyncResponse], error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.sessions[c.calls%len(c.sessions)]
	c.calls++
	if s.open != nil {
		return nil, s.open
	}
	return &fakeStream{ctx: ctx, heard: s.heard, end: s.end}, nil
}

type fakeStream struct {
	grpc.ClientStream
	ctx   context.Context
	heard int
	end   error
}

func (s *fakeStream) Send(*composerv1.SyncRequest) error { return nil }
func (s *fakeStream) Recv() (*composerv1.SyncResponse, error) {
	if s.heard > 0 {
		s.heard--
		return &composerv1.SyncResponse{Msg: &composerv1.SyncResponse_Heard{Heard: &composerv1.Heard{}}}, nil
	}
	return nil, s.end
}

var quiet = slog.New(slog.DiscardHandler)

func retryInfo(code codes.Code, d time.Duration) error {
	st, err := status.New(code, "try later").WithDetails(&errdetails.RetryInfo{RetryDelay: durationpb.New(d)})
	if err != nil {
		panic(err)
	}
	return st.Err()
}

// clock is the fake clock and jitter of a run: it records every delay
// waited and every bound the jitter was asked for, and stops the run after
// a number of waits.
type clock struct {
	mu     sync.Mutex
	waits  []time.Duration
	bounds []time.Duration
	pick   func(n int64) int64
	stop   int
	cancel context.CancelFunc
}

func (c *clock) randN(n int64) int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.bounds = append(c.bounds, time.Duration(n))
	return c.pick(n)
}

func (c *clock) after(d time.Duration) <-chan time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.waits = append(c.waits, d)
	if len(c.waits) >= c.stop {
		// The run ends here: this wait never ends, the run's context does.
		c.cancel()
		return nil
	}
	ch := make(chan time.Time, 1)
	ch <- time.Time{}
	return ch
}

// TestBackoff checks the reconnect delays (DESIGN.md §6 step 5): full
// jitter over 1 s doubling to 5 min, a RetryInfo of an UNAVAILABLE status
// honoured (bounded by the same 5 min), and the backoff starting over after
// a stream on which the composer sent something.
func TestBackoff(t *testing.T) {
	t.Parallel()
	down := status.Error(codes.Unavailable, "connection refused")
	s := time.Second
	maxPick := func(n int64) int64 { return n - 1 }
	tests := []struct {
		name     string
		sessions []play
		pick     func(n int64) int64
		waits    int
		want     []time.Duration
		// bounds are the jitter's bounds asked, each the cap + 1 ns.
		bounds []time.Duration
	}{
		{
			name: "doubling from 1 s to 5 min, the top of the jitter", sessions: []play{{open: down}}, pick: maxPick, waits: 12,
			want:   []time.Duration{s, 2 * s, 4 * s, 8 * s, 16 * s, 32 * s, 64 * s, 128 * s, 256 * s, 300 * s, 300 * s, 300 * s},
			bounds: []time.Duration{s + 1, 2*s + 1, 4*s + 1, 8*s + 1, 16*s + 1, 32*s + 1, 64*s + 1, 128*s + 1, 256*s + 1, 300*s + 1, 300*s + 1, 300*s + 1},
		},
		{
			name: "full jitter reaches 0", sessions: []play{{open: down}}, pick: func(int64) int64 { return 0 }, waits: 3,
			want: []time.Duration{0, 0, 0}, bounds: []time.Duration{s + 1, 2*s + 1, 4*s + 1},
		},
		{
			name: "a stream that ends before the composer sends anything backs off too", sessions: []play{{end: down}}, pick: maxPick, waits: 3,
			want: []time.Duration{s, 2 * s, 4 * s}, bounds: []time.Duration{s + 1, 2*s + 1, 4*s + 1},
		},
		{
			name:     "retry-after honoured, a floor of the jitter",
			sessions: []play{{end: retryInfo(codes.Unavailable, 7*s)}}, pick: maxPick, waits: 2,
			want: []time.Duration{7 * s, 7 * s}, bounds: []time.Duration{s + 1, 2*s + 1},
		},
		{
			name:     "retry-after bounded by 5 min",
			sessions: []play{{end: retryInfo(codes.Unavailable, time.Hour)}}, pick: maxPick, waits: 1,
			want: []time.Duration{300 * s}, bounds: []time.Duration{s + 1},
		},
		{
			name:     "retry info of another code is not a retry-after",
			sessions: []play{{end: retryInfo(codes.PermissionDenied, 7*s)}}, pick: maxPick, waits: 2,
			want: []time.Duration{s, 2 * s}, bounds: []time.Duration{s + 1, 2*s + 1},
		},
		{
			name:     "a stream the composer sent on starts the backoff over",
			sessions: []play{{open: down}, {open: down}, {heard: 1, end: io.EOF}, {open: down}}, pick: maxPick, waits: 4,
			want: []time.Duration{s, 2 * s, s, 2 * s}, bounds: []time.Duration{s + 1, 2*s + 1, s + 1, 2*s + 1},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			c := &clock{pick: tt.pick, stop: tt.waits, cancel: cancel}
			eng := newFakeEngine()
			err := Run(ctx, Config{Client: &fakeClient{sessions: tt.sessions}, Engine: eng, RandN: c.randN, After: c.after, Logger: quiet})
			if err != nil {
				t.Fatalf("Run: %v", err)
			}
			if !equal(c.waits, tt.want) || !equal(c.bounds, tt.bounds) {
				t.Errorf("waited %v (jitter bounds %v)\nwant   %v (jitter bounds %v)", c.waits, c.bounds, tt.want, tt.bounds)
			}
			eng.mu.Lock()
			defer eng.mu.Unlock()
			// The engine is told, for every ended stream, that it is
			// not connected and why; the last is the stop.
			downs := 0
			for _, s := range eng.conns {
				if s != "connected" {
					downs++
				}
			}
			if downs != tt.waits+1 || eng.conns[len(eng.conns)-1] != "down: stopped" {
				t.Errorf("connection states %q", eng.conns)
			}
		})
	}
}

func equal(a, b []time.Duration) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestConnectionSaysWhy: a stream that ends tells the engine it is not
// connected with the composer's error, so GetStatus can say why.
func TestConnectionSaysWhy(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	c := &clock{pick: func(int64) int64 { return 0 }, stop: 1, cancel: cancel}
	eng := newFakeEngine()
	refused := status.Error(codes.PermissionDenied, "node ace has no node spec")
	if err := Run(ctx, Config{Client: &fakeClient{sessions: []play{{heard: 2, end: refused}}}, Engine: eng, RandN: c.randN, After: c.after, Logger: quiet}); err != nil {
		t.Fatal(err)
	}
	eng.mu.Lock()
	defer eng.mu.Unlock()
	want := []string{"connected", "down: " + refused.Error(), "down: stopped"}
	if len(eng.conns) != len(want) || eng.conns[0] != want[0] || eng.conns[1] != want[1] || eng.conns[2] != want[2] || eng.heard != 2 || eng.hellos != 1 {
		t.Errorf("connection states %q, heard %d, hellos %d", eng.conns, eng.heard, eng.hellos)
	}
	if !errors.Is(ctx.Err(), context.Canceled) {
		t.Error("the run did not stop at the clock")
	}
}

// TestRetryAfterIsAFloorOfTheBackoff: a composer that refuses stream after
// stream with a 5 s retry-after (its store down) sees each engine wait at
// least that long, and longer as the refusals go on (DESIGN.md §6 step 5:
// backoff 1 s → 5 min, a retry-after honoured), not every 5 s for the
// whole outage.
func TestRetryAfterIsAFloorOfTheBackoff(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	c := &clock{pick: func(n int64) int64 { return n - 1 }, stop: 12, cancel: cancel}
	eng := newFakeEngine()
	behind := retryInfo(codes.Unavailable, 5*time.Second)
	if err := Run(ctx, Config{Client: &fakeClient{sessions: []play{{end: behind}}}, Engine: eng, RandN: c.randN, After: c.after, Logger: quiet}); err != nil {
		t.Fatal(err)
	}
	if last := c.waits[len(c.waits)-1]; last < time.Minute {
		t.Errorf("after %d streams refused with a 5 s retry-after the engine waits %v (waits %v), want the backoff grown past 1 min", len(c.waits), last, c.waits)
	}
	for i, w := range c.waits {
		if w < 5*time.Second {
			t.Errorf("wait %d is %v, under the composer's retry-after", i, w)
		}
	}
}
