// Package store is the composer's typed view of its JetStream buckets
// (DESIGN.md §9): node specs, approvals, assignments, compositions and their
// judgement records, haves, status, the keyset and the lease, and the object
// store of composition content. Every call goes through natsx, so each KV
// call is a span carrying the trace context in its headers.
package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"

	"mesh.dev/internal/natsx"
	composerv1 "mesh.dev/proto/mesh/composer/v1"
	typev1 "mesh.dev/proto/mesh/type/v1"
)

// Sentinels, re-exported so callers need not import natsx.
var (
	ErrNotFound = natsx.ErrNotFound
	ErrConflict = natsx.ErrConflict
)

// Store holds the composer's buckets.
type Store struct {
	Nodes        *natsx.KV
	Approvals    *natsx.KV
	Assignments  *natsx.KV
	Compositions *natsx.KV
	Composed     *natsx.KV
	Haves        *natsx.KV
	Status       *natsx.KV
	Keysets      *natsx.KV
	Lease        *natsx.KV
	Objects      jetstream.ObjectStore
	js           jetstream.JetStream
	opts         []natsx.Option
}

// composerBuckets are the KV buckets the composer owns.
var composerBuckets = map[string]bool{
	natsx.BucketNodes: true, natsx.BucketApprovals: true, natsx.BucketAssignments: true,
	natsx.BucketCompositions: true, natsx.BucketComposed: true, natsx.BucketHaves: true,
	natsx.BucketStatus: true, natsx.BucketKeysets: true,
}

// Open creates (or updates) the composer's buckets with the settings of
// DESIGN.md §9 and returns the store.
func Open(ctx context.Context, js jetstream.JetStream, replicas int, leaseTTL time.Duration, opts ...natsx.Option) (*Store, error) {
	s := &Store{js: js, opts: opts}
	kvs := map[string]*natsx.KV{}
	for _, spec := range natsx.Buckets(replicas) {
		if !composerBuckets[spec.Bucket] {
			continue
		}
		kv, err := natsx.EnsureKV(ctx, js, spec, opts...)
		if err != nil {
			return nil, fmt.Errorf("bucket %s: %w", spec.Bucket, err)
		}
		kvs[spec.Bucket] = kv
	}
	lease, err := natsx.EnsureKV(ctx, js, natsx.LeaseSpec(replicas, leaseTTL), opts...)
	if err != nil {
		return nil, fmt.Errorf("bucket %s: %w", natsx.BucketComposerLease, err)
	}
	for _, spec := range natsx.ObjectStores(replicas) {
		if spec.Bucket != natsx.ObjectStoreObjects {
			continue
		}
		if s.Objects, err = natsx.EnsureObjectStore(ctx, js, spec); err != nil {
			return nil, fmt.Errorf("object store %s: %w", spec.Bucket, err)
		}
	}
	s.Nodes, s.Approvals, s.Assignments = kvs[natsx.BucketNodes], kvs[natsx.BucketApprovals], kvs[natsx.BucketAssignments]
	s.Compositions, s.Composed, s.Haves = kvs[natsx.BucketCompositions], kvs[natsx.BucketComposed], kvs[natsx.BucketHaves]
	s.Status, s.Keysets, s.Lease = kvs[natsx.BucketStatus], kvs[natsx.BucketKeysets], lease
	return s, nil
}

// ObjectOptions are the natsx options the store was opened with, for object
// calls.
func (s *Store) ObjectOptions() []natsx.Option { return s.opts }

// decode unmarshals a stored record.
func decode(e natsx.Entry, m proto.Message) error {
	if err := proto.Unmarshal(e.Value, m); err != nil {
		return fmt.Errorf("%s: stored value does not decode as %s: %w", e.Key, m.ProtoReflect().Descriptor().FullName(), err)
	}
	return nil
}

func encode(m proto.Message) ([]byte, error) {
	return proto.MarshalOptions{Deterministic: true}.Marshal(m)
}

// get reads a key and decodes it; ErrNotFound when absent.
func get[T proto.Message](ctx context.Context, kv *natsx.KV, key string, m T) (T, uint64, error) {
	e, err := kv.Get(ctx, key)
	if err != nil {
		var zero T
		return zero, 0, err
	}
	if err := decode(e, m); err != nil {
		var zero T
		return zero, e.Revision, err
	}
	return m, e.Revision, nil
}

// write creates the key when rev is 0, else updates it at rev: never a blind
// overwrite. ErrConflict when the key moved.
func write(ctx context.Context, kv *natsx.KV, key string, m proto.Message, rev uint64) (uint64, error) {
	b, err := encode(m)
	if err != nil {
		return 0, err
	}
	if rev == 0 {
		return kv.Create(ctx, key, b)
	}
	return kv.Update(ctx, key, b, rev)
}

// Spec returns a node spec and its revision.
func (s *Store) Spec(ctx context.Context, node string) (*composerv1.NodeSpec, uint64, error) {
	return get(ctx, s.Nodes, node, &composerv1.NodeSpec{})
}

