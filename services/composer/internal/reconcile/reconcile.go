// Package reconcile decides which nodes the composer passes over and when
// (DESIGN.md §5.2, §6): a node is recomposed when its spec changes, when a
// module it places is registered at a new fingerprint, when an approval of a
// module it places changes, when its engine reports a new applied digest or a
// failure that needs a new signature, and when its manifest is due for
// renewal; a full reconcile visits every node within the period (15 min),
// spread out. Watches run on every replica; passes run only while this
// composer holds the lease.
package reconcile

import (
	"context"
	"errors"
	"log/slog"
	"maps"
	"math/rand/v2"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
	"google.golang.org/protobuf/proto"

	"mesh.dev/internal/telemetry"
	catalogv1 "mesh.dev/proto/mesh/catalog/v1"
	composerv1 "mesh.dev/proto/mesh/composer/v1"
	"mesh.dev/services/composer/internal/pass"
	"mesh.dev/services/composer/internal/store"
)

// Config is what a Reconciler needs.
type Config struct {
	Store  *store.Store
	Passer *pass.Passer
	Logger *slog.Logger
	// Workers is how many nodes are passed over at once.
	Workers int
	// Period is the full reconcile period: every node is visited at least
	// this often.
	Period time.Duration
	// OnPass, when set, is called after every pass (metrics, tests).
	OnPass func(node string, res *pass.Result, err error)
	// OnNodeDeleted, when set, is called when a node's spec is deleted
	// (the Sync streams of the node end).
	OnNodeDeleted func(node string)
	// OnLabelsChanged, when set, is called when a node's labels changed,
	// after Spec returns the new ones (the Sync streams hearing it judge
	// their needs' selectors again: no assignment or haves write wakes
	// them for a relabel).
	OnLabelsChanged func(node string)
	Now             func() time.Time
	// Tracer makes a "composer.pass" span for each change that queues
	// passes; each node's pass continues its trace.
	Tracer trace.Tracer
}

// task is a pending pass of one node: why, and the trace it continues.
type task struct {
	reason      string
	traceparent string
	tracestate  string
	// followUp marks a pass that follows an engine's report of what it
	// applied (DESIGN.md §6 step 4): it waits behind the passes of
	// changes, up to followUpWait, so a fleet-wide change reaches every
	// node before the nodes that applied it first are passed over again.
	followUp bool
	// since is when the task was queued.
	since time.Time
}

// followUpWait bounds how long a follow-up pass waits behind others.
const followUpWait = 5 * time.Second

// Reconciler queues and runs node passes.
type Reconciler struct {
	cfg Config

	mu sync.Mutex
	// queue holds nodes in order, later the nodes of follow-up tasks;
	// pending their tasks (a node in either list without one was passed
	// over already); running the nodes being passed over, and dirty those
	// queued again meanwhile.
	queue   []string
	later   []string
	pending map[string]task
	running map[string]bool
	dirty   map[string]task
	wake    chan struct{}
	leading bool
	// specsLoaded and approvalsLoaded are set once the watches delivered
	// what the buckets held when they started.
	specsLoaded, approvalsLoaded bool

	specs     map[string]*composerv1.NodeSpec
	approvals map[string]*composerv1.Approval
	haves     map[string]*composerv1.HaveRecord
	// known are each node's spec and haves record as the watches
	// delivered them last, with their revisions (see Watched).
	known     map[string]pass.Watched
	nextVisit map[string]time.Time
	// undeleted are nodes without a spec whose last pass (which deletes
	// what was derived for them, Passer.DeleteNode) failed: visited again
	// when due, as nodes with a spec are.
	undeleted map[string]bool
	// failures counts each node's passes failed in a row.
	failures map[string]int
	// refresh stands in for the Passer's RefreshStatus in tests.
	refresh func(ctx context.Context, node string) error
}

