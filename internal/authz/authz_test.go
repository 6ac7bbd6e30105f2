package authz_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"log/slog"
	"net/url"
	"strings"
	"sync"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	healthgrpc "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"mesh.dev/internal/authz"
	"mesh.dev/internal/identity"
	"mesh.dev/internal/testutil"
	signerv1 "mesh.dev/proto/mesh/signer/v1"
)

const (
	methodSign  = "/test.v1.Test/Sign"
	methodRead  = "/test.v1.Test/Read"
	methodOwn   = "/test.v1.Test/Own"
	methodNoOne = "/test.v1.Test/NoOne"
	methodNone  = "/test.v1.Test/Unlisted"
)

// nodeReq is a request naming a node; a request with an empty node is
// malformed.
type nodeReq struct{ node string }

func testPolicy() authz.Policy {
	return authz.Policy{
		methodSign:  authz.Allow(identity.RoleComposer),
		methodRead:  authz.AnyAuthenticated(),
		methodNoOne: authz.Allow(),
		methodOwn: authz.Allow(identity.RoleNode, identity.RoleOperator, identity.RoleComposer).
			Self(authz.SelfFrom(func(r *nodeReq) (string, error) {
				if r.node == "" {
					return "", errors.New("node: empty")
				}
				return r.node, nil
			})),
	}
}

// peerCtx is the context gRPC gives a handler of a caller whose verified
// certificate holds uris.
func peerCtx(t *testing.T, uris ...string) context.Context {
	t.Helper()
	leaf := &x509.Certificate{}
	for _, s := range uris {
		u, err := url.Parse(s)
		if err != nil {
			t.Fatal(err)
		}
		leaf.URIs = append(leaf.URIs, u)
	}
	return peer.NewContext(context.Background(), &peer.Peer{
		AuthInfo: credentials.TLSInfo{State: tls.ConnectionState{VerifiedChains: [][]*x509.Certificate{{leaf}}}},
	})
}

// logSink collects JSON log records.
type logSink struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (s *logSink) Write(b []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.buf.Write(b)
}

func (s *logSink) records(t *testing.T) []map[string]any {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []map[string]any
	for line := range strings.Lines(s.buf.String()) {
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatal(err)
		}
		out = append(out, m)
	}
	return out
}

