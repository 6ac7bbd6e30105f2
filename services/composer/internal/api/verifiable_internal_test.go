package api

import (
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"mesh.dev/internal/envelope"
	"mesh.dev/internal/testutil"
	"mesh.dev/internal/verify"
	typev1 "mesh.dev/proto/mesh/type/v1"
)

// TestVerifiable: a composition held in memory is answered only when one
// of its signatures is by a key the current keyset lets verify; revoked,
// unknown, or no keyset at all send the read to the bucket.
func TestVerifiable(t *testing.T) {
	t.Parallel()
	tr := testutil.NewTrust(t, 1, 1)
	ring, err := verify.Keyset(tr.Roots, tr.KeysetEnvelope)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	ks := proto.Clone(tr.Keyset).(*typev1.Keyset)
	ks.Version = 2
	ks.Keys = []*typev1.KeysetKey{testutil.KeysetKeyOf(tr.SigningKey, typev1.KeyState_KEY_STATE_REVOKED, now.Add(-time.Hour), now.Add(time.Hour))}
	revoked, err := verify.Keyset(tr.Roots, tr.SignKeyset(t, ks, tr.RootKeys...))
	if err != nil {
		t.Fatal(err)
	}
	signed, _ := tr.Sign(t, typev1.PayloadType_PAYLOAD_TYPE_COMPOSITION, &typev1.Composition{Node: "ace", Module: "motd"})
	other := proto.Clone(signed).(*typev1.Envelope)
	other.Signatures = nil
	if err := envelope.SignWith(other, testutil.NewKey(t)); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		ring func() *verify.Keyring
		env  *typev1.Envelope
		want bool
	}{
		{"signed by the keyset's key", func() *verify.Keyring { return ring }, signed, true},
		{"signed by a key not in the keyset", func() *verify.Keyring { return ring }, other, false},
		{"the key revoked since", func() *verify.Keyring { return revoked }, signed, false},
		{"no keyset yet", func() *verify.Keyring { return nil }, signed, false},
		{"no keyring configured", nil, signed, false},
	} {
		s := New(Config{Keyring: c.ring})
		if got := s.verifiable(c.env); got != c.want {
			t.Errorf("%s: verifiable = %v, want %v", c.name, got, c.want)
		}
	}
}