// New returns a Reconciler.
func New(cfg Config) *Reconciler {
	if cfg.Workers <= 0 {
		cfg.Workers = 16
	}
	if cfg.Period <= 0 {
		cfg.Period = 15 * time.Minute
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Tracer == nil {
		cfg.Tracer = noop.NewTracerProvider().Tracer("")
	}
	return &Reconciler{cfg: cfg, pending: map[string]task{}, running: map[string]bool{}, dirty: map[string]task{},
		wake: make(chan struct{}, 1), specs: map[string]*composerv1.NodeSpec{}, haves: map[string]*composerv1.HaveRecord{},
		approvals: map[string]*composerv1.Approval{}, known: map[string]pass.Watched{},
		nextVisit: map[string]time.Time{}, failures: map[string]int{}, undeleted: map[string]bool{}}
}

// Enqueue asks for a pass of a node, continuing the trace of ctx.
func (r *Reconciler) Enqueue(ctx context.Context, node, reason string) {
	r.fanOut(ctx, reason, []string{node})
}

// followUp asks for a follow-up pass of a node (see task.followUp).
func (r *Reconciler) followUp(ctx context.Context, node, reason string) {
	r.fanOutTask(ctx, reason, []string{node}, true)
}

// fanOut queues passes of nodes for one reason inside a "composer.pass" span
// continuing the trace of ctx (the change that caused them): each node's
// pass is a child of it.
func (r *Reconciler) fanOut(ctx context.Context, reason string, nodes []string) {
	r.fanOutTask(ctx, reason, nodes, false)
}

func (r *Reconciler) fanOutTask(ctx context.Context, reason string, nodes []string, followUp bool) {
	if len(nodes) == 0 {
		return
	}
	ctx, span := r.cfg.Tracer.Start(ctx, "composer.pass", trace.WithAttributes(
		attribute.String("mesh.reason", reason), attribute.Int("mesh.nodes", len(nodes))))
	tp, ts := telemetry.Traceparent(ctx)
	now := r.cfg.Now()
	for _, node := range nodes {
		r.enqueue(node, task{reason: reason, traceparent: tp, tracestate: ts, followUp: followUp, since: now})
	}
	span.End()
}

func (r *Reconciler) enqueue(node string, t task) {
	r.mu.Lock()
	if r.running[node] {
		if old, ok := r.dirty[node]; ok {
			t.followUp = t.followUp && old.followUp
		}
		r.dirty[node] = t
	} else if old, ok := r.pending[node]; !ok {
		r.queueLocked(node, t)
	} else if old.followUp && !t.followUp {
		// Another reason than a follow-up: the node moves up to the
		// queue (its entry in later is passed over).
		r.queueLocked(node, t)
	} else if t.traceparent != "" {
		t.followUp, t.since = old.followUp, old.since
		r.pending[node] = t
	}
	r.mu.Unlock()
	r.wakeWorker()
}

// releaseLocked ends a node's turn (a pass or a status refresh): a task
// queued for it meanwhile goes to the queue.
func (r *Reconciler) releaseLocked(node string) {
	delete(r.running, node)
	if again, ok := r.dirty[node]; ok {
		delete(r.dirty, node)
		r.queueLocked(node, again)
	}
}

// wakeWorker tells a waiting worker that the queue changed.
func (r *Reconciler) wakeWorker() {
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// queueLocked makes t the node's pending task and puts the node at the
// end of its task's list.
func (r *Reconciler) queueLocked(node string, t task) {
	r.pending[node] = t
	if t.followUp {
		r.later = append(r.later, node)
	} else {
		r.queue = append(r.queue, node)
	}
}

// Pending returns how many nodes wait for a pass.
func (r *Reconciler) Pending() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.pending) + len(r.running)
}

// ModuleChanged queues every node placing a module, continuing the
// registration's trace.
func (r *Reconciler) ModuleChanged(reg *catalogv1.Registration) {
	ctx := telemetry.ContextWithTraceparent(context.Background(), reg.GetTraceparent(), reg.GetTracestate())
	r.fanOut(ctx, "module "+reg.GetModule()+" registered at "+reg.GetFingerprint(), r.nodesPlacing(reg.GetModule()))
}

