package store

import (
	"mesh.dev/internal/envelope"
	"mesh.dev/internal/lru"
	typev1 "mesh.dev/proto/mesh/type/v1"
)

// DefaultCompositionCacheBytes bounds the payload bytes the composition
// cache holds: 64 MiB is about 5,000 compositions of 12 KB.
const DefaultCompositionCacheBytes = 64 << 20

// compCache holds signed compositions this composer wrote or read, by key
// and the digest of their payload, least recently used first out. A digest
// names its payload's bytes, so an entry is never stale as content; its
// signatures are the ones last seen with that payload (a composition signed
// again after a key rotation replaces them when this composer writes or
// reads it). Entries are shared read-only.
type compCache struct {
	lru *lru.Cache[*typev1.Envelope]
}

func newCompCache(maxBytes int) *compCache {
	return &compCache{lru: lru.New[*typev1.Envelope](maxBytes)}
}

// cacheKey names a composition by its key and digest ("\x00" is in
// neither).
func cacheKey(key, digest string) string { return key + "\x00" + digest }

func (c *compCache) put(key string, env *typev1.Envelope) {
	if c == nil || env == nil {
		return
	}
	c.lru.Put(cacheKey(key, envelope.Digest(env)), env, len(env.GetPayload()))
}

func (c *compCache) get(key, digest string) (*typev1.Envelope, bool) {
	if c == nil || digest == "" {
		return nil, false
	}
	return c.lru.Get(cacheKey(key, digest))
}
