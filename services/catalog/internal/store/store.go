// Package store keeps the catalog's truth in JetStream (DESIGN.md §9): the
// KV buckets catalog-entries and catalog-builds (key: fingerprint hex),
// catalog-modules (key "<module>" for the current registration and
// "<module>.<seq>" for its immutable history) and the object store
// artifacts (named by digest). Records are stored as canonical bytes; an
// entry is written with its module in the Mesh-Module header, from which an
// in-memory index orders entries by module for ListEntries. Every
// KV and object call is a span (natsx). Errors wrap natsx.ErrNotFound,
// natsx.ErrConflict and natsx.ErrTooLarge where those apply, ErrMismatch for
// an artifact whose bytes are not what was declared and ErrHistoryConflict
// for a history key that would be rewritten.
package store

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/protobuf/proto"

	"mesh.dev/internal/canonical"
	"mesh.dev/internal/lru"
	"mesh.dev/internal/names"
	"mesh.dev/internal/natsx"
	catalogv1 "mesh.dev/proto/mesh/catalog/v1"
)

// DefaultEntryCacheBytes bounds the in-memory cache of entries. Entries are
// immutable and content-addressed, so a cached entry is never stale.
const DefaultEntryCacheBytes = 64 << 20

// TracerName is the instrumentation scope of the store's own spans.
const TracerName = "mesh.dev/services/catalog/internal/store"

// Config is what Open needs besides a JetStream context.
type Config struct {
	// Replicas of every bucket and of the object store (1 on one machine, 3
	// on a cluster); 0 means 1.
	Replicas int
	// EntryCacheBytes bounds the entry cache; 0 means DefaultEntryCacheBytes
	// and a negative value turns the cache off.
	EntryCacheBytes int
	// TracerProvider makes the KV and object spans; nil means the global one.
	TracerProvider trace.TracerProvider
	Logger         *slog.Logger
}

// Store is the catalog's persistence.
type Store struct {
	js        jetstream.JetStream
	entries   *natsx.KV
	builds    *natsx.KV
	modules   *natsx.KV
	artifacts jetstream.ObjectStore
	opts      []natsx.Option
	tracer    trace.Tracer
	log       *slog.Logger

	// cache holds entries by fingerprint, bounded by their encoded size;
	// entries never change once written, so it needs no invalidation.
	cache *lru.Cache[*catalogv1.Entry]
	index *entryIndex
}

// Open creates or updates the catalog's buckets and object store with the
// settings of natsx.Buckets and natsx.ObjectStores (DESIGN.md §9) and
// returns the store over them.
func Open(ctx context.Context, js jetstream.JetStream, cfg Config) (*Store, error) {
	replicas := max(cfg.Replicas, 1)
	var opts []natsx.Option
	if cfg.TracerProvider != nil {
		opts = append(opts, natsx.WithTracerProvider(cfg.TracerProvider))
	}
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	tp := cfg.TracerProvider
	if tp == nil {
		tp = otel.GetTracerProvider()
	}
	s := &Store{js: js, opts: opts, tracer: tp.Tracer(TracerName), log: log, index: newEntryIndex()}
	kvs := map[string]**natsx.KV{
		natsx.BucketCatalogEntries: &s.entries,
		natsx.BucketCatalogBuilds:  &s.builds,
		natsx.BucketCatalogModules: &s.modules,
	}
	for _, spec := range natsx.Buckets(replicas) {
		dst, ok := kvs[spec.Bucket]
		if !ok {
			continue
		}
		kv, err := natsx.EnsureKV(ctx, js, spec, opts...)
		if err != nil {
			return nil, err
		}
		*dst = kv
	}
	for bucket, dst := range kvs {
		if *dst == nil {
			return nil, fmt.Errorf("store: natsx.Buckets has no bucket %s", bucket)
		}
	}
	for _, spec := range natsx.ObjectStores(replicas) {
		if spec.Bucket != natsx.ObjectStoreArtifacts {
			continue
		}
		store, err := natsx.EnsureObjectStore(ctx, js, spec)
		if err != nil {
			return nil, err
		}
		s.artifacts = store
	}
	if s.artifacts == nil {
		return nil, fmt.Errorf("store: natsx.ObjectStores has no store %s", natsx.ObjectStoreArtifacts)
	}
	cacheBytes := cfg.EntryCacheBytes
	if cacheBytes == 0 {
		cacheBytes = DefaultEntryCacheBytes
	}
	if cacheBytes > 0 {
		s.cache = lru.New[*catalogv1.Entry](cacheBytes)
	}
	return s, nil
}

// Artifacts returns the artifacts object store, for tests and benchmarks.
func (s *Store) Artifacts() jetstream.ObjectStore { return s.artifacts }

func fpKey(fp string) (string, error) {
	h := names.FingerprintHex(fp)
	if h == "" {
		return "", fmt.Errorf("%q is not a fingerprint", fp)
	}
	return h, nil
}

