package engine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	otelcodes "go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"mesh.dev/internal/envelope"
	"mesh.dev/internal/lint"
	"mesh.dev/internal/names"
	"mesh.dev/internal/telemetry"
	"mesh.dev/internal/verify"
	composerv1 "mesh.dev/proto/mesh/composer/v1"
	nodeenginev1 "mesh.dev/proto/mesh/nodeengine/v1"
	typev1 "mesh.dev/proto/mesh/type/v1"
	"mesh.dev/services/nodeengine/internal/apply"
	"mesh.dev/services/nodeengine/internal/entries"
	"mesh.dev/services/nodeengine/internal/picture"
	"mesh.dev/services/nodeengine/internal/state"
)

// Attempt states.
const (
	stateApplied = composerv1.AttemptState_ATTEMPT_STATE_APPLIED
	stateFailed  = composerv1.AttemptState_ATTEMPT_STATE_FAILED
	stateHeld    = composerv1.AttemptState_ATTEMPT_STATE_HELD
	stateStale   = composerv1.AttemptState_ATTEMPT_STATE_STALE
)

// ReasonOf maps a verification error to its reason code.
func ReasonOf(err error) composerv1.ReasonCode {
	switch {
	case errors.Is(err, verify.ErrRevoked), errors.Is(err, verify.ErrExpired), errors.Is(err, verify.ErrKeysetExpired):
		return composerv1.ReasonCode_REASON_CODE_EXPIRED
	case errors.Is(err, verify.ErrKeyset), errors.Is(err, verify.ErrRoots):
		return composerv1.ReasonCode_REASON_CODE_KEYSET_INVALID
	case errors.Is(err, verify.ErrNode):
		return composerv1.ReasonCode_REASON_CODE_NODE_MISMATCH
	case errors.Is(err, verify.ErrFastForward):
		return composerv1.ReasonCode_REASON_CODE_FAST_FORWARD
	case errors.Is(err, verify.ErrDigest):
		return composerv1.ReasonCode_REASON_CODE_DIGEST_MISMATCH
	case errors.Is(err, verify.ErrWant):
		return composerv1.ReasonCode_REASON_CODE_WANT_MISMATCH
	case errors.Is(err, verify.ErrBelowFloor):
		return composerv1.ReasonCode_REASON_CODE_REVISION_BELOW_FLOOR
	}
	// ErrSignature, ErrUnknownKey, ErrKeyNotValid, ErrPayload.
	return composerv1.ReasonCode_REASON_CODE_SIGNATURE_INVALID
}

// staleErr reports whether an error makes the engine stale: nothing new is
// applied, what is applied is kept and enforced.
func staleErr(err error) bool {
	return errors.Is(err, verify.ErrExpired) || errors.Is(err, verify.ErrRevoked) || errors.Is(err, verify.ErrKeysetExpired)
}

// Pass runs one pass (DESIGN.md §7 "Each pass").
func (e *Engine) Pass(ctx context.Context) {
	e.passMu.Lock()
	defer e.passMu.Unlock()
	// Before anything is taken: a Poke after this asks for the next pass.
	pokes := e.pokes.Load()
	now := e.cfg.Now()

	e.retryPending(ctx)
	e.retryWrites()
	e.takeKeysets()
	e.finishHeldJournal(ctx)
	e.takeOffers(now)

	e.mu.Lock()
	heard, lv, ring := e.heard, e.live, e.keyring
	wants := sortedWants(e.keptWants)
	if lv != nil {
		// Live wants replace the kept ones.
		wants = lv.manifest.GetWants()
	}
	e.mu.Unlock()

	// The span starts before the entries are asked for, so that an ask
	// continues the manifest's trace.
	ctx, span := e.startSpan(ctx, lv)
	defer span.End()

	needed := picture.Needed(wants, heard)
	e.need(ctx, needed)
	stale, staleSince := e.judgeStale(lv, ring, now)
	var pre *prefetched
	if lv != nil {
		// The compositions the live wants name are fetched while the
		// entries are asked: two round trips at once, not one after the
		// other (a fleet-wide change asks both of every engine). Only when
		// the apply will take them: not stale, nothing blocking it.
		if stale == "" && e.unblocked() {
			pre = e.prefetch(ctx, wants, ring, now)
		}
		e.waitFirstAnswers(ctx, wants)
	}
	refused := pre.wait()
	// Answers counted by now show in the rows the picture reads.
	answers := e.answers.Load()
	defer func() {
		e.lastPokes.Store(pokes)
		e.lastAnswers.Store(answers)
	}()
	pic := picture.Lay(e.cfg.Node, wants, heard, e.lookupEntry)
	holds := picture.Holds(e.cfg.Node, wants, pic, e.lookupEntry)

	attempts, drift, notes := e.applyPass(ctx, lv, ring, wants, holds, stale, now, refused)

	e.mu.Lock()
	e.wants, e.holds, e.picture, e.drift, e.notes = wants, holds, pic, drift, notes
	e.stale, e.staleSince = stale, staleSince
	e.passes++
	e.publishLocked(wants, attempts, now)
	e.mu.Unlock()
	if len(drift) > 0 {
		span.SetAttributes(attribute.StringSlice("mesh.drift", drift))
	}
}

func (e *Engine) startSpan(ctx context.Context, lv *live) (context.Context, trace.Span) {
	var attrs []attribute.KeyValue
	if lv != nil {
		// The manifest carries the trace of the change that caused it: the
		// apply joins it, from a registration to every node.
		ctx = telemetry.ContextWithTraceparent(ctx, lv.manifest.GetTraceparent(), lv.manifest.GetTracestate())
		attrs = append(attrs, attribute.Int64("mesh.manifest.revision", int64(lv.manifest.GetRevision())))
	}
	ctx, span := e.tracer.Start(ctx, "nodeengine.pass", trace.WithAttributes(append(attrs, attribute.String("mesh.node", e.cfg.Node))...))
	e.mu.Lock()
	if lv != nil {
		e.traceparent, e.tracestate = telemetry.Traceparent(ctx)
	}
	e.mu.Unlock()
	return ctx, span
}

// retryPending finishes an apply whose ops ran but whose commit failed.
func (e *Engine) retryPending(ctx context.Context) {
	e.mu.Lock()
	j := e.pending
	e.mu.Unlock()
	if j != nil {
		e.replay(ctx, j)
	}
}

