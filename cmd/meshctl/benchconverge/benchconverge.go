// Package benchconverge is `meshctl bench converge`: N node engines in one
// process (each with its own mTLS Sync stream and its own root on a tmpfs),
// one catalog, signer and composer on an embedded JetStream; a fleet-wide
// change to one module; and how long it takes, measured on the engines:
// from the RegisterModule call returning to each engine's apply of the new
// composition (p50, p99, time to 100 %). It prints the same run's baseline:
// the KV writes of the change's pass (its compositions, judgement records
// and assignments) written straight to JetStream with the composer's
// concurrency; and the engine's verify cost per 12 KB composition.
package benchconverge

import (
	"cmp"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"google.golang.org/protobuf/proto"

	"mesh.dev/cmd/meshctl/onebox"
	"mesh.dev/internal/identity"
	"mesh.dev/internal/names"
	"mesh.dev/internal/natsx"
	catalogv1 "mesh.dev/proto/mesh/catalog/v1"
	composerv1 "mesh.dev/proto/mesh/composer/v1"
	nodeenginev1 "mesh.dev/proto/mesh/nodeengine/v1"
	"mesh.dev/services/catalog/publish"
	nodeengineapp "mesh.dev/services/nodeengine/app"
)

// Defaults of Options.
const (
	DefaultEngines = 200
	DefaultWorkers = 64
	DefaultTimeout = 15 * time.Minute
)

// Options configure a run.
type Options struct {
	// Engines is how many node engines run (default 200).
	Engines int
	// LazySync runs the embedded JetStream with periodic fsync instead of
	// sync_interval always.
	LazySync bool
	// Workers is how many nodes the composer composes at once (default 64);
	// the raw baseline writes with as many writers.
	Workers int
	// Dir holds JetStream, keys and certificates (default a new temp dir,
	// removed at the end). It should be on the disk a real mesh would use.
	Dir string
	// NodesDir holds the engines' roots and states (default a new dir on
	// the tmpfs /dev/shm, else under Dir).
	NodesDir string
	// Timeout bounds each phase (default 15 min).
	Timeout time.Duration
	// LogOutput receives the services' logs (default discarded).
	LogOutput io.Writer
	// Breakdown prints where the change's time went: the spans every
	// service made from the registration on, by name, with their count,
	// total and mean time.
	Breakdown bool
	// CPUProfile, when set, is a file the CPU profile of the change (from
	// the registration to the last engine's apply) is written to.
	CPUProfile string
	// MemProfile, when set, is a file the allocation profile is written
	// to at the end of the change, and MemProfile+".base" one written at
	// its start: `go tool pprof -sample_index=alloc_space -diff_base
	// FILE.base FILE` shows what the change allocated.
	MemProfile string
	// Changes is how many fleet-wide changes run one after the other
	// (default 1), each to a new fingerprint of bench. The figures reported
	// are the change whose p99 is the median, beside each change's own;
	// the breakdown and the profiles cover the first.
	Changes int
}

// Result is what a run measured.
type Result struct {
	Engines  int
	LazySync bool
	// Changes are the figures of every change, in order; Median is the
	// index of the one whose p99 is the median (the lower of two), whose
	// figures Assigned, Applied, CPU and Window are.
	Changes []ChangeFigures
	Median  int
	// Placement is how long the first placement took to converge.
	Placement time.Duration
	// Assigned is when the last assignment naming the new fingerprint was
	// written, after the registration returned.
	Assigned time.Duration
	// Applied are the engines' change-to-applied times, sorted.
	Applied []time.Duration
	// Raw is the time of the change's KV writes done raw, and RawWrites
	// how many writes that was.
	Raw       time.Duration
	RawWrites int
	// CPU is the CPU time (user and system) the process used from the
	// registration to the last engine's apply: the mesh's whole cost of the
	// change, every service and engine being in this process.
	CPU time.Duration
	// Window is how long that was.
	Window time.Duration
	// Verify is the engine's verify cost per composition of VerifySize
	// bytes.
	Verify     time.Duration
	VerifySize int
	// RawCPU is the CPU the raw baseline's timed writes took (the mesh's
	// background rate just after taken out).
	RawCPU time.Duration
	// Apply is the CPU of an engine's apply of the change on its own (its
	// files written and fsynced through temp files, journal and commit),
	// Sign of one ed25519 signature as the signer makes it and SigVerify
	// of one check of it, as the engine makes of a manifest: each measured
	// alone in this run, before the mesh starts.
	Apply, Sign, SigVerify time.Duration
	// Cores is how many cores the process may use.
	Cores int
}

