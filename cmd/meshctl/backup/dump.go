package backup

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"

	"mesh.dev/internal/envelope"
	"mesh.dev/internal/natsx"
	composerv1 "mesh.dev/proto/mesh/composer/v1"
	typev1 "mesh.dev/proto/mesh/type/v1"
)

// DefaultIdle is how long a read waits for a message its stream still holds
// before it asks the stream again.
const DefaultIdle = 5 * time.Second

// stallRounds is how many idle waits in a row, with messages still held
// beyond the last one read, make a backup give up on a bucket.
const stallRounds = 6

// Options configure Backup.
type Options struct {
	// Source describes the server, for the archive's record.
	Source Source
	// Progress, when set, is told of each bucket as it is finished.
	Progress func(BucketSummary)
	// Idle is DefaultIdle when zero.
	Idle time.Duration
	// Now is time.Now when nil.
	Now func() time.Time
}

// Backup reads the buckets and stores of Buckets from JetStream and writes
// them to w as an archive (see the package comment), streaming: a KV value
// is held in memory only while it is written, an object's content not at
// all. It returns the manifest it wrote.
//
// What a backup taken while the mesh writes holds: each KV bucket is read
// as its stream, in order, up to the last message it held when its read
// started, and then every key met nowhere in that read (written, or
// rewritten after its earlier message was passed over, while it ran) at its
// latest message. So every record is a write the server acknowledged; every
// key that exists when its bucket's read starts and still exists when it
// ends is in the archive; a key's archived revisions are in the order they
// were written. Buckets are read one after another, not at one instant: a
// change made while the backup runs may be in one bucket and not another.
// Objects are those listed when their store's turn comes, each checked
// against its digest as it is read.
func Backup(ctx context.Context, js jetstream.JetStream, w io.Writer, opts Options) (*Manifest, error) {
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.Idle <= 0 {
		opts.Idle = DefaultIdle
	}
	started := opts.Now().UTC()
	aw := newArchiveWriter(w, started)
	if _, err := aw.putJSON(headerFile, &Header{Format: Format, StartedAt: started, Source: opts.Source, Buckets: Buckets}); err != nil {
		return nil, err
	}
	m := &Manifest{Format: Format, StartedAt: started, Source: opts.Source}
	wanted := &wantedSet{compositions: map[string]bool{}, objects: map[string]bool{}}
	for _, bucket := range Buckets {
		var sum BucketSummary
		var err error
		switch {
		case bucket == natsx.BucketAssignments:
			sum, err = dumpKV(ctx, js, aw, bucket, opts.Idle, wanted.noteAssignment)
		case bucket == natsx.BucketCompositions:
			sum, err = dumpWantedCompositions(ctx, js, aw, wanted)
		case bucket == natsx.ObjectStoreObjects:
			sum, err = dumpObjects(ctx, js, aw, bucket, wanted.objectNames())
		case kindOf(bucket) == KindObject:
			sum, err = dumpObjects(ctx, js, aw, bucket, nil)
		default:
			sum, err = dumpKV(ctx, js, aw, bucket, opts.Idle, nil)
		}
		if err != nil {
			return nil, fmt.Errorf("back up %s: %w", bucket, err)
		}
		m.Buckets = append(m.Buckets, sum)
		if opts.Progress != nil {
			opts.Progress(sum)
		}
	}
	absent := 0
	for _, b := range m.Buckets {
		if b.Absent {
			absent++
		}
	}
	if absent == len(m.Buckets) {
		return nil, errors.New("the server holds none of the mesh's buckets: wrong server or account?")
	}
	m.FinishedAt = opts.Now().UTC()
	if err := aw.finish(m); err != nil {
		return nil, err
	}
	return m, nil
}

// wantedSet collects the compositions the archived assignments' wants name
// (every kept revision's, so the composition a node applied under an
// older manifest is there to judge against), then the objects those
// compositions name.
type wantedSet struct {
	compositions map[string]bool
	objects      map[string]bool
}

