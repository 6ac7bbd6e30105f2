package service

import (
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	"mesh.dev/internal/keyfile"
	"mesh.dev/internal/verify"
	typev1 "mesh.dev/proto/mesh/type/v1"
)

// Keysets holds the root-signed keyset the signer serves, and reloads it
// from its file when the file changes. A new keyset is taken when it
// verifies against the pinned roots, is unexpired and has a higher version,
// even when it no longer lists the signer's key as ACTIVE: the roots
// retired or revoked the key, and from then on the signer signs nothing
// (signingKeyValid) while it serves the keyset that says why. Otherwise the
// current one stays. Either way the error is returned to the caller to log.
// At start (LoadKeysets) the key must be ACTIVE.
type Keysets struct {
	path  string
	roots *typev1.TrustRoots
	keyID string

	mu      sync.RWMutex
	ring    *verify.Keyring
	modTime time.Time
}

// ErrKeyNotActive is returned when a keyset does not list the signer's key as
// ACTIVE (the signer then refuses to start, or keeps its current keyset).
var ErrKeyNotActive = errors.New("the signer's key is not ACTIVE in the keyset")

// LoadKeysets reads and checks the keyset file: it must verify against the
// roots, be unexpired and list keyID as ACTIVE and valid now.
func LoadKeysets(path string, roots *typev1.TrustRoots, keyID string, now time.Time) (*Keysets, error) {
	k := &Keysets{path: path, roots: roots, keyID: keyID}
	ring, mod, err := k.read(now)
	if err != nil {
		return nil, err
	}
	k.ring, k.modTime = ring, mod
	return k, nil
}

// read reads the keyset file and checks it as LoadKeysets does; ring is
// set when it verifies against the roots and is unexpired, and err then
// says whether the signer's key may sign under it.
func (k *Keysets) read(now time.Time) (*verify.Keyring, time.Time, error) {
	ring, mod, err := k.readVerified(now)
	if err != nil {
		return nil, time.Time{}, err
	}
	return ring, mod, k.keyUsable(ring, now)
}

// readVerified reads the keyset file: it must verify against the roots and
// be unexpired.
func (k *Keysets) readVerified(now time.Time) (*verify.Keyring, time.Time, error) {
	fi, err := os.Stat(k.path)
	if err != nil {
		return nil, time.Time{}, fmt.Errorf("keyset file: %w", err)
	}
	env := &typev1.Envelope{}
	if err := keyfile.ReadJSON(k.path, env); err != nil {
		return nil, time.Time{}, fmt.Errorf("keyset file: %w", err)
	}
	ring, err := verify.Keyset(k.roots, env)
	if err != nil {
		return nil, time.Time{}, fmt.Errorf("keyset file %s: %w", k.path, err)
	}
	if ring.Expired(now) {
		return nil, time.Time{}, fmt.Errorf("keyset file %s: version %d %w at %s", k.path, ring.Version(), verify.ErrKeysetExpired, ring.Keyset().GetExpiresAt().AsTime().UTC().Format(time.RFC3339))
	}
	return ring, fi.ModTime(), nil
}

// keyUsable checks that a keyset lists the signer's key as ACTIVE and valid
// now.
func (k *Keysets) keyUsable(ring *verify.Keyring, now time.Time) error {
	key, ok := ring.Key(k.keyID)
	if !ok || key.GetState() != typev1.KeyState_KEY_STATE_ACTIVE {
		state := "not listed"
		if ok {
			state = key.GetState().String()
		}
		return fmt.Errorf("%w: keyset version %d, key %s is %s", ErrKeyNotActive, ring.Version(), k.keyID, state)
	}
	if nb := key.GetNotBefore(); nb != nil && now.Before(nb.AsTime()) {
		return fmt.Errorf("%w: key %s is valid from %s", ErrKeyNotActive, k.keyID, nb.AsTime().UTC().Format(time.RFC3339))
	}
	if na := key.GetNotAfter(); na != nil && now.After(na.AsTime()) {
		return fmt.Errorf("%w: key %s was valid until %s", ErrKeyNotActive, k.keyID, na.AsTime().UTC().Format(time.RFC3339))
	}
	return nil
}

// Current returns the keyset in use.
func (k *Keysets) Current() *verify.Keyring {
	k.mu.RLock()
	defer k.mu.RUnlock()
	return k.ring
}

// Reload takes the keyset file again when its modification time changed. It
// returns whether a new keyset was taken.
func (k *Keysets) Reload(now time.Time) (bool, error) {
	fi, err := os.Stat(k.path)
	if err != nil {
		return false, fmt.Errorf("keyset file: %w", err)
	}
	k.mu.RLock()
	same := fi.ModTime().Equal(k.modTime)
	cur := k.ring
	k.mu.RUnlock()
	if same {
		return false, nil
	}
	ring, mod, err := k.readVerified(now)
	if err != nil {
		return false, err
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	k.modTime = mod
	if ring.Version() <= cur.Version() {
		if ring.Digest() != cur.Digest() {
			return false, fmt.Errorf("keyset file %s: version %d is not above the served version %d", k.path, ring.Version(), cur.Version())
		}
		return false, nil
	}
	k.ring = ring
	if err := k.keyUsable(ring, now); err != nil {
		// Taken all the same: the roots say so of the key.
		return true, fmt.Errorf("keyset version %d taken; it signs nothing more: %w", ring.Version(), err)
	}
	return true, nil
}
