package pass

import (
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	"mesh.dev/internal/envelope"
	"mesh.dev/internal/testutil"
	"mesh.dev/internal/verify"
	typev1 "mesh.dev/proto/mesh/type/v1"
)

// TestSignerAhead: a manifest the signer just signed tells the composer its
// keyset is behind when it names a newer keyset version or is signed by a
// key the keyset does not list (the signer restarted on a rotated key);
// then the keyset is refreshed at once instead of at the next poll.
func TestSignerAhead(t *testing.T) {
	t.Parallel()
	tr := testutil.NewTrust(t, 1, 1)
	ring, err := verify.Keyset(tr.Roots, tr.KeysetEnvelope)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	signed := func(version uint64, key []byte) *typev1.Envelope {
		env, _, err := envelope.Seal(typev1.PayloadType_PAYLOAD_TYPE_MANIFEST, &typev1.Manifest{Node: "ace", Revision: 1,
			IssuedAt: timestamppb.New(now), ExpiresAt: timestamppb.New(now.Add(time.Hour)), KeysetVersion: version})
		if err != nil {
			t.Fatal(err)
		}
		if err := envelope.SignWith(env, key); err != nil {
			t.Fatal(err)
		}
		return env
	}
	other := testutil.NewKey(t)
	for _, tc := range []struct {
		name string
		env  *typev1.Envelope
		want bool
	}{
		{"the keyset held, its key", signed(1, tr.SigningKey), false},
		{"a newer keyset version", signed(2, tr.SigningKey), true},
		{"a key the keyset does not list", signed(1, other), true},
	} {
		p := New(Config{Trust: fakeTrust{ring: ring}})
		if got := p.signerAhead(tc.env); got != tc.want {
			t.Errorf("%s: signerAhead = %v, want %v", tc.name, got, tc.want)
		}
	}
	if p := New(Config{Trust: fakeTrust{}}); !p.signerAhead(signed(1, tr.SigningKey)) {
		t.Error("with no keyset held, the signer is ahead")
	}
}