// ChangeFigures are one change's figures.
type ChangeFigures struct {
	P50, P99, All, Assigned, CPU, Window time.Duration
}

// Floor is the CPU time of the work a change cannot skip, each part
// measured alone in this run: every engine's apply and verification of its
// composition and manifest, two signatures per node, and the change's KV
// writes done raw. Composing, the Sync streams, the RPCs that carry the
// compositions and entries, and the engines' reports come on top.
func (r *Result) Floor() time.Duration {
	n := time.Duration(r.Engines)
	return n*(r.Apply+r.Verify+r.SigVerify) + 2*n*r.Sign + r.RawCPU
}

// FloorWall is the floor spread over every core: no change on this machine
// can reach 100 % applied sooner, nor p99 much sooner.
func (r *Result) FloorWall() time.Duration {
	return r.Floor() / time.Duration(max(1, r.Cores))
}

// Percentile returns the p-th percentile (0 < p ≤ 100) of the applied
// times (nearest rank).
func (r *Result) Percentile(p float64) time.Duration {
	if len(r.Applied) == 0 {
		return 0
	}
	i := int(float64(len(r.Applied))*p/100+0.999999) - 1
	return r.Applied[max(0, min(i, len(r.Applied)-1))]
}

// All is the time to 100 % applied.
func (r *Result) All() time.Duration { return r.Percentile(100) }

// Run runs the benchmark and prints what it measured to w.
func Run(ctx context.Context, o Options, w io.Writer) error {
	_, err := Measure(ctx, o, w)
	return err
}

