package grpcserver

import (
	"errors"
	"net"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/credentials"
)

// blockingCreds stands for TLS: each server handshake waits until the test
// ends it, and the creds record how many ran at once.
type blockingCreds struct {
	credentials.TransportCredentials
	entered chan struct{}
	release chan error

	mu             sync.Mutex
	inFlight, peak int
}

func (c *blockingCreds) ServerHandshake(conn net.Conn) (net.Conn, credentials.AuthInfo, error) {
	// The ClientHello read: TLS calls the config's GetConfigForClient.
	helloArrived(conn)
	c.mu.Lock()
	c.inFlight++
	c.peak = max(c.peak, c.inFlight)
	c.mu.Unlock()
	c.entered <- struct{}{}
	err := <-c.release
	c.mu.Lock()
	c.inFlight--
	c.mu.Unlock()
	return conn, nil, err
}

func (c *blockingCreds) Clone() credentials.TransportCredentials { return c }

// TestHandshakeLimit: at most the limit of server handshakes run at once
// (DESIGN.md §6 step 5: a reconnect storm of a fleet queues), the others
// wait for a slot, and a slot is given back when a handshake fails as when
// it succeeds, also through a clone of the credentials.
func TestHandshakeLimit(t *testing.T) {
	t.Parallel()
	const limit, total = 2, 7
	inner := &blockingCreds{entered: make(chan struct{}), release: make(chan error)}
	creds := newHandshakeLimit(limit).creds(inner)
	clone := creds.Clone()
	done := make(chan error, total)
	for i := range total {
		c := creds
		if i%2 == 1 {
			c = clone
		}
		go func() {
			server, client := net.Pipe()
			defer client.Close()
			_, _, err := c.ServerHandshake(server)
			done <- err
		}()
	}
	deadline := time.After(20 * time.Second)
	enter := func(i int) {
		select {
		case <-inner.entered:
		case <-deadline:
			t.Fatalf("handshake %d did not start: a slot was not given back", i+1)
		}
	}
	// The limit's handshakes start; each one ended lets the next start.
	// Every other one fails: its slot must come back too.
	for i := range limit {
		enter(i)
	}
	for i := range total {
		var err error
		if i%2 == 0 {
			err = errors.New("bad certificate")
		}
		inner.release <- err
		if i+limit < total {
			enter(i + limit)
		}
	}
	for range total {
		<-done
	}
	inner.mu.Lock()
	defer inner.mu.Unlock()
	if inner.peak != limit {
		t.Errorf("%d handshakes ran at once, want the limit, %d", inner.peak, limit)
	}
}
