package store

import (
	"container/list"
	"sync"

	"mesh.dev/internal/envelope"
	typev1 "mesh.dev/proto/mesh/type/v1"
)

// DefaultCompositionCacheBytes bounds the payload bytes the composition
// cache holds: 64 MiB is about 5,000 compositions of 12 KB.
const DefaultCompositionCacheBytes = 64 << 20

// compCache holds signed compositions this composer wrote or read, by the
// digest of their payload, least recently used first out. A digest names
// its payload's bytes, so an entry is never stale as content; its
// signatures are the ones last seen with that payload (a composition signed
// again after a key rotation replaces them when this composer writes or
// reads it). Entries are shared read-only.
type compCache struct {
	mu    sync.Mutex
	max   int
	bytes int
	order *list.List // of *compEntry, most recent at the front
	by    map[string]*list.Element
}

type compEntry struct {
	digest, key string
	env         *typev1.Envelope
	size        int
}

func newCompCache(maxBytes int) *compCache {
	return &compCache{max: maxBytes, order: list.New(), by: map[string]*list.Element{}}
}

func (c *compCache) put(key string, env *typev1.Envelope) {
	if c == nil || env == nil {
		return
	}
	size := len(env.GetPayload())
	if size > c.max {
		return
	}
	digest := envelope.Digest(env)
	c.mu.Lock()
	defer c.mu.Unlock()
	if el, ok := c.by[digest]; ok {
		e := el.Value.(*compEntry)
		e.env, e.key = env, key
		c.order.MoveToFront(el)
		return
	}
	c.by[digest] = c.order.PushFront(&compEntry{digest: digest, key: key, env: env, size: size})
	c.bytes += size
	for c.bytes > c.max {
		el := c.order.Back()
		e := el.Value.(*compEntry)
		c.order.Remove(el)
		delete(c.by, e.digest)
		c.bytes -= e.size
	}
}

func (c *compCache) get(key, digest string) (*typev1.Envelope, bool) {
	if c == nil || digest == "" {
		return nil, false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	el, ok := c.by[digest]
	if !ok || el.Value.(*compEntry).key != key {
		return nil, false
	}
	c.order.MoveToFront(el)
	return el.Value.(*compEntry).env, true
}
