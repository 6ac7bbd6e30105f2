package natsx

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"io"
	"strings"
	"testing"
	"testing/iotest"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/attribute"
)

func TestObjectPutGet(t *testing.T) {
	t.Parallel()
	_, js := serverAndJS(t)
	tp, exp := recordingTracer(t)
	store, err := EnsureObjectStore(t.Context(), js, ObjectSpec{Bucket: "objects-test"})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name   string
		size   int
		offset int64
	}{
		{name: "empty", size: 0},
		{name: "one byte", size: 1},
		{name: "one byte from its end", size: 1, offset: 1},
		{name: "one chunk less one", size: ObjectChunkSize - 1},
		{name: "exactly one chunk", size: ObjectChunkSize},
		{name: "several chunks", size: 3*ObjectChunkSize + 5},
		{name: "several chunks from mid-chunk", size: 3*ObjectChunkSize + 5, offset: ObjectChunkSize + 17},
		{name: "several chunks from a chunk boundary", size: 3*ObjectChunkSize + 5, offset: 2 * ObjectChunkSize},
		{name: "from the last byte", size: 1000, offset: 999},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			data := make([]byte, tt.size)
			_, _ = rand.Read(data)
			name := "sha256:" + strings.ReplaceAll(tt.name, " ", "-")
			// A one-byte reader makes Put see many short reads.
			info, err := PutObject(t.Context(), store, name, iotest.OneByteReader(bytes.NewReader(data)), int64(tt.size), WithTracerProvider(tp))
			if err != nil {
				t.Fatal(err)
			}
			if info.Size != uint64(tt.size) {
				t.Errorf("stored size %d", info.Size)
			}
			// Short reads are gathered into full chunks.
			if want := (tt.size + ObjectChunkSize - 1) / ObjectChunkSize; info.Chunks != uint32(want) {
				t.Errorf("stored in %d chunks, want %d", info.Chunks, want)
			}
			r, info, err := GetObject(t.Context(), store, name, tt.offset, WithTracerProvider(tp))
			if err != nil {
				t.Fatal(err)
			}
			defer r.Close()
			got, err := io.ReadAll(r)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, data[tt.offset:]) {
				t.Errorf("read %d bytes from %d, want %d", len(got), tt.offset, len(data)-int(tt.offset))
			}
			if info.Size != uint64(tt.size) {
				t.Errorf("info size %d", info.Size)
			}
		})
	}
	t.Run("spans", func(t *testing.T) {
		t.Parallel()
		if _, err := PutObject(t.Context(), store, "traced", strings.NewReader("x"), 1, WithTracerProvider(tp)); err != nil {
			t.Fatal(err)
		}
		for _, s := range exp.GetSpans() {
			if s.Name == "object.put objects-test" {
				attrs := attribute.NewSet(s.Attributes...)
				if v, _ := attrs.Value(attrObject); v.AsString() == "traced" {
					return
				}
			}
		}
		t.Error("no object.put span naming the bucket and object")
	})
}

func TestObjectPutRefusesWrongSize(t *testing.T) {
	t.Parallel()
	_, js := serverAndJS(t)
	store, err := EnsureObjectStore(t.Context(), js, ObjectSpec{Bucket: "artifacts-test"})
	if err != nil {
		t.Fatal(err)
	}
	good := bytes.Repeat([]byte("good"), ObjectChunkSize/2) // two chunks
	if _, err := PutObject(t.Context(), store, "held", bytes.NewReader(good), int64(len(good))); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		r       io.Reader
		size    int64
		want    error
		wantErr string
	}{
		{name: "reader shorter than declared", r: strings.NewReader("short"), size: 6, wantErr: "reader ended after 5 of the declared 6 bytes"},
		{name: "reader longer than declared", r: bytes.NewReader(make([]byte, 3*ObjectChunkSize)), size: ObjectChunkSize, want: ErrTooLarge},
		{name: "reader fails", r: iotest.ErrReader(errors.New("disk gone")), size: 10, wantErr: "disk gone"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := PutObject(t.Context(), store, "held", tt.r, tt.size)
			if err == nil {
				t.Fatal("put succeeded")
			}
			if tt.want != nil && !errors.Is(err, tt.want) {
				t.Errorf("err = %v, want %v", err, tt.want)
			}
			if tt.wantErr != "" && !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("err = %v, want %q", err, tt.wantErr)
			}
			// The object held under the name is untouched.
			r, _, err := GetObject(t.Context(), store, "held", 0)
			if err != nil {
				t.Fatal(err)
			}
			got, err := io.ReadAll(r)
			r.Close()
			if err != nil || !bytes.Equal(got, good) {
				t.Errorf("held object changed: %d bytes, %v", len(got), err)
			}
		})
	}
	// A negative size takes whatever the reader holds.
	info, err := PutObject(t.Context(), store, "unsized", strings.NewReader("any length"), -1)
	if err != nil || info.Size != 10 {
		t.Errorf("unsized put: %v %v", info, err)
	}
}

