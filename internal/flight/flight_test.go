package flight

import (
	"context"
	"errors"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
)

// inFlight starts a call for key under ctx that blocks until release is
// closed and returns once it is in flight.
func inFlight(t *testing.T, ctx context.Context, g *Group[string, int], key string, v int, err error, release chan struct{}) <-chan error {
	t.Helper()
	started := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		got, gotErr := g.Do(ctx, key, func() (int, error) {
			close(started)
			<-release
			return v, err
		})
		if gotErr == nil && got != v {
			gotErr = errors.New("the caller got another value")
		}
		done <- gotErr
	}()
	<-started
	return done
}

func TestWaitersShareTheCall(t *testing.T) {
	t.Parallel()
	var g Group[string, int]
	release := make(chan struct{})
	first := inFlight(t, context.Background(), &g, "fp", 7, nil, release)
	var calls atomic.Int32
	var wg sync.WaitGroup
	got := make([]int, 8)
	for i := range got {
		wg.Go(func() {
			got[i], _ = g.Do(context.Background(), "fp", func() (int, error) { calls.Add(1); return -1, nil })
		})
	}
	// Released only once every waiter waits on the call.
	for {
		if _, n := g.InFlight("fp"); n == len(got) {
			break
		}
		runtime.Gosched()
	}
	close(release)
	wg.Wait()
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	for i, v := range got {
		if v != 7 {
			t.Fatalf("waiter %d got %d, want the shared call's 7", i, v)
		}
	}
	if n := calls.Load(); n != 0 {
		t.Fatalf("%d waiters called fn themselves", n)
	}
	// Nothing is kept after the call: the next one calls again.
	v, err := g.Do(context.Background(), "fp", func() (int, error) { return 9, nil })
	if err != nil || v != 9 {
		t.Fatalf("a call after the shared one: %d, %v; want 9", v, err)
	}
}

// waitFor returns once n callers wait on the call in flight for key.
func waitFor(g *Group[string, int], key string, n int) {
	for {
		if _, w := g.InFlight(key); w == n {
			return
		}
		runtime.Gosched()
	}
}

// TestFailureIsShared: a call that failed on its own (the catalog said no)
// gives its error to its waiters, who do not ask again.
func TestFailureIsShared(t *testing.T) {
	t.Parallel()
	var g Group[string, int]
	release := make(chan struct{})
	refused := errors.New("no entry of fingerprint fp")
	first := inFlight(t, context.Background(), &g, "fp", 0, refused, release)
	got := make(chan error, 1)
	go func() {
		_, err := g.Do(context.Background(), "fp", func() (int, error) { return 5, nil })
		got <- err
	}()
	waitFor(&g, "fp", 1)
	close(release)
	if err := <-first; !errors.Is(err, refused) {
		t.Fatalf("first caller: %v", err)
	}
	if err := <-got; !errors.Is(err, refused) {
		t.Fatalf("waiter: %v, want the shared call's error", err)
	}
}

// TestCallersOwnFailureIsAskedAgain: a call whose caller's context ended
// failed for that caller only; its waiters ask again, in one shared call.
func TestCallersOwnFailureIsAskedAgain(t *testing.T) {
	t.Parallel()
	var g Group[string, int]
	release := make(chan struct{})
	ctx, cancel := context.WithCancel(context.Background())
	first := inFlight(t, ctx, &g, "fp", 0, context.Canceled, release)
	var calls atomic.Int32
	const waiters = 4
	got := make(chan int, waiters)
	for range waiters {
		go func() {
			v, _ := g.Do(context.Background(), "fp", func() (int, error) {
				calls.Add(1)
				// Held until every other waiter waits on this call.
				waitFor(&g, "fp", waiters-1)
				return 5, nil
			})
			got <- v
		}()
	}
	waitFor(&g, "fp", waiters)
	cancel()
	close(release)
	if err := <-first; !errors.Is(err, context.Canceled) {
		t.Fatalf("first caller: %v", err)
	}
	for range waiters {
		if v := <-got; v != 5 {
			t.Fatalf("waiter after its leader's context ended got %d, want a new call's 5", v)
		}
	}
	if n := calls.Load(); n != 1 {
		t.Fatalf("%d calls asked again for %d waiters, want 1 shared", n, waiters)
	}
}

func TestWaiterContextEnds(t *testing.T) {
	t.Parallel()
	var g Group[string, int]
	release := make(chan struct{})
	defer close(release)
	inFlight(t, context.Background(), &g, "fp", 1, nil, release)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := g.Do(ctx, "fp", func() (int, error) { return 2, nil }); !errors.Is(err, context.Canceled) {
		t.Fatalf("waiter with an ended context: %v, want context.Canceled", err)
	}
}

func TestPanicIsNotShared(t *testing.T) {
	t.Parallel()
	var g Group[string, int]
	release := make(chan struct{})
	started := make(chan struct{})
	panicked := make(chan any, 1)
	go func() {
		defer func() { panicked <- recover() }()
		g.Do(context.Background(), "fp", func() (int, error) {
			close(started)
			<-release
			panic("boom")
		})
	}()
	<-started
	got := make(chan int, 1)
	go func() {
		v, _ := g.Do(context.Background(), "fp", func() (int, error) { return 3, nil })
		got <- v
	}()
	close(release)
	if p := <-panicked; p != "boom" {
		t.Fatalf("the caller's panic: %v", p)
	}
	if v := <-got; v != 3 {
		t.Fatalf("waiter after a panicked call got %d, want its own call's 3", v)
	}
}

func TestCachedLooksAgainInsideTheCall(t *testing.T) {
	t.Parallel()
	var g Group[string, int]
	looks := 0
	// The first look misses, the one inside the call finds what a call
	// that just ended put there: fn is not called.
	cached := func(string) (int, bool) { looks++; return 4, looks > 1 }
	v, err := g.Cached(context.Background(), "fp", cached, func() (int, error) { t.Fatal("fn called"); return 0, nil })
	if err != nil || v != 4 || looks != 2 {
		t.Fatalf("Cached: %d, %v after %d looks; want 4 after 2", v, err, looks)
	}
	v, err = g.Cached(context.Background(), "other", func(string) (int, bool) { return 0, false }, func() (int, error) { return 8, nil })
	if err != nil || v != 8 {
		t.Fatalf("Cached of a key nothing holds: %d, %v; want fn's 8", v, err)
	}
}
