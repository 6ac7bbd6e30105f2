package faults

import (
	"bufio"
	"context"
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"

	"mesh.dev/internal/envelope"
	"mesh.dev/internal/natsx"
	composerv1 "mesh.dev/proto/mesh/composer/v1"
	typev1 "mesh.dev/proto/mesh/type/v1"
)

// Skew is the clock skew DESIGN.md §7 lets an engine allow when it judges
// a manifest's expiry; MaxAhead how far ahead of its clock a manifest may be
// issued.
const (
	Skew     = time.Hour
	MaxAhead = 24 * time.Hour
)

// Recorder records what JetStream acknowledged (every assignment and
// composition write it stored, seen through watches) and what every engine
// committed (its commit log), and checks the invariants over them.
type Recorder struct {
	t *testing.T
	m *Mesh

	mu sync.Mutex
	// manifests are the signed manifests JetStream acknowledged, by digest.
	manifests map[string]ackedManifest
	// compositions are the composition digests JetStream acknowledged.
	compositions map[string]string
	// writes counts the acknowledged writes seen, by bucket.
	writes map[string]int
	// injected holds the composition keys and object names the harness
	// wrote bad bytes into, until the mesh repairs them: what the harness
	// broke on purpose is not counted as missing.
	injected map[string]bool
	// failed are the FAILED attempts engines reported (bucket haves).
	failed     []Failure
	failedSeen map[string]bool
	// stale are the STALE attempts engines reported (an engine that
	// refused a manifest for an expired or revoked signature says so).
	stale   []Failure
	engines []*engineTrack
	// commitsMu serializes reading the commit logs (the loop, Final and
	// Applied all read them).
	commitsMu sync.Mutex
	// violations of the invariants, in the order found.
	violations []string
	// checked counts what the checker judged.
	checked struct{ manifests, compositions, keysets, currentChecks int }

	cancelWatch context.CancelFunc
	watchWG     sync.WaitGroup
	stopCh      chan struct{}
	loopWG      sync.WaitGroup
	stopped     bool
}

type ackedManifest struct {
	node     string
	revision uint64
	env      *typev1.Envelope
}

// engineTrack is what the checker knows of one engine's commits.
type engineTrack struct {
	e      *Engine
	offset int64
	// ring is the keyset the engine took last, verified against the roots.
	ring *keyring
	// manifest is the manifest the engine applied last, its digest and
	// revision; applied the digest of each module's applied composition.
	manifest *typev1.Manifest
	digest   string
	applied  map[string]string
}

// NewRecorder starts the watches and the checker's loops.
func NewRecorder(t *testing.T, m *Mesh) *Recorder {
	r := &Recorder{t: t, m: m, manifests: map[string]ackedManifest{}, compositions: map[string]string{},
		writes: map[string]int{}, injected: map[string]bool{}, failedSeen: map[string]bool{}, stopCh: make(chan struct{})}
	r.Rewatch()
	r.loopWG.Add(2)
	go r.loop(200*time.Millisecond, r.readCommits)
	go r.loop(300*time.Millisecond, func() { r.checkCurrent(false) })
	return r
}

func (r *Recorder) loop(every time.Duration, fn func()) {
	defer r.loopWG.Done()
	tick := time.NewTicker(every)
	defer tick.Stop()
	for {
		select {
		case <-r.stopCh:
			return
		case <-tick.C:
			fn()
		}
	}
}

func (r *Recorder) stop() {
	r.mu.Lock()
	if r.stopped {
		r.mu.Unlock()
		return
	}
	r.stopped = true
	r.mu.Unlock()
	close(r.stopCh)
	r.loopWG.Wait()
	if r.cancelWatch != nil {
		r.cancelWatch()
	}
	r.watchWG.Wait()
}

