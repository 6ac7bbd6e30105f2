package badinput

import (
	"context"
	"fmt"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"mesh.dev/internal/identity"
	"mesh.dev/internal/names"
	composerv1 "mesh.dev/proto/mesh/composer/v1"
	typev1 "mesh.dev/proto/mesh/type/v1"
	"mesh.dev/tests/internal/rig"
)

// TestComposerRefusesWhatItCannotKeep guards bad input the composer once
// took (or failed on) instead of refusing it as DESIGN.md §8 says ("Bad
// input gets INVALID_ARGUMENT naming the field; limits are explicit
// constants; a refused write changes nothing"):
//
//   - PutNode refuses spec.policies with an upgrade policy no version
//     defines, and a why over its limit;
//   - Approve refuses more digests than its limit (20000 of them would make
//     a record over the 1 MiB KV limit).
func TestComposerRefusesWhatItCannotKeep(t *testing.T) {
	t.Parallel()
	m := rig.Start(t, rig.Options{})
	c := composerv1.NewComposerServiceClient(m.Dial(t, m.ComposerAddr, identity.RoleOperator, "admin"))
	state := composerState(m.JS)
	for _, v := range badEnums {
		t.Run(fmt.Sprintf("unknown policy %d", v), func(t *testing.T) {
			before := state(t)
			_, err := c.PutNode(context.Background(), &composerv1.PutNodeRequest{Spec: &composerv1.NodeSpec{Node: "ace",
				Policies: map[string]*typev1.Policy{"web": {Policy: typev1.UpgradePolicy(v), Why: "because"}}}})
			if status.Code(err) != codes.InvalidArgument || !containsAll(status.Convert(err).Message(), []string{"spec.policies[web].policy"}) {
				t.Errorf("PutNode with policy %d: %v, want INVALID_ARGUMENT naming spec.policies[web].policy", v, err)
			}
			if after := state(t); after != before {
				t.Errorf("the spec was stored: %s -> %s", before, after)
			}
		})
	}
	t.Run("20000 approval digests", func(t *testing.T) {
		var ds []string
		for i := 0; i < 20000; i++ {
			ds = append(ds, names.Digest([]byte(fmt.Sprint(i))))
		}
		before := state(t)
		_, err := c.Approve(context.Background(), &composerv1.ApproveRequest{Module: "web", Digests: ds})
		if status.Code(err) != codes.InvalidArgument || !containsAll(status.Convert(err).Message(), []string{"digests"}) {
			t.Errorf("Approve of 20000 digests: %v, want INVALID_ARGUMENT naming digests and their limit", err)
		}
		if after := state(t); after != before {
			t.Errorf("state changed: %s -> %s", before, after)
		}
	})
}
