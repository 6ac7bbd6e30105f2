package admin_test

import (
	"testing"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"mesh.dev/internal/authz/authztest"
	"mesh.dev/internal/identity"
	"mesh.dev/internal/testutil"
	nodeenginev1 "mesh.dev/proto/mesh/nodeengine/v1"
	"mesh.dev/services/nodeengine/internal/admin"
)

type engine struct{}

func (engine) Node() string                            { return authztest.DefaultNode }
func (engine) Status() *nodeenginev1.GetStatusResponse { return &nodeenginev1.GetStatusResponse{} }
func (engine) FirstViews() *nodeenginev1.FirstViewsResponse {
	return &nodeenginev1.FirstViewsResponse{}
}
func (engine) EntryAgain(string) bool { return false }

// TestAuthorizationMatrix calls every admin RPC as every role over real
// mTLS: operators and the engine's own node only.
func TestAuthorizationMatrix(t *testing.T) {
	t.Parallel()
	p := testutil.NewPKI(t)
	policy := admin.Policy(authztest.DefaultNode)
	addr, _ := testutil.StartServer(t, p, p.Identity(identity.RoleNode, authztest.DefaultNode), policy, admin.New(engine{}, nil).Register)
	sd := nodeenginev1.File_mesh_nodeengine_v1_nodeengine_proto.Services().ByName("NodeEngineService")
	authztest.RunMatrix(t, authztest.Matrix{
		Target: addr, PKI: p, Services: []protoreflect.ServiceDescriptor{sd}, Policy: policy,
		// DESIGN.md §7: the local admin API answers operators and the
		// engine's own node, never another node or a service.
		Expect: map[string]authztest.Expectation{
			nodeenginev1.NodeEngineService_GetStatus_FullMethodName:  authztest.Allow(identity.RoleOperator, identity.RoleNode).AndSelf(),
			nodeenginev1.NodeEngineService_FirstViews_FullMethodName: authztest.Allow(identity.RoleOperator, identity.RoleNode).AndSelf(),
			nodeenginev1.NodeEngineService_EntryAgain_FullMethodName: authztest.Allow(identity.RoleOperator, identity.RoleNode).AndSelf(),
		},
		Requests: map[string]proto.Message{
			nodeenginev1.NodeEngineService_GetStatus_FullMethodName:  &nodeenginev1.GetStatusRequest{},
			nodeenginev1.NodeEngineService_FirstViews_FullMethodName: &nodeenginev1.FirstViewsRequest{},
			nodeenginev1.NodeEngineService_EntryAgain_FullMethodName: &nodeenginev1.EntryAgainRequest{Fingerprint: "fp1:" + "ab"},
		},
	})
}
