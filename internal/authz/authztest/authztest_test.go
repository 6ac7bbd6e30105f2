package authztest_test

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"mesh.dev/internal/authz"
	"mesh.dev/internal/authz/authztest"
	"mesh.dev/internal/identity"
	"mesh.dev/internal/testutil"
	composerv1 "mesh.dev/proto/mesh/composer/v1"
	signerv1 "mesh.dev/proto/mesh/signer/v1"
)

var (
	signerService   = signerv1.File_mesh_signer_v1_signer_proto.Services().ByName("SignerService")
	composerService = composerv1.File_mesh_composer_v1_composer_proto.Services().ByName("ComposerService")
	syncService     = composerv1.File_mesh_composer_v1_sync_proto.Services().ByName("SyncService")
)

// nodeOfKey reads the node of a composition key, "<node>.<...>".
func nodeOfKey(key string) (string, error) {
	node, _, ok := strings.Cut(key, ".")
	if !ok || node == "" {
		return "", errors.New("key: not <node>.<module>.<fp hex> or <node>.node")
	}
	return node, nil
}

// testPolicy is shaped like the services' own: operators everywhere on the
// composer, nodes only for their own compositions, objects and stream.
func testPolicy() authz.Policy {
	p := authz.Policy{
		signerv1.SignerService_SignCompositions_FullMethodName: authz.Allow(identity.RoleComposer),
		signerv1.SignerService_SignManifests_FullMethodName:    authz.Allow(identity.RoleComposer),
		signerv1.SignerService_Fence_FullMethodName:            authz.Allow(identity.RoleComposer),
		signerv1.SignerService_GetKeyset_FullMethodName:        authz.AnyAuthenticated(),

		composerv1.ComposerService_GetComposition_FullMethodName: authz.Allow(identity.RoleNode, identity.RoleOperator).
			Self(authz.SelfFrom(func(r *composerv1.GetCompositionRequest) (string, error) { return nodeOfKey(r.GetKey()) })),
		composerv1.ComposerService_GetObject_FullMethodName: authz.Allow(identity.RoleNode, identity.RoleOperator).
			Self(authz.SelfFrom(func(r *composerv1.GetObjectRequest) (string, error) { return nodeOfKey(r.GetCompositionKey()) })),
		composerv1.SyncService_Sync_FullMethodName: authz.Allow(identity.RoleNode).
			Self(authz.SelfFrom(func(r *composerv1.SyncRequest) (string, error) {
				if r.GetHello() == nil {
					return "", errors.New("the first message must be a hello")
				}
				return r.GetHello().GetNode(), nil
			})),
	}
	methods := composerService.Methods()
	for i := range methods.Len() {
		full := "/" + string(composerService.FullName()) + "/" + string(methods.Get(i).Name())
		if _, ok := p[full]; !ok {
			p[full] = authz.Allow(identity.RoleOperator)
		}
	}
	return p
}

// syncServer receives the opening message, as the real one does, so that
// node:self is checked on it; then it has nothing to say.
type syncServer struct {
	composerv1.UnimplementedSyncServiceServer
}

func (syncServer) Sync(stream composerv1.SyncService_SyncServer) error {
	if _, err := stream.Recv(); err != nil {
		return err
	}
	return status.Error(codes.Unimplemented, "test sync server")
}

func startServer(t *testing.T, p *testutil.PKI, policy authz.Policy) string {
	t.Helper()
	addr, _ := testutil.StartServer(t, p, p.Identity(identity.RoleComposer, ""), policy, func(s grpc.ServiceRegistrar) {
		signerv1.RegisterSignerServiceServer(s, signerv1.UnimplementedSignerServiceServer{})
		composerv1.RegisterComposerServiceServer(s, composerv1.UnimplementedComposerServiceServer{})
		composerv1.RegisterSyncServiceServer(s, syncServer{})
	})
	return addr
}

// testExpect is what testPolicy allows, written out as a matrix test pins
// its service's policy.
func testExpect() map[string]authztest.Expectation {
	e := map[string]authztest.Expectation{
		signerv1.SignerService_SignCompositions_FullMethodName:   authztest.Allow(identity.RoleComposer),
		signerv1.SignerService_SignManifests_FullMethodName:      authztest.Allow(identity.RoleComposer),
		signerv1.SignerService_Fence_FullMethodName:              authztest.Allow(identity.RoleComposer),
		signerv1.SignerService_GetKeyset_FullMethodName:          authztest.Anyone(),
		composerv1.ComposerService_GetComposition_FullMethodName: authztest.Allow(identity.RoleNode, identity.RoleOperator).AndSelf(),
		composerv1.ComposerService_GetObject_FullMethodName:      authztest.Allow(identity.RoleNode, identity.RoleOperator).AndSelf(),
		composerv1.SyncService_Sync_FullMethodName:               authztest.Allow(identity.RoleNode).AndSelf(),
	}
	methods := composerService.Methods()
	for i := range methods.Len() {
		full := "/" + string(composerService.FullName()) + "/" + string(methods.Get(i).Name())
		if _, ok := e[full]; !ok {
			e[full] = authztest.Allow(identity.RoleOperator)
		}
	}
	return e
}