// finishHeldJournal replays the journal the start kept while a section
// blocked the engine, once nothing blocks it: the half-done apply is
// finished before anything else is judged.
func (e *Engine) finishHeldJournal(ctx context.Context) {
	e.mu.Lock()
	j := e.heldJournal
	if j == nil || e.blocked != "" {
		e.mu.Unlock()
		return
	}
	e.heldJournal = nil
	e.mu.Unlock()
	e.log.Warn("finishing an apply a stop left half done", slog.Uint64("revision", j.Revision), slog.Int("ops", len(j.Ops)))
	e.replay(ctx, j)
}

// replay finishes a journal and takes its result as the kept state.
func (e *Engine) replay(ctx context.Context, j *state.Journal) {
	// A stop in the middle of a write left its temp file: the replay
	// writes through a new one.
	e.cfg.Applier.SweepTemps(j)
	res := e.cfg.Applier.Replay(ctx, j, e.ledger, e.cfg.Store)
	e.mu.Lock()
	if res.CommitErr != nil {
		e.pending = j
		e.mu.Unlock()
		e.log.Error("committing the apply failed: the ledger is not written, nothing else is applied until it is", slog.Any("error", res.CommitErr))
		return
	}
	e.pending = nil
	e.takeResultLocked(j, res)
	e.mu.Unlock()
	for m, f := range res.Failed {
		e.log.Error("an apply a stop left half done could not be finished for a module", slog.String("module", m), slog.String("reason", f.Reason))
	}
	// What could not be finished is rolled back at once; the next pass
	// judges the wanted composition again and says why it is not applied.
	e.rollBack(ctx)
}

// takeResultLocked makes a committed apply of journal j (a replay) the
// engine's kept state, its manifest and compositions decoded from the
// journal's bytes.
func (e *Engine) takeResultLocked(j *state.Journal, res *apply.Result) {
	manifest := journalManifest(j)
	comps := map[string]*apply.Composition{}
	for m := range res.Applied {
		env := &typev1.Envelope{}
		if proto.Unmarshal(j.Compositions[m], env) != nil {
			continue
		}
		c := &typev1.Composition{}
		if envelope.Open(env, typev1.PayloadType_PAYLOAD_TYPE_COMPOSITION, c) != nil {
			continue
		}
		comps[m] = &apply.Composition{Module: m, Comp: c, Env: env}
	}
	e.takeAppliedLocked(manifest, comps, j.Drop, res)
}

// takeAppliedLocked makes a committed apply the engine's kept state: the
// manifest (nil when the apply did not record one), and of the
// compositions in effect those the result records applied, as the pass
// holds them decoded (the journal's bytes are the same envelopes).
func (e *Engine) takeAppliedLocked(manifest *typev1.Envelope, inEffect map[string]*apply.Composition, drop []string, res *apply.Result) {
	e.ledger = res.Ledger
	e.rollback = e.rollback.Merge(res.Rollback, res.Settled)
	if manifest != nil {
		e.applied.Manifest = manifest
	}
	for m := range res.Applied {
		c, ok := inEffect[m]
		if !ok || c.Env == nil || c.Comp == nil {
			continue
		}
		if e.applied.Compositions == nil {
			e.applied.Compositions = map[string]*typev1.Envelope{}
		}
		e.applied.Compositions[m] = c.Env
		e.appliedComps[m] = c.Comp
	}
	for _, m := range drop {
		delete(e.applied.Compositions, m)
		delete(e.appliedComps, m)
	}
}

// retryWrites writes again the entries and wants whose writes failed.
func (e *Engine) retryWrites() {
	e.mu.Lock()
	defer e.mu.Unlock()
	for fp, r := range e.dirtyEntries {
		err := e.cfg.Store.PutEntry(fp, state.KeptEntry{Entry: r.Entry, Since: r.Since})
		e.noteWrite("entry "+fp, err)
		if err == nil {
			delete(e.dirtyEntries, fp)
			e.keptEntries[fp] = true
		}
	}
	var gone []string
	for m := range e.dirtyWants {
		if k, ok := e.keptWants[m]; ok {
			err := e.cfg.Store.PutWant(m, k)
			e.noteWrite("want "+m, err)
			if err == nil {
				delete(e.dirtyWants, m)
			}
		} else {
			gone = append(gone, m)
		}
	}
	if len(gone) > 0 {
		sort.Strings(gone)
		err := e.cfg.Store.DeleteWants(gone)
		for _, m := range gone {
			e.noteWrite("want "+m, err)
			if err == nil {
				delete(e.dirtyWants, m)
			}
		}
	}
}

// takeKeysets accepts a keyset signed by the pinned roots whose version is
// higher than the one held, persisted before it is used.
func (e *Engine) takeKeysets() {
	e.mu.Lock()
	defer e.mu.Unlock()
	offers := e.keysetOffers
	e.keysetOffers = nil
	for _, env := range offers {
		ring, err := verify.Keyset(e.cfg.Roots, env)
		if err != nil {
			e.keysetRefused = "keyset refused: " + err.Error()
			e.refuseLocked(composerv1.ReasonCode_REASON_CODE_KEYSET_INVALID, e.keysetRefused)
			continue
		}
		if e.keyring != nil && ring.Version() <= e.keyring.Version() {
			continue // only a higher version is taken
		}
		if e.keyring == nil {
			// No keyset held (the kept one unreadable, not signed by the
			// roots, or lost): an older keyset than the newest this
			// engine took is a rollback (it may list keys a later one
			// revoked) and replaces nothing.
			if floor, from := e.keysetFloorLocked(); ring.Version() < floor {
				e.keysetRefused = fmt.Sprintf("keyset refused: version %d is older than version %d (%s; %s, and only a keyset at least that new replaces it)",
					ring.Version(), floor, from, e.noKeysetLocked())
				e.refuseLocked(composerv1.ReasonCode_REASON_CODE_KEYSET_INVALID, e.keysetRefused)
				continue
			}
		}
		next := e.hw
		if e.hwErr == nil && ring.Version() > next.KeysetVersion {
			// The floor is kept with the keyset, in one transaction.
			next.KeysetVersion = ring.Version()
			err = e.cfg.Store.PutKeysetAndMarks(env, next)
		} else {
			err = e.cfg.Store.PutKeyset(env)
		}
		if err != nil {
			// Not used before it is kept; the composer sends it again.
			e.log.Error("keyset not persisted, not used", slog.Uint64("version", ring.Version()), slog.Any("error", err))
			continue
		}
		if e.hwErr == nil {
			e.hw = next
		}
		e.log.Info("keyset accepted", slog.Uint64("version", ring.Version()))
		e.keyring = ring
		e.keysetRefused, e.keysetNotRoots = "", ""
		if e.keysetErr != nil {
			e.keysetErr = nil
			e.unblockLocked()
		}
	}
}

