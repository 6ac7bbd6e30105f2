package service

import (
	"context"
	"errors"

	"go.opentelemetry.io/otel/attribute"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/timestamppb"

	"mesh.dev/internal/names"
	"mesh.dev/internal/natsx"
	"mesh.dev/internal/telemetry"
	catalogv1 "mesh.dev/proto/mesh/catalog/v1"
	"mesh.dev/services/catalog/internal/store"
)

// RegisterModule makes a module run at a fingerprint of one of its entries.
// The current registration (key "<module>") changes by compare-and-set; each
// registration is also kept under its immutable history key
// "<module>.<seq>". Registering the fingerprint a module already runs at is
// a no-op.
func (s *Server) RegisterModule(ctx context.Context, req *catalogv1.RegisterModuleRequest) (*catalogv1.RegisterModuleResponse, error) {
	const method = "RegisterModule"
	ctx, span := s.start(ctx, method, attrModule.String(req.GetModule()), attrFingerprint.String(req.GetFingerprint()))
	defer span.End()
	reg, changed, err := s.register(ctx, req.GetModule(), req.GetFingerprint())
	if err != nil {
		return nil, s.fail(ctx, span, method, err)
	}
	span.SetAttributes(attribute.Bool("mesh.changed", changed), attribute.Int64("mesh.seq", int64(reg.GetSeq())))
	return &catalogv1.RegisterModuleResponse{Registration: reg, Changed: changed}, nil
}

func (s *Server) register(ctx context.Context, module, fp string) (*catalogv1.Registration, bool, error) {
	if err := names.CheckModule(module); err != nil {
		return nil, false, invalidf("module: %v", err)
	}
	if err := names.CheckFingerprint("fingerprint", fp); err != nil {
		return nil, false, invalidf("%v", err)
	}
	entry, err := s.store.Entry(ctx, fp)
	if errors.Is(err, natsx.ErrNotFound) {
		return nil, false, noEntry(fp)
	}
	if err != nil {
		return nil, false, err
	}
	if entry.GetModule() != module {
		return nil, false, preconditionf("fingerprint %s is an entry of module %q, not %q", fp, entry.GetModule(), module)
	}
	// The registration carries this span's context, so the composer's pass
	// continues the trace from here (DESIGN.md §6).
	traceparent, tracestate := telemetry.Traceparent(ctx)
	for range casAttempts {
		cur, rev, err := s.store.Registration(ctx, module)
		if err != nil && !errors.Is(err, natsx.ErrNotFound) {
			return nil, false, err
		}
		var seq uint64
		if cur != nil {
			// A catalog that stopped between the two writes of a
			// registration left its history key unwritten: write it now.
			if err := s.store.PutHistory(ctx, cur); err != nil {
				return nil, false, err
			}
			if cur.GetFingerprint() == fp {
				return cur, false, nil
			}
			seq = cur.GetSeq()
		} else if seq, err = s.store.LastSeq(ctx, module); err != nil {
			// No current key (a first registration, or one deleted by hand):
			// history keys are never reused.
			return nil, false, err
		}
		reg := &catalogv1.Registration{
			Module: module, Fingerprint: fp, Seq: seq + 1, RegisteredAt: timestamppb.New(s.now()),
			RegisteredBy: caller(ctx), Traceparent: traceparent, Tracestate: tracestate,
		}
		if _, err := s.store.PutRegistration(ctx, reg, rev); err != nil {
			if errors.Is(err, natsx.ErrConflict) {
				continue // another registration came first: judge against it
			}
			return nil, false, err
		}
		if err := s.store.PutHistory(ctx, reg); err != nil {
			// The registration holds; its history key is written by the
			// next registration of the module or the next start.
			s.log.ErrorContext(ctx, "registration history key not written", "module", module, "seq", reg.GetSeq(), "error", err)
		}
		s.m.registrations.Add(ctx, 1)
		s.log.InfoContext(ctx, "module registered", "module", module, "fingerprint", fp, "seq", reg.GetSeq(),
			"previous", cur.GetFingerprint(), "caller", caller(ctx))
		return reg, true, nil
	}
	return nil, false, coded(codes.Aborted, "the registration of module %s changed under this request %d times; retry", module, casAttempts)
}

// GetModule returns a module's registration and, when asked, its history.
func (s *Server) GetModule(ctx context.Context, req *catalogv1.GetModuleRequest) (*catalogv1.GetModuleResponse, error) {
	const method = "GetModule"
	ctx, span := s.start(ctx, method, attrModule.String(req.GetModule()))
	defer span.End()
	resp, err := s.getModule(ctx, req)
	if err != nil {
		return nil, s.fail(ctx, span, method, err)
	}
	return resp, nil
}

