package store

import (
	"container/list"
	"sync"

	catalogv1 "mesh.dev/proto/mesh/catalog/v1"
)

// entryCache is a least-recently-used cache of entries bounded by their
// encoded size. Entries never change once written, so it needs no
// invalidation. A nil cache holds nothing.
type entryCache struct {
	mu    sync.Mutex
	max   int
	bytes int
	order *list.List // front: most recently used
	items map[string]*list.Element
}

type cached struct {
	fp    string
	entry *catalogv1.Entry
	size  int
}

func newEntryCache(maxBytes int) *entryCache {
	return &entryCache{max: maxBytes, order: list.New(), items: map[string]*list.Element{}}
}

func (c *entryCache) get(fp string) *catalogv1.Entry {
	if c == nil {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	el, ok := c.items[fp]
	if !ok {
		return nil
	}
	c.order.MoveToFront(el)
	return el.Value.(*cached).entry
}

func (c *entryCache) put(fp string, e *catalogv1.Entry, size int) {
	if c == nil || size > c.max {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if el, ok := c.items[fp]; ok {
		c.order.MoveToFront(el)
		return
	}
	c.items[fp] = c.order.PushFront(&cached{fp: fp, entry: e, size: size})
	c.bytes += size
	for c.bytes > c.max {
		last := c.order.Back()
		v := last.Value.(*cached)
		c.order.Remove(last)
		delete(c.items, v.fp)
		c.bytes -= v.size
	}
}

// reset drops every cached entry (the store went back: an entry it held may
// be gone).
func (c *entryCache) reset() {
	if c == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.order.Init()
	c.items = map[string]*list.Element{}
	c.bytes = 0
}
