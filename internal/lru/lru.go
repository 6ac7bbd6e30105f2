// Package lru is a least-recently-used cache bounded by the bytes its
// values take, as their owner counts them: the catalog's entries and the
// composer's compositions are kept in one each.
package lru

import (
	"container/list"
	"sync"
)

// Cache holds values by key, most recently used first, dropping the least
// recently used once the sizes put exceed its bound. It is safe for
// concurrent use; a nil Cache holds nothing.
type Cache[V any] struct {
	mu    sync.Mutex
	max   int
	bytes int
	order *list.List // of *item[V], most recently used at the front
	items map[string]*list.Element
}

type item[V any] struct {
	key   string
	value V
	size  int
}

// New returns a cache of at most maxBytes.
func New[V any](maxBytes int) *Cache[V] {
	return &Cache[V]{max: maxBytes, order: list.New(), items: map[string]*list.Element{}}
}

// Get returns the value of key and makes it the most recently used.
func (c *Cache[V]) Get(key string) (V, bool) {
	var zero V
	if c == nil {
		return zero, false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	el, ok := c.items[key]
	if !ok {
		return zero, false
	}
	c.order.MoveToFront(el)
	return el.Value.(*item[V]).value, true
}

// Put keeps value under key (replacing what it held) as the most recently
// used, then drops the least recently used while over the bound. A value
// larger than the bound is not kept.
func (c *Cache[V]) Put(key string, value V, size int) {
	if c == nil || size > c.max {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if el, ok := c.items[key]; ok {
		it := el.Value.(*item[V])
		c.bytes += size - it.size
		it.value, it.size = value, size
		c.order.MoveToFront(el)
	} else {
		c.items[key] = c.order.PushFront(&item[V]{key: key, value: value, size: size})
		c.bytes += size
	}
	for c.bytes > c.max {
		last := c.order.Back()
		it := last.Value.(*item[V])
		c.order.Remove(last)
		delete(c.items, it.key)
		c.bytes -= it.size
	}
}

// Delete drops the value of key, if held.
func (c *Cache[V]) Delete(key string) {
	if c == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if el, ok := c.items[key]; ok {
		c.order.Remove(el)
		delete(c.items, key)
		c.bytes -= el.Value.(*item[V]).size
	}
}

// Bytes returns the sizes of the values held.
func (c *Cache[V]) Bytes() int {
	if c == nil {
		return 0
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.bytes
}

// Reset drops every value.
func (c *Cache[V]) Reset() {
	if c == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.order.Init()
	c.items = map[string]*list.Element{}
	c.bytes = 0
}
