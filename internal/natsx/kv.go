package natsx

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"mesh.dev/internal/telemetry"
)

// TracerName is the instrumentation scope of natsx spans.
const TracerName = "mesh.dev/internal/natsx"

// The KV protocol of nats.go, which the wrapper speaks so that its buckets
// stay readable and writable by nats.go, the nats CLI and other clients.
const (
	kvOperationHeader = "KV-Operation"
	kvOperationDelete = "DEL"
	kvOperationPurge  = "PURGE"
)

// Key and bucket rules of nats.go's KV (DESIGN.md §2 relies on them).
var (
	validBucketRe    = regexp.MustCompile(`^[a-zA-Z0-9_-]+$`)
	validKeyRe       = regexp.MustCompile(`^[-/_=\.a-zA-Z0-9]+$`)
	validSearchKeyRe = regexp.MustCompile(`^[-/_=\.a-zA-Z0-9*]*[>]?$`)
)

func kvStreamName(bucket string) string    { return "KV_" + bucket }
func kvSubjectPrefix(bucket string) string { return "$KV." + bucket + "." }

func keyValid(key string) bool {
	if key == "" || key[0] == '.' || key[len(key)-1] == '.' || strings.Contains(key, "..") {
		return false
	}
	return validKeyRe.MatchString(key)
}

func searchKeyValid(key string) bool {
	if key == "" || key[0] == '.' || key[len(key)-1] == '.' || strings.Contains(key, "..") {
		return false
	}
	return validSearchKeyRe.MatchString(key)
}

// Span attributes; values are never recorded.
var (
	attrBucket   = attribute.Key("kv.bucket")
	attrKey      = attribute.Key("kv.key")
	attrRevision = attribute.Key("kv.revision")
	attrFound    = attribute.Key("kv.found")
	attrObject   = attribute.Key("object.name")
	attrSize     = attribute.Key("object.size")
	spanKind     = trace.WithSpanKind(trace.SpanKindClient)
)

func bucketAttr(bucket string) trace.SpanStartOption {
	return trace.WithAttributes(attrBucket.String(bucket))
}

