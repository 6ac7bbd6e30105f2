package pass

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/protobuf/proto"

	"mesh.dev/internal/envelope"
	"mesh.dev/internal/lru"
	"mesh.dev/internal/names"
	"mesh.dev/internal/natsx"
	"mesh.dev/internal/telemetry"
	catalogv1 "mesh.dev/proto/mesh/catalog/v1"
	composerv1 "mesh.dev/proto/mesh/composer/v1"
	signerv1 "mesh.dev/proto/mesh/signer/v1"
	typev1 "mesh.dev/proto/mesh/type/v1"
	"mesh.dev/services/composer/internal/compose"
	"mesh.dev/services/composer/internal/store"
)

// Config is what a Passer needs.
type Config struct {
	Store     *store.Store
	Catalog   Catalog
	Signer    Signer
	Trust     Trust
	Lease     Lease
	Approvals Approvals
	// LeaseMargin is the lease time that must be left before a node is
	// written: one renewal interval.
	LeaseMargin time.Duration
	// ManifestLifetime is the signer's; renewals are planned from it when a
	// manifest's own times are unknown.
	Now    func() time.Time
	Tracer trace.Tracer
	Logger *slog.Logger
	// CASRetries bounds the re-reads after a CAS conflict on one key.
	CASRetries int
	// KeepPerModule is how many compositions of one module a node keeps
	// (besides those its wants or applied manifest name).
	KeepPerModule int
	// LastSeen, when set, tells when each engine was last heard.
	LastSeen LastSeen
	// ObjectTouched, when set, is told of every object digest a pass makes
	// sure is held, before it checks: the object sweep of this process
	// keeps an object a pass is about to name.
	ObjectTouched func(digest string)
	// Recompose, when set, asks for a pass of a node soon (of every node
	// when node is ""): the lease holder calls it when another writer
	// changed a node's assignment or compositions, or a bucket went back
	// to an older state (see FollowAssignments).
	Recompose func(node, reason string)
	// StoreWentBack, when set, is told that a bucket the passes write went
	// back to an older state, before the passes that follow are asked for
	// (the app has the catalog view read every registration again).
	StoreWentBack func(bucket string)
	// Watched, when set, returns a node's spec and haves record as the
	// composer's watches delivered them last (shared messages: the pass
	// copies what it takes, see watchedOf). A pass the reconciler runs
	// takes them from there: whatever is written after is delivered too,
	// and calls for a pass or a status of its own (a delete of the haves
	// of a node that has a spec calls for a pass; a node this composer
	// deleted lately is read from the buckets), so reading the bucket
	// again would only cost a round trip to the stream. A pass with plan
	// inputs to meet, and a part the watch holds no message of, reads the
	// bucket at the revision delivered or later, since the buckets answer
	// reads from any replica and one behind the write that called for the
	// pass would make the pass decide on what came before it.
	Watched func(node string) Watched
	// CatalogCaughtUp, when set, reports whether the catalog view holds
	// every registration; a pass refuses to run while it does not.
	CatalogCaughtUp func() bool
}

// Watched is what the composer's watches delivered last of a node: its
// spec and haves record and their revisions (0: none delivered, or
// deleted). A value that did not decode has its revision and no message.
type Watched struct {
	Spec     *composerv1.NodeSpec
	SpecRev  uint64
	Haves    *composerv1.HaveRecord
	HavesRev uint64
}

// Passer writes nodes.
type Passer struct {
	cfg      Config
	hooks    hooks
	verified verifyCache
	splits   splitCache
	// records and compositions mirror buckets composed and compositions
	// (see mirror).
	records, compositions *mirror
	// own are the writes this composer made lately; seen the highest
	// manifest revision seen of each node (see others.go).
	own  ownWrites
	seen seenRevisions
	// statuses are the statuses this composer wrote last (see
	// writtenStatuses).
	statuses writtenStatuses
	// assignments are the assignments as FollowAssignments last saw them.
	assignments watchedAssignments
	// objects are the object versions found to hash to their names;
	// repairs when each composition key was last repaired.
	objects objectChecks
	repairs repairTimes
}

// hooks let tests act between the steps of a pass (export_test.go sets
// them); all are nil outside tests.
type hooks struct {
	// beforeSign runs before the compositions of a node are signed.
	beforeSign func(keys []string)
	// beforeWrite runs before each CAS attempt of a composition.
	beforeWrite func(key string, attempt int)
	// beforeReread runs before the judgement record's follow loop reads
	// the composition again.
	beforeReread func(key string, follow int)
	// beforeCommit runs before the assignment's lease check and commit.
	beforeCommit func(node string)
}

// New returns a Passer.
func New(cfg Config) *Passer {
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Tracer == nil {
		cfg.Tracer = trace.NewNoopTracerProvider().Tracer("")
	}
	if cfg.CASRetries == 0 {
		cfg.CASRetries = 3
	}
	if cfg.KeepPerModule == 0 {
		cfg.KeepPerModule = 5
	}
	p := &Passer{cfg: cfg, records: newMirror("judgement record", recordSummary),
		compositions: newMirror("composition", compositionSummary), statuses: writtenStatuses{cache: lru.New[writtenStatus](statusCacheBytes)}}
	p.compositions.nodeOf = compositionNode
	p.compositions.onWrite = p.compositionWritten
	p.compositions.onResync = func() { p.storeWentBack(natsx.BucketCompositions) }
	return p
}

