package composertest

import (
	"context"
	"errors"
	"testing"
	"time"

	"google.golang.org/grpc"

	"mesh.dev/internal/identity"
	composerv1 "mesh.dev/proto/mesh/composer/v1"
)

// Engine is a small client of the Sync protocol (DESIGN.md §6) speaking as
// a node over real mTLS: it sends Hello and Reports and reads what the
// composer sends only when asked to (so it can also play an engine that
// stops reading).
type Engine struct {
	Node    string
	stream  grpc.BidiStreamingClient[composerv1.SyncRequest, composerv1.SyncResponse]
	cancel  context.CancelFunc
	pending chan received
}

// Dial opens a Sync stream to addr as node name and sends hello. Extra dial
// options configure the connection (a small flow-control window, say).
func (w *World) Dial(t testing.TB, addr, name string, hello *composerv1.Hello, opts ...grpc.DialOption) *Engine {
	t.Helper()
	var conn *grpc.ClientConn
	if len(opts) == 0 {
		conn = w.As(t, addr, identity.RoleNode, name)
	} else {
		cfg := w.PKI.ClientTLS(t, w.PKI.Identity(identity.RoleNode, name))
		conn = dialTLS(t, addr, cfg, opts...)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	stream, err := composerv1.NewSyncServiceClient(conn).Sync(ctx)
	Must(t, err)
	Must(t, stream.Send(&composerv1.SyncRequest{Msg: &composerv1.SyncRequest_Hello{Hello: hello}}))
	return &Engine{Node: name, stream: stream, cancel: cancel}
}

type received struct {
	msg *composerv1.SyncResponse
	err error
}

// Recv returns the next message, or an error: the stream's end, or
// errNothing when nothing came within d (the receive goes on, and its
// message is returned by the next Recv).
func (e *Engine) Recv(d time.Duration) (*composerv1.SyncResponse, error) {
	if e.pending == nil {
		e.pending = make(chan received, 1)
		go func() {
			m, err := e.stream.Recv()
			e.pending <- received{m, err}
		}()
	}
	select {
	case r := <-e.pending:
		e.pending = nil
		return r.msg, r.err
	case <-time.After(d):
		return nil, ErrNothing
	}
}

// ErrNothing is Recv's error when nothing came in time.
var ErrNothing = errors.New("nothing received in time")

// Report sends a report.
func (e *Engine) Report(t testing.TB, r *composerv1.Report) {
	t.Helper()
	Must(t, e.stream.Send(&composerv1.SyncRequest{Msg: &composerv1.SyncRequest_Report{Report: r}}))
}

// Close ends the stream.
func (e *Engine) Close() { e.cancel() }
