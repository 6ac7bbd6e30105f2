// Package bench is the composer's benchmark (`meshctl bench compose`): N
// nodes × M modules composed, signed through the gRPC signer and committed on
// an embedded JetStream with sync_interval always (the one-machine default),
// against the rate of raw JetStream writes of the same message set in the
// same run. Everything runs in this process over real mTLS: a catalog, a
// signer cross-checking against it, and a composer.
package bench

import (
	"cmp"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"runtime/pprof"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"mesh.dev/internal/canonical"
	"mesh.dev/internal/envelope"
	"mesh.dev/internal/grpcclient"
	"mesh.dev/internal/identity"
	"mesh.dev/internal/keyfile"
	"mesh.dev/internal/names"
	"mesh.dev/internal/natsx"
	"mesh.dev/internal/pki"
	catalogv1 "mesh.dev/proto/mesh/catalog/v1"
	composerv1 "mesh.dev/proto/mesh/composer/v1"
	typev1 "mesh.dev/proto/mesh/type/v1"
	catalogapp "mesh.dev/services/catalog/app"
	"mesh.dev/services/composer/app"
	"mesh.dev/services/composer/internal/pass"
	signerapp "mesh.dev/services/signer/app"
)

// Limits of the benchmark's size.
const (
	MaxNodes   = 10_000
	MaxModules = 20
)

// Config sizes a run.
type Config struct {
	// Nodes and Modules: every node places every module (default 1,000 ×
	// 20, at most 10,000 × 20).
	Nodes, Modules int
	// Workers is how many nodes the composer passes over at once, and how
	// many writers the raw baseline uses (default 64).
	Workers int
	// Dir holds the JetStream store and the signer's state; a temporary
	// directory, removed afterwards, when empty.
	Dir string
	// Logger receives the services' warnings; none when nil.
	Logger *slog.Logger
	// Progress, when set, receives a line per phase.
	Progress io.Writer
	// FirstProfile and SecondProfile, when set, are files the CPU profile
	// of the first and of the second pass is written to.
	FirstProfile, SecondProfile string
}

