package lru

import "testing"

// TestCache: the least recently used goes first once over the bound, a
// value larger than the bound is not kept, a value put again replaces the
// one held (and its size), Delete drops one, and a nil cache holds nothing.
func TestCache(t *testing.T) {
	t.Parallel()
	c := New[string](100)
	c.Put("a", "a1", 40)
	c.Put("b", "b1", 40)
	if _, ok := c.Get("a"); !ok { // a is now the most recently used
		t.Fatal("a not cached")
	}
	c.Put("c", "c1", 40) // over 100: b, the least recently used, goes
	_, b := c.Get("b")
	_, a := c.Get("a")
	_, cc := c.Get("c")
	if b || !a || !cc {
		t.Fatalf("eviction kept the wrong values: b %v a %v c %v", b, a, cc)
	}
	if c.Bytes() != 80 {
		t.Errorf("bytes %d", c.Bytes())
	}
	c.Put("big", "big", 101) // larger than the cache: not cached
	if _, ok := c.Get("big"); ok {
		t.Error("a value larger than the cache was cached")
	}
	if _, ok := c.Get("a"); !ok {
		t.Error("a value larger than the cache pushed others out")
	}
	c.Put("a", "a2", 50)
	if v, _ := c.Get("a"); v != "a2" || c.Bytes() != 90 {
		t.Errorf("put again: %q, %d bytes; want a2, 90", v, c.Bytes())
	}
	c.Delete("a")
	c.Delete("absent")
	if _, ok := c.Get("a"); ok || c.Bytes() != 40 {
		t.Errorf("after Delete: a held %v, %d bytes; want none, 40", ok, c.Bytes())
	}
	c.Reset()
	if _, ok := c.Get("a"); ok || c.Bytes() != 0 {
		t.Error("values kept past Reset")
	}
	var none *Cache[string]
	none.Put("a", "a", 1)
	none.Delete("a")
	if _, ok := none.Get("a"); ok {
		t.Error("a nil cache held a value")
	}
}
