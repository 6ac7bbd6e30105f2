package natsx

import (
	"context"
	"log/slog"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

// The natsx tests start their own servers rather than through testutil,
// which imports this package.

func startServer(t testing.TB, cfg EmbeddedConfig) *Embedded {
	t.Helper()
	if cfg.DataDir == "" {
		cfg.DataDir = t.TempDir()
	}
	e, err := StartEmbedded(cfg)
	if err != nil {
		t.Fatalf("start embedded nats: %v", err)
	}
	t.Cleanup(e.Shutdown)
	return e
}

func connect(t testing.TB, e *Embedded) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	nc, js, err := Connect(ctx, ConnConfig{URL: e.ClientURL(), Name: t.Name(), Logger: discardLogger})
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	t.Cleanup(nc.Close)
	return nc, js
}

// serverAndJS starts a server and connects to it.
func serverAndJS(t testing.TB) (*Embedded, jetstream.JetStream) {
	t.Helper()
	e := startServer(t, EmbeddedConfig{})
	_, js := connect(t, e)
	return e, js
}

var discardLogger = slog.New(slog.DiscardHandler)

var bucketSeq atomic.Int64

// testSpec returns a spec for a fresh bucket named after the test.
func testSpec(history uint8) KVSpec {
	return KVSpec{Bucket: "test-" + strconv.FormatInt(bucketSeq.Add(1), 10), History: history}
}

func ensureKV(t testing.TB, js jetstream.JetStream, spec KVSpec, opts ...Option) *KV {
	t.Helper()
	kv, err := EnsureKV(context.Background(), js, spec, opts...)
	if err != nil {
		t.Fatalf("ensure kv %s: %v", spec.Bucket, err)
	}
	return kv
}

// recordingTracer returns a tracer provider that exports every ended span
// synchronously to the returned exporter.
func recordingTracer(t testing.TB) (*sdktrace.TracerProvider, *tracetest.InMemoryExporter) {
	t.Helper()
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	return tp, exp
}

// waitFor polls cond until it holds or the deadline passes; for conditions
// nothing signals, such as a server expiring a value.
func waitFor(t testing.TB, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.NewTimer(within)
	defer deadline.Stop()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		select {
		case <-deadline.C:
			t.Fatalf("timed out after %s waiting for %s", within, what)
		case <-tick.C:
		}
	}
}

// next receives one update from w or fails after a deadline.
func next(t testing.TB, w *Watcher) *Entry {
	t.Helper()
	select {
	case e, ok := <-w.Updates():
		if !ok {
			t.Fatalf("watcher closed: %v", w.Err())
		}
		return e
	case <-time.After(10 * time.Second):
		t.Fatal("timed out waiting for a watch update")
	}
	return nil
}