// endSpan records err on span, except ErrNotFound, which is an answer and not
// a failure; it returns err.
func endSpan(span trace.Span, err error) error {
	if err != nil && !errors.Is(err, ErrNotFound) {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	return err
}

// Option configures the KV wrapper and the object helpers.
type Option func(*options)

type options struct {
	tracer trace.Tracer
}

// WithTracerProvider makes the spans with tp instead of the global provider;
// the one-process dev mesh passes each service's own.
func WithTracerProvider(tp trace.TracerProvider) Option {
	return func(o *options) { o.tracer = tp.Tracer(TracerName) }
}

func newOptions(opts []Option) options {
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	if o.tracer == nil {
		o.tracer = otel.GetTracerProvider().Tracer(TracerName)
	}
	return o
}

// Entry is one revision of a key.
type Entry struct {
	Key   string
	Value []byte
	// Revision is the stream sequence of the write; Update and Delete take it
	// as the expected last revision.
	Revision uint64
	// Created is the server's timestamp of the write.
	Created time.Time
	// Op tells a value (KeyValuePut) from a delete or purge marker; Get never
	// returns a marker, Watch does unless IgnoreDeletes.
	Op jetstream.KeyValueOp
	// Header holds the headers written with the value, among them the trace
	// context of the writer (see TraceContext).
	Header nats.Header
	// Resync marks the entry a watch with ResyncMarker delivers when it
	// starts over because the stream went back: it has no key, and what
	// the watch delivers after it up to the next nil marker is what the
	// bucket holds now.
	Resync bool
}

// TraceContext returns ctx with the writer's span as remote parent, so the
// work a value causes joins the trace of the change that wrote it.
func (e Entry) TraceContext(ctx context.Context) context.Context {
	return telemetry.ExtractHeader(ctx, e.Header)
}

// KV is a JetStream KV bucket as the mesh uses it. Writes go out as JetStream
// publishes carrying the writer's trace context in headers (the nats.go KV
// API takes none), reads return those headers, and every call is a span and
// maps its errors to ErrNotFound, ErrConflict and ErrTooLarge. The messages
// are exactly those of nats.go's KV, so either can read what the other wrote.
type KV struct {
	js       jetstream.JetStream
	kv       jetstream.KeyValue
	stream   jetstream.Stream
	bucket   string
	prefix   string
	maxValue int
	direct   bool
	tracer   trace.Tracer
	// lastSeq shares LastSequence requests between concurrent callers.
	lastSeq *lastSeqShare
	// acked is the highest revision a write through this handle was
	// acknowledged with (see Acked); unsure counts the writes whose outcome
	// is unknown (see Unsure).
	acked, unsure *atomic.Uint64
}

// OpenKV binds to an existing bucket without changing it, for services that
// use a bucket another one ensures. A missing bucket is an error wrapping
// jetstream.ErrBucketNotFound (not ErrNotFound: it is a deployment fault).
func OpenKV(ctx context.Context, js jetstream.JetStream, bucket string, opts ...Option) (*KV, error) {
	return openKV(ctx, js, bucket, 0, newOptions(opts))
}

func openKV(ctx context.Context, js jetstream.JetStream, bucket string, maxValue int32, o options) (*KV, error) {
	if !validBucketRe.MatchString(bucket) {
		return nil, fmt.Errorf("kv bucket name %q is invalid", bucket)
	}
	stream, err := js.Stream(ctx, kvStreamName(bucket))
	if err != nil {
		if errors.Is(err, jetstream.ErrStreamNotFound) {
			return nil, fmt.Errorf("open kv bucket %s: %w", bucket, jetstream.ErrBucketNotFound)
		}
		return nil, fmt.Errorf("open kv bucket %s: %w", bucket, err)
	}
	kv, err := js.KeyValue(ctx, bucket)
	if err != nil {
		return nil, fmt.Errorf("open kv bucket %s: %w", bucket, err)
	}
	cfg := stream.CachedInfo().Config
	if maxValue == 0 {
		// A bucket this package did not create: take its limit, less the
		// header room EnsureKV adds, capped at the mesh's limit.
		maxValue = MaxValueSize
		if cfg.MaxMsgSize > MaxHeaderBytes && cfg.MaxMsgSize-MaxHeaderBytes < MaxValueSize {
			maxValue = cfg.MaxMsgSize - MaxHeaderBytes
		}
	}
	return &KV{
		js:       js,
		kv:       kv,
		stream:   stream,
		bucket:   bucket,
		prefix:   kvSubjectPrefix(bucket),
		maxValue: int(maxValue),
		direct:   cfg.AllowDirect,
		tracer:   o.tracer,
		lastSeq:  &lastSeqShare{},
		acked:    &atomic.Uint64{},
		unsure:   &atomic.Uint64{},
	}, nil
}

// Bucket returns the bucket's name.
func (k *KV) Bucket() string { return k.bucket }

// KeyValue returns the nats.go handle of the bucket, for what the wrapper
// does not offer; its calls carry no trace context.
func (k *KV) KeyValue() jetstream.KeyValue { return k.kv }

// LeaderReads reports whether reads are answered by the stream leader.
func (k *KV) LeaderReads() bool { return !k.direct }

// MaxValueSize returns the largest value the bucket takes.
func (k *KV) MaxValueSize() int { return k.maxValue }

func (k *KV) start(ctx context.Context, op, key string) (context.Context, trace.Span) {
	return k.tracer.Start(ctx, op+" "+k.bucket, spanKind,
		trace.WithAttributes(attrBucket.String(k.bucket), attrKey.String(key)))
}

func (k *KV) fail(span trace.Span, op, key string, err error) error {
	return endSpan(span, fmt.Errorf("kv %s: %s %s: %w", k.bucket, op, key, MapError(err)))
}

// Get returns the key's latest value with its headers, read from the stream
// leader when the bucket has LeaderReads. It returns ErrNotFound when the key
// has no value or its latest revision is a delete or purge marker.
func (k *KV) Get(ctx context.Context, key string) (Entry, error) {
	ctx, span := k.start(ctx, "kv.get", key)
	defer span.End()
	e, err := k.last(ctx, key)
	if err == nil && e.Op != jetstream.KeyValuePut {
		err = fmt.Errorf("%w (deleted at revision %d)", jetstream.ErrKeyNotFound, e.Revision)
	}
	span.SetAttributes(attrFound.Bool(err == nil))
	if err != nil {
		return Entry{}, k.fail(span, "get", key, err)
	}
	span.SetAttributes(attrRevision.Int64(int64(e.Revision)))
	return e, nil
}

// atLeastWait bounds how long GetAtLeast asks again for a write it knows of.
var atLeastWait = 2 * time.Second

// GetAtLeast is Get for a caller that knows the key was written at rev or
// later (a watch delivered that write; 0: nothing known, a plain Get). A
// bucket without LeaderReads answers gets from any replica, and one may
// not have applied that write yet: a revision below rev, or no key, is
// asked for again, backing off from 2 ms, until a revision at rev or later
// comes (a delete marker among them: ErrNotFound). ErrBehind when none did
// within atLeastWait.
func (k *KV) GetAtLeast(ctx context.Context, key string, rev uint64) (Entry, error) {
	if rev == 0 {
		return k.Get(ctx, key)
	}
	ctx, span := k.start(ctx, "kv.get", key)
	defer span.End()
	span.SetAttributes(attribute.Int64("kv.at_least", int64(rev)))
	delay := 2 * time.Millisecond
	deadline := time.Now().Add(atLeastWait)
	for {
		e, err := k.last(ctx, key)
		switch {
		case err == nil && e.Revision >= rev && e.Op != jetstream.KeyValuePut:
			return Entry{}, k.fail(span, "get", key, fmt.Errorf("%w (deleted at revision %d)", jetstream.ErrKeyNotFound, e.Revision))
		case err == nil && e.Revision >= rev:
			span.SetAttributes(attrFound.Bool(true), attrRevision.Int64(int64(e.Revision)))
			return e, nil
		case err != nil && !errors.Is(err, jetstream.ErrKeyNotFound):
			return Entry{}, k.fail(span, "get", key, err)
		}
		if !time.Now().Before(deadline) {
			return Entry{}, k.fail(span, "get", key, fmt.Errorf("%w: revision %d was written, the replicas asked hold %d", ErrBehind, rev, e.Revision))
		}
		select {
		case <-ctx.Done():
			return Entry{}, k.fail(span, "get", key, ctx.Err())
		case <-time.After(delay):
		}
		delay = min(2*delay, 200*time.Millisecond)
	}
}

// last returns the key's latest message, marker or not.
func (k *KV) last(ctx context.Context, key string) (Entry, error) {
	if !keyValid(key) {
		return Entry{}, fmt.Errorf("%w: %q", jetstream.ErrInvalidKey, key)
	}
	m, err := Request(ctx, func(ctx context.Context) (*jetstream.RawStreamMsg, error) {
		return k.stream.GetLastMsgForSubject(ctx, k.prefix+key)
	})
	if err != nil {
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return Entry{}, jetstream.ErrKeyNotFound
		}
		return Entry{}, err
	}
	h := m.Header
	if k.direct {
		h = withoutDirectGetHeaders(h)
	}
	return Entry{
		Key:      key,
		Value:    m.Data,
		Revision: m.Sequence,
		Created:  m.Time,
		Op:       opOf(m.Header),
		Header:   h,
	}, nil
}

