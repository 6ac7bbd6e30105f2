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
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
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

// ErrCorrupt is wrapped by the error of a read whose stored value does not
// decode (bad bytes written past the services, a damaged store).
var ErrCorrupt = errors.New("stored value does not decode")

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
	tracer       trace.Tracer
	// compositions is the stream behind bucket compositions, for the
	// listings and lookups natsx.KV does not offer.
	compositions jetstream.Stream
	// comps holds the compositions written and read, by digest.
	comps *compCache
}

// composerBuckets are the KV buckets the composer owns.
var composerBuckets = map[string]bool{
	natsx.BucketNodes: true, natsx.BucketApprovals: true, natsx.BucketAssignments: true,
	natsx.BucketCompositions: true, natsx.BucketComposed: true, natsx.BucketHaves: true,
	natsx.BucketStatus: true, natsx.BucketKeysets: true,
}

// Open creates (or updates) the composer's buckets with the settings of
// DESIGN.md §9 and returns the store.
func Open(ctx context.Context, js jetstream.JetStream, replicas int, leaseTTL time.Duration, tp trace.TracerProvider, opts ...natsx.Option) (*Store, error) {
	if tp == nil {
		tp = noop.NewTracerProvider()
	}
	s := &Store{js: js, opts: append(opts, natsx.WithTracerProvider(tp)), tracer: tp.Tracer(natsx.TracerName), comps: newCompCache(DefaultCompositionCacheBytes)}
	opts = s.opts
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
	if s.compositions, err = js.Stream(ctx, "KV_"+natsx.BucketCompositions); err != nil {
		return nil, fmt.Errorf("bucket %s: %w", natsx.BucketCompositions, err)
	}
	return s, nil
}

const compositionsPrefix = "$KV." + natsx.BucketCompositions + "."

func (s *Store) span(ctx context.Context, op, key string) (context.Context, trace.Span) {
	return s.tracer.Start(ctx, op+" "+natsx.BucketCompositions, trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(attribute.String("kv.bucket", natsx.BucketCompositions), attribute.String("kv.key", key)))
}

func endSpan(span trace.Span, err error) {
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
}

// CompositionKeys lists the keys <node>.*.* of bucket compositions that hold
// a message — a value or a delete marker — sorted. It asks the stream for
// its subjects in one request: listing with a watcher would create and
// delete a consumer on every pass.
func (s *Store) CompositionKeys(ctx context.Context, node string) (_ []string, err error) {
	ctx, span := s.span(ctx, "kv.list_subjects", node+".*.*")
	defer func() { endSpan(span, err) }()
	info, err := natsx.Request(ctx, func(ctx context.Context) (*jetstream.StreamInfo, error) {
		return s.compositions.Info(ctx, jetstream.WithSubjectFilter(compositionsPrefix+node+".*.*"))
	})
	if err != nil {
		return nil, fmt.Errorf("kv %s: list subjects %s.*.*: %w", natsx.BucketCompositions, node, natsx.MapError(err))
	}
	keys := make([]string, 0, len(info.State.Subjects))
	for subj := range info.State.Subjects {
		keys = append(keys, strings.TrimPrefix(subj, compositionsPrefix))
	}
	slices.Sort(keys)
	return keys, nil
}

// CompositionMeta returns the last message of a composition key, marker or
// not, without decoding it: revision, server timestamp and operation.
func (s *Store) CompositionMeta(ctx context.Context, key string) (_ natsx.Entry, err error) {
	ctx, span := s.span(ctx, "kv.meta", key)
	defer func() { endSpan(span, err) }()
	m, err := natsx.Request(ctx, func(ctx context.Context) (*jetstream.RawStreamMsg, error) {
		return s.compositions.GetLastMsgForSubject(ctx, compositionsPrefix+key)
	})
	if err != nil {
		return natsx.Entry{}, fmt.Errorf("kv %s: meta %s: %w", natsx.BucketCompositions, key, natsx.MapError(err))
	}
	op := jetstream.KeyValuePut
	switch m.Header.Get("KV-Operation") {
	case "DEL":
		op = jetstream.KeyValueDelete
	case "PURGE":
		op = jetstream.KeyValuePurge
	}
	return natsx.Entry{Key: key, Revision: m.Sequence, Created: m.Time, Op: op}, nil
}

// PurgeMarker removes a composition key's delete marker at rev from the
// stream, so listings no longer show the key. It removes nothing when the
// key was written since.
func (s *Store) PurgeMarker(ctx context.Context, key string, rev uint64) (err error) {
	ctx, span := s.span(ctx, "kv.purge_marker", key)
	defer func() { endSpan(span, err) }()
	m, err := natsx.Request(ctx, func(ctx context.Context) (*jetstream.RawStreamMsg, error) {
		return s.compositions.GetLastMsgForSubject(ctx, compositionsPrefix+key)
	})
	if err != nil {
		return natsx.MapError(err)
	}
	if m.Sequence != rev {
		return nil
	}
	// The purge keeps nothing of the subject up to and including the
	// marker; a value written meanwhile has a higher sequence and stays.
	_, err = natsx.Request(ctx, func(ctx context.Context) (struct{}, error) {
		return struct{}{}, s.compositions.Purge(ctx, jetstream.WithPurgeSubject(compositionsPrefix+key), jetstream.WithPurgeSequence(rev+1))
	})
	return err
}

