package testutil

import (
	"context"
	"log/slog"
	"os"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"mesh.dev/internal/natsx"
)

// JetStreamOption configures StartJetStream.
type JetStreamOption func(*natsx.EmbeddedConfig)

// WithSyncAlways fsyncs every JetStream write, as the one-machine default
// does; tests that kill the server mid-write want it, others run faster
// without.
func WithSyncAlways() JetStreamOption {
	return func(c *natsx.EmbeddedConfig) { c.SyncAlways = true }
}

// WithJetStreamMaxStore caps the server's file store, for tests of a full
// store.
func WithJetStreamMaxStore(bytes int64) JetStreamOption {
	return func(c *natsx.EmbeddedConfig) { c.JetStreamMaxStore = bytes }
}

// StartJetStream starts a real embedded nats-server with JetStream in a
// fresh t.TempDir() on a random port, and shuts it down when the test ends.
func StartJetStream(t testing.TB, opts ...JetStreamOption) *natsx.Embedded {
	t.Helper()
	cfg := natsx.EmbeddedConfig{DataDir: t.TempDir(), ServerName: "test"}
	for _, opt := range opts {
		opt(&cfg)
	}
	return startJetStream(t, cfg)
}

func startJetStream(t testing.TB, cfg natsx.EmbeddedConfig) *natsx.Embedded {
	t.Helper()
	e, err := natsx.StartEmbedded(cfg)
	if err != nil {
		t.Fatalf("start jetstream: %v", err)
	}
	t.Cleanup(e.Shutdown)
	return e
}

// RestartJetStream shuts e down and starts a server again on the same data
// dir and port, so clients reconnect to it and find what e stored. e must
// not be used afterwards; the new server is shut down when the test ends.
func RestartJetStream(t testing.TB, e *natsx.Embedded) *natsx.Embedded {
	t.Helper()
	e.Shutdown()
	return startJetStream(t, e.Config())
}

// SnapshotJetStream shuts e down, copies its JetStream store and starts a
// server again on the same data dir and port; it returns the new server and
// the snapshot for RollbackJetStream. e must not be used afterwards.
func SnapshotJetStream(t testing.TB, e *natsx.Embedded) (*natsx.Embedded, string) {
	t.Helper()
	e.Shutdown()
	snap := t.TempDir()
	if err := os.CopyFS(snap, os.DirFS(e.Config().DataDir)); err != nil {
		t.Fatalf("snapshot jetstream: %v", err)
	}
	return startJetStream(t, e.Config()), snap
}

// RollbackJetStream shuts e down, puts a snapshot of SnapshotJetStream in
// place of its store and starts a server again on the same data dir and
// port: what a restore of an older disk image, or a disk that lied about
// its fsyncs, does to a server. Every write acknowledged since the snapshot
// is lost and its sequence is handed out again. e must not be used
// afterwards.
func RollbackJetStream(t testing.TB, e *natsx.Embedded, snap string) *natsx.Embedded {
	t.Helper()
	e.Shutdown()
	dir := e.Config().DataDir
	if err := os.RemoveAll(dir); err != nil {
		t.Fatalf("roll jetstream back: %v", err)
	}
	if err := os.CopyFS(dir, os.DirFS(snap)); err != nil {
		t.Fatalf("roll jetstream back: %v", err)
	}
	return startJetStream(t, e.Config())
}

// quiet drops the connection's event logs: they may come after the test has
// ended (the closed event is asynchronous), when t.Log would panic.
var quiet = slog.New(slog.DiscardHandler)

// ConnectJetStream connects to e as a service would (natsx.Connect) and
// closes the connection when the test ends.
func ConnectJetStream(t testing.TB, e *natsx.Embedded) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	nc, js, err := natsx.Connect(ctx, natsx.ConnConfig{URL: e.ClientURL(), Name: t.Name(), Logger: quiet})
	if err != nil {
		t.Fatalf("connect to jetstream: %v", err)
	}
	t.Cleanup(nc.Close)
	return nc, js
}