// Rewatch (re)starts the watches of the assignments and compositions
// buckets; after a restart of nats-server, and above all after its store
// went back to an older snapshot, a watch is started afresh.
func (r *Recorder) Rewatch() {
	if r.cancelWatch != nil {
		r.cancelWatch()
		r.watchWG.Wait()
	}
	ctx, cancel := context.WithCancel(context.Background())
	r.cancelWatch = cancel
	for _, b := range []string{natsx.BucketAssignments, natsx.BucketCompositions, natsx.BucketHaves} {
		r.watchWG.Add(1)
		go r.watch(ctx, b)
	}
}

// watch records every value a bucket stores, re-creating its watcher
// whenever it ends.
func (r *Recorder) watch(ctx context.Context, bucket string) {
	defer r.watchWG.Done()
	for ctx.Err() == nil {
		kv, err := r.m.JS.KeyValue(ctx, bucket)
		if err != nil {
			sleepCtx(ctx, 200*time.Millisecond)
			continue
		}
		w, err := kv.WatchAll(ctx, jetstream.IgnoreDeletes())
		if err != nil {
			sleepCtx(ctx, 200*time.Millisecond)
			continue
		}
		for e := range w.Updates() {
			if e == nil {
				continue
			}
			r.recordWrite(bucket, e)
		}
		w.Stop()
		sleepCtx(ctx, 100*time.Millisecond)
	}
}

func sleepCtx(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}

func (r *Recorder) recordWrite(bucket string, e jetstream.KeyValueEntry) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.writes[bucket]++
	switch bucket {
	case natsx.BucketAssignments:
		a := &composerv1.Assignment{}
		if proto.Unmarshal(e.Value(), a) == nil && a.GetManifest() != nil {
			r.manifests[envelope.Digest(a.GetManifest())] = ackedManifest{node: a.GetNode(), revision: a.GetManifestRevision(), env: a.GetManifest()}
		}
	case natsx.BucketCompositions:
		env := &typev1.Envelope{}
		if proto.Unmarshal(e.Value(), env) == nil && len(env.GetPayload()) > 0 {
			r.compositions[envelope.Digest(env)] = e.Key()
		}
	case natsx.BucketHaves:
		h := &composerv1.HaveRecord{}
		if proto.Unmarshal(e.Value(), h) != nil {
			return
		}
		for _, have := range h.GetHaves() {
			a := have.GetAttempt()
			if a.GetState() == composerv1.AttemptState_ATTEMPT_STATE_FAILED {
				key := fmt.Sprintf("%s/%s/%s/%v", h.GetNode(), have.GetModule(), a.GetDigest(), a.GetReasonCode())
				if !r.failedSeen[key] {
					r.failedSeen[key] = true
					r.failed = append(r.failed, Failure{At: time.Now(), Node: h.GetNode(), Module: have.GetModule(), Code: a.GetReasonCode(), Reason: a.GetReason()})
				}
			}
			if a.GetState() == composerv1.AttemptState_ATTEMPT_STATE_STALE {
				key := fmt.Sprintf("stale %s/%s/%s/%v/%s", h.GetNode(), have.GetModule(), a.GetDigest(), a.GetReasonCode(), a.GetReason())
				if !r.failedSeen[key] {
					r.failedSeen[key] = true
					r.stale = append(r.stale, Failure{At: time.Now(), Node: h.GetNode(), Module: have.GetModule(), Code: a.GetReasonCode(), Reason: a.GetReason()})
				}
			}
		}
	}
}

// Failure is a FAILED attempt an engine reported.
type Failure struct {
	At           time.Time
	Node, Module string
	Code         composerv1.ReasonCode
	Reason       string
}

func (f Failure) String() string {
	return fmt.Sprintf("%s %s: %v %s", f.Node, f.Module, f.Code, f.Reason)
}

// FailedSince returns the FAILED attempts reported since t.
func (r *Recorder) FailedSince(t time.Time) []Failure {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []Failure
	for _, f := range r.failed {
		if !f.At.Before(t) {
			out = append(out, f)
		}
	}
	return out
}

