package reconcile

import (
	"context"
	"errors"
	"testing"
	"time"
)

// TestFailedDeleteIsVisitedAgain: a node whose spec was deleted is passed
// over by DeleteNode (its assignment, compositions, haves and status go).
// When that fails (a lease margin check, a KV error during a leader
// election), it is visited again when due, like a node with a spec whose
// pass failed: otherwise the deleted node's assignment stays and Sync keeps
// serving its manifest. Once it succeeds, it is not visited again.
func TestFailedDeleteIsVisitedAgain(t *testing.T) {
	t.Parallel()
	now := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	r := New(Config{Now: func() time.Time { return now }})
	// The spec watch saw the delete; the node's pass (DeleteNode) ran and
	// failed.
	r.mu.Lock()
	r.running["gone"] = true
	r.mu.Unlock()
	r.done("gone", nil, errors.New("gone: delete assignment: nats: timeout"))
	now = now.Add(10 * time.Minute)
	r.visitDue()
	if n := r.Pending(); n == 0 {
		t.Fatalf("a failed DeleteNode is never tried again (nothing pending 10 min later; next visit %v, nodes %v)", r.nextVisit["gone"], r.Nodes())
	}
	// A worker takes the visit, and the delete succeeds.
	node, _, _ := r.next(context.Background())
	r.done(node, nil, nil)
	now = now.Add(time.Hour)
	r.visitDue()
	if r.Pending() != 0 {
		t.Errorf("a node deleted whole is visited again")
	}
}
