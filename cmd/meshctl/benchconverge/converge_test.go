package benchconverge

import (
	"bytes"
	"context"
	"flag"
	"os"
	"strings"
	"testing"
	"time"
)

var (
	engines   = flag.Int("converge.engines", DefaultEngines, "engines of BenchmarkConverge (1000 for the issue's target)")
	lazy      = flag.Bool("converge.lazy", false, "BenchmarkConverge with lazy JetStream sync instead of always")
	workers   = flag.Int("converge.workers", DefaultWorkers, "composer workers of BenchmarkConverge")
	breakdown = flag.Bool("converge.breakdown", false, "BenchmarkConverge prints where the change's time went")
	profile   = flag.String("converge.cpuprofile", "", "BenchmarkConverge writes the CPU profile of the change to this file")
)

// BenchmarkConverge runs `meshctl bench converge` once per iteration
// (go test -run '^$' -bench Converge -benchtime 1x
// -converge.engines 1000 [-converge.lazy]) and reports its figures.
func BenchmarkConverge(b *testing.B) {
	for b.Loop() {
		// The figures go to stdout: a benchmark's log is cut short.
		r, err := Measure(context.Background(), Options{Engines: *engines, LazySync: *lazy, Workers: *workers,
			Breakdown: *breakdown, CPUProfile: *profile}, os.Stdout)
		if err != nil {
			b.Fatal(err)
		}
		b.ReportMetric(float64(r.Percentile(50).Microseconds())/1000, "p50-ms")
		b.ReportMetric(float64(r.Percentile(99).Microseconds())/1000, "p99-ms")
		b.ReportMetric(float64(r.All().Microseconds())/1000, "all-ms")
		b.ReportMetric(float64(r.Raw.Microseconds())/1000, "raw-baseline-ms")
		b.ReportMetric(float64(r.Verify.Nanoseconds())/1000, "verify-µs")
		b.ReportMetric(float64(r.FloorWall().Microseconds())/1000, "floor-ms")
	}
}

// TestRunSmall runs the benchmark on a few engines, both syncs (the lazy
// one with two changes): every engine applies each change and every figure
// is printed.
func TestRunSmall(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a mesh")
	}
	for _, lazy := range []bool{false, true} {
		changes := 1
		if lazy {
			changes = 2
		}
		var out bytes.Buffer
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		r, err := Measure(ctx, Options{Engines: 5, LazySync: lazy, Timeout: time.Minute, Breakdown: true, Changes: changes}, &out)
		cancel()
		t.Log(out.String())
		if err != nil {
			t.Fatal(err)
		}
		if len(r.Applied) != 5 || r.Raw <= 0 || r.RawWrites != 15 || r.Verify <= 0 || r.Assigned <= 0 ||
			r.Apply <= 0 || r.Sign <= 0 || r.SigVerify <= 0 || r.Cores <= 0 || r.Floor() < 5*r.Apply {
			t.Errorf("result %+v", r)
		}
		for _, want := range []string{"p50", "p99", "100 %", "raw baseline", "verify cost", "floor", "× the floor's CPU", "composer.pass.node", "nodeengine.pass"} {
			if !strings.Contains(out.String(), want) {
				t.Errorf("the output does not say %q", want)
			}
		}
		if len(r.Changes) != changes || r.Median < 0 || r.Median >= changes || r.Changes[r.Median].P99 != r.Percentile(99) {
			t.Errorf("changes %+v, median %d; want %d, the median's p99 %s", r.Changes, r.Median, changes, r.Percentile(99))
		}
		if lazy && (!strings.Contains(out.String(), "change 2: p50") || !strings.Contains(out.String(), "the median change by p99")) {
			t.Errorf("the output of two changes does not give each change's figures and the median")
		}
	}
}