func (r *Reconciler) nodesPlacing(module string) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for node, spec := range r.specs {
		for _, pm := range spec.GetModules() {
			if pm.GetModule() == module {
				out = append(out, node)
				break
			}
		}
	}
	slices.Sort(out)
	return out
}

// Loaded reports whether the spec and approval watches have delivered what
// their buckets held when they started: before that a pass could miss an
// approval, and the full reconcile a node.
func (r *Reconciler) Loaded() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.specsLoaded && r.approvalsLoaded
}

// Nodes returns every node with a spec.
func (r *Reconciler) Nodes() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]string, 0, len(r.specs))
	for n := range r.specs {
		out = append(out, n)
	}
	slices.Sort(out)
	return out
}

// setKnownLocked keeps what the watches delivered last of a node (nothing
// kept for a node with neither).
func (r *Reconciler) setKnownLocked(node string, k pass.Watched) {
	if k.SpecRev == 0 && k.HavesRev == 0 {
		delete(r.known, node)
		return
	}
	r.known[node] = k
}

// Watched returns the node spec and haves record the watches delivered
// last, with their revisions (0 for none; a value that did not decode has
// its revision and no message) (pass.Config.Watched). A delete, or a watch
// that started over, replaces them: they are never above what the bucket
// now holds for long. The messages are shared: a caller copies what it
// keeps.
func (r *Reconciler) Watched(node string) pass.Watched {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.known[node]
}

// Spec returns a node's spec as the nodes watch last delivered it.
func (r *Reconciler) Spec(node string) (*composerv1.NodeSpec, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	s, ok := r.specs[node]
	return s, ok
}

// Watch follows node specs, approvals and haves until ctx is done, queueing
// the passes they call for.
func (r *Reconciler) Watch(ctx context.Context) error {
	errc := make(chan error, 3)
	go func() { errc <- r.watchSpecs(ctx) }()
	go func() { errc <- r.watchApprovals(ctx) }()
	go func() { errc <- r.watchHaves(ctx) }()
	err := <-errc
	return err
}

func (r *Reconciler) watchSpecs(ctx context.Context) error {
	w, err := r.cfg.Store.Nodes.Watch(ctx, ">")
	if err != nil {
		return err
	}
	defer w.Stop()
	for e := range w.Updates() {
		if e == nil {
			r.mu.Lock()
			r.specsLoaded = true
			r.mu.Unlock()
			continue
		}
		node := e.Key
		tctx := e.TraceContext(context.Background())
		var spec *composerv1.NodeSpec
		if e.Op == jetstream.KeyValuePut {
			spec = &composerv1.NodeSpec{}
			if err := proto.Unmarshal(e.Value, spec); err != nil {
				r.cfg.Logger.Warn("node spec does not decode", "node", node, "error", err)
				spec = nil
			}
		}
		r.mu.Lock()
		k := r.known[node]
		k.SpecRev, k.Spec = 0, spec
		if e.Op == jetstream.KeyValuePut {
			k.SpecRev = e.Revision
		}
		r.setKnownLocked(node, k)
		r.mu.Unlock()
		if e.Op != jetstream.KeyValuePut {
			r.mu.Lock()
			delete(r.specs, node)
			delete(r.nextVisit, node)
			delete(r.failures, node)
			r.mu.Unlock()
			if r.cfg.OnNodeDeleted != nil {
				r.cfg.OnNodeDeleted(node)
			}
			r.Enqueue(tctx, node, "node spec deleted")
			continue
		}
		if spec == nil {
			continue
		}
		r.mu.Lock()
		old := r.specs[node]
		r.specs[node] = spec
		r.mu.Unlock()
		if r.cfg.OnLabelsChanged != nil && (old == nil || !maps.Equal(old.GetLabels(), spec.GetLabels())) {
			r.cfg.OnLabelsChanged(node)
		}
		if old == nil || !proto.Equal(old, spec) {
			r.Enqueue(tctx, node, "node spec changed")
		}
	}
	if ctx.Err() != nil {
		return nil
	}
	return errors.Join(errors.New("node spec watch ended"), w.Err())
}

