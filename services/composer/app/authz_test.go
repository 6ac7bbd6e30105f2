package app_test

import (
	"context"
	"errors"
	"io"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"mesh.dev/internal/authz/authztest"
	"mesh.dev/internal/identity"
	"mesh.dev/internal/lint"
	"mesh.dev/internal/names"
	composerv1 "mesh.dev/proto/mesh/composer/v1"
	typev1 "mesh.dev/proto/mesh/type/v1"
	"mesh.dev/services/composer/app"
	ct "mesh.dev/services/composer/internal/composertest"
)

// TestAuthorizationMatrix calls every ComposerService and SyncService RPC as
// every role over real mTLS (DESIGN.md §8); node:self methods are called as
// node ace naming ace (let through) and as node bob naming ace (denied).
func TestAuthorizationMatrix(t *testing.T) {
	t.Parallel()
	// DESIGN.md §8: operators change and read everything; a node reads
	// only its own compositions and objects and opens its own Sync stream.
	expect := map[string]authztest.Expectation{
		composerv1.SyncService_Sync_FullMethodName:               authztest.Allow(identity.RoleNode).AndSelf(),
		composerv1.ComposerService_GetComposition_FullMethodName: authztest.Allow(identity.RoleOperator, identity.RoleNode).AndSelf(),
		composerv1.ComposerService_GetObject_FullMethodName:      authztest.Allow(identity.RoleOperator, identity.RoleNode).AndSelf(),
	}
	methods := composerv1.File_mesh_composer_v1_composer_proto.Services().ByName("ComposerService").Methods()
	for i := range methods.Len() {
		full := "/mesh.composer.v1.ComposerService/" + string(methods.Get(i).Name())
		if _, ok := expect[full]; !ok {
			expect[full] = authztest.Allow(identity.RoleOperator)
		}
	}
	if policy := app.Policy(); len(policy) != len(expect) {
		t.Errorf("the policy has %d rules, want %d", len(policy), len(expect))
	}

	w := ct.New(t)
	c := w.StartComposer(t, "one")
	c.PutNode(t, ct.Spec(authztest.DefaultNode))
	digest := names.Digest([]byte("x"))
	authztest.RunMatrix(t, authztest.Matrix{
		Target:   c.Addr,
		PKI:      w.PKI,
		Services: []protoreflect.ServiceDescriptor{composerv1.File_mesh_composer_v1_composer_proto.Services().ByName("ComposerService"), composerv1.File_mesh_composer_v1_sync_proto.Services().ByName("SyncService")},
		Policy:   app.Policy(),
		Expect:   expect,
		Requests: map[string]proto.Message{
			composerv1.ComposerService_GetComposition_FullMethodName: &composerv1.GetCompositionRequest{Key: "ace.node"},
			composerv1.ComposerService_GetObject_FullMethodName:      &composerv1.GetObjectRequest{CompositionKey: "ace.motd." + strings.Repeat("a", 64), Digest: digest},
			composerv1.SyncService_Sync_FullMethodName:               hello(&composerv1.Hello{Node: authztest.DefaultNode, KeysetVersion: 1}),
		},
	})
}

// TestNodeReadsOnlyItsOwn covers the node:self reads of DESIGN.md §8: a node
// reads its own compositions, and an object only through a composition of
// its own that exists and names the digest; anything of another node is
// PERMISSION_DENIED.
func TestNodeReadsOnlyItsOwn(t *testing.T) {
	t.Parallel()
	w := ct.New(t)
	c := w.StartManual(t, "one")
	big := fill(lint.MaxInlineContent+1, 'o')
	for _, n := range []string{"ace", "bob"} {
		s := ct.Spec(n)
		s.Resources = []*typev1.Resource{inline("local:big", "/etc/big", big)}
		c.PutNode(t, s)
		if res := c.Pass(t, n); res.Err != nil {
			t.Fatal(res.Err)
		}
	}
	digest := names.Digest(big)
	other := names.Digest([]byte("not named"))
	ace := composerv1.NewComposerServiceClient(w.As(t, c.Addr, identity.RoleNode, "ace"))
	ctx := context.Background()
	getObject := func(key, d string) error {
		stream, err := ace.GetObject(ctx, &composerv1.GetObjectRequest{CompositionKey: key, Digest: d})
		if err != nil {
			return err
		}
		for {
			if _, err := stream.Recv(); err != nil {
				if errors.Is(err, io.EOF) {
					return nil
				}
				return err
			}
		}
	}
	cases := []struct {
		name string
		call func() error
		code codes.Code
	}{
		{"its own composition", func() error {
			_, err := ace.GetComposition(ctx, &composerv1.GetCompositionRequest{Key: "ace.node"})
			return err
		}, codes.OK},
		{"another node's composition", func() error {
			_, err := ace.GetComposition(ctx, &composerv1.GetCompositionRequest{Key: "bob.node"})
			return err
		}, codes.PermissionDenied},
		{"an object its composition names", func() error { return getObject("ace.node", digest) }, codes.OK},
		{"the same object through another node's composition", func() error { return getObject("bob.node", digest) }, codes.PermissionDenied},
		{"an object its composition does not name", func() error { return getObject("ace.node", other) }, codes.PermissionDenied},
		{"an object through a composition that does not exist", func() error {
			return getObject("ace.motd."+strings.Repeat("a", 64), digest)
		}, codes.NotFound},
		{"a key that is not a composition key", func() error {
			_, err := ace.GetComposition(ctx, &composerv1.GetCompositionRequest{Key: "ace"})
			return err
		}, codes.InvalidArgument},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.call(); status.Code(err) != tc.code {
				t.Errorf("got %v, want %s", err, tc.code)
			}
		})
	}
}
