package natsx

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
)

// side writes and reads a key through either the wrapper or nats.go's own
// KeyValue, to show the two agree on every message.
type side struct {
	name   string
	create func(ctx context.Context, kv *KV, key string, v []byte) (uint64, error)
	update func(ctx context.Context, kv *KV, key string, v []byte, rev uint64) (uint64, error)
	put    func(ctx context.Context, kv *KV, key string, v []byte) (uint64, error)
	delete func(ctx context.Context, kv *KV, key string) error
	purge  func(ctx context.Context, kv *KV, key string) error
	get    func(ctx context.Context, kv *KV, key string) (value []byte, rev uint64, created time.Time, err error)
}

var (
	wrapperSide = side{
		name:   "wrapper",
		create: func(ctx context.Context, kv *KV, key string, v []byte) (uint64, error) { return kv.Create(ctx, key, v) },
		update: func(ctx context.Context, kv *KV, key string, v []byte, rev uint64) (uint64, error) {
			return kv.Update(ctx, key, v, rev)
		},
		put:    func(ctx context.Context, kv *KV, key string, v []byte) (uint64, error) { return kv.Put(ctx, key, v) },
		delete: func(ctx context.Context, kv *KV, key string) error { return kv.Delete(ctx, key) },
		purge:  func(ctx context.Context, kv *KV, key string) error { return kv.Purge(ctx, key) },
		get: func(ctx context.Context, kv *KV, key string) ([]byte, uint64, time.Time, error) {
			e, err := kv.Get(ctx, key)
			return e.Value, e.Revision, e.Created, err
		},
	}
	natsGoSide = side{
		name: "nats.go",
		create: func(ctx context.Context, kv *KV, key string, v []byte) (uint64, error) {
			return kv.KeyValue().Create(ctx, key, v)
		},
		update: func(ctx context.Context, kv *KV, key string, v []byte, rev uint64) (uint64, error) {
			return kv.KeyValue().Update(ctx, key, v, rev)
		},
		put: func(ctx context.Context, kv *KV, key string, v []byte) (uint64, error) {
			return kv.KeyValue().Put(ctx, key, v)
		},
		delete: func(ctx context.Context, kv *KV, key string) error { return kv.KeyValue().Delete(ctx, key) },
		purge:  func(ctx context.Context, kv *KV, key string) error { return kv.KeyValue().Purge(ctx, key) },
		get: func(ctx context.Context, kv *KV, key string) ([]byte, uint64, time.Time, error) {
			e, err := kv.KeyValue().Get(ctx, key)
			if err != nil {
				return nil, 0, time.Time{}, err
			}
			return e.Value(), e.Revision(), e.Created(), nil
		},
	}
	sides = []side{wrapperSide, natsGoSide}
)

