package faults

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"mesh.dev/internal/natsx"
	"mesh.dev/tests/internal/procmesh"
)

// Iterations of each scenario: CIIterations in `make test` (and so in
// .ci/run), LongIterations with -long or MESH_LONG_TESTS=1.
const (
	CIIterations   = 3
	LongIterations = 20
)

// Environment: a seed to replay, the long form, and a file the figures of
// each scenario are appended to (one JSON line each) for RELIABILITY.md.
const (
	seedEnv   = "MESH_FAULTS_SEED"
	longEnv   = "MESH_LONG_TESTS"
	reportEnv = "MESH_FAULTS_REPORT"
)

var long = flag.Bool("long", false, "run each fault scenario "+strconv.Itoa(LongIterations)+" times ("+longEnv+"=1 does the same)")

func TestMain(m *testing.M) {
	if spec := os.Getenv(childEnv); spec != "" {
		os.Exit(runChild(spec))
	}
	os.Exit(procmesh.Main(m))
}

// run is one scenario's run: its mesh, its random source and what the
// fleet must converge on.
type run struct {
	t      *testing.T
	m      *Mesh
	rng    *rand.Rand
	expect Expect
	// converge are the times from healing to converged, one per iteration.
	converge []time.Duration
	// notes are figures a scenario adds to its report line.
	notes []string
}

// scenario runs a named fault scenario: a mesh, the example modules
// published and placed on every node, the fleet converged; then body once
// per iteration, each ending converged; then the final check of the
// invariants. body injects its fault, heals it and calls r.healed.
func scenario(t *testing.T, opts Options, body func(r *run, i int)) {
	if testing.Short() {
		t.Skip("-short: fault scenarios run the whole mesh as processes and kill them")
	}
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv(seedEnv); s != "" {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("%s=%q: %v", seedEnv, s, err)
		}
		seed = v
	}
	t.Logf("random moments drawn with %s=%d", seedEnv, seed)
	iterations := CIIterations
	if *long || os.Getenv(longEnv) == "1" {
		iterations = LongIterations
	}
	began := time.Now()
	m := Start(t, opts)
	r := &run{t: t, m: m, rng: rand.New(rand.NewPCG(seed, 0x6d657368)), expect: m.PublishAll()}
	m.PutNodes()
	m.WaitConverged("first placement", r.expect)
	t.Logf("mesh up and converged in %.1fs", time.Since(began).Seconds())
	for i := 0; i < iterations; i++ {
		body(r, i)
		if t.Failed() {
			break
		}
	}
	f := m.Rec.Final()
	for _, v := range f.Violations {
		t.Errorf("invariant violated: %s", v)
	}
	worst, sum := time.Duration(0), time.Duration(0)
	for _, d := range r.converge {
		sum += d
		worst = max(worst, d)
	}
	mean := time.Duration(0)
	if len(r.converge) > 0 {
		mean = sum / time.Duration(len(r.converge))
	}
	t.Logf("%s: %d iterations, %d violations; checked %d applied manifests, %d applied compositions, %d keysets, %d sweeps of current manifests; %d assignment and %d composition writes acknowledged; converged after healing in %s on average, %s at worst (bound %s); %s",
		t.Name(), len(r.converge), len(f.Violations), f.ManifestsApplied, f.CompositionsApplied, f.KeysetsTaken, f.CurrentChecks,
		f.AckedWrites[natsx.BucketAssignments], f.AckedWrites[natsx.BucketCompositions], mean.Round(10*time.Millisecond), worst.Round(10*time.Millisecond),
		ConvergeBound, strings.Join(r.notes, "; "))
	if path := os.Getenv(reportEnv); path != "" {
		line, _ := json.Marshal(map[string]any{
			"scenario": t.Name(), "seed": seed, "iterations": len(r.converge), "violations": len(f.Violations),
			"manifests": f.ManifestsApplied, "compositions": f.CompositionsApplied, "keysets": f.KeysetsTaken,
			"converge_mean_ms": mean.Milliseconds(), "converge_max_ms": worst.Milliseconds(), "notes": r.notes,
			"seconds": int(time.Since(began).Seconds()), "failed": t.Failed(),
		})
		if fl, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644); err == nil {
			fl.Write(append(line, '\n'))
			fl.Close()
		}
	}
}

// healed waits for the fleet to converge on r.expect after a fault was
// healed (invariant 4) and records how long it took.
func (r *run) healed(what string, nodes ...string) {
	r.t.Helper()
	d := r.m.WaitConverged(what, r.expect, nodes...)
	r.converge = append(r.converge, d)
}

