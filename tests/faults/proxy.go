package faults

import (
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// Proxy forwards an engine's connections to the composer replicas (any
// replica serves Sync), so that the harness can cut the engine off the
// composers and heal it, as a partition would. A new connection goes to the
// next replica that accepts it, round robin.
type Proxy struct {
	lis net.Listener

	mu      sync.Mutex
	targets []string
	next    int
	cut     bool
	conns   map[net.Conn]struct{}
	closed  bool

	// toEngine counts the bytes forwarded from the composers to the engine.
	toEngine atomic.Int64
}

// ToEngine is how many bytes the proxy forwarded from the composers to the
// engine so far.
func (p *Proxy) ToEngine() int64 { return p.toEngine.Load() }

type countingWriter struct {
	w io.Writer
	n *atomic.Int64
}

func (c countingWriter) Write(b []byte) (int, error) {
	n, err := c.w.Write(b)
	c.n.Add(int64(n))
	return n, err
}

// NewProxy listens on a free loopback port.
func NewProxy(targets []string) (*Proxy, error) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &Proxy{lis: lis, targets: targets, conns: map[net.Conn]struct{}{}}
	go p.serve()
	return p, nil
}

// Addr is the address engines dial.
func (p *Proxy) Addr() string { return p.lis.Addr().String() }

// Cut drops every connection through the proxy and refuses new ones until
// Heal.
func (p *Proxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = true
	for c := range p.conns {
		c.Close()
	}
}

// Heal lets connections through again.
func (p *Proxy) Heal() {
	p.mu.Lock()
	p.cut = false
	p.mu.Unlock()
}

// Close stops the proxy.
func (p *Proxy) Close() {
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	p.lis.Close()
	p.Cut()
}

func (p *Proxy) serve() {
	for {
		c, err := p.lis.Accept()
		if err != nil {
			return
		}
		go p.handle(c)
	}
}

func (p *Proxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cut || p.closed {
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *Proxy) untrack(c net.Conn) {
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
}

func (p *Proxy) handle(in net.Conn) {
	if !p.track(in) {
		in.Close()
		return
	}
	defer p.untrack(in)
	out, err := p.dial()
	if err != nil {
		in.Close()
		return
	}
	if !p.track(out) {
		in.Close()
		out.Close()
		return
	}
	defer p.untrack(out)
	var wg sync.WaitGroup
	wg.Add(2)
	pipe := func(dst, src net.Conn, w io.Writer) {
		defer wg.Done()
		_, _ = io.Copy(w, src)
		dst.Close()
		src.Close()
	}
	go pipe(out, in, out)
	go pipe(in, out, countingWriter{w: in, n: &p.toEngine})
	wg.Wait()
}

// dial connects to the next replica that accepts.
func (p *Proxy) dial() (net.Conn, error) {
	p.mu.Lock()
	targets := append([]string(nil), p.targets...)
	start := p.next
	p.next++
	p.mu.Unlock()
	for i := range targets {
		c, err := net.DialTimeout("tcp", targets[(start+i)%len(targets)], time.Second)
		if err == nil {
			return c, nil
		}
	}
	return nil, errors.New("no composer replica accepts connections")
}