func (c *Config) defaults() error {
	if c.Nodes == 0 {
		c.Nodes = 1000
	}
	if c.Modules == 0 {
		c.Modules = MaxModules
	}
	if c.Workers == 0 {
		c.Workers = 64
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Progress == nil {
		c.Progress = io.Discard
	}
	switch {
	case c.Nodes < 1 || c.Nodes > MaxNodes:
		return fmt.Errorf("bench: nodes %d is outside 1..%d", c.Nodes, MaxNodes)
	case c.Modules < 1 || c.Modules > MaxModules:
		return fmt.Errorf("bench: modules %d is outside 1..%d", c.Modules, MaxModules)
	case c.Workers < 1 || c.Workers > 1024:
		return fmt.Errorf("bench: workers %d is outside 1..1024", c.Workers)
	}
	return nil
}

// Result holds the figures of a run.
type Result struct {
	Nodes, Modules, Workers int
	// Compositions is how many compositions the first pass wrote (each
	// node's module compositions and its own); Messages all it wrote
	// (compositions, judgement records, assignments).
	Compositions, Messages int
	// First is the first pass: every node composed, signed and committed.
	First time.Duration
	// Raw is the raw JetStream writes of the same message set.
	Raw time.Duration
	// Second is a pass over every node with nothing changed, and
	// SecondWrites what it wrote (compositions, records, assignments,
	// status).
	Second       time.Duration
	SecondWrites uint64
}

// FirstRate is the first pass's compositions per second.
func (r *Result) FirstRate() float64 { return float64(r.Compositions) / r.First.Seconds() }

// RawRate is the raw writes' compositions per second.
func (r *Result) RawRate() float64 { return float64(r.Compositions) / r.Raw.Seconds() }

// Report writes the figures.
func (r *Result) Report(w io.Writer) {
	fmt.Fprintf(w, "bench compose: %d nodes × %d modules, %d workers, embedded JetStream with sync_interval always\n", r.Nodes, r.Modules, r.Workers)
	fmt.Fprintf(w, "  first pass:  %8.2fs  %8.0f compositions/s  (%d compositions, %d messages with records and assignments)\n",
		r.First.Seconds(), r.FirstRate(), r.Compositions, r.Messages)
	fmt.Fprintf(w, "  raw writes:  %8.2fs  %8.0f compositions/s  (the same %d messages, pre-built, %d writers)\n",
		r.Raw.Seconds(), r.RawRate(), r.Messages, r.Workers)
	fmt.Fprintf(w, "  ratio:       %8.2f   of the raw rate (target >= 0.5)\n", r.FirstRate()/r.RawRate())
	fmt.Fprintf(w, "  second pass: %8.2fs  %d writes, %.2f of the first pass's time (target: no writes, <= 0.20)\n",
		r.Second.Seconds(), r.SecondWrites, r.Second.Seconds()/r.First.Seconds())
}

// Meets reports whether the run met the targets: a first pass at least
// half the raw rate, a second pass writing nothing in at most a fifth of
// the first pass's time.
func (r *Result) Meets() bool {
	return r.FirstRate() >= 0.5*r.RawRate() && r.SecondWrites == 0 && r.Second*5 <= r.First
}

// Run runs the benchmark.
func Run(ctx context.Context, cfg Config) (_ *Result, err error) {
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	dir := cfg.Dir
	if dir == "" {
		if dir, err = os.MkdirTemp("", "mesh-bench-"); err != nil {
			return nil, err
		}
		defer os.RemoveAll(dir)
	}
	say := func(format string, args ...any) { fmt.Fprintf(cfg.Progress, format+"\n", args...) }
	ctx, cancel := context.WithCancel(ctx)
	var loops sync.WaitGroup
	// closers run after the services stopped, last first.
	var closers []func()
	defer func() {
		cancel()
		loops.Wait()
		for i := len(closers) - 1; i >= 0; i-- {
			closers[i]()
		}
	}()
	serve := func(name string, run func(ctx context.Context) error) {
		loops.Add(1)
		go func() {
			defer loops.Done()
			if err := run(ctx); err != nil && !errors.Is(err, context.Canceled) {
				cfg.Logger.Error("bench: "+name+" stopped", "error", err)
			}
		}()
	}

	// The one-machine default: an embedded server fsyncing every write.
	e, err := natsx.StartEmbedded(natsx.EmbeddedConfig{DataDir: filepath.Join(dir, "jetstream"), SyncAlways: true, ServerName: "bench"})
	if err != nil {
		return nil, err
	}
	closers = append(closers, e.Shutdown)
	nc, js, err := natsx.Connect(ctx, natsx.ConnConfig{Name: "bench", InProcess: e.Server(), Logger: cfg.Logger})
	if err != nil {
		return nil, err
	}
	closers = append(closers, nc.Close)

	w, err := newWorld(dir)
	if err != nil {
		return nil, err
	}
	catLis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	cat, err := catalogapp.New(ctx, catalogapp.Config{Listen: catLis.Addr().String(), MetricsListen: catalogapp.MetricsOff},
		catalogapp.Options{Logger: cfg.Logger, JetStream: js, Listener: catLis, ServerTLS: w.serverTLS(identity.RoleCatalog)})
	if err != nil {
		return nil, err
	}
	serve("catalog", func(ctx context.Context) error { return cat.Serve(ctx, nil) })
	sigLis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	signerCatalog, err := grpcclient.Dial(catLis.Addr().String(), w.clientTLS(identity.RoleSigner, ""))
	if err != nil {
		return nil, err
	}
	closers = append(closers, func() { signerCatalog.Close() })
	sig, err := signerapp.New(ctx, signerapp.Config{
		Listen: sigLis.Addr().String(), SigningKeyFile: w.signingKeyFile, KeysetFile: w.keysetFile, RootsFile: w.rootsFile,
		StateDir: filepath.Join(dir, "signer"), OwnPrefixes: []string{"/etc"}, CatalogAddr: catLis.Addr().String(),
	}, signerapp.Options{Logger: cfg.Logger, Listener: sigLis, ServerTLS: w.serverTLS(identity.RoleSigner),
		Catalog: catalogv1.NewCatalogServiceClient(signerCatalog)})
	if err != nil {
		return nil, err
	}
	serve("signer", func(ctx context.Context) error { return sig.Serve(ctx, nil) })

	builderConn, err := grpcclient.Dial(catLis.Addr().String(), w.clientTLS(identity.RoleBuilder, "bench"))
	if err != nil {
		return nil, err
	}
	closers = append(closers, func() { builderConn.Close() })
	say("releasing %d modules", cfg.Modules)
	if err := release(ctx, catalogv1.NewCatalogServiceClient(builderConn), cfg.Modules); err != nil {
		return nil, err
	}
	say("putting %d node specs", cfg.Nodes)
	if err := putSpecs(ctx, js, cfg.Nodes, cfg.Modules); err != nil {
		return nil, err
	}

	// The composer: every pass is counted; the first pass is done when
	// every node committed.
	var committed, passed, failures atomic.Int64
	var firstErr atomic.Pointer[error]
	// counting is what done waits for: commits in the first pass, passes
	// in the second.
	var counting atomic.Pointer[atomic.Int64]
	counting.Store(&committed)
	done := make(chan struct{}, 1)
	onPass := func(node string, res *pass.Result, err error) {
		if err == nil && res != nil {
			err = res.Err
		}
		if err != nil {
			failures.Add(1)
			err = fmt.Errorf("node %s: %w", node, err)
			firstErr.CompareAndSwap(nil, &err)
		}
		if res != nil && res.Committed {
			committed.Add(1)
		}
		passed.Add(1)
		if counting.Load().Load() == int64(cfg.Nodes) {
			select {
			case done <- struct{}{}:
			default:
			}
		}
	}
	compLis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	c, err := app.New(ctx, app.Config{Listen: compLis.Addr().String(), SignerAddr: sigLis.Addr().String(), CatalogAddr: catLis.Addr().String(),
		Workers: cfg.Workers, Holder: "bench"}, app.Options{
		Logger: cfg.Logger, JetStream: js, Listener: compLis, Roots: w.roots,
		ServerTLS: w.serverTLS(identity.RoleComposer), ClientTLS: w.clientTLS(identity.RoleComposer, ""), OnPass: onPass,
	})
	if err != nil {
		return nil, err
	}
	say("first pass")
	stopProfile, err := profile(cfg.FirstProfile)
	if err != nil {
		return nil, err
	}
	start := time.Now()
	serve("composer", func(ctx context.Context) error { return c.Serve(ctx, nil) })
	if err := waitFor(ctx, done, 30*time.Minute); err != nil {
		return nil, fmt.Errorf("first pass: %w", err)
	}
	first := time.Since(start)
	stopProfile()
	if n := failures.Load(); n > 0 {
		return nil, fmt.Errorf("first pass: %d passes failed, the first with: %w", n, *firstErr.Load())
	}
	// Passes queued again while a node was being passed (the keyset
	// taken, the full reconcile of the lease) end before the second pass.
	for c.Reconciler.Pending() > 0 {
		time.Sleep(10 * time.Millisecond)
	}

	res := &Result{Nodes: cfg.Nodes, Modules: cfg.Modules, Workers: cfg.Workers, First: first}

	say("reading the message set back")
	set, err := readSet(ctx, js)
	if err != nil {
		return nil, err
	}
	res.Compositions, res.Messages = set.compositions, set.messages
	if want := cfg.Nodes * (cfg.Modules + 1); res.Compositions != want {
		return nil, fmt.Errorf("the first pass wrote %d compositions, want %d", res.Compositions, want)
	}

	say("second pass")
	before, err := lastSeqs(ctx, js)
	if err != nil {
		return nil, err
	}
	passed.Store(0)
	counting.Store(&passed)
	if stopProfile, err = profile(cfg.SecondProfile); err != nil {
		return nil, err
	}
	start = time.Now()
	for _, n := range set.nodes {
		c.Reconciler.Enqueue(ctx, n, "bench: second pass")
	}
	if err := waitFor(ctx, done, 30*time.Minute); err != nil {
		return nil, fmt.Errorf("second pass: %w", err)
	}
	res.Second = time.Since(start)
	stopProfile()
	after, err := lastSeqs(ctx, js)
	if err != nil {
		return nil, err
	}
	res.SecondWrites = after - before

	say("raw writes of the same %d messages", res.Messages)
	if res.Raw, err = writeRaw(ctx, js, set, cfg.Workers); err != nil {
		return nil, err
	}
	return res, nil
}

// profile starts a CPU profile into path ("" none) and returns what stops
// it.
func profile(path string) (func(), error) {
	if path == "" {
		return func() {}, nil
	}
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, err
	}
	return func() {
		pprof.StopCPUProfile()
		f.Close()
	}, nil
}