// AssignmentHistory returns the kept revisions of a node's assignment
// (bucket assignments keeps 5), oldest first, skipping deletes and values
// that do not decode.
func (s *Store) AssignmentHistory(ctx context.Context, node string) (_ []*composerv1.Assignment, err error) {
	ctx, span := s.tracer.Start(ctx, "kv.history "+natsx.BucketAssignments, trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(attribute.String("kv.bucket", natsx.BucketAssignments), attribute.String("kv.key", node)))
	defer func() { endSpan(span, err) }()
	entries, err := natsx.Request(ctx, func(ctx context.Context) ([]jetstream.KeyValueEntry, error) {
		return s.Assignments.KeyValue().History(ctx, node)
	})
	if err != nil {
		return nil, fmt.Errorf("kv %s: history %s: %w", natsx.BucketAssignments, node, natsx.MapError(err))
	}
	var out []*composerv1.Assignment
	for _, e := range entries {
		if e.Operation() != jetstream.KeyValuePut {
			continue
		}
		a := &composerv1.Assignment{}
		if proto.Unmarshal(e.Value(), a) == nil {
			out = append(out, a)
		}
	}
	return out, nil
}

// ObjectOptions are the natsx options the store was opened with, for object
// calls.
func (s *Store) ObjectOptions() []natsx.Option { return s.opts }

// decode unmarshals a stored record.
func decode(e natsx.Entry, m proto.Message) error {
	if err := proto.Unmarshal(e.Value, m); err != nil {
		return fmt.Errorf("%s: %w as %s: %w", e.Key, ErrCorrupt, m.ProtoReflect().Descriptor().FullName(), err)
	}
	return nil
}

func encode(m proto.Message) ([]byte, error) {
	return proto.MarshalOptions{Deterministic: true}.Marshal(m)
}

// get reads a key and decodes it; ErrNotFound when absent.
func get[T proto.Message](ctx context.Context, kv *natsx.KV, key string, m T) (T, uint64, error) {
	return getAtLeast(ctx, kv, key, 0, m)
}

// getAtLeast is get of a key known written at rev or later (natsx
// GetAtLeast; 0: nothing known).
func getAtLeast[T proto.Message](ctx context.Context, kv *natsx.KV, key string, rev uint64, m T) (T, uint64, error) {
	e, err := kv.GetAtLeast(ctx, key, rev)
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

// SpecAtLeast is Spec of a spec known written at rev or later (a watch
// delivered it): a replica behind that write is not taken for the truth.
func (s *Store) SpecAtLeast(ctx context.Context, node string, rev uint64) (*composerv1.NodeSpec, uint64, error) {
	return getAtLeast(ctx, s.Nodes, node, rev, &composerv1.NodeSpec{})
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

// HaveAtLeast is Have of a record known written at rev or later.
func (s *Store) HaveAtLeast(ctx context.Context, node string, rev uint64) (*composerv1.HaveRecord, uint64, error) {
	return getAtLeast(ctx, s.Haves, node, rev, &composerv1.HaveRecord{})
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
// not verify; a value that does not decode returns an error wrapping
// ErrCorrupt and the revision, so the writer can replace it by CAS.
func (s *Store) Composition(ctx context.Context, key string) (*typev1.Envelope, uint64, time.Time, error) {
	e, err := s.Compositions.Get(ctx, key)
	if err != nil {
		return nil, 0, time.Time{}, err
	}
	env := &typev1.Envelope{}
	if err := decode(e, env); err != nil {
		return nil, e.Revision, e.Created, err
	}
	s.comps.put(key, env)
	return env, e.Revision, e.Created, nil
}

// CompositionOf returns the composition at key whose payload has the given
// digest when this composer wrote or read it lately, without a read; false
// otherwise (the caller reads the bucket). The envelope is shared: read
// only.
func (s *Store) CompositionOf(key, digest string) (*typev1.Envelope, bool) {
	return s.comps.get(key, digest)
}

// WriteComposition writes a signed composition at rev (0: create).
func (s *Store) WriteComposition(ctx context.Context, key string, env *typev1.Envelope, rev uint64) (uint64, error) {
	rev, err := write(ctx, s.Compositions, key, env, rev)
	if err == nil {
		s.comps.put(key, env)
	}
	return rev, err
}

// NodeStatus returns a node's status.
func (s *Store) NodeStatus(ctx context.Context, node string) (*composerv1.NodeStatus, uint64, error) {
	return get(ctx, s.Status, node, &composerv1.NodeStatus{})
}

// WriteStatus writes a node's status at rev (0: create), by CAS: a status
// is derived from the haves read after the status it replaces, so a writer
// holding older haves cannot overwrite one built from newer ones.
// ErrConflict when the key moved.
func (s *Store) WriteStatus(ctx context.Context, st *composerv1.NodeStatus, rev uint64) (uint64, error) {
	return write(ctx, s.Status, st.GetNode(), st, rev)
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
