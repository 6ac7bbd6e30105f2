package service

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/protobuf/types/known/timestamppb"

	"mesh.dev/internal/canonical"
	"mesh.dev/internal/envelope"
	"mesh.dev/internal/lint"
	"mesh.dev/internal/names"
	"mesh.dev/internal/verify"
	signerv1 "mesh.dev/proto/mesh/signer/v1"
	typev1 "mesh.dev/proto/mesh/type/v1"
	"mesh.dev/services/signer/internal/audit"
	"mesh.dev/services/signer/internal/state"
)

// SignManifests is the typed operation behind the RPC: epoch, lint, a request
// audit record, revisions assigned and made durable, the manifests built and
// signed, a signed audit record.
func (s *Server) SignManifests(ctx context.Context, req *signerv1.SignManifestsRequest) (*signerv1.SignManifestsResponse, error) {
	const method = "SignManifests"
	ctx, span := s.tracer.Start(ctx, "signer.SignManifests", trace.WithAttributes(
		attribute.Int("mesh.batch_size", len(req.GetManifests())),
		attribute.Int64("mesh.fencing_epoch", int64(req.GetFencingEpoch())),
	))
	defer span.End()
	resp, err := s.signManifests(ctx, method, req)
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
		return nil, s.toStatus(ctx, method, err)
	}
	return resp, nil
}

func (s *Server) signManifests(ctx context.Context, method string, req *signerv1.SignManifestsRequest) (*signerv1.SignManifestsResponse, error) {
	s.epochMu.RLock()
	defer s.epochMu.RUnlock()
	if err := s.checkEpoch(req.GetFencingEpoch()); err != nil {
		return nil, s.refuse(ctx, method, 0, err)
	}
	items := req.GetManifests()
	if len(items) == 0 || len(items) > lint.MaxBatch {
		return nil, s.refuse(ctx, method, 0, fmt.Errorf("%w: manifests: %d items, want 1 to %d", errInvalid, len(items), lint.MaxBatch))
	}
	seen := make(map[string]bool, len(items))
	for i, m := range items {
		if err := names.CheckNode(m.GetNode()); err != nil {
			return nil, s.refuse(ctx, method, 0, fmt.Errorf("%w: manifests[%d].node: %v", errInvalid, i, err))
		}
		if seen[m.GetNode()] {
			return nil, s.refuse(ctx, method, 0, fmt.Errorf("%w: manifests[%d].node %s is listed twice", errInvalid, i, m.GetNode()))
		}
		seen[m.GetNode()] = true
		if err := lint.CheckWants(m.GetNode(), m.GetWants()); err != nil {
			return nil, s.refuse(ctx, method, 0, fmt.Errorf("%w: manifests[%d] (%s): %v", errInvalid, i, m.GetNode(), err))
		}
	}
	for i, m := range items {
		if err := s.cfg.Checker.CheckWants(ctx, m.GetNode(), m.GetWants()); err != nil {
			if errors.Is(err, ErrUnavailable) {
				// Recorded as every refusal is; answered UNAVAILABLE.
				return nil, s.refuse(ctx, method, 0, err)
			}
			return nil, s.refuse(ctx, method, 0, fmt.Errorf("%w: manifests[%d] (%s): %v", errPrecondition, i, m.GetNode(), err))
		}
	}
	ring := s.cfg.Keysets.Current()
	now := s.cfg.Now()
	signingKey, err := s.signingKeyValid(now)
	if err != nil {
		return nil, s.refuse(ctx, method, 0, err)
	}

	// The size limit is judged before revisions are assigned, with the
	// largest revision a manifest could get: a refused batch consumes
	// none.
	for i, m := range items {
		largest := &typev1.Manifest{
			Node: m.GetNode(), Revision: math.MaxUint64, IssuedAt: timestamppb.New(now), ExpiresAt: timestamppb.New(now.Add(s.cfg.ManifestLifetime)),
			KeysetVersion: ring.Version(), Wants: m.GetWants(), Traceparent: m.GetTraceparent(), Tracestate: m.GetTracestate(),
		}
		if n := canonical.Size(largest); n > lint.MaxKVValue/2 {
			return nil, s.refuse(ctx, method, 0, fmt.Errorf("%w: manifests[%d] (%s) is %d bytes encoded, over %d", errInvalid, i, m.GetNode(), n, lint.MaxKVValue/2))
		}
	}

	// Revisions are assigned (and durable) before the request record, so
	// the request record lists the digests of exactly what is then signed.
	// A crash in between consumes revisions and signs nothing: a gap an
	// engine never sees, since it only ever sees higher revisions.
	revReqs := make([]state.RevisionRequest, len(items))
	// A floor far ahead of the clock would take the node's revisions where
	// no later one fits (up to the largest there is): it could then take no
	// manifest ever after. Revisions are milliseconds since 1970; an
	// engine refuses a manifest issued more than MaxAhead ahead of its own
	// clock, and no honest floor is further.
	maxFloor := uint64(now.Add(verify.MaxAhead).UnixMilli())
	for i, m := range items {
		floor := m.GetRevisionFloor()
		if floor > maxFloor {
			return nil, s.refuse(ctx, method, 0, fmt.Errorf("%w: manifests[%d] (%s): revision_floor %d is more than %s ahead of the signer's clock (revisions are milliseconds since 1970; the node could take no manifest after it)", errInvalid, i, m.GetNode(), floor, verify.MaxAhead))
		}
		// An engine refuses a manifest below its keyset's floor; no
		// revision below it is ever assigned.
		if kf := ring.Keyset().GetRevisionFloor(); kf > floor {
			floor = kf
		}
		revReqs[i] = state.RevisionRequest{Node: m.GetNode(), Floor: floor}
	}
	revisions, err := s.cfg.State.AssignRevisions(revReqs, uint64(now.UnixMilli()))
	if err != nil {
		return nil, s.refuse(ctx, method, 0, err)
	}

	expires := now.Add(s.cfg.ManifestLifetime)
	if na := signingKey.GetNotAfter(); na != nil && na.AsTime().Before(expires) {
		// A manifest never outlives the key that signs it.
		expires = na.AsTime()
	}
	issued, expiresPB := timestamppb.New(now), timestamppb.New(expires)
	envs := make([]*typev1.Envelope, len(items))
	audited := make([]audit.Item, len(items))
	for i, m := range items {
		manifest := &typev1.Manifest{
			Node: m.GetNode(), Revision: revisions[i], IssuedAt: issued, ExpiresAt: expiresPB,
			KeysetVersion: ring.Version(), Wants: m.GetWants(),
			Traceparent: m.GetTraceparent(), Tracestate: m.GetTracestate(),
		}
		env, digest, err := envelope.Seal(typev1.PayloadType_PAYLOAD_TYPE_MANIFEST, manifest)
		if err != nil {
			return nil, s.refuse(ctx, method, 0, err)
		}
		if len(env.GetPayload()) > lint.MaxKVValue/2 {
			return nil, s.refuse(ctx, method, 0, fmt.Errorf("%w: manifests[%d] (%s) is %d bytes encoded, over %d", errInvalid, i, m.GetNode(), len(env.GetPayload()), lint.MaxKVValue/2))
		}
		envs[i] = env
		audited[i] = audit.Item{Digest: digest, Key: m.GetNode(), Revision: revisions[i]}
	}
	reqRec, err := s.cfg.Audit.Append(audit.Record{
		Kind: audit.KindRequest, Method: method, Caller: caller(ctx), Epoch: req.GetFencingEpoch(),
		KeyID: s.cfg.Key.KeyID(), Items: audited, TraceID: traceID(ctx),
	})
	if err != nil {
		return nil, fmt.Errorf("audit request: %w", err)
	}
	return signBatchAfter(ctx, s, method, req.GetFencingEpoch(), reqRec.Seq, envs, audited, func(signed []*signerv1.SignedItem) *signerv1.SignManifestsResponse {
		s.count(s.signed, ctx, len(signed), attribute.String("type", "manifest"))
		out := make([]*signerv1.SignedManifest, len(signed))
		for i, it := range signed {
			out[i] = &signerv1.SignedManifest{Item: it, Revision: revisions[i], IssuedAt: issued, ExpiresAt: expiresPB}
		}
		return &signerv1.SignManifestsResponse{Manifests: out}
	})
}