// Measure runs the benchmark, prints what it measured to w and returns it.
func Measure(ctx context.Context, o Options, w io.Writer) (*Result, error) {
	// Ends the engines' and the assignments' watchers on the way out.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if o.Engines <= 0 {
		o.Engines = DefaultEngines
	}
	if o.Workers <= 0 {
		o.Workers = DefaultWorkers
	}
	if o.Timeout <= 0 {
		o.Timeout = DefaultTimeout
	}
	if o.Changes <= 0 {
		o.Changes = 1
	}
	if o.LogOutput == nil {
		o.LogOutput = io.Discard
	}
	if err := raiseFileLimit(16*o.Engines + 1024); err != nil {
		fmt.Fprintf(w, "warning: %v\n", err)
	}
	cleanup, err := dirs(&o, w)
	if err != nil {
		return nil, err
	}
	defer cleanup()
	syncWord := "always"
	if o.LazySync {
		syncWord = "lazy (periodic)"
	}
	fmt.Fprintf(w, "bench converge: %d engines, JetStream sync %s in %s, roots on %s, composer workers %d\n",
		o.Engines, syncWord, o.Dir, o.NodesDir, o.Workers)

	res := &Result{Engines: o.Engines, LazySync: o.LazySync}
	verify, size, err := nodeengineapp.VerifyCost(2000, 300*time.Millisecond)
	if err != nil {
		return nil, fmt.Errorf("verify cost: %w", err)
	}
	res.Verify, res.VerifySize = verify, size
	if err := measureFloor(res, o.NodesDir); err != nil {
		return nil, err
	}

	var spans *spanTotals
	var exporter sdktrace.SpanExporter
	if o.Breakdown {
		spans = &spanTotals{byName: map[string]*spanTotal{}}
		exporter = spans
	}
	start := time.Now()
	m, err := onebox.Start(ctx, onebox.Options{
		DataDir: o.Dir, NodesDir: o.NodesDir, Nodes: o.Engines, LogOutput: o.LogOutput, LazySync: o.LazySync,
		DriftInterval: 24 * time.Hour, ComposerWorkers: o.Workers, SpanExporter: exporter,
	})
	if err != nil {
		return nil, err
	}
	defer m.Stop()
	fmt.Fprintf(w, "mesh started in %s\n", time.Since(start).Round(time.Millisecond))

	b, err := newBench(ctx, m, o)
	if err != nil {
		return nil, err
	}
	defer b.close()

	// The first placement: every node runs bench and base.
	fp0, err := b.publish(ctx, 0, true)
	if err != nil {
		return nil, err
	}
	if _, err := b.publishBase(ctx); err != nil {
		return nil, err
	}
	start = time.Now()
	watch := b.watch(ctx, fp0)
	if err := b.putNodes(ctx); err != nil {
		return nil, err
	}
	if _, err := waitAll(ctx, watch, start, o.Timeout); err != nil {
		return nil, fmt.Errorf("first placement: %w", err)
	}
	res.Placement = time.Since(start)
	fmt.Fprintf(w, "first placement converged on %d engines in %s\n", o.Engines, res.Placement.Round(time.Millisecond))

	// The changes: each a new fingerprint of bench, registered fleet-wide.
	type change struct {
		figures ChangeFigures
		applied []time.Duration
	}
	var changes []change
	fp := fp0
	for i := 1; i <= o.Changes; i++ {
		first := i == 1
		if i == 2 {
			// The breakdown covers the spans that start before the next
			// change begins: the first change's, and what its engines'
			// reports called for by then.
			spans.until(time.Now())
		}
		from := fp
		if fp, err = b.publish(ctx, i, false); err != nil {
			return nil, err
		}
		watch = b.watch(ctx, fp)
		assigned := b.watchAssignments(ctx, fp)
		if first && o.CPUProfile != "" {
			f, err := os.Create(o.CPUProfile)
			if err != nil {
				return nil, err
			}
			if err := pprof.StartCPUProfile(f); err != nil {
				f.Close()
				return nil, err
			}
			defer func() {
				pprof.StopCPUProfile()
				f.Close()
			}()
		}
		if first && o.MemProfile != "" {
			if err := writeAllocs(o.MemProfile + ".base"); err != nil {
				return nil, err
			}
		}
		cpu0 := cpuTime()
		reg := time.Now()
		if first {
			spans.from(reg)
		}
		if _, err := b.catalog.RegisterModule(ctx, &catalogv1.RegisterModuleRequest{Module: "bench", Fingerprint: fp}); err != nil {
			return nil, fmt.Errorf("register bench: %w", err)
		}
		t0 := time.Now()
		fmt.Fprintf(w, "change: bench %s -> %s (RegisterModule took %s)\n", short(from), short(fp), t0.Sub(reg).Round(time.Microsecond))
		applied, err := waitAll(ctx, watch, t0, o.Timeout)
		if err != nil {
			return nil, fmt.Errorf("change %d: %w", i, err)
		}
		c := change{applied: applied}
		c.figures.CPU, c.figures.Window = cpuTime()-cpu0, time.Since(reg)
		if first {
			if o.CPUProfile != "" {
				pprof.StopCPUProfile()
			}
			if o.MemProfile != "" {
				if err := writeAllocs(o.MemProfile); err != nil {
					return nil, err
				}
				fmt.Fprintf(w, "allocations of the change: go tool pprof -sample_index=alloc_space -diff_base %s.base %s\n", o.MemProfile, o.MemProfile)
			}
		}
		// Every engine applied: every assignment is written, and seen soon.
		if at, err := assigned.wait(min(o.Timeout, 30*time.Second)); err == nil {
			c.figures.Assigned = at.Sub(t0)
		}
		one := &Result{Applied: applied}
		c.figures.P50, c.figures.P99, c.figures.All = one.Percentile(50), one.Percentile(99), one.All()
		changes = append(changes, c)
	}
	order := make([]int, len(changes))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int { return cmp.Compare(changes[a].figures.P99, changes[b].figures.P99) })
	res.Median = order[(len(order)-1)/2]
	for _, c := range changes {
		res.Changes = append(res.Changes, c.figures)
	}
	med := changes[res.Median]
	res.Applied, res.Assigned, res.CPU, res.Window = med.applied, med.figures.Assigned, med.figures.CPU, med.figures.Window

	// The raw baseline: the change's writes again, straight to JetStream.
	raw, n, rawCPU, err := b.rawBaseline(ctx, fp)
	if err != nil {
		return nil, fmt.Errorf("raw baseline: %w", err)
	}
	res.Raw, res.RawWrites, res.RawCPU = raw, n, rawCPU
	report(w, res, o)
	// Stopping flushes the spans still batched.
	m.Stop()
	if spans != nil {
		spans.print(w, 25)
	}
	if err := m.Err(); err != nil {
		return res, fmt.Errorf("the mesh's services failed: %w", err)
	}
	return res, nil
}

