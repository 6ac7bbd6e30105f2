package natsx

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/trace"
)

// ObjectChunkSize is the chunk size PutObject writes, nats.go's default; a
// chunk must fit the server's max payload.
const ObjectChunkSize = 128 << 10

// PutObject stores exactly size bytes read from r under name and returns the
// stored object's info. A reader that ends early or holds more than size
// bytes fails the put before anything is committed, so an object already
// held under name is never replaced by a wrong one; a longer one fails with
// ErrTooLarge. A negative size accepts whatever r holds.
func PutObject(ctx context.Context, store jetstream.ObjectStore, name string, r io.Reader, size int64, opts ...Option) (*jetstream.ObjectInfo, error) {
	o := newOptions(opts)
	bucket := storeName(store)
	ctx, span := o.tracer.Start(ctx, "object.put "+bucket, spanKind,
		trace.WithAttributes(attrBucket.String(bucket), attrObject.String(name), attrSize.Int64(size)))
	defer span.End()
	r = &fullReader{r: r, size: max(size, -1)}
	info, err := store.Put(ctx, jetstream.ObjectMeta{
		Name: name,
		Opts: &jetstream.ObjectMetaOptions{ChunkSize: ObjectChunkSize},
	}, r)
	if err != nil {
		return nil, endSpan(span, fmt.Errorf("object store %s: put %s: %w", bucket, name, MapError(err)))
	}
	return info, nil
}

// GetObject opens the object name for reading from offset on; the caller
// closes the reader. The object store streams from the first chunk, so the
// bytes before offset are read and discarded; the store's digest check at
// the end still covers the whole object. It returns ErrNotFound when there
// is no such object and an error when offset is past its end.
func GetObject(ctx context.Context, store jetstream.ObjectStore, name string, offset int64, opts ...Option) (io.ReadCloser, *jetstream.ObjectInfo, error) {
	o := newOptions(opts)
	bucket := storeName(store)
	ctx, span := o.tracer.Start(ctx, "object.get "+bucket, spanKind,
		trace.WithAttributes(attrBucket.String(bucket), attrObject.String(name)))
	defer span.End()
	fail := func(err error) error {
		return endSpan(span, fmt.Errorf("object store %s: get %s: %w", bucket, name, MapError(err)))
	}
	if offset < 0 {
		return nil, nil, fail(fmt.Errorf("negative offset %d", offset))
	}
	// The read lives under rctx; the reader's Close ends it.
	rctx, cancel := context.WithCancel(ctx)
	res, err := lookupObject(rctx, cancel, store, name)
	if err != nil {
		return nil, nil, fail(err)
	}
	info, err := res.Info()
	if err != nil {
		res.Close()
		cancel()
		return nil, nil, fail(err)
	}
	span.SetAttributes(attrSize.Int64(int64(info.Size)))
	if uint64(offset) > info.Size {
		res.Close()
		cancel()
		return nil, nil, fail(fmt.Errorf("offset %d is past the end of a %d-byte object", offset, info.Size))
	}
	r := newObjectReader(rctx, res, name)
	r.cancel = cancel
	if offset > 0 {
		if _, err := io.CopyN(io.Discard, r, offset); err != nil {
			r.Close()
			return nil, nil, fail(fmt.Errorf("skip to offset %d: %w", offset, err))
		}
	}
	return r, info, nil
}

// lookupObject opens an object for reading and waits at most
// RequestTimeout for the lookup. nats.go looks the object's info up under
// the caller's context, which also carries the read that follows, so a
// lookup whose reply was lost (a server restart, a leader change) would
// hold the caller until its deadline. A lookup cut so cancels ctx (cancel)
// and closes what the lookup opens later.
func lookupObject(ctx context.Context, cancel context.CancelFunc, store jetstream.ObjectStore, name string) (jetstream.ObjectResult, error) {
	type got struct {
		res jetstream.ObjectResult
		err error
	}
	done := make(chan got, 1)
	go func() {
		res, err := store.Get(ctx, name)
		done <- got{res, err}
	}()
	abandon := func(err error) (jetstream.ObjectResult, error) {
		cancel()
		go func() {
			if g := <-done; g.err == nil {
				g.res.Close()
			}
		}()
		return nil, err
	}
	timer := time.NewTimer(RequestTimeout)
	defer timer.Stop()
	select {
	case g := <-done:
		if g.err != nil {
			cancel()
		}
		return g.res, g.err
	case <-timer.C:
		return abandon(fmt.Errorf("lookup: no reply within %s: %w", RequestTimeout, context.DeadlineExceeded))
	case <-ctx.Done():
		return abandon(ctx.Err())
	}
}

