package pass_test

import (
	"context"
	"testing"

	"mesh.dev/internal/natsx"
	composerv1 "mesh.dev/proto/mesh/composer/v1"
	ct "mesh.dev/services/composer/internal/composertest"
)

// A status key lost (purged, or a replica that lost it) is written again by
// the next pass, though the status the composer wrote last and keeps is the
// same as the one the pass builds.
func TestLostStatusWrittenAgain(t *testing.T) {
	s := newSetup(t)
	ctx := context.Background()
	st := &composerv1.NodeStatus{}
	if _, err := s.w.Get(t, natsx.BucketStatus, "ace", st); err != nil {
		t.Fatalf("status after the first pass: %v", err)
	}
	ct.Must(t, s.w.KV(t, natsx.BucketStatus).Purge(ctx, "ace"))
	if res := s.c.Pass(t, "ace"); res.Err != nil {
		t.Fatal(res.Err)
	}
	again := &composerv1.NodeStatus{}
	if _, err := s.w.Get(t, natsx.BucketStatus, "ace", again); err != nil {
		t.Fatalf("status lost, and the pass after did not write it again: %v", err)
	}
	if again.GetManifestRevision() != st.GetManifestRevision() {
		t.Fatalf("status written again says manifest revision %d, want %d", again.GetManifestRevision(), st.GetManifestRevision())
	}
}
