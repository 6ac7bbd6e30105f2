package pass

import "sync"

// maxObjectChecks bounds the objects remembered as verified; the memory is
// emptied when full (an object is then only hashed once more).
const maxObjectChecks = 1 << 16

// objectChecks remembers, per object digest, the stored version (NUID)
// whose bytes were found to hash to it: a version never changes, so it is
// not hashed again.
type objectChecks struct {
	mu sync.Mutex
	m  map[string]string
}

func (c *objectChecks) verified(digest, nuid string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return nuid != "" && c.m[digest] == nuid
}

func (c *objectChecks) remember(digest, nuid string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil || len(c.m) >= maxObjectChecks {
		c.m = map[string]string{}
	}
	c.m[digest] = nuid
}
