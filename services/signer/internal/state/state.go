// Package state keeps the signer's local, fsynced state: the last manifest
// revision per node and the fencing epoch. It lives in the signer's state
// dir, not in JetStream, so revisions stay monotonic through JetStream loss,
// lease handover and node re-creation (DESIGN.md §5.4).
package state

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"time"

	bolt "go.etcd.io/bbolt"
)

var (
	bucketRevisions = []byte("revisions")
	bucketMeta      = []byte("meta")
	keyEpoch        = []byte("epoch")
)

// Store is the signer's state file. Every write commits with fsync before it
// returns.
type Store struct {
	db *bolt.DB
}

// Open opens or creates the state file.
func Open(path string) (*Store, error) {
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: 5 * time.Second})
	if err != nil {
		return nil, fmt.Errorf("open signer state %s: %w", path, err)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		for _, b := range [][]byte{bucketRevisions, bucketMeta} {
			if _, err := tx.CreateBucketIfNotExists(b); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("init signer state: %w", err)
	}
	return &Store{db: db}, nil
}

// Close closes the file.
func (s *Store) Close() error { return s.db.Close() }

func u64(b []byte) uint64 {
	if len(b) != 8 {
		return 0
	}
	return binary.BigEndian.Uint64(b)
}

func be(v uint64) []byte { return binary.BigEndian.AppendUint64(nil, v) }

// Epoch returns the newest fencing epoch (0 before the first Fence).
func (s *Store) Epoch() (uint64, error) {
	var e uint64
	err := s.db.View(func(tx *bolt.Tx) error {
		e = u64(tx.Bucket(bucketMeta).Get(keyEpoch))
		return nil
	})
	return e, err
}

// NextEpoch increments the fencing epoch and returns it once it is durable.
func (s *Store) NextEpoch() (uint64, error) {
	var e uint64
	err := s.db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketMeta)
		e = u64(b.Get(keyEpoch)) + 1
		return b.Put(keyEpoch, be(e))
	})
	if err != nil {
		return 0, fmt.Errorf("persist fencing epoch: %w", err)
	}
	return e, nil
}

// RevisionRequest asks for a node's next revision with a floor.
type RevisionRequest struct {
	Node  string
	Floor uint64
}

// ErrDuplicateNode is returned when one batch asks twice for a node.
var ErrDuplicateNode = errors.New("node listed twice in one batch")

// AssignRevisions assigns each node its next revision, max(last + 1, floor,
// nowMillis), and makes all of them durable in one commit before returning.
// A failure assigns none.
func (s *Store) AssignRevisions(reqs []RevisionRequest, nowMillis uint64) ([]uint64, error) {
	out := make([]uint64, len(reqs))
	seen := make(map[string]bool, len(reqs))
	for _, r := range reqs {
		if seen[r.Node] {
			return nil, fmt.Errorf("%w: %s", ErrDuplicateNode, r.Node)
		}
		seen[r.Node] = true
	}
	err := s.db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketRevisions)
		for i, r := range reqs {
			last := u64(b.Get([]byte(r.Node)))
			if last == math.MaxUint64 {
				// No revision is above it: wrapping to 0 would go back.
				return fmt.Errorf("node %s: its last revision is %d, the largest there is; no manifest can follow it", r.Node, last)
			}
			rev := max(last+1, r.Floor, nowMillis)
			if err := b.Put([]byte(r.Node), be(rev)); err != nil {
				return err
			}
			out[i] = rev
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("persist manifest revisions: %w", err)
	}
	return out, nil
}

// LastRevision returns the last revision assigned to a node (0 if none).
func (s *Store) LastRevision(node string) (uint64, error) {
	var rev uint64
	err := s.db.View(func(tx *bolt.Tx) error {
		rev = u64(tx.Bucket(bucketRevisions).Get([]byte(node)))
		return nil
	})
	return rev, err
}