func TestKVCompatibleWithNatsGo(t *testing.T) {
	t.Parallel()
	_, js := serverAndJS(t)
	for _, leaderReads := range []bool{false, true} {
		for _, w := range sides {
			for _, r := range sides {
				name := w.name + " writes, " + r.name + " reads"
				if leaderReads {
					name += ", leader reads"
				}
				t.Run(name, func(t *testing.T) {
					t.Parallel()
					spec := testSpec(5)
					spec.LeaderReads = leaderReads
					kv := ensureKV(t, js, spec)
					ctx := t.Context()
					before := time.Now()
					check := func(key string, want []byte, wantRev uint64) {
						t.Helper()
						got, rev, created, err := r.get(ctx, kv, key)
						if err != nil {
							t.Fatalf("get %s: %v", key, err)
						}
						if !bytes.Equal(got, want) || rev != wantRev {
							t.Fatalf("get %s = %q at %d, want %q at %d", key, got, rev, want, wantRev)
						}
						if created.Before(before.Add(-time.Minute)) || created.After(time.Now().Add(time.Minute)) {
							t.Errorf("created %v is not the write's time", created)
						}
					}
					binary := []byte{0, 1, 2, 0xff, '\n'}
					rev, err := w.create(ctx, kv, "a.b", binary)
					if err != nil {
						t.Fatal(err)
					}
					check("a.b", binary, rev)
					rev, err = w.update(ctx, kv, "a.b", []byte("second"), rev)
					if err != nil {
						t.Fatal(err)
					}
					check("a.b", []byte("second"), rev)
					rev, err = w.put(ctx, kv, "a.b", []byte{})
					if err != nil {
						t.Fatal(err)
					}
					check("a.b", nil, rev)
					if err := w.delete(ctx, kv, "a.b"); err != nil {
						t.Fatal(err)
					}
					if _, _, _, err := r.get(ctx, kv, "a.b"); !errors.Is(err, jetstream.ErrKeyNotFound) {
						t.Fatalf("get after delete: %v", err)
					}
					// Create over a delete marker works from either side.
					rev, err = w.create(ctx, kv, "a.b", []byte("again"))
					if err != nil {
						t.Fatalf("create after delete: %v", err)
					}
					check("a.b", []byte("again"), rev)
					if err := w.purge(ctx, kv, "a.b"); err != nil {
						t.Fatal(err)
					}
					if _, _, _, err := r.get(ctx, kv, "a.b"); !errors.Is(err, jetstream.ErrKeyNotFound) {
						t.Fatalf("get after purge: %v", err)
					}
					rev, err = w.create(ctx, kv, "a.b", []byte("after purge"))
					if err != nil {
						t.Fatalf("create after purge: %v", err)
					}
					check("a.b", []byte("after purge"), rev)
					// The purge removed the history.
					hist, err := kv.KeyValue().History(ctx, "a.b")
					if err != nil || len(hist) != 2 || hist[0].Operation() != jetstream.KeyValuePurge {
						t.Errorf("history after purge: %d entries, %v", len(hist), err)
					}
				})
			}
		}
	}
}

func TestKVCompareAndSet(t *testing.T) {
	t.Parallel()
	_, js := serverAndJS(t)
	kv := ensureKV(t, js, testSpec(1))
	ctx := t.Context()

	tests := []struct {
		name string
		// run prepares the key and makes the call under test.
		run func(t *testing.T, key string) error
		// want: nil means success.
		want error
	}{
		{name: "create absent", run: func(t *testing.T, key string) error { _, err := kv.Create(ctx, key, []byte("v")); return err }},
		{name: "create existing", want: ErrConflict, run: func(t *testing.T, key string) error {
			mustPut(t, kv, key)
			_, err := kv.Create(ctx, key, []byte("v"))
			return err
		}},
		{name: "create after delete", run: func(t *testing.T, key string) error {
			mustPut(t, kv, key)
			mustNoErr(t, kv.Delete(ctx, key))
			_, err := kv.Create(ctx, key, []byte("v"))
			return err
		}},
		{name: "update at last revision", run: func(t *testing.T, key string) error {
			rev := mustPut(t, kv, key)
			_, err := kv.Update(ctx, key, []byte("v"), rev)
			return err
		}},
		{name: "update at old revision", want: ErrConflict, run: func(t *testing.T, key string) error {
			rev := mustPut(t, kv, key)
			mustPut(t, kv, key)
			_, err := kv.Update(ctx, key, []byte("v"), rev)
			return err
		}},
		{name: "update of absent key", want: ErrConflict, run: func(t *testing.T, key string) error {
			_, err := kv.Update(ctx, key, []byte("v"), 1)
			return err
		}},
		{name: "update of deleted key at its value's revision", want: ErrConflict, run: func(t *testing.T, key string) error {
			rev := mustPut(t, kv, key)
			mustNoErr(t, kv.Delete(ctx, key))
			_, err := kv.Update(ctx, key, []byte("v"), rev)
			return err
		}},
		{name: "delete at last revision", run: func(t *testing.T, key string) error {
			rev := mustPut(t, kv, key)
			return kv.Delete(ctx, key, LastRevision(rev))
		}},
		{name: "delete at old revision", want: ErrConflict, run: func(t *testing.T, key string) error {
			rev := mustPut(t, kv, key)
			mustPut(t, kv, key)
			return kv.Delete(ctx, key, LastRevision(rev))
		}},
		{name: "purge at old revision", want: ErrConflict, run: func(t *testing.T, key string) error {
			rev := mustPut(t, kv, key)
			mustPut(t, kv, key)
			return kv.Purge(ctx, key, LastRevision(rev))
		}},
		{name: "delete absent key", run: func(t *testing.T, key string) error { return kv.Delete(ctx, key) }},
		{name: "get absent key", want: ErrNotFound, run: func(t *testing.T, key string) error { _, err := kv.Get(ctx, key); return err }},
		{name: "get deleted key", want: ErrNotFound, run: func(t *testing.T, key string) error {
			mustPut(t, kv, key)
			mustNoErr(t, kv.Delete(ctx, key))
			_, err := kv.Get(ctx, key)
			return err
		}},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			key := fmt.Sprintf("cas.k%02d", i)
			err := tt.run(t, key)
			if tt.want == nil {
				if err != nil {
					t.Fatalf("err = %v", err)
				}
				return
			}
			if !errors.Is(err, tt.want) {
				t.Fatalf("err = %v, want %v", err, tt.want)
			}
			if !strings.Contains(err.Error(), kv.Bucket()) || !strings.Contains(err.Error(), key) {
				t.Errorf("error %q does not name bucket and key", err)
			}
			if tt.want == ErrConflict && !strings.Contains(err.Error(), "wrong last sequence") {
				t.Errorf("error %q lost the server's text", err)
			}
		})
	}
}

