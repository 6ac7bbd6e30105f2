package procmesh

import (
	"strings"
	"testing"
	"time"
)

// TestRunEndsAHungShell ends a command that outlives its timeout together
// with the children it started, which would otherwise hold its output open
// and hang the test.
func TestRunEndsAHungShell(t *testing.T) {
	old := commandTimeout
	commandTimeout = 500 * time.Millisecond
	defer func() { commandTimeout = old }()
	start := time.Now()
	out, err := Run("", nil, "bash", "-c", "echo started; sleep 60 & sleep 60")
	if err == nil || !strings.Contains(out, "started") {
		t.Fatalf("Run = %q, %v; want the output so far and a timeout", out, err)
	}
	if took := time.Since(start); took > 20*time.Second {
		t.Errorf("Run returned after %s", took)
	}
}
