package audit

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
)

func writeN(t *testing.T, path string, n int) {
	t.Helper()
	l, _, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < n; i++ {
		if _, err := l.Append(Record{Kind: KindRequest, Method: "SignCompositions", Items: []Item{{Digest: "sha256:aa", Key: "ace.node"}}}); err != nil {
			t.Fatal(err)
		}
	}
	l.Close()
}

func TestChainVerifies(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "audit.log")
	writeN(t, path, 5)
	// Reopen and continue: the chain carries on across restarts.
	writeN(t, path, 3)
	rep, err := Verify(path)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Records != 8 || rep.Last.Seq != 8 || rep.Torn {
		t.Fatalf("report %+v", rep)
	}
}

func TestVerifyNamesTheBreak(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name   string
		edit   func(lines []string) []string
		line   int
		reason string
	}{
		{"edited record", func(l []string) []string {
			l[2] = strings.Replace(l[2], "ace.node", "bob.node", 1)
			return l
		}, 3, "does not match its hash"},
		{"removed record", func(l []string) []string { return append(l[:1], l[2:]...) }, 2, "seq 3 follows 1"},
		{"reordered records", func(l []string) []string { l[1], l[2] = l[2], l[1]; return l }, 2, "seq 3 follows 1"},
		{"garbage line", func(l []string) []string { l[3] = "{not json"; return l }, 4, "not a record"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			path := filepath.Join(t.TempDir(), "audit.log")
			writeN(t, path, 5)
			b, _ := os.ReadFile(path)
			lines := strings.Split(strings.TrimSuffix(string(b), "\n"), "\n")
			lines = c.edit(lines)
			os.WriteFile(path, []byte(strings.Join(lines, "\n")+"\n"), 0o600)
			_, err := Verify(path)
			var be *BreakError
			if !errors.As(err, &be) || be.Line != c.line || !strings.Contains(be.Reason, c.reason) {
				t.Fatalf("Verify = %v, want a break at line %d: %s", err, c.line, c.reason)
			}
			if _, _, err := Open(path); err == nil {
				t.Error("Open accepted a broken chain")
			}
		})
	}
}

func TestTornTailIsCut(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "audit.log")
	writeN(t, path, 3)
	f, _ := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
	f.WriteString(`{"seq":4,"time":"2026-`)
	f.Close()
	rep, err := Verify(path)
	if err != nil || !rep.Torn || rep.Records != 3 {
		t.Fatalf("Verify of a torn tail = %+v, %v", rep, err)
	}
	l, torn, err := Open(path)
	if err != nil || !torn {
		t.Fatalf("Open = %v, torn %v", err, torn)
	}
	r, err := l.Append(Record{Kind: KindStart})
	if err != nil || r.Seq != 4 {
		t.Fatalf("Append after a torn tail = %+v, %v", r, err)
	}
	l.Close()
	if rep, err := Verify(path); err != nil || rep.Torn || rep.Records != 4 {
		t.Fatalf("after repair: %+v, %v", rep, err)
	}
}

// TestFailedAppendStopsTheLog: an append whose write fails and cannot be cut
// off leaves the log refusing appends, so no record is ever written after a
// partial one (which would break the chain and stop the signer's next start).
func TestFailedAppendStopsTheLog(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "audit.log")
	writeN(t, path, 2)
	l, _, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	l.f.Close() // every write, truncate and fsync now fails
	if _, err := l.Append(Record{Kind: KindStart}); err == nil || !strings.Contains(err.Error(), "write audit record") {
		t.Fatalf("Append on a failing file = %v, want the write error", err)
	}
	if _, err := l.Append(Record{Kind: KindStart}); err == nil || !strings.Contains(err.Error(), "refuses appends after an earlier failure") {
		t.Fatalf("Append after a failed one = %v, want a refusal", err)
	}
	if rep, err := Verify(path); err != nil || rep.Records != 2 || rep.Torn {
		t.Fatalf("the log after the failures: %+v, %v", rep, err)
	}
}

