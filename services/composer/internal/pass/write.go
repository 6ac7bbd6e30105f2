package pass

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"sort"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/protobuf/proto"

	"mesh.dev/internal/canonical"
	"mesh.dev/internal/envelope"
	"mesh.dev/internal/lint"
	"mesh.dev/internal/names"
	"mesh.dev/internal/natsx"
	"mesh.dev/internal/verify"
	composerv1 "mesh.dev/proto/mesh/composer/v1"
	signerv1 "mesh.dev/proto/mesh/signer/v1"
	typev1 "mesh.dev/proto/mesh/type/v1"
	"mesh.dev/services/composer/internal/compose"
	"mesh.dev/services/composer/internal/store"
)

// item is one composition of a pass.
type item struct {
	key  string
	own  bool
	comp *typev1.Composition
	// objects are the contents moved out of line, by digest.
	objects map[string][]byte
	// objectOwner names the resource each object came from.
	objectOwner map[string]string
	env         *typev1.Envelope
	digest      string

	// held is what the key held when read: its envelope when it decoded
	// and verified, its digest, its revision (0: absent).
	held       *typev1.Composition
	heldDigest string
	heldRev    uint64
	// beforeHeld and beforeDigest are what the key held when the pass
	// began, kept for judging after the pass replaced it.
	beforeHeld   *typev1.Composition
	beforeDigest string
	// differs is set when the held value is not this composition.
	differs bool
	// deferred is set when it differs but is not written: it would
	// replace the composition the node wants with a move the assigner
	// holds (see movesAhead).
	deferred bool
	// absent is set when the key held nothing when the pass read it.
	absent bool
	// written is the revision written by this pass.
	written uint64
	// reput is set when an object the composition names was held with
	// other bytes and was put again.
	reput bool
	// rec and recRev are the judgement record held under the key and its
	// revision (nil, 0: none), once recLoaded.
	rec       *composerv1.JudgementRecord
	recRev    uint64
	recLoaded bool
	// recSum is the mirror's digest of the record held when its content
	// was not read.
	recSum string

	judged compose.Judged
	policy compose.Policy
	err    error
}

// spill moves inline content out of line (DESIGN.md §5.2 step 1): every
// file over MaxInlineContent, then the largest inline files until the encoded
// composition is at most MaxCompositionSize.
func spill(c *typev1.Composition) (*typev1.Composition, map[string][]byte, map[string]string) {
	c = proto.Clone(c).(*typev1.Composition)
	objects := map[string][]byte{}
	owners := map[string]string{}
	move := func(r *typev1.Resource) {
		b := r.GetInline()
		d := names.Digest(b)
		objects[d] = b
		owners[d] = r.GetId()
		r.Content = &typev1.Resource_Object{Object: &typev1.ObjectRef{Digest: d, Size: int64(len(b))}}
	}
	var inline []*typev1.Resource
	for _, r := range c.GetResources() {
		if _, ok := r.GetContent().(*typev1.Resource_Inline); !ok {
			continue
		}
		if len(r.GetInline()) > lint.MaxInlineContent {
			move(r)
		} else {
			inline = append(inline, r)
		}
	}
	sort.SliceStable(inline, func(i, j int) bool { return len(inline[i].GetInline()) > len(inline[j].GetInline()) })
	for _, r := range inline {
		if canonical.Size(c) <= lint.MaxCompositionSize {
			break
		}
		move(r)
	}
	return c, objects, owners
}

// prepare spills, lints and seals each composition and reads what its key
// holds from the stream leader (DESIGN.md §5.2 steps 1 and 2) — except a
// module key the leader's listing of the node's keys did not show, which is
// absent. A composition that fails a step keeps its error; the others go
// on.
func (p *Passer) prepare(ctx context.Context, node string, keys []string, comps map[string]*typev1.Composition, st *nodeState) []*item {
	work := make([]*item, 0, len(keys))
	for _, key := range keys {
		it := &item{key: key, own: key == names.NodeKey(node)}
		it.comp, it.objects, it.objectOwner = spill(comps[key])
		work = append(work, it)
		if err := lint.CheckComposition(it.comp); err != nil {
			it.err = fmt.Errorf("%s: %w; not written", key, err)
			continue
		}
		env, digest, err := envelope.Seal(typev1.PayloadType_PAYLOAD_TYPE_COMPOSITION, it.comp)
		if err != nil {
			it.err = fmt.Errorf("%s: %w; not written", key, err)
			continue
		}
		it.env, it.digest = env, digest
		var obs observation
		// The node's own key is outside <node>.*.*: always looked up.
		if st.listed == nil || it.own || st.listed[key] {
			if p.fromMirror(ctx, st, it) {
				it.beforeHeld, it.beforeDigest = it.held, it.heldDigest
				it.differs, it.absent = it.heldDigest != it.digest, it.heldRev == 0
				continue
			}
			obs = p.observe(ctx, key)
		}
		if obs.err != nil {
			it.err = fmt.Errorf("%w; not written", obs.err)
			continue
		}
		p.hold(it, obs)
		it.beforeHeld, it.beforeDigest = it.held, it.heldDigest
		it.differs = it.heldDigest != it.digest
		it.absent = !obs.value
	}
	return work
}

