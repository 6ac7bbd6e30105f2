package testutil

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"sync"
	"testing"
)

// handedOut are the ports FreePort returned in this process: each only
// once, since nothing binds them until the caller starts its server.
var handedOut sync.Map

// FreePort returns a loopback TCP port nothing listens on now, for a server
// the test starts later (a child process, a container). It is picked below
// the kernel's ephemeral range: a port the kernel hands out for port 0 can
// be taken by any outgoing connection of the tests running beside this one
// before the server binds it ("address already in use"); one below the
// range is only ever taken by an explicit bind.
func FreePort(t testing.TB) int {
	t.Helper()
	lo := ephemeralLow()
	for range 500 {
		port := 10000 + rand.IntN(lo-10000)
		if _, taken := handedOut.LoadOrStore(port, true); taken {
			continue
		}
		l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
		if err != nil {
			continue
		}
		l.Close()
		return port
	}
	t.Fatalf("no free loopback port between 10000 and %d", lo)
	return 0
}

// FreeAddr is FreePort as a loopback address.
func FreeAddr(t testing.TB) string {
	t.Helper()
	return fmt.Sprintf("127.0.0.1:%d", FreePort(t))
}

// ephemeralLow is the low end of the kernel's ephemeral port range (Linux's
// default when it cannot be read).
func ephemeralLow() int {
	lo := 32768
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		var a, z int
		if n, _ := fmt.Sscan(string(b), &a, &z); n == 2 && a > 10000+1000 {
			lo = a
		}
	}
	return lo
}