func mustPut(t *testing.T, kv *KV, key string) uint64 {
	t.Helper()
	rev, err := kv.Put(t.Context(), key, []byte("x"))
	if err != nil {
		t.Fatal(err)
	}
	return rev
}

func mustNoErr(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func TestKVHistory(t *testing.T) {
	t.Parallel()
	_, js := serverAndJS(t)
	tests := []struct {
		name    string
		spec    KVSpec
		writes  int
		wantLen int
	}{
		{name: "history 1 keeps the last", spec: Buckets(1)[0], writes: 4, wantLen: 1},
		{name: "assignments keep 5", spec: Buckets(1)[5], writes: 8, wantLen: 5},
		{name: "fewer writes than history", spec: Buckets(1)[5], writes: 3, wantLen: 3},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			spec := tt.spec
			spec.Bucket = testSpec(0).Bucket
			kv := ensureKV(t, js, spec)
			var revs []uint64
			for i := range tt.writes {
				rev, err := kv.Put(t.Context(), "n1", []byte{byte(i)})
				if err != nil {
					t.Fatal(err)
				}
				revs = append(revs, rev)
			}
			hist, err := kv.KeyValue().History(t.Context(), "n1")
			if err != nil {
				t.Fatal(err)
			}
			if len(hist) != tt.wantLen {
				t.Fatalf("history holds %d, want %d", len(hist), tt.wantLen)
			}
			for i, e := range hist {
				if want := revs[len(revs)-tt.wantLen+i]; e.Revision() != want {
					t.Errorf("history[%d] at %d, want %d", i, e.Revision(), want)
				}
			}
		})
	}
}