// RefusedSince returns the FAILED and STALE attempts reported since t.
func (r *Recorder) RefusedSince(t time.Time) []Failure {
	out := r.FailedSince(t)
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, f := range r.stale {
		if !f.At.Before(t) {
			out = append(out, f)
		}
	}
	return out
}

// Written reports whether JetStream acknowledged a composition of digest d.
func (r *Recorder) Written(d string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	_, ok := r.compositions[d]
	return ok
}

// Inject marks a composition key or object name as holding bad bytes the
// harness wrote; Repaired clears it once the mesh put it right.
func (r *Recorder) Inject(name string) {
	r.mu.Lock()
	r.injected[name] = true
	r.mu.Unlock()
}

// Repaired clears an injected mark.
func (r *Recorder) Repaired(name string) {
	r.mu.Lock()
	delete(r.injected, name)
	r.mu.Unlock()
}

func (r *Recorder) violate(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	r.mu.Lock()
	r.violations = append(r.violations, msg)
	r.mu.Unlock()
}

// Violations returns the violations found so far.
func (r *Recorder) Violations() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.violations...)
}

func (r *Recorder) watchEngine(e *Engine) {
	r.mu.Lock()
	r.engines = append(r.engines, &engineTrack{e: e, applied: map[string]string{}})
	r.mu.Unlock()
}

// readCommits reads every complete new line of every engine's commit log
// and judges it (invariants 2 and 3).
func (r *Recorder) readCommits() {
	r.commitsMu.Lock()
	defer r.commitsMu.Unlock()
	r.mu.Lock()
	engines := append([]*engineTrack(nil), r.engines...)
	r.mu.Unlock()
	for _, tr := range engines {
		r.readEngine(tr)
	}
}

func (r *Recorder) readEngine(tr *engineTrack) {
	f, err := os.Open(tr.e.Commits)
	if err != nil {
		return
	}
	defer f.Close()
	if _, err := f.Seek(tr.offset, io.SeekStart); err != nil {
		return
	}
	br := bufio.NewReader(f)
	for {
		line, err := br.ReadBytes('\n')
		if err != nil {
			// A line without its newline is a write still under way (or
			// cut by a kill): it is read again next time.
			return
		}
		tr.offset += int64(len(line))
		var rec commitRecord
		if err := json.Unmarshal(line, &rec); err != nil {
			r.violate("engine %s: commit log line does not decode: %v", tr.e.Node, err)
			continue
		}
		r.judge(tr, rec)
	}
}