// keysetFloorLocked is the lowest keyset version that may repair an
// unreadable keyset section, and where it comes from: the highest keyset
// version the high-water marks record as taken, or, for state kept before
// they recorded it, the keyset version the applied manifest or a journal's
// manifest was signed under.
func (e *Engine) keysetFloorLocked() (uint64, string) {
	floor, from := e.hw.KeysetVersion, "the newest this engine took"
	signedUnder := func(env *typev1.Envelope, what string) {
		m := &typev1.Manifest{}
		if env != nil && envelope.Open(env, typev1.PayloadType_PAYLOAD_TYPE_MANIFEST, m) == nil && m.GetKeysetVersion() > floor {
			floor, from = m.GetKeysetVersion(), "the one "+what+" was signed under"
		}
	}
	signedUnder(e.applied.Manifest, "the applied manifest")
	for _, j := range []*state.Journal{e.heldJournal, e.pending} {
		signedUnder(journalManifest(j), "the manifest of an unfinished apply")
	}
	return floor, from
}

// journalManifest is the manifest envelope a journal holds; nil when it
// holds none (or j is nil) or its bytes do not decode.
func journalManifest(j *state.Journal) *typev1.Envelope {
	if j == nil || len(j.Manifest) == 0 {
		return nil
	}
	env := &typev1.Envelope{}
	if proto.Unmarshal(j.Manifest, env) != nil {
		return nil
	}
	return env
}

// noKeysetLocked says why the engine holds no keyset.
func (e *Engine) noKeysetLocked() string {
	switch {
	case e.keysetErr != nil:
		return "the kept keyset is unreadable"
	case e.keysetNotRoots != "":
		return "the kept keyset does not verify against the pinned roots: " + e.keysetNotRoots
	}
	return "no keyset is kept"
}

// unblockLocked clears the blocked reason once no section blocks.
func (e *Engine) unblockLocked() {
	if e.hwErr == nil && e.ledgerErr == nil && e.appliedErr == nil && e.keysetErr == nil {
		e.blocked = ""
	}
}

func (e *Engine) refuseLocked(code composerv1.ReasonCode, reason string) {
	e.refused = &refusal{code: code, reason: reason, at: e.cfg.Now()}
	e.log.Warn("refused", slog.String("code", code.String()), slog.String("reason", reason))
}

// takeOffers judges the manifests received since the last pass, in order.
func (e *Engine) takeOffers(now time.Time) {
	e.mu.Lock()
	defer e.mu.Unlock()
	offers := e.offers
	e.offers = nil
	if len(offers) == 0 {
		return
	}
	if e.keyring == nil {
		// Nothing can be verified without a keyset: keep them until one
		// comes (the composer sends the keyset first).
		e.offers = offers
		reason := "no keyset verified against the pinned roots yet: the manifest waits"
		if e.keysetRefused != "" {
			// The refusal of the keyset is the cause: keep saying it.
			reason += " (" + e.keysetRefused + ")"
		}
		e.refuseLocked(composerv1.ReasonCode_REASON_CODE_KEYSET_INVALID, reason)
		return
	}
	for i, env := range offers {
		if retry := e.judgeLocked(env, now); retry {
			e.offers = append(offers[i:], e.offers...)
			return
		}
	}
}

// judgeLocked verifies one manifest and takes it when it passes; it
// reports whether the manifest should be judged again next pass (its
// high-water mark could not be persisted).
func (e *Engine) judgeLocked(env *typev1.Envelope, now time.Time) bool {
	node := e.cfg.Node
	keyID, err := e.keyring.Verify(env, typev1.PayloadType_PAYLOAD_TYPE_MANIFEST, now)
	if err != nil {
		e.refuseLocked(ReasonOf(err), "manifest refused: "+err.Error())
		return false
	}
	m := &typev1.Manifest{}
	if err := envelope.Open(env, typev1.PayloadType_PAYLOAD_TYPE_MANIFEST, m); err != nil {
		e.refuseLocked(composerv1.ReasonCode_REASON_CODE_SIGNATURE_INVALID, "manifest refused: "+err.Error())
		return false
	}
	if m.GetNode() != node {
		e.refuseLocked(composerv1.ReasonCode_REASON_CODE_NODE_MISMATCH, fmt.Sprintf("manifest refused: revision %d is of node %q, not %q", m.GetRevision(), m.GetNode(), node))
		return false
	}
	if e.hwErr != nil {
		e.refuseLocked(composerv1.ReasonCode_REASON_CODE_STATE_UNREADABLE, "manifest refused: the high-water marks cannot be read: "+e.hwErr.Error())
		return false
	}
	digest := envelope.Digest(env)
	hw := e.hw
	if m.GetRevision() < hw.Revision || (m.GetRevision() == hw.Revision && digest != hw.Digest) {
		e.refuseLocked(composerv1.ReasonCode_REASON_CODE_REVISION_CONFLICT,
			fmt.Sprintf("manifest revision %d (%s) refused: the high-water mark is revision %d (%s)", m.GetRevision(), digest, hw.Revision, hw.Digest))
		return false
	}
	// Verified and opened above: the rest of the manifest's checks.
	if err := e.keyring.CheckManifest(m, node, now); err != nil {
		e.refuseLocked(ReasonOf(err), "manifest refused: "+err.Error())
		return false
	}
	if m.GetRevision() > hw.Revision {
		next := hw
		next.Revision, next.Digest = m.GetRevision(), digest
		next.KeysetVersion = max(next.KeysetVersion, e.keyring.Version())
		// The mark is durable before anything of the manifest is applied.
		if err := e.cfg.Store.PutHighWater(next); err != nil {
			e.refuseLocked(composerv1.ReasonCode_REASON_CODE_WRITE_FAILED, "manifest not applied: its high-water mark could not be kept: "+err.Error())
			return true
		}
		e.hw = next
	}
	e.live = &live{env: env, manifest: m, digest: digest, keyID: keyID, ring: e.keyring}
	e.refused = nil
	e.keepWantsLocked(m.GetWants(), now)
	return false
}

// keepWantsLocked makes the wants of a verified manifest the kept wants
// (state.PlanWants: since kept across changes at one fingerprint, a want
// rewritten only when it changed, puts before deletes); a failed write is
// said once per key and retried by each pass.
func (e *Engine) keepWantsLocked(wants []*typev1.Want, now time.Time) {
	c := state.PlanWants(e.keptWants, wants, now, func(m string) bool { return e.dirtyWants[m] })
	failed := state.KeepWants(e.cfg.Store, c)
	for _, m := range append(append([]string{}, c.Put...), c.Delete...) {
		err := failed[m]
		e.noteWrite("want "+m, err)
		if err != nil {
			e.dirtyWants[m] = true
		} else {
			delete(e.dirtyWants, m)
		}
	}
	e.keptWants = c.Next
}