func TestKVTTL(t *testing.T) {
	t.Parallel()
	_, js := serverAndJS(t)
	spec := LeaseSpec(1, time.Second)
	spec.Bucket = testSpec(0).Bucket
	kv := ensureKV(t, js, spec)
	ctx := t.Context()
	rev, err := kv.Create(ctx, KeyLeaseLeader, []byte("composer-a"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Create(ctx, KeyLeaseLeader, []byte("composer-b")); !errors.Is(err, ErrConflict) {
		t.Fatalf("second holder took a held lease: %v", err)
	}
	// Renewing keeps it held past the first write's TTL.
	if _, err := kv.Update(ctx, KeyLeaseLeader, []byte("composer-a"), rev); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "the lease to expire", func() bool {
		_, err := kv.Get(ctx, KeyLeaseLeader)
		return errors.Is(err, ErrNotFound)
	})
	if _, err := kv.Create(ctx, KeyLeaseLeader, []byte("composer-b")); err != nil {
		t.Fatalf("create after expiry: %v", err)
	}
}

func TestKVValueSize(t *testing.T) {
	t.Parallel()
	_, js := serverAndJS(t)
	kv := ensureKV(t, js, Buckets(1)[0]) // catalog-entries: 1 MiB
	small := testSpec(1)
	small.MaxValueSize = 100
	smallKV := ensureKV(t, js, small)
	tp, _ := recordingTracer(t)
	ctx, span := tp.Tracer("test").Start(t.Context(), "writer") // so trace headers go out
	defer span.End()

	tests := []struct {
		name string
		kv   *KV
		size int
		want error
	}{
		{name: "exactly 1 MiB with trace headers", kv: kv, size: MaxValueSize},
		{name: "1 MiB + 1", kv: kv, size: MaxValueSize + 1, want: ErrTooLarge},
		{name: "at a bucket's own limit", kv: smallKV, size: 100},
		{name: "over a bucket's own limit", kv: smallKV, size: 101, want: ErrTooLarge},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			value := bytes.Repeat([]byte{'v'}, tt.size)
			key := "size" + string(rune('a'+i))
			_, err := tt.kv.Put(ctx, key, value)
			if !errors.Is(err, tt.want) {
				t.Fatalf("put err = %v, want %v", err, tt.want)
			}
			if tt.want != nil {
				if _, err := tt.kv.Get(ctx, key); !errors.Is(err, ErrNotFound) {
					t.Errorf("refused write changed the key: %v", err)
				}
				return
			}
			e, err := tt.kv.Get(ctx, key)
			if err != nil || !bytes.Equal(e.Value, value) {
				t.Fatalf("get: %d bytes, %v", len(e.Value), err)
			}
		})
	}
	// The server's own limit maps too: nats.go writes past the header room.
	_, err := kv.KeyValue().Put(t.Context(), "raw", make([]byte, MaxValueSize+MaxHeaderBytes+1))
	if !errors.Is(MapError(err), ErrTooLarge) {
		t.Errorf("server refusal %v does not map to ErrTooLarge", err)
	}
}

func TestKVInvalidKey(t *testing.T) {
	t.Parallel()
	_, js := serverAndJS(t)
	kv := ensureKV(t, js, testSpec(1))
	for _, key := range []string{"", ".a", "a.", "a..b", "a b", "fp1:abc", "a*", "a>"} {
		if _, err := kv.Put(t.Context(), key, nil); !errors.Is(err, jetstream.ErrInvalidKey) {
			t.Errorf("put %q: %v", key, err)
		}
		if _, err := kv.Get(t.Context(), key); !errors.Is(err, jetstream.ErrInvalidKey) {
			t.Errorf("get %q: %v", key, err)
		}
	}
}

