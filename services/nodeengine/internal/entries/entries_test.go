package entries

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"mesh.dev/internal/canonical"
	"mesh.dev/internal/names"
	catalogv1 "mesh.dev/proto/mesh/catalog/v1"
	typev1 "mesh.dev/proto/mesh/type/v1"
)

type catalog struct {
	mu    sync.Mutex
	err   error
	entry *catalogv1.Entry
	calls int
}

func (c *catalog) GetEntry(context.Context, *catalogv1.GetEntryRequest, ...grpc.CallOption) (*catalogv1.GetEntryResponse, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.calls++
	if c.err != nil {
		return nil, c.err
	}
	return &catalogv1.GetEntryResponse{Entry: c.entry}, nil
}

func (c *catalog) set(err error, e *catalogv1.Entry) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.err, c.entry = err, e
}

func (c *catalog) n() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.calls
}

func entryOf(t *testing.T, module string) *catalogv1.Entry {
	b, err := canonical.Marshal(&typev1.ModuleManifest{Module: module, Version: "1.0"})
	if err != nil {
		t.Fatal(err)
	}
	e := &catalogv1.Entry{Module: module, Repository: "r", Path: module, SourceDigest: names.Digest([]byte(module)), Manifest: b, ManifestDigest: names.Digest(b)}
	e.Fingerprint = names.ComputeFingerprint(e.Module, e.Repository, e.Path, e.SourceDigest, e.ManifestDigest)
	return e
}

func wait(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 10s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// TestNotFoundOnlyOnCodeAndWords answers NOT_FOUND only for the code and
// the exact words for the fingerprint asked; anything else stays ASKED and
// is asked again.
func TestNotFoundOnlyOnCodeAndWords(t *testing.T) {
	t.Parallel()
	good := entryOf(t, "web")
	fp := good.GetFingerprint()
	other := names.FingerprintFromHex("00000000000000000000000000000000000000000000000000000000000000ff")
	tests := []struct {
		name  string
		err   error
		entry *catalogv1.Entry
		want  string
	}{
		{"code and words", status.Error(codes.NotFound, "no entry of fingerprint "+fp), nil, "NOT_FOUND"},
		{"words of another fingerprint", status.Error(codes.NotFound, "no entry of fingerprint "+other), nil, "ASKED"},
		{"other words", status.Error(codes.NotFound, "not found"), nil, "ASKED"},
		{"words with another code", status.Error(codes.Unavailable, "no entry of fingerprint "+fp), nil, "ASKED"},
		{"answered", nil, good, "ANSWERED"},
		{"an entry whose fields compute another fingerprint", nil, func() *catalogv1.Entry { e := entryOf(t, "web"); e.Repository = "x"; return e }(), "ASKED"},
		{"an entry whose manifest digest lies", nil, func() *catalogv1.Entry { e := entryOf(t, "web"); e.ManifestDigest = names.Digest(nil); return e }(), "ASKED"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			c := &catalog{err: tt.err, entry: tt.entry}
			kept := make(chan Row, 1)
			cache := New(Config{Catalog: c, BackoffBase: time.Millisecond, BackoffMax: 5 * time.Millisecond, Keep: func(r Row) { kept <- r }})
			defer cache.Close()
			if got := cache.Need(fp); got != Asked {
				t.Fatalf("first Need = %v", got)
			}
			switch tt.want {
			case "ASKED":
				wait(t, "asked again", func() bool { return c.n() >= 3 })
				if r, _ := cache.Get(fp); r.State != Asked || r.Error == "" {
					t.Fatalf("row %+v", r)
				}
			case "NOT_FOUND":
				wait(t, "not found", func() bool { r, _ := cache.Get(fp); return r.State == NotFound })
				n := c.n()
				cache.Need(fp)
				if c.n() != n {
					t.Error("NOT_FOUND asked again without Again")
				}
				c.set(nil, good)
				cache.Again(fp, nil)
				wait(t, "answered after Again", func() bool { r, _ := cache.Get(fp); return r.State == Answered })
			case "ANSWERED":
				wait(t, "answered", func() bool { r, _ := cache.Get(fp); return r.State == Answered })
				if r := <-kept; r.Fingerprint != fp {
					t.Errorf("kept %v", r.Fingerprint)
				}
			}
			cache.Release(fp)
			if _, ok := cache.Get(fp); ok {
				t.Error("released row still there")
			}
		})
	}
}

// tracingCatalog records the span context each GetEntry is called in.
type tracingCatalog struct {
	entry *catalogv1.Entry
	seen  chan trace.SpanContext
}

func (c *tracingCatalog) GetEntry(ctx context.Context, _ *catalogv1.GetEntryRequest, _ ...grpc.CallOption) (*catalogv1.GetEntryResponse, error) {
	c.seen <- trace.SpanContextFromContext(ctx)
	return &catalogv1.GetEntryResponse{Entry: c.entry}, nil
}

