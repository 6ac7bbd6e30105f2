// Package authz decides which identities may call which gRPC methods
// (DESIGN.md §8). Each service declares a Policy, full method → Rule, beside
// its registration; methods without a rule are denied, and grpcserver
// refuses to start a server with a registered method missing from its
// policy. The caller's identity is read once per call from the verified
// peer certificate and put into the context for handlers.
package authz

import (
	"context"
	"fmt"
	"log/slog"
	"slices"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthgrpc "google.golang.org/grpc/health/grpc_health_v1"
	reflectionv1 "google.golang.org/grpc/reflection/grpc_reflection_v1"
	reflectionv1alpha "google.golang.org/grpc/reflection/grpc_reflection_v1alpha"
	"google.golang.org/grpc/status"

	"mesh.dev/internal/identity"
)

// Rule says who may call one method.
type Rule struct {
	// Roles may call the method; an empty list allows no one.
	Roles []identity.Role
	// NodeSelf, when set, extracts the node a request names; a caller with
	// role node may then act only for itself (node:self). Operators and
	// services are not subject to it. An error from NodeSelf is the
	// caller's: it becomes INVALID_ARGUMENT with the error's text.
	NodeSelf func(req any) (string, error)
}

// Allow returns a rule allowing roles.
func Allow(roles ...identity.Role) Rule { return Rule{Roles: slices.Clone(roles)} }

// AnyAuthenticated returns a rule allowing all six roles.
func AnyAuthenticated() Rule { return Allow(identity.Roles()...) }

// Self returns a copy of r that also requires node:self, with fn extracting
// the node a request names.
func (r Rule) Self(fn func(req any) (string, error)) Rule {
	r.Roles = slices.Clone(r.Roles)
	r.NodeSelf = fn
	return r
}

// Allows reports whether role is listed.
func (r Rule) Allows(role identity.Role) bool { return slices.Contains(r.Roles, role) }

// SelfFrom adapts a typed node extractor to Rule.NodeSelf, so a policy
// entry reads .Self(authz.SelfFrom(func(r *xv1.GetThingRequest) (string, error) {...})).
// A request of another type is an error.
func SelfFrom[T any](fn func(T) (string, error)) func(req any) (string, error) {
	return func(req any) (string, error) {
		t, ok := req.(T)
		if !ok {
			var zero T
			return "", fmt.Errorf("request is %T, not %T", req, zero)
		}
		return fn(t)
	}
}

// Policy maps a full method ("/mesh.signer.v1.SignerService/SignCompositions")
// to its rule. A method with no rule is denied.
type Policy map[string]Rule

// Merge returns a new policy holding the rules of every policy; a later
// policy's rule for a method replaces an earlier one's.
func Merge(policies ...Policy) Policy {
	out := Policy{}
	for _, p := range policies {
		for m, r := range p {
			out[m] = r
		}
	}
	return out
}

// PlatformRules returns the rules of the services every mesh server runs:
// gRPC health and server reflection, open to any authenticated role so that
// grpcurl with any mesh certificate works (DESIGN.md §10).
func PlatformRules() Policy {
	p := Policy{}
	for _, sd := range []grpc.ServiceDesc{
		healthgrpc.Health_ServiceDesc,
		reflectionv1.ServerReflection_ServiceDesc,
		reflectionv1alpha.ServerReflection_ServiceDesc,
	} {
		for _, m := range sd.Methods {
			p["/"+sd.ServiceName+"/"+m.MethodName] = AnyAuthenticated()
		}
		for _, s := range sd.Streams {
			p["/"+sd.ServiceName+"/"+s.StreamName] = AnyAuthenticated()
		}
	}
	return p
}

// authorizer holds what both interceptors share.
type authorizer struct {
	policy      Policy
	log         *slog.Logger
	trustDomain string
}

// Option configures an interceptor.
type Option func(*authorizer)

// InTrustDomain refuses callers whose identity is of another trust domain
// (PERMISSION_DENIED): a CA bundle that also holds another trust domain's
// CA (federation, a migration) must not give that domain's workloads the
// roles of this one. Empty: no check.
func InTrustDomain(td string) Option { return func(a *authorizer) { a.trustDomain = td } }

func newAuthorizer(p Policy, log *slog.Logger, opts []Option) *authorizer {
	if log == nil {
		log = slog.Default()
	}
	// A copy: the policy a server was built with cannot change under it.
	a := &authorizer{policy: Merge(p), log: log}
	for _, o := range opts {
		o(a)
	}
	return a
}

