// Package trust keeps the keyset the composer serves and checks against: the
// lease holder reads it from the signer and publishes it in bucket keysets
// (only a higher version, verified against the pinned roots); every replica
// reads it from the bucket, so Sync streams send engines the same keyset
// whichever replica they reach.
package trust

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"

	"mesh.dev/internal/natsx"
	"mesh.dev/internal/verify"
	signerv1 "mesh.dev/proto/mesh/signer/v1"
	typev1 "mesh.dev/proto/mesh/type/v1"
	"mesh.dev/services/composer/internal/store"

	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
)

// KeysetSource is the signer's GetKeyset.
type KeysetSource interface {
	GetKeyset(ctx context.Context, in *signerv1.GetKeysetRequest, opts ...grpc.CallOption) (*signerv1.GetKeysetResponse, error)
}

// Keeper holds the current verified keyset.
type Keeper struct {
	roots  *typev1.TrustRoots
	store  *store.Store
	signer KeysetSource
	log    *slog.Logger

	mu       sync.RWMutex
	ring     *verify.Keyring
	signing  string
	onChange []func(*verify.Keyring)
	// stale is poked when a pass finds the signer ahead of this keeper (a
	// signature by a key the keyset does not list, a manifest of a newer
	// keyset version): the lease holder refreshes at once instead of at
	// its next poll.
	stale chan struct{}
}

// New returns a Keeper pinned to roots.
func New(roots *typev1.TrustRoots, st *store.Store, signer KeysetSource, log *slog.Logger) *Keeper {
	if log == nil {
		log = slog.Default()
	}
	return &Keeper{roots: roots, store: st, signer: signer, log: log, stale: make(chan struct{}, 1)}
}

// Stale says the signer signs with a key or keyset this keeper does not
// hold yet; Refreshes wakes for it.
func (k *Keeper) Stale() {
	select {
	case k.stale <- struct{}{}:
	default:
	}
}

// Refreshes is signalled by Stale.
func (k *Keeper) Refreshes() <-chan struct{} { return k.stale }

// OnChange registers a callback for a newer keyset.
func (k *Keeper) OnChange(f func(*verify.Keyring)) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.onChange = append(k.onChange, f)
}

// Keyring returns the current keyset, nil before one is known.
func (k *Keeper) Keyring() *verify.Keyring {
	k.mu.RLock()
	defer k.mu.RUnlock()
	return k.ring
}

// SigningKeyID returns the key the signer signs with now.
func (k *Keeper) SigningKeyID() string {
	k.mu.RLock()
	defer k.mu.RUnlock()
	return k.signing
}

// take installs a keyset envelope when it verifies and is newer.
func (k *Keeper) take(env *typev1.Envelope) (bool, error) {
	ring, err := verify.Keyset(k.roots, env)
	if err != nil {
		return false, err
	}
	k.mu.Lock()
	if k.ring != nil && ring.Version() <= k.ring.Version() {
		k.mu.Unlock()
		return false, nil
	}
	k.ring = ring
	cbs := append([]func(*verify.Keyring){}, k.onChange...)
	k.mu.Unlock()
	for _, f := range cbs {
		f(ring)
	}
	return true, nil
}

// Load reads the keyset from the bucket (any replica).
func (k *Keeper) Load(ctx context.Context) error {
	env, _, err := k.store.Keyset(ctx)
	if errors.Is(err, natsx.ErrNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	if _, err := k.take(env); err != nil {
		return fmt.Errorf("keyset in bucket %s: %w", natsx.BucketKeysets, err)
	}
	return nil
}

// Refresh asks the signer for its keyset and signing key, takes a newer
// keyset and publishes it in the bucket (lease holder).
func (k *Keeper) Refresh(ctx context.Context) error {
	resp, err := k.signer.GetKeyset(ctx, &signerv1.GetKeysetRequest{})
	if err != nil {
		return fmt.Errorf("signer GetKeyset: %w", err)
	}
	k.mu.Lock()
	k.signing = resp.GetSigningKeyId()
	k.mu.Unlock()
	if _, err := k.take(resp.GetKeyset()); err != nil {
		return fmt.Errorf("the signer's keyset: %w", err)
	}
	cur := k.Keyring()
	held, rev, err := k.store.Keyset(ctx)
	switch {
	case errors.Is(err, natsx.ErrNotFound):
		_, err = k.store.PutKeyset(ctx, cur.Envelope(), 0)
		return err
	case err != nil:
		return err
	}
	if hr, herr := verify.Keyset(k.roots, held); herr == nil && hr.Version() >= cur.Version() {
		return nil
	}
	_, err = k.store.PutKeyset(ctx, cur.Envelope(), rev)
	return err
}

// Watch follows the keysets bucket so every replica serves the newest.
func (k *Keeper) Watch(ctx context.Context) error {
	w, err := k.store.Keysets.Watch(ctx, natsx.KeyKeysetCurrent)
	if err != nil {
		return err
	}
	defer w.Stop()
	for e := range w.Updates() {
		if e == nil || e.Op != jetstream.KeyValuePut {
			continue
		}
		env := &typev1.Envelope{}
		if err := proto.Unmarshal(e.Value, env); err != nil {
			k.log.Warn("keyset bucket holds a value that does not decode", "error", err)
			continue
		}
		if took, err := k.take(env); err != nil {
			k.log.Warn("keyset bucket holds a keyset that does not verify", "error", err)
		} else if took {
			k.log.Info("keyset taken", "version", k.Keyring().Version())
		}
	}
	return w.Err()
}
