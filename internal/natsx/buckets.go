package natsx

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// MaxValueSize is the largest KV value any mesh bucket holds (DESIGN.md §8,
// §9) and the default of KVSpec.MaxValueSize.
const MaxValueSize = 1 << 20

// MaxHeaderBytes is the room a bucket's stream leaves above its value limit
// for headers (trace context, the CAS and operation headers). The server
// counts headers against a stream's max message size, so without it a value
// of exactly MaxValueSize could not be written with its trace context.
const MaxHeaderBytes = 8 << 10

// Bucket and object store names (DESIGN.md §9).
const (
	BucketCatalogEntries = "catalog-entries"
	BucketCatalogBuilds  = "catalog-builds"
	BucketCatalogModules = "catalog-modules"
	BucketNodes          = "nodes"
	BucketApprovals      = "approvals"
	BucketAssignments    = "assignments"
	BucketCompositions   = "compositions"
	BucketComposed       = "composed"
	BucketHaves          = "haves"
	BucketStatus         = "status"
	BucketKeysets        = "keysets"
	BucketComposerLease  = "composer-lease"

	ObjectStoreArtifacts = "artifacts"
	ObjectStoreObjects   = "objects"
)

// Fixed keys of the single-key buckets.
const (
	KeyKeysetCurrent = "current" // in BucketKeysets
	KeyLeaseLeader   = "leader"  // in BucketComposerLease
)

// KVSpec is the configuration of one KV bucket.
type KVSpec struct {
	Bucket string
	// History is the number of revisions kept per key; 0 means 1.
	History uint8
	// Replicas is the stream's replica count; 0 means 1.
	Replicas int
	// Storage is where the stream lives; the mesh uses file storage
	// everywhere (the zero value).
	Storage jetstream.StorageType
	// MaxValueSize caps a value; 0 means MaxValueSize, and it may not be
	// larger.
	MaxValueSize int32
	// TTL expires values that old; 0 keeps them.
	TTL time.Duration
	// LeaderReads turns the stream's direct get off, so reads are answered by
	// the stream leader and see every acknowledged write (DESIGN.md §5.2:
	// buckets read back are created with direct get off).
	LeaderReads bool
	// Description is shown by `nats kv ls` and stream info.
	Description string
}

// ObjectSpec is the configuration of one object store.
type ObjectSpec struct {
	Bucket string
	// Replicas is the stream's replica count; 0 means 1.
	Replicas int
	// Storage is where the stream lives; file storage is the zero value.
	Storage     jetstream.StorageType
	Description string
	// LeaderReads turns direct get off, so every read is answered by the
	// stream leader (nats.go turns it on for every object store).
	LeaderReads bool
}

// Buckets returns the KV buckets of DESIGN.md §9 with the given replica
// count, except composer-lease, whose TTL is the composer's to choose: see
// LeaseSpec.
func Buckets(replicas int) []KVSpec {
	kv := func(bucket string, history uint8, leaderReads bool, desc string) KVSpec {
		return KVSpec{
			Bucket:       bucket,
			History:      history,
			Replicas:     replicas,
			Storage:      jetstream.FileStorage,
			MaxValueSize: MaxValueSize,
			LeaderReads:  leaderReads,
			Description:  desc,
		}
	}
	return []KVSpec{
		// The catalog reads its own writes at once (a registration needs
		// the entry put just before, a DONE build the artifacts just
		// uploaded) and answers engines whose NOT_FOUND is final until
		// asked again: on a cluster a follower's direct get may not hold a
		// write the leader acknowledged, so these are read from the leader.
		kv(BucketCatalogEntries, 1, true, "catalog entries by fingerprint (truth)"),
		kv(BucketCatalogBuilds, 1, true, "catalog builds by fingerprint (truth)"),
		kv(BucketCatalogModules, 1, true, "module registrations and their history keys (truth)"),
		kv(BucketNodes, 1, false, "node specs (truth: operator intent)"),
		kv(BucketApprovals, 1, false, "approvals of held moves (truth: operator intent)"),
		kv(BucketAssignments, 5, false, "per-node wants, holds and signed manifest (truth: what nodes run)"),
		kv(BucketCompositions, 1, true, "signed compositions by composition key (derived)"),
		kv(BucketComposed, 1, true, "judgements of compositions by composition key (derived, advisory)"),
		kv(BucketHaves, 1, false, "what each node reports it has applied (reported)"),
		kv(BucketStatus, 1, false, "per-node compose status (derived)"),
		kv(BucketKeysets, 5, false, "the root-signed keyset under key current"),
	}
}

