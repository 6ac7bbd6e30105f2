package natsx

import (
	"context"
	"errors"
	"testing"
	"time"
)

// TestGetAtLeast: a read at a revision known written waits for it (a
// replica behind that write answers with less, here the write comes late),
// returns a later value or delete at once, and says ErrBehind when the
// revision never comes.
func TestGetAtLeast(t *testing.T) {
	wait := atLeastWait
	atLeastWait = 300 * time.Millisecond
	t.Cleanup(func() { atLeastWait = wait })
	_, js := serverAndJS(t)
	kv := ensureKV(t, js, testSpec(1))
	ctx := context.Background()
	r1 := putValue(t, kv, "a", "1")

	if e, err := kv.GetAtLeast(ctx, "a", r1); err != nil || string(e.Value) != "1" {
		t.Fatalf("at the revision written: %q, %v", e.Value, err)
	}
	if e, err := kv.GetAtLeast(ctx, "a", 0); err != nil || string(e.Value) != "1" {
		t.Fatalf("with nothing known: %q, %v", e.Value, err)
	}
	// The write the caller knows of lands while it asks.
	go func() {
		time.Sleep(50 * time.Millisecond)
		putValue(t, kv, "a", "2")
	}()
	e, err := kv.GetAtLeast(ctx, "a", r1+1)
	if err != nil || string(e.Value) != "2" {
		t.Fatalf("a write that lands while asked: %q, %v", e.Value, err)
	}
	// Nothing comes: ErrBehind, naming the revisions.
	start := time.Now()
	if _, err := kv.GetAtLeast(ctx, "a", e.Revision+10); !errors.Is(err, ErrBehind) {
		t.Errorf("a revision that never comes: %v, want ErrBehind", err)
	} else if took := time.Since(start); took < atLeastWait {
		t.Errorf("gave up after %s, before %s", took, atLeastWait)
	}
	// A key created after: not there yet, then there.
	go func() {
		time.Sleep(50 * time.Millisecond)
		putValue(t, kv, "b", "1")
	}()
	if e, err := kv.GetAtLeast(ctx, "b", e.Revision+1); err != nil || string(e.Value) != "1" {
		t.Errorf("a key that appears while asked: %q, %v", e.Value, err)
	}
	// Deleted at or after the revision known: not found, at once.
	if err := kv.Delete(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	if _, err := kv.GetAtLeast(ctx, "a", r1); !errors.Is(err, ErrNotFound) {
		t.Errorf("deleted since: %v, want ErrNotFound", err)
	}
}