func waitFor(ctx context.Context, done <-chan struct{}, limit time.Duration) error {
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(limit):
		return fmt.Errorf("not done within %s", limit)
	}
}

// world is the benchmark's PKI and chain of trust.
type world struct {
	ca                                    *pki.CA
	roots                                 *typev1.TrustRoots
	rootsFile, keysetFile, signingKeyFile string
}

func newWorld(dir string) (*world, error) {
	ca, err := pki.NewCA("bench.mesh", 24*time.Hour)
	if err != nil {
		return nil, err
	}
	_, root, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, err
	}
	_, signing, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, err
	}
	rootPub := root.Public().(ed25519.PublicKey)
	roots := &typev1.TrustRoots{Threshold: 1, Keys: []*typev1.RootKey{{Id: envelope.KeyID(rootPub), PublicKey: rootPub}}}
	now := time.Now()
	pub := signing.Public().(ed25519.PublicKey)
	ks := &typev1.Keyset{Version: 1, IssuedAt: timestamppb.New(now), ExpiresAt: timestamppb.New(now.Add(30 * 24 * time.Hour)),
		Keys: []*typev1.KeysetKey{{Id: envelope.KeyID(pub), PublicKey: pub, State: typev1.KeyState_KEY_STATE_ACTIVE,
			NotBefore: timestamppb.New(now.Add(-time.Hour)), NotAfter: timestamppb.New(now.Add(30 * 24 * time.Hour))}}}
	env, _, err := envelope.Seal(typev1.PayloadType_PAYLOAD_TYPE_KEYSET, ks)
	if err != nil {
		return nil, err
	}
	if err := envelope.SignWith(env, root); err != nil {
		return nil, err
	}
	w := &world{ca: ca, roots: roots, rootsFile: filepath.Join(dir, "roots.json"), keysetFile: filepath.Join(dir, "keyset.json"),
		signingKeyFile: filepath.Join(dir, "signing-key.pem")}
	if err := keyfile.WriteJSON(w.rootsFile, roots, 0o644); err != nil {
		return nil, err
	}
	if err := keyfile.WriteJSON(w.keysetFile, env, 0o644); err != nil {
		return nil, err
	}
	if err := keyfile.Write(w.signingKeyFile, signing); err != nil {
		return nil, err
	}
	return w, nil
}

