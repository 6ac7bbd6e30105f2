// Package certs checks that every service refuses callers with a bad
// certificate (DESIGN.md §8) before any handler runs: expired, not yet
// valid, of another CA, without a URI SAN, with two URI SANs, of a role the
// method does not allow, and no certificate at all. Each case calls every
// method of every service over real mTLS; counting interceptors (which run
// inside authorization) prove that no handler was invoked.
package certs

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/emptypb"

	"mesh.dev/internal/authz"
	"mesh.dev/internal/grpcserver"
	"mesh.dev/internal/identity"
	"mesh.dev/internal/testutil"
	catalogv1 "mesh.dev/proto/mesh/catalog/v1"
	composerv1 "mesh.dev/proto/mesh/composer/v1"
	nodeenginev1 "mesh.dev/proto/mesh/nodeengine/v1"
	signerv1 "mesh.dev/proto/mesh/signer/v1"
	catalogapp "mesh.dev/services/catalog/app"
	composerapp "mesh.dev/services/composer/app"
	signerapp "mesh.dev/services/signer/app"
	"mesh.dev/tests/internal/rig"
)

// service is one server under test.
type service struct {
	name  string
	addr  string
	descs []grpc.ServiceDesc
	// policy says which roles each method allows (node:self aside).
	policy authz.Policy
	// calls counts handler invocations; nil when the server offers no way
	// to count (the composer's app: see the stub below).
	calls *rig.Counter
	// good may call probe, which reaches its handler.
	good  identity.Identity
	probe string
	// self is the node a node:self rule allows (the engine's own).
	self string
}

// certCase is one kind of bad certificate.
type certCase struct {
	name string
	// tls returns the client config of the case for a service; nil skips
	// a method (a wrong role for a method every role may call).
	tls func(t *testing.T, s *service, method string) *tls.Config
	// want is the code, words the message must hold (any of).
	want  codes.Code
	words []string
	// alert is what a refused handshake's alert says (handshake cases).
	alert string
}

// handshake lists what a refused TLS handshake reads as on a gRPC client:
// in TLS 1.3 the server judges the client's certificate after the client
// finished its side, so the client sees the alert, or the connection the
// server closed while it was writing. probeHandshake reads the alert
// itself.
var handshake = []string{"tls:", "certificate", "handshake", "connection", "broken pipe", "EOF"}

func certCases(p *testutil.PKI) []certCase {
	return []certCase{
		{"expired", func(t *testing.T, s *service, _ string) *tls.Config { return p.ExpiredClientTLS(t, s.good) }, codes.Unavailable, handshake,
			"tls: expired certificate"},
		{"not yet valid", func(t *testing.T, s *service, _ string) *tls.Config { return p.NotYetValidClientTLS(t, s.good) }, codes.Unavailable, handshake,
			"tls: expired certificate"}, // Go's alert for a certificate outside its validity either way
		{"wrong CA", func(t *testing.T, s *service, _ string) *tls.Config { return p.OtherCAClientTLS(t, s.good) }, codes.Unavailable, handshake,
			"tls: unknown certificate authority"},
		{"no URI SAN", func(t *testing.T, _ *service, _ string) *tls.Config { return p.NoURISANClientTLS(t) }, codes.Unauthenticated,
			[]string{"certificate has no URI SAN"}, ""},
		{"two URI SANs", func(t *testing.T, _ *service, _ string) *tls.Config { return p.TwoURISANsClientTLS(t) }, codes.Unauthenticated,
			[]string{"certificate has 2 URI SANs, want exactly 1"}, ""},
		{"wrong role", func(t *testing.T, s *service, method string) *tls.Config {
			id, ok := wrongRole(p, s, method)
			if !ok {
				return nil
			}
			return p.ClientTLS(t, id)
		}, codes.PermissionDenied, []string{"may not call", "may not act for node"}, ""},
		{"no certificate", func(*testing.T, *service, string) *tls.Config { return p.NoCertClientTLS() }, codes.Unavailable, handshake,
			"tls: certificate required"},
	}
}

