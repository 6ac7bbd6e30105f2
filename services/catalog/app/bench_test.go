package app_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"mesh.dev/internal/names"
	"mesh.dev/internal/natsx"
	catalogv1 "mesh.dev/proto/mesh/catalog/v1"
	typev1 "mesh.dev/proto/mesh/type/v1"
	"mesh.dev/services/catalog/publish"
)

// benchManifest is a manifest of typical size (about 8 KiB of templates).
func benchManifest() *typev1.ModuleManifest {
	m := manifest("sshd", "9.6.1")
	text := ""
	for i := 0; len(text) < 8<<10; i++ {
		text += fmt.Sprintf("# line %d of a typical config\nSetting%d {{ .Params.port }}\n", i, i)
	}
	m.Resources[1].Content = &typev1.ResourceTemplate_Text{Text: text}
	return m
}

// BenchmarkGetEntry measures warm GetEntry calls over gRPC and mTLS, in
// parallel, and in the same run raw JetStream KV gets of the same entry's
// value: the ratio is what the service costs over its store.
func BenchmarkGetEntry(b *testing.B) {
	w := newWorld(b)
	r := w.start(b)
	c := w.builder(b, r)
	e := entryOf(b, benchManifest())
	if _, err := c.PutEntry(context.Background(), &catalogv1.PutEntryRequest{Entry: e}); err != nil {
		b.Fatal(err)
	}
	req := &catalogv1.GetEntryRequest{Fingerprint: e.GetFingerprint()}
	if _, err := c.GetEntry(context.Background(), req); err != nil { // warm: connection and cache
		b.Fatal(err)
	}

	b.ResetTimer()
	start := time.Now()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, err := c.GetEntry(context.Background(), req); err != nil {
				b.Error(err)
				return
			}
		}
	})
	rpc := float64(b.N) / time.Since(start).Seconds()
	b.StopTimer()

	kv, err := natsx.OpenKV(context.Background(), w.js, natsx.BucketCatalogEntries)
	if err != nil {
		b.Fatal(err)
	}
	key := names.FingerprintHex(e.GetFingerprint())
	n := max(b.N, 1000)
	var left atomic.Int64
	left.Store(int64(n))
	start = time.Now()
	// As many readers as RunParallel ran callers.
	done := make(chan struct{})
	workers := runtime.GOMAXPROCS(0)
	for range workers {
		go func() {
			defer func() { done <- struct{}{} }()
			for left.Add(-1) >= 0 {
				if _, err := kv.Get(context.Background(), key); err != nil {
					b.Error(err)
					return
				}
			}
		}()
	}
	for range workers {
		<-done
	}
	raw := float64(n) / time.Since(start).Seconds()

	b.ReportMetric(rpc, "GetEntry/s")
	b.ReportMetric(raw, "KVGet/s")
	b.ReportMetric(rpc/raw, "GetEntry/KVGet")
	b.ReportMetric(0, "ns/op") // the rates above are the figures
}

// BenchmarkUploadArtifact measures UploadArtifact of 8 MiB artifacts over
// gRPC and mTLS (hashed while stored, then verified), and in the same run
// raw object-store puts of as many bytes.
func BenchmarkUploadArtifact(b *testing.B) {
	const size = 8 << 20
	w := newWorld(b)
	r := w.start(b)
	c := w.builder(b, r)
	base := randomBytes(b, size)
	// Each artifact differs in its first bytes, so none is deduplicated.
	artifact := func(i int) ([]byte, string) {
		buf := bytes.Clone(base)
		binary.BigEndian.PutUint64(buf, uint64(i)+1)
		return buf, names.Digest(buf)
	}

	var upload time.Duration
	b.SetBytes(size)
	b.ResetTimer()
	for i := range b.N {
		b.StopTimer()
		buf, digest := artifact(i)
		b.StartTimer()
		t0 := time.Now()
		resp, err := publish.Upload(context.Background(), c, digest, size, bytes.NewReader(buf))
		upload += time.Since(t0)
		if err != nil || !resp.GetCreated() {
			b.Fatalf("upload: %v, %v", resp, err)
		}
	}
	b.StopTimer()

	store, err := natsx.EnsureObjectStore(context.Background(), w.js, natsx.ObjectSpec{Bucket: "bench", Storage: jetstream.FileStorage})
	if err != nil {
		b.Fatal(err)
	}
	var put time.Duration
	n := max(b.N, 3)
	for i := range n {
		buf, digest := artifact(b.N + i)
		t0 := time.Now()
		if _, err := natsx.PutObject(context.Background(), store, digest, bytes.NewReader(buf), size); err != nil {
			b.Fatal(err)
		}
		put += time.Since(t0)
	}
	mb := func(count int, d time.Duration) float64 { return float64(count) * size / 1e6 / d.Seconds() }
	b.ReportMetric(mb(b.N, upload), "upload-MB/s")
	b.ReportMetric(mb(n, put), "objput-MB/s")
	b.ReportMetric(mb(b.N, upload)/mb(n, put), "upload/objput")
}