func (w *wantedSet) noteAssignment(rec *Record, value []byte) {
	if rec.Op != OpPut {
		return
	}
	a := &composerv1.Assignment{}
	if proto.Unmarshal(value, a) != nil {
		return // a value that does not decode names nothing
	}
	for _, want := range a.GetWants() {
		if k := want.GetCompositionKey(); validKey(k) {
			w.compositions[k] = true
		}
	}
}

func (w *wantedSet) noteComposition(value []byte) {
	env := &typev1.Envelope{}
	c := &typev1.Composition{}
	if proto.Unmarshal(value, env) != nil || envelope.Open(env, typev1.PayloadType_PAYLOAD_TYPE_COMPOSITION, c) != nil {
		return
	}
	for _, r := range c.GetResources() {
		if o := r.GetObject(); o != nil && o.GetDigest() != "" {
			w.objects[o.GetDigest()] = true
		}
	}
}

// objectNames returns the objects to back up, sorted; never nil, since nil
// tells dumpObjects to take the whole store.
func (w *wantedSet) objectNames() []string {
	out := slices.Sorted(maps.Keys(w.objects))
	if out == nil {
		out = []string{}
	}
	return out
}

func kvStream(bucket string) string    { return "KV_" + bucket }
func kvPrefix(bucket string) string    { return "$KV." + bucket + "." }
func objectStream(store string) string { return "OBJ_" + store }

// opOf reads a KV message's operation as nats.go does, including the
// markers the server writes itself.
func opOf(h nats.Header) string {
	switch h.Get("KV-Operation") {
	case "DEL":
		return OpDel
	case "PURGE":
		return OpPurge
	}
	switch h.Get(jetstream.MarkerReasonHeader) {
	case "MaxAge", "Purge":
		return OpPurge
	case "Remove":
		return OpDel
	}
	return OpPut
}

func configOf(cfg jetstream.StreamConfig) *BucketConfig {
	c := &BucketConfig{Replicas: cfg.Replicas, Storage: cfg.Storage.String(), Description: cfg.Description}
	if strings.HasPrefix(cfg.Name, "KV_") {
		c.History = cfg.MaxMsgsPerSubject
		if cfg.MaxMsgSize > natsx.MaxHeaderBytes {
			c.MaxValueSize = cfg.MaxMsgSize - natsx.MaxHeaderBytes
		}
	}
	return c
}

// streamReader reads the messages of a stream in order, from the first it
// keeps.
type streamReader struct {
	js     jetstream.JetStream
	stream jetstream.Stream
	name   string
	idle   time.Duration
}