// judge checks one commit of an engine apart from the engine: the keyset
// against the pinned roots; the manifest's signature, node, expiry and
// revision order; each composition's digest against the manifest,
// signature, node, module and fingerprint.
func (r *Recorder) judge(tr *engineTrack, rec commitRecord) {
	node := tr.e.Node
	// The engine judges time by its own clock; a skewed engine may be off
	// by its offset on top of the skew it allows.
	slack := Skew + absDuration(tr.e.Offset)
	if rec.Keyset != nil {
		r.mu.Lock()
		r.checked.keysets++
		r.mu.Unlock()
		env := &typev1.Envelope{}
		if err := proto.Unmarshal(rec.Keyset, env); err != nil {
			r.violate("engine %s took a keyset that does not decode: %v", node, err)
			return
		}
		ring, err := verifyKeyset(r.m.Trust.Roots, env)
		if err != nil {
			r.violate("engine %s took a keyset the roots did not sign: %v", node, err)
			return
		}
		if tr.ring != nil && ring.version < tr.ring.version {
			r.violate("engine %s took keyset version %d after version %d", node, ring.version, tr.ring.version)
		}
		tr.ring = ring
		return
	}
	if rec.Manifest != nil {
		env := &typev1.Envelope{}
		if err := proto.Unmarshal(rec.Manifest, env); err != nil {
			r.violate("engine %s applied a manifest that does not decode: %v", node, err)
			return
		}
		digest := envelope.Digest(env)
		if digest != tr.digest {
			r.mu.Lock()
			r.checked.manifests++
			_, acked := r.manifests[digest]
			r.mu.Unlock()
			m, err := r.checkManifest(tr, env, rec.At, slack)
			if err != nil {
				r.violate("engine %s applied manifest %s at %s: %v", node, digest, rec.At.Format(time.RFC3339Nano), err)
				return
			}
			switch {
			case tr.manifest != nil && m.GetRevision() < tr.manifest.GetRevision():
				r.violate("engine %s applied revision %d after revision %d", node, m.GetRevision(), tr.manifest.GetRevision())
			case tr.manifest != nil && m.GetRevision() == tr.manifest.GetRevision():
				r.violate("engine %s applied another digest (%s) at revision %d than before (%s)", node, digest, m.GetRevision(), tr.digest)
			}
			if !acked {
				r.t.Logf("note: engine %s applied manifest r%d (%s) the recorder's watch did not see written", node, m.GetRevision(), digest)
			}
			tr.manifest, tr.digest = m, digest
		}
	}
	for module, b := range rec.Compositions {
		env := &typev1.Envelope{}
		if err := proto.Unmarshal(b, env); err != nil {
			r.violate("engine %s applied a composition of %s that does not decode: %v", node, module, err)
			continue
		}
		digest := envelope.Digest(env)
		if tr.applied[module] == digest {
			// The composition it applied already (kept, drift-corrected):
			// nothing new.
			continue
		}
		r.mu.Lock()
		r.checked.compositions++
		r.mu.Unlock()
		err := r.checkComposition(tr, tr.manifest, module, env, rec.At, slack)
		if err != nil && rec.Manifest == nil {
			// A commit that keeps the applied manifest applies the modules
			// of a newer one that came through (each module applies or
			// fails on its own, DESIGN.md §7); that manifest is recorded
			// applied once every module is. The composition is judged
			// against the manifest it was applied under: one JetStream
			// acknowledged for this node above the applied revision that
			// passes every check itself.
			if m := r.newerManifestNaming(tr, module, env, rec.At, slack); m != nil {
				err = nil
			}
		}
		if err != nil {
			r.violate("engine %s applied composition %s of %s at %s: %v", node, digest, module, rec.At.Format(time.RFC3339Nano), err)
			continue
		}
		tr.applied[module] = digest
	}
	for _, module := range rec.Drop {
		delete(tr.applied, module)
	}
}

func absDuration(d time.Duration) time.Duration {
	if d < 0 {
		return -d
	}
	return d
}

func (r *Recorder) checkManifest(tr *engineTrack, env *typev1.Envelope, at time.Time, slack time.Duration) (*typev1.Manifest, error) {
	if tr.ring == nil {
		return nil, errors.New("the engine had taken no keyset")
	}
	if env.GetPayloadType() != typev1.PayloadType_PAYLOAD_TYPE_MANIFEST {
		return nil, fmt.Errorf("payload type %v", env.GetPayloadType())
	}
	if err := tr.ring.verify(env, at, slack); err != nil {
		return nil, err
	}
	m := &typev1.Manifest{}
	if err := proto.Unmarshal(env.GetPayload(), m); err != nil {
		return nil, fmt.Errorf("payload does not decode: %v", err)
	}
	switch {
	case m.GetNode() != tr.e.Node:
		return nil, fmt.Errorf("a manifest of node %q", m.GetNode())
	case m.GetExpiresAt() == nil || at.After(m.GetExpiresAt().AsTime().Add(slack)):
		return nil, fmt.Errorf("revision %d expired at %s", m.GetRevision(), m.GetExpiresAt().AsTime().Format(time.RFC3339))
	case m.GetIssuedAt() == nil || m.GetIssuedAt().AsTime().After(at.Add(MaxAhead+slack)):
		return nil, fmt.Errorf("revision %d issued at %s, more than %s ahead", m.GetRevision(), m.GetIssuedAt().AsTime().Format(time.RFC3339), MaxAhead)
	case m.GetRevision() < tr.ring.floor:
		return nil, fmt.Errorf("revision %d below the keyset's floor %d", m.GetRevision(), tr.ring.floor)
	}
	return m, nil
}