// writeAllocs writes the heap profile (allocations since the start,
// cumulative) to path, after a collection so that it is complete up to
// now (a profile is as of the last completed one).
func writeAllocs(path string) error {
	runtime.GC()
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := pprof.Lookup("allocs").WriteTo(f, 0); err != nil {
		f.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	return f.Close()
}

// spanTotals sums the spans that start from a moment on, by name.
type spanTotals struct {
	mu     sync.Mutex
	since  time.Time
	before time.Time
	byName map[string]*spanTotal
}

type spanTotal struct {
	n          int
	total, max time.Duration
}

// from leaves out the spans that start before t, and until those that
// start after t.
func (s *spanTotals) from(t time.Time) {
	if s != nil {
		s.set(&s.since, t)
	}
}

func (s *spanTotals) until(t time.Time) {
	if s != nil {
		s.set(&s.before, t)
	}
}

func (s *spanTotals) set(bound *time.Time, t time.Time) {
	s.mu.Lock()
	*bound = t
	s.mu.Unlock()
}

// ExportSpans implements sdktrace.SpanExporter.
func (s *spanTotals) ExportSpans(_ context.Context, spans []sdktrace.ReadOnlySpan) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, sp := range spans {
		if s.since.IsZero() || sp.StartTime().Before(s.since) || (!s.before.IsZero() && sp.StartTime().After(s.before)) {
			continue
		}
		t := s.byName[sp.Name()]
		if t == nil {
			t = &spanTotal{}
			s.byName[sp.Name()] = t
		}
		d := sp.EndTime().Sub(sp.StartTime())
		t.n++
		t.total += d
		t.max = max(t.max, d)
	}
	return nil
}

// Shutdown implements sdktrace.SpanExporter.
func (s *spanTotals) Shutdown(context.Context) error { return nil }

func (s *spanTotals) print(w io.Writer, top int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	names := make([]string, 0, len(s.byName))
	for n := range s.byName {
		names = append(names, n)
	}
	slices.SortFunc(names, func(a, b string) int { return int(s.byName[b].total - s.byName[a].total) })
	fmt.Fprintf(w, "where the change's time went (spans started after the registration, by total time; streams stay open):\n")
	for _, n := range names[:min(top, len(names))] {
		t := s.byName[n]
		fmt.Fprintf(w, "  %-52s %6d × mean %9s  max %9s  total %9s\n", n, t.n,
			(t.total / time.Duration(t.n)).Round(time.Microsecond), t.max.Round(time.Microsecond), t.total.Round(time.Millisecond))
	}
}

func report(w io.Writer, r *Result, o Options) {
	ms := func(d time.Duration) string { return fmt.Sprintf("%.1f ms", float64(d.Microseconds())/1000) }
	if len(r.Changes) > 1 {
		for i, c := range r.Changes {
			fmt.Fprintf(w, "  change %d: p50 %s  p99 %s  100 %% %s  last assignment %s  CPU %.2f s in %.2f s\n",
				i+1, ms(c.P50), ms(c.P99), ms(c.All), ms(c.Assigned), c.CPU.Seconds(), c.Window.Seconds())
		}
		fmt.Fprintf(w, "the median change by p99, change %d of %d:\n", r.Median+1, len(r.Changes))
	}
	fmt.Fprintf(w, "  composer: last assignment naming it written %s after the registration\n", ms(r.Assigned))
	fmt.Fprintf(w, "  change-to-applied on the engines: p50 %s  p99 %s  100 %% %s\n", ms(r.Percentile(50)), ms(r.Percentile(99)), ms(r.All()))
	if r.Window > 0 {
		fmt.Fprintf(w, "  CPU used by the whole mesh for the change: %.2f s in %.2f s (%.0f %% of one core; %.2f ms per engine)\n",
			r.CPU.Seconds(), r.Window.Seconds(), 100*r.CPU.Seconds()/r.Window.Seconds(), float64(r.CPU.Microseconds())/1000/float64(max(r.Engines, 1)))
	}
	fmt.Fprintf(w, "raw baseline (same run): the change's %d KV writes (compositions, judgement records, assignments of %d nodes) with %d writers: %s\n",
		r.RawWrites, r.Engines, o.Workers, ms(r.Raw))
	if r.Raw > 0 {
		fmt.Fprintf(w, "  p99 = %.2f× the baseline, 100 %% = %.2f× the baseline\n", float64(r.Percentile(99))/float64(r.Raw), float64(r.All())/float64(r.Raw))
	}
	fmt.Fprintf(w, "engine verify cost per %d-byte composition: %s\n", r.VerifySize, r.Verify.Round(100*time.Nanosecond))
	if r.Apply > 0 {
		us := func(d time.Duration) string { return fmt.Sprintf("%.0f µs", float64(d.Nanoseconds())/1000) }
		fmt.Fprintf(w, "floor (same run, the CPU of each part alone): per engine its apply %s (%d files: temp, fsync, rename; journal, commit) and verify %s + manifest signature %s; per node 2 signatures of %s; the raw KV writes %.2f CPU-s\n",
			us(r.Apply), benchFiles, us(r.Verify), us(r.SigVerify), us(r.Sign), r.RawCPU.Seconds())
		fmt.Fprintf(w, "  = %.2f CPU-s, %s on %d cores before composing, Sync, RPCs or reports: the change cannot be applied everywhere sooner here\n",
			r.Floor().Seconds(), ms(r.FloorWall()), r.Cores)
		if r.CPU > 0 {
			fmt.Fprintf(w, "  the mesh used %.1f× the floor's CPU\n", r.CPU.Seconds()/r.Floor().Seconds())
		}
	}
	target := "p99 and 100 % each ≤ 2× the raw baseline"
	if r.LazySync {
		target = "p99 ≤ 500 ms"
	}
	fmt.Fprintf(w, "targets at 1,000 engines: %s; verify ≤ 250 µs\n", target)
}

