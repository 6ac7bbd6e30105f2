// Package service implements mesh.signer.v1.SignerService: typed signing of
// compositions and manifests after lint and the catalog cross-check, manifest
// revisions, fencing epochs, and an audit record before and after every
// signature (DESIGN.md §5.4).
package service

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path"
	"strings"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"

	"mesh.dev/internal/envelope"
	"mesh.dev/internal/identity"
	"mesh.dev/internal/lint"
	"mesh.dev/internal/names"
	signerv1 "mesh.dev/proto/mesh/signer/v1"
	typev1 "mesh.dev/proto/mesh/type/v1"
	"mesh.dev/services/signer/internal/audit"
	"mesh.dev/services/signer/internal/keysource"
	"mesh.dev/services/signer/internal/state"
)

// Lifetimes of a manifest.
const (
	DefaultManifestLifetime = 24 * time.Hour
	MaxManifestLifetime     = 7 * 24 * time.Hour
)

// Checker cross-checks what the signer signs against the catalog (DESIGN.md
// §5.4): module compositions against their entries, and want parts against
// their builds' artifacts. It returns an *ItemError for an item that fails,
// or an error wrapping ErrUnavailable when the catalog cannot answer.
type Checker interface {
	CheckCompositions(ctx context.Context, comps []*typev1.Composition) error
	CheckWants(ctx context.Context, node string, wants []*typev1.Want) error
}

// ErrUnavailable marks a cross-check that could not be made.
var ErrUnavailable = errors.New("catalog unavailable")

// ItemError names the item of a batch that was refused and why.
type ItemError struct {
	Index int
	Key   string
	Err   error
}

func (e *ItemError) Error() string {
	return fmt.Sprintf("item %d (%s): %v", e.Index, e.Key, e.Err)
}

func (e *ItemError) Unwrap() error { return e.Err }

// Errors the handlers map to status codes (see toStatus).
var (
	errInvalid      = errors.New("invalid")
	errPrecondition = errors.New("failed precondition")
)

// Config is what a Server needs.
type Config struct {
	Key     keysource.Source
	State   *state.Store
	Audit   *audit.Log
	Keysets *Keysets
	// Checker cross-checks module compositions; required.
	Checker Checker
	// OwnPrefixes are the only paths a node's own composition may write
	// under (resources, symlink targets, filled and adopted paths).
	OwnPrefixes      []string
	ManifestLifetime time.Duration
	Now              func() time.Time
	TracerProvider   trace.TracerProvider
	MeterProvider    metric.MeterProvider
	Logger           *slog.Logger
}

// Server signs; it is the only holder of the online key.
type Server struct {
	signerv1.UnsafeSignerServiceServer

	cfg    Config
	tracer trace.Tracer
	log    *slog.Logger

	signed  metric.Int64Counter
	refused metric.Int64Counter

	// epochMu guards epoch, the newest fencing epoch handed out. A sign
	// request holds it for reading from its epoch check until its
	// signatures are made and audited, and Fence holds it for writing: once
	// Fence has returned a new epoch, no request that carried an older one
	// can still be signing.
	epochMu sync.RWMutex
	epoch   uint64
}

var _ signerv1.SignerServiceServer = (*Server)(nil)

