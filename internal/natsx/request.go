package natsx

import (
	"context"
	"fmt"
	"time"
)

// RequestTimeout bounds how long one JetStream request — a read, the
// acknowledgement of a write, a stream's info — waits for its reply,
// whatever the caller's deadline: the 5 s nats.go gives a request made
// without one. nats.go sends a request once and does not fail it when the
// connection it went out on is lost: a reply lost to a server restart or a
// leader change would hold a caller with a longer deadline until that
// deadline — minutes for an engine's fetch served from JetStream — while
// the connection is long back. A caller with time left asks again; a write
// whose acknowledgement timed out may have been made, which every writer
// here finds out by reading again (they write with compare-and-set, or
// values that can be written twice).
const RequestTimeout = 5 * time.Second

// Request runs one JetStream request under RequestTimeout; every KV read,
// write and status of this package does (listings and watches stream and are
// not requests), and callers that use a nats.go handle directly should.
// A request cut by it (not by the caller's context) says so in its error.
func Request[T any](ctx context.Context, do func(context.Context) (T, error)) (T, error) {
	rctx, cancel := context.WithTimeout(ctx, RequestTimeout)
	defer cancel()
	v, err := do(rctx)
	if err != nil && ctx.Err() == nil && rctx.Err() != nil {
		err = fmt.Errorf("no reply within %s: %w", RequestTimeout, err)
	}
	return v, err
}