// dirs makes the data and nodes dirs the options leave unset.
func dirs(o *Options, w io.Writer) (func(), error) {
	var remove []string
	cleanup := func() {
		for _, d := range remove {
			os.RemoveAll(d)
		}
	}
	if o.Dir == "" {
		d, err := os.MkdirTemp("", "mesh-bench-converge-")
		if err != nil {
			return nil, err
		}
		o.Dir = d
		remove = append(remove, d)
	}
	if o.NodesDir == "" {
		if isTmpfs("/dev/shm") {
			d, err := os.MkdirTemp("/dev/shm", "mesh-bench-nodes-")
			if err != nil {
				cleanup()
				return nil, err
			}
			o.NodesDir = d
			remove = append(remove, d)
		} else {
			fmt.Fprintln(w, "warning: /dev/shm is not a tmpfs: the engines' roots go under the data dir")
			o.NodesDir = filepath.Join(o.Dir, "nodes")
		}
	} else if !isTmpfs(o.NodesDir) {
		fmt.Fprintf(w, "warning: %s is not on a tmpfs\n", o.NodesDir)
	}
	return cleanup, nil
}

// cpuTime is the CPU time (user and system) this process used so far.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// tmpfsMagic is the f_type of a tmpfs (linux/magic.h).
const tmpfsMagic = 0x01021994

func isTmpfs(dir string) bool {
	var st syscall.Statfs_t
	return syscall.Statfs(dir, &st) == nil && st.Type == tmpfsMagic
}

// raiseFileLimit raises the soft limit of open files to at least n (up to
// the hard limit): each engine holds a state file, a root per prefix and
// its connections.
func raiseFileLimit(n int) error {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return err
	}
	if lim.Cur >= uint64(n) {
		return nil
	}
	lim.Cur = min(uint64(n), lim.Max)
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return fmt.Errorf("raise the open files limit to %d: %w", n, err)
	}
	if lim.Cur < uint64(n) {
		return fmt.Errorf("open files limited to %d (hard limit), %d wanted", lim.Cur, n)
	}
	return nil
}

// bench holds the clients and files of a run.
type bench struct {
	m        *onebox.Mesh
	o        Options
	catalog  catalogv1.CatalogServiceClient
	composer composerv1.ComposerServiceClient
	closers  []func()
	modules  string
}

func newBench(ctx context.Context, m *onebox.Mesh, o Options) (*bench, error) {
	b := &bench{m: m, o: o, modules: filepath.Join(o.Dir, "modules")}
	cc, err := m.Dial(m.Catalog, identity.RoleBuilder, "ci")
	if err != nil {
		return nil, err
	}
	b.closers = append(b.closers, func() { cc.Close() })
	b.catalog = catalogv1.NewCatalogServiceClient(cc)
	oc, err := m.Dial(m.Composer, identity.RoleOperator, "admin")
	if err != nil {
		b.close()
		return nil, err
	}
	b.closers = append(b.closers, func() { oc.Close() })
	b.composer = composerv1.NewComposerServiceClient(oc)
	return b, nil
}