func TestUnaryInterceptor(t *testing.T) {
	t.Parallel()
	const (
		composer = "spiffe://mesh.test/service/composer"
		catalog  = "spiffe://mesh.test/service/catalog"
		ace      = "spiffe://mesh.test/node/ace"
		admin    = "spiffe://mesh.test/operator/admin"
		ci       = "spiffe://mesh.test/builder/ci"
	)
	tests := []struct {
		name       string
		ctx        func(t *testing.T) context.Context
		method     string
		req        any
		wantCode   codes.Code
		wantMsg    string
		wantReason string // logged reason of a denial
	}{
		{name: "allowed", ctx: func(t *testing.T) context.Context { return peerCtx(t, composer) }, method: methodSign, wantCode: codes.OK},
		{name: "any authenticated", ctx: func(t *testing.T) context.Context { return peerCtx(t, ci) }, method: methodRead, wantCode: codes.OK},
		{name: "role not listed", ctx: func(t *testing.T) context.Context { return peerCtx(t, catalog) }, method: methodSign,
			wantCode: codes.PermissionDenied, wantMsg: "service/catalog may not call /test.v1.Test/Sign", wantReason: "role not allowed"},
		{name: "method without rule", ctx: func(t *testing.T) context.Context { return peerCtx(t, composer) }, method: methodNone,
			wantCode: codes.PermissionDenied, wantMsg: "may not call /test.v1.Test/Unlisted", wantReason: "method has no rule"},
		{name: "rule allowing no one", ctx: func(t *testing.T) context.Context { return peerCtx(t, admin) }, method: methodNoOne,
			wantCode: codes.PermissionDenied, wantReason: "role not allowed"},
		{name: "no peer", ctx: func(*testing.T) context.Context { return context.Background() }, method: methodRead,
			wantCode: codes.Unauthenticated, wantMsg: "no peer in context", wantReason: "no peer in context"},
		{name: "no URI SAN", ctx: func(t *testing.T) context.Context { return peerCtx(t) }, method: methodRead,
			wantCode: codes.Unauthenticated, wantMsg: "certificate has no URI SAN", wantReason: "certificate has no URI SAN"},
		{name: "two URI SANs", ctx: func(t *testing.T) context.Context { return peerCtx(t, ace, admin) }, method: methodRead,
			wantCode: codes.Unauthenticated, wantMsg: "certificate has 2 URI SANs"},
		{name: "malformed SAN", ctx: func(t *testing.T) context.Context { return peerCtx(t, "spiffe://mesh.test/node/ace/x") }, method: methodRead,
			wantCode: codes.Unauthenticated, wantMsg: "has 3 segments"},
		{name: "unknown role", ctx: func(t *testing.T) context.Context { return peerCtx(t, "spiffe://mesh.test/robot/r2") }, method: methodRead,
			wantCode: codes.Unauthenticated, wantMsg: `unknown role "robot"`},
		{name: "node self", ctx: func(t *testing.T) context.Context { return peerCtx(t, ace) }, method: methodOwn, req: &nodeReq{"ace"}, wantCode: codes.OK},
		{name: "node for another", ctx: func(t *testing.T) context.Context { return peerCtx(t, ace) }, method: methodOwn, req: &nodeReq{"bob"},
			wantCode: codes.PermissionDenied, wantMsg: `node/ace may not act for node "bob"`, wantReason: `node:self: request names node "bob"`},
		{name: "node self malformed request", ctx: func(t *testing.T) context.Context { return peerCtx(t, ace) }, method: methodOwn, req: &nodeReq{},
			wantCode: codes.InvalidArgument, wantMsg: "node: empty", wantReason: "node:self: node: empty"},
		{name: "node self wrong type", ctx: func(t *testing.T) context.Context { return peerCtx(t, ace) }, method: methodOwn, req: "x",
			wantCode: codes.InvalidArgument, wantMsg: "request is string, not *authz_test.nodeReq"},
		{name: "operator exempt from self", ctx: func(t *testing.T) context.Context { return peerCtx(t, admin) }, method: methodOwn, req: &nodeReq{"bob"}, wantCode: codes.OK},
		{name: "service exempt from self", ctx: func(t *testing.T) context.Context { return peerCtx(t, composer) }, method: methodOwn, req: &nodeReq{"bob"}, wantCode: codes.OK},
		{name: "role check before self", ctx: func(t *testing.T) context.Context { return peerCtx(t, ci) }, method: methodOwn, req: &nodeReq{"ci"},
			wantCode: codes.PermissionDenied, wantReason: "role not allowed"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			sink := &logSink{}
			intercept := authz.UnaryInterceptor(testPolicy(), slog.New(slog.NewJSONHandler(sink, nil)))
			ctx := tt.ctx(t)
			var seen identity.Identity
			called := false
			_, err := intercept(ctx, tt.req, &grpc.UnaryServerInfo{FullMethod: tt.method}, func(ctx context.Context, req any) (any, error) {
				called = true
				seen, _ = identity.FromContext(ctx)
				return "ok", nil
			})
			if got := status.Code(err); got != tt.wantCode {
				t.Fatalf("code = %s (%v), want %s", got, err, tt.wantCode)
			}
			if tt.wantMsg != "" && !strings.Contains(status.Convert(err).Message(), tt.wantMsg) {
				t.Errorf("message = %q, want it to contain %q", status.Convert(err).Message(), tt.wantMsg)
			}
			if tt.wantCode == codes.OK {
				want, _ := identity.FromPeer(ctx)
				if !called || seen != want {
					t.Errorf("handler called=%v with identity %+v, want %+v", called, seen, want)
				}
				if recs := sink.records(t); len(recs) != 0 {
					t.Errorf("allowed call logged %v", recs)
				}
				return
			}
			if called {
				t.Error("handler ran for a refused call")
			}
			recs := sink.records(t)
			if len(recs) != 1 {
				t.Fatalf("logged %d records, want 1 denial", len(recs))
			}
			rec := recs[0]
			if rec["msg"] != "request denied" || rec["method"] != tt.method {
				t.Errorf("log record %v, want msg \"request denied\" and method %s", rec, tt.method)
			}
			if _, ok := rec["caller"]; !ok {
				t.Errorf("log record %v has no caller", rec)
			}
			if tt.wantReason != "" && rec["reason"] != tt.wantReason {
				t.Errorf("logged reason %q, want %q", rec["reason"], tt.wantReason)
			}
		})
	}
}