func TestKVListKeys(t *testing.T) {
	t.Parallel()
	_, js := serverAndJS(t)
	kv := ensureKV(t, js, testSpec(1))
	ctx := t.Context()
	for _, key := range []string{"n1.web.aa", "n1.db.bb", "n1.node", "n2.web.cc", "n1.gone.dd", "n10.web.ee"} {
		mustPut(t, kv, key)
	}
	mustNoErr(t, kv.Delete(ctx, "n1.gone.dd"))
	mustNoErr(t, kv.Purge(ctx, "n1.node"))

	empty := ensureKV(t, js, testSpec(1))
	tests := []struct {
		name    string
		kv      *KV
		filters []string
		want    []string
	}{
		{name: "all", kv: kv, want: []string{"n1.db.bb", "n1.web.aa", "n10.web.ee", "n2.web.cc"}},
		{name: "one node's compositions", kv: kv, filters: []string{"n1.*.*"}, want: []string{"n1.db.bb", "n1.web.aa"}},
		{name: "two filters", kv: kv, filters: []string{"n1.web.*", "n2.>"}, want: []string{"n1.web.aa", "n2.web.cc"}},
		{name: "no match", kv: kv, filters: []string{"n3.*.*"}, want: []string{}},
		{name: "empty bucket", kv: empty, want: []string{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			filters := slices.Clone(tt.filters)
			got, err := tt.kv.ListKeys(ctx, filters...)
			if err != nil {
				t.Fatal(err)
			}
			if got == nil || !slices.Equal(got, tt.want) {
				t.Errorf("keys = %#v, want %#v", got, tt.want)
			}
			if !slices.Equal(filters, tt.filters) {
				t.Errorf("filters changed to %v", filters)
			}
		})
	}
	meta, err := kv.ListMeta(ctx, "n1.*.*")
	if err != nil {
		t.Fatal(err)
	}
	if len(meta) != 2 || meta[0].Key != "n1.db.bb" || meta[1].Key != "n1.web.aa" {
		t.Fatalf("meta = %+v", meta)
	}
	for _, m := range meta {
		e, err := kv.Get(ctx, m.Key)
		if err != nil {
			t.Fatal(err)
		}
		if m.Revision != e.Revision || !m.Created.Equal(e.Created) || m.Value != nil || m.Op != jetstream.KeyValuePut {
			t.Errorf("meta of %s = %+v, get = %+v", m.Key, m, e)
		}
	}
	if _, err := kv.ListKeys(ctx, "a..b"); !errors.Is(err, jetstream.ErrInvalidKey) {
		t.Errorf("invalid filter: %v", err)
	}
	canceled, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := kv.ListKeys(canceled); err == nil {
		t.Error("listing with an ended context succeeded")
	}
	// Listing does not leave consumers behind for long.
	waitFor(t, 10*time.Second, "listing consumers to be deleted", func() bool {
		st, err := js.Stream(ctx, "KV_"+kv.Bucket())
		if err != nil {
			return false
		}
		info, err := st.Info(ctx)
		return err == nil && info.State.Consumers == 0
	})
}