func (b *bench) close() {
	for _, c := range b.closers {
		c()
	}
}

// benchFiles is how many files the bench module declares: 24 of 480 bytes,
// a composition of about 12 KB.
const benchFiles = 24

// writeModule writes a module directory: files of 480 bytes, the first one
// a template naming the node (so every node's composition differs, as in a
// real fleet), the rest raw bytes that change with gen.
func (b *bench) writeModule(module string, files, gen int) (string, error) {
	dir := filepath.Join(b.modules, module)
	os.RemoveAll(dir)
	if err := os.MkdirAll(filepath.Join(dir, "files"), 0o755); err != nil {
		return "", err
	}
	var y strings.Builder
	fmt.Fprintf(&y, "module: %s\nversion: 1.0.%d\nupgrade:\n  policy: AUTO\nresources:\n", module, gen)
	fmt.Fprintf(&y, "  - {name: dir, type: directory, path: /etc/%s, mode: \"0755\", owner: root, group: root}\n", module)
	for i := 0; i < files; i++ {
		body := fmt.Sprintf("# %s generation %d file %d\n", module, gen, i)
		render := "false"
		if i == 0 {
			body += "node: {{ .Node }}\n"
			render = "true"
		}
		body += strings.Repeat(fmt.Sprintf("%s-%d-%d ", module, gen, i), 480)[:480-len(body)-1] + "\n"
		name := fmt.Sprintf("f%02d", i)
		if err := os.WriteFile(filepath.Join(dir, "files", name), []byte(body), 0o644); err != nil {
			return "", err
		}
		fmt.Fprintf(&y, "  - {name: %s, type: file, path: /etc/%s/%s.conf, mode: \"0644\", owner: root, group: root, source: files/%s, render: %s}\n",
			name, module, name, name, render)
	}
	if err := os.WriteFile(filepath.Join(dir, "module.yaml"), []byte(y.String()), 0o644); err != nil {
		return "", err
	}
	return dir, nil
}

// publish publishes generation gen of bench (registering it when asked)
// and returns its fingerprint.
func (b *bench) publish(ctx context.Context, gen int, register bool) (string, error) {
	dir, err := b.writeModule("bench", benchFiles, gen)
	if err != nil {
		return "", err
	}
	res, err := publish.Dir(ctx, b.catalog, dir, publish.Options{NoGit: true, Repository: "file:///mesh-bench", Path: "bench", NoRegister: !register})
	if err != nil {
		return "", err
	}
	return res.Fingerprint, nil
}

// publishBase publishes base, a module every node runs that the change
// leaves as it is.
func (b *bench) publishBase(ctx context.Context) (string, error) {
	dir, err := b.writeModule("base", 4, 0)
	if err != nil {
		return "", err
	}
	res, err := publish.Dir(ctx, b.catalog, dir, publish.Options{NoGit: true, Repository: "file:///mesh-bench", Path: "base"})
	if err != nil {
		return "", err
	}
	return res.Fingerprint, nil
}