// each calls fn for every message up to sequence bound (0: until it has
// caught up with the stream's last message), and returns the last sequence
// it passed to fn.
func (r *streamReader) each(ctx context.Context, bound uint64, fn func(msg jetstream.Msg, meta *jetstream.MsgMetadata) error) (lastSeq uint64, err error) {
	info, err := r.stream.Info(ctx)
	if err != nil {
		return 0, err
	}
	if info.State.Msgs == 0 || (bound > 0 && info.State.FirstSeq > bound) {
		return 0, nil
	}
	cons, err := r.js.OrderedConsumer(ctx, r.name, jetstream.OrderedConsumerConfig{
		DeliverPolicy:     jetstream.DeliverAllPolicy,
		InactiveThreshold: time.Minute,
	})
	if err != nil {
		return 0, fmt.Errorf("consumer: %w", err)
	}
	defer func() {
		if ci := cons.CachedInfo(); ci != nil {
			dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			_ = r.js.DeleteConsumer(dctx, r.name, ci.Name)
			cancel()
		}
	}()
	it, err := cons.Messages()
	if err != nil {
		return 0, fmt.Errorf("consumer: %w", err)
	}
	defer it.Stop()
	idleRounds := 0
	for {
		if err := ctx.Err(); err != nil {
			return lastSeq, err
		}
		msg, err := it.Next(jetstream.NextMaxWait(r.idle))
		if errors.Is(err, nats.ErrTimeout) {
			// Nothing came within the wait: done if the stream holds
			// nothing after the last message read (or up to the bound).
			info, err := r.stream.Info(ctx)
			if err != nil {
				return lastSeq, err
			}
			end := info.State.LastSeq
			if bound > 0 {
				end = min(end, bound)
			}
			if info.State.Msgs == 0 || end <= lastSeq {
				return lastSeq, nil
			}
			if idleRounds++; idleRounds >= stallRounds {
				return lastSeq, fmt.Errorf("no message came for %s although the stream holds up to sequence %d and %d was the last read",
					time.Duration(stallRounds)*r.idle, info.State.LastSeq, lastSeq)
			}
			continue
		}
		if err != nil {
			return lastSeq, fmt.Errorf("read: %w", err)
		}
		idleRounds = 0
		meta, err := msg.Metadata()
		if err != nil {
			return lastSeq, err
		}
		if bound > 0 && meta.Sequence.Stream > bound {
			return lastSeq, nil
		}
		if err := fn(msg, meta); err != nil {
			return lastSeq, err
		}
		lastSeq = meta.Sequence.Stream
		if meta.NumPending == 0 || (bound > 0 && lastSeq >= bound) {
			return lastSeq, nil
		}
	}
}

// directGetHeaders are added by the server to a direct get's reply; they are
// not the writer's.
var directGetHeaders = []string{
	jetstream.StreamHeader, jetstream.SequenceHeader, jetstream.TimeStampHeaer,
	jetstream.SubjectHeader, jetstream.LastSequenceHeader, "Nats-Num-Pending",
}

// kvWriter writes the records of one KV bucket.
type kvWriter struct {
	aw     *archiveWriter
	bucket string
	prefix string
	sum    *BucketSummary
	keys   map[string]bool
	// seen, when set, is told of every record written.
	seen func(rec *Record, value []byte)
}

func (k *kvWriter) write(subject string, hdr nats.Header, data []byte, seq uint64, ts time.Time) error {
	key, ok := strings.CutPrefix(subject, k.prefix)
	if !ok || !validKey(key) {
		return fmt.Errorf("message %d has subject %q, not a key of the bucket", seq, subject)
	}
	h := sha256.Sum256(data)
	rec := &Record{
		Bucket: k.bucket, Key: key, Op: opOf(hdr), Revision: seq, Created: ts.UTC(),
		Size: int64(len(data)), SHA256: hex.EncodeToString(h[:]),
	}
	if len(hdr) > 0 {
		rec.Headers = hdr
	}
	sum := k.sum
	sum.Records++
	if _, err := k.aw.putJSON(recordPath(k.bucket, sum.Records, "json"), rec); err != nil {
		return err
	}
	if _, err := k.aw.put(recordPath(k.bucket, sum.Records, "value"), rec.Size, bytes.NewReader(data), rec.SHA256); err != nil {
		return err
	}
	k.keys[key] = true
	if rec.Op != OpPut {
		sum.Markers++
	}
	sum.Bytes += rec.Size
	sum.LastSequence = max(sum.LastSequence, seq)
	sum.Keys = len(k.keys)
	if k.seen != nil {
		k.seen(rec, data)
	}
	return nil
}

// kvBucket opens a bucket's stream; nil when there is none.
func kvBucket(ctx context.Context, js jetstream.JetStream, bucket string) (jetstream.Stream, error) {
	stream, err := js.Stream(ctx, kvStream(bucket))
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	cfg := stream.CachedInfo().Config
	if !slices.Contains(cfg.Subjects, kvPrefix(bucket)+">") {
		return nil, fmt.Errorf("stream %s is not a KV bucket (subjects %v)", cfg.Name, cfg.Subjects)
	}
	return stream, nil
}

