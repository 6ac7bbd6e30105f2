package grpcserver

import (
	"context"
	"net"

	"google.golang.org/grpc/credentials"
)

// limitedCreds bounds concurrent server handshakes with a semaphore.
type limitedCreds struct {
	credentials.TransportCredentials
	sem chan struct{}
}

func limitHandshakes(c credentials.TransportCredentials, n int) credentials.TransportCredentials {
	return &limitedCreds{TransportCredentials: c, sem: make(chan struct{}, n)}
}

// ServerHandshake waits for a slot, then does the TLS handshake. The slot is
// released when the handshake ends, whatever its outcome.
func (c *limitedCreds) ServerHandshake(conn net.Conn) (net.Conn, credentials.AuthInfo, error) {
	c.sem <- struct{}{}
	defer func() { <-c.sem }()
	return c.TransportCredentials.ServerHandshake(conn)
}

// Clone keeps the limit (and shares its slots).
func (c *limitedCreds) Clone() credentials.TransportCredentials {
	return &limitedCreds{TransportCredentials: c.TransportCredentials.Clone(), sem: c.sem}
}

// ClientHandshake is not used by a server; it passes through.
func (c *limitedCreds) ClientHandshake(ctx context.Context, authority string, conn net.Conn) (net.Conn, credentials.AuthInfo, error) {
	return c.TransportCredentials.ClientHandshake(ctx, authority, conn)
}
