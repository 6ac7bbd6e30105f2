package testutil

import (
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	healthgrpc "google.golang.org/grpc/health/grpc_health_v1"

	"mesh.dev/internal/authz"
	"mesh.dev/internal/grpcclient"
	"mesh.dev/internal/grpcserver"
	"mesh.dev/internal/identity"
)

// StartServer builds a grpcserver with id's certificate, policy and the
// registered services, serves it on 127.0.0.1 on a free port and stops it
// when the test ends. It returns the address to dial.
func StartServer(t testing.TB, p *PKI, id identity.Identity, policy authz.Policy, register ...func(grpc.ServiceRegistrar)) (string, *grpcserver.Server) {
	t.Helper()
	return StartServerConfig(t, grpcserver.Config{
		TLS:    p.ServerTLS(t, id),
		Policy: policy,
	}, register...)
}

// StartServerConfig is StartServer with a config of the caller's; Addr
// defaults to 127.0.0.1:0, Logger to the test's log and GracePeriod to 5 s.
func StartServerConfig(t testing.TB, cfg grpcserver.Config, register ...func(grpc.ServiceRegistrar)) (string, *grpcserver.Server) {
	t.Helper()
	if cfg.Addr == "" {
		cfg.Addr = "127.0.0.1:0"
	}
	if cfg.Logger == nil {
		cfg.Logger = serverTestLogger(t)
	}
	if cfg.GracePeriod == 0 {
		cfg.GracePeriod = 5 * time.Second
	}
	srv, err := grpcserver.Build(cfg, register...)
	if err != nil {
		t.Fatalf("testutil: build server: %v", err)
	}
	addr, err := srv.Listen()
	if err != nil {
		t.Fatalf("testutil: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("testutil: serve: %v", err)
		}
	})
	return addr.String(), srv
}

// Dial connects to addr as id over mTLS and closes the connection when the
// test ends.
func Dial(t testing.TB, p *PKI, addr string, id identity.Identity) *grpc.ClientConn {
	t.Helper()
	return DialTLS(t, addr, p.ClientTLS(t, id))
}

// DialTLS connects to addr with a client config of the caller's (for
// instance one of the PKI's odd certificates) and closes the connection when
// the test ends.
func DialTLS(t testing.TB, addr string, cfg *tls.Config, opts ...grpc.DialOption) *grpc.ClientConn {
	t.Helper()
	conn, err := grpcclient.Dial(addr, cfg, opts...)
	if err != nil {
		t.Fatalf("testutil: dial %s: %v", addr, err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

// serverTestLogger logs to the test's log until the test's cleanups run;
// later lines are dropped, since logging to a finished test panics.
func serverTestLogger(t testing.TB) *slog.Logger {
	w := &testLogWriter{t: t}
	t.Cleanup(w.close)
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

type testLogWriter struct {
	t      testing.TB
	mu     sync.Mutex
	closed bool
}

func (w *testLogWriter) Write(b []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.closed {
		w.t.Log(strings.TrimSuffix(string(b), "\n"))
	}
	return len(b), nil
}

func (w *testLogWriter) close() {
	w.mu.Lock()
	w.closed = true
	w.mu.Unlock()
}

// Serving asks a server's gRPC health (the whole server) and returns an
// error unless it answers SERVING.
func Serving(ctx context.Context, conn grpc.ClientConnInterface) error {
	resp, err := healthgrpc.NewHealthClient(conn).Check(ctx, &healthgrpc.HealthCheckRequest{})
	if err != nil {
		return err
	}
	if resp.GetStatus() != healthgrpc.HealthCheckResponse_SERVING {
		return fmt.Errorf("health %s", resp.GetStatus())
	}
	return nil
}
