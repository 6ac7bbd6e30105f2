package pass

import (
	"testing"
	"time"

	composerv1 "mesh.dev/proto/mesh/composer/v1"
	typev1 "mesh.dev/proto/mesh/type/v1"
)

// A node is converged only when its engine applied every wanted
// composition and reports none FAILED or STALE: an engine whose kept
// state is unreadable, or whose manifest expired, applies nothing new and
// may correct no drift while its applied digests still equal the wanted
// ones. A module the engine holds at the wanted digest stays in effect.
func TestConvergedNeedsNoFailedOrStaleAttempt(t *testing.T) {
	now := time.Now()
	const digest, nodeDigest, manifest = "sha256:aa", "sha256:bb", "sha256:cc"
	fp := "fp1:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	asg := &composerv1.Assignment{Node: "ace", ManifestDigest: manifest, ManifestRevision: 7, Wants: []*typev1.Want{
		{Module: "motd", Fingerprint: fp, CompositionKey: "ace.motd.x", CompositionDigest: digest},
		{Module: "node", CompositionKey: "ace.node", CompositionDigest: nodeDigest}}}
	have := func(m, d, f string, state composerv1.AttemptState, code composerv1.ReasonCode) *composerv1.Have {
		return &composerv1.Have{Module: m, Applied: &composerv1.AppliedRef{Fingerprint: f, Digest: d},
			Attempt: &composerv1.Attempt{State: state, ReasonCode: code, Reason: "words"}}
	}
	for _, tc := range []struct {
		name      string
		motd      composerv1.AttemptState
		code      composerv1.ReasonCode
		converged bool
	}{
		{"applied", composerv1.AttemptState_ATTEMPT_STATE_APPLIED, 0, true},
		{"state unreadable", composerv1.AttemptState_ATTEMPT_STATE_FAILED, composerv1.ReasonCode_REASON_CODE_STATE_UNREADABLE, false},
		{"stale", composerv1.AttemptState_ATTEMPT_STATE_STALE, composerv1.ReasonCode_REASON_CODE_EXPIRED, false},
		{"held by the engine at the wanted digest", composerv1.AttemptState_ATTEMPT_STATE_HELD, composerv1.ReasonCode_REASON_CODE_NEED_UNMET, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			haves := &composerv1.HaveRecord{Node: "ace", Applied: &composerv1.ManifestRef{Revision: 7, Digest: manifest},
				Haves: []*composerv1.Have{have("motd", digest, fp, tc.motd, tc.code),
					have("node", nodeDigest, "", composerv1.AttemptState_ATTEMPT_STATE_APPLIED, 0)}}
			if st := BuildStatus("ace", asg, haves, nil, nil, now, now); st.GetConverged() != tc.converged {
				t.Errorf("converged %v, want %v: %v", st.GetConverged(), tc.converged, st)
			}
		})
	}
}