// New returns a Server; the config is checked and the fencing epoch read.
func New(cfg Config) (*Server, error) {
	switch {
	case cfg.Key == nil:
		return nil, errors.New("signer: no key source")
	case cfg.State == nil:
		return nil, errors.New("signer: no state store")
	case cfg.Audit == nil:
		return nil, errors.New("signer: no audit log")
	case cfg.Keysets == nil:
		return nil, errors.New("signer: no keyset")
	case cfg.Checker == nil:
		return nil, errors.New("signer: no catalog cross-checker")
	}
	if cfg.ManifestLifetime == 0 {
		cfg.ManifestLifetime = DefaultManifestLifetime
	}
	if cfg.ManifestLifetime < time.Minute || cfg.ManifestLifetime > MaxManifestLifetime {
		return nil, fmt.Errorf("signer: manifest lifetime %s is outside 1m..%s", cfg.ManifestLifetime, MaxManifestLifetime)
	}
	for i, p := range cfg.OwnPrefixes {
		if err := names.CheckPath(fmt.Sprintf("own_prefixes[%d]", i), p); err != nil {
			return nil, fmt.Errorf("signer: %w", err)
		}
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.TracerProvider == nil {
		cfg.TracerProvider = trace.NewNoopTracerProvider()
	}
	epoch, err := cfg.State.Epoch()
	if err != nil {
		return nil, err
	}
	s := &Server{cfg: cfg, tracer: cfg.TracerProvider.Tracer("mesh.dev/services/signer"), log: cfg.Logger, epoch: epoch}
	if cfg.MeterProvider != nil {
		m := cfg.MeterProvider.Meter("mesh.dev/services/signer")
		s.signed, _ = m.Int64Counter("mesh_signer_signatures", metric.WithDescription("Signatures made, by payload type."))
		s.refused, _ = m.Int64Counter("mesh_signer_refusals", metric.WithDescription("Sign requests refused, by reason."))
	}
	return s, nil
}

// Register registers the service.
func (s *Server) Register(r grpc.ServiceRegistrar) { signerv1.RegisterSignerServiceServer(r, s) }

func caller(ctx context.Context) string {
	if id, ok := identity.FromContext(ctx); ok {
		return id.String()
	}
	return "in-process"
}

// checkEpoch judges a request's fencing epoch; the caller holds epochMu
// for reading until it has signed.
func (s *Server) checkEpoch(epoch uint64) error {
	cur := s.epoch
	switch {
	case cur == 0:
		return fmt.Errorf("%w: no fencing epoch was handed out yet: call Fence first", errPrecondition)
	case epoch < cur:
		return fmt.Errorf("%w: fencing epoch %d is below the signer's %d: another composer holds the lease", errPrecondition, epoch, cur)
	case epoch > cur:
		return fmt.Errorf("%w: fencing epoch %d was never handed out (newest is %d)", errPrecondition, epoch, cur)
	}
	return nil
}

func (s *Server) count(c metric.Int64Counter, ctx context.Context, n int, kv ...attribute.KeyValue) {
	if c != nil {
		c.Add(ctx, int64(n), metric.WithAttributes(kv...))
	}
}

// refuse records a refusal in the audit log (after a request record when one
// was written) and returns err.
func (s *Server) refuse(ctx context.Context, method string, request uint64, err error) error {
	s.count(s.refused, ctx, 1, attribute.String("method", method))
	_, aerr := s.cfg.Audit.Append(audit.Record{
		Kind: audit.KindRefused, Method: method, Caller: caller(ctx), Request: request,
		Reason: err.Error(), TraceID: traceID(ctx),
	})
	if aerr != nil {
		s.log.Error("audit a refusal", "method", method, "error", aerr)
	}
	return err
}

func traceID(ctx context.Context) string {
	if sc := trace.SpanContextFromContext(ctx); sc.HasTraceID() {
		return sc.TraceID().String()
	}
	return ""
}

// signingKeyValid checks that the signer may sign now: the keyset it serves
// is unexpired and lists its key as ACTIVE and within its validity window.
// Both are checked at start; this catches a keyset or key that lapses while
// the signer runs, so nothing is signed that every engine would refuse.
func (s *Server) signingKeyValid(now time.Time) (*typev1.KeysetKey, error) {
	// One keyset for every check: a reload in between must not pair one
	// version's key with another's expiry.
	ring := s.cfg.Keysets.Current()
	key, _ := ring.Key(s.cfg.Keysets.keyID)
	switch {
	case key == nil || key.GetState() != typev1.KeyState_KEY_STATE_ACTIVE:
		return nil, fmt.Errorf("%w: the signer's key is not ACTIVE in keyset version %d", errPrecondition, ring.Version())
	case ring.Expired(now):
		return nil, fmt.Errorf("%w: keyset version %d has expired; load a new one", errPrecondition, ring.Version())
	case key.GetNotBefore() != nil && now.Before(key.GetNotBefore().AsTime()):
		return nil, fmt.Errorf("%w: the signer's key %s is valid only from %s", errPrecondition, s.cfg.Key.KeyID(), key.GetNotBefore().AsTime().UTC().Format(time.RFC3339))
	case key.GetNotAfter() != nil && !now.Before(key.GetNotAfter().AsTime()):
		return nil, fmt.Errorf("%w: the signer's key %s was valid until %s", errPrecondition, s.cfg.Key.KeyID(), key.GetNotAfter().AsTime().UTC().Format(time.RFC3339))
	}
	return key, nil
}

// checkOwn checks that a node's own composition writes only under the own
// prefixes.
func (s *Server) checkOwn(c *typev1.Composition) error {
	under := func(p string) bool {
		for _, pre := range s.cfg.OwnPrefixes {
			if names.Within(p, pre) {
				return true
			}
		}
		return false
	}
	for i, r := range c.GetResources() {
		if !under(r.GetPath()) {
			return fmt.Errorf("resources[%d].path %s (%s) is outside the own prefixes %v", i, r.GetPath(), r.GetId(), s.cfg.OwnPrefixes)
		}
		if t := r.GetTarget(); t != "" {
			// A relative target resolves from the link's directory; a
			// target climbing out with ".." is outside as surely as an
			// absolute one.
			resolved := t
			if !strings.HasPrefix(t, "/") {
				resolved = path.Join(path.Dir(r.GetPath()), t)
			}
			if !under(path.Clean(resolved)) {
				return fmt.Errorf("resources[%d].target %s (%s) resolves to %s, outside the own prefixes %v", i, t, r.GetId(), path.Clean(resolved), s.cfg.OwnPrefixes)
			}
		}
	}
	for _, list := range []struct {
		field string
		paths []string
	}{{"filled", c.GetFilled()}, {"adoption", c.GetAdoption()}} {
		for i, p := range list.paths {
			if !under(p) {
				return fmt.Errorf("%s[%d] %s is outside the own prefixes %v", list.field, i, p, s.cfg.OwnPrefixes)
			}
		}
	}
	return nil
}

func compositionKey(c *typev1.Composition) string {
	k, err := names.CompositionKey(c.GetNode(), c.GetModule(), c.GetFingerprint())
	if err != nil {
		return fmt.Sprintf("%s.%s", c.GetNode(), c.GetModule())
	}
	return k
}

// SignCompositions is the typed operation behind the RPC: epoch, lint, the
// catalog cross-check, canonical bytes and digests, a request audit record,
// the signatures, a signed audit record. Nothing in a refused batch is signed.
func (s *Server) SignCompositions(ctx context.Context, req *signerv1.SignCompositionsRequest) (*signerv1.SignCompositionsResponse, error) {
	const method = "SignCompositions"
	ctx, span := s.tracer.Start(ctx, "signer.SignCompositions", trace.WithAttributes(
		attribute.Int("mesh.batch_size", len(req.GetCompositions())),
		attribute.Int64("mesh.fencing_epoch", int64(req.GetFencingEpoch())),
	))
	defer span.End()
	resp, err := s.signCompositions(ctx, method, req)
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
		return nil, s.toStatus(ctx, method, err)
	}
	return resp, nil
}