// lastMsg reads a key's latest message, without the headers a direct get
// adds; nil when the key has none.
func lastMsg(ctx context.Context, stream jetstream.Stream, subject string) (*jetstream.RawStreamMsg, error) {
	m, err := stream.GetLastMsgForSubject(ctx, subject)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", subject, err)
	}
	if stream.CachedInfo().Config.AllowDirect {
		for _, name := range directGetHeaders {
			delete(m.Header, name)
		}
	}
	return m, nil
}

// dumpKV reads a bucket in two steps. First its stream, in order, up to the
// last message it held when the read started: every kept revision of every
// key. Then the keys that hold a message now and were not met (written, or
// rewritten after their earlier message was passed over, while the first
// step ran), each at its latest message.
func dumpKV(ctx context.Context, js jetstream.JetStream, aw *archiveWriter, bucket string, idle time.Duration, seen func(*Record, []byte)) (BucketSummary, error) {
	sum := BucketSummary{Name: bucket, Kind: KindKV}
	stream, err := kvBucket(ctx, js, bucket)
	if err != nil {
		return sum, err
	}
	if stream == nil {
		sum.Absent = true
		return sum, nil
	}
	sum.Config = configOf(stream.CachedInfo().Config)
	prefix := kvPrefix(bucket)
	kw := &kvWriter{aw: aw, bucket: bucket, prefix: prefix, sum: &sum, keys: map[string]bool{}, seen: seen}

	info, err := stream.Info(ctx)
	if err != nil {
		return sum, err
	}
	r := &streamReader{js: js, stream: stream, name: kvStream(bucket), idle: idle}
	if info.State.LastSeq > 0 {
		if _, err := r.each(ctx, info.State.LastSeq, func(msg jetstream.Msg, meta *jetstream.MsgMetadata) error {
			return kw.write(msg.Subject(), msg.Headers(), msg.Data(), meta.Sequence.Stream, meta.Timestamp)
		}); err != nil {
			return sum, err
		}
	}

	now, err := stream.Info(ctx, jetstream.WithSubjectFilter(prefix+">"))
	if err != nil {
		return sum, fmt.Errorf("list keys: %w", err)
	}
	var missed []string
	for subject := range now.State.Subjects {
		if !kw.keys[strings.TrimPrefix(subject, prefix)] {
			missed = append(missed, subject)
		}
	}
	slices.Sort(missed)
	for _, subject := range missed {
		m, err := lastMsg(ctx, stream, subject)
		if err != nil {
			return sum, err
		}
		if m == nil {
			continue
		}
		if err := kw.write(m.Subject, m.Header, m.Data, m.Sequence, m.Time); err != nil {
			return sum, err
		}
	}
	return sum, nil
}

// dumpWantedCompositions writes the latest value of each composition the
// assignments' wants name, and notes the objects it names.
func dumpWantedCompositions(ctx context.Context, js jetstream.JetStream, aw *archiveWriter, wanted *wantedSet) (BucketSummary, error) {
	bucket := natsx.BucketCompositions
	sum := BucketSummary{Name: bucket, Kind: KindKV, Selection: "the compositions the archived assignments' wants name"}
	keys := slices.Sorted(maps.Keys(wanted.compositions))
	stream, err := kvBucket(ctx, js, bucket)
	if err != nil {
		return sum, err
	}
	if stream == nil {
		sum.Absent = true
		for _, key := range keys {
			sum.Skipped = append(sum.Skipped, key+": not held")
		}
		return sum, nil
	}
	sum.Config = configOf(stream.CachedInfo().Config)
	kw := &kvWriter{aw: aw, bucket: bucket, prefix: kvPrefix(bucket), sum: &sum, keys: map[string]bool{},
		seen: func(_ *Record, value []byte) { wanted.noteComposition(value) }}
	for _, key := range keys {
		m, err := lastMsg(ctx, stream, kvPrefix(bucket)+key)
		if err != nil {
			return sum, err
		}
		if m == nil || opOf(m.Header) != OpPut {
			sum.Skipped = append(sum.Skipped, key+": not held")
			continue
		}
		if err := kw.write(m.Subject, m.Header, m.Data, m.Sequence, m.Time); err != nil {
			return sum, err
		}
	}
	return sum, nil
}

