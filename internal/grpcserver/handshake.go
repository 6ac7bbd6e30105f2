package grpcserver

import (
	"context"
	"crypto/tls"
	"net"
	"time"

	"google.golang.org/grpc/credentials"
)

// HandshakeTimeout bounds a connection's TLS and HTTP/2 handshakes (gRPC's
// default is 120 s): a peer that connects and says nothing is cut then.
const HandshakeTimeout = 10 * time.Second

// handshakeLimit bounds the TLS handshakes in progress (DESIGN.md §6 step
// 5: a fleet's reconnect storm queues instead of starving the server's
// CPU). A handshake takes its slot when the peer's ClientHello has arrived,
// where the costly part starts, and gives it back when it ends, whatever
// its outcome: a peer that connects and sends nothing holds no slot, so
// idle connections cannot lock every client out.
type handshakeLimit struct {
	sem chan struct{}
}

func newHandshakeLimit(n int) *handshakeLimit {
	return &handshakeLimit{sem: make(chan struct{}, n)}
}

// onHello returns a copy of cfg whose GetConfigForClient (called once the
// ClientHello is read) first takes the connection's slot.
func (l *handshakeLimit) onHello(cfg *tls.Config) *tls.Config {
	cfg = cfg.Clone()
	next := cfg.GetConfigForClient
	cfg.GetConfigForClient = func(hello *tls.ClientHelloInfo) (*tls.Config, error) {
		helloArrived(hello.Conn)
		if next != nil {
			return next(hello)
		}
		return nil, nil
	}
	return cfg
}

// creds wraps TLS credentials built from onHello's config: each server
// handshake runs on a connection that can take a slot, given back when the
// handshake returns.
func (l *handshakeLimit) creds(c credentials.TransportCredentials) credentials.TransportCredentials {
	return &limitedCreds{TransportCredentials: c, sem: l.sem}
}

type limitedCreds struct {
	credentials.TransportCredentials
	sem chan struct{}
}

// slotConn is a connection in its server handshake, holding a slot or not.
type slotConn struct {
	net.Conn
	sem  chan struct{}
	held bool
}

// helloArrived takes conn's slot, waiting for one, when conn is a
// handshake's (only the handshake's goroutine calls it).
func helloArrived(conn net.Conn) {
	if c, ok := conn.(*slotConn); ok && !c.held {
		c.sem <- struct{}{}
		c.held = true
	}
}

func (c *limitedCreds) ServerHandshake(conn net.Conn) (net.Conn, credentials.AuthInfo, error) {
	sc := &slotConn{Conn: conn, sem: c.sem}
	defer func() {
		if sc.held {
			<-c.sem
		}
	}()
	return c.TransportCredentials.ServerHandshake(sc)
}

// Clone keeps the limit (and shares its slots).
func (c *limitedCreds) Clone() credentials.TransportCredentials {
	return &limitedCreds{TransportCredentials: c.TransportCredentials.Clone(), sem: c.sem}
}

// ClientHandshake is not used by a server; it passes through.
func (c *limitedCreds) ClientHandshake(ctx context.Context, authority string, conn net.Conn) (net.Conn, credentials.AuthInfo, error) {
	return c.TransportCredentials.ClientHandshake(ctx, authority, conn)
}