func TestKVTraceContext(t *testing.T) {
	t.Parallel()
	_, js := serverAndJS(t)
	tp, exp := recordingTracer(t)
	for _, leaderReads := range []bool{false, true} {
		spec := testSpec(1)
		spec.LeaderReads = leaderReads
		kv := ensureKV(t, js, spec, WithTracerProvider(tp))

		w, err := kv.Watch(t.Context(), ">", UpdatesOnly())
		if err != nil {
			t.Fatal(err)
		}
		ctx, writer := tp.Tracer("test").Start(t.Context(), "registration")
		rev, err := kv.Put(ctx, "n1", []byte("secret-value"))
		writer.End()
		if err != nil {
			t.Fatal(err)
		}

		var putSpan trace.SpanContext
		for _, s := range exp.GetSpans() {
			if s.Name == "kv.put "+kv.Bucket() {
				putSpan = s.SpanContext
				if s.Parent.SpanID() != writer.SpanContext().SpanID() {
					t.Errorf("kv.put is not a child of the caller's span")
				}
				attrs := attribute.NewSet(s.Attributes...)
				if v, _ := attrs.Value(attrBucket); v.AsString() != kv.Bucket() {
					t.Errorf("bucket attribute %q", v.AsString())
				}
				if v, _ := attrs.Value(attrKey); v.AsString() != "n1" {
					t.Errorf("key attribute %q", v.AsString())
				}
				if v, _ := attrs.Value(attrRevision); v.AsInt64() != int64(rev) {
					t.Errorf("revision attribute %d, want %d", v.AsInt64(), rev)
				}
				for _, a := range s.Attributes {
					if strings.Contains(a.Value.Emit(), "secret-value") {
						t.Errorf("value recorded in attribute %s", a.Key)
					}
				}
			}
		}
		if !putSpan.IsValid() {
			t.Fatal("no kv.put span")
		}

		e, err := kv.Get(t.Context(), "n1")
		if err != nil {
			t.Fatal(err)
		}
		got := trace.SpanContextFromContext(e.TraceContext(context.Background()))
		if got.TraceID() != writer.SpanContext().TraceID() || got.SpanID() != putSpan.SpanID() {
			t.Errorf("leader reads %v: Get carries %v, want the kv.put span %v", leaderReads, got, putSpan)
		}
		if e.Header.Get(jetstream.StreamHeader) != "" || e.Header.Get(jetstream.SequenceHeader) != "" {
			t.Errorf("direct-get headers leaked into the entry: %v", e.Header)
		}

		we := next(t, w)
		if we == nil || we.Key != "n1" || we.Revision != rev {
			t.Fatalf("watch delivered %+v", we)
		}
		got = trace.SpanContextFromContext(we.TraceContext(context.Background()))
		if got.TraceID() != writer.SpanContext().TraceID() || got.SpanID() != putSpan.SpanID() {
			t.Errorf("Watch carries %v, want the kv.put span %v", got, putSpan)
		}
		w.Stop()

		// Reads are spans too; a missing key is not an error on them.
		_, _ = kv.Get(t.Context(), "absent")
		found := false
		for _, s := range exp.GetSpans() {
			attrs := attribute.NewSet(s.Attributes...)
			if s.Name == "kv.get "+kv.Bucket() && attrs.HasValue(attrFound) {
				if v, _ := attrs.Value(attrKey); v.AsString() == "absent" {
					found = true
					if s.Status.Code.String() == "Error" {
						t.Error("not found recorded as a span error")
					}
				}
			}
		}
		if !found {
			t.Error("no kv.get span for the absent key")
		}
	}
}

func TestKVConflictSpanIsError(t *testing.T) {
	t.Parallel()
	_, js := serverAndJS(t)
	tp, exp := recordingTracer(t)
	kv := ensureKV(t, js, testSpec(1), WithTracerProvider(tp))
	mustPut(t, kv, "k")
	if _, err := kv.Update(t.Context(), "k", nil, 999); !errors.Is(err, ErrConflict) {
		t.Fatal(err)
	}
	for _, s := range exp.GetSpans() {
		if s.Name == "kv.update "+kv.Bucket() {
			if s.Status.Code.String() != "Error" || len(s.Events) == 0 {
				t.Errorf("conflict not recorded on the span: %+v", s.Status)
			}
			return
		}
	}
	t.Error("no kv.update span")
}