// wrongRole returns an identity the method's rule does not allow: a role
// it does not list, or for a node:self rule another node. A method every
// role may call has none.
func wrongRole(p *testutil.PKI, s *service, method string) (identity.Identity, bool) {
	rule := s.policy[method]
	for _, r := range []identity.Role{identity.RoleCatalog, identity.RoleSigner, identity.RoleComposer, identity.RoleBuilder, identity.RoleOperator} {
		if !rule.Allows(r) {
			return p.Identity(r, ""), true
		}
	}
	if s.self != "" {
		return p.Identity(identity.RoleNode, "not-"+s.self), true
	}
	return identity.Identity{}, false
}

// methods lists a service's full methods and whether each streams.
func methods(descs []grpc.ServiceDesc) map[string]*grpc.StreamDesc {
	out := map[string]*grpc.StreamDesc{}
	for _, d := range descs {
		for _, m := range d.Methods {
			out["/"+d.ServiceName+"/"+m.MethodName] = nil
		}
		for _, s := range d.Streams {
			out["/"+d.ServiceName+"/"+s.StreamName] = &grpc.StreamDesc{StreamName: s.StreamName, ServerStreams: s.ServerStreams, ClientStreams: s.ClientStreams}
		}
	}
	return out
}

// call invokes a method with an empty request and returns its error.
func call(conn *grpc.ClientConn, method string, sd *grpc.StreamDesc) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if sd == nil {
		return conn.Invoke(ctx, method, &emptypb.Empty{}, &emptypb.Empty{})
	}
	st, err := conn.NewStream(ctx, sd, method)
	if err != nil {
		return err
	}
	_ = st.SendMsg(&emptypb.Empty{})
	_ = st.CloseSend()
	return st.RecvMsg(&emptypb.Empty{})
}

// stubComposer answers every composer method Unimplemented: it stands for
// the composer's handlers in a server built exactly as the composer's
// (grpcserver with composerapp.Policy()), with counting interceptors the
// composer's app.Options has no way to take.
//
// For node:self on a stream the authorization interceptor checks the first
// request as the handler reads it (it must be read to name the node), so
// the interceptors count the stream; the stub counts, in reached, the
// requests that got to its code, which must stay zero.
type stubComposer struct {
	composerv1.UnimplementedComposerServiceServer
	composerv1.UnimplementedSyncServiceServer
	reached *rig.Counter
}

func (s stubComposer) GetComposition(context.Context, *composerv1.GetCompositionRequest) (*composerv1.GetCompositionResponse, error) {
	s.reached.Add(composerv1.ComposerService_GetComposition_FullMethodName)
	return nil, status.Error(codes.Unimplemented, "stub")
}

func (s stubComposer) GetObject(*composerv1.GetObjectRequest, grpc.ServerStreamingServer[composerv1.GetObjectResponse]) error {
	s.reached.Add(composerv1.ComposerService_GetObject_FullMethodName)
	return status.Error(codes.Unimplemented, "stub")
}

func (s stubComposer) Sync(stream grpc.BidiStreamingServer[composerv1.SyncRequest, composerv1.SyncResponse]) error {
	if _, err := stream.Recv(); err != nil {
		return err
	}
	s.reached.Add(composerv1.SyncService_Sync_FullMethodName)
	return status.Error(codes.Unimplemented, "stub")
}