// appendsWhileSyncing opens a log whose first fsync waits until n more
// appends have written their records (they then wait on an fsync), and
// starts those appends. It returns the fsyncs counted, the first append's
// error and the others' errors, once all have returned; fail makes the
// fsyncs after the first fail.
func appendsWhileSyncing(t *testing.T, path string, n int, fail bool) (syncs int32, first error, rest []error) {
	t.Helper()
	l, _, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	var count atomic.Int32
	release := make(chan struct{})
	l.sync = func(f *os.File) error {
		if count.Add(1) == 1 {
			<-release
			return f.Sync()
		}
		if fail {
			return errors.New("the disk went away")
		}
		return f.Sync()
	}
	firstDone := make(chan error, 1)
	go func() {
		_, err := l.Append(Record{Kind: KindStart})
		firstDone <- err
	}()
	for count.Load() == 0 {
		runtime.Gosched()
	}
	errs := make(chan error, n)
	for range n {
		go func() {
			_, err := l.Append(Record{Kind: KindRequest, Method: "SignCompositions"})
			errs <- err
		}()
	}
	// Released once every append has written its record.
	for {
		l.mu.Lock()
		seq := l.seq
		l.mu.Unlock()
		if seq == uint64(1+n) {
			break
		}
		runtime.Gosched()
	}
	close(release)
	first = <-firstDone
	for range n {
		rest = append(rest, <-errs)
	}
	return count.Load(), first, rest
}

// TestAppendsAtOnceShareAnFsync: appends made while an fsync runs wait for
// the next one, which covers them all; each returns only once durable, and
// the chain holds in the order they were written.
func TestAppendsAtOnceShareAnFsync(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "audit.log")
	syncs, first, rest := appendsWhileSyncing(t, path, 8, false)
	if first != nil {
		t.Fatal(first)
	}
	for _, err := range rest {
		if err != nil {
			t.Fatal(err)
		}
	}
	if syncs != 2 {
		t.Fatalf("%d fsyncs for 9 appends, 8 of them made during the first: want 2", syncs)
	}
	rep, err := Verify(path)
	if err != nil || rep.Records != 9 || rep.Torn {
		t.Fatalf("the log: %+v, %v", rep, err)
	}
}

// TestFailedSharedFsyncAcknowledgesNone: when the fsync covering several
// appends fails, none of them is acknowledged and the log takes no more.
func TestFailedSharedFsyncAcknowledgesNone(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "audit.log")
	syncs, first, rest := appendsWhileSyncing(t, path, 4, true)
	if first != nil {
		t.Fatalf("the append the first fsync covered: %v", first)
	}
	for i, err := range rest {
		if err == nil || !strings.Contains(err.Error(), "fsync audit record") && !strings.Contains(err.Error(), "refuses appends") {
			t.Fatalf("append %d after a failed fsync: %v, want it refused", i, err)
		}
	}
	if syncs != 2 {
		t.Fatalf("%d fsyncs: the failed one is tried once, then the log refuses", syncs)
	}
}

// BenchmarkAppend appends records of 100 items, from one caller and from
// 8 at once (the composer keeps up to 4 requests of each kind in flight,
// 2 records each): ns/op is per record, each durable when Append returns.
func BenchmarkAppend(b *testing.B) {
	items := make([]Item, 100)
	for i := range items {
		items[i] = Item{Digest: "sha256:" + strings.Repeat("ab", 32), Key: "ace.web.0123456789abcdef"}
	}
	for _, callers := range []int{1, 8} {
		b.Run(fmt.Sprintf("callers=%d", callers), func(b *testing.B) {
			l, _, err := Open(filepath.Join(b.TempDir(), "audit.log"))
			if err != nil {
				b.Fatal(err)
			}
			defer l.Close()
			b.SetParallelism(max(1, callers/runtime.GOMAXPROCS(0)))
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if _, err := l.Append(Record{Kind: KindRequest, Method: "SignCompositions", Items: items}); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	}
}