// TestKVCreateWithHeader checks that a header written with a value comes
// back from Get, ListMeta and a MetaOnly watch resumed from a revision (how
// the catalog indexes entries by module without reading them), that
// Create's rules hold, and that the wrapper's own headers cannot be set.
func TestKVCreateWithHeader(t *testing.T) {
	t.Parallel()
	_, js := serverAndJS(t)
	kv := ensureKV(t, js, testSpec(1))
	ctx := t.Context()
	first, err := kv.Create(ctx, "a", []byte("no header"))
	mustNoErr(t, err)
	rev, err := kv.CreateWithHeader(ctx, "b", []byte("value"), nats.Header{"Mesh-Module": []string{"sshd"}})
	mustNoErr(t, err)

	e, err := kv.Get(ctx, "b")
	mustNoErr(t, err)
	if e.Header.Get("Mesh-Module") != "sshd" || string(e.Value) != "value" || e.Revision != rev {
		t.Fatalf("get = %+v", e)
	}
	meta, err := kv.ListMeta(ctx)
	mustNoErr(t, err)
	if len(meta) != 2 || meta[0].Header.Get("Mesh-Module") != "" || meta[1].Header.Get("Mesh-Module") != "sshd" {
		t.Fatalf("meta = %+v", meta)
	}
	w, err := kv.Watch(ctx, "", ResumeFromRevision(first+1), MetaOnly(), IgnoreDeletes())
	mustNoErr(t, err)
	defer w.Stop()
	got := <-w.Updates()
	if got == nil || got.Key != "b" || got.Header.Get("Mesh-Module") != "sshd" || got.Revision != rev {
		t.Fatalf("watch from %d delivered %+v", first+1, got)
	}
	if marker := <-w.Updates(); marker != nil {
		t.Fatalf("watch delivered %+v, want the caught-up marker", marker)
	}

	if _, err := kv.CreateWithHeader(ctx, "b", []byte("other"), nats.Header{"Mesh-Module": []string{"motd"}}); !errors.Is(err, ErrConflict) {
		t.Errorf("create over a value: %v", err)
	}
	for _, name := range []string{"KV-Operation", "Nats-Expected-Last-Subject-Sequence", "traceparent"} {
		_, err := kv.CreateWithHeader(ctx, "c", []byte("x"), nats.Header{name: []string{"x"}})
		if err == nil || !strings.Contains(err.Error(), "header "+name+" is the wrapper's") {
			t.Errorf("header %s: %v", name, err)
		}
	}
	if _, err := kv.Get(ctx, "c"); !errors.Is(err, ErrNotFound) {
		t.Errorf("a refused create wrote: %v", err)
	}
}

// TestKVAckedAndUnsure: Acked is the highest revision a write through the
// handle was acknowledged with, whatever the kind of write, and not another
// handle's; Unsure counts the writes that got no answer, not the ones the
// stream refused.
func TestKVAckedAndUnsure(t *testing.T) {
	t.Parallel()
	_, js := serverAndJS(t)
	spec := testSpec(1)
	kv := ensureKV(t, js, spec)
	other, err := OpenKV(t.Context(), js, spec.Bucket)
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	if kv.Acked() != 0 || kv.Unsure() != 0 {
		t.Fatalf("a new handle: Acked %d, Unsure %d", kv.Acked(), kv.Unsure())
	}
	rev, err := kv.Create(ctx, "a", []byte("1"))
	if err != nil || kv.Acked() != rev {
		t.Fatalf("after a create at r%d (%v): Acked %d", rev, err, kv.Acked())
	}
	if rev, err = kv.Update(ctx, "a", []byte("2"), rev); err != nil || kv.Acked() != rev {
		t.Fatalf("after an update at r%d (%v): Acked %d", rev, err, kv.Acked())
	}
	if err := kv.Delete(ctx, "a"); err != nil || kv.Acked() != rev+1 {
		t.Fatalf("after a delete (%v): Acked %d, want r%d", err, kv.Acked(), rev+1)
	}
	if _, err := other.Put(ctx, "b", []byte("1")); err != nil || kv.Acked() != rev+1 {
		t.Fatalf("another handle's put (%v) moved Acked to %d", err, kv.Acked())
	}
	if _, err := kv.Update(ctx, "b", []byte("2"), 1); !errors.Is(err, ErrConflict) || kv.Unsure() != 0 {
		t.Fatalf("a refused update: %v, Unsure %d; want a conflict and 0", err, kv.Unsure())
	}
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := kv.Put(cancelled, "c", []byte("1")); err == nil || kv.Unsure() != 1 {
		t.Fatalf("a put with no answer: %v, Unsure %d; want an error and 1", err, kv.Unsure())
	}
}