// newerManifestNaming returns a manifest of the engine's node that
// JetStream acknowledged, above the revision the engine applied, that passes
// every check of checkManifest at the commit's time and under which the
// composition passes checkComposition; nil when there is none.
func (r *Recorder) newerManifestNaming(tr *engineTrack, module string, env *typev1.Envelope, at time.Time, slack time.Duration) *typev1.Manifest {
	r.mu.Lock()
	var candidates []*typev1.Envelope
	for _, m := range r.manifests {
		if m.node == tr.e.Node && m.env != nil && (tr.manifest == nil || m.revision > tr.manifest.GetRevision()) {
			candidates = append(candidates, m.env)
		}
	}
	r.mu.Unlock()
	for _, c := range candidates {
		m, err := r.checkManifest(tr, c, at, slack)
		if err != nil {
			continue
		}
		if r.checkComposition(tr, m, module, env, at, slack) == nil {
			return m
		}
	}
	return nil
}

func (r *Recorder) checkComposition(tr *engineTrack, manifest *typev1.Manifest, module string, env *typev1.Envelope, at time.Time, slack time.Duration) error {
	if manifest == nil {
		return errors.New("no manifest applied")
	}
	var want *typev1.Want
	for _, w := range manifest.GetWants() {
		if w.GetModule() == module {
			want = w
		}
	}
	if want == nil {
		return fmt.Errorf("the applied manifest r%d has no want of %s", manifest.GetRevision(), module)
	}
	if d := envelope.Digest(env); d != want.GetCompositionDigest() {
		return fmt.Errorf("its digest is not the manifest's %s", want.GetCompositionDigest())
	}
	if env.GetPayloadType() != typev1.PayloadType_PAYLOAD_TYPE_COMPOSITION {
		return fmt.Errorf("payload type %v", env.GetPayloadType())
	}
	if err := tr.ring.verify(env, at, slack); err != nil {
		return err
	}
	c := &typev1.Composition{}
	if err := proto.Unmarshal(env.GetPayload(), c); err != nil {
		return fmt.Errorf("payload does not decode: %v", err)
	}
	if c.GetNode() != tr.e.Node || c.GetModule() != want.GetModule() || c.GetFingerprint() != want.GetFingerprint() {
		return fmt.Errorf("of node %q module %q at %q, the want says %q at %q", c.GetNode(), c.GetModule(), c.GetFingerprint(), want.GetModule(), want.GetFingerprint())
	}
	return nil
}

// keyring is a keyset the roots signed, as the checker reads it.
type keyring struct {
	version uint64
	floor   uint64
	keys    map[string]*typev1.KeysetKey
}