// Mode says whether a pass writes or only plans.
type Mode int

const (
	// Write signs and writes (lease holder only).
	Write Mode = iota
	// Plan computes what Write would do and writes nothing.
	Plan
)

// Composition is what a pass did (or would do) with one composition.
type Composition struct {
	Key    string
	Module string
	Digest string
	Judged compose.Judged
	Policy compose.Policy
	// Written is set when the held value differed (Plan: would differ).
	Written bool
	Err     error
}

// Result is the outcome of one node's pass.
type Result struct {
	Node         string
	Inputs       *composerv1.AssignmentInputs
	Compositions []*Composition
	Wants        []*typev1.Want
	Holds        []*composerv1.Hold
	Moved        []string
	// Changes is set when the assignment differs from the one held (Plan:
	// would differ).
	Changes bool
	// Committed is set when an assignment was written.
	Committed bool
	Manifest  *signerv1.SignedManifest
	// RenewAt is when the node's manifest is due for renewal.
	RenewAt time.Time
	// Waiting is set when a placed module waits for its registered
	// fingerprint's build to be DONE.
	Waiting bool
	// Err joins every error of the pass; Written and Records are the keys
	// it wrote all the same (DESIGN.md §5.2 step 6), in the order written:
	// compositions (a held composition rebuilt included) and judgement
	// records (written or deleted).
	Err     error
	Written []string
	Records []string
}

// ErrStale is returned by an Apply whose planned inputs moved.
var ErrStale = errors.New("the plan's inputs moved")

// ErrCatalogBehind is returned by a pass while the catalog view does not
// hold every registration (at start, and while it reads them again after
// the store went back).
var ErrCatalogBehind = errors.New("the catalog view is reading the registrations again; the pass is retried")

// ErrNoSpec is returned for a node without a spec.
var ErrNoSpec = errors.New("no node spec")

// ErrTenureEnded is returned when the lease tenure a Write pass started
// under ended before the pass wrote, even when this composer holds the
// lease again: what the pass read and judged belongs to the old tenure.
var ErrTenureEnded = errors.New("the lease tenure this pass started under ended")

// nodeState is everything a pass reads about a node before deciding.
type nodeState struct {
	spec       *composerv1.NodeSpec
	specRev    uint64
	assignment *composerv1.Assignment
	asgRev     uint64
	haves      *composerv1.HaveRecord
	havesRev   uint64
	// listed holds the node's module composition keys (<node>.*.*) that
	// held a message (value or marker) when the pass began, nil when the
	// listing failed; written the composition keys this pass wrote since,
	// in order, and writtenRev the revision of each write; records the
	// judgement record keys it wrote or deleted.
	listed     map[string]bool
	written    []string
	writtenRev map[string]uint64
	records    []string
	// mode is the pass's: a Plan rebuilds nothing.
	mode Mode
	// epoch is the fencing epoch of the lease tenure a Write pass started
	// under: every sign request of the pass carries it.
	epoch uint64
	// tenure is the lease epoch the pass's mirror barriers are taken in
	// (see mirror.current): a reconciler's Write pass's (RunThenFinish),
	// 0 for any other, whose barriers ask the stream each time.
	tenure uint64
	// corruptAssignment is set when the assignment held a value that does
	// not decode: it counts as present with no content (asgRev is its
	// revision, so the commit replaces it by CAS), and the wants the
	// engine reports applied stand in for its wants (recovered).
	corruptAssignment bool
	recovered         map[string]*typev1.Want
	// problems are what the pass met that the node's status reports
	// without failing the pass (a haves record that does not decode).
	problems []error
	// mirror says whether the composition mirror was current when the
	// pass began comparing: 0 not asked yet, 1 yes, 2 no.
	mirror int
	// approvals are the approvals as the pass began: every decision of
	// one pass (which writes are deferred, which moves the assigner lets
	// through) is made on the same ones. An approval that arrives meanwhile
	// queues a pass of its own.
	approvals []*composerv1.Approval
}

// wanted reports whether the held assignment wants a composition key at a
// digest.
func (st *nodeState) wanted(key, digest string) bool {
	for _, w := range st.assignment.GetWants() {
		if w.GetCompositionKey() == key && w.GetCompositionDigest() == digest {
			return true
		}
	}
	return false
}

// wrote notes a composition this pass wrote at rev.
func (st *nodeState) wrote(key string, rev uint64) {
	if st.writtenRev == nil {
		st.writtenRev = map[string]uint64{}
	}
	if _, ok := st.writtenRev[key]; !ok {
		st.written = append(st.written, key)
	}
	st.writtenRev[key] = rev
}

// recorded notes a judgement record this pass wrote or deleted.
func (st *nodeState) recorded(key string) {
	if !slices.Contains(st.records, key) {
		st.records = append(st.records, key)
	}
}

// prevWant is the want the node holds for a module: its assignment's, or,
// when the assignment does not decode, the one recovered from what the
// engine reports applied.
func (st *nodeState) prevWant(module string) *typev1.Want {
	if st.corruptAssignment {
		return st.recovered[module]
	}
	return wantOf(st.assignment, module)
}

// watchedOf returns what the watches delivered last of a node (its
// revisions, for reads at least that new) and whether its messages may
// stand in for reads: not for a node this composer deleted lately
// (DeleteNode), which may be re-created before the watches delivered the
// deletes, so what they hold may be the old node's.
func (p *Passer) watchedOf(node string) (Watched, bool) {
	if p.cfg.Watched == nil {
		return Watched{}, false
	}
	return p.cfg.Watched(node), !p.own.deletedLately(natsx.BucketHaves, node)
}