// directGetHeaders are added by the server to a direct get reply; they are
// not the writer's, and a leader read has none, so they are dropped.
var directGetHeaders = []string{
	jetstream.StreamHeader, jetstream.SequenceHeader, jetstream.TimeStampHeaer,
	jetstream.SubjectHeader, jetstream.LastSequenceHeader, "Nats-Num-Pending",
}

func withoutDirectGetHeaders(h nats.Header) nats.Header {
	if len(h) == 0 {
		return h
	}
	out := make(nats.Header, len(h))
	for k, v := range h {
		if !slices.Contains(directGetHeaders, k) {
			out[k] = v
		}
	}
	return out
}

// opOf reads the operation of a KV message as nats.go does, including the
// markers the server writes itself (Nats-Marker-Reason).
func opOf(h nats.Header) jetstream.KeyValueOp {
	if len(h) == 0 {
		return jetstream.KeyValuePut
	}
	switch h.Get(kvOperationHeader) {
	case kvOperationDelete:
		return jetstream.KeyValueDelete
	case kvOperationPurge:
		return jetstream.KeyValuePurge
	}
	switch h.Get(jetstream.MarkerReasonHeader) {
	case "MaxAge", "Purge":
		return jetstream.KeyValuePurge
	case "Remove":
		return jetstream.KeyValueDelete
	}
	return jetstream.KeyValuePut
}