// verifyKeyset checks a keyset envelope against the roots: a threshold of
// distinct root keys signed its bytes, and every key's id is its public
// key's.
func verifyKeyset(roots *typev1.TrustRoots, env *typev1.Envelope) (*keyring, error) {
	if env.GetPayloadType() != typev1.PayloadType_PAYLOAD_TYPE_KEYSET {
		return nil, fmt.Errorf("payload type %v", env.GetPayloadType())
	}
	input, err := envelope.SigningInput(env.GetPayloadType(), env.GetPayload())
	if err != nil {
		return nil, err
	}
	signed := map[string]bool{}
	for _, s := range env.GetSignatures() {
		for _, root := range roots.GetKeys() {
			if root.GetId() == s.GetKeyId() && ed25519.Verify(root.GetPublicKey(), input, s.GetSignature()) {
				signed[root.GetId()] = true
			}
		}
	}
	if len(signed) < int(roots.GetThreshold()) || len(signed) == 0 {
		return nil, fmt.Errorf("%d root signatures, %d needed", len(signed), roots.GetThreshold())
	}
	ks := &typev1.Keyset{}
	if err := proto.Unmarshal(env.GetPayload(), ks); err != nil {
		return nil, fmt.Errorf("payload does not decode: %v", err)
	}
	ring := &keyring{version: ks.GetVersion(), floor: ks.GetRevisionFloor(), keys: map[string]*typev1.KeysetKey{}}
	for _, k := range ks.GetKeys() {
		if envelope.KeyID(k.GetPublicKey()) != k.GetId() {
			return nil, fmt.Errorf("key %s is not the id of its public key", k.GetId())
		}
		ring.keys[k.GetId()] = k
	}
	return ring, nil
}

// verify checks that a signature of a key usable at (about) at signed env:
// ACTIVE, or RETIRED within its validity; never REVOKED, never unlisted.
func (k *keyring) verify(env *typev1.Envelope, at time.Time, slack time.Duration) error {
	input, err := envelope.SigningInput(env.GetPayloadType(), env.GetPayload())
	if err != nil {
		return err
	}
	var why []string
	for _, s := range env.GetSignatures() {
		key, ok := k.keys[s.GetKeyId()]
		switch {
		case !ok:
			why = append(why, fmt.Sprintf("key %s is not in keyset version %d", s.GetKeyId(), k.version))
		case key.GetState() != KeyActive && key.GetState() != KeyRetired:
			why = append(why, fmt.Sprintf("key %s is %v in keyset version %d", s.GetKeyId(), key.GetState(), k.version))
		case key.GetNotBefore() != nil && at.Add(slack).Before(key.GetNotBefore().AsTime()):
			why = append(why, fmt.Sprintf("key %s is valid only from %s", s.GetKeyId(), key.GetNotBefore().AsTime()))
		case key.GetNotAfter() != nil && at.Add(-slack).After(key.GetNotAfter().AsTime()):
			why = append(why, fmt.Sprintf("key %s was valid until %s", s.GetKeyId(), key.GetNotAfter().AsTime()))
		case !ed25519.Verify(key.GetPublicKey(), input, s.GetSignature()):
			why = append(why, fmt.Sprintf("the signature by %s does not verify", s.GetKeyId()))
		default:
			return nil
		}
	}
	if len(why) == 0 {
		return errors.New("not signed")
	}
	return errors.New(strings.Join(why, "; "))
}

// checkCurrent checks invariant 1 on what JetStream holds now: every
// composition each node's current assignment names is held with the digest
// its manifest says, and every object those compositions name is held. A
// read that fails (nats-server down) checks nothing; a composition found
// missing counts only if the assignment did not move meanwhile. final makes
// a read failure an error of the test.
func (r *Recorder) checkCurrent(final bool) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	fail := func(err error) {
		if final {
			r.t.Errorf("final check of current manifests: %v", err)
		}
	}
	js := r.m.JS
	assignments, err := js.KeyValue(ctx, natsx.BucketAssignments)
	if err != nil {
		fail(err)
		return
	}
	compositions, err := js.KeyValue(ctx, natsx.BucketCompositions)
	if err != nil {
		fail(err)
		return
	}
	objects, err := js.ObjectStore(ctx, natsx.ObjectStoreObjects)
	if err != nil && !errors.Is(err, jetstream.ErrBucketNotFound) && !errors.Is(err, jetstream.ErrStreamNotFound) {
		fail(err)
		return
	}
	for _, node := range r.m.opts.Nodes {
		ae, err := assignments.Get(ctx, node)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			continue
		}
		if err != nil {
			fail(err)
			return
		}
		a := &composerv1.Assignment{}
		if err := proto.Unmarshal(ae.Value(), a); err != nil {
			// Bad bytes in an assignment are the harness's own doing in a
			// scenario (an assignment is written only by CAS of signed
			// content); the engine judges what it is sent.
			continue
		}
		for _, w := range a.GetWants() {
			problem, err := r.missing(ctx, compositions, objects, w)
			if err != nil {
				fail(err)
				return
			}
			if problem == "" {
				continue
			}
			// Still the same assignment? Then its manifest names something
			// JetStream does not hold.
			again, err := assignments.Get(ctx, node)
			if err != nil || again.Revision() != ae.Revision() {
				continue
			}
			r.violate("node %s: current manifest r%d names %s: %s", node, a.GetManifestRevision(), w.GetCompositionKey(), problem)
		}
	}
	r.mu.Lock()
	r.checked.currentChecks++
	r.mu.Unlock()
}

