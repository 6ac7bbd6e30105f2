package natsx

import (
	"context"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"
)

func TestConnOptionsRefuses(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		cfg     ConnConfig
		wantErr string
	}{
		{name: "no url", cfg: ConnConfig{}, wantErr: "url is required"},
		{name: "cert without key", cfg: ConnConfig{URL: "nats://x", CertFile: "c.pem"}, wantErr: "cert file and key file"},
		{name: "key without cert", cfg: ConnConfig{URL: "nats://x", KeyFile: "k.pem"}, wantErr: "cert file and key file"},
		{name: "password without user", cfg: ConnConfig{URL: "nats://x", Password: "p"}, wantErr: "password given without a user"},
		{name: "user and token", cfg: ConnConfig{URL: "nats://x", User: "u", Token: "t"}, wantErr: "only one of"},
		{name: "creds and user", cfg: ConnConfig{URL: "nats://x", User: "u", CredsFile: "f"}, wantErr: "only one of"},
		{name: "missing ca file", cfg: ConnConfig{URL: "nats://x", CAFile: "/nonexistent/ca.pem"}, wantErr: "rootCA"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, _, err := Connect(t.Context(), tt.cfg)
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("err = %v, want %q", err, tt.wantErr)
			}
		})
	}
}

func TestConnectFails(t *testing.T) {
	t.Parallel()
	// A port nothing listens on: take a free one and close it.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	url := "nats://" + l.Addr().String()
	l.Close()

	canceled, cancel := context.WithCancel(t.Context())
	cancel()
	tests := []struct {
		name    string
		ctx     context.Context
		wantErr string
	}{
		{name: "nothing listens", ctx: t.Context(), wantErr: "nats connect to " + url},
		{name: "context ended", ctx: canceled, wantErr: "context canceled"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			nc, _, err := Connect(tt.ctx, ConnConfig{URL: url, Logger: discardLogger})
			if err == nil {
				nc.Close()
				t.Fatal("connected")
			}
			if !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("err = %v, want %q", err, tt.wantErr)
			}
		})
	}
}

// chanHandler sends each log message to a channel, so a test can wait for an
// event without polling.
type chanHandler struct{ msgs chan string }

func (h chanHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h chanHandler) Handle(_ context.Context, r slog.Record) error {
	select {
	case h.msgs <- r.Message:
	default:
	}
	return nil
}
func (h chanHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h chanHandler) WithGroup(string) slog.Handler      { return h }

func TestConnectReconnectsAndLogs(t *testing.T) {
	t.Parallel()
	e := startServer(t, EmbeddedConfig{})
	msgs := make(chan string, 64)
	nc, js, err := Connect(t.Context(), ConnConfig{URL: e.ClientURL(), Name: "reconnect", Logger: slog.New(chanHandler{msgs})})
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	kv := ensureKV(t, js, testSpec(1))

	e.Shutdown()
	waitMsg(t, msgs, "nats disconnected")
	e2 := startServer(t, e.Config())
	waitMsg(t, msgs, "nats reconnected")
	_ = e2

	// The connection is usable again: the data dir kept the bucket.
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if _, err := kv.Put(ctx, "after", []byte("restart")); err != nil {
		t.Fatalf("put after reconnect: %v", err)
	}
}

func waitMsg(t *testing.T, msgs <-chan string, want string) {
	t.Helper()
	deadline := time.After(30 * time.Second)
	for {
		select {
		case m := <-msgs:
			if m == want {
				return
			}
		case <-deadline:
			t.Fatalf("no %q logged", want)
		}
	}
}