// Fence hands out a new fencing epoch, durable before it is returned; sign
// requests with a lower epoch are refused from then on.
func (s *Server) Fence(ctx context.Context, req *signerv1.FenceRequest) (*signerv1.FenceResponse, error) {
	ctx, span := s.tracer.Start(ctx, "signer.Fence")
	defer span.End()
	s.epochMu.Lock()
	defer s.epochMu.Unlock()
	epoch, err := s.cfg.State.NextEpoch()
	if err != nil {
		return nil, s.toStatus(ctx, "Fence", err)
	}
	s.epoch = epoch
	if _, err := s.cfg.Audit.Append(audit.Record{
		Kind: audit.KindFence, Method: "Fence", Caller: caller(ctx), Epoch: epoch, Reason: "holder " + req.GetHolder(), TraceID: traceID(ctx),
	}); err != nil {
		return nil, s.toStatus(ctx, "Fence", fmt.Errorf("audit fence: %w", err))
	}
	span.SetAttributes(attribute.Int64("mesh.fencing_epoch", int64(epoch)))
	s.log.Info("fencing epoch handed out", "epoch", epoch, "holder", req.GetHolder(), "caller", caller(ctx))
	return &signerv1.FenceResponse{Epoch: epoch}, nil
}

// GetKeyset returns the keyset the signer serves.
func (s *Server) GetKeyset(ctx context.Context, _ *signerv1.GetKeysetRequest) (*signerv1.GetKeysetResponse, error) {
	if took, err := s.cfg.Keysets.Reload(s.cfg.Now()); took && err != nil {
		s.log.Error("keyset taken that does not let this signer's key sign", "version", s.cfg.Keysets.Current().Version(), "error", err)
	} else if err != nil {
		s.log.Warn("keyset file not taken; serving the current keyset", "error", err)
	}
	ring := s.cfg.Keysets.Current()
	return &signerv1.GetKeysetResponse{Keyset: ring.Envelope(), Version: ring.Version(), SigningKeyId: s.cfg.Key.KeyID()}, nil
}

// WatchKeyset reloads the keyset file every interval until ctx is done, so a
// rotated keyset is served without a restart.
func (s *Server) WatchKeyset(ctx context.Context, interval time.Duration) error {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			took, err := s.cfg.Keysets.Reload(s.cfg.Now())
			switch {
			case took && err != nil:
				s.log.Error("keyset taken that does not let this signer's key sign", "version", s.cfg.Keysets.Current().Version(), "error", err)
			case err != nil:
				s.log.Warn("keyset file not taken; serving the current keyset", "error", err)
			case took:
				s.log.Info("keyset taken", "version", s.cfg.Keysets.Current().Version())
			}
		}
	}
}