// publish writes one KV message carrying the trace context of ctx and the
// extra headers. expect, when not nil, is the revision the key's last
// message must have (0: none).
func (k *KV) publish(ctx context.Context, key string, value []byte, expect *uint64, op string, extra ...nats.Header) (uint64, error) {
	if !keyValid(key) {
		return 0, fmt.Errorf("%w: %q", jetstream.ErrInvalidKey, key)
	}
	if len(value) > k.maxValue {
		return 0, fmt.Errorf("%w: value is %d bytes, over the bucket's limit of %d", ErrTooLarge, len(value), k.maxValue)
	}
	m := &nats.Msg{Subject: k.prefix + key, Data: value, Header: nats.Header{}}
	for _, h := range extra {
		for name, values := range h {
			m.Header[name] = slices.Clone(values)
		}
	}
	telemetry.InjectHeader(ctx, m.Header)
	if expect != nil {
		m.Header.Set(jetstream.ExpectedLastSubjSeqHeader, strconv.FormatUint(*expect, 10))
	}
	switch op {
	case kvOperationDelete:
		m.Header.Set(kvOperationHeader, kvOperationDelete)
	case kvOperationPurge:
		m.Header.Set(kvOperationHeader, kvOperationPurge)
		m.Header.Set(jetstream.MsgRollup, jetstream.MsgRollupSubject)
	}
	ack, err := Request(ctx, func(ctx context.Context) (*jetstream.PubAck, error) { return k.js.PublishMsg(ctx, m) })
	if err != nil {
		var refused *jetstream.APIError
		if !errors.As(err, &refused) {
			// No answer from the stream (a timeout, a connection lost):
			// the write may have been stored all the same.
			k.unsure.Add(1)
		}
		return 0, err
	}
	for {
		acked := k.acked.Load()
		if ack.Sequence <= acked || k.acked.CompareAndSwap(acked, ack.Sequence) {
			break
		}
	}
	return ack.Sequence, nil
}

// Acked returns the highest revision a write through this handle (a put,
// create, update, delete or purge) was acknowledged with, 0 before the
// first. A watch of the bucket that delivered that revision has delivered
// every write this handle made before — a barrier on the process's own
// writes that asks the server nothing (LastSequence asks it for everyone's).
func (k *KV) Acked() uint64 { return k.acked.Load() }

// Unsure counts what makes this handle unsure of what the stream holds: the
// writes through it that got no answer (a timeout, a connection lost), each
// of which may have been stored without Acked knowing its revision, and the
// connection's reconnects (the server may have come back from an older
// state: a restore, a snapshot). A barrier on Acked taken while the count
// moved must ask the stream instead.
func (k *KV) Unsure() uint64 {
	n := k.unsure.Load()
	if nc := k.js.Conn(); nc != nil {
		n += nc.Stats().Reconnects
	}
	return n
}

