package pass

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/protobuf/proto"

	"mesh.dev/internal/envelope"
	"mesh.dev/internal/names"
	composerv1 "mesh.dev/proto/mesh/composer/v1"
	typev1 "mesh.dev/proto/mesh/type/v1"
	"mesh.dev/services/composer/internal/compose"
	"mesh.dev/services/composer/internal/store"
)

// maxFollows is how many times the judgement follows a composition that
// another writer replaced under this one.
const maxFollows = 3

// judging is what judging a node's compositions needs: what the node
// applied and what each key held before this pass wrote.
type judging struct {
	p         *Passer
	st        *nodeState
	spec      *composerv1.NodeSpec
	haves     *composerv1.HaveRecord
	manifests map[string]*typev1.ModuleManifest
	// before holds what each key held when the pass read it, by key.
	before       map[string]*typev1.Composition
	beforeDigest map[string]string
	// own is the content of the node's applied own composition.
	own    *typev1.Composition
	ownRef *composerv1.AppliedRef
	// mirror says whether the record mirror is current for this pass: 0
	// not asked yet, 1 yes, 2 no.
	mirror int
}

// useMirror reports whether the pass may compare judgement records with
// the mirror; it asks once per pass.
func (jc *judging) useMirror(ctx context.Context) bool {
	if jc.mirror == 0 {
		jc.mirror = 2
		if jc.p.mirrorCurrent(ctx, jc.st) {
			jc.mirror = 1
		}
	}
	return jc.mirror == 1
}

func (p *Passer) judging(ctx context.Context, st *nodeState, work []*item, manifests map[string]*typev1.ModuleManifest) *judging {
	jc := &judging{p: p, st: st, spec: st.spec, haves: st.haves, manifests: manifests,
		before: map[string]*typev1.Composition{}, beforeDigest: map[string]string{}}
	for _, it := range work {
		if it.beforeHeld != nil {
			jc.before[it.key], jc.beforeDigest[it.key] = it.beforeHeld, it.beforeDigest
		}
	}
	jc.ownRef = appliedOf(st.haves, names.NodeModule)
	jc.own = jc.appliedContent(ctx, jc.ownRef)
	return jc
}

// appliedContent returns the content of what the node applied at a key and
// digest: from the values this pass read before writing when it is the same
// key, else from the bucket. nil when it is no longer held.
func (jc *judging) appliedContent(ctx context.Context, ref *composerv1.AppliedRef) *typev1.Composition {
	if ref == nil || ref.GetDigest() == "" {
		return nil
	}
	if c, ok := jc.before[ref.GetKey()]; ok && jc.beforeDigest[ref.GetKey()] == ref.GetDigest() {
		return c
	}
	env, ok := jc.p.cfg.Store.CompositionOf(ref.GetKey(), ref.GetDigest())
	if !ok {
		var err error
		env, _, _, err = jc.p.cfg.Store.Composition(ctx, ref.GetKey())
		if err != nil || envelope.Digest(env) != ref.GetDigest() {
			return nil
		}
	}
	c := &typev1.Composition{}
	if err := envelope.Open(env, typev1.PayloadType_PAYLOAD_TYPE_COMPOSITION, c); err != nil {
		return nil
	}
	return c
}

// judge sets a composition's policy and judges it against what the node
// applied (DESIGN.md §5.3).
func (jc *judging) judge(ctx context.Context, it *item) {
	module := it.comp.GetModule()
	if it.own {
		it.policy = compose.Policy{Policy: typev1.UpgradePolicy_UPGRADE_POLICY_AUTO, From: compose.PolicyFromDefault, Why: "the node's own composition always moves"}
	} else {
		it.policy = compose.ResolvePolicy(jc.spec, module, jc.manifests[module])
	}
	it.judged = jc.judgeOne(ctx, it.comp, it.digest)
}