// fakeStream is a server stream whose received messages are queued.
type fakeStream struct {
	grpc.ServerStream
	ctx  context.Context
	msgs []string
}

func (s *fakeStream) Context() context.Context { return s.ctx }

func (s *fakeStream) RecvMsg(m any) error {
	if len(s.msgs) == 0 {
		return errors.New("EOF")
	}
	m.(*nodeReq).node, s.msgs = s.msgs[0], s.msgs[1:]
	return nil
}

func TestStreamInterceptor(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		caller   string
		method   string
		msgs     []string
		wantCode codes.Code // of the interceptor itself
		wantRecv []codes.Code
	}{
		{name: "allowed", caller: "spiffe://mesh.test/service/composer", method: methodSign, msgs: []string{"x"}, wantRecv: []codes.Code{codes.OK}},
		{name: "denied", caller: "spiffe://mesh.test/node/ace", method: methodSign, wantCode: codes.PermissionDenied},
		{name: "unauthenticated", caller: "https://mesh.test/node/ace", method: methodRead, wantCode: codes.Unauthenticated},
		{name: "self first message", caller: "spiffe://mesh.test/node/ace", method: methodOwn, msgs: []string{"ace", "bob"},
			// Only the first message is the interceptor's to check.
			wantRecv: []codes.Code{codes.OK, codes.OK}},
		{name: "other node first message", caller: "spiffe://mesh.test/node/ace", method: methodOwn, msgs: []string{"bob", "ace"},
			// The refusal sticks for a handler that ignores it.
			wantRecv: []codes.Code{codes.PermissionDenied, codes.PermissionDenied}},
		{name: "operator for any node", caller: "spiffe://mesh.test/operator/admin", method: methodOwn, msgs: []string{"bob"}, wantRecv: []codes.Code{codes.OK}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			intercept := authz.StreamInterceptor(testPolicy(), slog.New(slog.DiscardHandler))
			ss := &fakeStream{ctx: peerCtx(t, tt.caller), msgs: tt.msgs}
			var got []codes.Code
			err := intercept(nil, ss, &grpc.StreamServerInfo{FullMethod: tt.method}, func(_ any, s grpc.ServerStream) error {
				id, ok := identity.FromContext(s.Context())
				if want, _ := identity.FromPeer(ss.ctx); !ok || id != want {
					t.Errorf("stream context identity %+v, %v; want %+v", id, ok, want)
				}
				for range tt.wantRecv {
					got = append(got, status.Code(s.RecvMsg(&nodeReq{})))
				}
				return nil
			})
			if code := status.Code(err); code != tt.wantCode {
				t.Fatalf("interceptor code = %s (%v), want %s", code, err, tt.wantCode)
			}
			if len(got) != len(tt.wantRecv) {
				t.Fatalf("RecvMsg codes %v, want %v", got, tt.wantRecv)
			}
			for i := range got {
				if got[i] != tt.wantRecv[i] {
					t.Fatalf("RecvMsg codes %v, want %v", got, tt.wantRecv)
				}
			}
		})
	}
}

func TestCheckSelf(t *testing.T) {
	t.Parallel()
	ctxOf := func(role identity.Role, name string) context.Context {
		return identity.NewContext(context.Background(), identity.Identity{TrustDomain: "mesh.test", Role: role, Name: name})
	}
	tests := []struct {
		name string
		ctx  context.Context
		node string
		want codes.Code
	}{
		{"node itself", ctxOf(identity.RoleNode, "ace"), "ace", codes.OK},
		{"node for another", ctxOf(identity.RoleNode, "ace"), "bob", codes.PermissionDenied},
		{"node for none", ctxOf(identity.RoleNode, "ace"), "", codes.PermissionDenied},
		{"operator", ctxOf(identity.RoleOperator, "admin"), "bob", codes.OK},
		{"service", ctxOf(identity.RoleComposer, "composer"), "bob", codes.OK},
		{"no identity", context.Background(), "ace", codes.Unauthenticated},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if got := status.Code(authz.CheckSelf(tt.ctx, tt.node)); got != tt.want {
				t.Fatalf("CheckSelf() = %s, want %s", got, tt.want)
			}
		})
	}
}

