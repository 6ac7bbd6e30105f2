package pass_test

import (
	"strings"
	"testing"

	"mesh.dev/internal/natsx"
	composerv1 "mesh.dev/proto/mesh/composer/v1"
)

// DESIGN.md §6 step 4: when the engine's applied revision or high-water
// exceeds the held manifest's, the lease holder re-signs with floor = that
// + 1 — the applied revision too, not only high_water (an engine whose
// kept high-water was reset).
func TestAppliedRevisionAboveHeldResigns(t *testing.T) {
	t.Parallel()
	s := newSetup(t)
	a1, _, err := s.w.Assignment(t, "ace")
	if err != nil {
		t.Fatal(err)
	}
	above := a1.GetManifestRevision() + 1000
	s.w.Put(t, natsx.BucketHaves, "ace", &composerv1.HaveRecord{Node: "ace", ReportSeq: 5,
		Applied: &composerv1.ManifestRef{Revision: above, Digest: "sha256:" + strings.Repeat("a", 64)}})
	res := s.c.Pass(t, "ace")
	a2, _, err := s.w.Assignment(t, "ace")
	if err != nil {
		t.Fatal(err)
	}
	if a2.GetManifestRevision() <= above {
		t.Errorf("engine reported applied r%d above the held r%d; after the pass (committed %v, err %v) the held manifest is r%d: the engine is never sent a manifest (Sync holds back revisions below what it reported)",
			above, a1.GetManifestRevision(), res.Committed, res.Err, a2.GetManifestRevision())
	}
}