// need asks for every needed fingerprint (an ask continues the trace of
// ctx), releases the rest and deletes the kept entries nothing needs any
// more.
func (e *Engine) need(ctx context.Context, needed []string) {
	set := map[string]bool{}
	for _, fp := range needed {
		set[fp] = true
		e.cache.NeedFrom(ctx, fp)
	}
	for _, r := range e.cache.Rows() {
		if !set[r.Fingerprint] {
			e.cache.Release(r.Fingerprint)
		}
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	var gone []string
	for fp := range e.keptEntries {
		if !set[fp] {
			gone = append(gone, fp)
		}
	}
	for fp := range e.dirtyEntries {
		if !set[fp] {
			delete(e.dirtyEntries, fp)
		}
	}
	if len(gone) > 0 {
		sort.Strings(gone)
		if err := e.cfg.Store.DeleteEntries(gone); err != nil {
			e.noteWrite("entries deleted", err)
			return
		}
		e.noteWrite("entries deleted", nil)
		for _, fp := range gone {
			delete(e.keptEntries, fp)
		}
	}
}

// judgeStale judges, at pass start, the manifest the engine holds (the
// live one, or the applied one after a restart): expired, signed by a
// revoked key, or under an expired keyset, it is stale.
func (e *Engine) judgeStale(lv *live, ring *verify.Keyring, now time.Time) (string, time.Time) {
	e.mu.Lock()
	cur := e.applied.Manifest
	prevSince := e.staleSince
	e.mu.Unlock()
	if lv != nil {
		cur = lv.env
	}
	if cur == nil {
		return "", time.Time{}
	}
	var err error
	since := now
	if ring == nil {
		err = errors.New("no keyset verifies against the pinned roots")
	} else if ring.Expired(now) {
		since = ring.Keyset().GetExpiresAt().AsTime()
		err = fmt.Errorf("%w: version %d expired at %s", verify.ErrKeysetExpired, ring.Version(), since.UTC().Format(time.RFC3339))
	} else if lv != nil && lv.ring == ring {
		// Verified by this keyring when taken: its key and times only.
		if err = ring.Recheck(lv.keyID, lv.manifest, e.cfg.Node, now); errors.Is(err, verify.ErrExpired) {
			since = lv.manifest.GetExpiresAt().AsTime()
		}
	} else if _, _, err = ring.Manifest(cur, e.cfg.Node, now); err != nil && errors.Is(err, verify.ErrExpired) {
		m := &typev1.Manifest{}
		if envelope.Open(cur, typev1.PayloadType_PAYLOAD_TYPE_MANIFEST, m) == nil {
			since = m.GetExpiresAt().AsTime()
		}
	}
	if err == nil {
		return "", time.Time{}
	}
	if !prevSince.IsZero() && !errors.Is(err, verify.ErrExpired) && !errors.Is(err, verify.ErrKeysetExpired) {
		since = prevSince
	}
	return fmt.Sprintf("STALE since %s: %v", since.UTC().Format(time.RFC3339), err), since
}

// composition returns a want's verified composition: from the cache, the
// applied state, or fetched from the composer and verified (digest,
// signature, node, module, fingerprint, then lint).
func (e *Engine) composition(ctx context.Context, w *typev1.Want, ring *verify.Keyring, now time.Time) (*verified, *apply.Failure) {
	refused := func(err error) *apply.Failure {
		return &apply.Failure{Code: ReasonOf(err), Reason: fmt.Sprintf("composition %s refused: %v", w.GetCompositionKey(), err)}
	}
	e.mu.Lock()
	held := e.heldLocked(w)
	e.mu.Unlock()
	if held != nil {
		// Held by digest, which alone ties it neither to this want's
		// module and fingerprint nor to the keyset now: judged again for
		// both (the signature only once per keyring).
		v, err := e.recheck(held, w, ring, now)
		if err == nil {
			if v != held {
				e.mu.Lock()
				e.compCache[w.GetCompositionDigest()] = v
				e.mu.Unlock()
			}
			return v, nil
		}
		if errors.Is(err, verify.ErrWant) || errors.Is(err, verify.ErrNode) {
			// Its bytes are what the want names: fetching gives the same.
			return nil, refused(err)
		}
		// Its signature no longer verifies (a key revoked, retired past
		// its not_after or rotated out): the composer holds it signed
		// again under the same digest.
		e.mu.Lock()
		delete(e.compCache, w.GetCompositionDigest())
		e.mu.Unlock()
	}
	if e.cfg.Composer == nil {
		return nil, &apply.Failure{Code: composerv1.ReasonCode_REASON_CODE_FETCH_FAILED, Reason: "no composer connection"}
	}
	fctx, cancel := context.WithTimeout(ctx, e.cfg.CompositionDeadline)
	resp, err := e.cfg.Composer.GetComposition(fctx, &composerv1.GetCompositionRequest{Key: w.GetCompositionKey(), Digest: w.GetCompositionDigest()})
	cancel()
	if err != nil {
		return nil, &apply.Failure{Code: composerv1.ReasonCode_REASON_CODE_FETCH_FAILED, Reason: fmt.Sprintf("fetch composition %s: %v", w.GetCompositionKey(), err)}
	}
	env := resp.GetComposition()
	c, keyID, err := ring.VerifyComposition(env, e.cfg.Node, w, now)
	if err != nil {
		return nil, refused(err)
	}
	for _, r := range c.GetResources() {
		if f := e.cfg.Applier.CheckPath(r.GetPath()); f != nil {
			return nil, &apply.Failure{Code: f.Code, Reason: fmt.Sprintf("composition %s: %s: %s", w.GetCompositionKey(), r.GetId(), f.Reason)}
		}
	}
	if err := lint.CheckComposition(c); err != nil {
		return nil, &apply.Failure{Code: composerv1.ReasonCode_REASON_CODE_WANT_MISMATCH, Reason: fmt.Sprintf("composition %s does not lint: %v", w.GetCompositionKey(), err)}
	}
	v := &verified{env: env, comp: c, ring: ring, keyID: keyID}
	e.mu.Lock()
	e.compCache[w.GetCompositionDigest()] = v
	e.mu.Unlock()
	return v, nil
}

// prefetchAtOnce bounds the compositions one pass fetches at once.
const prefetchAtOnce = 8

// prefetched is a pass's prefetch: done is closed when every fetch ended,
// and refused then holds the failures by want (prefetchKey).
type prefetched struct {
	done    chan struct{}
	mu      sync.Mutex
	refused map[string]*apply.Failure
}

// wait waits for the fetches and returns their failures (nil: none, or no
// prefetch).
func (p *prefetched) wait() map[string]*apply.Failure {
	if p == nil {
		return nil
	}
	<-p.done
	return p.refused
}

// prefetchKey names a want's fetch: its module and composition digest (a
// digest alone may be named by a want of another module, and refused for
// it only).
func prefetchKey(w *typev1.Want) string { return w.GetModule() + "\x00" + w.GetCompositionDigest() }

// unblocked reports whether nothing keeps the apply from running: the
// state is readable and no ledger commit is pending.
func (e *Engine) unblocked() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.blocked == "" && e.pending == nil
}

