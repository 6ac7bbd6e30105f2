package faults

import (
	"crypto/ed25519"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	"mesh.dev/internal/envelope"
	"mesh.dev/internal/testutil"
	typev1 "mesh.dev/proto/mesh/type/v1"
)

// Key states of a keyset.
const (
	KeyActive  = typev1.KeyState_KEY_STATE_ACTIVE
	KeyRetired = typev1.KeyState_KEY_STATE_RETIRED
	KeyRevoked = typev1.KeyState_KEY_STATE_REVOKED
)

// KeysetKey is one online key of a keyset.
type KeysetKey struct {
	Key   ed25519.PrivateKey
	State typev1.KeyState
}

// Keyset is the harness's description of the keyset the signer serves.
type Keyset struct {
	Version uint64
	Keys    []KeysetKey
}

// keyValidity: keys are valid from two hours before now, so an engine whose
// clock is an hour behind (and allowed an hour of skew) takes them.
const keyValidity = 2 * time.Hour

// Sign builds the keyset and signs it with every root.
func (k *Keyset) Sign(t testing.TB, tr *testutil.Trust) *typev1.Envelope {
	now := time.Now()
	ks := &typev1.Keyset{Version: k.Version, IssuedAt: timestamppb.New(now.Add(-keyValidity)), ExpiresAt: timestamppb.New(now.Add(365 * 24 * time.Hour))}
	for _, key := range k.Keys {
		ks.Keys = append(ks.Keys, testutil.KeysetKeyOf(key.Key, key.State, now.Add(-keyValidity), now.Add(365*24*time.Hour)))
	}
	return tr.SignKeyset(t, ks, tr.RootKeys...)
}

// KeyID is the id of a key.
func KeyID(k ed25519.PrivateKey) string { return envelope.KeyID(k.Public().(ed25519.PublicKey)) }