func TestPlatformRules(t *testing.T) {
	t.Parallel()
	p := authz.PlatformRules()
	for _, m := range []string{
		"/grpc.health.v1.Health/Check",
		"/grpc.health.v1.Health/Watch",
		"/grpc.health.v1.Health/List",
		"/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
		"/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
	} {
		r, ok := p[m]
		if !ok {
			t.Errorf("no platform rule for %s", m)
			continue
		}
		for _, role := range identity.Roles() {
			if !r.Allows(role) {
				t.Errorf("%s does not allow %s", m, role)
			}
		}
	}
	if len(p) != 5 {
		t.Errorf("PlatformRules has %d entries, want 5", len(p))
	}
}

func TestRuleConstructorsDoNotAlias(t *testing.T) {
	t.Parallel()
	roles := []identity.Role{identity.RoleNode, identity.RoleOperator}
	r := authz.Allow(roles...)
	roles[0] = identity.RoleBuilder
	if !r.Allows(identity.RoleNode) || r.Allows(identity.RoleBuilder) {
		t.Fatal("Allow kept the caller's slice")
	}
	s := r.Self(func(any) (string, error) { return "", nil })
	s.Roles[0] = identity.RoleBuilder
	if !r.Allows(identity.RoleNode) || r.NodeSelf != nil {
		t.Fatal("Self changed the rule it was called on")
	}
	merged := authz.Merge(authz.Policy{methodRead: r}, authz.Policy{methodRead: authz.Allow()})
	if merged[methodRead].Allows(identity.RoleNode) {
		t.Fatal("Merge: a later policy's rule does not win")
	}
}

// TestOverMTLS checks the interceptors behind a real server: malformed
// certificates of the right CA are UNAUTHENTICATED, certificates the TLS
// layer refuses never reach authorization.
func TestOverMTLS(t *testing.T) {
	t.Parallel()
	p := testutil.NewPKI(t)
	policy := authz.Policy{
		signerv1.SignerService_SignCompositions_FullMethodName: authz.Allow(identity.RoleComposer),
		signerv1.SignerService_SignManifests_FullMethodName:    authz.Allow(identity.RoleComposer),
		signerv1.SignerService_Fence_FullMethodName:            authz.Allow(identity.RoleComposer),
		signerv1.SignerService_GetKeyset_FullMethodName:        authz.AnyAuthenticated(),
	}
	addr, _ := testutil.StartServer(t, p, p.Identity(identity.RoleSigner, ""), policy, func(s grpc.ServiceRegistrar) {
		signerv1.RegisterSignerServiceServer(s, signerv1.UnimplementedSignerServiceServer{})
	})
	node := p.Identity(identity.RoleNode, "ace")
	tests := []struct {
		name string
		tls  *tls.Config
		want codes.Code
	}{
		{"valid", p.ClientTLS(t, node), codes.Unimplemented},
		{"no URI SAN", p.NoURISANClientTLS(t), codes.Unauthenticated},
		{"two URI SANs", p.TwoURISANsClientTLS(t), codes.Unauthenticated},
		{"not spiffe", p.URISANsClientTLS(t, "https://mesh.test/node/ace"), codes.Unauthenticated},
		{"unknown role", p.URISANsClientTLS(t, "spiffe://mesh.test/robot/r2"), codes.Unauthenticated},
		{"other trust domain", p.URISANsClientTLS(t, "spiffe://other.test/node/ace"), codes.Unavailable},
		{"expired", p.ExpiredClientTLS(t, node), codes.Unavailable},
		{"not yet valid", p.NotYetValidClientTLS(t, node), codes.Unavailable},
		{"other CA", p.OtherCAClientTLS(t, node), codes.Unavailable},
		{"no certificate", p.NoCertClientTLS(), codes.Unavailable},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			conn := testutil.DialTLS(t, addr, tt.tls)
			_, err := signerv1.NewSignerServiceClient(conn).GetKeyset(t.Context(), &signerv1.GetKeysetRequest{})
			if got := status.Code(err); got != tt.want {
				t.Fatalf("GetKeyset: %s (%v), want %s", got, err, tt.want)
			}
		})
	}
	// Health is open to every authenticated role.
	conn := testutil.Dial(t, p, addr, p.Identity(identity.RoleBuilder, "ci"))
	if _, err := healthgrpc.NewHealthClient(conn).Check(t.Context(), &healthgrpc.HealthCheckRequest{}); err != nil {
		t.Fatalf("health check as builder: %v", err)
	}
}
