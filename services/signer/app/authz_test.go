package app_test

import (
	"testing"

	"google.golang.org/protobuf/reflect/protoreflect"

	"mesh.dev/internal/authz/authztest"
	"mesh.dev/internal/identity"
	signerv1 "mesh.dev/proto/mesh/signer/v1"
	"mesh.dev/services/signer/app"
)

// TestAuthorizationMatrix calls every signer RPC as every role over real
// mTLS: only the composer signs and fences; every role reads the keyset; a
// client without a certificate cannot connect.
func TestAuthorizationMatrix(t *testing.T) {
	w := newWorld(t)
	r := w.start(t)
	authztest.RunMatrix(t, authztest.Matrix{
		Target:   r.addr,
		PKI:      w.pki,
		Services: []protoreflect.ServiceDescriptor{signerv1.File_mesh_signer_v1_signer_proto.Services().ByName("SignerService")},
		Policy:   app.Policy(),
		// DESIGN.md §8: only the composer signs (and fences); the signer's
		// keyset is public to every role.
		Expect: map[string]authztest.Expectation{
			signerv1.SignerService_SignCompositions_FullMethodName: authztest.Allow(identity.RoleComposer),
			signerv1.SignerService_SignManifests_FullMethodName:    authztest.Allow(identity.RoleComposer),
			signerv1.SignerService_Fence_FullMethodName:            authztest.Allow(identity.RoleComposer),
			signerv1.SignerService_GetKeyset_FullMethodName:        authztest.Anyone(),
		},
	})
}