// Approvals returns the approvals the watch holds (they outlive restarts:
// the watch starts from the bucket's current state).
func (r *Reconciler) Approvals() []*composerv1.Approval {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]*composerv1.Approval, 0, len(r.approvals))
	for _, a := range r.approvals {
		out = append(out, a)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].GetId() < out[j].GetId() })
	return out
}

func (r *Reconciler) watchApprovals(ctx context.Context) error {
	w, err := r.cfg.Store.Approvals.Watch(ctx, ">")
	if err != nil {
		return err
	}
	defer w.Stop()
	initial := true
	for e := range w.Updates() {
		if e == nil {
			initial = false
			r.mu.Lock()
			r.approvalsLoaded = true
			r.mu.Unlock()
			continue
		}
		a := &composerv1.Approval{}
		if e.Op != jetstream.KeyValuePut {
			r.mu.Lock()
			delete(r.approvals, e.Key)
			r.mu.Unlock()
			continue
		}
		if proto.Unmarshal(e.Value, a) != nil {
			continue
		}
		r.mu.Lock()
		r.approvals[e.Key] = a
		r.mu.Unlock()
		if initial {
			continue
		}
		r.fanOut(e.TraceContext(context.Background()), "approval "+a.GetId()+" of module "+a.GetModule(), r.nodesPlacing(a.GetModule()))
	}
	if ctx.Err() != nil {
		return nil
	}
	return errors.Join(errors.New("approvals watch ended"), w.Err())
}

// needsPass reports whether a new haves record calls for a pass (DESIGN.md
// §6 step 4): an applied digest changed, or an attempt failed for a digest or
// signature reason (an object longer than its declared size is one: its
// bytes are not those of its digest), a revision conflict, or a fetch (what
// it fetched may have been found corrupt and repaired meanwhile: the pass
// then signs the manifest again so the engine tries again at once; else it
// finds nothing to do). Other attempt changes only change the node's
// status. A pass for a failed attempt is urgent; one for an applied digest
// that changed is a follow-up (task.followUp): the change that made the
// engine apply is still reaching other nodes.
func needsPass(old, next *composerv1.HaveRecord) (need, urgent bool) {
	applied := map[string]string{}
	for _, h := range old.GetHaves() {
		applied[h.GetModule()] = h.GetApplied().GetDigest()
	}
	for _, h := range next.GetHaves() {
		if applied[h.GetModule()] != h.GetApplied().GetDigest() {
			need = true
		}
		delete(applied, h.GetModule())
		if h.GetAttempt().GetState() == composerv1.AttemptState_ATTEMPT_STATE_FAILED {
			switch h.GetAttempt().GetReasonCode() {
			case composerv1.ReasonCode_REASON_CODE_DIGEST_MISMATCH, composerv1.ReasonCode_REASON_CODE_SIGNATURE_INVALID,
				composerv1.ReasonCode_REASON_CODE_REVISION_CONFLICT, composerv1.ReasonCode_REASON_CODE_WANT_MISMATCH,
				composerv1.ReasonCode_REASON_CODE_SIZE_EXCEEDED, composerv1.ReasonCode_REASON_CODE_FETCH_FAILED:
				return true, true
			}
		}
	}
	return need || len(applied) > 0, false
}

// reported is the highest manifest revision an engine reported.
func reported(h *composerv1.HaveRecord) uint64 {
	return max(h.GetHighWater(), h.GetApplied().GetRevision())
}