func (s *Server) signCompositions(ctx context.Context, method string, req *signerv1.SignCompositionsRequest) (*signerv1.SignCompositionsResponse, error) {
	s.epochMu.RLock()
	defer s.epochMu.RUnlock()
	if err := s.checkEpoch(req.GetFencingEpoch()); err != nil {
		return nil, s.refuse(ctx, method, 0, err)
	}
	if _, err := s.signingKeyValid(s.cfg.Now()); err != nil {
		return nil, s.refuse(ctx, method, 0, err)
	}
	comps := req.GetCompositions()
	if len(comps) == 0 || len(comps) > lint.MaxBatch {
		return nil, s.refuse(ctx, method, 0, fmt.Errorf("%w: compositions: %d items, want 1 to %d", errInvalid, len(comps), lint.MaxBatch))
	}
	var modules []*typev1.Composition
	for i, c := range comps {
		if err := lint.CheckComposition(c); err != nil {
			return nil, s.refuse(ctx, method, 0, fmt.Errorf("%w: compositions[%d] (%s): %v", errInvalid, i, compositionKey(c), err))
		}
		if c.GetModule() == names.NodeModule {
			if err := s.checkOwn(c); err != nil {
				return nil, s.refuse(ctx, method, 0, fmt.Errorf("%w: compositions[%d] (%s): %v", errPrecondition, i, compositionKey(c), err))
			}
		} else {
			modules = append(modules, c)
		}
	}
	if len(modules) > 0 {
		if err := s.cfg.Checker.CheckCompositions(ctx, modules); err != nil {
			if errors.Is(err, ErrUnavailable) {
				// Recorded as every refusal is; answered UNAVAILABLE.
				return nil, s.refuse(ctx, method, 0, err)
			}
			return nil, s.refuse(ctx, method, 0, fmt.Errorf("%w: %v", errPrecondition, err))
		}
	}

	envs := make([]*typev1.Envelope, len(comps))
	items := make([]audit.Item, len(comps))
	for i, c := range comps {
		env, digest, err := envelope.Seal(typev1.PayloadType_PAYLOAD_TYPE_COMPOSITION, c)
		if err != nil {
			return nil, s.refuse(ctx, method, 0, fmt.Errorf("%w: compositions[%d]: %v", errInvalid, i, err))
		}
		envs[i] = env
		items[i] = audit.Item{Digest: digest, Key: compositionKey(c)}
	}
	return signBatch(ctx, s, method, req.GetFencingEpoch(), envs, items, func(signed []*signerv1.SignedItem) *signerv1.SignCompositionsResponse {
		s.count(s.signed, ctx, len(signed), attribute.String("type", "composition"))
		return &signerv1.SignCompositionsResponse{Items: signed}
	})
}