// note adds a figure to the scenario's report.
func (r *run) note(format string, args ...any) {
	r.notes = append(r.notes, fmt.Sprintf(format, args...))
}

// newMotd publishes a new motd naming the scenario and iteration, and makes
// it what the fleet must converge on.
func (r *run) newMotd(i int) string {
	fp := r.m.PublishMotd(fmt.Sprintf("%s iteration %d", r.t.Name(), i))
	r.expect["motd"] = fp
	return fp
}

// pick returns one of s at random.
func pick[T any](r *run, s []T) T { return s[r.rng.IntN(len(s))] }

// between returns a duration in [lo, hi).
func (r *run) between(lo, hi time.Duration) time.Duration {
	return lo + time.Duration(r.rng.Int64N(int64(hi-lo)))
}

// onWrites calls fn (once) from a NATS subscription when the n-th write to
// a bucket's keys is published from now on; the returned func cancels it.
func (r *run) onWrites(bucket string, n int, fn func()) func() {
	var seen atomic.Int64
	var done atomic.Bool
	sub, err := r.m.nc.Subscribe("$KV."+bucket+".>", func(*nats.Msg) {
		if seen.Add(1) == int64(n) && done.CompareAndSwap(false, true) {
			fn()
		}
	})
	must(r.t, err)
	must(r.t, r.m.nc.Flush())
	return func() { _ = sub.Unsubscribe() }
}

// waitFor waits for cond, failing the test after d.
func (r *run) waitFor(what string, d time.Duration, cond func() error) {
	r.t.Helper()
	r.m.Eventually(what, d, cond)
}

// armSigner writes the signer's fault plan; it returns a func that waits
// until the fault fired and returns what it did.
func (r *run) armSigner(p faultPlan) func(d time.Duration) fired {
	wait := r.armSignerN(p)
	return func(d time.Duration) fired {
		r.t.Helper()
		return wait(1, d)
	}
}

// armSignerN is armSigner whose wait returns the n-th line (from 1) the
// fault wrote (a held call writes one when held and one when answered).
func (r *run) armSignerN(p faultPlan) func(n int, d time.Duration) fired {
	p.Arm = fmt.Sprintf("%d", time.Now().UnixNano())
	p.Fired = filepath.Join(r.m.Dir, "signer", "fired-"+p.Arm+".jsonl")
	b, err := json.Marshal(p)
	must(r.t, err)
	path := r.m.Signer.spec.Faults
	must(r.t, os.WriteFile(path+".tmp", b, 0o600))
	must(r.t, os.Rename(path+".tmp", path))
	return func(n int, d time.Duration) fired {
		r.t.Helper()
		var got fired
		r.waitFor("the signer's fault to fire", d, func() error {
			f, err := os.Open(p.Fired)
			if err != nil {
				return err
			}
			defer f.Close()
			sc := bufio.NewScanner(f)
			sc.Buffer(make([]byte, 1<<20), 1<<20)
			seen := 0
			for sc.Scan() {
				got = fired{}
				if err := json.Unmarshal(sc.Bytes(), &got); err == nil {
					if seen++; seen == n {
						return nil
					}
				}
			}
			return fmt.Errorf("%d lines in %s yet, waiting for %d", seen, p.Fired, n)
		})
		return got
	}
}

// disarmSigner clears the signer's fault plan.
func (r *run) disarmSigner() {
	must(r.t, os.WriteFile(r.m.Signer.spec.Faults, []byte("{}"), 0o600))
}

// leaseHolder returns the composer holding the lease.
func (r *run) leaseHolder() *Service {
	r.t.Helper()
	var holder *Service
	r.waitFor("a composer holds the lease", 2*time.Minute, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		kv, err := r.m.JS.KeyValue(ctx, natsx.BucketComposerLease)
		if err != nil {
			return err
		}
		e, err := kv.Get(ctx, natsx.KeyLeaseLeader)
		if err != nil {
			return err
		}
		var rec struct {
			Holder string `json:"holder"`
		}
		if err := json.Unmarshal(e.Value(), &rec); err != nil {
			return err
		}
		for _, c := range r.m.Composers {
			if c.Name == rec.Holder && c.Running() {
				holder = c
				return nil
			}
		}
		return fmt.Errorf("the lease names %q, which does not run", rec.Holder)
	})
	return holder
}

// others returns the composers but c.
func (r *run) others(c *Service) []*Service {
	return slices.DeleteFunc(slices.Clone(r.m.Composers), func(x *Service) bool { return x == c })
}