// Entry returns the entry of a fingerprint, from the cache when held. The
// entry is shared: callers must not modify it. It returns an error wrapping
// natsx.ErrNotFound when there is none.
func (s *Store) Entry(ctx context.Context, fp string) (*catalogv1.Entry, error) {
	if e, ok := s.cache.Get(fp); ok {
		return e, nil
	}
	key, err := fpKey(fp)
	if err != nil {
		return nil, err
	}
	v, err := s.entries.Get(ctx, key)
	if err != nil {
		return nil, err
	}
	e := &catalogv1.Entry{}
	if err := proto.Unmarshal(v.Value, e); err != nil {
		return nil, fmt.Errorf("entry %s: stored value does not decode: %w", fp, err)
	}
	if e.GetFingerprint() != fp {
		return nil, fmt.Errorf("entry %s: stored under the key of another fingerprint (%s)", fp, e.GetFingerprint())
	}
	s.remember(e, len(v.Value))
	return e, nil
}

func (s *Store) remember(e *catalogv1.Entry, size int) {
	s.cache.Put(e.GetFingerprint(), e, size)
}

// CreateEntry stores a new entry, its module in the ModuleHeader header.
// When the fingerprint is already held it stores nothing and returns the
// held entry with created false, for the caller to compare.
func (s *Store) CreateEntry(ctx context.Context, e *catalogv1.Entry) (held *catalogv1.Entry, created bool, err error) {
	key, err := fpKey(e.GetFingerprint())
	if err != nil {
		return nil, false, err
	}
	b, err := canonical.Marshal(e)
	if err != nil {
		return nil, false, err
	}
	if _, err := s.entries.CreateWithHeader(ctx, key, b, nats.Header{ModuleHeader: []string{e.GetModule()}}); err != nil {
		if !errors.Is(err, natsx.ErrConflict) {
			return nil, false, err
		}
		held, err := s.Entry(ctx, e.GetFingerprint())
		if err != nil {
			return nil, false, err
		}
		return held, false, nil
	}
	s.remember(e, len(b))
	return e, true, nil
}

// Build returns the build of a fingerprint and its revision, or an error
// wrapping natsx.ErrNotFound.
func (s *Store) Build(ctx context.Context, fp string) (*catalogv1.Build, uint64, error) {
	key, err := fpKey(fp)
	if err != nil {
		return nil, 0, err
	}
	v, err := s.builds.Get(ctx, key)
	if err != nil {
		return nil, 0, err
	}
	b := &catalogv1.Build{}
	if err := proto.Unmarshal(v.Value, b); err != nil {
		return nil, 0, fmt.Errorf("build %s: stored value does not decode: %w", fp, err)
	}
	return b, v.Revision, nil
}

// PutBuild writes a build: created when rev is 0, else only over revision
// rev. It returns an error wrapping natsx.ErrConflict when another write came
// first.
func (s *Store) PutBuild(ctx context.Context, b *catalogv1.Build, rev uint64) (uint64, error) {
	key, err := fpKey(b.GetFingerprint())
	if err != nil {
		return 0, err
	}
	v, err := canonical.Marshal(b)
	if err != nil {
		return 0, err
	}
	if rev == 0 {
		return s.builds.Create(ctx, key, v)
	}
	return s.builds.Update(ctx, key, v, rev)
}

// HistoryKey returns the key of a module's registration number seq.
func HistoryKey(module string, seq uint64) string {
	return module + "." + strconv.FormatUint(seq, 10)
}

func decodeRegistration(key string, value []byte) (*catalogv1.Registration, error) {
	r := &catalogv1.Registration{}
	if err := proto.Unmarshal(value, r); err != nil {
		return nil, fmt.Errorf("registration %s: stored value does not decode: %w", key, err)
	}
	return r, nil
}

// Registration returns a module's current registration and its revision,
// or an error wrapping natsx.ErrNotFound.
func (s *Store) Registration(ctx context.Context, module string) (*catalogv1.Registration, uint64, error) {
	v, err := s.modules.Get(ctx, module)
	if err != nil {
		return nil, 0, err
	}
	r, err := decodeRegistration(module, v.Value)
	if err != nil {
		return nil, 0, err
	}
	return r, v.Revision, nil
}

// PutRegistration makes r the module's current registration: created when
// rev is 0, else only over revision rev (natsx.ErrConflict otherwise). The
// write carries the trace context of ctx in its headers.
func (s *Store) PutRegistration(ctx context.Context, r *catalogv1.Registration, rev uint64) (uint64, error) {
	v, err := canonical.Marshal(r)
	if err != nil {
		return 0, err
	}
	if rev == 0 {
		return s.modules.Create(ctx, r.GetModule(), v)
	}
	return s.modules.Update(ctx, r.GetModule(), v, rev)
}

// ErrHistoryConflict is returned by PutHistory when the history key holds
// another registration: history is never rewritten, and this is no race a
// retry resolves but a store changed by hand.
var ErrHistoryConflict = errors.New("the history key holds another registration")

