package syncsvc

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"slices"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"mesh.dev/internal/authz"
	"mesh.dev/internal/identity"
	"mesh.dev/internal/names"
	"mesh.dev/internal/telemetry"
	"mesh.dev/internal/verify"
	composerv1 "mesh.dev/proto/mesh/composer/v1"
	typev1 "mesh.dev/proto/mesh/type/v1"
	"mesh.dev/services/composer/internal/pass"
	"mesh.dev/services/composer/internal/store"
)

// Keysets gives the current keyset.
type Keysets interface {
	Keyring() *verify.Keyring
}

// Config is what the Sync server needs.
type Config struct {
	Hub     *Hub
	Store   *store.Store
	Keysets Keysets
	Catalog pass.Catalog
	// Labels returns a node's labels (for needs' selectors).
	Labels func(node string) map[string]string
	Logger *slog.Logger
	Tracer trace.Tracer
	// HeardEvery bounds how often Heard is sent on one stream (1 s).
	HeardEvery time.Duration
	// MaxReports bounds a Report's haves.
	MaxHaves int
}

// Server implements SyncService.
type Server struct {
	composerv1.UnsafeSyncServiceServer
	cfg Config
}

var _ composerv1.SyncServiceServer = (*Server)(nil)

// New returns the server.
func New(cfg Config) *Server {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Tracer == nil {
		cfg.Tracer = noop.NewTracerProvider().Tracer("")
	}
	if cfg.HeardEvery == 0 {
		cfg.HeardEvery = time.Second
	}
	if cfg.MaxHaves == 0 {
		cfg.MaxHaves = 512
	}
	return &Server{cfg: cfg}
}

// Register registers the service.
func (s *Server) Register(r grpc.ServiceRegistrar) { composerv1.RegisterSyncServiceServer(r, s) }

// Policy: only nodes open Sync streams, each for itself (checked on Hello).
func Policy() authz.Policy {
	return authz.Policy{
		composerv1.SyncService_Sync_FullMethodName: authz.Allow(identity.RoleNode).Self(authz.SelfFrom(func(r *composerv1.SyncRequest) (string, error) {
			if r.GetHello() == nil {
				return "", errors.New("the first message of a Sync stream must be Hello")
			}
			return r.GetHello().GetNode(), nil
		})),
	}
}

// retryLater ends a stream with UNAVAILABLE and a RetryInfo the engine
// honours, jittered so a replica's engines do not return at once.
func retryLater(msg string, base time.Duration) error {
	st := status.New(codes.Unavailable, msg)
	d := base/2 + rand.N(base)
	if withInfo, err := st.WithDetails(&errdetails.RetryInfo{RetryDelay: durationpb.New(d)}); err == nil {
		return withInfo.Err()
	}
	return st.Err()
}

// checkHaves checks a report's haves: modules and keys of this node.
func checkHaves(node string, haves []*composerv1.Have, max int) error {
	if len(haves) > max {
		return fmt.Errorf("%d haves, over the limit of %d", len(haves), max)
	}
	for i, h := range haves {
		if h.GetModule() != names.NodeModule {
			if err := names.CheckModule(h.GetModule()); err != nil {
				return fmt.Errorf("haves[%d].module: %v", i, err)
			}
		}
		for _, key := range []string{h.GetApplied().GetKey(), h.GetAttempt().GetKey()} {
			if key == "" {
				continue
			}
			k, err := names.ParseCompositionKey(key)
			if err != nil {
				return fmt.Errorf("haves[%d]: %v", i, err)
			}
			if k.Node != node {
				return fmt.Errorf("haves[%d]: key %s is not of node %s", i, key, node)
			}
		}
	}
	return nil
}