// TestAskContinuesTheTraceOfTheNeed asks the catalog within the trace of
// the pass that first needed the entry (one trace from a registration to
// the apply), and in no trace when Need is given none.
func TestAskContinuesTheTraceOfTheNeed(t *testing.T) {
	t.Parallel()
	parent := trace.NewSpanContext(trace.SpanContextConfig{
		TraceID: trace.TraceID{1, 2, 3}, SpanID: trace.SpanID{4, 5, 6}, TraceFlags: trace.FlagsSampled, Remote: true,
	})
	withTrace := entryOf(t, "web")
	without := entryOf(t, "db")
	c := &tracingCatalog{seen: make(chan trace.SpanContext, 2)}
	cache := New(Config{Catalog: c})
	defer cache.Close()

	c.entry = withTrace
	ctx, cancel := context.WithCancel(trace.ContextWithSpanContext(context.Background(), parent))
	if got := cache.NeedFrom(ctx, withTrace.GetFingerprint()); got != Asked {
		t.Fatalf("NeedFrom = %v", got)
	}
	cancel() // the pass ended; the ask goes on
	if sc := <-c.seen; sc.TraceID() != parent.TraceID() || sc.SpanID() != parent.SpanID() {
		t.Errorf("GetEntry ran in span context %v/%v, want the pass's %v/%v", sc.TraceID(), sc.SpanID(), parent.TraceID(), parent.SpanID())
	}
	wait(t, "answered", func() bool { r, _ := cache.Get(withTrace.GetFingerprint()); return r.State == Answered })

	c.entry = without
	cache.Need(without.GetFingerprint())
	if sc := <-c.seen; sc.IsValid() {
		t.Errorf("GetEntry of a Need without a trace ran in span context %v", sc.TraceID())
	}
}

// genOf returns the generation of fp's row.
func genOf(c *Cache, fp string) (uint64, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	r, ok := c.rows[fp]
	if !ok {
		return 0, false
	}
	return r.gen, true
}

// TestAnswerInFlightNotKeptAfterAgainOrRelease holds an answer inside Keep
// while Again or Release runs: Again's drop runs only once that keep is
// done (so the engine's dropped entry stays dropped until the new answer),
// and Release returns only once it is done, so the kept entry the engine
// deletes after Release is not written back; the stale answer never shows.
func TestAnswerInFlightNotKeptAfterAgainOrRelease(t *testing.T) {
	t.Parallel()
	for _, op := range []string{"again", "release"} {
		t.Run(op, func(t *testing.T) {
			t.Parallel()
			e := entryOf(t, "web")
			fp := e.GetFingerprint()
			var (
				mu    sync.Mutex
				log   []string
				kept  = map[string]bool{}
				first = true
			)
			note := func(s string) {
				mu.Lock()
				defer mu.Unlock()
				log = append(log, s)
			}
			keeping, proceed := make(chan struct{}), make(chan struct{})
			keep := func(r Row) {
				mu.Lock()
				wasFirst := first
				first = false
				mu.Unlock()
				if wasFirst {
					close(keeping)
					<-proceed
				}
				mu.Lock()
				defer mu.Unlock()
				log = append(log, "keep")
				kept[r.Fingerprint] = true
			}
			cache := New(Config{Catalog: &catalog{entry: e}, Keep: keep})
			defer cache.Close()
			cache.Need(fp)
			<-keeping
			gen, _ := genOf(cache, fp)
			done := make(chan struct{})
			switch op {
			case "again":
				go func() {
					defer close(done)
					cache.Again(fp, func() {
						mu.Lock()
						defer mu.Unlock()
						log = append(log, "drop")
						delete(kept, fp)
					})
				}()
				wait(t, "Again started", func() bool { g, ok := genOf(cache, fp); return ok && g != gen })
			case "release":
				go func() {
					defer close(done)
					cache.Release(fp)
					note("released")
					// The engine deletes the kept entries of released rows.
					mu.Lock()
					delete(kept, fp)
					mu.Unlock()
				}()
				wait(t, "Release started", func() bool { _, ok := genOf(cache, fp); return !ok })
				select {
				case <-done:
					t.Error("Release returned while an answer of fp was being kept")
				default:
				}
			}
			close(proceed)
			<-done
			switch op {
			case "again":
				wait(t, "answered again", func() bool { r, _ := cache.Get(fp); return r.State == Answered })
				mu.Lock()
				defer mu.Unlock()
				if want := []string{"keep", "drop", "keep"}; !slices.Equal(log, want) || !kept[fp] {
					t.Errorf("events %v (kept %v), want %v: the drop must follow the keep in flight", log, kept[fp], want)
				}
			case "release":
				mu.Lock()
				defer mu.Unlock()
				if want := []string{"keep", "released"}; !slices.Equal(log, want) || kept[fp] {
					t.Errorf("events %v (kept %v), want %v and nothing kept", log, kept[fp], want)
				}
				if _, ok := cache.Get(fp); ok {
					t.Error("the released row came back with the answer in flight")
				}
			}
		})
	}
}