// signBatch writes the request record and then signs (see signBatchAfter).
func signBatch[R any](ctx context.Context, s *Server, method string, epoch uint64, envs []*typev1.Envelope, items []audit.Item, build func([]*signerv1.SignedItem) R) (R, error) {
	var zero R
	req, err := s.cfg.Audit.Append(audit.Record{
		Kind: audit.KindRequest, Method: method, Caller: caller(ctx), Epoch: epoch, KeyID: s.cfg.Key.KeyID(),
		Items: items, TraceID: traceID(ctx),
	})
	if err != nil {
		return zero, fmt.Errorf("audit request: %w", err)
	}
	return signBatchAfter(ctx, s, method, epoch, req.Seq, envs, items, build)
}

// signBatchAfter signs every envelope once the request record (seq request)
// is durable, writes the signed record and builds the response: nothing is
// returned before both records are fsynced.
func signBatchAfter[R any](ctx context.Context, s *Server, method string, epoch, request uint64, envs []*typev1.Envelope, items []audit.Item, build func([]*signerv1.SignedItem) R) (R, error) {
	var zero R
	keyID := s.cfg.Key.KeyID()
	out := make([]*signerv1.SignedItem, len(envs))
	for i, env := range envs {
		input, err := envelope.SigningInputOfDigest(env.GetPayloadType(), items[i].Digest)
		if err != nil {
			return zero, s.refuse(ctx, method, request, err)
		}
		sig, err := s.cfg.Key.Sign(ctx, input)
		if err != nil {
			return zero, s.refuse(ctx, method, request, fmt.Errorf("sign: %w", err))
		}
		env.Signatures = []*typev1.Signature{{KeyId: keyID, Signature: sig}}
		out[i] = &signerv1.SignedItem{Envelope: env, Digest: items[i].Digest}
	}
	if _, err := s.cfg.Audit.Append(audit.Record{
		Kind: audit.KindSigned, Method: method, Caller: caller(ctx), Epoch: epoch, KeyID: keyID,
		Request: request, Items: items, TraceID: traceID(ctx),
	}); err != nil {
		return zero, fmt.Errorf("audit signed: %w", err)
	}
	return build(out), nil
}
