package backup

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"mesh.dev/internal/natsx"
)

// RestoreOptions configure Restore.
type RestoreOptions struct {
	// Replicas of every bucket and store created; 0 takes each one's
	// replica count from the archive (what the source ran with).
	Replicas int
	// Force restores into buckets that hold messages, and while a composer
	// holds the lease: each archived record is published on top of what a
	// bucket holds (keys the archive holds end with its values; others keep
	// theirs), and objects already held with the same digest are kept.
	Force bool
	// Progress, when set, is told of each bucket as it is restored.
	Progress func(RestoredBucket)
	// Idle is DefaultIdle when zero.
	Idle time.Duration
}

// RestoredBucket says what a restore did to one bucket or store.
type RestoredBucket struct {
	Name     string
	Kind     string
	Replicas int
	// Records is how many KV messages or objects were written.
	Records int
	// Kept counts objects already held with the archived digest (Force).
	Kept  int
	Bytes int64
}

// NotEmptyError is a refused restore: a bucket the archive would be
// written into holds messages, or a composer is running. Nothing was
// written.
type NotEmptyError struct {
	// Buckets name the buckets that hold messages, with how many.
	Buckets []string
	// Lease says which composer holds the lease, if one does.
	Lease string
}

func (e *NotEmptyError) Error() string {
	var parts []string
	if len(e.Buckets) > 0 {
		parts = append(parts, "the target JetStream already holds "+strings.Join(e.Buckets, ", "))
	}
	if e.Lease != "" {
		parts = append(parts, e.Lease+": stop every composer before restoring")
	}
	return "restore refused: " + strings.Join(parts, "; ") +
		" (restore into an empty JetStream, or pass --force to write the archive over what is there)"
}

// Restore brings an archive's buckets and stores back into JetStream. It
// verifies the whole archive first (Verify) and writes nothing when it does
// not; it refuses, writing nothing, when a target bucket of Buckets holds
// any message or a composer holds the lease, unless Force. It creates the
// buckets with the settings of DESIGN.md §9 (natsx.EnsureKV and
// natsx.EnsureObjectStore), publishes every archived KV message again in its
// order, with the headers it had (less the publish directives Nats-Expected-*
// and Nats-Msg-Id, which named the old stream), and puts every object with
// its name, description, headers, metadata and chunk size, checking its
// digest. What is referred to comes first (artifacts, entries, builds,
// registrations, keysets, nodes, approvals, objects, compositions,
// assignments). It then reads
// every restored bucket back and checks that each key's last messages are
// the archived ones and each object has the archived digest.
func Restore(ctx context.Context, js jetstream.JetStream, archive io.ReadSeeker, opts RestoreOptions) (*Manifest, []RestoredBucket, error) {
	if opts.Idle <= 0 {
		opts.Idle = DefaultIdle
	}
	if _, err := archive.Seek(0, io.SeekStart); err != nil {
		return nil, nil, err
	}
	m, err := Verify(archive)
	if err != nil {
		return nil, nil, fmt.Errorf("the archive does not verify, nothing was restored: %w", err)
	}
	if !opts.Force {
		if err := preflight(ctx, js); err != nil {
			return m, nil, err
		}
	}
	replicasOf := func(name string) int {
		if opts.Replicas > 0 {
			return opts.Replicas
		}
		if b := m.Bucket(name); b != nil && b.Config != nil && b.Config.Replicas > 0 {
			return b.Config.Replicas
		}
		return 1
	}
	for _, spec := range natsx.Buckets(1) {
		if !slices.Contains(Buckets, spec.Bucket) {
			continue
		}
		spec.Replicas = replicasOf(spec.Bucket)
		if _, err := natsx.EnsureKV(ctx, js, spec); err != nil {
			return m, nil, err
		}
	}
	stores := map[string]jetstream.ObjectStore{}
	for _, spec := range natsx.ObjectStores(1) {
		if !slices.Contains(Buckets, spec.Bucket) {
			continue
		}
		spec.Replicas = replicasOf(spec.Bucket)
		obs, err := natsx.EnsureObjectStore(ctx, js, spec)
		if err != nil {
			return m, nil, err
		}
		stores[spec.Bucket] = obs
	}

	var done []RestoredBucket
	for _, bucket := range restoreOrder() {
		rb := RestoredBucket{Name: bucket, Kind: kindOf(bucket), Replicas: replicasOf(bucket)}
		if _, err := archive.Seek(0, io.SeekStart); err != nil {
			return m, done, err
		}
		if rb.Kind == KindKV {
			err = restoreKV(ctx, js, archive, bucket, opts, &rb)
		} else {
			err = restoreObjects(ctx, stores[bucket], archive, bucket, opts, &rb)
		}
		if err != nil {
			return m, done, fmt.Errorf("restore %s: %w", bucket, err)
		}
		done = append(done, rb)
		if opts.Progress != nil {
			opts.Progress(rb)
		}
	}
	return m, done, nil
}

