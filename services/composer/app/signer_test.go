package app_test

import (
	"context"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"mesh.dev/internal/identity"
	catalogv1 "mesh.dev/proto/mesh/catalog/v1"
	composerv1 "mesh.dev/proto/mesh/composer/v1"
	signerv1 "mesh.dev/proto/mesh/signer/v1"
	typev1 "mesh.dev/proto/mesh/type/v1"
	ct "mesh.dev/services/composer/internal/composertest"
)

// TestSignerCrossCheck covers DESIGN.md §5.4 end to end: the signer signs
// only what the catalog backs — a module composition of an entry with a DONE
// build, a verdict other than FAIL, the manifest's resource ids and types —
// and a node's own composition only under its own-prefixes; a pass the
// signer refuses fails and the node's status says why.
func TestSignerCrossCheck(t *testing.T) {
	t.Parallel()
	w := ct.New(t)
	c := w.StartManual(t, "one")
	motd := w.Release(t, ct.Motd("1.0"), nil)
	waitFingerprint(t, c, "motd", motd)

	t.Run("the node's own writing outside the own-prefixes", func(t *testing.T) {
		spec := ct.Spec("ace", "motd")
		spec.Resources = []*typev1.Resource{inline("local:www", "/srv/www/index.html", []byte("hi"))}
		c.PutNode(t, spec)
		res := c.Pass(t, "ace")
		if res.Err == nil || res.Committed {
			t.Fatalf("the pass went through: %v", res.Err)
		}
		resp, err := c.Operator(t).GetStatus(context.Background(), &composerv1.GetStatusRequest{Node: "ace"})
		ct.Must(t, err)
		why := resp.GetStatus().GetLastError()
		for _, want := range []string{"ace.node", "/srv/www/index.html", "local:www", "outside the own prefixes", "FailedPrecondition"} {
			if !strings.Contains(why, want) {
				t.Errorf("status says %q, not %q", why, want)
			}
		}
	})

	pending := w.Publish(t, ct.Motd("2.0"), nil, ct.PublishOptions{State: catalogv1.BuildState_BUILD_STATE_PENDING})
	failed := w.Publish(t, ct.Motd("3.0"), nil, ct.PublishOptions{Verdict: catalogv1.Verdict_VERDICT_FAIL})
	motdRes := func(id string, typ typev1.ResourceType) *typev1.Resource {
		r := &typev1.Resource{Id: id, Module: "motd", Type: typ, Path: "/etc/motd", Mode: 0o644}
		if typ == ct.File {
			r.Content = &typev1.Resource_Inline{Inline: []byte("hi")}
		}
		return r
	}
	comp := func(fp string, rs ...*typev1.Resource) *typev1.Composition {
		return &typev1.Composition{Node: "ace", Module: "motd", Fingerprint: fp, Resources: rs}
	}
	signer := signerv1.NewSignerServiceClient(w.As(t, w.SignerAddr, identity.RoleComposer, ""))
	cases := []struct {
		name string
		comp *typev1.Composition
		code codes.Code
	}{
		{"backed", comp(motd, motdRes("motd:motd", ct.File)), codes.OK},
		{"no entry of the fingerprint", comp("fp1:"+strings.Repeat("e", 64), motdRes("motd:motd", ct.File)), codes.FailedPrecondition},
		{"a build not DONE", comp(pending, motdRes("motd:motd", ct.File)), codes.FailedPrecondition},
		{"verdict FAIL", comp(failed, motdRes("motd:motd", ct.File)), codes.FailedPrecondition},
		{"a resource id the manifest does not list", comp(motd, motdRes("motd:other", ct.File)), codes.FailedPrecondition},
		{"a resource type the manifest does not say", comp(motd, motdRes("motd:motd", ct.Dir)), codes.FailedPrecondition},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := signer.SignCompositions(context.Background(), &signerv1.SignCompositionsRequest{FencingEpoch: c.Lease.Epoch(), Compositions: []*typev1.Composition{tc.comp}})
			if status.Code(err) != tc.code {
				t.Errorf("SignCompositions: %v, want %s", err, tc.code)
			}
		})
	}
}
