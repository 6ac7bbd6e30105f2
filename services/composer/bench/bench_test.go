package bench_test

import (
	"context"
	"os"
	"testing"

	"mesh.dev/services/composer/bench"
)

// TestSmall runs the benchmark at a small size: every node committed, the
// message set read back and written raw, and a second pass that writes
// nothing. It asserts no speed (tests never do).
func TestSmall(t *testing.T) {
	t.Parallel()
	res, err := bench.Run(context.Background(), bench.Config{Nodes: 12, Modules: 3, Workers: 4, Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	if res.Compositions != 12*4 || res.Messages != 12*(4+4+1) {
		t.Errorf("compositions %d, messages %d", res.Compositions, res.Messages)
	}
	if res.SecondWrites != 0 {
		t.Errorf("the second pass wrote %d messages", res.SecondWrites)
	}
	res.Report(testWriter{t})
}

// BenchmarkCompose is `meshctl bench compose` at its default size (1,000 ×
// 20); it reports compositions/s of the first pass and of the raw writes.
func BenchmarkCompose(b *testing.B) {
	for range b.N {
		res, err := bench.Run(context.Background(), bench.Config{Dir: b.TempDir(), Progress: os.Stderr})
		if err != nil {
			b.Fatal(err)
		}
		res.Report(os.Stdout)
		b.ReportMetric(res.FirstRate(), "compositions/s")
		b.ReportMetric(res.RawRate(), "raw-compositions/s")
		b.ReportMetric(res.FirstRate()/res.RawRate(), "ratio")
		b.ReportMetric(res.Second.Seconds()/res.First.Seconds(), "second/first")
	}
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(b []byte) (int, error) {
	w.t.Log(string(b))
	return len(b), nil
}
