package app_test

import (
	"context"
	"testing"

	"google.golang.org/grpc/codes"

	signerv1 "mesh.dev/proto/mesh/signer/v1"
	typev1 "mesh.dev/proto/mesh/type/v1"
)

// TestOwnSymlinkTargetsStayUnderOwnPrefixes: a node's own composition may
// only write under the own prefixes, and a symlink it makes may only point
// there, whether its target is absolute, absolute with "..", or relative
// and climbing out of its directory.
func TestOwnSymlinkTargetsStayUnderOwnPrefixes(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	r := w.start(t)
	c := w.composer(t, r)
	epoch := fence(t, c)
	link := func(target string) *typev1.Composition {
		comp := nodeComposition("ace")
		comp.Resources = append(comp.Resources, &typev1.Resource{Id: "wireguard:zlink", Type: typev1.ResourceType_RESOURCE_TYPE_SYMLINK,
			Path: "/etc/wireguard/zlink", Target: target})
		return comp
	}
	for _, tc := range []struct {
		target, resolved string
	}{
		{"/root/.ssh/authorized_keys", "/root/.ssh/authorized_keys"},
		{"/etc/wireguard/../../root/.ssh", "/root/.ssh"},
		{"../../root/.ssh/authorized_keys", "/root/.ssh/authorized_keys"},
		{"../mesh-not/x", "/etc/mesh-not/x"},
		{"../../../../../../..", "/"},
	} {
		t.Run(tc.target, func(t *testing.T) {
			_, err := c.SignCompositions(context.Background(), &signerv1.SignCompositionsRequest{FencingEpoch: epoch, Compositions: []*typev1.Composition{link(tc.target)}})
			mustCode(t, err, codes.FailedPrecondition, "resources[1].target", "resolves to "+tc.resolved, "outside the own prefixes")
		})
	}
	for _, ok := range []string{"wg0.conf", "../mesh/x", "/etc/mesh/y"} {
		if _, err := c.SignCompositions(context.Background(), &signerv1.SignCompositionsRequest{FencingEpoch: epoch, Compositions: []*typev1.Composition{link(ok)}}); err != nil {
			t.Errorf("target %s: %v", ok, err)
		}
	}
}