// putNodes puts every engine's spec: bench and base, no params.
func (b *bench) putNodes(ctx context.Context) error {
	errc := make(chan error, len(b.m.Engines))
	sem := make(chan struct{}, 16)
	for _, e := range b.m.Engines {
		sem <- struct{}{}
		go func() {
			defer func() { <-sem }()
			spec := &composerv1.NodeSpec{Node: e.Node, Labels: map[string]string{"bench": "converge"},
				Modules: []*composerv1.PlacedModule{{Module: "base"}, {Module: "bench"}}}
			_, err := b.composer.PutNode(ctx, &composerv1.PutNodeRequest{Spec: spec})
			errc <- err
		}()
	}
	var errs []error
	for range b.m.Engines {
		if err := <-errc; err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// applied is one engine's apply of a fingerprint of bench.
type applied struct {
	node string
	at   time.Time
}

// watch waits, on every engine, for bench applied at fp with nothing
// pending, and sends when each did. The engine reports through Changed
// right after it commits an apply; reading Status then is cheap next to
// the apply.
func (b *bench) watch(ctx context.Context, fp string) <-chan applied {
	out := make(chan applied, len(b.m.Engines))
	for _, e := range b.m.Engines {
		go func() {
			for {
				ch := e.Changed()
				if done(e.Status(), fp) {
					out <- applied{node: e.Node, at: time.Now()}
					return
				}
				select {
				case <-ctx.Done():
					return
				case <-ch:
				}
			}
		}()
	}
	return out
}

// done reports whether an engine applied bench at fp, and every want.
func done(s *nodeenginev1.GetStatusResponse, fp string) bool {
	if s.GetApplied() == nil || s.GetPending() != nil {
		return false
	}
	found := false
	for _, w := range s.GetWants() {
		var have *composerv1.Have
		for _, h := range s.GetHaves() {
			if h.GetModule() == w.GetModule() {
				have = h
			}
		}
		if have.GetApplied().GetDigest() != w.GetCompositionDigest() {
			return false
		}
		if w.GetModule() == "bench" && w.GetFingerprint() == fp {
			found = true
		}
	}
	return found
}

// waitAll collects every engine's apply and returns the times since t0,
// sorted.
func waitAll(ctx context.Context, c <-chan applied, t0 time.Time, timeout time.Duration) ([]time.Duration, error) {
	var out []time.Duration
	total := cap(c)
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for len(out) < total {
		select {
		case a := <-c:
			out = append(out, a.at.Sub(t0))
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-deadline.C:
			return nil, fmt.Errorf("%d of %d engines applied within %s", len(out), total, timeout)
		}
	}
	slices.Sort(out)
	return out, nil
}

// assignmentsWatch tells when the last assignment naming a fingerprint of
// bench was written.
type assignmentsWatch struct {
	done chan time.Time
}

func (a *assignmentsWatch) wait(timeout time.Duration) (time.Time, error) {
	select {
	case t := <-a.done:
		return t, nil
	case <-time.After(timeout):
		return time.Time{}, errors.New("not every assignment names the fingerprint")
	}
}

func (b *bench) watchAssignments(ctx context.Context, fp string) *assignmentsWatch {
	a := &assignmentsWatch{done: make(chan time.Time, 1)}
	kv, err := b.m.JetStream.KeyValue(ctx, natsx.BucketAssignments)
	if err != nil {
		return a
	}
	watch, err := kv.WatchAll(ctx, jetstream.UpdatesOnly())
	if err != nil {
		return a
	}
	go func() {
		defer watch.Stop()
		seen := map[string]bool{}
		for {
			select {
			case <-ctx.Done():
				return
			case e, ok := <-watch.Updates():
				if !ok {
					return
				}
				if e == nil {
					continue
				}
				as := &composerv1.Assignment{}
				if proto.Unmarshal(e.Value(), as) != nil {
					continue
				}
				for _, w := range as.GetWants() {
					if w.GetModule() == "bench" && w.GetFingerprint() == fp {
						seen[e.Key()] = true
					}
				}
				if len(seen) == len(b.m.Engines) {
					a.done <- time.Now()
					return
				}
			}
		}
	}()
	return a
}

// rawBaseline writes the change's compositions, judgement records and
// assignments again, byte for byte, to scratch buckets made like theirs,
// with as many writers as the composer has workers: per node a create of
// the composition, a create of its record and an update of the assignment
// (the keys exist before, as the assignments did), as the pass does.
func (b *bench) rawBaseline(ctx context.Context, fp string) (time.Duration, int, time.Duration, error) {
	js := b.m.JetStream
	read := func(bucket string) (*natsx.KV, error) { return natsx.OpenKV(ctx, js, bucket) }
	comps, err := read(natsx.BucketCompositions)
	if err != nil {
		return 0, 0, 0, err
	}
	records, err := read(natsx.BucketComposed)
	if err != nil {
		return 0, 0, 0, err
	}
	assigns, err := read(natsx.BucketAssignments)
	if err != nil {
		return 0, 0, 0, err
	}
	type writes struct {
		key                string
		comp, rec, assign  []byte
		node               string
		assignmentRevision uint64
	}
	var all []writes
	for _, e := range b.m.Engines {
		key, err := names.CompositionKey(e.Node, "bench", fp)
		if err != nil {
			return 0, 0, 0, err
		}
		c, err := comps.Get(ctx, key)
		if err != nil {
			return 0, 0, 0, fmt.Errorf("composition %s: %w", key, err)
		}
		r, err := records.Get(ctx, key)
		if err != nil {
			return 0, 0, 0, fmt.Errorf("record %s: %w", key, err)
		}
		a, err := assigns.Get(ctx, e.Node)
		if err != nil {
			return 0, 0, 0, fmt.Errorf("assignment %s: %w", e.Node, err)
		}
		all = append(all, writes{key: key, comp: c.Value, rec: r.Value, assign: a.Value, node: e.Node})
	}
	scratch := map[string]*natsx.KV{}
	for _, spec := range natsx.Buckets(1) {
		switch spec.Bucket {
		case natsx.BucketCompositions, natsx.BucketComposed, natsx.BucketAssignments:
			name := spec.Bucket
			spec.Bucket = "bench-raw-" + name
			kv, err := natsx.EnsureKV(ctx, js, spec)
			if err != nil {
				return 0, 0, 0, err
			}
			scratch[name] = kv
			defer js.DeleteStream(context.WithoutCancel(ctx), "KV_"+spec.Bucket)
		}
	}
	// The assignments exist before the pass: put them first, untimed.
	for i := range all {
		rev, err := scratch[natsx.BucketAssignments].Create(ctx, all[i].node, all[i].assign)
		if err != nil {
			return 0, 0, 0, err
		}
		all[i].assignmentRevision = rev
	}
	work := make(chan writes)
	errc := make(chan error, b.o.Workers)
	var wg sync.WaitGroup
	cpu0 := cpuTime()
	start := time.Now()
	for range b.o.Workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for wr := range work {
				if _, err := scratch[natsx.BucketCompositions].Create(ctx, wr.key, wr.comp); err != nil {
					errc <- err
					return
				}
				if _, err := scratch[natsx.BucketComposed].Create(ctx, wr.key, wr.rec); err != nil {
					errc <- err
					return
				}
				if _, err := scratch[natsx.BucketAssignments].Update(ctx, wr.node, wr.assign, wr.assignmentRevision); err != nil {
					errc <- err
					return
				}
			}
		}()
	}
	var werr error
feed:
	for _, wr := range all {
		select {
		case work <- wr:
		case werr = <-errc:
			break feed
		}
	}
	close(work)
	wg.Wait()
	took := time.Since(start)
	cpu := cpuTime() - cpu0
	// The mesh may still be busy with the change's follow-ups: its rate
	// of CPU just after is taken out of the writes' CPU (measured after,
	// so that the writes start when they always did).
	idle0, idleAt := cpuTime(), time.Now()
	time.Sleep(300 * time.Millisecond)
	background := float64(cpuTime()-idle0) / float64(time.Since(idleAt))
	cpu = max(0, cpu-time.Duration(background*float64(took)))
	if werr == nil {
		select {
		case werr = <-errc:
		default:
		}
	}
	return took, 3 * len(all), cpu, werr
}

