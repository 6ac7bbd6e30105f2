package grpcserver_test

import (
	"context"
	"net"
	"testing"
	"time"

	"google.golang.org/grpc"
	healthgrpc "google.golang.org/grpc/health/grpc_health_v1"

	"mesh.dev/internal/grpcserver"
	"mesh.dev/internal/identity"
	"mesh.dev/internal/testutil"
	signerv1 "mesh.dev/proto/mesh/signer/v1"
)

// TestIdleConnectionsDoNotStarveHandshakes: an unauthenticated peer that
// opens DefaultMaxConcurrentHandshakes TCP connections and sends nothing
// does not lock a legitimate client out: a handshake takes its slot only
// once the ClientHello arrived. (They held one each until the connection
// timeout, 120 s by gRPC's default; the client here waits 3 s, under
// HandshakeTimeout.)
func TestIdleConnectionsDoNotStarveHandshakes(t *testing.T) {
	t.Parallel()
	p := testutil.NewPKI(t)
	_, addr, _, _ := serve(t, p, grpcserver.Config{}, signerv1.UnimplementedSignerServiceServer{})
	for range grpcserver.DefaultMaxConcurrentHandshakes {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close() // never sends a ClientHello
	}
	time.Sleep(200 * time.Millisecond)
	conn := testutil.DialTLS(t, addr, p.ClientTLS(t, p.Identity(identity.RoleOperator, "ops")))
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	if _, err := healthgrpc.NewHealthClient(conn).Check(ctx, &healthgrpc.HealthCheckRequest{}, grpc.WaitForReady(true)); err != nil {
		t.Fatalf("a legitimate client with a valid certificate got %v while %d idle TCP connections were open", err, grpcserver.DefaultMaxConcurrentHandshakes)
	}
}