// judgeOne judges a composition: against the node's applied composition of
// its module, else against the applied own composition's resources naming
// the module, else NEW.
func (jc *judging) judgeOne(ctx context.Context, c *typev1.Composition, digest string) compose.Judged {
	applied := compose.Applied{}
	if c.GetModule() == names.NodeModule {
		if jc.own != nil {
			applied.Module, applied.ModuleDigest = jc.own, jc.ownRef.GetDigest()
		} else if jc.ownRef != nil {
			return lostJudgement(jc.ownRef.GetDigest())
		}
		return compose.Judge(c, applied)
	}
	ref := appliedOf(jc.haves, c.GetModule())
	if ref != nil {
		if ref.GetDigest() == digest {
			return compose.Judged{Judgement: composerv1.Judgement_JUDGEMENT_SAME, Words: "applied", Against: digest}
		}
		content := jc.appliedContent(ctx, ref)
		if content == nil {
			return lostJudgement(ref.GetDigest())
		}
		applied.Module, applied.ModuleDigest = content, ref.GetDigest()
		if content.GetFingerprint() != c.GetFingerprint() {
			// Artifacts name their bytes by ref: the builds say which.
			applied.ModuleParts = jc.partsOf(ctx, content.GetFingerprint())
			applied.NextParts = jc.partsOf(ctx, c.GetFingerprint())
		}
	} else if jc.own != nil {
		applied.Own, applied.OwnDigest = jc.own, jc.ownRef.GetDigest()
	}
	return compose.Judge(c, applied)
}

// partsOf returns the artifact digests of fp's build by ref; nil when the
// catalog cannot say (an artifact is then judged changed).
func (jc *judging) partsOf(ctx context.Context, fp string) map[string]string {
	b, err := jc.p.cfg.Catalog.Build(ctx, fp)
	if err != nil {
		return nil
	}
	out := make(map[string]string, len(b.GetArtifacts()))
	for _, a := range b.GetArtifacts() {
		out[a.GetRef()] = a.GetDigest()
	}
	return out
}

const lostWords = "the applied composition "

// lostJudgement judges against an applied composition whose content is no
// longer held: it can only be called a change, so MANUAL still holds it.
func lostJudgement(digest string) compose.Judged {
	return compose.Judged{Judgement: composerv1.Judgement_JUDGEMENT_CHANGES,
		Words: lostWords + digest + " is no longer held; judged a change", Against: digest}
}

func isLost(j compose.Judged) bool { return strings.HasPrefix(j.Words, lostWords) }

func recordOf(digest string, j compose.Judged, pol compose.Policy) *composerv1.JudgementRecord {
	return &composerv1.JudgementRecord{
		Digest: digest, Judgement: j.Judgement, Words: j.Words, UserListOnly: j.UserListOnly, Against: j.Against,
		Policy: pol.Policy, PolicyFrom: pol.From, PolicyWhy: pol.Why,
	}
}

// readRecord reads a judgement record; one that does not decode counts as
// absent at its revision (it is replaced).
func (p *Passer) readRecord(ctx context.Context, key string) (*composerv1.JudgementRecord, uint64, error) {
	old, rev, err := p.cfg.Store.Record(ctx, key)
	switch {
	case errors.Is(err, store.ErrNotFound):
		return nil, 0, nil
	case err != nil && rev == 0:
		return nil, 0, fmt.Errorf("%s: read judgement: %w", key, err)
	case err != nil:
		return nil, rev, nil
	}
	return old, rev, nil
}

// writeRecord keeps a composition's judgement record (DESIGN.md §5.2 step
// 5): written (CAS) when it differs from the one held. What is held comes
// from the record mirror when it is current for this pass, else from a
// read; the record of a composition that was absent is created without a
// read (it rarely has one), and read only when the create finds one. It
// reports whether it wrote.
func (p *Passer) writeRecord(ctx context.Context, it *item, jc *judging) (bool, error) {
	ctx, span := p.cfg.Tracer.Start(ctx, "composer.write.judgement", trace.WithAttributes(attribute.String("mesh.key", it.key)))
	defer span.End()
	wrote, err := p.writeRecordSpan(ctx, it, jc)
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	return wrote, err
}

