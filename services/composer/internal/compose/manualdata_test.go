package compose_test

import (
	"testing"

	composerv1 "mesh.dev/proto/mesh/composer/v1"
	typev1 "mesh.dev/proto/mesh/type/v1"
	"mesh.dev/services/composer/internal/compose"
)

// TestManualHoldsAUserListChangeOnADataPath: a change touching a data path
// is DATA, which even AUTO holds until approved. When the file changed is a
// user list, MANUAL — the stricter policy — holds it too: the user-list
// exemption does not reach a change touching data.
func TestManualHoldsAUserListChangeOnADataPath(t *testing.T) {
	comp := func(users string) *typev1.Composition {
		return &typev1.Composition{Node: "ace", Module: "svc", Fingerprint: "fp1:x", Data: true, DataPaths: []string{"/var/lib/svc"},
			Resources: []*typev1.Resource{{Id: "svc:users", Module: "svc", Type: typev1.ResourceType_RESOURCE_TYPE_FILE,
				Path: "/var/lib/svc/users", Mode: 0o600, UserList: true, Content: &typev1.Resource_Inline{Inline: []byte(users)}}}}
	}
	j := compose.Judge(comp("alice\nbob\n"), compose.Applied{Module: comp("alice\n"), ModuleDigest: "sha256:old"})
	if j.Judgement != composerv1.Judgement_JUDGEMENT_DATA {
		t.Fatalf("judged %v %q, want DATA", j.Judgement, j.Words)
	}
	auto, _ := compose.Decide(compose.Move{Module: "svc", Judged: j, Policy: compose.Policy{Policy: typev1.UpgradePolicy_UPGRADE_POLICY_AUTO}})
	manual, _ := compose.Decide(compose.Move{Module: "svc", Judged: j, Policy: compose.Policy{Policy: typev1.UpgradePolicy_UPGRADE_POLICY_MANUAL}})
	if auto {
		t.Fatal("AUTO moved a DATA change")
	}
	if manual {
		t.Errorf("MANUAL moved a DATA change without approval (user_list_only=%v, %q) that AUTO holds", j.UserListOnly, j.Words)
	}
}