func (w *world) issue(role identity.Role, name string) (cert, key []byte) {
	if role.IsService() && name == "" {
		name = string(role)
	}
	cert, key, err := w.ca.Issue(identity.Identity{TrustDomain: w.ca.TrustDomain(), Role: role, Name: name}, pki.IssueOptions{})
	if err != nil {
		panic(err)
	}
	return cert, key
}

func (w *world) serverTLS(role identity.Role) *tls.Config {
	cert, key := w.issue(role, "")
	cfg, err := pki.ServerTLSFromPEM(cert, key, w.ca.CertPEM())
	if err != nil {
		panic(err)
	}
	return cfg
}

func (w *world) clientTLS(role identity.Role, name string) *tls.Config {
	cert, key := w.issue(role, name)
	cfg, err := pki.ClientTLSFromPEM(cert, key, w.ca.CertPEM())
	if err != nil {
		panic(err)
	}
	return cfg
}

// moduleName is the name of the i-th module.
func moduleName(i int) string { return fmt.Sprintf("mod%02d", i) }

// release puts every module in the catalog as a builder would: entry, DONE
// build, registration. Each module renders a directory and two files from
// the node's name and params, so every node's compositions differ.
func release(ctx context.Context, cat catalogv1.CatalogServiceClient, modules int) error {
	for i := range modules {
		m := moduleName(i)
		mm := &typev1.ModuleManifest{Module: m, Version: "1.0", Upgrade: &typev1.Policy{Policy: typev1.UpgradePolicy_UPGRADE_POLICY_AUTO},
			Resources: []*typev1.ResourceTemplate{
				{Name: "dir", Type: typev1.ResourceType_RESOURCE_TYPE_DIRECTORY, Path: "/etc/" + m, Mode: 0o755},
				{Name: "conf", Type: typev1.ResourceType_RESOURCE_TYPE_FILE, Path: "/etc/" + m + "/conf", Mode: 0o644,
					Content: &typev1.ResourceTemplate_Text{Text: "# " + m + " on {{ .Node }}\nport = {{ .Params.port }}\nweight = {{ .Params.weight }}\n"}},
				{Name: "motd", Type: typev1.ResourceType_RESOURCE_TYPE_FILE, Path: "/etc/" + m + "/motd", Mode: 0o644,
					Content: &typev1.ResourceTemplate_Text{Text: "Welcome to {{ .Node }}, running " + m + ".\n"}},
			}}
		b, err := canonical.Marshal(mm)
		if err != nil {
			return err
		}
		src := names.Digest([]byte("bench/" + m))
		fp := names.ComputeFingerprint(m, "git.example/bench", "modules/"+m, src, names.Digest(b))
		entry := &catalogv1.Entry{Fingerprint: fp, Module: m, Repository: "git.example/bench", Path: "modules/" + m, SourceDigest: src,
			Commit: "0123456789abcdef0123456789abcdef01234567", Manifest: b, ManifestDigest: names.Digest(b), Verdict: catalogv1.Verdict_VERDICT_PASS}
		if _, err := cat.PutEntry(ctx, &catalogv1.PutEntryRequest{Entry: entry}); err != nil {
			return fmt.Errorf("put entry %s: %w", m, err)
		}
		if _, err := cat.PutBuild(ctx, &catalogv1.PutBuildRequest{Build: &catalogv1.Build{Fingerprint: fp, State: catalogv1.BuildState_BUILD_STATE_DONE}}); err != nil {
			return fmt.Errorf("put build %s: %w", m, err)
		}
		if _, err := cat.RegisterModule(ctx, &catalogv1.RegisterModuleRequest{Module: m, Fingerprint: fp}); err != nil {
			return fmt.Errorf("register %s: %w", m, err)
		}
	}
	return nil
}