// read reads what a pass decides on; with watched set, the spec, haves
// record and assignment come from the watches when they hold them (see
// Config.Watched and watchedAssignment).
func (p *Passer) read(ctx context.Context, node string, watched bool) (*nodeState, error) {
	st := &nodeState{approvals: p.cfg.Approvals.Approvals()}
	w, usable := p.watchedOf(node)
	watched = watched && usable
	// The reads are independent: one round trip instead of three.
	var specErr, asgErr, havesErr error
	var wg sync.WaitGroup
	var asgWatched bool
	if watched {
		st.assignment, st.asgRev, asgWatched = p.watchedAssignment(node)
	}
	if !asgWatched {
		wg.Add(1)
		go func() {
			defer wg.Done()
			st.assignment, st.asgRev, asgErr = p.cfg.Store.Assignment(ctx, node)
		}()
	}
	if watched && w.Haves != nil {
		st.haves, st.havesRev = proto.CloneOf(w.Haves), w.HavesRev
	} else {
		wg.Add(1)
		go func() {
			defer wg.Done()
			st.haves, st.havesRev, havesErr = p.cfg.Store.HaveAtLeast(ctx, node, w.HavesRev)
		}()
	}
	if watched && w.Spec != nil {
		st.spec, st.specRev = proto.CloneOf(w.Spec), w.SpecRev
	} else {
		st.spec, st.specRev, specErr = p.cfg.Store.SpecAtLeast(ctx, node, w.SpecRev)
	}
	wg.Wait()
	if err := specErr; err != nil {
		if errors.Is(err, store.ErrNotFound) {
			return nil, fmt.Errorf("%w of %s", ErrNoSpec, node)
		}
		return nil, err
	}
	// A value that does not decode comes back with its revision and an
	// error; one that cannot be read, with revision 0.
	if err := asgErr; err != nil && !errors.Is(err, store.ErrNotFound) {
		if st.asgRev == 0 {
			return nil, fmt.Errorf("read assignment of %s: %w", node, err)
		}
		// Like a composition that does not decode: present with no
		// content, never trusted, re-derived and replaced by CAS at its
		// revision. The signer's own last revision of the node keeps the
		// new manifest's revision above any it signed before.
		st.assignment, st.corruptAssignment = nil, true
		p.cfg.Logger.WarnContext(ctx, "the assignment does not decode; re-deriving it", "node", node, "revision", st.asgRev, "error", err)
	}
	if err := havesErr; err != nil && !errors.Is(err, store.ErrNotFound) {
		if st.havesRev == 0 {
			return nil, fmt.Errorf("read haves of %s: %w", node, err)
		}
		// No haves known: judged as if the engine reported nothing, until
		// its next report replaces the record.
		st.haves = nil
		st.problems = append(st.problems, fmt.Errorf("the haves record of %s (r%d) does not decode (%v): judged as if the engine reported nothing until it reports again", node, st.havesRev, err))
	}
	return st, nil
}

// recoverWants stands in for the wants of an assignment that does not
// decode: each module the engine reports applied, at a fingerprint that is
// still usable, counts as wanted at the key and digest it applied, so a
// move the policy holds keeps the node on what it runs instead of dropping
// the module. The assigner still checks each is held and verifies.
func (p *Passer) recoverWants(ctx context.Context, st *nodeState) error {
	node := st.spec.GetNode()
	placed := map[string]bool{}
	for _, pm := range st.spec.GetModules() {
		placed[pm.GetModule()] = true
	}
	st.recovered = map[string]*typev1.Want{}
	for _, h := range st.haves.GetHaves() {
		m, ref := h.GetModule(), h.GetApplied()
		if !placed[m] || ref.GetDigest() == "" {
			continue
		}
		if key, err := names.CompositionKey(node, m, ref.GetFingerprint()); err != nil || key != ref.GetKey() {
			continue
		}
		_, build, why, err := p.usable(ctx, m, ref.GetFingerprint())
		if err != nil {
			return err
		}
		if why != "" {
			continue
		}
		st.recovered[m] = &typev1.Want{Module: m, Fingerprint: ref.GetFingerprint(), Parts: sortedParts(build.parts),
			CompositionKey: ref.GetKey(), CompositionDigest: ref.GetDigest()}
	}
	return nil
}

// wantOfKey returns the want naming a composition key, nil when none.
func wantOfKey(a *composerv1.Assignment, key string) *typev1.Want {
	for _, w := range a.GetWants() {
		if w.GetCompositionKey() == key {
			return w
		}
	}
	return nil
}

func wantOf(a *composerv1.Assignment, module string) *typev1.Want {
	for _, w := range a.GetWants() {
		if w.GetModule() == module {
			return w
		}
	}
	return nil
}

func appliedOf(h *composerv1.HaveRecord, module string) *composerv1.AppliedRef {
	for _, hv := range h.GetHaves() {
		if hv.GetModule() == module && hv.GetApplied().GetDigest() != "" {
			return hv.GetApplied()
		}
	}
	return nil
}