// ErrObjectStalled is returned by a read of an object whose next chunk did
// not come within objectIdle.
var ErrObjectStalled = errors.New("no chunk of the object came in time (it was put again or deleted while read)")

// objectIdle bounds how long a read of an object waits for its next chunk.
// nats.go's reader waits until the caller's deadline when the chunks it
// subscribed to are gone — the object was put again (its old chunks
// purged) or deleted between its lookup and its subscription — and the
// caller with it: an engine's fetch, and with it every apply of its node.
var objectIdle = 15 * time.Second

// objectReader maps the errors of reading an object and ends a read that
// stalls (see objectIdle) or whose context ends. nats.go's reader cannot be
// interrupted (its Close waits for the Read it blocks), so a goroutine
// reads it and hands the chunks over; a stalled one is left to end at the
// caller's deadline, holding nothing but its subscription.
type objectReader struct {
	ctx    context.Context
	cancel context.CancelFunc
	name   string
	chunks chan []byte
	done   chan struct{}
	once   sync.Once
	// err is the reader's end, set before chunks is closed.
	err  error
	left []byte
}

func newObjectReader(ctx context.Context, res jetstream.ObjectResult, name string) *objectReader {
	r := &objectReader{ctx: ctx, name: name, chunks: make(chan []byte), done: make(chan struct{})}
	go r.pump(res)
	return r
}

func (r *objectReader) pump(res jetstream.ObjectResult) {
	defer res.Close()
	defer close(r.chunks)
	for {
		buf := make([]byte, 64<<10)
		n, err := res.Read(buf)
		if n > 0 {
			select {
			case r.chunks <- buf[:n]:
			case <-r.done:
				return
			}
		}
		if err != nil {
			r.err = err
			return
		}
	}
}

func (r *objectReader) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	if len(r.left) == 0 {
		idle := time.NewTimer(objectIdle)
		defer idle.Stop()
		select {
		case c, ok := <-r.chunks:
			if !ok {
				err := r.err
				if !errors.Is(err, io.EOF) {
					err = MapError(err)
				}
				return 0, err
			}
			r.left = c
		case <-idle.C:
			return 0, fmt.Errorf("object %s: %w: none for %s", r.name, ErrObjectStalled, objectIdle)
		case <-r.ctx.Done():
			return 0, r.ctx.Err()
		}
	}
	n := copy(p, r.left)
	r.left = r.left[n:]
	return n, nil
}

// Close ends the read.
func (r *objectReader) Close() error {
	r.once.Do(func() {
		close(r.done)
		if r.cancel != nil {
			r.cancel()
		}
	})
	return nil
}

// storeName returns the bucket of an object store for span names and
// errors. jetstream.ObjectStore does not tell its name; the stores
// EnsureObjectStore returns do.
func storeName(store jetstream.ObjectStore) string {
	if n, ok := store.(interface{ Bucket() string }); ok {
		return n.Bucket()
	}
	return "?"
}

// namedStore is an object store that knows its bucket's name.
type namedStore struct {
	jetstream.ObjectStore
	bucket string
}

// Bucket returns the object store's name.
func (s namedStore) Bucket() string { return s.bucket }

// fullReader fills each read as far as its reader allows, because the
// object store makes one chunk of every read: a network stream's short reads
// would otherwise be stored as many tiny chunks. With a size (>= 0) it also
// fails when its reader does not hold exactly size bytes.
type fullReader struct {
	r    io.Reader
	size int64 // -1: any
	read int64
}

func (f *fullReader) Read(p []byte) (int, error) {
	if f.size >= 0 {
		left := f.size - f.read
		if left == 0 {
			// One more byte tells whether r is longer than declared.
			var one [1]byte
			n, err := io.ReadFull(f.r, one[:])
			if n > 0 {
				return 0, fmt.Errorf("%w: reader holds more than the declared %d bytes", ErrTooLarge, f.size)
			}
			if err != nil && !errors.Is(err, io.EOF) {
				return 0, err
			}
			return 0, io.EOF
		}
		if int64(len(p)) > left {
			p = p[:left]
		}
	}
	n, err := io.ReadFull(f.r, p)
	f.read += int64(n)
	switch {
	case errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, io.EOF):
		if f.size >= 0 && f.read < f.size {
			return n, fmt.Errorf("reader ended after %d of the declared %d bytes: %w", f.read, f.size, io.ErrUnexpectedEOF)
		}
		if n > 0 {
			return n, nil
		}
		return 0, io.EOF
	}
	return n, err
}