// fromMirror looks a key up in the composition mirror, when it is current
// for this pass (one stream-info request, asked once), instead of reading
// it: a key the mirror shows with no value is absent, and one holding the
// very composition this pass sealed, signed by the key the signer signs
// with now in a signature verified recently, is held. It reports false when
// the key must be read.
func (p *Passer) fromMirror(ctx context.Context, st *nodeState, it *item) bool {
	if st.mirror == 0 {
		st.mirror = 2
		if p.compositions.current(ctx, p.cfg.Store.Compositions, st.tenure) {
			st.mirror = 1
		}
	}
	if st.mirror != 1 {
		return false
	}
	v, ok := p.compositions.lookup(it.key)
	if !ok || !v.put {
		// Absent: nothing held (a marker's revision is not needed; a
		// Create over it fails should a value appear).
		p.hold(it, observation{})
		return true
	}
	ring := p.cfg.Trust.Keyring()
	if ring == nil || v.sum != it.digest {
		return false
	}
	if keyID, ok := p.verified.known(cacheKeyOf(ring, v.sum, v.signatures), p.cfg.Now()); !ok || keyID != p.cfg.Trust.SigningKeyID() {
		return false
	}
	it.held, it.heldDigest, it.heldRev = it.comp, it.digest, v.rev
	return true
}

// observation is what a key of bucket compositions held when read: a
// value (at revision rev; env its envelope when it decodes), or nothing.
type observation struct {
	value bool
	rev   uint64
	env   *typev1.Envelope
	err   error
}

// observe reads a key from the stream leader.
func (p *Passer) observe(ctx context.Context, key string) observation {
	env, rev, _, err := p.cfg.Store.Composition(ctx, key)
	switch {
	case errors.Is(err, store.ErrNotFound):
		return observation{}
	case err != nil && rev == 0:
		return observation{err: fmt.Errorf("%s: read: %w", key, err)}
	case err != nil:
		return observation{value: true, rev: rev}
	}
	return observation{value: true, rev: rev, env: env}
}

// hold records an observation as what the key holds. A value that does not
// decode or verify counts as present with no content: it is replaced by an
// Update at its revision. A value signed by a key other than the signer's
// current one is treated the same way, so rotation re-signs it.
func (p *Passer) hold(it *item, obs observation) {
	it.held, it.heldDigest, it.heldRev = nil, "", obs.rev
	if obs.env == nil {
		return
	}
	if envelope.Digest(obs.env) == it.digest {
		// The very bytes this pass sealed: only the signature is left to
		// check (the content is this pass's own).
		if p.signedNow(obs.env) {
			it.held, it.heldDigest = it.comp, it.digest
		}
		return
	}
	if c, ok := p.verifyHeld(obs.env, it.key, true); ok {
		it.held, it.heldDigest = c, envelope.Digest(obs.env)
	}
}

// signedNow reports whether an envelope verifies against the keyset and was
// signed by the key the signer signs with now.
func (p *Passer) signedNow(env *typev1.Envelope) bool {
	ring := p.cfg.Trust.Keyring()
	if ring == nil {
		return false
	}
	keyID, err := p.verified.verify(ring, env, typev1.PayloadType_PAYLOAD_TYPE_COMPOSITION, p.cfg.Now())
	return err == nil && keyID == p.cfg.Trust.SigningKeyID()
}

// readHeld reads what a key holds now (after a CAS conflict).
func (p *Passer) readHeld(ctx context.Context, it *item) error {
	obs := p.observe(ctx, it.key)
	if obs.err != nil {
		return obs.err
	}
	p.hold(it, obs)
	return nil
}

