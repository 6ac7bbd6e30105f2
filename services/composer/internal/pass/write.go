package pass

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sort"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/protobuf/proto"

	"mesh.dev/internal/canonical"
	"mesh.dev/internal/envelope"
	"mesh.dev/internal/lint"
	"mesh.dev/internal/names"
	"mesh.dev/internal/natsx"
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
	// written is the revision written by this pass.
	written uint64

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

// prepare spills, seals and lints each composition, and reads what its key
// holds.
func (p *Passer) prepare(ctx context.Context, node string, st *nodeState, keys []string, comps map[string]*typev1.Composition, mode Mode) ([]*item, error) {
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
		if err := p.readHeld(ctx, it); err != nil {
			return nil, err
		}
		it.beforeHeld, it.beforeDigest = it.held, it.heldDigest
		it.differs = it.heldDigest != it.digest
	}
	return work, nil
}

// readHeld reads a key from the stream leader. A value that does not decode
// or verify counts as present with no content: it is replaced by an Update
// at its revision. A value signed by a key other than the signer's current
// one is treated the same way, so rotation re-signs it.
func (p *Passer) readHeld(ctx context.Context, it *item) error {
	it.held, it.heldDigest, it.heldRev = nil, "", 0
	env, rev, _, err := p.cfg.Store.Composition(ctx, it.key)
	switch {
	case errors.Is(err, store.ErrNotFound):
		return nil
	case err != nil && rev == 0:
		return fmt.Errorf("%s: read: %w", it.key, err)
	case err != nil:
		it.heldRev = rev
		return nil
	}
	it.heldRev = rev
	c, ok := p.verifyHeld(env, it.key, true)
	if !ok {
		return nil
	}
	it.held, it.heldDigest = c, envelope.Digest(env)
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
	keyID, err := ring.Verify(env, typev1.PayloadType_PAYLOAD_TYPE_COMPOSITION, p.cfg.Now())
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

// writeAll holds the objects, signs what differs in one batch and writes
// each with CAS: modules first, the node's own last and only when no module
// failed.
func (p *Passer) writeAll(ctx context.Context, node string, work []*item, moduleFailed *bool, fail func(error)) {
	var toSign []*item
	for _, it := range work {
		if it.err != nil || !it.differs {
			continue
		}
		if err := p.holdObjects(ctx, node, it); err != nil {
			it.err = err
			fail(err)
			if !it.own {
				*moduleFailed = true
			}
			continue
		}
		toSign = append(toSign, it)
	}
	if len(toSign) > 0 {
		comps := make([]*typev1.Composition, len(toSign))
		for i, it := range toSign {
			comps[i] = it.comp
		}
		signed, err := p.cfg.Signer.SignCompositions(ctx, comps)
		if err != nil {
			for _, it := range toSign {
				it.err = fmt.Errorf("%s: sign: %w; not written", it.key, err)
				if !it.own {
					*moduleFailed = true
				}
			}
			fail(fmt.Errorf("node %s: sign %d compositions: %w", node, len(toSign), err))
			toSign = nil
		}
		for i, it := range toSign {
			s := signed[i]
			if s.GetDigest() != it.digest || !bytes.Equal(s.GetEnvelope().GetPayload(), it.env.GetPayload()) {
				it.err = fmt.Errorf("%s: the signer returned other bytes than were asked; not written", it.key)
				fail(it.err)
				if !it.own {
					*moduleFailed = true
				}
				continue
			}
			it.env = s.GetEnvelope()
		}
	}
	for _, it := range work {
		if it.err != nil || !it.differs || it.env.GetSignatures() == nil {
			continue
		}
		if it.own && *moduleFailed {
			it.err = fmt.Errorf("%s is not written: a module's composition of this pass was not", it.key)
			fail(it.err)
			continue
		}
		if err := p.cas(ctx, it); err != nil {
			it.err = err
			fail(err)
			if !it.own {
				*moduleFailed = true
			}
		}
	}
}

// holdObjects puts every object a composition names into the object store,
// unless held already. A composition is never written naming an object that
// is not held.
func (p *Passer) holdObjects(ctx context.Context, node string, it *item) error {
	for d, b := range it.objects {
		info, err := p.cfg.Store.Objects.GetInfo(ctx, d)
		if err == nil && info.Size == uint64(len(b)) && !info.Deleted {
			continue
		}
		if _, err := natsx.PutObject(ctx, p.cfg.Store.Objects, d, bytes.NewReader(b), int64(len(b)), p.cfg.Store.ObjectOptions()...); err != nil {
			return fmt.Errorf("%s: resource %s: object %s of node %s is not held (%v); not written", it.key, it.objectOwner[d], d, node, err)
		}
	}
	return nil
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
		rev, err := p.cfg.Store.WriteComposition(ctx, it.key, it.env, it.heldRev)
		if err == nil {
			it.written = rev
			return nil
		}
		if !errors.Is(err, store.ErrConflict) {
			span.RecordError(err)
			return fmt.Errorf("%s: write: %w; not written", it.key, err)
		}
		if attempt >= p.cfg.CASRetries {
			return fmt.Errorf("%s: write conflicted %d times: %w; not written", it.key, attempt+1, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(backoff):
		}
		backoff *= 2
		if err := p.readHeld(ctx, it); err != nil {
			return err
		}
		if it.heldDigest == it.digest {
			return nil
		}
	}
}