// prefetch fetches and verifies the compositions of wants not held yet,
// at most prefetchAtOnce at a time, into the cache the pass's composition
// takes them from. A failure is kept for the apply, which reports it
// without fetching again.
func (e *Engine) prefetch(ctx context.Context, wants []*typev1.Want, ring *verify.Keyring, now time.Time) *prefetched {
	p := &prefetched{done: make(chan struct{}), refused: map[string]*apply.Failure{}}
	if ring == nil || e.cfg.Composer == nil {
		close(p.done)
		return p
	}
	var missing []*typev1.Want
	e.mu.Lock()
	for _, w := range wants {
		if w.GetCompositionDigest() != "" && e.heldLocked(w) == nil {
			missing = append(missing, w)
		}
	}
	e.mu.Unlock()
	var wg sync.WaitGroup
	slots := make(chan struct{}, prefetchAtOnce)
	for _, w := range missing {
		wg.Go(func() {
			slots <- struct{}{}
			defer func() { <-slots }()
			if _, f := e.composition(ctx, w, ring, now); f != nil {
				p.mu.Lock()
				p.refused[prefetchKey(w)] = f
				p.mu.Unlock()
			}
		})
	}
	go func() {
		wg.Wait()
		close(p.done)
	}()
	return p
}

// heldLocked returns the composition of a want's digest the engine holds:
// cached, or applied for its module (not verified yet); nil when it must
// be fetched.
func (e *Engine) heldLocked(w *typev1.Want) *verified {
	if v, ok := e.compCache[w.GetCompositionDigest()]; ok {
		return v
	}
	if env := e.applied.Compositions[w.GetModule()]; env != nil && envelope.Digest(env) == w.GetCompositionDigest() {
		return &verified{env: env}
	}
	return nil
}

// recheck judges a composition held by digest (cached, or applied) for a
// want and keyring: the key that signed it still usable and node, module
// and fingerprint the want's, its signature verified again only under
// another keyring than the one it was verified with. It returns the
// composition as verified now.
func (e *Engine) recheck(held *verified, w *typev1.Want, ring *verify.Keyring, now time.Time) (*verified, error) {
	if held.ring == ring && held.comp != nil {
		if err := ring.RecheckComposition(held.keyID, held.comp, e.cfg.Node, w, now); err != nil {
			return nil, err
		}
		return held, nil
	}
	c, keyID, err := ring.VerifyComposition(held.env, e.cfg.Node, w, now)
	if err != nil {
		return nil, err
	}
	return &verified{env: held.env, comp: c, ring: ring, keyID: keyID}, nil
}

// outcome is what a pass found of one module.
type outcome struct {
	state  composerv1.AttemptState
	code   composerv1.ReasonCode
	reason string
	want   *typev1.Want
}