func (s *Server) getModule(ctx context.Context, req *catalogv1.GetModuleRequest) (*catalogv1.GetModuleResponse, error) {
	module := req.GetModule()
	if err := names.CheckModule(module); err != nil {
		return nil, invalidf("module: %v", err)
	}
	cur, _, err := s.store.Registration(ctx, module)
	if errors.Is(err, natsx.ErrNotFound) {
		return nil, notFoundf("no registration of module %s", module)
	}
	if err != nil {
		return nil, err
	}
	resp := &catalogv1.GetModuleResponse{Registration: cur}
	if req.GetHistory() {
		hist, err := s.store.History(ctx, module, MaxHistory)
		if err != nil {
			return nil, err
		}
		if n := len(hist); n == 0 || hist[n-1].GetSeq() < cur.GetSeq() {
			// The history key of the current one is not written yet.
			hist = append(hist, cur)
		}
		resp.History = hist
	}
	return resp, nil
}

// ListModules returns every module's current registration.
func (s *Server) ListModules(ctx context.Context, _ *catalogv1.ListModulesRequest) (*catalogv1.ListModulesResponse, error) {
	const method = "ListModules"
	ctx, span := s.start(ctx, method)
	defer span.End()
	regs, err := s.store.Registrations(ctx)
	if err != nil {
		return nil, s.fail(ctx, span, method, err)
	}
	return &catalogv1.ListModulesResponse{Registrations: regs}, nil
}

// WatchModules streams registrations: the current ones changed after
// from_revision, a caught_up marker, then every change. A registration
// deleted by hand comes as one with no fingerprint. A from_revision above
// the store's last revision (the store was restored from a backup) counts as
// 0, so that a resuming client misses nothing; its caught_up marker then has
// a revision below from_revision, which tells the client that everything
// was sent again (a module not sent is registered no more). When the store
// goes back to an older state under a running watch (restored from an older
// snapshot), the watch sends every current registration again, a module
// registered no more as one with no fingerprint, and a new caught_up marker
// with the revision to resume from, lower than those sent before.
func (s *Server) WatchModules(req *catalogv1.WatchModulesRequest, stream catalogv1.CatalogService_WatchModulesServer) error {
	const method = "WatchModules"
	ctx, span := s.start(stream.Context(), method, attribute.Int64("mesh.from_revision", int64(req.GetFromRevision())))
	defer span.End()
	s.m.watches.Add(ctx, 1)
	defer s.m.watches.Add(ctx, -1)
	if err := s.watch(ctx, req.GetFromRevision(), stream); err != nil {
		return s.fail(ctx, span, method, err)
	}
	return nil
}

func (s *Server) watch(ctx context.Context, from uint64, stream catalogv1.CatalogService_WatchModulesServer) error {
	if from > 0 {
		last, err := s.store.ModulesRevision(ctx)
		if err != nil {
			return err
		}
		if from > last {
			s.log.WarnContext(ctx, "watch resumes from a revision the store never reached; sending everything",
				"from_revision", from, "last_revision", last, "caller", caller(ctx))
			from = 0
		}
	}
	w, err := s.store.WatchRegistrations(ctx)
	if err != nil {
		return coded(codes.Unavailable, "watch of %s: %v; resume from revision %d", natsx.BucketCatalogModules, err, from)
	}
	defer w.Stop()
	seen := from
	caughtUp := false
	for {
		select {
		case e, ok := <-w.Updates():
			if !ok {
				if err := ctx.Err(); err != nil {
					return err
				}
				return coded(codes.Unavailable, "watch of %s ended: %v; resume from revision %d", natsx.BucketCatalogModules, w.Err(), seen)
			}
			if e != nil && e.Resync {
				// The store went back to an older state: what it holds now
				// comes again (a module it no longer registers as one with
				// no fingerprint), then a caught_up marker whose revision,
				// lower than those sent before, is where to resume from.
				s.log.WarnContext(ctx, "catalog-modules went back to an older state; sending every registration again",
					"last_sent_revision", seen, "caller", caller(ctx))
				from, seen, caughtUp = 0, 0, false
				continue
			}
			if e == nil {
				caughtUp = true
				if err := stream.Send(&catalogv1.WatchModulesResponse{CaughtUp: true, Revision: seen}); err != nil {
					return err
				}
				continue
			}
			if !caughtUp && from > 0 && e.Revision <= from {
				continue
			}
			reg, err := store.DecodeRegistration(e)
			if err != nil {
				s.log.ErrorContext(ctx, "watch skips a registration that does not decode", "key", e.Key, "revision", e.Revision, "error", err)
				continue
			}
			seen = max(seen, e.Revision)
			if err := stream.Send(&catalogv1.WatchModulesResponse{Registration: reg, Revision: e.Revision}); err != nil {
				return err
			}
		case <-s.stopping:
			return coded(codes.Unavailable, "the catalog is stopping; resume from revision %d", seen)
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}