// putSpecs writes the node specs straight into bucket nodes, before the
// composer starts, so its first pass is the whole fleet at once.
func putSpecs(ctx context.Context, js jetstream.JetStream, nodes, modules int) error {
	var spec natsx.KVSpec
	for _, s := range natsx.Buckets(1) {
		if s.Bucket == natsx.BucketNodes {
			spec = s
		}
	}
	kv, err := natsx.EnsureKV(ctx, js, spec)
	if err != nil {
		return err
	}
	for i := range nodes {
		s := &composerv1.NodeSpec{Node: fmt.Sprintf("node-%05d", i), Labels: map[string]string{"rack": fmt.Sprintf("r%d", i%40)}}
		for j := range modules {
			params, err := structpb.NewStruct(map[string]any{"port": 7000 + j, "weight": i % 7})
			if err != nil {
				return err
			}
			s.Modules = append(s.Modules, &composerv1.PlacedModule{Module: moduleName(j), Params: params})
		}
		b, err := proto.MarshalOptions{Deterministic: true}.Marshal(s)
		if err != nil {
			return err
		}
		if _, err := kv.Put(ctx, s.GetNode(), b); err != nil {
			return err
		}
	}
	return nil
}

// messageSet is what the first pass wrote, by node, in the order a pass
// writes it: each composition and its judgement record, then the
// assignment.
type messageSet struct {
	nodes                  []string
	byNode                 map[string][]rawMsg
	compositions, messages int
}