// missing says what is wrong with a want's composition as JetStream holds
// it, "" when nothing; an error when JetStream could not be asked.
func (r *Recorder) missing(ctx context.Context, compositions jetstream.KeyValue, objects jetstream.ObjectStore, w *typev1.Want) (string, error) {
	key := w.GetCompositionKey()
	r.mu.Lock()
	injected := r.injected[key]
	r.mu.Unlock()
	ce, err := compositions.Get(ctx, key)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return "the composition is not held", nil
	}
	if err != nil {
		return "", err
	}
	env := &typev1.Envelope{}
	if err := proto.Unmarshal(ce.Value(), env); err != nil || envelope.Digest(env) != w.GetCompositionDigest() {
		if injected {
			return "", nil
		}
		return fmt.Sprintf("it holds digest %s, not %s", envelope.Digest(env), w.GetCompositionDigest()), nil
	}
	c := &typev1.Composition{}
	if err := proto.Unmarshal(env.GetPayload(), c); err != nil {
		return "its payload does not decode", nil
	}
	for _, res := range c.GetResources() {
		d := res.GetObject().GetDigest()
		if d == "" {
			continue
		}
		if objects == nil {
			return fmt.Sprintf("object %s of %s is not held (no object store)", d, res.GetId()), nil
		}
		r.mu.Lock()
		inj := r.injected[d]
		r.mu.Unlock()
		if inj {
			continue
		}
		if _, err := objects.GetInfo(ctx, d); errors.Is(err, jetstream.ErrObjectNotFound) {
			return fmt.Sprintf("object %s of %s is not held", d, res.GetId()), nil
		} else if err != nil {
			return "", err
		}
	}
	return "", nil
}

// Figures are what the checker judged.
type Figures struct {
	ManifestsApplied, CompositionsApplied, KeysetsTaken, CurrentChecks int
	AckedWrites                                                        map[string]int
	Violations                                                         []string
}

// Final reads every commit left, checks the current manifests once more
// (every read must succeed) and returns the figures.
func (r *Recorder) Final() Figures {
	r.readCommits()
	r.checkCurrent(true)
	r.mu.Lock()
	defer r.mu.Unlock()
	f := Figures{ManifestsApplied: r.checked.manifests, CompositionsApplied: r.checked.compositions,
		KeysetsTaken: r.checked.keysets, CurrentChecks: r.checked.currentChecks, AckedWrites: map[string]int{},
		Violations: append([]string(nil), r.violations...)}
	for b, n := range r.writes {
		f.AckedWrites[b] = n
	}
	return f
}

// Applied returns the digest of each module's composition an engine's
// commit log says it applied last, and its manifest revision.
func (r *Recorder) Applied(node string) (uint64, map[string]string) {
	r.readCommits()
	r.commitsMu.Lock()
	defer r.commitsMu.Unlock()
	for _, tr := range r.engines {
		if tr.e.Node == node {
			out := map[string]string{}
			for m, d := range tr.applied {
				out[m] = d
			}
			return tr.manifest.GetRevision(), out
		}
	}
	return 0, nil
}