// LeaseSpec returns the composer-lease bucket: one key, leader, that expires
// ttl after its last write unless renewed. It is read back (the holder checks
// it still holds the lease), so reads go to the leader.
func LeaseSpec(replicas int, ttl time.Duration) KVSpec {
	return KVSpec{
		Bucket:       BucketComposerLease,
		History:      1,
		Replicas:     replicas,
		Storage:      jetstream.FileStorage,
		MaxValueSize: MaxValueSize,
		TTL:          ttl,
		LeaderReads:  true,
		Description:  "the composer lease under key leader",
	}
}

// ObjectStores returns the object stores of DESIGN.md §9 with the given
// replica count.
func ObjectStores(replicas int) []ObjectSpec {
	return []ObjectSpec{
		// Both are read right after they are written (a DONE build checks
		// its artifacts are held; an engine fetches an object as soon as
		// the composition naming it is committed): leader reads.
		{Bucket: ObjectStoreArtifacts, Replicas: replicas, Storage: jetstream.FileStorage, Description: "build artifacts by digest (truth)", LeaderReads: true},
		{Bucket: ObjectStoreObjects, Replicas: replicas, Storage: jetstream.FileStorage, Description: "composition content moved out of line, by digest (derived)", LeaderReads: true},
	}
}

// streamConfig returns the stream behind a KV bucket. It is what nats.go's
// CreateKeyValue builds, except that AllowDirect follows LeaderReads, which
// KeyValueConfig cannot express, and that the max message size leaves
// MaxHeaderBytes for headers.
func (s KVSpec) streamConfig() (jetstream.StreamConfig, error) {
	if s.Bucket == "" || !validBucketRe.MatchString(s.Bucket) {
		return jetstream.StreamConfig{}, fmt.Errorf("kv bucket name %q is invalid", s.Bucket)
	}
	history := int64(max(s.History, 1))
	if history > jetstream.KeyValueMaxHistory {
		return jetstream.StreamConfig{}, fmt.Errorf("kv bucket %s: history %d is over %d", s.Bucket, history, jetstream.KeyValueMaxHistory)
	}
	maxValue := s.valueLimit()
	if maxValue > MaxValueSize || maxValue < 0 {
		return jetstream.StreamConfig{}, fmt.Errorf("kv bucket %s: max value size %d is outside 1..%d", s.Bucket, s.MaxValueSize, MaxValueSize)
	}
	if s.TTL < 0 {
		return jetstream.StreamConfig{}, fmt.Errorf("kv bucket %s: negative ttl", s.Bucket)
	}
	// The duplicate window may not exceed MaxAge.
	duplicates := 2 * time.Minute
	if s.TTL > 0 && s.TTL < duplicates {
		duplicates = s.TTL
	}
	return jetstream.StreamConfig{
		Name:              kvStreamName(s.Bucket),
		Description:       s.Description,
		Subjects:          []string{kvSubjectPrefix(s.Bucket) + ">"},
		MaxMsgsPerSubject: history,
		MaxBytes:          -1,
		MaxAge:            s.TTL,
		MaxMsgSize:        maxValue + MaxHeaderBytes,
		Storage:           s.Storage,
		Replicas:          max(s.Replicas, 1),
		AllowRollup:       true,
		DenyDelete:        true,
		Duplicates:        duplicates,
		MaxMsgs:           -1,
		MaxConsumers:      -1,
		AllowDirect:       !s.LeaderReads,
		Discard:           jetstream.DiscardNew,
	}, nil
}

func (s KVSpec) valueLimit() int32 {
	if s.MaxValueSize == 0 {
		return MaxValueSize
	}
	return s.MaxValueSize
}

// EnsureKV creates the bucket or updates it to spec, and returns the wrapper
// services use for every KV operation. It creates the stream itself rather
// than through CreateOrUpdateKeyValue, which always turns direct get on; the
// bucket stays an ordinary nats.go KV bucket (nats kv, jetstream.KeyValue).
func EnsureKV(ctx context.Context, js jetstream.JetStream, spec KVSpec, opts ...Option) (*KV, error) {
	scfg, err := spec.streamConfig()
	if err != nil {
		return nil, err
	}
	o := newOptions(opts)
	ctx, span := o.tracer.Start(ctx, "kv.ensure "+spec.Bucket, spanKind, bucketAttr(spec.Bucket))
	defer span.End()
	if _, err := js.CreateOrUpdateStream(ctx, scfg); err != nil {
		return nil, endSpan(span, fmt.Errorf("ensure kv bucket %s: %w", spec.Bucket, err))
	}
	kv, err := openKV(ctx, js, spec.Bucket, spec.valueLimit(), o)
	return kv, endSpan(span, err)
}