func TestGetObjectRefuses(t *testing.T) {
	t.Parallel()
	_, js := serverAndJS(t)
	store, err := EnsureObjectStore(t.Context(), js, ObjectSpec{Bucket: "get-test"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := PutObject(t.Context(), store, "ten", strings.NewReader("0123456789"), 10); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		object  string
		offset  int64
		want    error
		wantErr string
	}{
		{name: "absent", object: "nope", want: ErrNotFound},
		{name: "offset past the end", object: "ten", offset: 11, wantErr: "past the end"},
		{name: "negative offset", object: "ten", offset: -1, wantErr: "negative offset"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			r, _, err := GetObject(t.Context(), store, tt.object, tt.offset)
			if err == nil {
				r.Close()
				t.Fatal("get succeeded")
			}
			if tt.want != nil && !errors.Is(err, tt.want) {
				t.Errorf("err = %v, want %v", err, tt.want)
			}
			if tt.wantErr != "" && !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("err = %v, want %q", err, tt.wantErr)
			}
			if !strings.Contains(err.Error(), "get-test") {
				t.Errorf("error %q does not name the store", err)
			}
		})
	}
	// Offset at the very end reads nothing.
	r, _, err := GetObject(t.Context(), store, "ten", 10)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if b, err := io.ReadAll(r); err != nil || len(b) != 0 {
		t.Errorf("read at end: %q %v", b, err)
	}
}

// TestGetObjectWhoseChunksWentAway: the chunks of an object are gone
// between its lookup and its read (it was put again, its old chunks
// purged): nats.go's reader waits until the caller's deadline; GetObject's
// fails after objectIdle. Not parallel: it shortens objectIdle.
func TestGetObjectWhoseChunksWentAway(t *testing.T) {
	defer func(d time.Duration) { objectIdle = d }(objectIdle)
	objectIdle = 300 * time.Millisecond
	_, js := serverAndJS(t)
	store, err := EnsureObjectStore(t.Context(), js, ObjectSpec{Bucket: "objects-gone"})
	if err != nil {
		t.Fatal(err)
	}
	data := bytes.Repeat([]byte("x"), 2*ObjectChunkSize)
	info, err := PutObject(t.Context(), store, "sha256:gone", bytes.NewReader(data), int64(len(data)))
	if err != nil {
		t.Fatal(err)
	}
	// What a put over it does to its chunks, without the new meta.
	stream, err := js.Stream(t.Context(), "OBJ_objects-gone")
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Purge(t.Context(), jetstream.WithPurgeSubject("$O.objects-gone.C."+info.NUID)); err != nil {
		t.Fatal(err)
	}
	// A caller's deadline far off, as an engine's fetch has: nats.go's
	// reader waits until it.
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	r, _, err := GetObject(ctx, store, "sha256:gone", 0)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	done := make(chan error, 1)
	go func() {
		_, err := io.Copy(io.Discard, r)
		done <- err
	}()
	select {
	case err := <-done:
		if !errors.Is(err, ErrObjectStalled) {
			t.Errorf("read of an object whose chunks are gone: %v, want ErrObjectStalled", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the read of an object whose chunks are gone still waits")
	}
}

// silentLookup is an object store whose lookups get no reply: what a
// lookup sent on a connection that was then lost sees in nats.go (the
// request is not failed; it waits for its context).
type silentLookup struct {
	jetstream.ObjectStore
}

func (silentLookup) Get(ctx context.Context, _ string, _ ...jetstream.GetObjectOpt) (jetstream.ObjectResult, error) {
	<-ctx.Done()
	return nil, ctx.Err()
}

// TestGetObjectLookupWithoutReply: a lookup whose reply never comes fails
// after RequestTimeout, not at the caller's far deadline, and says so.
func TestGetObjectLookupWithoutReply(t *testing.T) {
	t.Parallel()
	_, js := serverAndJS(t)
	store, err := EnsureObjectStore(t.Context(), js, ObjectSpec{Bucket: "objects-silent"})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	began := time.Now()
	_, _, err = GetObject(ctx, namedStore{silentLookup{store}, "objects-silent"}, "sha256:x", 0)
	if err == nil || !strings.Contains(err.Error(), "no reply within "+RequestTimeout.String()) {
		t.Fatalf("a lookup without reply: %v, want no reply within %s", err, RequestTimeout)
	}
	if took := time.Since(began); took > 3*RequestTimeout {
		t.Errorf("a lookup without reply held the caller %s", took)
	}
	// The caller's own end is the caller's error.
	short, cancelShort := context.WithCancel(t.Context())
	cancelShort()
	if _, _, err := GetObject(short, namedStore{silentLookup{store}, "objects-silent"}, "sha256:x", 0); !errors.Is(err, context.Canceled) {
		t.Errorf("a lookup of a cancelled caller: %v, want context.Canceled", err)
	}
}
