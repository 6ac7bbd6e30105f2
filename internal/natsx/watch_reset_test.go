package natsx

import (
	"fmt"
	"testing"
	"time"
)

// TestInitialMarkerAfterAConsumerReset: nats.go's ordered consumer
// recreates itself after a server restart by start sequence, so in a bucket
// that keeps history it delivers superseded revisions too; the watch counts
// the initial values again from the new consumer's pending count, and the
// initial-values-done marker comes only after the latest value of every key
// (it once came before, counted against the first consumer's count).
func TestInitialMarkerAfterAConsumerReset(t *testing.T) {
	r := newStoreRollback(t)
	_, js := connect(t, r.e)
	kv := ensureKV(t, js, testSpec(5))
	const keys = 300
	for i := range keys {
		for v := range 3 {
			putValue(t, kv, fmt.Sprintf("k%03d", i), fmt.Sprint(v))
		}
	}
	w, err := kv.Watch(t.Context(), ">")
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	seen := map[string]bool{}
	for range 10 {
		e := next(t, w)
		seen[e.Key] = true
	}
	time.Sleep(200 * time.Millisecond) // the delivery loop fills its channel
	r.e.Shutdown()
	r.e = startServer(t, r.e.Config())
	reachable(t, kv)
	for {
		e := next(t, w)
		if e == nil {
			break
		}
		seen[e.Key] = true
	}
	if len(seen) != keys {
		t.Fatalf("the initial-values-done marker came after %d of the %d keys", len(seen), keys)
	}
}
