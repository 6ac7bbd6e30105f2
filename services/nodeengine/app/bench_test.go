package app_test

import (
	"testing"
	"time"

	"mesh.dev/services/nodeengine/app"
)

// BenchmarkVerifyComposition measures the engine's verify cost per 12 KB
// composition: digest, signature, decode, node/module/fingerprint against
// the want, and lint (target ≤ 250 µs). `meshctl bench converge` prints the
// same figure from the same fixture.
func BenchmarkVerifyComposition(b *testing.B) {
	f, err := app.NewVerifyFixture()
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(f.Size()))
	b.ResetTimer()
	for b.Loop() {
		if err := f.Verify(); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	per := b.Elapsed() / time.Duration(b.N)
	b.ReportMetric(float64(per.Microseconds()), "µs/composition")
	b.Logf("verify cost per %d-byte composition: %s (target ≤ 250µs)", f.Size(), per)
}