// aboveHeld reports whether an engine reported a manifest revision above the
// node's held manifest: the lease holder then re-signs above it at once
// (DESIGN.md §6 step 4).
func (r *Reconciler) aboveHeld(ctx context.Context, node string, h *composerv1.HaveRecord) bool {
	if reported(h) == 0 {
		return false
	}
	a, _, err := r.cfg.Store.Assignment(ctx, node)
	if err != nil {
		// No assignment yet, or it cannot be read: the pass decides.
		return true
	}
	return reported(h) > a.GetManifestRevision()
}

func (r *Reconciler) watchHaves(ctx context.Context) error {
	w, err := r.cfg.Store.Haves.Watch(ctx, ">")
	if err != nil {
		return err
	}
	defer w.Stop()
	initial := true
	for e := range w.Updates() {
		if e == nil {
			initial = false
			continue
		}
		var rec *composerv1.HaveRecord
		if e.Op == jetstream.KeyValuePut {
			rec = &composerv1.HaveRecord{}
			if proto.Unmarshal(e.Value, rec) != nil {
				rec = nil
			}
		}
		r.mu.Lock()
		k := r.known[e.Key]
		k.HavesRev, k.Haves = 0, rec
		if e.Op == jetstream.KeyValuePut {
			k.HavesRev = e.Revision
		}
		r.setKnownLocked(e.Key, k)
		r.mu.Unlock()
		if e.Op != jetstream.KeyValuePut {
			// A node deleted, or a record the store lost (the watch starts
			// over after a store went back): its next report is a change.
			r.mu.Lock()
			delete(r.haves, e.Key)
			_, placed := r.specs[e.Key]
			leading := r.leading
			r.mu.Unlock()
			if placed && leading {
				// A pass may have decided on the record before it (passes
				// take the watched one, see Watched).
				r.Enqueue(e.TraceContext(context.Background()), e.Key, "the haves record was deleted")
			}
			continue
		}
		if rec == nil {
			continue
		}
		r.mu.Lock()
		old, known := r.haves[e.Key]
		// A record written after the watch caught up is a change even
		// when it is the node's first.
		known = known || !initial
		r.haves[e.Key] = rec
		leading := r.leading
		_, placed := r.specs[e.Key]
		r.mu.Unlock()
		tctx := e.TraceContext(context.Background())
		need, urgent := needsPass(old, rec)
		switch {
		case !placed:
		case known && urgent:
			r.Enqueue(tctx, e.Key, "engine reported a failed attempt")
		case known && need:
			r.followUp(tctx, e.Key, "engine reported a change")
		case (!known || reported(rec) > reported(old)) && r.aboveHeld(ctx, e.Key, rec):
			r.Enqueue(tctx, e.Key, "engine reported a manifest revision above the held one")
		case !known && !leading:
			// The first record seen after a start: the full reconcile,
			// which starts with the tenure, covers it.
		case leading:
			// While leading the full reconcile may have passed this node
			// already: a record the watch delivers with its first values
			// (written while it caught up, an engine's first report after
			// a restart) would otherwise leave the status it wrote from
			// the record before until the next full visit.
			r.refreshStatus(tctx, e.Key)
		}
	}
	if ctx.Err() != nil {
		return nil
	}
	return errors.Join(errors.New("haves watch ended"), w.Err())
}

// refreshStatus rewrites a node's status from its assignment and the haves
// record just delivered, never beside a pass of the node: a refresh that
// read the assignment before a pass committed a new one would write, after
// the pass's status, a status of the old one. While a pass is queued it
// writes the status itself (passes take the watched record); while one
// runs (it may have decided on the record before) the node is passed over
// again after it; otherwise the node is held as running for the refresh.
func (r *Reconciler) refreshStatus(ctx context.Context, node string) {
	r.mu.Lock()
	_, pending := r.pending[node]
	running := r.running[node]
	if !pending && !running {
		r.running[node] = true
	}
	r.mu.Unlock()
	switch {
	case pending:
		return
	case running:
		r.Enqueue(ctx, node, "engine reported while its node was passed over")
		return
	}
	refresh := r.refresh
	if refresh == nil {
		refresh = r.cfg.Passer.RefreshStatus
	}
	if err := refresh(ctx, node); err != nil {
		r.cfg.Logger.Warn("refresh status", "node", node, "error", err)
	}
	r.mu.Lock()
	r.releaseLocked(node)
	r.mu.Unlock()
	r.wakeWorker()
}

