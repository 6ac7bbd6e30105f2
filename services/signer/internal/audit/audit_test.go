package audit

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
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