// Sync serves one engine's stream (DESIGN.md §6).
func (s *Server) Sync(stream grpc.BidiStreamingServer[composerv1.SyncRequest, composerv1.SyncResponse]) error {
	ctx := stream.Context()
	first, err := stream.Recv()
	if err != nil {
		return err
	}
	hello := first.GetHello()
	if hello == nil {
		return status.Error(codes.InvalidArgument, "the first message of a Sync stream must be Hello")
	}
	node := hello.GetNode()
	if err := names.CheckNode(node); err != nil {
		return status.Errorf(codes.InvalidArgument, "hello.node: %v", err)
	}
	if err := authz.CheckSelf(ctx, node); err != nil {
		return err
	}
	if _, _, err := s.cfg.Store.Spec(ctx, node); errors.Is(err, store.ErrNotFound) {
		return status.Errorf(codes.PermissionDenied, "node %s has no node spec", node)
	} else if err != nil {
		return retryLater("node specs cannot be read now", 5*time.Second)
	}
	if err := checkHaves(node, hello.GetHaves(), s.cfg.MaxHaves); err != nil {
		return status.Errorf(codes.InvalidArgument, "hello: %v", err)
	}
	hub := s.cfg.Hub
	if !hub.Healthy() {
		return retryLater("this composer replica is behind; try another or retry", 5*time.Second)
	}
	sub := hub.subscribe(node)
	defer hub.unsubscribe(sub)
	unhealthy := hub.Unhealthy()

	// The highest revision the engine has seen: never send one below it.
	reported := max(hello.GetApplied().GetRevision(), hello.GetHighWater())
	if err := hub.writeHaves(ctx, &composerv1.HaveRecord{Node: node, ReportSeq: hello.GetReportSeq(), Applied: hello.GetApplied(),
		HighWater: hello.GetHighWater(), Haves: sortedHaves(hello.GetHaves()), EngineVersion: hello.GetEngineVersion()}); err != nil {
		s.cfg.Logger.Warn("sync: record haves from hello", "node", node, "error", err)
	}

	reports := make(chan *composerv1.Report, 1)
	recvErr := make(chan error, 1)
	go func() {
		for {
			msg, err := stream.Recv()
			if err != nil {
				recvErr <- err
				return
			}
			rep := msg.GetReport()
			if rep == nil {
				recvErr <- status.Error(codes.InvalidArgument, "after Hello a Sync stream carries only Reports")
				return
			}
			select {
			case reports <- rep:
			case <-ctx.Done():
				return
			}
		}
	}()

	var sentKeyset uint64 = hello.GetKeysetVersion()
	var sentRev uint64
	var lastHeard *composerv1.Heard
	sendKeyset := func() error {
		ring := s.cfg.Keysets.Keyring()
		if ring == nil || ring.Version() <= sentKeyset {
			return nil
		}
		if err := stream.Send(&composerv1.SyncResponse{Msg: &composerv1.SyncResponse_Keyset{Keyset: ring.Envelope()}}); err != nil {
			return err
		}
		sentKeyset = ring.Version()
		return nil
	}
	// sendManifest sends the node's manifest when newer than the one sent,
	// after the newest keyset this replica holds.
	sendManifest := func() error {
		a := hub.assignment(node)
		if a == nil || a.manifest == nil {
			return nil
		}
		// A lagging replica never sends an older manifest than the
		// engine reported; the lease holder re-signs above it.
		if a.manifestRevision < reported || a.manifestRevision <= sentRev {
			return nil
		}
		if err := sendKeyset(); err != nil {
			return err
		}
		// Signed by a key no keyset this replica holds lists (the signer
		// took a new key before the keyset that lists it reached this
		// replica): the engine could not verify it, and would drop it.
		// It waits for that keyset, which wakes the stream (sub.keyset).
		if ring := s.cfg.Keysets.Keyring(); ring != nil && !ring.ListsSigners(a.manifest) {
			return nil
		}
		if err := stream.Send(&composerv1.SyncResponse{Msg: &composerv1.SyncResponse_Manifest{Manifest: a.manifest}}); err != nil {
			return err
		}
		sentRev = a.manifestRevision
		return nil
	}
	heardDirty := false
	sendHeard := func() error {
		h, ok := s.heardFor(ctx, node, sub)
		if !ok {
			// The needs could not be read: the engine keeps the last
			// Heard, and the next tick tries again.
			heardDirty = true
			return nil
		}
		if h == nil || (lastHeard != nil && proto.Equal(h, lastHeard)) || (lastHeard == nil && len(h.GetModules()) == 0) {
			return nil
		}
		if err := stream.Send(&composerv1.SyncResponse{Msg: &composerv1.SyncResponse_Heard{Heard: h}}); err != nil {
			return err
		}
		lastHeard = h
		return nil
	}
	if err := sendKeyset(); err != nil {
		return err
	}
	if err := sendManifest(); err != nil {
		return err
	}
	if err := sendHeard(); err != nil {
		return err
	}
	heardTick := time.NewTicker(s.cfg.HeardEvery)
	defer heardTick.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-unhealthy:
			return retryLater("this composer replica fell behind; reconnect", 5*time.Second)
		case <-sub.gone:
			return status.Errorf(codes.PermissionDenied, "node %s has no node spec any more", node)
		case err := <-recvErr:
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		case rep := <-reports:
			hub.seen(node)
			if err := checkHaves(node, rep.GetHaves(), s.cfg.MaxHaves); err != nil {
				return status.Errorf(codes.InvalidArgument, "report: %v", err)
			}
			reported = max(reported, rep.GetApplied().GetRevision(), rep.GetHighWater())
			rctx := telemetry.ContextWithTraceparent(ctx, rep.GetTraceparent(), rep.GetTracestate())
			rctx, span := s.cfg.Tracer.Start(rctx, "composer.sync.report", trace.WithAttributes(
				attribute.String("mesh.node", node), attribute.Int64("mesh.report_seq", int64(rep.GetReportSeq()))))
			err := hub.writeHaves(rctx, &composerv1.HaveRecord{Node: node, ReportSeq: rep.GetReportSeq(), Applied: rep.GetApplied(),
				HighWater: rep.GetHighWater(), Haves: sortedHaves(rep.GetHaves()), EngineVersion: hello.GetEngineVersion()})
			if err != nil {
				span.RecordError(err)
				s.cfg.Logger.Warn("sync: record haves", "node", node, "error", err)
			}
			span.End()
		case <-sub.keyset:
			if err := sendKeyset(); err != nil {
				return err
			}
			// A manifest held back for want of this keyset goes now.
			if err := sendManifest(); err != nil {
				return err
			}
		case <-sub.manifest:
			if err := sendManifest(); err != nil {
				return err
			}
		case <-sub.heard:
			heardDirty = true
		case <-heardTick.C:
			// Other replicas hear this engine through its haves record.
			if err := hub.touch(ctx, node); err != nil && ctx.Err() == nil {
				s.cfg.Logger.Warn("sync: touch haves", "node", node, "error", err)
			}
			if heardDirty {
				heardDirty = false
				if err := sendHeard(); err != nil {
					return err
				}
			}
		}
	}
}