// verifyHeld decodes and verifies a held envelope against the current
// keyset — and, with current set, checks it was signed by the key the signer
// signs with now; ok is false when it counts as no content.
func (p *Passer) verifyHeld(env *typev1.Envelope, key string, current bool) (*typev1.Composition, bool) {
	ring := p.cfg.Trust.Keyring()
	if ring == nil {
		return nil, false
	}
	keyID, err := p.verified.verify(ring, env, typev1.PayloadType_PAYLOAD_TYPE_COMPOSITION, p.cfg.Now())
	if err != nil || (current && keyID != p.cfg.Trust.SigningKeyID()) {
		return nil, false
	}
	c := &typev1.Composition{}
	if err := envelope.Open(env, typev1.PayloadType_PAYLOAD_TYPE_COMPOSITION, c); err != nil {
		return nil, false
	}
	if k, err := names.CompositionKey(c.GetNode(), c.GetModule(), c.GetFingerprint()); err != nil || k != key {
		return nil, false
	}
	return c, true
}

// write carries out steps 1 to 5 of DESIGN.md §5.2 for every composition
// of a node: the objects of each composition that differs are held, all
// that differ are signed in one batch, then the modules' compositions are
// written (CAS) and judged, each keeping its judgement record, and last the
// node's own — not written when a module's composition of this pass failed.
func (p *Passer) write(ctx context.Context, st *nodeState, work []*item, jc *judging, builds map[string]*catalogBuild, fpHolds []fpHold, fail func(error)) {
	node := st.spec.GetNode()
	moduleFailed := false
	failed := func(it *item, err error) {
		it.err = err
		fail(err)
		if !it.own {
			moduleFailed = true
		}
	}
	// The compositions whose objects the engine found other bytes in
	// (DIGEST_MISMATCH or SIZE_EXCEEDED) or could not fetch (FETCH_FAILED):
	// their objects are hashed again.
	suspect := suspectKeys(st.haves)
	// A write over the composition the node wants is decided with the
	// assignment it leads to (see movesAhead).
	var ahead map[string]bool
	for _, it := range work {
		if it.err == nil && it.differs && sameKeyMove(st, it) {
			ahead = p.movesAhead(ctx, st, work, jc, builds, fpHolds)
			break
		}
	}
	var toSign []*item
	for _, it := range work {
		if it.err != nil {
			failed(it, it.err)
			continue
		}
		if !it.differs {
			if suspect[it.key] {
				if err := p.holdObjects(ctx, node, it, true); err != nil {
					failed(it, err)
				} else if it.reput && st.wanted(it.key, it.digest) {
					p.repairs.note(it.key, p.cfg.Now())
				}
			}
			continue
		}
		if sameKeyMove(st, it) && !ahead[it.key+" "+it.digest] {
			// Neither signed nor written: the held want stays held.
			it.differs, it.deferred = false, true
			continue
		}
		if err := p.holdObjects(ctx, node, it, false); err != nil {
			failed(it, err)
			continue
		}
		toSign = append(toSign, it)
	}
	if len(toSign) > 0 {
		comps := make([]*typev1.Composition, len(toSign))
		keys := make([]string, len(toSign))
		for i, it := range toSign {
			comps[i], keys[i] = it.comp, it.key
		}
		// The signer refuses a request of an older tenure; the local check
		// spares it one this composer already knows is.
		err := p.stillHolds(st)
		var signed []*signerv1.SignedItem
		if err == nil {
			if p.hooks.beforeSign != nil {
				p.hooks.beforeSign(keys)
			}
			signed, err = p.cfg.Signer.SignCompositions(ctx, st.epoch, comps)
		}
		if err != nil {
			for _, it := range toSign {
				it.err = fmt.Errorf("%s: sign: %w; not written", it.key, err)
				if !it.own {
					moduleFailed = true
				}
			}
			fail(fmt.Errorf("node %s: sign %d compositions: %w", node, len(toSign), err))
			toSign = nil
		}
		for i, it := range toSign {
			s := signed[i]
			if s.GetDigest() != it.digest || !bytes.Equal(s.GetEnvelope().GetPayload(), it.env.GetPayload()) {
				failed(it, fmt.Errorf("%s: the signer returned other bytes than were asked; not written", it.key))
				continue
			}
			// A signature that does not verify would be refused by every
			// engine; checking it now also spares the next pass the check.
			if ring := p.cfg.Trust.Keyring(); ring != nil {
				if _, err := p.verified.verify(ring, s.GetEnvelope(), typev1.PayloadType_PAYLOAD_TYPE_COMPOSITION, p.cfg.Now()); err != nil {
					if errors.Is(err, verify.ErrUnknownKey) {
						// The signer was restarted on a new key: take its
						// keyset now; the retry of this pass verifies.
						p.cfg.Trust.Stale()
					}
					failed(it, fmt.Errorf("%s: the signer's signature does not verify (%v); not written", it.key, err))
					continue
				}
			}
			it.env = s.GetEnvelope()
		}
	}
	// keep writes a composition that differs and keeps its judgement
	// record; it reports whether it wrote either, so the composition must
	// be read again (step 5).
	keep := func(it *item) bool {
		if it.err != nil {
			return false
		}
		if it.deferred {
			// The key keeps what the node wants, and its record.
			return false
		}
		if it.differs {
			err := p.cas(ctx, it)
			if it.written != 0 {
				st.wrote(it.key, it.written)
			}
			if err != nil {
				failed(it, err)
				return false
			}
		}
		if (it.written != 0 || it.reput) && st.wanted(it.key, it.digest) {
			// What the held manifest names was missing or other bytes (a
			// store that went back, a replay, a corruption) and is right
			// again (see needsCommit).
			p.repairs.note(it.key, p.cfg.Now())
		}
		jc.judge(ctx, it)
		wrote, err := p.writeRecord(ctx, it, jc)
		if err != nil {
			failed(it, err)
			return false
		}
		// Nothing written, nothing to follow: the record describes what
		// compare read.
		return wrote || it.differs
	}
	// The modules' compositions are written and recorded, then read again
	// together; the node's own after them.
	var own *item
	var reread []*item
	for _, it := range work {
		if it.own {
			own = it
			continue
		}
		if keep(it) {
			reread = append(reread, it)
		}
	}
	p.followAll(ctx, reread, jc, failed)
	if own == nil || own.err != nil {
		return
	}
	if moduleFailed {
		failed(own, fmt.Errorf("%s is not written: a module's composition of this pass was not", own.key))
		return
	}
	if keep(own) {
		p.followAll(ctx, []*item{own}, jc, failed)
	}
}

