package backup

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"google.golang.org/protobuf/proto"

	"mesh.dev/internal/envelope"
	"mesh.dev/internal/natsx"
	"mesh.dev/internal/testutil"
	composerv1 "mesh.dev/proto/mesh/composer/v1"
	typev1 "mesh.dev/proto/mesh/type/v1"
)

const leaseTTL = 30 * time.Second

// source is a JetStream holding every bucket of DESIGN.md §9 with a little
// of everything a backup must carry: values with headers, kept history,
// delete and purge markers, objects of several chunks, an empty object, a
// deleted one, and derived data that must stay out.
type source struct {
	js        jetstream.JetStream
	wantedKey string
	kvs       map[string]*natsx.KV
	stores    map[string]jetstream.ObjectStore
	objects   map[string][]byte
}

func newSource(t *testing.T) *source {
	t.Helper()
	ctx := t.Context()
	_, js := testutil.ConnectJetStream(t, testutil.StartJetStream(t))
	kvs, stores, err := natsx.EnsureAll(ctx, js, 1, leaseTTL)
	if err != nil {
		t.Fatal(err)
	}
	s := &source{js: js, kvs: kvs, stores: stores, objects: map[string][]byte{}, wantedKey: "n3.postgres." + strings.Repeat("ab", 32)}
	put := func(bucket, key, value string, hdr nats.Header) {
		t.Helper()
		msg := &nats.Msg{Subject: "$KV." + bucket + "." + key, Data: []byte(value), Header: hdr}
		if _, err := js.PublishMsg(ctx, msg); err != nil {
			t.Fatal(err)
		}
	}
	trace := func(i int) nats.Header {
		return nats.Header{"traceparent": {fmt.Sprintf("00-%032x-%016x-01", i+1, i+1)}, "X-Mesh-Test": {"a", "b"}}
	}
	put(natsx.BucketCatalogEntries, "aa11", "entry one", trace(1))
	put(natsx.BucketCatalogEntries, "bb22", "entry two", nil)
	put(natsx.BucketCatalogBuilds, "aa11", "build one", trace(2))
	put(natsx.BucketCatalogModules, "sshd", "registration", trace(3))
	put(natsx.BucketCatalogModules, "sshd.1", "registration history 1", nil)
	put(natsx.BucketNodes, "n1", "spec n1", trace(4))
	put(natsx.BucketNodes, "n2", "spec n2", nil)
	put(natsx.BucketNodes, "gone", "spec gone", nil)
	if err := kvs[natsx.BucketNodes].Purge(ctx, "gone"); err != nil {
		t.Fatal(err)
	}
	// Seven writes through the CAS of natsx: history 5 keeps the last five,
	// each stored with its Nats-Expected-Last-Subject-Sequence directive.
	var rev uint64
	for i := 1; i <= 7; i++ {
		v := []byte(fmt.Sprintf("assignment n1 #%d", i))
		if rev == 0 {
			rev, err = kvs[natsx.BucketAssignments].Create(ctx, "n1", v)
		} else {
			rev, err = kvs[natsx.BucketAssignments].Update(ctx, "n1", v, rev)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	put(natsx.BucketAssignments, "n2", "assignment n2", trace(5))
	if err := kvs[natsx.BucketAssignments].Delete(ctx, "n2"); err != nil {
		t.Fatal(err)
	}
	put(natsx.BucketKeysets, natsx.KeyKeysetCurrent, "keyset v1", nil)
	put(natsx.BucketKeysets, natsx.KeyKeysetCurrent, "keyset v2", trace(6))
	// Derived: never in a backup, except the compositions the
	// assignments' wants name and the objects those name.
	put(natsx.BucketCompositions, "n1.sshd.abc", "composition", nil)
	put(natsx.BucketHaves, "n1", "haves", nil)
	wantedKey := s.wantedKey
	comp, _, err := envelope.Seal(typev1.PayloadType_PAYLOAD_TYPE_COMPOSITION, &typev1.Composition{Node: "n3", Module: "postgres",
		Resources: []*typev1.Resource{{Id: "postgres:conf", Path: "/etc/postgresql.conf",
			Content: &typev1.Resource_Object{Object: &typev1.ObjectRef{Digest: "sha256:wanted", Size: 6}}}}})
	if err != nil {
		t.Fatal(err)
	}
	compBytes, _ := proto.Marshal(comp)
	put(natsx.BucketCompositions, wantedKey, string(compBytes), trace(7))
	asg, _ := proto.Marshal(&composerv1.Assignment{Node: "n3", Wants: []*typev1.Want{
		{Module: "postgres", CompositionKey: wantedKey}, {Module: "gone", CompositionKey: "n3.gone." + strings.Repeat("cd", 32)}}})
	put(natsx.BucketAssignments, "n3", string(asg), nil)
	objs := stores[natsx.ObjectStoreObjects]
	for _, name := range []string{"sha256:wanted", "sha256:unwanted"} {
		if _, err := objs.PutString(ctx, name, name[7:]); err != nil {
			t.Fatal(err)
		}
	}

	big := make([]byte, 3*natsx.ObjectChunkSize+12345)
	if _, err := rand.Read(big); err != nil {
		t.Fatal(err)
	}
	arts := stores[natsx.ObjectStoreArtifacts]
	if _, err := arts.Put(ctx, jetstream.ObjectMeta{Name: "sha256:big", Description: "a big one",
		Headers: nats.Header{"X-Kind": {"tarball"}}, Metadata: map[string]string{"ref": "tar:root"},
		Opts: &jetstream.ObjectMetaOptions{ChunkSize: natsx.ObjectChunkSize}}, bytes.NewReader(big)); err != nil {
		t.Fatal(err)
	}
	s.objects["sha256:big"] = big
	if _, err := arts.PutBytes(ctx, "sha256:empty", nil); err != nil {
		t.Fatal(err)
	}
	s.objects["sha256:empty"] = []byte{}
	if _, err := arts.PutString(ctx, "sha256:deleted", "deleted"); err != nil {
		t.Fatal(err)
	}
	if err := arts.Delete(ctx, "sha256:deleted"); err != nil {
		t.Fatal(err)
	}
	return s
}

// backupTo writes a backup of js into a file and returns its path.
func backupTo(t *testing.T, js jetstream.JetStream) (string, *Manifest) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "backup.tar")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	m, err := Backup(t.Context(), js, f, Options{Source: Source{URL: "test"}, Idle: time.Second})
	if err != nil {
		t.Fatalf("backup: %v", err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	return path, m
}

// message is a stored KV message as a restore must reproduce it.
type message struct {
	Key, Op string
	Data    string
	Headers nats.Header
}

// readStream returns every message a KV bucket's stream keeps, in order,
// less the publish directives.
func readStream(t *testing.T, js jetstream.JetStream, bucket string) []message {
	t.Helper()
	stream, err := js.Stream(t.Context(), kvStream(bucket))
	if err != nil {
		t.Fatalf("%s: %v", bucket, err)
	}
	var out []message
	r := &streamReader{js: js, stream: stream, name: kvStream(bucket), idle: time.Second}
	if _, err := r.each(t.Context(), 0, func(msg jetstream.Msg, _ *jetstream.MsgMetadata) error {
		out = append(out, message{Key: strings.TrimPrefix(msg.Subject(), kvPrefix(bucket)), Op: opOf(msg.Headers()),
			Data: string(msg.Data()), Headers: publishHeaders(msg.Headers())})
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return out
}

func streamConfig(t *testing.T, js jetstream.JetStream, name string) jetstream.StreamConfig {
	t.Helper()
	s, err := js.Stream(t.Context(), name)
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	cfg := s.CachedInfo().Config
	// Fields the server fills in per stream, not settings.
	cfg.Metadata = nil
	return cfg
}

func TestBackupRestoreRoundTrip(t *testing.T) {
	t.Parallel()
	src := newSource(t)
	path, m := backupTo(t, src.js)

	want := map[string]struct{ records, keys, markers int }{
		natsx.BucketAssignments:    {5 + 2 + 1, 3, 1},
		natsx.BucketCompositions:   {1, 1, 0},
		natsx.ObjectStoreObjects:   {1, 1, 0},
		natsx.BucketApprovals:      {0, 0, 0},
		natsx.BucketNodes:          {3, 3, 1},
		natsx.BucketKeysets:        {2, 1, 0},
		natsx.BucketCatalogModules: {2, 2, 0},
		natsx.BucketCatalogBuilds:  {1, 1, 0},
		natsx.BucketCatalogEntries: {2, 2, 0},
		natsx.ObjectStoreArtifacts: {2, 2, 0},
	}
	if len(m.Buckets) != len(want) {
		t.Fatalf("manifest has %d buckets, want %d", len(m.Buckets), len(want))
	}
	for _, b := range m.Buckets {
		w := want[b.Name]
		if b.Records != w.records || b.Keys != w.keys || b.Markers != w.markers {
			t.Errorf("%s: %d records, %d keys, %d markers; want %d, %d, %d", b.Name, b.Records, b.Keys, b.Markers, w.records, w.keys, w.markers)
		}
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := Verify(f); err != nil {
		t.Fatalf("verify: %v", err)
	}

	_, dst := testutil.ConnectJetStream(t, testutil.StartJetStream(t))
	var progress []string
	if _, done, err := Restore(t.Context(), dst, f, RestoreOptions{Idle: time.Second, Progress: func(b RestoredBucket) { progress = append(progress, b.Name) }}); err != nil {
		t.Fatalf("restore: %v", err)
	} else if len(done) != len(Buckets) {
		t.Fatalf("restored %d buckets", len(done))
	}
	if !slices.Equal(progress, restoreOrder()) {
		t.Errorf("restored in the order %v, want %v", progress, restoreOrder())
	}

	specs := map[string]natsx.KVSpec{}
	for _, s := range natsx.Buckets(1) {
		specs[s.Bucket] = s
	}
	for _, bucket := range Buckets {
		if kindOf(bucket) == KindObject {
			continue
		}
		// Every message, in order: values byte for byte, markers, headers
		// (the writer's trace context among them) and kept history.
		got, wantMsgs := readStream(t, dst, bucket), readStream(t, src.js, bucket)
		if wantedOnly(bucket) {
			// Only the compositions the assignments name.
			wantMsgs = slices.DeleteFunc(wantMsgs, func(m message) bool { return m.Key != src.wantedKey })
		}
		if len(got) != len(wantMsgs) {
			t.Errorf("%s: %d messages restored, the source keeps %d", bucket, len(got), len(wantMsgs))
			continue
		}
		for i := range got {
			if got[i].Key != wantMsgs[i].Key || got[i].Op != wantMsgs[i].Op || got[i].Data != wantMsgs[i].Data || !maps.EqualFunc(got[i].Headers, wantMsgs[i].Headers, slices.Equal) {
				t.Errorf("%s message %d: got %+v, want %+v", bucket, i, got[i], wantMsgs[i])
			}
		}
		// The settings of DESIGN.md §9, as the services create them.
		if g, w := streamConfig(t, dst, kvStream(bucket)), streamConfig(t, src.js, kvStream(bucket)); !configEqual(g, w) {
			t.Errorf("%s: restored stream config\n%+v\nwant\n%+v", bucket, g, w)
		}
		// Read back from the leader: compositions (DESIGN.md §9) and the
		// catalog's buckets, which it reads its own writes from at once.
		leader := map[string]bool{natsx.BucketCompositions: true, natsx.BucketCatalogEntries: true,
			natsx.BucketCatalogBuilds: true, natsx.BucketCatalogModules: true}
		if s := specs[bucket]; s.LeaderReads != leader[bucket] {
			t.Errorf("%s: leader reads %v, want %v", bucket, s.LeaderReads, leader[bucket])
		}
	}
	// History: the last five revisions of n1, the marker of n2, and a
	// reader through natsx sees the same values.
	kv, err := natsx.OpenKV(t.Context(), dst, natsx.BucketAssignments)
	if err != nil {
		t.Fatal(err)
	}
	if e, err := kv.Get(t.Context(), "n1"); err != nil || string(e.Value) != "assignment n1 #7" {
		t.Errorf("n1: %q, %v", e.Value, err)
	}
	if _, err := kv.Get(t.Context(), "n2"); !errors.Is(err, natsx.ErrNotFound) {
		t.Errorf("n2 was deleted in the source; restored: %v", err)
	}
	hist, err := kv.KeyValue().History(t.Context(), "n1")
	if err != nil || len(hist) != 5 || string(hist[0].Value()) != "assignment n1 #3" {
		t.Errorf("n1 history: %d revisions, %v", len(hist), err)
	}

	// Objects: content and meta exactly.
	obs, err := dst.ObjectStore(t.Context(), natsx.ObjectStoreArtifacts)
	if err != nil {
		t.Fatal(err)
	}
	srcObs := src.stores[natsx.ObjectStoreArtifacts]
	infos, err := obs.List(t.Context())
	if err != nil || len(infos) != len(src.objects) {
		t.Fatalf("restored objects: %d, %v", len(infos), err)
	}
	for name, content := range src.objects {
		got, err := obs.GetBytes(t.Context(), name)
		if err != nil || !bytes.Equal(got, content) {
			t.Errorf("object %s: %d bytes restored, %d in the source, %v", name, len(got), len(content), err)
		}
		gi, _ := obs.GetInfo(t.Context(), name)
		wi, _ := srcObs.GetInfo(t.Context(), name)
		if gi.Digest != wi.Digest || gi.Description != wi.Description || !maps.Equal(gi.Metadata, wi.Metadata) ||
			!maps.EqualFunc(gi.Headers, wi.Headers, slices.Equal) || gi.Opts.ChunkSize != wi.Opts.ChunkSize || gi.Chunks != wi.Chunks {
			t.Errorf("object %s: restored info %+v, want %+v", name, gi, wi)
		}
	}
	if g, w := streamConfig(t, dst, objectStream(natsx.ObjectStoreArtifacts)), streamConfig(t, src.js, objectStream(natsx.ObjectStoreArtifacts)); !configEqual(g, w) {
		t.Errorf("artifacts: restored stream config\n%+v\nwant\n%+v", g, w)
	}
	// Derived data stays out (the composer rebuilds it), but for the
	// composition an assignment names and the object it names.
	for _, name := range []string{kvStream(natsx.BucketHaves), kvStream(natsx.BucketStatus), kvStream(natsx.BucketComposed), kvStream(natsx.BucketComposerLease)} {
		if _, err := dst.Stream(t.Context(), name); !errors.Is(err, jetstream.ErrStreamNotFound) {
			t.Errorf("%s exists after a restore: %v", name, err)
		}
	}
	objs, err := dst.ObjectStore(t.Context(), natsx.ObjectStoreObjects)
	if err != nil {
		t.Fatal(err)
	}
	if infos, err := objs.List(t.Context()); err != nil || len(infos) != 1 || infos[0].Name != "sha256:wanted" {
		t.Errorf("restored objects: %v, %v", infos, err)
	} else if b, err := objs.GetString(t.Context(), "sha256:wanted"); err != nil || b != "wanted" {
		t.Errorf("restored object: %q, %v", b, err)
	}
	if b := m.Bucket(natsx.BucketCompositions); len(b.Skipped) != 1 || !strings.HasPrefix(b.Skipped[0], "n3.gone.") {
		t.Errorf("compositions skipped: %v", b.Skipped)
	}
}

// configEqual compares the settings of two streams.
func configEqual(a, b jetstream.StreamConfig) bool {
	return a.Name == b.Name && slices.Equal(a.Subjects, b.Subjects) && a.MaxMsgsPerSubject == b.MaxMsgsPerSubject &&
		a.MaxMsgSize == b.MaxMsgSize && a.MaxBytes == b.MaxBytes && a.MaxAge == b.MaxAge && a.Storage == b.Storage &&
		a.Replicas == b.Replicas && a.AllowDirect == b.AllowDirect && a.AllowRollup == b.AllowRollup &&
		a.DenyDelete == b.DenyDelete && a.Discard == b.Discard && a.Duplicates == b.Duplicates && a.Description == b.Description
}

// streamState is what a refused restore must leave unchanged.
type streamState struct {
	msgs, lastSeq, bytes uint64
}

func streamStates(t *testing.T, js jetstream.JetStream) map[string]streamState {
	t.Helper()
	out := map[string]streamState{}
	for _, bucket := range Buckets {
		name := kvStream(bucket)
		if kindOf(bucket) == KindObject {
			name = objectStream(bucket)
		}
		s, err := js.Stream(t.Context(), name)
		if errors.Is(err, jetstream.ErrStreamNotFound) {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		info, err := s.Info(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		out[bucket] = streamState{msgs: info.State.Msgs, lastSeq: info.State.LastSeq, bytes: info.State.Bytes}
	}
	return out
}

func TestRestoreRefusesNonEmptyTarget(t *testing.T) {
	t.Parallel()
	src := newSource(t)
	path, _ := backupTo(t, src.js)
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()

	// The target holds a node spec someone wrote: nothing may be written.
	_, dst := testutil.ConnectJetStream(t, testutil.StartJetStream(t))
	var nodes *natsx.KV
	for _, spec := range natsx.Buckets(1) {
		if spec.Bucket == natsx.BucketNodes {
			if nodes, err = natsx.EnsureKV(t.Context(), dst, spec); err != nil {
				t.Fatal(err)
			}
		}
	}
	if _, err := nodes.Put(t.Context(), "other", []byte("a node of the target")); err != nil {
		t.Fatal(err)
	}
	before := streamStates(t, dst)
	_, _, err = Restore(t.Context(), dst, f, RestoreOptions{Idle: time.Second})
	var ne *NotEmptyError
	if !errors.As(err, &ne) || len(ne.Buckets) != 1 || !strings.HasPrefix(ne.Buckets[0], "nodes (1 messages)") {
		t.Fatalf("restore into a target holding a node: %v", err)
	}
	if after := streamStates(t, dst); !maps.Equal(before, after) {
		t.Errorf("a refused restore changed the target: %v, then %v", before, after)
	}

	// A running composer (its lease) refuses a restore too.
	_, empty := testutil.ConnectJetStream(t, testutil.StartJetStream(t))
	lease, err := natsx.EnsureKV(t.Context(), empty, natsx.LeaseSpec(1, leaseTTL))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := lease.Create(t.Context(), natsx.KeyLeaseLeader, []byte("composer-a")); err != nil {
		t.Fatal(err)
	}
	_, _, err = Restore(t.Context(), empty, f, RestoreOptions{Idle: time.Second})
	if !errors.As(err, &ne) || ne.Lease == "" || len(ne.Buckets) != 0 {
		t.Fatalf("restore while a composer holds the lease: %v", err)
	}
	if st := streamStates(t, empty); len(st) != 0 {
		t.Errorf("a refused restore created %v", slices.Collect(maps.Keys(st)))
	}

	// --force writes the archive over what is there: archived keys end
	// with their archived values, others stay; objects held are kept.
	_, done, err := Restore(t.Context(), dst, f, RestoreOptions{Idle: time.Second, Force: true})
	if err != nil {
		t.Fatalf("forced restore: %v", err)
	}
	if e, err := nodes.Get(t.Context(), "other"); err != nil || string(e.Value) != "a node of the target" {
		t.Errorf("forced restore lost a key the archive does not hold: %v", err)
	}
	if e, err := nodes.Get(t.Context(), "n1"); err != nil || string(e.Value) != "spec n1" {
		t.Errorf("forced restore: n1 %q, %v", e.Value, err)
	}
	// A second forced restore (an interrupted one run again) keeps the
	// objects it already wrote.
	if _, done, err = Restore(t.Context(), dst, f, RestoreOptions{Idle: time.Second, Force: true}); err != nil {
		t.Fatalf("forced restore again: %v", err)
	}
	for _, b := range done {
		if want := map[string]int{natsx.ObjectStoreArtifacts: 2, natsx.ObjectStoreObjects: 1}[b.Name]; b.Kind == KindObject && (b.Kept != want || b.Records != 0) {
			t.Errorf("second forced restore of %s: %d written, %d kept", b.Name, b.Records, b.Kept)
		}
	}
}

// corruptions change an archive's bytes; each must be caught by Verify and
// make Restore write nothing.
func TestVerifyCatchesCorruption(t *testing.T) {
	t.Parallel()
	src := newSource(t)
	path, _ := backupTo(t, src.js)
	good, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Verify(bytes.NewReader(good)); err != nil {
		t.Fatalf("the good archive: %v", err)
	}
	flip := func(needle string, delta int) func([]byte) []byte {
		return func(b []byte) []byte {
			i := bytes.Index(b, []byte(needle))
			if i < 0 {
				t.Fatalf("%q is not in the archive", needle)
			}
			b[i+delta] ^= 0x01
			return b
		}
	}
	cases := []struct {
		name   string
		change func([]byte) []byte
		file   string // the file the error names, when it names one
	}{
		{"a byte of a value", flip("assignment n1 #7", 3), "kv/assignments/00000005.value"},
		{"a byte of an object", func(b []byte) []byte {
			// The big object's content starts one tar block after its header.
			i := bytes.Index(b, []byte("objects/artifacts/00000001.data"))
			b[i+512+1000] ^= 0x80
			return b
		}, "objects/artifacts/00000001.data"},
		{"a record's key", flip(`"key": "n2"`, len(`"key": "n`)), ""},
		{"a record's sha256", flip(`"sha256": "`, len(`"sha256": "`)), ""},
		{"the manifest", flip(`"records": 8`, len(`"records": `)), "manifest.json"},
		{"cut short", func(b []byte) []byte { return b[:len(b)/2] }, ""},
		{"cut before the manifest", func(b []byte) []byte {
			return b[:bytes.LastIndex(b, []byte(manifestFile+"\x00"))]
		}, ""},
		{"a file added after the end", func(b []byte) []byte {
			i := bytes.LastIndex(b, []byte(manifestSumFile+"\x00"))
			// Copy the sum's header and content (two blocks) once more.
			extra := slices.Clone(b[i : i+1024])
			end := i + 1024
			return append(append(b[:end:end], extra...), make([]byte, 1024)...)
		}, manifestSumFile},
		{"not a backup", func(b []byte) []byte { return flip(headerFile, 0)(b) }, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			b := c.change(slices.Clone(good))
			_, err := Verify(bytes.NewReader(b))
			var ce *CorruptError
			if !errors.As(err, &ce) {
				t.Fatalf("verify: %v, want a CorruptError", err)
			}
			if c.file != "" && ce.File != c.file {
				t.Errorf("the error names %q, want %q: %v", ce.File, c.file, err)
			}
			_, dst := testutil.ConnectJetStream(t, testutil.StartJetStream(t))
			if _, _, err := Restore(t.Context(), dst, bytes.NewReader(b), RestoreOptions{Idle: time.Second}); !errors.As(err, &ce) {
				t.Errorf("restore of a corrupt archive: %v", err)
			}
			if st := streamStates(t, dst); len(st) != 0 {
				t.Errorf("restore of a corrupt archive created %v", slices.Collect(maps.Keys(st)))
			}
		})
	}
}

func TestBackupOfAnEmptyServerFails(t *testing.T) {
	t.Parallel()
	_, js := testutil.ConnectJetStream(t, testutil.StartJetStream(t))
	if _, err := Backup(t.Context(), js, io.Discard, Options{Idle: time.Second}); err == nil || !strings.Contains(err.Error(), "none of the mesh's buckets") {
		t.Fatalf("backup of a server without the mesh's buckets: %v", err)
	}
}

// TestBackupWhileWriting backs up a bucket another client keeps writing:
// every key written before the backup is in it, each with a value that
// was acknowledged, and the backup ends.
func TestBackupWhileWriting(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	_, js := testutil.ConnectJetStream(t, testutil.StartJetStream(t))
	kvs, _, err := natsx.EnsureAll(ctx, js, 1, leaseTTL)
	if err != nil {
		t.Fatal(err)
	}
	nodes := kvs[natsx.BucketNodes]
	const keys = 50
	var mu sync.Mutex
	acked := map[string]map[string]bool{}
	write := func(key, value string) error {
		if _, err := nodes.Put(ctx, key, []byte(value)); err != nil {
			return err
		}
		mu.Lock()
		if acked[key] == nil {
			acked[key] = map[string]bool{}
		}
		acked[key][value] = true
		mu.Unlock()
		return nil
	}
	for k := range keys {
		if err := write(fmt.Sprintf("k%02d", k), "v0"); err != nil {
			t.Fatal(err)
		}
	}
	wctx, stop := context.WithCancel(ctx)
	writerDone := make(chan error, 1)
	go func() {
		for i := 1; ; i++ {
			if wctx.Err() != nil {
				writerDone <- nil
				return
			}
			if err := write(fmt.Sprintf("k%02d", i%keys), fmt.Sprintf("v%d", i)); err != nil && wctx.Err() == nil {
				writerDone <- err
				return
			}
		}
	}()
	var buf bytes.Buffer
	_, err = Backup(ctx, js, &buf, Options{Idle: time.Second})
	stop()
	if werr := <-writerDone; werr != nil {
		t.Fatal(werr)
	}
	if err != nil {
		t.Fatalf("backup while writing: %v", err)
	}
	if _, err := Verify(bytes.NewReader(buf.Bytes())); err != nil {
		t.Fatal(err)
	}
	s := newScanner(bytes.NewReader(buf.Bytes()), false)
	if _, err := s.readHeader(); err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for {
		e, mh, err := s.next(func(b string) bool { return b != natsx.BucketNodes })
		if err != nil {
			t.Fatal(err)
		}
		if mh != nil {
			break
		}
		if e.record != nil {
			if _, dup := got[e.record.Key]; dup {
				t.Errorf("key %s is in the archive twice (history 1)", e.record.Key)
			}
			got[e.record.Key] = string(e.value)
		}
	}
	if len(got) != keys {
		t.Errorf("%d keys in the archive, %d were written before it started", len(got), keys)
	}
	mu.Lock()
	defer mu.Unlock()
	for k, v := range got {
		if !acked[k][v] {
			t.Errorf("key %s holds %q in the archive, never acknowledged", k, v)
		}
	}
}
