// Package authztest runs the authorization matrix of DESIGN.md §8: every
// method of a service called as every role over real mTLS, each outcome
// checked against the policy.
package authztest

import (
	"context"
	"errors"
	"io"
	"slices"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/dynamicpb"

	"mesh.dev/internal/authz"
	"mesh.dev/internal/identity"
	"mesh.dev/internal/testutil"
)

// Default names of the callers that are not services.
const (
	DefaultNode      = "ace"
	DefaultOtherNode = "bob"
	DefaultOperator  = "admin"
	DefaultBuilder   = "ci"
)

// DefaultTimeout bounds each call of the matrix.
const DefaultTimeout = 10 * time.Second

// Matrix describes one authorization matrix run.
type Matrix struct {
	// Target is the address of a server started with Policy, e.g. from
	// testutil.StartServer.
	Target string
	// PKI issued the server's certificate; the callers' come from it too.
	PKI *testutil.PKI
	// Services are called method by method; each method must have a rule.
	Services []protoreflect.ServiceDescriptor
	// Policy is the server's policy; the platform rules are added as the
	// server adds them.
	Policy authz.Policy
	// Expect is what the test says each full method allows, written out
	// independently of Policy: the roles that may call it and whether it
	// requires node:self. A method without an expectation, or whose policy
	// rule differs from it, fails the test; the calls are then judged
	// against Expect, so a rule opened to another role fails even if the
	// server enforces it faithfully.
	Expect map[string]Expectation
	// Requests holds the request to send per full method; an empty message
	// is sent for a method not listed. A method whose rule has node:self
	// and allows nodes needs one naming Node: the matrix then calls it as
	// Node (allowed) and as OtherNode (PERMISSION_DENIED).
	Requests map[string]proto.Message
	// Node and OtherNode name the node callers; DefaultNode and
	// DefaultOtherNode when empty.
	Node, OtherNode string
	// Timeout bounds each call; DefaultTimeout when zero.
	Timeout time.Duration
}

// Expectation is the expected rule of one method.
type Expectation struct {
	Roles []identity.Role
	// Self is set when a node may call it only for itself.
	Self bool
}

// Allow is an Expectation for roles.
func Allow(roles ...identity.Role) Expectation { return Expectation{Roles: roles} }

// Anyone is the Expectation of a method every authenticated role may call.
func Anyone() Expectation { return Allow(identity.Roles()...) }

// AndSelf marks an Expectation as node:self.
func (e Expectation) AndSelf() Expectation { e.Self = true; return e }

func (e Expectation) allows(r identity.Role) bool { return slices.Contains(e.Roles, r) }

// caller is one identity of the matrix and the label of its subtests.
type caller struct {
	label string
	id    identity.Identity
}