// applyPass decides the compositions in effect and applies them.
// refused are the failures of this pass's prefetch, by want (prefetchKey):
// not fetched again.
func (e *Engine) applyPass(ctx context.Context, lv *live, ring *verify.Keyring, wants []*typev1.Want, holds []*nodeenginev1.EngineHold, stale string, now time.Time, refused map[string]*apply.Failure) (map[string]*outcome, []string, map[string][]string) {
	out := map[string]*outcome{}
	wantOf := map[string]*typev1.Want{}
	for _, w := range wants {
		wantOf[w.GetModule()] = w
	}
	e.mu.Lock()
	blocked, pending := e.blocked, e.pending
	e.mu.Unlock()
	// What an apply left part-way is rolled back before anything else
	// (its commit failing blocks the apply as any other's does); a module
	// still kept so then says why at the end of the pass.
	var rolled map[string]string
	if blocked == "" && pending == nil {
		rolled = e.rollBack(ctx)
		e.mu.Lock()
		pending = e.pending
		e.mu.Unlock()
	}
	defer func() {
		e.mu.Lock()
		rb := e.rollback
		e.mu.Unlock()
		for _, m := range slices.Sorted(maps.Keys(rolled)) {
			words := rolled[m]
			if o, ok := out[m]; ok {
				o.reason += "; " + words
			} else if rb.Holds(m) {
				out[m] = &outcome{state: stateFailed, code: composerv1.ReasonCode_REASON_CODE_WRITE_FAILED,
					reason: "an apply failed: " + rb.Modules[m] + "; " + words, want: wantOf[m]}
			}
		}
	}()
	code := composerv1.ReasonCode_REASON_CODE_STATE_UNREADABLE
	if blocked == "" && pending != nil {
		// A failed ledger write blocks the apply until it is written.
		blocked = "apply done, ledger not committed; retried each pass"
		code = composerv1.ReasonCode_REASON_CODE_WRITE_FAILED
	}
	e.mu.Lock()
	e.block = nil
	if blocked != "" {
		e.block = &outcome{state: stateFailed, code: code, reason: blocked}
	}
	e.mu.Unlock()
	if blocked != "" {
		for _, w := range wants {
			out[w.GetModule()] = &outcome{state: stateFailed, code: code, reason: blocked, want: w}
		}
		return out, nil, nil
	}
	e.mu.Lock()
	// A module left part-way keeps the composition it had applied, with
	// the artifact digests it was written with.
	appliedComps := e.appliedLocked(nil, beforeView(e.ledger, e.rollback))
	var partWay map[string]string
	if e.rollback != nil {
		partWay = e.rollback.Modules
	}
	e.mu.Unlock()

	fresh := lv != nil && stale == "" && ring != nil
	inEffect := map[string]*apply.Composition{}
	removals := fresh
	held := map[string]*nodeenginev1.EngineHold{}
	for _, h := range holds {
		held[h.GetModule()] = h
	}
	if fresh {
		fetched := map[string]*apply.Composition{}
		for _, w := range lv.manifest.GetWants() {
			m := w.GetModule()
			if r, ok := e.retryRolledBack[m]; ok && r.digest == w.GetCompositionDigest() && now.Before(r.at) {
				// Rolled back after its apply failed part-way: not
				// written again (and rolled back again) at every pass.
				out[m] = &outcome{state: stateFailed, code: r.code, want: w,
					reason: r.reason + "; tried again from " + r.at.UTC().Format(time.RFC3339) + " (or at a restart)"}
				removals = false
				if old, ok := appliedComps[m]; ok {
					inEffect[m] = old
				}
				continue
			}
			var v *verified
			f := refused[prefetchKey(w)]
			if f == nil {
				v, f = e.composition(ctx, w, ring, now)
			}
			if f != nil {
				out[m] = &outcome{state: stateFailed, code: f.Code, reason: f.Reason, want: w}
				removals = false
				if old, ok := appliedComps[m]; ok {
					inEffect[m] = old
				}
				continue
			}
			fetched[m] = &apply.Composition{Module: m, Key: w.GetCompositionKey(), Comp: v.comp, Env: v.env, Parts: e.partsWanted(w)}
		}
		conflicts := PathConflicts(fetched)
		for m, c := range fetched {
			w := wantOf[m]
			if words, ok := conflicts[m]; ok {
				out[m] = &outcome{state: stateHeld, code: composerv1.ReasonCode_REASON_CODE_PATH_CONFLICT, reason: words, want: w}
				removals = false
			} else if h, ok := held[m]; ok {
				out[m] = &outcome{state: stateHeld, code: h.GetCode(), reason: h.GetWords(), want: w}
				if e.takesOver(c) {
					// The manifest moves paths to a module that cannot
					// apply yet: they stay with their owner, so nothing
					// leaves until the module takes them over.
					removals = false
				}
			} else {
				inEffect[m] = c
				continue
			}
			// A held module keeps what it last applied.
			if old, ok := appliedComps[m]; ok {
				inEffect[m] = old
			}
		}
		e.pruneCompCache(lv.manifest.GetWants())
	} else {
		for m, c := range appliedComps {
			inEffect[m] = c
		}
		for _, w := range wants {
			if h, ok := held[w.GetModule()]; ok {
				out[w.GetModule()] = &outcome{state: stateHeld, code: h.GetCode(), reason: h.GetWords(), want: w}
			}
		}
	}

	var prep *apply.Prepared
	// failedLeft are the modules that left whose applied composition
	// failed to prepare in this pass: not put back again (each turn would
	// refuse it once more and the loop would end with nothing applied).
	failedLeft := map[string]bool{}
	// Each turn takes out at least one failing module.
	for range len(inEffect) + len(appliedComps) + 2 {
		if !removals {
			for m, c := range appliedComps {
				if _, ok := inEffect[m]; !ok && wantOf[m] == nil && !failedLeft[m] {
					// A module that left keeps its paths while the
					// manifest is not applied whole (a move half done
					// must not remove and recreate).
					inEffect[m] = c
				}
			}
		}
		var failures map[string]*apply.Failure
		if prep, failures = e.prepareAndStage(ctx, apply.Plan{Compositions: ordered(inEffect), Ledger: e.ledger, Removals: removals}); len(failures) == 0 {
			break
		}
		removals = false
		for m, f := range failures {
			st := stateFailed
			if f.Code == composerv1.ReasonCode_REASON_CODE_PATH_CONFLICT {
				st = stateHeld
			}
			out[m] = &outcome{state: st, code: f.Code, reason: f.Reason, want: wantOf[m]}
			if old, ok := appliedComps[m]; ok && inEffect[m] != old {
				inEffect[m] = old
			} else {
				delete(inEffect, m)
				if wantOf[m] == nil {
					failedLeft[m] = true
				}
			}
		}
		prep = nil
	}
	if prep == nil {
		// Not reached while each turn takes a failing module out; should
		// it be, no want is left without its reason.
		for _, w := range wants {
			if _, ok := out[w.GetModule()]; !ok {
				out[w.GetModule()] = &outcome{state: stateFailed, code: composerv1.ReasonCode_REASON_CODE_WRITE_FAILED,
					reason: "nothing written: the pass found no apply without failures to prepare", want: w}
			}
		}
		return out, nil, nil
	}

	// The manifest is recorded applied only when every composition of it
	// is in effect or held by its entry: refused, failed or conflicting
	// compositions leave the applied manifest as it was.
	whole := fresh && removals
	if len(prep.Ops()) == 0 && e.recorded(lv, whole, inEffect) {
		return out, prep.Drift, prep.Notes
	}
	meta := apply.Meta{}
	for m, c := range inEffect {
		// A module left part-way is whole once its wanted composition
		// applies; its applied one again is not enough (what the apply
		// created stays until rolled back).
		if _, half := partWay[m]; half && c != appliedComps[m] {
			meta.Settle = append(meta.Settle, m)
		}
	}
	sort.Strings(meta.Settle)
	if fresh {
		meta.Revision = lv.manifest.GetRevision()
		meta.Traceparent, _ = telemetry.Traceparent(ctx)
	}
	if whole {
		meta.Manifest = lv.env
		for m := range appliedComps {
			if _, ok := inEffect[m]; !ok {
				meta.Drop = append(meta.Drop, m)
			}
		}
		sort.Strings(meta.Drop)
	}
	res, err := e.cfg.Applier.Execute(ctx, prep, e.ledger, e.cfg.Store, meta)
	if err != nil {
		reason := "apply journal not written, nothing applied: " + err.Error()
		for m := range inEffect {
			if _, ok := out[m]; !ok {
				out[m] = &outcome{state: stateFailed, code: composerv1.ReasonCode_REASON_CODE_WRITE_FAILED, reason: reason, want: wantOf[m]}
			}
		}
		trace.SpanFromContext(ctx).SetStatus(otelcodes.Error, reason)
		return out, nil, nil
	}
	e.mu.Lock()
	if res.CommitErr != nil {
		e.pending = res.Journal
		e.log.Error("committing the apply failed: retried each pass", slog.Any("error", res.CommitErr))
		for m := range inEffect {
			if _, ok := out[m]; !ok {
				out[m] = &outcome{state: stateFailed, code: composerv1.ReasonCode_REASON_CODE_WRITE_FAILED, reason: "apply done, ledger not committed: " + res.CommitErr.Error(), want: wantOf[m]}
			}
		}
		e.mu.Unlock()
		return out, prep.Drift, prep.Notes
	}
	e.takeAppliedLocked(meta.Manifest, inEffect, meta.Drop, res)
	e.mu.Unlock()
	for m, f := range res.Failed {
		out[m] = &outcome{state: stateFailed, code: f.Code, reason: f.Reason, want: wantOf[m]}
	}
	if !res.Rollback.Empty() {
		// Not left half until the next pass: rolled back at once. Its
		// words are the module's last (rolled at the pass's start may
		// hold older ones).
		if rolled == nil {
			rolled = map[string]string{}
		}
		back := e.rollBack(ctx)
		maps.Copy(rolled, back)
		e.mu.Lock()
		rb := e.rollback
		e.mu.Unlock()
		for m := range res.Rollback.Modules {
			if w := wantOf[m]; w != nil && !rb.Holds(m) {
				e.backOffRolledBack(m, w.GetCompositionDigest(), out[m].code, out[m].reason+"; "+back[m], now)
			}
		}
	}
	for m := range res.Applied {
		delete(e.retryRolledBack, m)
	}
	if len(prep.Drift) > 0 {
		e.log.Warn("drift found and corrected", slog.Any("paths", prep.Drift))
	}
	if res.Ops > 0 {
		e.log.Info("applied", slog.Uint64("revision", meta.Revision), slog.Int("ops", res.Ops), slog.Int("failed_modules", len(res.Failed)))
	}
	return out, prep.Drift, prep.Notes
}