// followAll reads again the compositions a pass wrote (or wrote the records
// of) and follows another writer's where one replaced it (step 5). With the
// composition mirror current as of now — after every one of those writes —
// a key it shows holding the pass's digest needs no read: nothing replaced
// it. Any other key is read from the stream leader and followed.
func (p *Passer) followAll(ctx context.Context, items []*item, jc *judging, failed func(*item, error)) {
	if len(items) == 0 {
		return
	}
	if p.hooks.beforeReread != nil {
		for _, it := range items {
			p.hooks.beforeReread(it.key, 0)
		}
	}
	// One stream-info request instead of a read per key; a single key is
	// read as cheaply.
	mirrored := len(items) > 1 && p.compositions.current(ctx, p.cfg.Store.Compositions, jc.st.tenure)
	for _, it := range items {
		if mirrored {
			if v, ok := p.compositions.lookup(it.key); ok && v.put && v.sum == it.digest {
				continue
			}
		}
		if err := p.follow(ctx, it, jc); err != nil {
			failed(it, err)
		}
	}
}

// holdObjects makes sure every object a composition names is held in the
// object store, its stored bytes hashing to its name, before the
// composition is signed and written: content this pass moved out of line
// is put unless held already (and put again over other bytes stored under
// its name); an object named otherwise (a node's own resource naming one)
// must be held. A composition is never written naming an object that is
// not held.
//
// Objects are derived and shared by digest, so a write past the composer
// can leave other bytes under a digest's name. An object is hashed once
// per stored version (its NUID) — every pass writing a composition would
// otherwise read every object again — or, with check set, again whatever
// was verified before: an engine reported the composition's content
// refused (see suspectKeys).
func (p *Passer) holdObjects(ctx context.Context, node string, it *item, check bool) error {
	seen := map[string]bool{}
	for _, r := range it.comp.GetResources() {
		o := r.GetObject()
		if o == nil || seen[o.GetDigest()] {
			continue
		}
		d := o.GetDigest()
		seen[d] = true
		if p.cfg.ObjectTouched != nil {
			// Before the check, so a sweep that started earlier keeps it.
			p.cfg.ObjectTouched(d)
		}
		info, err := p.cfg.Store.Objects.GetInfo(ctx, d)
		held := err == nil && !info.Deleted && info.Size == uint64(o.GetSize())
		why := "the object store holds no such object"
		switch {
		case err != nil && !errors.Is(err, jetstream.ErrObjectNotFound):
			why = err.Error()
		case err == nil && !held:
			why = fmt.Sprintf("the object store holds %d bytes, the resource says %d", info.Size, o.GetSize())
		}
		if held && (check || !p.objects.verified(d, info.NUID)) {
			ok, herr := p.objectHashes(ctx, d)
			_, ours := it.objects[d]
			switch {
			case herr != nil && !ours:
				return fmt.Errorf("%s: resource %s: object %s of node %s cannot be read to check it (%v); not written", it.key, r.GetId(), d, node, herr)
			case herr != nil:
				// Its description is there but its bytes do not come (a
				// put a crash cut short, chunks lost): this pass has the
				// bytes and puts them again.
				held, why = false, fmt.Sprintf("its stored bytes cannot be read (%v)", herr)
				p.cfg.Logger.WarnContext(ctx, "an object's stored bytes cannot be read: put again", "object", d, "key", it.key, "node", node, "error", herr)
			case !ok:
				held, why = false, "its stored bytes do not hash to its name"
				p.cfg.Logger.WarnContext(ctx, "an object's stored bytes do not hash to its name", "object", d, "key", it.key, "node", node)
			default:
				p.objects.remember(d, info.NUID)
			}
		}
		if held {
			continue
		}
		wasHeld := err == nil && !info.Deleted
		b, ours := it.objects[d]
		if !ours {
			return fmt.Errorf("%s: resource %s: object %s of node %s is not held (%s); not written", it.key, r.GetId(), d, node, why)
		}
		put, err := natsx.PutObject(ctx, p.cfg.Store.Objects, d, bytes.NewReader(b), int64(len(b)), p.cfg.Store.ObjectOptions()...)
		if err != nil {
			return fmt.Errorf("%s: resource %s: object %s of node %s is not held (%v); not written", it.key, it.objectOwner[d], d, node, err)
		}
		p.objects.remember(d, put.NUID)
		it.reput = it.reput || wasHeld
	}
	return nil
}

