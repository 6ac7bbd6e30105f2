package pass

import (
	"strconv"
	"strings"
	"sync"
	"time"

	"mesh.dev/internal/envelope"
	"mesh.dev/internal/verify"
	typev1 "mesh.dev/proto/mesh/type/v1"
)

// verifyFor is how long a verified envelope is remembered: well below any
// key's lifetime; a key's not_after ends it sooner.
const verifyFor = 10 * time.Minute

// maxVerified bounds the cache (a fleet's held compositions, about 20 a
// node); it is emptied when full.
const maxVerified = 1 << 18

// verifyCache remembers which envelopes verified under which keyset, so a
// pass that finds nothing changed does not check every signature of the
// node again: an ed25519 verification costs more than the rest of the
// comparison. An entry is bound to the keyset version, the payload's digest
// and the exact signatures.
type verifyCache struct {
	mu sync.Mutex
	m  map[string]verifiedEntry
}

type verifiedEntry struct {
	keyID string
	until time.Time
}

func cacheKey(ring *verify.Keyring, env *typev1.Envelope) string {
	return cacheKeyOf(ring, envelope.Digest(env), signaturesKey(env))
}

// cacheKeyOf is the cache key of an envelope known by its payload's digest
// and signaturesKey.
func cacheKeyOf(ring *verify.Keyring, digest, signatures string) string {
	return strconv.FormatUint(ring.Version(), 10) + "\x00" + digest + signatures
}

// signaturesKey names an envelope's payload type and exact signatures.
func signaturesKey(env *typev1.Envelope) string {
	var b strings.Builder
	b.WriteString(strconv.Itoa(int(env.GetPayloadType())))
	for _, s := range env.GetSignatures() {
		b.WriteByte(0)
		b.WriteString(s.GetKeyId())
		b.WriteByte(0)
		b.Write(s.GetSignature())
	}
	return b.String()
}

// known returns the key an envelope verified with recently, by cache key,
// without verifying anything.
func (c *verifyCache) known(key string, now time.Time) (string, bool) {
	c.mu.Lock()
	e, ok := c.m[key]
	c.mu.Unlock()
	return e.keyID, ok && now.Before(e.until)
}

// verify returns the id of the key an envelope verifies with, from the cache
// when it verified recently.
func (c *verifyCache) verify(ring *verify.Keyring, env *typev1.Envelope, t typev1.PayloadType, now time.Time) (string, error) {
	key := cacheKey(ring, env)
	c.mu.Lock()
	e, ok := c.m[key]
	c.mu.Unlock()
	if ok && now.Before(e.until) {
		return e.keyID, nil
	}
	keyID, err := ring.Verify(env, t, now)
	if err != nil {
		return "", err
	}
	until := now.Add(verifyFor)
	if k, ok := ring.Key(keyID); ok && k.GetNotAfter() != nil && k.GetNotAfter().AsTime().Before(until) {
		until = k.GetNotAfter().AsTime()
	}
	c.mu.Lock()
	if c.m == nil || len(c.m) >= maxVerified {
		c.m = map[string]verifiedEntry{}
	}
	c.m[key] = verifiedEntry{keyID: keyID, until: until}
	c.mu.Unlock()
	return keyID, nil
}