// Run passes over one node. In Write mode it requires the lease; with
// expect set (an Apply of a plan) it refuses with ErrStale when the node's
// inputs moved since the plan.
func (p *Passer) Run(ctx context.Context, node string, mode Mode, expect *composerv1.AssignmentInputs) (*Result, error) {
	ctx, span := p.cfg.Tracer.Start(ctx, "composer.pass.node", trace.WithAttributes(
		attribute.String("mesh.node", node), attribute.Bool("mesh.plan", mode == Plan)))
	defer span.End()
	res, err := p.run(ctx, node, mode, expect, nil)
	if err == nil && res != nil {
		err = res.Err
	}
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	return res, err
}

// RunThenFinish is a Write pass whose last steps, the node's status and
// prune (DESIGN.md §5.2 step 8), are left to finish, which the caller must
// call once (nil when there is nothing left). The assignment is committed
// when RunThenFinish returns, so the node's engine can go on meanwhile; the
// caller keeps the node from another pass until finish returned, and reads
// res.RenewAt only after it.
func (p *Passer) RunThenFinish(ctx context.Context, node string) (*Result, func(), error) {
	ctx, span := p.cfg.Tracer.Start(ctx, "composer.pass.node", trace.WithAttributes(
		attribute.String("mesh.node", node), attribute.Bool("mesh.plan", false)))
	defer span.End()
	var finish func()
	res, err := p.run(ctx, node, Write, nil, &finish)
	if err == nil && res != nil {
		err = res.Err
	}
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	return res, finish, err
}

