package app_test

import (
	"fmt"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"mesh.dev/internal/natsx"
	composerv1 "mesh.dev/proto/mesh/composer/v1"
	ct "mesh.dev/services/composer/internal/composertest"
)

// TestManifestRevisions covers DESIGN.md §5.4 and §6 step 4: the revision
// floor is max(held revision, engine high-water) + 1, and a manifest is
// signed again at once when an engine reports a high-water above the held
// revision or a REVISION_CONFLICT — with the same wants.
func TestManifestRevisions(t *testing.T) {
	t.Parallel()
	w := ct.New(t)
	c := w.StartComposer(t, "one")
	fp := w.Release(t, ct.Motd("1.0"), nil)
	c.PutNode(t, ct.Spec("ace", "motd"))
	a0 := w.Converged(t, "ace", map[string]string{"motd": fp})

	resigned := func(after *composerv1.Assignment, above uint64) *composerv1.Assignment {
		t.Helper()
		var a *composerv1.Assignment
		ct.WaitFor(t, "manifest signed again", 20*time.Second, func() (bool, string) {
			a, _, _ = w.Assignment(t, "ace")
			return a.GetManifestRevision() > after.GetManifestRevision(), fmt.Sprintf("revision %d", a.GetManifestRevision())
		})
		if a.GetManifestRevision() <= above {
			t.Errorf("revision %d is not above %d", a.GetManifestRevision(), above)
		}
		if !proto.Equal(&composerv1.Assignment{Wants: a.GetWants()}, &composerv1.Assignment{Wants: after.GetWants()}) {
			t.Errorf("wants changed: %v → %v", after.GetWants(), a.GetWants())
		}
		if _, err := w.CheckAssignment(t, a); err != nil {
			t.Error(err)
		}
		return a
	}

	// An engine reports a high-water far above the held revision (say a
	// signer restored from an old backup, and a clock an hour ahead when
	// it signed): the next manifest is above it. (A floor more than 24 h
	// ahead of the signer's clock is refused: no engine took a revision
	// issued so far ahead.)
	high := max(a0.GetManifestRevision(), uint64(time.Now().UnixMilli())) + uint64(time.Hour.Milliseconds())
	w.Put(t, natsx.BucketHaves, "ace", &composerv1.HaveRecord{Node: "ace", ReportSeq: 1, HighWater: high,
		Applied: &composerv1.ManifestRef{Revision: a0.GetManifestRevision(), Digest: a0.GetManifestDigest()}})
	a1 := resigned(a0, high)

	// The engine refuses a manifest with REVISION_CONFLICT.
	w.Put(t, natsx.BucketHaves, "ace", &composerv1.HaveRecord{Node: "ace", ReportSeq: 2, HighWater: a1.GetManifestRevision(),
		Applied: &composerv1.ManifestRef{Revision: a0.GetManifestRevision(), Digest: a0.GetManifestDigest()},
		Haves: []*composerv1.Have{{Module: "motd", Attempt: &composerv1.Attempt{State: composerv1.AttemptState_ATTEMPT_STATE_FAILED,
			ReasonCode: composerv1.ReasonCode_REASON_CODE_REVISION_CONFLICT, Reason: "revision below the high-water"}}}})
	resigned(a1, a1.GetManifestRevision())
}