// objectHashes reports whether an object's stored bytes hash to its name.
func (p *Passer) objectHashes(ctx context.Context, digest string) (bool, error) {
	r, _, err := natsx.GetObject(ctx, p.cfg.Store.Objects, digest, 0, p.cfg.Store.ObjectOptions()...)
	if err != nil {
		return false, err
	}
	defer r.Close()
	h := sha256.New()
	if _, err := io.Copy(h, r); err != nil {
		return false, err
	}
	return names.DigestOfSum(h.Sum(nil)) == digest, nil
}

// suspectKeys are the composition keys of a node's attempts that failed for
// the content of a file: DIGEST_MISMATCH or SIZE_EXCEEDED, or FETCH_FAILED
// (an object whose bytes do not come: its chunks lost under its
// description).
func suspectKeys(h *composerv1.HaveRecord) map[string]bool {
	out := map[string]bool{}
	for _, hv := range h.GetHaves() {
		a := hv.GetAttempt()
		if a.GetState() != composerv1.AttemptState_ATTEMPT_STATE_FAILED {
			continue
		}
		switch a.GetReasonCode() {
		case composerv1.ReasonCode_REASON_CODE_DIGEST_MISMATCH, composerv1.ReasonCode_REASON_CODE_SIZE_EXCEEDED,
			composerv1.ReasonCode_REASON_CODE_FETCH_FAILED:
			out[a.GetKey()] = true
		}
	}
	return out
}

// cas writes a signed composition: Create when absent, Update at the read
// revision otherwise. A conflict re-reads: when the key now holds this very
// composition there is nothing to do; otherwise the write is retried with
// backoff a bounded number of times. Never a blind overwrite.
func (p *Passer) cas(ctx context.Context, it *item) error {
	ctx, span := p.cfg.Tracer.Start(ctx, "composer.write.composition", trace.WithAttributes(attribute.String("mesh.key", it.key), attribute.String("mesh.digest", it.digest)))
	defer span.End()
	backoff := 10 * time.Millisecond
	for attempt := 0; ; attempt++ {
		if p.hooks.beforeWrite != nil {
			p.hooks.beforeWrite(it.key, attempt)
		}
		rev, err := p.cfg.Store.WriteComposition(ctx, it.key, it.env, it.heldRev)
		if err == nil {
			p.own.wrote(natsx.BucketCompositions, it.key, rev, false)
			it.written = rev
			return nil
		}
		if !errors.Is(err, store.ErrConflict) {
			span.RecordError(err)
			span.SetStatus(codes.Error, err.Error())
			return fmt.Errorf("%s: write: %w; not written", it.key, err)
		}
		if attempt >= p.cfg.CASRetries {
			err = fmt.Errorf("%s: write conflicted %d times: %w; not written", it.key, attempt+1, err)
			span.RecordError(err)
			span.SetStatus(codes.Error, err.Error())
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(backoff):
		}
		backoff *= 2
		if err := p.readHeld(ctx, it); err != nil {
			return fmt.Errorf("%w; not written", err)
		}
		if it.heldDigest == it.digest {
			// Another writer wrote this very composition.
			return nil
		}
	}
}