// EnsureObjectStore creates the object store or updates it to spec. The
// store it returns also has a Bucket() string method, which PutObject and
// GetObject use to name their spans.
func EnsureObjectStore(ctx context.Context, js jetstream.JetStream, spec ObjectSpec) (jetstream.ObjectStore, error) {
	if spec.Bucket == "" || !validBucketRe.MatchString(spec.Bucket) {
		return nil, fmt.Errorf("object store name %q is invalid", spec.Bucket)
	}
	// A store that exists is updated here rather than by nats.go, whose
	// update would turn direct get on again for a moment at every start.
	if st, err := js.Stream(ctx, objStreamName(spec.Bucket)); err == nil {
		cfg := st.CachedInfo().Config
		want := cfg
		want.Description, want.Replicas, want.AllowDirect = spec.Description, max(spec.Replicas, 1), !spec.LeaderReads
		if !reflect.DeepEqual(cfg, want) {
			if _, err := js.UpdateStream(ctx, want); err != nil {
				return nil, fmt.Errorf("ensure object store %s: %w", spec.Bucket, err)
			}
		}
		store, err := js.ObjectStore(ctx, spec.Bucket)
		if err != nil {
			return nil, fmt.Errorf("ensure object store %s: %w", spec.Bucket, err)
		}
		return namedStore{ObjectStore: store, bucket: spec.Bucket}, nil
	} else if !errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil, fmt.Errorf("ensure object store %s: %w", spec.Bucket, err)
	}
	store, err := js.CreateObjectStore(ctx, jetstream.ObjectStoreConfig{
		Bucket:      spec.Bucket,
		Description: spec.Description,
		Storage:     spec.Storage,
		Replicas:    max(spec.Replicas, 1),
	})
	if errors.Is(err, jetstream.ErrBucketExists) || errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
		// Another service made it meanwhile.
		return EnsureObjectStore(ctx, js, spec)
	}
	if err != nil {
		return nil, fmt.Errorf("ensure object store %s: %w", spec.Bucket, err)
	}
	if spec.LeaderReads {
		if store, err = leaderReadsOnly(ctx, js, spec.Bucket, store); err != nil {
			return nil, fmt.Errorf("ensure object store %s: %w", spec.Bucket, err)
		}
	}
	return namedStore{ObjectStore: store, bucket: spec.Bucket}, nil
}

// leaderReadsOnly turns direct get off on an object store's stream and
// binds the store again, so its reads (which follow the stream's setting
// as the store found it) go to the leader.
func leaderReadsOnly(ctx context.Context, js jetstream.JetStream, bucket string, store jetstream.ObjectStore) (jetstream.ObjectStore, error) {
	st, err := js.Stream(ctx, objStreamName(bucket))
	if err != nil {
		return nil, err
	}
	cfg := st.CachedInfo().Config
	if !cfg.AllowDirect {
		return store, nil
	}
	cfg.AllowDirect = false
	if _, err := js.UpdateStream(ctx, cfg); err != nil {
		return nil, fmt.Errorf("turn direct get off: %w", err)
	}
	return js.ObjectStore(ctx, bucket)
}

// EnsureAll creates or updates every bucket and object store of DESIGN.md §9
// with the given replicas and lease TTL, and returns the KV wrappers by
// bucket name and the object stores by name.
func EnsureAll(ctx context.Context, js jetstream.JetStream, replicas int, leaseTTL time.Duration, opts ...Option) (map[string]*KV, map[string]jetstream.ObjectStore, error) {
	if leaseTTL <= 0 {
		return nil, nil, errors.New("ensure buckets: lease ttl must be positive")
	}
	kvs := map[string]*KV{}
	for _, spec := range append(Buckets(replicas), LeaseSpec(replicas, leaseTTL)) {
		kv, err := EnsureKV(ctx, js, spec, opts...)
		if err != nil {
			return nil, nil, err
		}
		kvs[spec.Bucket] = kv
	}
	stores := map[string]jetstream.ObjectStore{}
	for _, spec := range ObjectStores(replicas) {
		store, err := EnsureObjectStore(ctx, js, spec)
		if err != nil {
			return nil, nil, err
		}
		stores[spec.Bucket] = store
	}
	return kvs, stores, nil
}

// objStreamName is the stream behind an object store, as nats.go names it.
func objStreamName(bucket string) string { return "OBJ_" + bucket }