// PutSpec writes a node spec: create-only, CAS on expectRev, or (both zero) a
// put over whatever is there — specs are operator intent, last write wins
// unless the operator asks for a CAS.
func (s *Store) PutSpec(ctx context.Context, spec *composerv1.NodeSpec, expectRev uint64, createOnly bool) (uint64, error) {
	b, err := encode(spec)
	if err != nil {
		return 0, err
	}
	switch {
	case createOnly:
		return s.Nodes.Create(ctx, spec.GetNode(), b)
	case expectRev > 0:
		return s.Nodes.Update(ctx, spec.GetNode(), b, expectRev)
	}
	return s.Nodes.Put(ctx, spec.GetNode(), b)
}

// Specs returns every node spec with its revision, by node.
func (s *Store) Specs(ctx context.Context) ([]*composerv1.NodeSpec, map[string]uint64, error) {
	keys, err := s.Nodes.ListKeys(ctx)
	if err != nil {
		return nil, nil, err
	}
	var specs []*composerv1.NodeSpec
	revs := map[string]uint64{}
	for _, k := range keys {
		spec, rev, err := s.Spec(ctx, k)
		if errors.Is(err, ErrNotFound) {
			continue
		}
		if err != nil {
			return nil, nil, err
		}
		specs = append(specs, spec)
		revs[k] = rev
	}
	return specs, revs, nil
}

// Assignment returns a node's assignment and its revision.
func (s *Store) Assignment(ctx context.Context, node string) (*composerv1.Assignment, uint64, error) {
	return get(ctx, s.Assignments, node, &composerv1.Assignment{})
}

// WriteAssignment commits a node's assignment with one CAS at rev (0: the key
// must not exist).
func (s *Store) WriteAssignment(ctx context.Context, a *composerv1.Assignment, rev uint64) (uint64, error) {
	return write(ctx, s.Assignments, a.GetNode(), a, rev)
}

// Have returns a node's haves record and its revision.
func (s *Store) Have(ctx context.Context, node string) (*composerv1.HaveRecord, uint64, error) {
	return get(ctx, s.Haves, node, &composerv1.HaveRecord{})
}

// Record returns the judgement record of a composition key.
func (s *Store) Record(ctx context.Context, key string) (*composerv1.JudgementRecord, uint64, error) {
	return get(ctx, s.Composed, key, &composerv1.JudgementRecord{})
}

// WriteRecord writes a judgement record at rev (0: create).
func (s *Store) WriteRecord(ctx context.Context, key string, r *composerv1.JudgementRecord, rev uint64) (uint64, error) {
	return write(ctx, s.Composed, key, r, rev)
}

// Composition returns the stored value of a composition key: a signed
// envelope. The envelope is returned even when the caller will find it does
// not verify; a value that does not decode returns an error and the
// revision, so the writer can replace it by CAS.
func (s *Store) Composition(ctx context.Context, key string) (*typev1.Envelope, uint64, time.Time, error) {
	e, err := s.Compositions.Get(ctx, key)
	if err != nil {
		return nil, 0, time.Time{}, err
	}
	env := &typev1.Envelope{}
	if err := decode(e, env); err != nil {
		return nil, e.Revision, e.Created, err
	}
	return env, e.Revision, e.Created, nil
}

// WriteComposition writes a signed composition at rev (0: create).
func (s *Store) WriteComposition(ctx context.Context, key string, env *typev1.Envelope, rev uint64) (uint64, error) {
	return write(ctx, s.Compositions, key, env, rev)
}

// NodeStatus returns a node's status.
func (s *Store) NodeStatus(ctx context.Context, node string) (*composerv1.NodeStatus, uint64, error) {
	return get(ctx, s.Status, node, &composerv1.NodeStatus{})
}

// PutStatus writes a node's status (derived and advisory: last write wins).
func (s *Store) PutStatus(ctx context.Context, st *composerv1.NodeStatus) error {
	b, err := encode(st)
	if err != nil {
		return err
	}
	_, err = s.Status.Put(ctx, st.GetNode(), b)
	return err
}

// Approval returns an approval by id.
func (s *Store) Approval(ctx context.Context, id string) (*composerv1.Approval, uint64, error) {
	return get(ctx, s.Approvals, id, &composerv1.Approval{})
}

// ApprovalsList returns every approval.
func (s *Store) ApprovalsList(ctx context.Context) ([]*composerv1.Approval, error) {
	keys, err := s.Approvals.ListKeys(ctx)
	if err != nil {
		return nil, err
	}
	var out []*composerv1.Approval
	for _, k := range keys {
		a, _, err := s.Approval(ctx, k)
		if errors.Is(err, ErrNotFound) {
			continue
		}
		if err != nil {
			return nil, err
		}
		out = append(out, a)
	}
	return out, nil
}

// Keyset returns the keyset envelope under key current.
func (s *Store) Keyset(ctx context.Context) (*typev1.Envelope, uint64, error) {
	return get(ctx, s.Keysets, natsx.KeyKeysetCurrent, &typev1.Envelope{})
}

// PutKeyset writes the keyset at rev (0: create).
func (s *Store) PutKeyset(ctx context.Context, env *typev1.Envelope, rev uint64) (uint64, error) {
	return write(ctx, s.Keysets, natsx.KeyKeysetCurrent, env, rev)
}
