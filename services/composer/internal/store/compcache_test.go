package store

import (
	"fmt"
	"testing"

	"mesh.dev/internal/envelope"
	typev1 "mesh.dev/proto/mesh/type/v1"
)

func payload(i, size int) *typev1.Envelope {
	b := make([]byte, size)
	copy(b, fmt.Sprintf("composition %d", i))
	return &typev1.Envelope{PayloadType: typev1.PayloadType_PAYLOAD_TYPE_COMPOSITION, Payload: b,
		Signatures: []*typev1.Signature{{KeyId: "k1:old"}}}
}

// TestCompositionCache: entries are found by key and digest, the least
// recently used go first once the bytes are over the bound, a payload put
// again (signed again) replaces the signatures, and one larger than the
// bound is not kept.
func TestCompositionCache(t *testing.T) {
	t.Parallel()
	c := newCompCache(3 * 100)
	envs := []*typev1.Envelope{payload(0, 100), payload(1, 100), payload(2, 100), payload(3, 100)}
	for i := range 3 {
		c.put(fmt.Sprintf("ace.m%d", i), envs[i])
	}
	if _, ok := c.get("ace.m0", envelope.Digest(envs[0])); !ok {
		t.Fatal("m0 not found")
	}
	if _, ok := c.get("bob.m0", envelope.Digest(envs[0])); ok {
		t.Error("found under another key")
	}
	if _, ok := c.get("ace.m0", envelope.Digest(envs[1])); ok {
		t.Error("found at another digest")
	}
	// m1 is now the least recently used.
	c.put("ace.m3", envs[3])
	if _, ok := c.get("ace.m1", envelope.Digest(envs[1])); ok {
		t.Error("m1 kept past the bound")
	}
	for _, i := range []int{0, 2, 3} {
		if _, ok := c.get(fmt.Sprintf("ace.m%d", i), envelope.Digest(envs[i])); !ok {
			t.Errorf("m%d evicted", i)
		}
	}
	resigned := payload(0, 100)
	resigned.Signatures = []*typev1.Signature{{KeyId: "k1:new"}}
	c.put("ace.m0", resigned)
	if got, _ := c.get("ace.m0", envelope.Digest(envs[0])); got.GetSignatures()[0].GetKeyId() != "k1:new" {
		t.Errorf("signatures %v after the payload was put again signed anew", got.GetSignatures())
	}
	if n := c.lru.Bytes(); n != 300 {
		t.Errorf("%d bytes held, want 300", n)
	}
	big := payload(9, 301)
	c.put("ace.big", big)
	if _, ok := c.get("ace.big", envelope.Digest(big)); ok {
		t.Error("a payload over the bound was kept")
	}
}
