package syncsvc

import (
	"context"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"mesh.dev/internal/testutil"
	composerv1 "mesh.dev/proto/mesh/composer/v1"
	"mesh.dev/services/composer/internal/store"
)

// TestHubLagJudgedAfterTheStoreWentBack: the assignments stream goes back
// to an older snapshot (acknowledged writes lost, their sequences handed
// out again). Once the hub's watch started over, its lag is judged from
// what it delivers since, not from the revisions it saw before: a watch
// falling behind the stream then is seen as behind, not hidden until the
// stream grows past the old high.
func TestHubLagJudgedAfterTheStoreWentBack(t *testing.T) {
	e := testutil.StartJetStream(t)
	_, js := testutil.ConnectJetStream(t, e)
	ctx := context.Background()
	st, err := store.Open(ctx, js, 1, 10*time.Second, nil)
	if err != nil {
		t.Fatal(err)
	}
	write := func(node string) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for {
			_, err := st.WriteAssignment(ctx, &composerv1.Assignment{Node: node, ManifestRevision: 1}, 0)
			if err == nil {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("write the assignment of %s: %v", node, err)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	write("ace")
	hub := NewHub(st, slog.New(slog.DiscardHandler))
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- hub.Run(runCtx) }()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	waitFor(t, "the hub caught up", hub.Healthy)
	e, snap := testutil.SnapshotJetStream(t, e)
	for i := range 20 {
		write(fmt.Sprintf("n%02d", i))
	}
	seen := func() uint64 {
		hub.mu.Lock()
		defer hub.mu.Unlock()
		return hub.seenRev
	}
	high, err := st.Assignments.LastSequence(ctx)
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the hub saw the 20 writes", func() bool { return seen() == high })
	testutil.RollbackJetStream(t, e, snap)
	var last uint64
	waitFor(t, "the hub's watch started over", func() bool {
		var err error
		last, err = st.Assignments.LastSequence(ctx)
		hub.mu.Lock()
		defer hub.mu.Unlock()
		return err == nil && last < high && hub.caughtUp && hub.seenRev == last
	})
	if hub.assignment("n00") != nil {
		t.Errorf("the hub still holds an assignment the store lost")
	}
}