// Waits before a wanted composition rolled back after its apply failed
// part-way is applied again: a lasting failure in the middle of a module's
// ops (a full disk) would otherwise write it and roll it back at every
// pass, the node's services seeing their files go back and forth.
const (
	rollbackRetryBase = time.Minute
	rollbackRetryMax  = 30 * time.Minute
)

// rolledBackWant is a wanted composition rolled back, and when it is
// applied again.
type rolledBackWant struct {
	digest string
	code   composerv1.ReasonCode
	reason string
	at     time.Time
	n      int
}

// backOffRolledBack holds module's wanted composition of digest back
// after its rollback: for rollbackRetryBase, doubling each time the same
// composition is rolled back again, up to rollbackRetryMax. Kept in
// memory: a restart tries it at once.
func (e *Engine) backOffRolledBack(module, digest string, code composerv1.ReasonCode, reason string, now time.Time) {
	n := 1
	if r, ok := e.retryRolledBack[module]; ok && r.digest == digest {
		n = r.n + 1
	}
	wait := rollbackRetryMax
	if n <= 5 {
		wait = min(rollbackRetryBase<<(n-1), rollbackRetryMax)
	}
	e.retryRolledBack[module] = &rolledBackWant{digest: digest, code: code, reason: reason, at: now.Add(wait), n: n}
}

// takesOver reports whether a composition declares a path the ledger holds
// for another module (a path moving to it).
func (e *Engine) takesOver(c *apply.Composition) bool {
	for _, r := range c.Comp.GetResources() {
		if rec, ok := e.ledger[r.GetPath()]; ok && rec.Module != c.Module {
			return true
		}
	}
	return false
}

// recorded reports whether the state already records what a pass without
// ops would commit, so an idle pass writes nothing.
func (e *Engine) recorded(lv *live, fresh bool, inEffect map[string]*apply.Composition) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	if fresh && (e.applied.Manifest == nil || envelope.Digest(e.applied.Manifest) != lv.digest) {
		return false
	}
	if len(inEffect) != len(e.applied.Compositions) {
		return false
	}
	for m, c := range inEffect {
		env, ok := e.applied.Compositions[m]
		if !ok || envelope.Digest(env) != envelope.Digest(c.Env) {
			return false
		}
	}
	return true
}

// appliedLocked returns the applied compositions (of the modules only
// names, nil: all) as an apply plans them, their parts from ledger.
func (e *Engine) appliedLocked(only map[string]string, ledger map[string]*state.LedgerRecord) map[string]*apply.Composition {
	out := map[string]*apply.Composition{}
	for m, env := range e.applied.Compositions {
		if _, ok := only[m]; only != nil && !ok {
			continue
		}
		c := e.appliedComps[m]
		key, _ := names.CompositionKey(e.cfg.Node, m, c.GetFingerprint())
		out[m] = &apply.Composition{Module: m, Key: key, Comp: c, Env: env, Parts: partsApplied(c, ledger)}
	}
	return out
}

// partsApplied returns the artifact parts an applied composition was
// written with, from the ledger: a held module keeps what it applied, never
// the digests of a newer want.
func partsApplied(c *typev1.Composition, ledger map[string]*state.LedgerRecord) map[string]*typev1.Artifact {
	out := map[string]*typev1.Artifact{}
	for _, r := range c.GetResources() {
		ref := r.GetArtifact()
		if ref == "" {
			continue
		}
		if rec, ok := ledger[r.GetPath()]; ok && rec.Type == state.TypeFile && names.ValidDigest(rec.Digest) {
			out[ref] = &typev1.Artifact{Ref: ref, Digest: rec.Digest, Size: rec.Size}
		}
	}
	return out
}

// partsWanted returns the artifact parts a want's composition is written
// with: its build record, made from the entry's artifact declarations and
// the want's parts only (DESIGN.md §7), so a part the entry does not
// declare is never fetched. A module whose entry is not held has none (it
// is held anyway); the node's own want has no entry and no parts.
func (e *Engine) partsWanted(w *typev1.Want) map[string]*typev1.Artifact {
	out := map[string]*typev1.Artifact{}
	if w.GetModule() == names.NodeModule {
		return out
	}
	r, ok := e.lookupEntry(w.GetFingerprint())
	if !ok || r.State != nodeenginev1.EntryState_ENTRY_STATE_ANSWERED {
		return out
	}
	for _, a := range picture.Build(r.Entry, w).Artifacts {
		out[a.Ref] = &typev1.Artifact{Ref: a.Ref, Digest: a.Digest, Size: a.Size}
	}
	return out
}

// PathConflicts finds paths two compositions of one manifest declare and
// returns, for each module involved, the words "2 resources declare <path>:
// <id1>, <id2>" (ids sorted).
func PathConflicts(comps map[string]*apply.Composition) map[string]string {
	type decl struct{ module, id string }
	seen := map[string]decl{}
	out := map[string]string{}
	for _, c := range ordered(comps) {
		for _, r := range c.Comp.GetResources() {
			prev, dup := seen[r.GetPath()]
			if !dup {
				seen[r.GetPath()] = decl{c.Module, r.GetId()}
				continue
			}
			ids := []string{prev.id, r.GetId()}
			sort.Strings(ids)
			words := fmt.Sprintf("2 resources declare %s: %s, %s", r.GetPath(), ids[0], ids[1])
			for _, m := range []string{prev.module, c.Module} {
				if _, ok := out[m]; !ok {
					out[m] = words
				}
			}
		}
	}
	return out
}

