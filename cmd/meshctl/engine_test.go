package main

import (
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	composerv1 "mesh.dev/proto/mesh/composer/v1"
	nodeenginev1 "mesh.dev/proto/mesh/nodeengine/v1"
)

// TestRenderEngineStatus: the engine's status says why it applies nothing
// when it does not, and each module's attempt with its code and words.
func TestRenderEngineStatus(t *testing.T) {
	t.Parallel()
	now := time.Now()
	st := &nodeenginev1.GetStatusResponse{
		Node: "ace", Applied: &nodeenginev1.ManifestView{Revision: 7}, Pending: &nodeenginev1.ManifestView{Revision: 9},
		HighWater: 9, KeysetVersion: 2, ConnectionError: "composer unreachable: connection refused",
		LastSync: timestamppb.New(now.Add(-time.Minute)),
		Blocked:  "kept keyset unreadable, nothing is applied until it is repaired: bad bytes",
		Haves: []*composerv1.Have{
			{Module: "motd", Applied: &composerv1.AppliedRef{Digest: "sha256:66ec029ef289aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"},
				Attempt: &composerv1.Attempt{State: composerv1.AttemptState_ATTEMPT_STATE_FAILED, ReasonCode: composerv1.ReasonCode_REASON_CODE_SPECIAL_FILE,
					Reason: "motd:motd: /etc/motd is a FIFO", Since: timestamppb.New(now.Add(-30 * time.Second))}},
		},
		Holds: []*nodeenginev1.EngineHold{{Module: "web", Code: composerv1.ReasonCode_REASON_CODE_ENTRY_ASKED, Words: "entry asked, not answered"}},
		Drift: []string{"/etc/motd"},
	}
	var out strings.Builder
	RenderEngineStatus(&out, st, now)
	got := out.String()
	for _, want := range []string{
		"node ace: applied r7, pending r9; high-water r9; keyset v2\n",
		"not connected: composer unreachable: connection refused (last sync 1m0s ago)\n",
		"BLOCKED: kept keyset unreadable, nothing is applied until it is repaired: bad bytes\n",
		"motd    sha256:66ec029ef289  FAILED   30s ago  SPECIAL_FILE: motd:motd: /etc/motd is a FIFO\n",
		"held web: ENTRY_ASKED: entry asked, not answered\n",
		"drift corrected on the last pass: /etc/motd\n",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("no %q in:\n%s", want, got)
		}
	}
}