// Create writes the key's first value and returns its revision. A key whose
// last revision is a delete or purge marker counts as absent, as in nats.go.
// It returns ErrConflict when the key holds a value, ErrTooLarge when value
// is over the bucket's limit.
func (k *KV) Create(ctx context.Context, key string, value []byte) (uint64, error) {
	return k.create(ctx, key, value, nil)
}

// CreateWithHeader is Create writing h with the value, for what readers
// should learn from a listing without reading values (ListMeta and a
// MetaOnly watch deliver the headers). The headers of the KV protocol and
// the trace context are the wrapper's: h must not set them.
func (k *KV) CreateWithHeader(ctx context.Context, key string, value []byte, h nats.Header) (uint64, error) {
	for name := range h {
		if name == kvOperationHeader || strings.HasPrefix(name, "Nats-") || name == "traceparent" || name == "tracestate" || name == "baggage" {
			return 0, fmt.Errorf("kv %s: create %s: header %s is the wrapper's", k.bucket, key, name)
		}
	}
	return k.create(ctx, key, value, h)
}

func (k *KV) create(ctx context.Context, key string, value []byte, h nats.Header) (uint64, error) {
	ctx, span := k.start(ctx, "kv.create", key)
	defer span.End()
	var none uint64
	rev, err := k.publish(ctx, key, value, &none, "", h)
	if err != nil && isWrongLastSequence(err) {
		// Only a marker may stand where a value is expected to be absent:
		// write over it with the marker's revision as the expected one.
		if last, lerr := k.last(ctx, key); lerr == nil && last.Op != jetstream.KeyValuePut {
			rev, err = k.publish(ctx, key, value, &last.Revision, "", h)
		}
	}
	if err != nil {
		if isWrongLastSequence(err) {
			err = fmt.Errorf("key exists: %w", err)
		}
		return 0, k.fail(span, "create", key, err)
	}
	span.SetAttributes(attrRevision.Int64(int64(rev)))
	return rev, nil
}

// Update writes value when the key's last revision is rev and returns the new
// revision. It returns ErrConflict when it is not (another writer came
// first, or the key was deleted), ErrTooLarge when value is over the limit.
func (k *KV) Update(ctx context.Context, key string, value []byte, rev uint64) (uint64, error) {
	ctx, span := k.start(ctx, "kv.update", key)
	defer span.End()
	span.SetAttributes(attribute.Int64("kv.expected_revision", int64(rev)))
	newRev, err := k.publish(ctx, key, value, &rev, "")
	if err != nil {
		return 0, k.fail(span, "update", key, err)
	}
	span.SetAttributes(attrRevision.Int64(int64(newRev)))
	return newRev, nil
}

// Put writes value whatever the key holds and returns the new revision. The
// mesh uses it only for records that have one writer (DESIGN.md §5.2: never
// a blind overwrite of a composition). It returns ErrTooLarge when value is
// over the limit.
func (k *KV) Put(ctx context.Context, key string, value []byte) (uint64, error) {
	ctx, span := k.start(ctx, "kv.put", key)
	defer span.End()
	rev, err := k.publish(ctx, key, value, nil, "")
	if err != nil {
		return 0, k.fail(span, "put", key, err)
	}
	span.SetAttributes(attrRevision.Int64(int64(rev)))
	return rev, nil
}

// DeleteOption configures Delete and Purge.
type DeleteOption func(*deleteOptions)

type deleteOptions struct {
	lastRevision uint64
}

// LastRevision makes a delete or purge happen only when the key's last
// revision is rev; otherwise it fails with ErrConflict.
func LastRevision(rev uint64) DeleteOption {
	return func(o *deleteOptions) { o.lastRevision = rev }
}

// Delete writes a delete marker for the key, keeping its history. Deleting
// an absent key writes a marker too and is not an error. With LastRevision
// it returns ErrConflict when the key's last revision differs.
func (k *KV) Delete(ctx context.Context, key string, opts ...DeleteOption) error {
	return k.remove(ctx, "kv.delete", "delete", kvOperationDelete, key, opts)
}

