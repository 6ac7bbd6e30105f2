package grpcclient_test

import (
	"crypto/tls"
	"net"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthgrpc "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"mesh.dev/internal/authz"
	"mesh.dev/internal/grpcclient"
	"mesh.dev/internal/identity"
	"mesh.dev/internal/pki"
	"mesh.dev/internal/testutil"
)

func TestDialRefusesWeakTLS(t *testing.T) {
	t.Parallel()
	p := testutil.NewPKI(t)
	good := p.ClientTLS(t, p.Identity(identity.RoleOperator, "admin"))
	tls12 := good.Clone()
	tls12.MinVersion = tls.VersionTLS12
	skip := good.Clone()
	skip.InsecureSkipVerify = true
	tests := []struct {
		name    string
		cfg     *tls.Config
		wantErr string
	}{
		{name: "nil", cfg: nil, wantErr: "no tls config"},
		{name: "TLS 1.2", cfg: tls12, wantErr: "must require TLS 1.3"},
		{name: "no verification", cfg: skip, wantErr: "skips server verification"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			conn, err := grpcclient.Dial("127.0.0.1:1", tt.cfg)
			if err == nil {
				conn.Close()
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("Dial() error = %v, want it to contain %q", err, tt.wantErr)
			}
		})
	}
}

// TestDial reaches a grpcserver by address and by name with the default
// service SANs, traces to the given provider, and verifies the server.
func TestDial(t *testing.T) {
	t.Parallel()
	p := testutil.NewPKI(t)
	addr, _ := testutil.StartServer(t, p, p.Identity(identity.RoleCatalog, ""), authz.Policy{})
	_, port, _ := net.SplitHostPort(addr)
	client := p.Identity(identity.RoleNode, "ace")
	other := testutil.NewPKI(t)
	tests := []struct {
		name   string
		target string
		cfg    *tls.Config
		want   codes.Code
	}{
		{name: "by address", target: addr, cfg: p.ClientTLS(t, client), want: codes.OK},
		{name: "by name", target: net.JoinHostPort("localhost", port), cfg: p.ClientTLS(t, client), want: codes.OK},
		{name: "dns scheme", target: "dns:///" + net.JoinHostPort("localhost", port), cfg: p.ClientTLS(t, client), want: codes.OK},
		{name: "expected server", target: addr, cfg: pki.RequireService(p.ClientTLS(t, client), identity.RoleCatalog), want: codes.OK},
		{name: "unexpected server", target: addr, cfg: pki.RequireService(p.ClientTLS(t, client), identity.RoleComposer), want: codes.Unavailable},
		{name: "server of another CA", target: addr, cfg: other.ClientTLS(t, other.Identity(identity.RoleNode, "ace")), want: codes.Unavailable},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			rec := tracetest.NewSpanRecorder()
			tp := trace.NewTracerProvider(trace.WithSpanProcessor(rec))
			conn := testutil.DialTLS(t, tt.target, tt.cfg, grpcclient.WithTracerProvider(tp))
			_, err := healthgrpc.NewHealthClient(conn).Check(t.Context(), &healthgrpc.HealthCheckRequest{})
			if got := status.Code(err); got != tt.want {
				t.Fatalf("health check: %s (%v), want %s", got, err, tt.want)
			}
			if tt.want != codes.OK {
				return
			}
			// The client's span ends when the call returns.
			spans := rec.Ended()
			if len(spans) != 1 || spans[0].Name() != "grpc.health.v1.Health/Check" {
				var names []string
				for _, s := range spans {
					names = append(names, s.Name())
				}
				t.Fatalf("client spans %v, want one grpc.health.v1.Health/Check", names)
			}
		})
	}
}

// TestOptionsOverride shows caller options come after the defaults: a
// smaller call limit than DefaultMaxMsgSize wins.
func TestOptionsOverride(t *testing.T) {
	t.Parallel()
	p := testutil.NewPKI(t)
	addr, _ := testutil.StartServer(t, p, p.Identity(identity.RoleCatalog, ""), authz.Policy{})
	conn := testutil.DialTLS(t, addr, p.ClientTLS(t, p.Identity(identity.RoleNode, "ace")),
		grpc.WithDefaultCallOptions(grpc.MaxCallSendMsgSize(64)))
	_, err := healthgrpc.NewHealthClient(conn).Check(t.Context(), &healthgrpc.HealthCheckRequest{Service: strings.Repeat("x", 128)})
	if status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("oversized send: %v, want ResourceExhausted", err)
	}
}

// TestKeepaliveCompatible guards the relation the server's enforcement
// relies on: clients ping no more often than servers permit.
func TestKeepaliveCompatible(t *testing.T) {
	t.Parallel()
	if grpcclient.KeepaliveTime < grpcclient.KeepaliveMinTime {
		t.Fatalf("KeepaliveTime %s is below the servers' KeepaliveMinTime %s: servers would close connections", grpcclient.KeepaliveTime, grpcclient.KeepaliveMinTime)
	}
	if grpcclient.Backoff.BaseDelay != time.Second || grpcclient.Backoff.MaxDelay != 2*time.Minute {
		t.Fatalf("Backoff = %+v", grpcclient.Backoff)
	}
}
