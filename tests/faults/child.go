package faults

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"mesh.dev/internal/config"
	signerv1 "mesh.dev/proto/mesh/signer/v1"
	catalogapp "mesh.dev/services/catalog/app"
	composerapp "mesh.dev/services/composer/app"
	nodeengineapp "mesh.dev/services/nodeengine/app"
	signerapp "mesh.dev/services/signer/app"
)

// The services run as children: this test binary, re-executed with
// childEnv naming a spec file, runs one service from its YAML configuration
// (exactly the file its binary reads) until SIGTERM stops it or the harness
// kills it. Running the test binary rather than the built binaries lets a
// child take options a binary has no flag for: an engine's clock skew and
// the record of everything it commits, the signer's fault interceptor.
const childEnv = "MESH_FAULTS_CHILD"

// Roles of a child.
const (
	roleCatalog  = "catalog"
	roleSigner   = "signer"
	roleComposer = "composer"
	roleEngine   = "engine"
)

// childSpec is what a child runs.
type childSpec struct {
	Role string `json:"role"`
	// Config is the service's YAML configuration file.
	Config string `json:"config"`
	// Ready is written (atomically) with the gRPC address once it serves.
	Ready string `json:"ready"`
	// ClockOffset skews an engine's clock.
	ClockOffset time.Duration `json:"clock_offset,omitempty"`
	// Commits is where an engine appends each durable commit (one JSON
	// line, fsynced).
	Commits string `json:"commits,omitempty"`
	// Faults is the signer's fault plan, read at every sign call, or an
	// engine's (an engineFault), read after every op of an apply.
	Faults string `json:"faults,omitempty"`
	// OpenOnly, set for an engine, only opens it (which finishes or rolls
	// back a journal a kill left, and nothing else: no pass, no stream),
	// writes its status as it stands then to this file (protojson) and
	// closes it.
	OpenOnly string `json:"open_only,omitempty"`
	// SmallWindows dials an engine's connections with grpc-go's smallest
	// HTTP/2 windows (64 KiB, fixed: no BDP growth) instead of mesh's.
	SmallWindows bool `json:"small_windows,omitempty"`
}

// runChild runs the service a spec names; it returns the exit code.
func runChild(specFile string) int {
	var spec childSpec
	b, err := os.ReadFile(specFile)
	if err == nil {
		err = json.Unmarshal(b, &spec)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "child spec:", err)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	log := slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo})).With("service", spec.Role)
	ready := func(a net.Addr) {
		tmp := spec.Ready + ".tmp"
		if err := os.WriteFile(tmp, []byte(a.String()), 0o600); err == nil {
			_ = os.Rename(tmp, spec.Ready)
		}
	}
	err = runRole(ctx, spec, log, ready)
	if err != nil && ctx.Err() == nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		return 1
	}
	return 0
}

func runRole(ctx context.Context, spec childSpec, log *slog.Logger, ready func(net.Addr)) error {
	switch spec.Role {
	case roleCatalog:
		var cfg catalogapp.Config
		if err := config.Load(spec.Config, &cfg); err != nil {
			return err
		}
		c, err := catalogapp.New(ctx, cfg, catalogapp.Options{Logger: log})
		if err != nil {
			return err
		}
		defer c.Close()
		return c.Serve(ctx, ready)
	case roleSigner:
		var cfg signerapp.Config
		if err := config.Load(spec.Config, &cfg); err != nil {
			return err
		}
		s, err := signerapp.New(ctx, cfg, signerapp.Options{Logger: log,
			ServerOptions: []grpc.ServerOption{grpc.ChainUnaryInterceptor((&signerFaults{path: spec.Faults, log: log}).intercept)}})
		if err != nil {
			return err
		}
		defer s.Close()
		return s.Serve(ctx, ready)
	case roleComposer:
		var cfg composerapp.Config
		if err := config.Load(spec.Config, &cfg); err != nil {
			return err
		}
		c, err := composerapp.New(ctx, cfg, composerapp.Options{Logger: log})
		if err != nil {
			return err
		}
		defer c.Close()
		return c.Serve(ctx, ready)
	case roleEngine:
		var cfg nodeengineapp.Config
		if err := config.Load(spec.Config, &cfg); err != nil {
			return err
		}
		commits, err := openCommitLog(spec.Commits)
		if err != nil {
			return err
		}
		defer commits.close()
		offset := spec.ClockOffset
		var dial []grpc.DialOption
		if spec.SmallWindows {
			dial = append(dial, grpc.WithInitialWindowSize(smallWindow), grpc.WithInitialConnWindowSize(smallWindow))
		}
		ef := &engineFaults{path: spec.Faults, log: log}
		opts := nodeengineapp.Options{Logger: log,
			AfterApplyOp:     ef.afterOp,
			DialOptions:      dial,
			Now:              func() time.Time { return time.Now().Add(offset) },
			OnCommit:         commits.add,
			EntryBackoffBase: 100 * time.Millisecond, SyncBackoffBase: 100 * time.Millisecond, SyncBackoffMax: time.Second,
			Ready: ready,
		}
		if spec.OpenOnly != "" {
			return openOnly(ctx, cfg, opts, spec.OpenOnly)
		}
		return nodeengineapp.Run(ctx, cfg, opts)
	}
	return fmt.Errorf("unknown role %q", spec.Role)
}