// Purge writes a purge marker that removes the key's history. With
// LastRevision it returns ErrConflict when the key's last revision differs.
func (k *KV) Purge(ctx context.Context, key string, opts ...DeleteOption) error {
	return k.remove(ctx, "kv.purge", "purge", kvOperationPurge, key, opts)
}

func (k *KV) remove(ctx context.Context, spanName, op, marker, key string, opts []DeleteOption) error {
	ctx, span := k.start(ctx, spanName, key)
	defer span.End()
	var o deleteOptions
	for _, opt := range opts {
		opt(&o)
	}
	var expect *uint64
	if o.lastRevision != 0 {
		expect = &o.lastRevision
		span.SetAttributes(attribute.Int64("kv.expected_revision", int64(o.lastRevision)))
	}
	rev, err := k.publish(ctx, key, nil, expect, marker)
	if err != nil {
		return k.fail(span, op, key, err)
	}
	span.SetAttributes(attrRevision.Int64(int64(rev)))
	return nil
}

// ListKeys returns the sorted keys that hold a value and match any of the
// subject filters (all keys when none is given), e.g. "<node>.*.*". An empty
// bucket gives an empty list, not an error. Unlike nats.go's key lister it
// fails, rather than returning a short list, when the listing is cut off.
func (k *KV) ListKeys(ctx context.Context, filters ...string) ([]string, error) {
	entries, err := k.list(ctx, "kv.list_keys", "list keys", filters)
	if err != nil {
		return nil, err
	}
	keys := make([]string, len(entries))
	for i, e := range entries {
		keys[i] = e.Key
	}
	return keys, nil
}

// ListMeta is ListKeys returning, for each key, its latest revision without
// the value: revision, server timestamp (Created) and headers. Pruning orders
// a node's compositions by the time of their last write (DESIGN.md §5.2 step
// 8) with it, without reading every value.
func (k *KV) ListMeta(ctx context.Context, filters ...string) ([]Entry, error) {
	return k.list(ctx, "kv.list_meta", "list meta", filters)
}

func (k *KV) list(ctx context.Context, spanName, op string, filters []string) ([]Entry, error) {
	what := strings.Join(filters, ",")
	ctx, span := k.start(ctx, spanName, what)
	defer span.End()
	w, err := k.watch(ctx, filters, watchOptions{ignoreDeletes: true, metaOnly: true, oneShot: true})
	if err != nil {
		return nil, k.fail(span, op, what, err)
	}
	defer w.Stop()
	// A key written during the listing may come twice; the last one wins.
	latest := map[string]Entry{}
	for {
		select {
		case e, ok := <-w.Updates():
			if !ok {
				err := w.Err()
				if err == nil {
					err = errors.New("watcher closed before the initial keys were listed")
				}
				return nil, k.fail(span, op, what, err)
			}
			if e != nil {
				e.Value = nil // a headers-only message has none; the size header stays
				latest[e.Key] = *e
				continue
			}
			entries := make([]Entry, 0, len(latest))
			for _, e := range latest {
				entries = append(entries, e)
			}
			slices.SortFunc(entries, func(a, b Entry) int { return strings.Compare(a.Key, b.Key) })
			span.SetAttributes(attribute.Int("kv.keys", len(entries)))
			return entries, nil
		case <-ctx.Done():
			return nil, k.fail(span, op, what, ctx.Err())
		}
	}
}

// Status returns the bucket's status and configuration.
func (k *KV) Status(ctx context.Context) (jetstream.KeyValueStatus, error) {
	ctx, span := k.tracer.Start(ctx, "kv.status "+k.bucket, spanKind, bucketAttr(k.bucket))
	defer span.End()
	st, err := Request(ctx, k.kv.Status)
	if err != nil {
		return nil, endSpan(span, fmt.Errorf("kv %s: status: %w", k.bucket, MapError(err)))
	}
	return st, nil
}