// TestMatrix runs the matrix over real generated services with
// unimplemented handlers: an allowed call reaches the handler and gets
// UNIMPLEMENTED, a denied one PERMISSION_DENIED; node:self is exercised on a
// unary method, a server stream and a bidirectional stream.
func TestMatrix(t *testing.T) {
	t.Parallel()
	p := testutil.NewPKI(t)
	policy := testPolicy()
	authztest.RunMatrix(t, authztest.Matrix{
		Target:   startServer(t, p, policy),
		PKI:      p,
		Services: []protoreflect.ServiceDescriptor{signerService, composerService, syncService},
		Policy:   policy,
		Expect:   testExpect(),
		Requests: map[string]proto.Message{
			composerv1.ComposerService_GetComposition_FullMethodName: &composerv1.GetCompositionRequest{Key: "ace.node"},
			composerv1.ComposerService_GetObject_FullMethodName:      &composerv1.GetObjectRequest{CompositionKey: "ace.web.00", Digest: "sha256:00"},
			composerv1.SyncService_Sync_FullMethodName:               &composerv1.SyncRequest{Msg: &composerv1.SyncRequest_Hello{Hello: &composerv1.Hello{Node: "ace"}}},
		},
	})
}

func TestMissing(t *testing.T) {
	t.Parallel()
	policy := testPolicy()
	delete(policy, signerv1.SignerService_Fence_FullMethodName)
	delete(policy, composerv1.SyncService_Sync_FullMethodName)
	tests := []struct {
		name     string
		services []protoreflect.ServiceDescriptor
		want     []string
	}{
		{name: "complete", services: []protoreflect.ServiceDescriptor{composerService}},
		{name: "one missing", services: []protoreflect.ServiceDescriptor{signerService}, want: []string{signerv1.SignerService_Fence_FullMethodName}},
		{name: "two services", services: []protoreflect.ServiceDescriptor{signerService, syncService},
			want: []string{signerv1.SignerService_Fence_FullMethodName, composerv1.SyncService_Sync_FullMethodName}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if got := authztest.Missing(policy, tt.services...); !slices.Equal(got, tt.want) {
				t.Fatalf("Missing() = %v, want %v", got, tt.want)
			}
		})
	}
}

// TestSyncSelfRefusalSticks shows that a stream handler which ignores the
// refusal of its opening message cannot read on.
func TestSyncSelfRefusalSticks(t *testing.T) {
	t.Parallel()
	p := testutil.NewPKI(t)
	second := make(chan error, 1)
	addr, _ := testutil.StartServer(t, p, p.Identity(identity.RoleComposer, ""), testPolicy(), func(s grpc.ServiceRegistrar) {
		signerv1.RegisterSignerServiceServer(s, signerv1.UnimplementedSignerServiceServer{})
		composerv1.RegisterComposerServiceServer(s, composerv1.UnimplementedComposerServiceServer{})
		composerv1.RegisterSyncServiceServer(s, careless{second: second})
	})
	conn := testutil.Dial(t, p, addr, p.Identity(identity.RoleNode, "bob"))
	stream, err := composerv1.NewSyncServiceClient(conn).Sync(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	hello := &composerv1.SyncRequest{Msg: &composerv1.SyncRequest_Hello{Hello: &composerv1.Hello{Node: "ace"}}}
	for range 2 {
		if err := stream.Send(hello); err != nil {
			t.Fatal(err)
		}
	}
	if err := <-second; status.Code(err) != codes.PermissionDenied {
		t.Fatalf("second Recv after a refused hello: %v, want PermissionDenied", err)
	}
	if _, err := stream.Recv(); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("client got %v, want PermissionDenied", err)
	}
}

// careless ignores the error of its first Recv.
type careless struct {
	composerv1.UnimplementedSyncServiceServer
	second chan<- error
}

func (c careless) Sync(stream composerv1.SyncService_SyncServer) error {
	_, _ = stream.Recv()
	_, err := stream.Recv()
	c.second <- err
	return err
}
