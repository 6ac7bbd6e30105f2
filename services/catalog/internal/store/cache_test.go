package store

import (
	"testing"

	catalogv1 "mesh.dev/proto/mesh/catalog/v1"
)

func TestEntryCache(t *testing.T) {
	t.Parallel()
	c := newEntryCache(100)
	e := func(fp string) *catalogv1.Entry { return &catalogv1.Entry{Fingerprint: fp} }
	c.put("a", e("a"), 40)
	c.put("b", e("b"), 40)
	if c.get("a") == nil { // a is now the most recently used
		t.Fatal("a not cached")
	}
	c.put("c", e("c"), 40) // over 100: b, the least recently used, goes
	if c.get("b") != nil || c.get("a") == nil || c.get("c") == nil {
		t.Fatalf("eviction kept the wrong entries: %v", c.items)
	}
	if c.bytes != 80 {
		t.Errorf("bytes %d", c.bytes)
	}
	c.put("big", e("big"), 101) // larger than the cache: not cached
	if c.get("big") != nil || c.get("a") == nil {
		t.Error("an entry larger than the cache was cached")
	}
	var none *entryCache
	none.put("a", e("a"), 1)
	if none.get("a") != nil {
		t.Error("a nil cache held an entry")
	}
}