// PutHistory writes r as the immutable history key "<module>.<seq>". A key
// already holding the same registration is not an error; one holding
// another is (ErrHistoryConflict), and is left as it is.
func (s *Store) PutHistory(ctx context.Context, r *catalogv1.Registration) error {
	key := HistoryKey(r.GetModule(), r.GetSeq())
	v, err := canonical.Marshal(r)
	if err != nil {
		return err
	}
	if _, err := s.modules.Create(ctx, key, v); err != nil {
		if !errors.Is(err, natsx.ErrConflict) {
			return err
		}
		held, gerr := s.modules.Get(ctx, key)
		if gerr != nil {
			return gerr
		}
		if !slices.Equal(held.Value, v) {
			other, derr := decodeRegistration(key, held.Value)
			if derr != nil {
				return fmt.Errorf("history key %s: %w (%v)", key, ErrHistoryConflict, derr)
			}
			return fmt.Errorf("history key %s: %w: %s registered by %s, not %s registered by %s", key, ErrHistoryConflict,
				other.GetFingerprint(), other.GetRegisteredBy(), r.GetFingerprint(), r.GetRegisteredBy())
		}
	}
	return nil
}

// historySeqs returns the sequence numbers of a module's history keys,
// ascending.
func (s *Store) historySeqs(ctx context.Context, module string) ([]uint64, error) {
	keys, err := s.modules.ListKeys(ctx, module+".*")
	if err != nil {
		return nil, err
	}
	seqs := make([]uint64, 0, len(keys))
	for _, k := range keys {
		n, err := strconv.ParseUint(strings.TrimPrefix(k, module+"."), 10, 64)
		if err != nil {
			s.log.Warn("catalog-modules holds a history key that is no number", "key", k)
			continue
		}
		seqs = append(seqs, n)
	}
	slices.Sort(seqs)
	return seqs, nil
}

// LastSeq returns the highest sequence number of a module's history, 0 when
// it has none.
func (s *Store) LastSeq(ctx context.Context, module string) (uint64, error) {
	seqs, err := s.historySeqs(ctx, module)
	if err != nil || len(seqs) == 0 {
		return 0, err
	}
	return seqs[len(seqs)-1], nil
}

// History returns up to limit of a module's newest registrations, oldest
// first.
func (s *Store) History(ctx context.Context, module string, limit int) ([]*catalogv1.Registration, error) {
	seqs, err := s.historySeqs(ctx, module)
	if err != nil {
		return nil, err
	}
	if limit > 0 && len(seqs) > limit {
		seqs = seqs[len(seqs)-limit:]
	}
	out := make([]*catalogv1.Registration, 0, len(seqs))
	for _, seq := range seqs {
		key := HistoryKey(module, seq)
		v, err := s.modules.Get(ctx, key)
		if errors.Is(err, natsx.ErrNotFound) {
			continue // listed, then deleted by hand
		}
		if err != nil {
			return nil, err
		}
		r, err := decodeRegistration(key, v.Value)
		if err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, nil
}

// Registrations returns every module's current registration, by module.
func (s *Store) Registrations(ctx context.Context) ([]*catalogv1.Registration, error) {
	keys, err := s.modules.ListKeys(ctx, "*")
	if err != nil {
		return nil, err
	}
	out := make([]*catalogv1.Registration, 0, len(keys))
	for _, k := range keys {
		r, _, err := s.Registration(ctx, k)
		if errors.Is(err, natsx.ErrNotFound) {
			continue
		}
		if err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, nil
}

// WatchRegistrations watches the current registrations (keys "<module>",
// not the history keys): their latest values, a nil marker, then every
// change, delete markers included. When the bucket's stream went back (a
// store restored from an older snapshot) the watch delivers an entry with
// Resync set and starts over (natsx.ResyncMarker).
func (s *Store) WatchRegistrations(ctx context.Context) (*natsx.Watcher, error) {
	return s.modules.Watch(ctx, "*", natsx.ResyncMarker())
}

// DecodeRegistration decodes a watched value; a delete or purge marker
// gives a registration of the module with no fingerprint (DESIGN.md §2: it
// then counts as having none).
func DecodeRegistration(e *natsx.Entry) (*catalogv1.Registration, error) {
	if e.Op != jetstream.KeyValuePut {
		return &catalogv1.Registration{Module: e.Key}, nil
	}
	return decodeRegistration(e.Key, e.Value)
}

// ModulesRevision returns the last revision of the catalog-modules bucket.
func (s *Store) ModulesRevision(ctx context.Context) (uint64, error) {
	return lastSeq(ctx, s.modules)
}

// RepairHistory writes the history key of every current registration that
// lacks one: a catalog that stopped between writing a registration and its
// history key leaves that gap. It returns how many keys it wrote.
func (s *Store) RepairHistory(ctx context.Context) (int, error) {
	regs, err := s.Registrations(ctx)
	if err != nil {
		return 0, err
	}
	n := 0
	for _, r := range regs {
		key := HistoryKey(r.GetModule(), r.GetSeq())
		if _, err := s.modules.Get(ctx, key); err == nil {
			continue
		} else if !errors.Is(err, natsx.ErrNotFound) {
			return n, err
		}
		if err := s.PutHistory(ctx, r); err != nil {
			return n, err
		}
		n++
	}
	return n, nil
}