// commitRecord is one line of an engine's commit log.
type commitRecord struct {
	// At is the machine's clock (not the engine's skewed one).
	At           time.Time         `json:"at"`
	Manifest     []byte            `json:"manifest,omitempty"`
	Compositions map[string][]byte `json:"compositions,omitempty"`
	Drop         []string          `json:"drop,omitempty"`
	Keyset       []byte            `json:"keyset,omitempty"`
}

// commitLog appends commit records to a file, each fsynced before the
// engine goes on: a record is never lost to a kill that comes after the
// commit it records.
type commitLog struct {
	mu sync.Mutex
	f  *os.File
}

func openCommitLog(path string) (*commitLog, error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, fmt.Errorf("commit log: %w", err)
	}
	return &commitLog{f: f}, nil
}

func (l *commitLog) add(c nodeengineapp.Committed) {
	rec := commitRecord{At: time.Now().UTC(), Drop: c.Drop}
	marshal := func(m proto.Message) []byte {
		b, err := proto.Marshal(m)
		if err != nil {
			panic(fmt.Sprintf("commit log: %v", err))
		}
		return b
	}
	if c.Manifest != nil {
		rec.Manifest = marshal(c.Manifest)
	}
	if c.Keyset != nil {
		rec.Keyset = marshal(c.Keyset)
	}
	if len(c.Compositions) > 0 {
		rec.Compositions = map[string][]byte{}
		for m, env := range c.Compositions {
			rec.Compositions[m] = marshal(env)
		}
	}
	b, err := json.Marshal(rec)
	if err != nil {
		panic(fmt.Sprintf("commit log: %v", err))
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, err := l.f.Write(append(b, '\n')); err != nil {
		panic(fmt.Sprintf("commit log: %v", err))
	}
	if err := l.f.Sync(); err != nil {
		panic(fmt.Sprintf("commit log: %v", err))
	}
}

func (l *commitLog) close() { l.f.Close() }

// openOnly opens an engine, writes its status to path and closes it.
func openOnly(ctx context.Context, cfg nodeengineapp.Config, opts nodeengineapp.Options, path string) error {
	a, err := nodeengineapp.New(ctx, cfg, opts)
	if err != nil {
		return err
	}
	defer a.Close()
	b, err := protojson.Marshal(a.Engine.Status())
	if err != nil {
		return err
	}
	if err := os.WriteFile(path+".tmp", b, 0o600); err != nil {
		return err
	}
	return os.Rename(path+".tmp", path)
}

// engineFault is an engine's fault plan: the engine kills itself (SIGKILL)
// after op 1+(AfterOps-1)%ops of the first apply it runs once the plan is
// written — between two ops, or after the last one and before the commit:
// some or all of the change is on disk, the journal says what is left, and
// the applied state is not yet moved. It fires once: not again once Fired
// exists (the restarted engine's replay runs the same journal).
type engineFault struct {
	AfterOps int    `json:"after_ops"`
	Fired    string `json:"fired"`
}

type engineFaults struct {
	path string
	log  *slog.Logger
}

func (f *engineFaults) afterOp(done, total int) {
	if f.path == "" || total < 1 {
		return
	}
	var p engineFault
	b, err := os.ReadFile(f.path)
	if err != nil || json.Unmarshal(b, &p) != nil || p.AfterOps <= 0 || p.Fired == "" {
		return
	}
	if _, err := os.Stat(p.Fired); err == nil {
		return
	}
	if done != 1+(p.AfterOps-1)%total {
		return
	}
	f.log.Warn("fault: the engine kills itself mid-apply", "done", done, "ops", total)
	writeFired(p.Fired, fired{What: fmt.Sprintf("engine killed itself after %d of %d ops", done, total), Killed: true})
	_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
	select {}
}

// smallWindow is grpc-go's initial (and smallest) HTTP/2 window.
const smallWindow = 64 << 10

// faultPlan is the signer's fault plan, rewritten by the harness to arm a
// fault. A plan fires once per Arm: a new Arm value counts calls afresh.
type faultPlan struct {
	Arm string `json:"arm"`
	// Method is "SignCompositions" or "SignManifests".
	Method string `json:"method"`
	// Nth is the call of Method (from 1, counted from arming) that fires.
	Nth int `json:"nth"`
	// KillPID, when set, is killed with SIGKILL once the Nth call was
	// signed (and audited), before its answer leaves: a composer killed
	// between sign and write.
	KillPID int `json:"kill_pid,omitempty"`
	// KillSelfAfter, when KillPID is 0, kills the signer itself this long
	// after the Nth call arrives, while it signs: a signer killed
	// mid-batch.
	KillSelfAfter time.Duration `json:"kill_self_after,omitempty"`
	// PausePID, when set (and KillPID is 0), is stopped with SIGSTOP when
	// the Nth call arrives, and the call is held before the signer judges
	// anything of it (its fencing epoch first) until the file Release
	// exists; then it is handled as it stands, answered to the stopped
	// caller, and its outcome written to Fired: a lease holder paused with
	// a sign request in flight that reaches the signer only after another
	// replica was fenced in.
	PausePID int    `json:"pause_pid,omitempty"`
	Release  string `json:"release,omitempty"`
	// Fired is written (with the time) when the fault fires.
	Fired string `json:"fired"`
}

// signerFaults runs a signer's fault plan; it sits inside authorization.
type signerFaults struct {
	path string
	log  *slog.Logger

	mu    sync.Mutex
	armed string
	calls int
	fired bool
}

func (f *signerFaults) plan() (faultPlan, bool) {
	var p faultPlan
	if f.path == "" {
		return p, false
	}
	b, err := os.ReadFile(f.path)
	if err != nil || json.Unmarshal(b, &p) != nil || p.Arm == "" {
		return p, false
	}
	return p, true
}

func (f *signerFaults) intercept(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	p, ok := f.plan()
	method := ""
	switch info.FullMethod {
	case signerv1.SignerService_SignCompositions_FullMethodName:
		method = "SignCompositions"
	case signerv1.SignerService_SignManifests_FullMethodName:
		method = "SignManifests"
	}
	if !ok || method == "" || method != p.Method {
		return h(ctx, req)
	}
	f.mu.Lock()
	if f.armed != p.Arm {
		f.armed, f.calls, f.fired = p.Arm, 0, false
	}
	f.calls++
	fire := !f.fired && f.calls == p.Nth
	if fire {
		f.fired = true
	}
	f.mu.Unlock()
	if !fire {
		return h(ctx, req)
	}
	if p.KillPID == 0 && p.PausePID != 0 {
		return f.stall(ctx, req, h, p, method)
	}
	if p.KillPID == 0 {
		time.AfterFunc(p.KillSelfAfter, func() {
			f.log.Warn("fault: the signer kills itself mid-batch", "method", method, "nth", p.Nth)
			writeFired(p.Fired, fired{What: "signer killed itself during " + method, Killed: true})
			_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
		})
		return h(ctx, req)
	}
	resp, err := h(ctx, req)
	if err != nil {
		writeFired(p.Fired, fired{What: fmt.Sprintf("%s failed (%v): nothing killed", method, err)})
		return resp, err
	}
	var digests []string
	switch r := resp.(type) {
	case *signerv1.SignCompositionsResponse:
		for _, it := range r.GetItems() {
			digests = append(digests, it.GetDigest())
		}
	case *signerv1.SignManifestsResponse:
		for _, m := range r.GetManifests() {
			digests = append(digests, m.GetItem().GetDigest())
		}
	}
	f.log.Warn("fault: killing the composer between sign and write", "pid", p.KillPID, "method", method, "nth", p.Nth)
	_ = syscall.Kill(p.KillPID, syscall.SIGKILL)
	writeFired(p.Fired, fired{What: fmt.Sprintf("composer pid %d killed after %s was signed", p.KillPID, method), Killed: true, Digests: digests})
	return resp, err
}

// stall stops the caller, holds its call until the plan's Release file
// exists and then handles it. The call is handled without the caller's
// cancellation or deadline: a request that reaches the signer late is judged
// as it stands, not dropped for being late.
func (f *signerFaults) stall(ctx context.Context, req any, h grpc.UnaryHandler, p faultPlan, method string) (any, error) {
	f.log.Warn("fault: pausing the caller and holding its sign request", "pid", p.PausePID, "method", method, "nth", p.Nth)
	_ = syscall.Kill(p.PausePID, syscall.SIGSTOP)
	writeFired(p.Fired, fired{What: fmt.Sprintf("composer pid %d paused with %s in flight", p.PausePID, method), Stalled: true})
	for deadline := time.Now().Add(5 * time.Minute); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if _, err := os.Stat(p.Release); err == nil {
			break
		}
	}
	resp, err := h(context.WithoutCancel(ctx), req)
	out := fired{What: fmt.Sprintf("%s of pid %d released", method, p.PausePID)}
	if err != nil {
		out.Err = err.Error()
	}
	writeFired(p.Fired, out)
	return resp, err
}

// fired is what a fault did, one JSON line of the plan's Fired file.
type fired struct {
	// Stalled is set when a call was held (PausePID); Err is the error a
	// held call was answered with once released, "" when it was signed.
	Stalled bool      `json:"stalled,omitempty"`
	Err     string    `json:"err,omitempty"`
	At      time.Time `json:"at"`
	What    string    `json:"what"`
	// Killed is set when the fault killed a process.
	Killed bool `json:"killed"`
	// Digests are the items the call signed before its caller was killed.
	Digests []string `json:"digests,omitempty"`
}

func writeFired(path string, what fired) {
	if path == "" {
		return
	}
	what.At = time.Now().UTC()
	b, _ := json.Marshal(what)
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return
	}
	f.Write(append(b, '\n'))
	f.Sync()
	f.Close()
}