func short(fp string) string {
	if h := names.FingerprintHex(fp); len(h) >= 12 {
		return h[:12]
	}
	return fp
}

// measureFloor measures, before the mesh starts, the parts of the floor an
// engine or the signer does on its own: an apply of the change on the
// engines' filesystem and the ed25519 signing and checking of the 48
// bytes a signature covers ("mesh.<type>.v1\x00" and a SHA-256).
func measureFloor(res *Result, nodesDir string) error {
	res.Cores = runtime.GOMAXPROCS(0)
	next, done, err := nodeengineapp.ChangeApplies(nodesDir, benchFiles)
	if err != nil {
		return fmt.Errorf("apply cost: %w", err)
	}
	var applyErr error
	res.Apply = timePer(200, 300*time.Millisecond, func() {
		if applyErr == nil {
			applyErr = next()
		}
	})
	done()
	if applyErr != nil {
		return fmt.Errorf("apply cost: %w", applyErr)
	}
	_, key, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return err
	}
	msg := sha256.Sum256([]byte("a composition"))
	signed := append([]byte("mesh.composition.v1\x00"), msg[:]...)
	sig := ed25519.Sign(key, signed)
	pub := key.Public().(ed25519.PublicKey)
	res.Sign = timePer(2000, 200*time.Millisecond, func() { ed25519.Sign(key, signed) })
	res.SigVerify = timePer(2000, 200*time.Millisecond, func() {
		if !ed25519.Verify(pub, signed, sig) {
			panic("a signature made here does not verify")
		}
	})
	return nil
}

// timePer returns the mean CPU time (of the process: nothing else runs
// yet) of fn over at least n calls and at least d.
func timePer(n int, d time.Duration, fn func()) time.Duration {
	cpu0, start := cpuTime(), time.Now()
	calls := 0
	for calls < n || time.Since(start) < d {
		fn()
		calls++
	}
	return (cpuTime() - cpu0) / time.Duration(calls)
}
