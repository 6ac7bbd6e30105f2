package natsx

import (
	"context"
	"errors"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// lossyProxy forwards TCP connections to a server. Once told to lose
// replies, the connections it holds forward what the client sends and drop
// what the server answers; reset then closes them, as a server restart
// does, and the client's next connection is forwarded whole.
type lossyProxy struct {
	lis    net.Listener
	target string
	mu     sync.Mutex
	conns  []net.Conn
	losing atomic.Bool
	// sentWhileLosing counts the bytes the client sent once replies were
	// being lost.
	sentWhileLosing atomic.Int64
}

func newLossyProxy(t *testing.T, target string) *lossyProxy {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &lossyProxy{lis: lis, target: target}
	t.Cleanup(func() {
		lis.Close()
		p.reset()
	})
	go p.serve()
	return p
}

func (p *lossyProxy) url() string { return "nats://" + p.lis.Addr().String() }

func (p *lossyProxy) serve() {
	for {
		in, err := p.lis.Accept()
		if err != nil {
			return
		}
		out, err := net.Dial("tcp", p.target)
		if err != nil {
			in.Close()
			continue
		}
		p.mu.Lock()
		p.conns = append(p.conns, in, out)
		p.mu.Unlock()
		go func() {
			buf := make([]byte, 32<<10)
			for {
				n, err := in.Read(buf)
				if n > 0 {
					if p.losing.Load() {
						p.sentWhileLosing.Add(int64(n))
					}
					if _, werr := out.Write(buf[:n]); werr != nil {
						return
					}
				}
				if err != nil {
					out.Close()
					return
				}
			}
		}()
		go func() {
			buf := make([]byte, 32<<10)
			for {
				n, err := out.Read(buf)
				if n > 0 && !p.losing.Load() {
					if _, werr := in.Write(buf[:n]); werr != nil {
						return
					}
				}
				if err != nil {
					in.Close()
					return
				}
			}
		}()
	}
}

// loseReplies makes the connections held drop what the server sends.
func (p *lossyProxy) loseReplies() { p.losing.Store(true) }

// reset closes every connection held; later ones are forwarded whole.
func (p *lossyProxy) reset() {
	p.mu.Lock()
	conns := p.conns
	p.conns = nil
	p.mu.Unlock()
	p.losing.Store(false)
	for _, c := range conns {
		c.Close()
	}
}

// TestRequestReplyLostWithItsConnection: a read or a write whose reply is
// lost with the connection it went out on (a server restart, a leader
// change) fails within RequestTimeout although the caller gave it minutes,
// and the same call succeeds once the connection is back. nats.go would
// otherwise wait for the caller's deadline: the composer answering an
// engine's fetch held the engine's whole pass for its 5 minutes.
func TestRequestReplyLostWithItsConnection(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		op   func(ctx context.Context, kv *KV, rev uint64) error
	}{
		{"read from the leader", func(ctx context.Context, kv *KV, _ uint64) error {
			_, err := kv.Get(ctx, "k")
			return err
		}},
		{"compare-and-set write", func(ctx context.Context, kv *KV, rev uint64) error {
			_, err := kv.Update(ctx, "k", []byte("next"), rev)
			if errors.Is(err, ErrConflict) {
				// The write lost its acknowledgement the first time but
				// was made: the next one conflicts, as it must.
				return nil
			}
			return err
		}},
		{"stream info", func(ctx context.Context, kv *KV, _ uint64) error {
			_, err := kv.LastSequence(ctx)
			return err
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			e := startServer(t, EmbeddedConfig{})
			p := newLossyProxy(t, strings.TrimPrefix(e.ClientURL(), "nats://"))
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			nc, js, err := Connect(ctx, ConnConfig{URL: p.url(), Name: t.Name(), Logger: discardLogger})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(nc.Close)
			spec := testSpec(1)
			spec.LeaderReads = true
			kv := ensureKV(t, js, spec)
			rev, err := kv.Put(ctx, "k", []byte("v"))
			if err != nil {
				t.Fatal(err)
			}

			p.loseReplies()
			long, cancelLong := context.WithTimeout(context.Background(), 5*RequestTimeout)
			defer cancelLong()
			start := time.Now()
			errc := make(chan error, 1)
			go func() { errc <- tt.op(long, kv, rev) }()
			waitFor(t, 10*time.Second, "the request sent", func() bool { return p.sentWhileLosing.Load() > 0 })
			p.reset()
			select {
			case err := <-errc:
				if err == nil || !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "no reply within "+RequestTimeout.String()) {
					t.Fatalf("a request whose reply was lost: %v, want no reply within %s", err, RequestTimeout)
				}
				if d := time.Since(start); d > RequestTimeout+5*time.Second {
					t.Fatalf("it failed after %s, not within %s", d, RequestTimeout)
				}
			case <-time.After(RequestTimeout + 5*time.Second):
				t.Fatalf("a request whose reply was lost still waits after %s (its caller gave it %s)", RequestTimeout+5*time.Second, 5*RequestTimeout)
			}
			waitFor(t, 20*time.Second, "reconnected", nc.IsConnected)
			if err := tt.op(long, kv, rev); err != nil {
				t.Fatalf("once reconnected: %v", err)
			}
		})
	}
}