// ordered returns compositions in apply order: modules' by key, the node's
// own last.
func ordered(in map[string]*apply.Composition) []*apply.Composition {
	out := make([]*apply.Composition, 0, len(in))
	for _, c := range in {
		out = append(out, c)
	}
	sort.Slice(out, func(i, j int) bool {
		oi, oj := out[i].Module == names.NodeModule, out[j].Module == names.NodeModule
		if oi != oj {
			return oj
		}
		return out[i].Key < out[j].Key
	})
	return out
}

func (e *Engine) pruneCompCache(wants []*typev1.Want) {
	keep := map[string]bool{}
	for _, w := range wants {
		keep[w.GetCompositionDigest()] = true
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	for d := range e.compCache {
		if !keep[d] {
			delete(e.compCache, d)
		}
	}
}

// logAttempt logs a module's attempt that is new (another state, reason
// code or digest than the last): the log says why a module is not applied
// as the haves do, once per change, not at every pass.
func (e *Engine) logAttempt(module string, a *composerv1.Attempt) {
	attrs := []any{slog.String("module", module), slog.String("state", strings.TrimPrefix(a.GetState().String(), "ATTEMPT_STATE_")),
		slog.String("code", strings.TrimPrefix(a.GetReasonCode().String(), "REASON_CODE_")), slog.String("reason", a.GetReason())}
	if a.GetDigest() != "" {
		attrs = append(attrs, slog.String("digest", a.GetDigest()))
	}
	switch a.GetState() {
	case stateFailed, stateStale:
		e.log.Warn("module not applied", attrs...)
	case stateHeld:
		e.log.Info("module held", attrs...)
	}
}

// publishLocked turns the pass's outcomes into haves and, when they
// changed, wakes the Sync client to report them.
func (e *Engine) publishLocked(wants []*typev1.Want, outcomes map[string]*outcome, now time.Time) {
	modules := map[string]bool{}
	for _, w := range wants {
		modules[w.GetModule()] = true
	}
	for m := range e.appliedComps {
		modules[m] = true
	}
	for m := range outcomes {
		modules[m] = true
	}
	if e.refused != nil || e.block != nil {
		// The node's own have carries why nothing is applied, or why the
		// last manifest was refused, even when no want is kept.
		modules[names.NodeModule] = true
	}
	wantOf := map[string]*typev1.Want{}
	for _, w := range wants {
		wantOf[w.GetModule()] = w
	}
	var haves []*composerv1.Have
	attempts := map[string]*composerv1.Attempt{}
	for m := range modules {
		h := &composerv1.Have{Module: m}
		if c, ok := e.appliedComps[m]; ok {
			key, _ := names.CompositionKey(e.cfg.Node, m, c.GetFingerprint())
			h.Applied = &composerv1.AppliedRef{Fingerprint: c.GetFingerprint(), Key: key, Digest: envelope.Digest(e.applied.Compositions[m])}
		}
		w := wantOf[m]
		var a *composerv1.Attempt
		o := outcomes[m]
		switch {
		case e.block != nil && m == names.NodeModule:
			// Applying nothing is the cause; a refusal it caused (a
			// manifest that cannot be judged) says less.
			a = &composerv1.Attempt{State: e.block.state, ReasonCode: e.block.code, Reason: e.block.reason}
		case e.refused != nil && m == names.NodeModule:
			a = &composerv1.Attempt{State: stateFailed, ReasonCode: e.refused.code, Reason: e.refused.reason}
			if e.refused.code == composerv1.ReasonCode_REASON_CODE_EXPIRED {
				a.State = stateStale
			}
		case e.stale != "" && w != nil:
			a = &composerv1.Attempt{State: stateStale, ReasonCode: composerv1.ReasonCode_REASON_CODE_EXPIRED, Reason: e.stale}
		case o != nil:
			a = &composerv1.Attempt{State: o.state, ReasonCode: o.code, Reason: o.reason}
		case w != nil && h.GetApplied().GetDigest() == w.GetCompositionDigest():
			a = &composerv1.Attempt{State: stateApplied, Reason: strings.Join(e.notes[m], "; ")}
		}
		if a != nil {
			if w != nil {
				a.Fingerprint, a.Key, a.Digest = w.GetFingerprint(), w.GetCompositionKey(), w.GetCompositionDigest()
			}
			a.Since = timestamppb.New(now)
			if prev, ok := e.attempts[m]; ok && prev.GetState() == a.GetState() && prev.GetReasonCode() == a.GetReasonCode() && prev.GetDigest() == a.GetDigest() {
				a.Since = prev.GetSince()
			} else {
				e.logAttempt(m, a)
			}
			attempts[m] = a
			h.Attempt = a
		}
		if h.Applied == nil && h.Attempt == nil {
			continue
		}
		haves = append(haves, h)
	}
	sort.Slice(haves, func(i, j int) bool { return haves[i].GetModule() < haves[j].GetModule() })
	e.attempts = attempts
	if haveSetEqual(haves, e.haves) {
		return
	}
	e.haves = haves
	e.reportVer++
	close(e.changed)
	e.changed = make(chan struct{})
}

func haveSetEqual(a, b []*composerv1.Have) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if !proto.Equal(a[i], b[i]) {
			return false
		}
	}
	return true
}

// EntryWait bounds how long a pass waits for the first answers of the
// entries its live manifest's wants name: the catalog answers in
// milliseconds, and a module whose entry is not answered is held
// (ENTRY_ASKED), so without the wait a new fingerprint costs a pass that
// holds it and another that applies it once the answer comes.
const EntryWait = time.Second

// waitFirstAnswers waits, up to EntryWait, while an entry a want names is
// asked for the first time (no failure yet: one that failed is re-asked
// with backoff, and the module is held meanwhile, as before).
func (e *Engine) waitFirstAnswers(ctx context.Context, wants []*typev1.Want) {
	var timer *time.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	for {
		asked := false
		for _, w := range wants {
			if fp := w.GetFingerprint(); fp != "" {
				if r, ok := e.cache.Get(fp); ok && r.State == entries.Asked && r.Error == "" {
					asked = true
					break
				}
			}
		}
		if !asked {
			return
		}
		if timer == nil {
			timer = time.NewTimer(EntryWait)
		}
		select {
		case <-e.answered:
		case <-timer.C:
			return
		case <-ctx.Done():
			return
		}
	}
}