// preflight refuses a target whose buckets hold messages, or that runs a
// composer.
func preflight(ctx context.Context, js jetstream.JetStream) error {
	refusal := &NotEmptyError{}
	for _, bucket := range Buckets {
		name := kvStream(bucket)
		if kindOf(bucket) == KindObject {
			name = objectStream(bucket)
		}
		stream, err := js.Stream(ctx, name)
		if errors.Is(err, jetstream.ErrStreamNotFound) {
			continue
		}
		if err != nil {
			return fmt.Errorf("look at %s: %w", bucket, err)
		}
		if n := stream.CachedInfo().State.Msgs; n > 0 {
			refusal.Buckets = append(refusal.Buckets, fmt.Sprintf("%s (%d messages)", bucket, n))
		}
	}
	lease, err := js.Stream(ctx, kvStream(natsx.BucketComposerLease))
	if err == nil {
		m, err := lease.GetLastMsgForSubject(ctx, kvPrefix(natsx.BucketComposerLease)+natsx.KeyLeaseLeader)
		if err == nil && opOf(m.Header) == OpPut {
			ttl := lease.CachedInfo().Config.MaxAge
			if age := time.Since(m.Time); ttl == 0 || age < ttl {
				refusal.Lease = fmt.Sprintf("a composer holds the lease (renewed %s ago)", age.Round(time.Second))
			}
		} else if err != nil && !errors.Is(err, jetstream.ErrMsgNotFound) {
			return fmt.Errorf("look at %s: %w", natsx.BucketComposerLease, err)
		}
	} else if !errors.Is(err, jetstream.ErrStreamNotFound) {
		return fmt.Errorf("look at %s: %w", natsx.BucketComposerLease, err)
	}
	if len(refusal.Buckets) > 0 || refusal.Lease != "" {
		return refusal
	}
	return nil
}

// directive reports whether a header instructs the server at publish time
// rather than describing the value: those named the source stream's
// sequences and message ids, and would make the publish fail or be dropped.
func directive(name string) bool {
	lower := strings.ToLower(name)
	return strings.HasPrefix(lower, "nats-expected-") || strings.HasPrefix(lower, "nats-batch-") ||
		lower == "nats-msg-id" || lower == "nats-required-api-level"
}

// publishHeaders returns the headers a restored message is published with.
func publishHeaders(h map[string][]string) nats.Header {
	var out nats.Header
	for k, v := range h {
		if directive(k) {
			continue
		}
		if out == nil {
			out = nats.Header{}
		}
		out[k] = slices.Clone(v)
	}
	return out
}

// messageDigest identifies a KV message by operation, headers (less
// directives) and value, to compare a restored bucket with the archive.
func messageDigest(op string, headers map[string][]string, valueSHA string) string {
	h := sha256.New()
	fmt.Fprintf(h, "%s\x00%s\x00", op, valueSHA)
	names := make([]string, 0, len(headers))
	for k := range headers {
		if !directive(k) {
			names = append(names, k)
		}
	}
	slices.Sort(names)
	for _, k := range names {
		fmt.Fprintf(h, "%d:%s", len(k), k)
		for _, v := range headers[k] {
			fmt.Fprintf(h, "%d:%s", len(v), v)
		}
		h.Write([]byte{0})
	}
	return hex.EncodeToString(h.Sum(nil))
}

func restoreKV(ctx context.Context, js jetstream.JetStream, archive io.Reader, bucket string, opts RestoreOptions, rb *RestoredBucket) error {
	s := newScanner(archive, false)
	if _, err := s.readHeader(); err != nil {
		return err
	}
	prefix := kvPrefix(bucket)
	want := map[string][]string{}
	for {
		e, mh, err := s.next(func(b string) bool { return b != bucket })
		if err != nil {
			return err
		}
		if mh != nil {
			break
		}
		if e.record == nil {
			continue
		}
		r := e.record
		msg := &nats.Msg{Subject: prefix + r.Key, Data: e.value, Header: publishHeaders(r.Headers)}
		if _, err := js.PublishMsg(ctx, msg); err != nil {
			return fmt.Errorf("key %s (record %d): %w", r.Key, e.index, err)
		}
		want[r.Key] = append(want[r.Key], messageDigest(r.Op, r.Headers, r.SHA256))
		rb.Records++
		rb.Bytes += r.Size
	}
	return checkKV(ctx, js, bucket, want, opts.Idle)
}