// RunMatrix calls every method of m.Services as every role, each in a
// subtest "<Service>/<Method>/<role>": a caller the policy allows must get a
// code other than PERMISSION_DENIED and UNAUTHENTICATED (the handler ran,
// whatever it answered), any other caller PERMISSION_DENIED. It fails the
// test for a method without a rule, and checks that a client presenting no
// certificate cannot reach the server at all.
func RunMatrix(t *testing.T, m Matrix) {
	t.Helper()
	if m.PKI == nil || m.Target == "" || len(m.Services) == 0 {
		t.Fatal("authztest: Matrix needs Target, PKI and Services")
	}
	if m.Node == "" {
		m.Node = DefaultNode
	}
	if m.OtherNode == "" {
		m.OtherNode = DefaultOtherNode
	}
	if m.Timeout == 0 {
		m.Timeout = DefaultTimeout
	}
	policy := authz.Merge(authz.PlatformRules(), m.Policy)
	for _, full := range Missing(policy, m.Services...) {
		t.Errorf("authztest: %s has no policy entry", full)
	}
	p := m.PKI
	callers := []caller{
		{"catalog", p.Identity(identity.RoleCatalog, "")},
		{"signer", p.Identity(identity.RoleSigner, "")},
		{"composer", p.Identity(identity.RoleComposer, "")},
		{"node", p.Identity(identity.RoleNode, m.Node)},
		{"operator", p.Identity(identity.RoleOperator, DefaultOperator)},
		{"builder", p.Identity(identity.RoleBuilder, DefaultBuilder)},
	}
	other := caller{"other-node", p.Identity(identity.RoleNode, m.OtherNode)}
	conns := map[string]*grpc.ClientConn{}
	for _, c := range append(callers, other) {
		conns[c.label] = testutil.Dial(t, p, m.Target, c.id)
	}

	for _, sd := range m.Services {
		t.Run(string(sd.Name()), func(t *testing.T) {
			methods := sd.Methods()
			for i := range methods.Len() {
				md := methods.Get(i)
				full := fullMethod(md)
				rule, ok := policy[full]
				if !ok {
					continue // reported above
				}
				want, ok := m.Expect[full]
				if !ok {
					t.Errorf("authztest: %s has no expectation in Matrix.Expect", full)
					continue
				}
				for _, r := range identity.Roles() {
					if rule.Allows(r) != want.allows(r) {
						t.Errorf("authztest: the policy of %s allows role %s: %v, the test expects %v", full, r, rule.Allows(r), want.allows(r))
					}
				}
				if (rule.NodeSelf != nil) != want.Self {
					t.Errorf("authztest: the policy of %s has node:self %v, the test expects %v", full, rule.NodeSelf != nil, want.Self)
				}
				req, hasReq := m.Requests[full]
				self := want.Self && want.allows(identity.RoleNode)
				if self && !hasReq {
					t.Errorf("authztest: %s requires node:self; give Matrix.Requests a request naming node %q", full, m.Node)
				}
				run := callers
				if self && hasReq {
					run = append(slices.Clone(callers), other)
				}
				for _, c := range run {
					allowed := want.allows(c.id.Role) && c.label != other.label
					t.Run(string(md.Name())+"/"+c.label, func(t *testing.T) {
						t.Parallel()
						code, err := call(t, conns[c.label], md, req, m.Timeout)
						switch {
						case allowed && (code == codes.PermissionDenied || code == codes.Unauthenticated):
							t.Errorf("%s calling %s: got %s (%v), want the call let through", c.id, full, code, err)
						case !allowed && code != codes.PermissionDenied:
							t.Errorf("%s calling %s: got %s (%v), want PermissionDenied", c.id, full, code, err)
						}
					})
				}
			}
		})
	}

	t.Run("no-client-certificate", func(t *testing.T) {
		t.Parallel()
		md := m.Services[0].Methods().Get(0)
		conn := testutil.DialTLS(t, m.Target, p.NoCertClientTLS())
		if code, err := call(t, conn, md, m.Requests[fullMethod(md)], m.Timeout); code != codes.Unavailable {
			t.Errorf("call without a client certificate: got %s (%v), want Unavailable (refused handshake)", code, err)
		}
	})
}

// Missing returns the full methods of services that policy has no rule for.
func Missing(policy authz.Policy, services ...protoreflect.ServiceDescriptor) []string {
	var missing []string
	for _, sd := range services {
		methods := sd.Methods()
		for i := range methods.Len() {
			full := fullMethod(methods.Get(i))
			if _, ok := policy[full]; !ok {
				missing = append(missing, full)
			}
		}
	}
	return missing
}

func fullMethod(md protoreflect.MethodDescriptor) string {
	return "/" + string(md.Parent().FullName()) + "/" + string(md.Name())
}

// call makes one call of md with req (an empty message when nil) and
// returns its status code. A stream sends the request, closes its side and
// receives once: enough for authorization to have answered.
func call(t *testing.T, conn *grpc.ClientConn, md protoreflect.MethodDescriptor, req proto.Message, timeout time.Duration) (codes.Code, error) {
	t.Helper()
	if req == nil {
		req = dynamicpb.NewMessage(md.Input())
	}
	resp := dynamicpb.NewMessage(md.Output())
	ctx, cancel := context.WithTimeout(t.Context(), timeout)
	defer cancel()
	full := fullMethod(md)
	if !md.IsStreamingClient() && !md.IsStreamingServer() {
		err := conn.Invoke(ctx, full, req, resp)
		return status.Code(err), err
	}
	desc := &grpc.StreamDesc{
		StreamName:    string(md.Name()),
		ServerStreams: md.IsStreamingServer(),
		ClientStreams: md.IsStreamingClient(),
	}
	cs, err := conn.NewStream(ctx, desc, full)
	if err != nil {
		return status.Code(err), err
	}
	// A send error (io.EOF when the server already ended the stream) is
	// followed by the real status on RecvMsg.
	_ = cs.SendMsg(req)
	_ = cs.CloseSend()
	err = cs.RecvMsg(resp)
	if errors.Is(err, io.EOF) {
		return codes.OK, nil
	}
	return status.Code(err), err
}