// dumpObjects writes the objects of a store: all of them, or only those
// named in only (when not nil).
func dumpObjects(ctx context.Context, js jetstream.JetStream, aw *archiveWriter, store string, only []string) (BucketSummary, error) {
	sum := BucketSummary{Name: store, Kind: KindObject}
	if only != nil {
		sum.Selection = "the objects the archived compositions name"
	}
	stream, err := js.Stream(ctx, objectStream(store))
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		sum.Absent = true
		for _, name := range only {
			sum.Skipped = append(sum.Skipped, name+": not held")
		}
		return sum, nil
	}
	if err != nil {
		return sum, err
	}
	sum.Config = configOf(stream.CachedInfo().Config)
	obs, err := js.ObjectStore(ctx, store)
	if err != nil {
		return sum, err
	}
	names := only
	if names == nil {
		infos, err := obs.List(ctx)
		if err != nil && !errors.Is(err, jetstream.ErrNoObjectsFound) {
			return sum, fmt.Errorf("list: %w", err)
		}
		for _, info := range infos {
			if info.Opts != nil && info.Opts.Link != nil {
				sum.Skipped = append(sum.Skipped, info.Name+": a link, not content")
				continue
			}
			names = append(names, info.Name)
		}
		slices.Sort(names)
	}
	for _, name := range names {
		done, err := dumpObject(ctx, obs, aw, store, name, sum.Records+1)
		if errors.Is(err, jetstream.ErrObjectNotFound) {
			what := "deleted while the backup ran"
			if only != nil {
				what = "not held"
			}
			sum.Skipped = append(sum.Skipped, name+": "+what)
			continue
		}
		if err != nil {
			return sum, err
		}
		sum.Records++
		sum.Bytes += done.Size
	}
	sum.Keys = sum.Records
	if info, err := stream.Info(ctx); err == nil {
		sum.LastSequence = info.State.LastSeq
	}
	return sum, nil
}

// dumpObject writes one object: its record, then its content streamed from
// the store, hashed as it goes; the store's own digest check runs at the
// end of the read.
func dumpObject(ctx context.Context, obs jetstream.ObjectStore, aw *archiveWriter, store, name string, n int) (*Object, error) {
	res, err := obs.Get(ctx, name)
	if err != nil {
		return nil, err
	}
	defer res.Close()
	info, err := res.Info()
	if err != nil {
		return nil, err
	}
	hexSum, err := natsDigestHex(info.Digest)
	if err != nil {
		return nil, fmt.Errorf("object %s: %w", name, err)
	}
	o := &Object{
		Store: store, Name: info.Name, Description: info.Description, Metadata: info.Metadata,
		Modified: info.ModTime.UTC(), Size: int64(info.Size), SHA256: hexSum, NATSDigest: info.Digest,
	}
	if len(info.Headers) > 0 {
		o.Headers = info.Headers
	}
	if info.Opts != nil {
		o.ChunkSize = info.Opts.ChunkSize
	}
	if _, err := aw.putJSON(objectPath(store, n, "json"), o); err != nil {
		return nil, err
	}
	if _, err := aw.put(objectPath(store, n, "data"), o.Size, res, o.SHA256); err != nil {
		return nil, fmt.Errorf("object %s: %w", name, err)
	}
	// Read past the end, where the store checks the object's digest.
	var one [1]byte
	if k, err := res.Read(one[:]); k > 0 {
		return nil, fmt.Errorf("object %s: longer than its recorded %d bytes", name, o.Size)
	} else if err != nil && !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("object %s: %w", name, err)
	}
	return o, nil
}
