// Package natsprobe connects to a NATS server as the user a certificate
// maps to (verify_and_map) and checks what that user is refused: a refused
// JetStream request gets no reply, only an asynchronous permissions
// violation, which a User hears.
package natsprobe

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// User is a connection as one NATS user.
type User struct {
	JS      jetstream.JetStream
	nc      *nats.Conn
	refusal chan string
}

// Connect connects over TLS 1.3 to url with the CA, certificate and key
// files.
func Connect(ctx context.Context, url, name, ca, cert, key string) (*User, error) {
	u := &User{refusal: make(chan string, 64)}
	opts := []nats.Option{
		nats.Name(name), nats.Secure(&tls.Config{MinVersion: tls.VersionTLS13}),
		nats.RootCAs(ca), nats.ClientCert(cert, key), nats.MaxReconnects(-1),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			if errors.Is(err, nats.ErrPermissionViolation) {
				select {
				case u.refusal <- err.Error():
				default:
				}
			}
		}),
	}
	type result struct {
		nc  *nats.Conn
		err error
	}
	done := make(chan result, 1)
	go func() {
		nc, err := nats.Connect(url, opts...)
		done <- result{nc, err}
	}()
	select {
	case r := <-done:
		if r.err != nil {
			return nil, fmt.Errorf("nats connect to %s: %w", url, r.err)
		}
		u.nc = r.nc
	case <-ctx.Done():
		go func() {
			if r := <-done; r.nc != nil {
				r.nc.Close()
			}
		}()
		return nil, ctx.Err()
	}
	js, err := jetstream.New(u.nc)
	if err != nil {
		u.nc.Close()
		return nil, err
	}
	u.JS = js
	return u, nil
}

// Close closes the connection.
func (u *User) Close() { u.nc.Close() }

// Refused runs do and returns nil once the server refuses this user the
// publish to subject; an error when do succeeds, or when no such refusal
// comes within timeout.
func (u *User) Refused(ctx context.Context, timeout time.Duration, subject string, do func(context.Context, jetstream.JetStream) error) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- do(ctx, u.JS) }()
	for {
		select {
		case v := <-u.refusal:
			if strings.Contains(v, `"`+subject+`"`) {
				return nil
			}
		case err := <-done:
			if err == nil {
				return fmt.Errorf("%s: allowed", subject)
			}
			done = nil // failed (refused, or the deadline): the violation says which
		case <-ctx.Done():
			return fmt.Errorf("%s: no permissions violation within %s", subject, timeout)
		}
	}
}