// Lead runs passes while ctx (the lease tenure) lasts: a full reconcile at
// once, then the queue, renewals and the spread full reconcile.
func (r *Reconciler) Lead(ctx context.Context) {
	r.mu.Lock()
	r.leading = true
	r.mu.Unlock()
	defer func() {
		r.mu.Lock()
		r.leading = false
		r.mu.Unlock()
	}()
	r.fanOut(ctx, "full reconcile on taking the lease", r.Nodes())
	var wg sync.WaitGroup
	finishing := make(chan struct{}, r.cfg.Workers)
	for i := 0; i < r.cfg.Workers; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r.work(ctx, finishing, &wg)
		}()
	}
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			wg.Wait()
			return
		case <-t.C:
			r.visitDue()
		}
	}
}

// visitDue queues nodes whose next visit (renewal or the spread full
// reconcile) has come.
func (r *Reconciler) visitDue() {
	now := r.cfg.Now()
	var due []string
	r.mu.Lock()
	for node := range r.specs {
		next, ok := r.nextVisit[node]
		if ok && now.After(next) {
			due = append(due, node)
		}
	}
	for node := range r.undeleted {
		next, ok := r.nextVisit[node]
		switch {
		case r.specs[node] != nil:
			delete(r.undeleted, node) // put again: visited as any node
		case ok && now.After(next):
			due = append(due, node)
		}
	}
	r.mu.Unlock()
	slices.Sort(due)
	r.fanOut(context.Background(), "periodic visit", due)
}

func (r *Reconciler) next(ctx context.Context) (string, task, bool) {
	for {
		r.mu.Lock()
		if node, ok := r.popLocked(); ok {
			t := r.pending[node]
			delete(r.pending, node)
			r.running[node] = true
			r.mu.Unlock()
			return node, t, true
		}
		r.mu.Unlock()
		select {
		case <-ctx.Done():
			return "", task{}, false
		case <-r.wake:
		}
	}
}

// popLocked takes the next node to pass over: the queue's first, unless
// it is empty or the first follow-up waited followUpWait already.
func (r *Reconciler) popLocked() (string, bool) {
	for len(r.queue) > 0 || len(r.later) > 0 {
		list := &r.queue
		if len(r.later) > 0 {
			if len(r.queue) == 0 {
				list = &r.later
			} else if t, ok := r.pending[r.later[0]]; ok && t.followUp && r.cfg.Now().Sub(t.since) >= followUpWait {
				list = &r.later
			}
		}
		node := (*list)[0]
		*list = (*list)[1:]
		if t, ok := r.pending[node]; ok && t.followUp == (list == &r.later) {
			return node, true
		}
		// Passed over already, or moved to the other list.
	}
	return "", false
}

func (r *Reconciler) work(ctx context.Context, finishing chan struct{}, wg *sync.WaitGroup) {
	for {
		node, t, ok := r.next(ctx)
		if !ok {
			return
		}
		res, finish, err := r.runOne(ctx, node, t)
		if finish == nil {
			r.done(node, res, err)
			continue
		}
		// The assignment is committed: the node's status and prune go on
		// beside the next node's pass (the node stays running until they
		// are done), unless as many are going on as there are workers.
		select {
		case finishing <- struct{}{}:
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer func() { <-finishing }()
				finish()
				r.done(node, res, err)
			}()
		default:
			finish()
			r.done(node, res, err)
		}
	}
}

