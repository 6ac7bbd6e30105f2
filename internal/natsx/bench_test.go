package natsx

import (
	"context"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

// BenchmarkKVUpdate compares the wrapper's Update (a JetStream publish with
// trace and CAS headers, a span, error mapping) with nats.go's own
// KeyValue.Update on the same embedded server and bucket, the baseline the
// project measures against. Each iteration is one CAS write chained on the
// revision of the previous one, as a composer writing a key does.
//
//	go test -run '^$' -bench BenchmarkKVUpdate -benchtime 2000x mesh.dev/internal/natsx
func BenchmarkKVUpdate(b *testing.B) {
	for _, mode := range []struct {
		name string
		on   bool
	}{{"sync=interval", false}, {"sync=always", true}} {
		b.Run(mode.name, func(b *testing.B) {
			e := startServer(b, EmbeddedConfig{SyncAlways: mode.on})
			_, js := connect(b, e)
			sampled := sdktrace.NewTracerProvider() // spans are made but not exported
			b.Cleanup(func() { _ = sampled.Shutdown(context.Background()) })

			wrapperUpdate := func(kv *KV, ctx context.Context, v []byte, rev uint64) (uint64, error) {
				return kv.Update(ctx, "n1", v, rev)
			}
			variants := []struct {
				name   string
				update func(kv *KV, ctx context.Context, v []byte, rev uint64) (uint64, error)
				tp     trace.TracerProvider
			}{
				{
					name: "nats.go",
					update: func(kv *KV, ctx context.Context, v []byte, rev uint64) (uint64, error) {
						return kv.KeyValue().Update(ctx, "n1", v, rev)
					},
					tp: noop.NewTracerProvider(),
				},
				{name: "wrapper/untraced", update: wrapperUpdate, tp: noop.NewTracerProvider()},
				// Under a caller's sampled span, as the composer writes: a
				// recorded span per call and trace headers on the wire.
				{name: "wrapper/traced", update: wrapperUpdate, tp: sampled},
			}
			value := make([]byte, 4<<10) // a typical composition
			for _, v := range variants {
				b.Run(v.name, func(b *testing.B) {
					kv := ensureKV(b, js, testSpec(1), WithTracerProvider(v.tp))
					ctx, span := v.tp.Tracer("bench").Start(context.Background(), "pass")
					defer span.End()
					rev, err := kv.Create(ctx, "n1", value)
					if err != nil {
						b.Fatal(err)
					}
					b.SetBytes(int64(len(value)))
					b.ReportAllocs()
					b.ResetTimer()
					for range b.N {
						if rev, err = v.update(kv, ctx, value, rev); err != nil {
							b.Fatal(err)
						}
					}
				})
			}
		})
	}
}
