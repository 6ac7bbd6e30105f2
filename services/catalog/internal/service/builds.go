package service

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"mesh.dev/internal/lint"
	"mesh.dev/internal/names"
	"mesh.dev/internal/natsx"
	catalogv1 "mesh.dev/proto/mesh/catalog/v1"
	typev1 "mesh.dev/proto/mesh/type/v1"
)

// PutBuild records the build of an existing entry. A DONE build needs every
// artifact the entry declares, held in the object store with the digest and
// size given; once DONE it never changes.
func (s *Server) PutBuild(ctx context.Context, req *catalogv1.PutBuildRequest) (*catalogv1.PutBuildResponse, error) {
	const method = "PutBuild"
	b := req.GetBuild()
	ctx, span := s.start(ctx, method, attrFingerprint.String(b.GetFingerprint()), attribute.String("mesh.build.state", b.GetState().String()))
	defer span.End()
	out, err := s.putBuild(ctx, b)
	if err != nil {
		return nil, s.fail(ctx, span, method, err)
	}
	return &catalogv1.PutBuildResponse{Build: out}, nil
}

func (s *Server) putBuild(ctx context.Context, in *catalogv1.Build) (*catalogv1.Build, error) {
	if in == nil {
		return nil, invalidf("build is required")
	}
	if err := knownFields(in); err != nil {
		return nil, invalidf("build holds fields this catalog does not know, so it cannot check them: %v", err)
	}
	fp := in.GetFingerprint()
	if err := names.CheckFingerprint("build.fingerprint", fp); err != nil {
		return nil, invalidf("%v", err)
	}
	state := in.GetState()
	switch state {
	case catalogv1.BuildState_BUILD_STATE_PENDING, catalogv1.BuildState_BUILD_STATE_DONE, catalogv1.BuildState_BUILD_STATE_FAILED:
	default:
		return nil, invalidf("build.state: %v is not PENDING, DONE or FAILED", state)
	}
	if err := lint.CheckReason("build.reason", in.GetReason()); err != nil {
		return nil, err
	}
	if state == catalogv1.BuildState_BUILD_STATE_FAILED && strings.TrimSpace(in.GetReason()) == "" {
		return nil, invalidf("build.reason: a FAILED build needs a reason")
	}
	if err := lint.CheckBuildArtifacts("build.artifacts", in.GetArtifacts()); err != nil {
		return nil, err
	}
	entry, err := s.store.Entry(ctx, fp)
	if errors.Is(err, natsx.ErrNotFound) {
		return nil, noEntry(fp)
	}
	if err != nil {
		return nil, err
	}
	if err := s.checkBuildArtifacts(ctx, entry, state, in.GetArtifacts()); err != nil {
		return nil, err
	}

	b := &catalogv1.Build{
		Fingerprint: fp, State: state, Artifacts: in.GetArtifacts(), Reason: in.GetReason(),
		UpdatedAt: timestamppb.New(s.now()), RecordedBy: caller(ctx),
	}
	for range casAttempts {
		held, rev, err := s.store.Build(ctx, fp)
		if err != nil && !errors.Is(err, natsx.ErrNotFound) {
			return nil, err
		}
		if held.GetState() == catalogv1.BuildState_BUILD_STATE_DONE {
			if sameBuild(held, b) {
				return held, nil
			}
			return nil, coded(codes.AlreadyExists, "the build of %s is DONE and immutable (recorded by %s)", fp, held.GetRecordedBy())
		}
		if _, err := s.store.PutBuild(ctx, b, rev); err != nil {
			if errors.Is(err, natsx.ErrConflict) {
				continue // another build record came first: judge against it
			}
			return nil, err
		}
		s.m.builds.Add(ctx, 1, metric.WithAttributes(attribute.String("state", state.String())))
		s.log.InfoContext(ctx, "build recorded", "fingerprint", fp, "module", entry.GetModule(), "state", state.String(),
			"artifacts", len(b.GetArtifacts()), "caller", caller(ctx))
		return b, nil
	}
	return nil, coded(codes.Aborted, "the build of %s changed under this request %d times; retry", fp, casAttempts)
}

// checkBuildArtifacts checks a build's artifacts against the entry's
// declarations and, for DONE, against the object store.
func (s *Server) checkBuildArtifacts(ctx context.Context, entry *catalogv1.Entry, state catalogv1.BuildState, arts []*typev1.Artifact) error {
	fp := entry.GetFingerprint()
	declared := make([]string, 0, len(entry.GetArtifacts()))
	for _, d := range entry.GetArtifacts() {
		declared = append(declared, d.GetRef())
	}
	given := make([]string, 0, len(arts))
	for i, a := range arts {
		if !slices.Contains(declared, a.GetRef()) {
			return preconditionf("build.artifacts[%d].ref %q is not an artifact of entry %s (it declares %s)", i, a.GetRef(), fp, listOrNone(declared))
		}
		given = append(given, a.GetRef())
	}
	if state != catalogv1.BuildState_BUILD_STATE_DONE {
		return nil
	}
	var missing []string
	for _, ref := range declared {
		if !slices.Contains(given, ref) {
			missing = append(missing, ref)
		}
	}
	if len(missing) > 0 {
		return preconditionf("a DONE build of %s needs every artifact its entry declares; missing %s", fp, strings.Join(missing, ", "))
	}
	for i, a := range arts {
		size, held, err := s.store.ArtifactHeld(ctx, a.GetDigest())
		if err != nil {
			return err
		}
		if !held {
			return preconditionf("build.artifacts[%d] (%s): %s is not held in the object store %s; upload it first", i, a.GetRef(), a.GetDigest(), natsx.ObjectStoreArtifacts)
		}
		if size != a.GetSize() {
			return preconditionf("build.artifacts[%d].size (%s): %d, but the held artifact %s is %d bytes", i, a.GetRef(), a.GetSize(), a.GetDigest(), size)
		}
	}
	return nil
}

func listOrNone(refs []string) string {
	if len(refs) == 0 {
		return "none"
	}
	return strings.Join(refs, ", ")
}

// sameBuild reports whether b records what held does; the time and the
// recorder may differ.
func sameBuild(held, b *catalogv1.Build) bool {
	return held.GetState() == b.GetState() && held.GetReason() == b.GetReason() &&
		slices.EqualFunc(held.GetArtifacts(), b.GetArtifacts(), func(x, y *typev1.Artifact) bool { return proto.Equal(x, y) })
}

// GetBuild returns the build of a fingerprint.
func (s *Server) GetBuild(ctx context.Context, req *catalogv1.GetBuildRequest) (*catalogv1.GetBuildResponse, error) {
	const method = "GetBuild"
	fp := req.GetFingerprint()
	ctx, span := s.start(ctx, method, attrFingerprint.String(fp))
	defer span.End()
	b, err := s.getBuild(ctx, fp)
	if err != nil {
		return nil, s.fail(ctx, span, method, err)
	}
	return &catalogv1.GetBuildResponse{Build: b}, nil
}

func (s *Server) getBuild(ctx context.Context, fp string) (*catalogv1.Build, error) {
	if err := names.CheckFingerprint("fingerprint", fp); err != nil {
		return nil, invalidf("%v", err)
	}
	b, _, err := s.store.Build(ctx, fp)
	if errors.Is(err, natsx.ErrNotFound) {
		return nil, notFoundf("no build of fingerprint %s", fp)
	}
	if err != nil {
		return nil, fmt.Errorf("build %s: %w", fp, err)
	}
	return b, nil
}