// checkKV reads a restored bucket back: each key's last messages must be
// the ones the archive holds for it, in order.
func checkKV(ctx context.Context, js jetstream.JetStream, bucket string, want map[string][]string, idle time.Duration) error {
	stream, err := js.Stream(ctx, kvStream(bucket))
	if err != nil {
		return err
	}
	prefix := kvPrefix(bucket)
	got := map[string][]string{}
	r := &streamReader{js: js, stream: stream, name: kvStream(bucket), idle: idle}
	if _, err := r.each(ctx, 0, func(msg jetstream.Msg, _ *jetstream.MsgMetadata) error {
		key := strings.TrimPrefix(msg.Subject(), prefix)
		if _, ok := want[key]; !ok {
			return nil
		}
		sum := sha256.Sum256(msg.Data())
		got[key] = append(got[key], messageDigest(opOf(msg.Headers()), msg.Headers(), hex.EncodeToString(sum[:])))
		return nil
	}); err != nil {
		return fmt.Errorf("read back: %w", err)
	}
	for key, w := range want {
		g := got[key]
		if len(g) < len(w) || !slices.Equal(g[len(g)-len(w):], w) {
			return fmt.Errorf("read back: key %s holds %d messages that are not the %d archived ones (another writer?)", key, len(g), len(w))
		}
	}
	return nil
}

func restoreObjects(ctx context.Context, obs jetstream.ObjectStore, archive io.Reader, store string, opts RestoreOptions, rb *RestoredBucket) error {
	s := newScanner(archive, false)
	if _, err := s.readHeader(); err != nil {
		return err
	}
	want := map[string]*Object{}
	for {
		e, mh, err := s.next(func(b string) bool { return b != store })
		if err != nil {
			return err
		}
		if mh != nil {
			break
		}
		if e.object == nil {
			continue
		}
		o := e.object
		want[o.Name] = o
		if opts.Force {
			if info, err := obs.GetInfo(ctx, o.Name); err == nil && info.Digest == o.NATSDigest && int64(info.Size) == o.Size {
				rb.Kept++
				if err := e.content.drain(); err != nil {
					return err
				}
				continue
			}
		}
		meta := jetstream.ObjectMeta{Name: o.Name, Description: o.Description, Metadata: o.Metadata,
			Opts: &jetstream.ObjectMetaOptions{ChunkSize: o.ChunkSize}}
		if len(o.Headers) > 0 {
			meta.Headers = nats.Header(o.Headers)
		}
		// The content reader fails at its end unless the bytes are the
		// archived ones; the store then keeps nothing of the put.
		info, err := obs.Put(ctx, meta, &fullReader{r: e.content})
		if err != nil {
			return fmt.Errorf("object %s: %w", o.Name, err)
		}
		if info.Digest != o.NATSDigest || int64(info.Size) != o.Size {
			_ = obs.Delete(ctx, o.Name)
			return fmt.Errorf("object %s: stored with digest %s and size %d, the archive has %s and %d", o.Name, info.Digest, info.Size, o.NATSDigest, o.Size)
		}
		rb.Records++
		rb.Bytes += o.Size
	}
	// Read back: every archived object is held with its digest.
	infos, err := obs.List(ctx)
	if err != nil && !errors.Is(err, jetstream.ErrNoObjectsFound) {
		return fmt.Errorf("read back: %w", err)
	}
	held := map[string]*jetstream.ObjectInfo{}
	for _, info := range infos {
		held[info.Name] = info
	}
	for name, o := range want {
		info := held[name]
		if info == nil || info.Digest != o.NATSDigest || int64(info.Size) != o.Size {
			return fmt.Errorf("read back: object %s is not held with digest %s", name, o.NATSDigest)
		}
	}
	return nil
}

// fullReader fills each read as far as its reader allows: the object store
// makes one chunk of every read, and the chunks should be those of the
// recorded chunk size.
type fullReader struct{ r io.Reader }

func (f *fullReader) Read(p []byte) (int, error) {
	n, err := io.ReadFull(f.r, p)
	if errors.Is(err, io.ErrUnexpectedEOF) {
		err = nil
		if n == 0 {
			err = io.EOF
		}
	}
	return n, err
}