func TestBadCertificatesReachNoHandler(t *testing.T) {
	t.Parallel()
	m := rig.Start(t, rig.Options{})
	// A catalog and a signer only this test calls: the mesh's own are
	// called by the composer meanwhile.
	catalogCalls, signerCalls := rig.NewCounter(), rig.NewCounter()
	catalogAddr := m.StartCatalog(t, catalogCalls)
	signerAddr, _ := m.StartSigner(t, signerCalls)
	eng := m.StartEngine(t, "ace", m.ComposerAddr)
	stubCalls, stubReached := rig.NewCounter(), rig.NewCounter()
	stubAddr, _ := testutil.StartServerConfig(t, grpcserver.Config{
		TLS: m.PKI.ServerTLS(t, m.PKI.Identity(identity.RoleComposer, "")), Policy: composerapp.Policy(),
		Logger: rig.Logger(t), ServerOptions: stubCalls.ServerOptions(),
	}, func(r grpc.ServiceRegistrar) {
		composerv1.RegisterComposerServiceServer(r, stubComposer{reached: stubReached})
		composerv1.RegisterSyncServiceServer(r, stubComposer{reached: stubReached})
	})
	operator := m.PKI.Identity(identity.RoleOperator, "admin")
	composerDescs := []grpc.ServiceDesc{composerv1.ComposerService_ServiceDesc, composerv1.SyncService_ServiceDesc}
	adminRule := authz.Allow(identity.RoleOperator, identity.RoleNode).Self(func(any) (string, error) { return "ace", nil })
	services := []*service{
		{name: "catalog", addr: catalogAddr, descs: []grpc.ServiceDesc{catalogv1.CatalogService_ServiceDesc}, policy: catalogapp.Policy(),
			calls: catalogCalls, good: m.PKI.Identity(identity.RoleBuilder, "ci"), probe: catalogv1.CatalogService_GetEntry_FullMethodName},
		{name: "signer", addr: signerAddr, descs: []grpc.ServiceDesc{signerv1.SignerService_ServiceDesc}, policy: signerapp.Policy(),
			calls: signerCalls, good: m.PKI.Identity(identity.RoleComposer, ""), probe: signerv1.SignerService_GetKeyset_FullMethodName},
		{name: "composer", addr: m.ComposerAddr, descs: composerDescs, policy: composerapp.Policy(),
			good: operator, probe: composerv1.ComposerService_ListNodes_FullMethodName},
		{name: "composer (policy stub)", addr: stubAddr, descs: composerDescs, policy: composerapp.Policy(),
			calls: stubCalls, good: operator, probe: composerv1.ComposerService_ListNodes_FullMethodName},
		{name: "node engine admin", addr: eng.Admin, descs: []grpc.ServiceDesc{nodeenginev1.NodeEngineService_ServiceDesc},
			policy: authz.Policy{
				nodeenginev1.NodeEngineService_GetStatus_FullMethodName:  adminRule,
				nodeenginev1.NodeEngineService_FirstViews_FullMethodName: adminRule,
				nodeenginev1.NodeEngineService_EntryAgain_FullMethodName: adminRule,
			}, calls: eng.Calls, good: operator, probe: nodeenginev1.NodeEngineService_GetStatus_FullMethodName, self: "ace"},
	}
	cases := certCases(m.PKI)
	type tally struct{ run, refused, skipped int }
	totals := map[string]*tally{}
	for _, s := range services {
		ms := methods(s.descs)
		names := make([]string, 0, len(ms))
		for n := range ms {
			names = append(names, n)
		}
		sort.Strings(names)
		before := 0
		if s.calls != nil {
			before = s.calls.Total()
		}
		for _, c := range cases {
			tl := totals[c.name]
			if tl == nil {
				tl = &tally{}
				totals[c.name] = tl
			}
			if c.alert != "" {
				if err := probeHandshake(s.addr, c.tls(t, s, s.probe)); err == nil || !strings.Contains(err.Error(), c.alert) {
					t.Errorf("%s, %s: the handshake ends with %v, want the alert %q", s.name, c.name, err, c.alert)
				}
			}
			conns := map[*tls.Config]*grpc.ClientConn{}
			for _, method := range names {
				cfg := c.tls(t, s, method)
				if cfg == nil {
					tl.skipped++
					continue
				}
				conn, ok := conns[cfg]
				if !ok {
					conn = testutil.DialTLS(t, s.addr, cfg)
					conns[cfg] = conn
				}
				tl.run++
				err := call(conn, method, ms[method])
				if got := status.Code(err); got != c.want || !containsAny(status.Convert(err).Message(), c.words) {
					t.Errorf("%s, %s, %s: %v (code %v), want %v with one of %q", s.name, c.name, method, err, got, c.want, c.words)
					continue
				}
				tl.refused++
			}
		}
		if s.calls != nil {
			if n := s.calls.Total() - before; n != 0 {
				t.Errorf("%s: %d handler invocations for refused callers, want 0", s.name, n)
			}
			// The counter does count: a good caller reaches the handler.
			_ = call(m.Dial(t, s.addr, s.good.Role, s.good.Name), s.probe, ms[s.probe])
			if s.calls.Of(s.probe) != 1 {
				t.Errorf("%s: %s as %s counted %d handler invocations, want 1", s.name, s.probe, s.good, s.calls.Of(s.probe))
			}
		}
		counted := "handler invocations for refused callers: 0"
		if s.calls == nil {
			counted = "refusals checked; handlers counted on the policy stub"
		}
		t.Logf("%s: %d methods × %d certificate cases, %s", s.name, len(names), len(cases), counted)
	}
	// node:self: a node's certificate naming another node than the one
	// its request is for.
	bob := m.PKI.Identity(identity.RoleNode, "bob")
	self := 0
	for _, s := range services[2:] {
		before := 0
		if s.calls != nil {
			before = s.calls.Total()
		}
		conn := m.Dial(t, s.addr, bob.Role, bob.Name)
		var errs []error
		if s.self == "" {
			cc := composerv1.NewComposerServiceClient(conn)
			_, err := cc.GetComposition(context.Background(), &composerv1.GetCompositionRequest{Key: "ace.node"})
			errs = append(errs, err)
			obj, err := cc.GetObject(context.Background(), &composerv1.GetObjectRequest{CompositionKey: "ace.node", Digest: "sha256:" + strings.Repeat("0", 64)})
			if err == nil {
				_, err = obj.Recv()
			}
			errs = append(errs, err)
			st, err := composerv1.NewSyncServiceClient(conn).Sync(context.Background())
			if err == nil {
				_ = st.Send(&composerv1.SyncRequest{Msg: &composerv1.SyncRequest_Hello{Hello: &composerv1.Hello{Node: "ace"}}})
				_, err = st.Recv()
			}
			errs = append(errs, err)
		} else {
			ec := nodeenginev1.NewNodeEngineServiceClient(conn)
			_, err := ec.GetStatus(context.Background(), &nodeenginev1.GetStatusRequest{})
			errs = append(errs, err)
			_, err = ec.FirstViews(context.Background(), &nodeenginev1.FirstViewsRequest{})
			errs = append(errs, err)
		}
		for i, err := range errs {
			self++
			if status.Code(err) != codes.PermissionDenied || !strings.Contains(status.Convert(err).Message(), `may not act for node "ace"`) {
				t.Errorf("%s: call %d as node bob for ace: %v, want PERMISSION_DENIED naming ace", s.name, i, err)
			}
		}
		switch {
		case s.calls == stubCalls:
			if n := stubReached.Total(); n != 0 {
				t.Errorf("%s: %d requests of node bob acting for ace reached the handlers, want 0", s.name, n)
			}
		case s.calls != nil && s.calls.Total() != before:
			t.Errorf("%s: %d handler invocations for node bob acting for ace, want 0", s.name, s.calls.Total()-before)
		}
	}
	t.Logf("node:self (node bob acting for ace): %d calls refused PERMISSION_DENIED, 0 handler invocations", self)

	var lines []string
	for _, c := range cases {
		tl := totals[c.name]
		lines = append(lines, fmt.Sprintf("%-15s calls %3d refused %3d violations %d%s", c.name, tl.run, tl.refused, tl.run-tl.refused,
			map[bool]string{true: fmt.Sprintf(" (%d methods any role may call: no wrong role)", tl.skipped), false: ""}[tl.skipped > 0]))
	}
	t.Logf("certificate cases over %d services:\n%s", len(services), strings.Join(lines, "\n"))
}

// probeHandshake makes a TLS connection as a gRPC client would and reads
// from it: a server that refuses the client's certificate answers with an
// alert, which the read returns.
func probeHandshake(addr string, cfg *tls.Config) error {
	cfg = cfg.Clone()
	cfg.NextProtos = []string{"h2"}
	cfg.ServerName = "localhost"
	conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 10 * time.Second}, "tcp", addr, cfg)
	if err != nil {
		return err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	_, err = conn.Read(make([]byte, 1))
	return err
}

func containsAny(s string, words []string) bool {
	return slices.ContainsFunc(words, func(w string) bool { return strings.Contains(s, w) })
}
