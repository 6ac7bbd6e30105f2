package main

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	composerv1 "mesh.dev/proto/mesh/composer/v1"
)

// TestWaitConvergedIsLive: while the fleet converges, the table is printed
// again whenever a node moves, each time after a progress line; once every
// node converged the final table is printed and WaitConverged returns.
func TestWaitConvergedIsLive(t *testing.T) {
	t.Parallel()
	seen := timestamppb.New(time.Now())
	node := func(name string, converged bool, applied uint64) *composerv1.NodeStatus {
		return &composerv1.NodeStatus{Node: name, Converged: converged, ManifestRevision: 7, AppliedRevision: applied, LastSeen: seen}
	}
	steps := [][]*composerv1.NodeStatus{
		{node("ace", false, 0), node("bay", false, 0)},
		{node("ace", true, 7), node("bay", false, 0)},
		{node("ace", true, 7), node("bay", true, 7)},
	}
	var mu sync.Mutex
	calls := 0
	fetch := func(context.Context) ([]*composerv1.NodeStatus, error) {
		mu.Lock()
		defer mu.Unlock()
		st := steps[min(calls, len(steps)-1)]
		calls++
		return st, nil
	}
	var out strings.Builder
	if err := WaitConverged(context.Background(), &out, fetch, 2, false); err != nil {
		t.Fatal(err)
	}
	got := out.String()
	for _, want := range []string{"0/2 nodes converged", "1/2 nodes converged", "2/2 nodes converged"} {
		if !strings.Contains(got, want) {
			t.Errorf("no %q in:\n%s", want, got)
		}
	}
	if n := strings.Count(got, "NODE "); n != 3 {
		t.Errorf("the table was printed %d times, want 3 (each state once):\n%s", n, got)
	}
	last := got[strings.LastIndex(got, "NODE "):]
	if !strings.Contains(last, "bay   r7/r7") || strings.Contains(last, "CONVERGING") {
		t.Errorf("the last table does not show every node converged:\n%s", last)
	}
}