// heardFor computes the Heard of a node from the needs of the modules it
// wants (entries are cached by the catalog view). ok is false when an
// entry could not be read (the catalog unreachable, not a missing entry):
// nothing is computed, and the stream's needs stay as they were.
func (s *Server) heardFor(ctx context.Context, node string, sb *sub) (h *composerv1.Heard, ok bool) {
	a := s.cfg.Hub.assignment(node)
	if a == nil {
		return nil, true
	}
	var needs []*typev1.Need
	for _, w := range a.wants {
		if w.GetFingerprint() == "" {
			continue
		}
		rel, err := s.cfg.Catalog.Entry(ctx, w.GetFingerprint())
		if errors.Is(err, pass.ErrNoEntry) {
			continue // no needs of a build the catalog does not hold
		}
		if err != nil {
			// Said at debug: the catalog view says its failures, and
			// every stream asks again each tick.
			s.cfg.Logger.Debug("sync: needs not read; Heard not sent", "node", node, "fingerprint", w.GetFingerprint(), "error", err)
			return nil, false
		}
		needs = append(needs, rel.Manifest.GetNeeds()...)
	}
	if sb != nil {
		s.cfg.Hub.setNeeds(sb, needs)
	}
	if len(needs) == 0 {
		return &composerv1.Heard{}, true
	}
	labels := s.cfg.Labels
	if labels == nil {
		labels = func(string) map[string]string { return nil }
	}
	return s.cfg.Hub.heard(node, needs, labels), true
}

func sortedHaves(in []*composerv1.Have) []*composerv1.Have {
	out := slices.Clone(in)
	slices.SortFunc(out, func(a, b *composerv1.Have) int {
		switch {
		case a.GetModule() < b.GetModule():
			return -1
		case a.GetModule() > b.GetModule():
			return 1
		}
		return 0
	})
	return out
}