type rawMsg struct {
	bucket, key string
	value       []byte
}

// setBuckets are the buckets the first pass's message set lives in, in the
// order a pass writes them for a node.
var setBuckets = []string{natsx.BucketCompositions, natsx.BucketComposed, natsx.BucketAssignments}

func readSet(ctx context.Context, js jetstream.JetStream) (*messageSet, error) {
	set := &messageSet{byNode: map[string][]rawMsg{}}
	for _, b := range setBuckets {
		kv, err := natsx.OpenKV(ctx, js, b)
		if err != nil {
			return nil, err
		}
		w, err := kv.Watch(ctx, ">", natsx.IgnoreDeletes())
		if err != nil {
			return nil, err
		}
		for e := range w.Updates() {
			if e == nil {
				break
			}
			node := e.Key
			if b != natsx.BucketAssignments {
				k, err := names.ParseCompositionKey(e.Key)
				if err != nil {
					continue
				}
				node = k.Node
				if b == natsx.BucketCompositions {
					set.compositions++
				}
			}
			set.byNode[node] = append(set.byNode[node], rawMsg{bucket: b, key: e.Key, value: e.Value})
			set.messages++
		}
		w.Stop()
	}
	// The order a pass writes a node's messages in: each composition (in
	// the order written, the node's own last) followed by its judgement
	// record, then the assignment.
	for n, msgs := range set.byNode {
		set.nodes = append(set.nodes, n)
		records := map[string]rawMsg{}
		for _, m := range msgs {
			if m.bucket == natsx.BucketComposed {
				records[m.key] = m
			}
		}
		ordered := make([]rawMsg, 0, len(msgs))
		for _, m := range msgs {
			if m.bucket == natsx.BucketCompositions {
				ordered = append(ordered, m)
				if r, ok := records[m.key]; ok {
					ordered = append(ordered, r)
					delete(records, m.key)
				}
			}
		}
		for _, m := range msgs {
			if m.bucket == natsx.BucketAssignments || (m.bucket == natsx.BucketComposed && records[m.key].key != "") {
				ordered = append(ordered, m)
			}
		}
		set.byNode[n] = ordered
	}
	sort.Strings(set.nodes)
	return set, nil
}

// lastSeqs sums the last sequence of every bucket a pass writes.
func lastSeqs(ctx context.Context, js jetstream.JetStream) (uint64, error) {
	var sum uint64
	for _, b := range append(setBuckets, natsx.BucketStatus) {
		s, err := js.Stream(ctx, "KV_"+b)
		if err != nil {
			return 0, err
		}
		info, err := s.Info(ctx)
		if err != nil {
			return 0, err
		}
		sum += info.State.LastSeq
	}
	return sum, nil
}

// writeRaw writes the message set into fresh buckets configured like the
// composer's (raw-<bucket>), each node's messages in the order a pass writes
// them (each composition, then its record), workers nodes at a time, each
// message a Create: the cost of the writes alone.
func writeRaw(ctx context.Context, js jetstream.JetStream, set *messageSet, workers int) (time.Duration, error) {
	kvs := map[string]*natsx.KV{}
	for _, spec := range natsx.Buckets(1) {
		for _, b := range setBuckets {
			if spec.Bucket == b {
				spec.Bucket = "raw-" + b
				kv, err := natsx.EnsureKV(ctx, js, spec)
				if err != nil {
					return 0, err
				}
				kvs[b] = kv
			}
		}
	}
	next := make(chan string)
	var mu sync.Mutex
	var first error
	var wg sync.WaitGroup
	start := time.Now()
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for n := range next {
				for _, m := range set.byNode[n] {
					if _, err := kvs[m.bucket].Create(ctx, m.key, m.value); err != nil {
						mu.Lock()
						first = cmp.Or(first, err)
						mu.Unlock()
						break
					}
				}
			}
		}()
	}
	for _, n := range set.nodes {
		next <- n
	}
	close(next)
	wg.Wait()
	took := time.Since(start)
	if first != nil {
		return 0, fmt.Errorf("raw writes: %w", first)
	}
	return took, nil
}
