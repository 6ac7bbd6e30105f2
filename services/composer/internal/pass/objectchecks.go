package pass

import (
	"sync"
	"time"
)

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

// repairsKept is how long a repair is remembered: an engine reports a
// refusal within seconds of its fetch.
const repairsKept = time.Hour

// repairTimes remembers when this composer last repaired each composition
// key: wrote again, at the digest the held manifest names, what the key
// held instead (nothing, other bytes), or put an object of it again.
type repairTimes struct {
	mu sync.Mutex
	m  map[string]time.Time
}

func (r *repairTimes) note(key string, at time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.m == nil {
		r.m = map[string]time.Time{}
	}
	for k, t := range r.m {
		if at.Sub(t) > repairsKept {
			delete(r.m, k)
		}
	}
	r.m[key] = at
}

func (r *repairTimes) last(key string) (time.Time, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	t, ok := r.m[key]
	return t, ok
}