// authorize reads the caller and checks its role; the rule is returned for
// the node:self check that follows once the request is known.
func (a *authorizer) authorize(ctx context.Context, method string) (identity.Identity, Rule, error) {
	id, err := identity.FromPeer(ctx)
	if err != nil {
		a.deny(ctx, method, "", err.Error())
		return identity.Identity{}, Rule{}, status.Errorf(codes.Unauthenticated, "no valid identity: %v", err)
	}
	if a.trustDomain != "" && id.TrustDomain != a.trustDomain {
		a.deny(ctx, method, id.String(), "trust domain "+id.TrustDomain)
		return identity.Identity{}, Rule{}, status.Errorf(codes.PermissionDenied, "%s is of trust domain %q; this server serves %q", id.URI(), id.TrustDomain, a.trustDomain)
	}
	rule, ok := a.policy[method]
	if !ok {
		a.deny(ctx, method, id.String(), "method has no rule")
		return identity.Identity{}, Rule{}, status.Errorf(codes.PermissionDenied, "%s may not call %s", id, method)
	}
	if !rule.Allows(id.Role) {
		a.deny(ctx, method, id.String(), "role not allowed")
		return identity.Identity{}, Rule{}, status.Errorf(codes.PermissionDenied, "%s may not call %s", id, method)
	}
	return id, rule, nil
}

// checkSelf applies node:self to one request.
func (a *authorizer) checkSelf(ctx context.Context, method string, id identity.Identity, rule Rule, req any) error {
	if rule.NodeSelf == nil || id.Role != identity.RoleNode {
		return nil
	}
	node, err := rule.NodeSelf(req)
	if err != nil {
		a.deny(ctx, method, id.String(), "node:self: "+err.Error())
		return status.Error(codes.InvalidArgument, err.Error())
	}
	if node != id.Name {
		a.deny(ctx, method, id.String(), fmt.Sprintf("node:self: request names node %q", node))
		return selfDenied(id, node)
	}
	return nil
}

func selfDenied(id identity.Identity, node string) error {
	return status.Errorf(codes.PermissionDenied, "%s may not act for node %q", id, node)
}

func (a *authorizer) deny(ctx context.Context, method, caller, reason string) {
	a.log.LogAttrs(ctx, slog.LevelWarn, "request denied",
		slog.String("method", method),
		slog.String("caller", caller),
		slog.String("reason", reason))
}

// UnaryInterceptor authorizes unary calls by p: UNAUTHENTICATED when the
// peer has no valid identity, PERMISSION_DENIED when the method has no rule,
// the caller's role is not listed or node:self fails. Denials are logged to
// log (slog.Default when nil) with method, caller and reason. The handler's
// context carries the caller's identity (identity.FromContext).
func UnaryInterceptor(p Policy, log *slog.Logger, opts ...Option) grpc.UnaryServerInterceptor {
	a := newAuthorizer(p, log, opts)
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		id, rule, err := a.authorize(ctx, info.FullMethod)
		if err != nil {
			return nil, err
		}
		if err := a.checkSelf(ctx, info.FullMethod, id, rule, req); err != nil {
			return nil, err
		}
		return handler(identity.NewContext(ctx, id), req)
	}
}

// StreamInterceptor authorizes streams like UnaryInterceptor. For a rule
// with node:self it checks the first message the handler receives, which
// covers server-streaming methods and the opening message of bidirectional
// ones (its error comes back from RecvMsg, and a handler must return it as
// is); later messages are the handler's to check with CheckSelf.
func StreamInterceptor(p Policy, log *slog.Logger, opts ...Option) grpc.StreamServerInterceptor {
	a := newAuthorizer(p, log, opts)
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		ctx := ss.Context()
		id, rule, err := a.authorize(ctx, info.FullMethod)
		if err != nil {
			return err
		}
		ws := &stream{ServerStream: ss, ctx: identity.NewContext(ctx, id)}
		if rule.NodeSelf != nil && id.Role == identity.RoleNode {
			ws.first = func(m any) error { return a.checkSelf(ctx, info.FullMethod, id, rule, m) }
		}
		return handler(srv, ws)
	}
}

// stream carries the caller's identity in its context and checks node:self
// on the first message received. gRPC never calls RecvMsg concurrently, so
// the fields need no lock.
type stream struct {
	grpc.ServerStream
	ctx     context.Context
	first   func(m any) error // nil once run or when there is nothing to check
	refused error
}

func (s *stream) Context() context.Context { return s.ctx }

func (s *stream) RecvMsg(m any) error {
	if s.refused != nil {
		// A handler that ignored the refusal must not read on as if the
		// opening message had passed.
		return s.refused
	}
	if err := s.ServerStream.RecvMsg(m); err != nil {
		return err
	}
	if check := s.first; check != nil {
		s.first = nil
		if err := check(m); err != nil {
			s.refused = err
			return err
		}
	}
	return nil
}

// CheckSelf returns nil when the caller in ctx may act for node: it is not
// a node, or it is that node. Otherwise PERMISSION_DENIED, or
// UNAUTHENTICATED when ctx carries no identity (the interceptors put it
// there). Stream handlers call it for each message that names a node.
func CheckSelf(ctx context.Context, node string) error {
	id, ok := identity.FromContext(ctx)
	if !ok {
		return status.Error(codes.Unauthenticated, "no identity in context")
	}
	if id.Role != identity.RoleNode || id.Name == node {
		return nil
	}
	return selfDenied(id, node)
}