// done ends a node's pass: the node may be passed over again, and its next
// visit is scheduled.
func (r *Reconciler) done(node string, res *pass.Result, err error) {
	if r.cfg.OnPass != nil {
		r.cfg.OnPass(node, res, err)
	}
	r.mu.Lock()
	r.releaseLocked(node)
	r.scheduleLocked(node, res, err)
	if r.specs[node] == nil {
		// The pass of a node without a spec deletes what was derived for
		// it: one that failed is tried again when due (visitDue).
		if err != nil {
			r.undeleted[node] = true
		} else {
			delete(r.undeleted, node)
		}
	}
	r.mu.Unlock()
	r.wakeWorker()
}

// Visits after a failure: the first soon, then backing off to
// retryFailedMax, so a dependency that is down a moment (the signer
// restarting, a NATS leader election) costs a second, and one that stays
// down is not hammered. retryAfter is how soon, on average, a node is
// visited again while a registered fingerprint waits for its build (no
// catalog change announces that it is DONE).
const (
	retryFailedMin = time.Second
	retryFailedMax = 30 * time.Second
	retryAfter     = 30 * time.Second
)

// retryDelay is the mean delay before the visit after the n-th failed pass
// in a row (n ≥ 1).
func retryDelay(n int) time.Duration {
	d := retryFailedMin
	for i := 1; i < n && d < retryFailedMax; i++ {
		d *= 2
	}
	return min(d, retryFailedMax)
}

// scheduleLocked sets a node's next visit: the full reconcile, at a random
// point of the second half of the period so the fleet's visits spread out;
// the manifest's renewal time when sooner; soon after a failure, backing
// off while the failures go on; and every half minute or so while a module
// waits for its registered fingerprint's build to be DONE. Every soon visit
// is jittered (×0.5–1.5) so nodes that failed together do not come back
// together.
func (r *Reconciler) scheduleLocked(node string, res *pass.Result, err error) {
	now := r.cfg.Now()
	next := now.Add(time.Duration(float64(r.cfg.Period) * (0.5 + 0.5*rand.Float64())))
	if res != nil && !res.RenewAt.IsZero() && res.RenewAt.Before(next) {
		next = res.RenewAt
	}
	failed := err != nil || res == nil || res.Err != nil
	var soon time.Duration
	switch {
	case failed:
		r.failures[node]++
		soon = retryDelay(r.failures[node])
	case res.Waiting:
		delete(r.failures, node)
		soon = retryAfter
	default:
		delete(r.failures, node)
	}
	if soon > 0 {
		if at := now.Add(time.Duration(float64(soon) * (0.5 + rand.Float64()))); at.Before(next) {
			next = at
		}
	}
	r.nextVisit[node] = next
}

func (r *Reconciler) runOne(ctx context.Context, node string, t task) (*pass.Result, func(), error) {
	pctx := telemetry.ContextWithTraceparent(ctx, t.traceparent, t.tracestate)
	if !trace.SpanContextFromContext(pctx).IsValid() {
		pctx = ctx
	}
	r.mu.Lock()
	_, hasSpec := r.specs[node]
	r.mu.Unlock()
	var res *pass.Result
	var finish func()
	var err error
	if !hasSpec {
		err = r.cfg.Passer.DeleteNode(pctx, node)
	} else {
		res, finish, err = r.cfg.Passer.RunThenFinish(pctx, node)
		if errors.Is(err, pass.ErrNoSpec) {
			err = nil
		}
	}
	switch {
	case err != nil && res != nil:
		// With what the failed pass wrote all the same (DESIGN.md §5.2
		// step 6).
		r.cfg.Logger.Warn("pass failed", "node", node, "reason", t.reason, "error", err,
			"written", res.Written, "records", res.Records)
	case err != nil:
		r.cfg.Logger.Warn("pass failed", "node", node, "reason", t.reason, "error", err)
	}
	return res, finish, err
}