func (p *Passer) writeRecordSpan(ctx context.Context, it *item, jc *judging) (bool, error) {
	if !it.recLoaded {
		switch {
		case it.absent:
		case jc.useMirror(ctx) && !isLost(it.judged):
			// What the mirror holds, current as of this pass: the
			// revision and a digest of the record.
			if v, ok := p.records.lookup(it.key); ok {
				it.recRev, it.recSum = v.rev, v.sum
			}
		default:
			var err error
			if it.rec, it.recRev, err = p.readRecord(ctx, it.key); err != nil {
				return false, err
			}
		}
		it.recLoaded = true
		// A judgement against content no longer held keeps the record
		// made while it was.
		if old := it.rec; old != nil && old.GetDigest() == it.digest && old.GetAgainst() == it.judged.Against && isLost(it.judged) {
			it.judged = compose.Judged{Judgement: old.GetJudgement(), Words: old.GetWords(), UserListOnly: old.GetUserListOnly(), Against: old.GetAgainst()}
		}
	}
	want := recordOf(it.digest, it.judged, it.policy)
	held := func() bool {
		if it.rec != nil {
			return proto.Equal(it.rec, want)
		}
		return it.recSum != "" && it.recSum == recordSum(want)
	}
	for attempt := 0; !held(); attempt++ {
		if attempt > p.cfg.CASRetries {
			return false, fmt.Errorf("%s: the judgement record changed under this writer %d times; the next pass writes it", it.key, attempt)
		}
		next, err := p.cfg.Store.WriteRecord(ctx, it.key, want, it.recRev)
		if err == nil {
			it.rec, it.recRev, it.recSum = want, next, ""
			jc.st.recorded(it.key)
			return true, nil
		}
		if !errors.Is(err, store.ErrConflict) {
			return false, fmt.Errorf("%s: write judgement: %w", it.key, err)
		}
		// Another writer recorded first: read theirs and compare again.
		it.recSum = ""
		if it.rec, it.recRev, err = p.readRecord(ctx, it.key); err != nil {
			return false, err
		}
	}
	return false, nil
}

// follow reads a composition again from the stream leader after this pass
// wrote it or its record: while it holds another digest than the one
// judged, that one is judged and its record kept instead; after maxFollows
// the composition fails. A key found deleted deletes its record and fails
// the composition: it is not held.
func (p *Passer) follow(ctx context.Context, it *item, jc *judging) error {
	for follow := 0; ; follow++ {
		if follow > 0 && p.hooks.beforeReread != nil {
			p.hooks.beforeReread(it.key, follow)
		}
		if follow == 0 && p.stillJudged(ctx, jc.st, it) {
			return nil
		}
		obs := p.observe(ctx, it.key)
		switch {
		case obs.err != nil:
			return fmt.Errorf("%s: re-read: %w", it.key, obs.err)
		case !obs.value:
			err := p.cfg.Store.Composed.Delete(ctx, it.key)
			if err != nil && !errors.Is(err, store.ErrNotFound) {
				return fmt.Errorf("%s: delete the judgement of a deleted composition: %w", it.key, err)
			}
			if err == nil {
				jc.st.recorded(it.key)
			}
			// Not held: no assignment of this pass may name it (step 7).
			return fmt.Errorf("%s was deleted under this writer after it was written; not held, so not wanted by this pass (the next one writes it again)", it.key)
		}
		var held string
		if obs.env != nil {
			held = envelope.Digest(obs.env)
		}
		if held == it.digest {
			return nil
		}
		if follow >= maxFollows {
			return fmt.Errorf("%s moved under this writer %d times; its digest is kept by the next pass", it.key, follow+1)
		}
		c, ok := (*typev1.Composition)(nil), false
		if obs.env != nil {
			c, ok = p.verifyHeld(obs.env, it.key, false)
		}
		if !ok {
			// Not a composition anyone can judge; the next pass replaces it.
			return fmt.Errorf("%s was replaced under this writer by a value that does not verify; the next pass replaces it", it.key)
		}
		it.digest, it.comp = held, c
		it.judged = jc.judgeOne(ctx, c, held)
		if _, err := p.writeRecord(ctx, it, jc); err != nil {
			return err
		}
	}
}

// stillJudged reports whether the composition mirror, current as of now
// (after this pass's writes: its barrier is taken after them, see
// mirror.current), shows the key holding the very digest judged. That is what the
// re-read from the stream leader would find, without moving the value;
// anything else (the mirror behind, the key moved or gone) is read.
func (p *Passer) stillJudged(ctx context.Context, st *nodeState, it *item) bool {
	if !p.compositions.current(ctx, p.cfg.Store.Compositions, st.tenure) {
		return false
	}
	v, ok := p.compositions.lookup(it.key)
	return ok && v.put && v.sum == it.digest
}