func (p *Passer) run(ctx context.Context, node string, mode Mode, expect *composerv1.AssignmentInputs, later *func()) (*Result, error) {
	if p.cfg.CatalogCaughtUp != nil && !p.cfg.CatalogCaughtUp() {
		// A pass on a partial view would hold modules for want of a
		// registration, or compose one the catalog no longer has.
		return nil, ErrCatalogBehind
	}
	var epoch uint64
	if mode == Write {
		var err error
		if epoch, err = p.cfg.Lease.Check(p.cfg.LeaseMargin); err != nil {
			return nil, err
		}
	}
	// One listing of the node's keys serves the compare (a module key it
	// does not list is absent: no read, and the write is a Create, which
	// fails should the key appear meanwhile) and the prune. It needs only
	// the node's name, so it is asked beside the reads: of the composition
	// mirror, once it is current (it then lists what the stream leader
	// would), else of the stream leader.
	type listing struct {
		keys     []string
		err      error
		mirrored bool
	}
	var tenure uint64 // see nodeState.tenure
	if mode == Write && later != nil {
		tenure = epoch
	}
	listed := make(chan listing, 1)
	go func() {
		if p.compositions.current(ctx, p.cfg.Store.Compositions, tenure) {
			if keys, ok := p.compositions.keysOf(node); ok {
				listed <- listing{keys: keys, mirrored: true}
				return
			}
		}
		keys, err := p.cfg.Store.CompositionKeys(ctx, node)
		listed <- listing{keys: keys, err: err}
	}()
	// The reconciler's passes (RunThenFinish) decide on what its watches
	// delivered; a plan's, and its Apply's, on the buckets.
	st, err := p.read(ctx, node, later != nil)
	if err != nil {
		return nil, err
	}
	st.mode, st.epoch, st.tenure = mode, epoch, tenure
	res := &Result{Node: node}
	var errs []error
	fail := func(err error) {
		errs = append(errs, err)
	}
	// done ends a pass that commits asg (nil: nothing): status and prune
	// run after every Write pass, even a failing one.
	done := func(asg *composerv1.Assignment) (*Result, error) {
		res.Err = errors.Join(errs...)
		res.Written, res.Records = st.written, st.records
		if mode == Write && later != nil {
			*later = func() { p.finish(ctx, st, res, asg) }
		} else if mode == Write {
			p.finish(ctx, st, res, asg)
		}
		return res, nil
	}

	if st.corruptAssignment {
		if err := p.recoverWants(ctx, st); err != nil {
			fail(fmt.Errorf("node %s: %w", node, err))
			return done(nil)
		}
	}
	modules, fps, manifests, builds, fpHolds, err := p.resolve(ctx, st)
	if err != nil {
		fail(fmt.Errorf("node %s: %w", node, err))
		return done(nil)
	}
	for _, h := range fpHolds {
		res.Waiting = res.Waiting || h.waiting
	}
	res.Inputs = &composerv1.AssignmentInputs{SpecRevision: st.specRev, Fingerprints: fps, HavesRevision: st.havesRev, AssignmentRevision: st.asgRev}
	if expect != nil && !sameInputs(expect, res.Inputs) {
		return res, fmt.Errorf("%w for node %s: planned spec r%d, haves r%d, assignment r%d, fingerprints %v; now r%d, r%d, r%d, %v",
			ErrStale, node, expect.GetSpecRevision(), expect.GetHavesRevision(), expect.GetAssignmentRevision(), expect.GetFingerprints(),
			st.specRev, st.havesRev, st.asgRev, fps)
	}

	split, err := p.split(st, fps, modules, manifests)
	if err != nil {
		fail(err)
		return done(nil)
	}
	res.Moved = split.Moved

	keys := make([]string, 0, len(split.Compositions))
	for k := range split.Compositions {
		if k != names.NodeKey(node) {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	keys = append(keys, names.NodeKey(node))

	if l := <-listed; l.err == nil {
		st.listed = make(map[string]bool, len(l.keys))
		for _, k := range l.keys {
			st.listed[k] = true
		}
		// The compare looks the keys up in the mirror found current, and
		// does not ask again of one found behind.
		st.mirror = 2
		if l.mirrored {
			st.mirror = 1
		}
	} else {
		p.cfg.Logger.WarnContext(ctx, "list the node's compositions; reading each", "node", node, "error", l.err)
	}
	work := p.prepare(ctx, node, keys, split.Compositions, st)
	jc := p.judging(ctx, st, work, manifests)
	if expect != nil {
		// Every input of the plan is checked before anything is written:
		// the approvals it counted on are decided as the commit would.
		if approvals, ok := p.approvalsNow(ctx, st, work, jc, builds, fpHolds); ok && !slices.Equal(expect.GetApprovals(), approvals) {
			return res, staleApprovals(node, expect.GetApprovals(), approvals)
		}
	}
	if mode == Write {
		p.write(ctx, st, work, jc, builds, fpHolds, fail)
	} else {
		for _, it := range work {
			if it.err != nil {
				fail(it.err)
				continue
			}
			jc.judge(ctx, it)
		}
	}
	for _, w := range work {
		res.Compositions = append(res.Compositions, &Composition{Key: w.key, Module: w.comp.GetModule(), Digest: w.digest,
			Judged: w.judged, Policy: w.policy, Written: w.differs, Err: w.err})
	}
	if len(errs) > 0 {
		return done(nil)
	}

	wants, holds, approvals, err := p.assign(ctx, st, work, builds, fpHolds)
	if err != nil {
		fail(err)
		return done(nil)
	}
	res.Inputs.Approvals = approvals
	if expect != nil && !slices.Equal(expect.GetApprovals(), approvals) {
		// The assigner decided otherwise after the writes than before
		// them (the pass decides on the approvals it began with, but a
		// held composition may have gone meanwhile): those writes stand
		// (derived, and the next pass keeps them), the assignment is not
		// committed.
		p.finish(ctx, st, res, nil)
		return res, staleApprovals(node, expect.GetApprovals(), approvals)
	}
	res.Wants, res.Holds = wants, holds
	changes, resign := p.needsCommit(st, wants, holds, split.Moved)
	res.Changes = changes || resign
	if mode == Plan || !res.Changes {
		return done(st.assignment)
	}
	if gone := revokedSince(approvals, p.cfg.Approvals.Approvals()); len(gone) > 0 {
		// The pass decided on the approvals it began with; one it moves
		// a module on was revoked while it wrote. Its writes stand
		// (derived); the move is not committed: an Apply is stale, and
		// a reconciler's pass fails and is tried again soon, deciding on
		// the approvals as they are then.
		if err := p.putBackWanted(ctx, st, work); err != nil {
			fail(err)
		}
		if expect != nil {
			p.finish(ctx, st, res, nil)
			return res, staleApprovals(node, expect.GetApprovals(), slices.DeleteFunc(slices.Clone(approvals), func(id string) bool { return slices.Contains(gone, id) }))
		}
		fail(fmt.Errorf("node %s: approval %s, which this pass moves on, was revoked while it wrote: not committed", node, strings.Join(gone, ", ")))
		return done(nil)
	}
	asg, err := p.commit(ctx, st, wants, holds, split.Moved, res.Inputs, resign)
	if err != nil {
		fail(err)
		return done(nil)
	}
	res.Committed = true
	return done(asg)
}

// stillHolds checks, before a Write pass writes, that this composer still
// holds the lease with the margin left and in the tenure the pass started
// under.
func (p *Passer) stillHolds(st *nodeState) error {
	epoch, err := p.cfg.Lease.Check(p.cfg.LeaseMargin)
	if err != nil {
		return err
	}
	if epoch != st.epoch {
		return fmt.Errorf("%w (epoch %d; the lease is held in epoch %d now)", ErrTenureEnded, st.epoch, epoch)
	}
	return nil
}

// approvalsNow decides, without writing, which approvals the node's wants
// would use now (what the commit records as an input): the compositions
// are judged and assigned as a Plan does. ok is false when the assigner
// cannot decide (the pass fails on the same error without committing).
func (p *Passer) approvalsNow(ctx context.Context, st *nodeState, work []*item, jc *judging, builds map[string]*catalogBuild, fpHolds []fpHold) ([]string, bool) {
	_, approvals, err := p.planAssign(ctx, st, work, jc, builds, fpHolds)
	return approvals, err == nil
}

// revokedSince returns the ids of used that current no longer holds.
func revokedSince(used []string, current []*composerv1.Approval) []string {
	var gone []string
	for _, id := range used {
		if !slices.ContainsFunc(current, func(a *composerv1.Approval) bool { return a.GetId() == id }) {
			gone = append(gone, id)
		}
	}
	return gone
}

// staleApprovals is the ErrStale of an Apply whose approvals moved: an
// approval the plan counted on went, or a new one lets a move through that
// the plan did not show.
func staleApprovals(node string, planned, now []string) error {
	return fmt.Errorf("%w for node %s: planned with approvals %v, now %v", ErrStale, node, planned, now)
}

func sameInputs(a, b *composerv1.AssignmentInputs) bool {
	return a.GetSpecRevision() == b.GetSpecRevision() && a.GetHavesRevision() == b.GetHavesRevision() &&
		a.GetAssignmentRevision() == b.GetAssignmentRevision() && maps2Equal(a.GetFingerprints(), b.GetFingerprints())
}

func maps2Equal(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

// fpHold is why a placed module does not run at its registered fingerprint.
type fpHold struct {
	module, fingerprint, reason string
	// waiting is set when the build is not DONE yet (it may still be).
	waiting bool
}

// resolve picks, for each placed module, the fingerprint the node composes
// it at: the registered one when its entry is of the module, its verdict not
// FAIL and its build DONE; otherwise the fingerprint the node wants now if
// that one still is; otherwise none (the module is listed as held).
func (p *Passer) resolve(ctx context.Context, st *nodeState) (map[string]compose.Module, map[string]string, map[string]*typev1.ModuleManifest, map[string]*catalogBuild, []fpHold, error) {
	modules := map[string]compose.Module{}
	fps := map[string]string{}
	manifests := map[string]*typev1.ModuleManifest{}
	builds := map[string]*catalogBuild{}
	var holds []fpHold
	for _, pm := range st.spec.GetModules() {
		m := pm.GetModule()
		var registered string
		if reg, ok := p.cfg.Catalog.Registration(m); ok {
			registered = reg.GetFingerprint()
		}
		rel, build, why, err := p.usable(ctx, m, registered)
		if err != nil {
			return nil, nil, nil, nil, nil, err
		}
		waiting := why != "" && build == nil && rel == nil && names.HasFingerprint(registered) && p.buildPending(ctx, registered)
		fp := registered
		if why != "" {
			prev := st.prevWant(m)
			fp = ""
			if prev != nil && prev.GetFingerprint() != registered {
				prel, pbuild, pwhy, perr := p.usable(ctx, m, prev.GetFingerprint())
				if perr != nil {
					return nil, nil, nil, nil, nil, perr
				}
				if pwhy == "" {
					fp, rel, build = prev.GetFingerprint(), prel, pbuild
					why += "; keeping " + prev.GetFingerprint()
				}
			}
			holds = append(holds, fpHold{module: m, fingerprint: registered, reason: why, waiting: waiting})
		}
		if fp == "" {
			continue
		}
		modules[m] = compose.Module{Fingerprint: fp, Manifest: rel.Manifest}
		fps[m] = fp
		manifests[m] = rel.Manifest
		builds[m] = build
	}
	return modules, fps, manifests, builds, holds, nil
}

// buildPending reports whether a fingerprint's build may still become DONE:
// there is none yet, or it is PENDING.
func (p *Passer) buildPending(ctx context.Context, fp string) bool {
	b, err := p.cfg.Catalog.Build(ctx, fp)
	if errors.Is(err, ErrNoBuild) {
		return true
	}
	return err == nil && b.GetState() == catalogv1.BuildState_BUILD_STATE_PENDING
}

// catalogBuild is a module's release as the assigner needs it.
type catalogBuild struct {
	fingerprint string
	parts       []*typev1.Artifact
	manifest    *typev1.ModuleManifest
}

// usable says why a fingerprint cannot be composed for a module ("" when it
// can); an error only when the catalog could not be asked.
func (p *Passer) usable(ctx context.Context, module, fp string) (*Release, *catalogBuild, string, error) {
	if !names.HasFingerprint(fp) {
		return nil, nil, "no registered fingerprint", nil
	}
	rel, err := p.cfg.Catalog.Entry(ctx, fp)
	if errors.Is(err, ErrNoEntry) {
		return nil, nil, "the catalog holds no entry of " + fp, nil
	}
	if err != nil {
		return nil, nil, "", err
	}
	if rel.Entry.GetModule() != module {
		return nil, nil, fmt.Sprintf("%s is an entry of module %s", fp, rel.Entry.GetModule()), nil
	}
	if rel.Entry.GetVerdict() == catalogv1.Verdict_VERDICT_FAIL {
		return nil, nil, fmt.Sprintf("entry %s has verdict FAIL", fp), nil
	}
	b, err := p.cfg.Catalog.Build(ctx, fp)
	if errors.Is(err, ErrNoBuild) {
		return nil, nil, "no build of " + fp + " yet", nil
	}
	if err != nil {
		return nil, nil, "", err
	}
	if b.GetState() != catalogv1.BuildState_BUILD_STATE_DONE {
		return nil, nil, fmt.Sprintf("the build of %s is %s", fp, stateWord(b.GetState().String())), nil
	}
	return rel, &catalogBuild{fingerprint: fp, parts: b.GetArtifacts(), manifest: rel.Manifest}, "", nil
}

func stateWord(s string) string {
	if i := len("BUILD_STATE_"); len(s) > i {
		return s[i:]
	}
	return s
}

// renewAt is when a manifest is renewed: once less than half its lifetime
// is left, at a point in the next quarter (DESIGN.md §5.4). The point is
// drawn from a hash of the node and the manifest's revision, not at random:
// across a fleet it is spread evenly over the quarter, as a random point
// would be, but for one manifest it is the same at every pass and on every
// replica. So it needs no storage; passes that compute it again neither move
// it nor make an early renewal likelier (a fresh draw at each pass would:
// the first pass past any draw renews); and a new lease holder renews at the
// point its predecessor planned.
func renewAt(node string, m *typev1.Manifest) time.Time {
	issued, expires := m.GetIssuedAt().AsTime(), m.GetExpiresAt().AsTime()
	life := expires.Sub(issued)
	h := fnv.New64a()
	fmt.Fprintf(h, "%s/%d", node, m.GetRevision())
	frac := float64(h.Sum64()%10000) / 10000
	return issued.Add(time.Duration(float64(life) * (0.5 + 0.25*frac)))
}

// needsCommit says whether the wants or holds differ from the held
// assignment (changes), or the manifest must be signed again although they do
// not (renewal, a revision conflict the engine reported, a newer keyset).
func (p *Passer) needsCommit(st *nodeState, wants []*typev1.Want, holds []*composerv1.Hold, moved []string) (changes, resign bool) {
	a := st.assignment
	if a == nil {
		// None yet, or one that does not decode.
		return true, true
	}
	if !wantsEqual(a.GetWants(), wants) {
		return true, true
	}
	if !holdsEqual(a.GetHolds(), holds) || !slices.Equal(a.GetMoved(), moved) {
		changes = true
	}
	m := &typev1.Manifest{}
	if err := envelope.Open(a.GetManifest(), typev1.PayloadType_PAYLOAD_TYPE_MANIFEST, m); err != nil {
		return changes, true
	}
	now := p.cfg.Now()
	if !now.Before(renewAt(st.spec.GetNode(), m)) {
		return changes, true
	}
	if p.refusedRepaired(st, m) {
		return changes, true
	}
	if ring := p.cfg.Trust.Keyring(); ring != nil && m.GetKeysetVersion() < ring.Version() {
		return changes, true
	}
	if a.GetManifest().GetSignatures() == nil || a.GetManifest().GetSignatures()[0].GetKeyId() != p.cfg.Trust.SigningKeyID() {
		return changes, true
	}
	h := st.haves
	if reportedRevision(h) > a.GetManifestRevision() {
		return changes, true
	}
	if p.seen.highest(st.spec.GetNode()) > a.GetManifestRevision() {
		// A manifest above the held one was in this bucket (the store went
		// back, or an old assignment was written over the current one):
		// an engine may run it, and would refuse the held one.
		return changes, true
	}
	// A revision conflict the engine reports (a revision at or below its
	// high-water, or equal to it with another digest) is answered once: by
	// a manifest above the high-water it reported. Once the held revision
	// is above it, the report is older than the held manifest and stands
	// only until the engine reports again — an engine offline for a while
	// does not get a new revision every pass.
	if reportedRevision(h) >= a.GetManifestRevision() && h.GetApplied().GetDigest() != a.GetManifestDigest() {
		for _, hv := range h.GetHaves() {
			if hv.GetAttempt().GetReasonCode() == composerv1.ReasonCode_REASON_CODE_REVISION_CONFLICT &&
				hv.GetAttempt().GetState() == composerv1.AttemptState_ATTEMPT_STATE_FAILED {
				return changes, true
			}
		}
	}
	return changes, false
}

// refusedRepaired reports whether the engine reports a FAILED attempt at a
// composition the held manifest names that this composer repaired (wrote
// again at the digest named, or put an object of again) after the manifest
// was issued. The wants do not change, so no new manifest would go out, and
// the engine would try again only at its next drift pass: the manifest is
// signed again so it tries now. Once it is, the repair is older than the
// manifest and the report is answered.
func (p *Passer) refusedRepaired(st *nodeState, m *typev1.Manifest) bool {
	issued := m.GetIssuedAt().AsTime()
	for _, hv := range st.haves.GetHaves() {
		a := hv.GetAttempt()
		if a.GetState() != composerv1.AttemptState_ATTEMPT_STATE_FAILED || wantOfKey(st.assignment, a.GetKey()) == nil {
			continue
		}
		if at, ok := p.repairs.last(a.GetKey()); ok && at.After(issued) {
			return true
		}
	}
	return false
}

func wantsEqual(a, b []*typev1.Want) bool {
	return slices.EqualFunc(a, b, func(x, y *typev1.Want) bool { return proto.Equal(x, y) })
}

func holdsEqual(a, b []*composerv1.Hold) bool {
	return slices.EqualFunc(a, b, func(x, y *composerv1.Hold) bool { return proto.Equal(x, y) })
}

// commit signs the node's manifest (when needed) and writes its assignment
// with one CAS: the commit point. Every composition the wants name is held
// (checked by assign).
func (p *Passer) commit(ctx context.Context, st *nodeState, wants []*typev1.Want, holds []*composerv1.Hold, moved []string, inputs *composerv1.AssignmentInputs, sign bool) (*composerv1.Assignment, error) {
	node := st.spec.GetNode()
	if p.hooks.beforeCommit != nil {
		p.hooks.beforeCommit(node)
	}
	if err := p.stillHolds(st); err != nil {
		return nil, fmt.Errorf("%s: assignment not committed: %w", node, err)
	}
	a := &composerv1.Assignment{Node: node, Wants: wants, Holds: holds, Inputs: inputs, Moved: moved}
	if sign || st.assignment == nil {
		floor := max(st.assignment.GetManifestRevision(), reportedRevision(st.haves), p.seen.highest(node)) + 1
		tp, ts := telemetry.Traceparent(ctx)
		signed, err := p.cfg.Signer.SignManifests(ctx, st.epoch, []*signerv1.ManifestItem{{Node: node, RevisionFloor: floor, Wants: wants, Traceparent: tp, Tracestate: ts}})
		if err != nil {
			return nil, fmt.Errorf("%s: sign manifest: %w", node, err)
		}
		sm := signed[0]
		if p.signerAhead(sm.GetItem().GetEnvelope()) {
			p.cfg.Trust.Stale()
		}
		a.Manifest, a.ManifestDigest, a.ManifestRevision, a.ManifestExpiresAt = sm.GetItem().GetEnvelope(), sm.GetItem().GetDigest(), sm.GetRevision(), sm.GetExpiresAt()
	} else {
		a.Manifest, a.ManifestDigest, a.ManifestRevision, a.ManifestExpiresAt = st.assignment.GetManifest(), st.assignment.GetManifestDigest(), st.assignment.GetManifestRevision(), st.assignment.GetManifestExpiresAt()
	}
	wctx, span := p.cfg.Tracer.Start(ctx, "composer.write.assignment", trace.WithAttributes(
		attribute.String("mesh.node", node), attribute.Int64("mesh.manifest_revision", int64(a.GetManifestRevision()))))
	defer span.End()
	rev, err := p.cfg.Store.WriteAssignment(wctx, a, st.asgRev)
	if err != nil {
		err = fmt.Errorf("%s: commit assignment at revision %d: %w", node, st.asgRev, err)
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
		return nil, err
	}
	p.own.wrote(natsx.BucketAssignments, node, rev, false)
	p.seen.saw(node, a.GetManifestRevision())
	return a, nil
}

// finish records status and prunes; both run after every Write pass, even a
// failing one.
func (p *Passer) finish(ctx context.Context, st *nodeState, res *Result, asg *composerv1.Assignment) {
	if err := p.stillHolds(st); err != nil {
		// Status and prune are writes too (a prune deletes compositions):
		// only the holder makes them.
		p.cfg.Logger.WarnContext(ctx, "status and prune skipped: the lease is no longer held", "node", res.Node, "error", err)
		return
	}
	if asg == nil {
		asg = st.assignment
	}
	m := &typev1.Manifest{}
	if asg != nil && envelope.Open(asg.GetManifest(), typev1.PayloadType_PAYLOAD_TYPE_MANIFEST, m) == nil {
		res.RenewAt = renewAt(res.Node, m)
	}
	if err := p.writeStatus(ctx, st, res, asg); err != nil {
		p.cfg.Logger.WarnContext(ctx, "write status", "node", res.Node, "error", err)
	}
	if err := p.prune(ctx, res.Node, asg, st); err != nil {
		p.cfg.Logger.WarnContext(ctx, "prune", "node", res.Node, "error", err)
	}
}

// DeleteNode removes what the composer derived for a node whose spec is gone:
// its assignment (so no manifest is served any more), its compositions and
// their judgement records, its haves and its status. The signer keeps the
// node's revision, so a node re-created later never goes backwards.
func (p *Passer) DeleteNode(ctx context.Context, node string) error {
	if _, err := p.cfg.Lease.Check(p.cfg.LeaseMargin); err != nil {
		return err
	}
	if _, _, err := p.cfg.Store.Spec(ctx, node); err == nil {
		return nil
	}
	p.splits.drop(node)
	var errs []error
	del := func(kv *natsx.KV, key string) {
		p.own.wrote(kv.Bucket(), key, 0, true)
		if err := kv.Delete(ctx, key); err != nil && !errors.Is(err, store.ErrNotFound) {
			errs = append(errs, err)
		}
	}
	del(p.cfg.Store.Assignments, node)
	keys, err := p.cfg.Store.Compositions.ListKeys(ctx, node+".>")
	if err != nil {
		errs = append(errs, err)
	}
	for _, k := range keys {
		if kk, err := names.ParseCompositionKey(k); err != nil || kk.Node != node {
			continue
		}
		del(p.cfg.Store.Composed, k)
		del(p.cfg.Store.Compositions, k)
	}
	del(p.cfg.Store.Haves, node)
	p.statuses.forget(node)
	del(p.cfg.Store.Status, node)
	return errors.Join(errs...)
}

// Declaration renders a node's declaration with the fingerprints a pass
// would use now.
func (p *Passer) Declaration(ctx context.Context, spec *composerv1.NodeSpec) (*composerv1.Declaration, error) {
	st := &nodeState{spec: spec}
	var rev uint64
	var err error
	if st.assignment, rev, err = p.cfg.Store.Assignment(ctx, spec.GetNode()); err != nil && !errors.Is(err, store.ErrNotFound) && rev == 0 {
		return nil, err
	}
	modules, _, _, _, _, err := p.resolve(ctx, st)
	if err != nil {
		return nil, err
	}
	return compose.Declare(spec, modules)
}

// signerAhead reports whether a manifest the signer just signed names a
// keyset version above the one this composer holds, or a key it does not
// list: engines are sent the keyset in their streams, so it must be taken
// (and published) before they get manifests it verifies.
func (p *Passer) signerAhead(env *typev1.Envelope) bool {
	ring := p.cfg.Trust.Keyring()
	if ring == nil {
		return true
	}
	m := &typev1.Manifest{}
	if err := envelope.Open(env, typev1.PayloadType_PAYLOAD_TYPE_MANIFEST, m); err == nil && m.GetKeysetVersion() > ring.Version() {
		return true
	}
	return !ring.ListsSigners(env)
}

// reportedRevision is the highest manifest revision an engine reported:
// its high-water or its applied revision, whichever is higher (an engine
// keeps the first at least the second, but its kept state may have been
// reset). The floor of the next manifest is above it (DESIGN.md §6 step 4).
func reportedRevision(h *composerv1.HaveRecord) uint64 {
	return max(h.GetHighWater(), h.GetApplied().GetRevision())
}
