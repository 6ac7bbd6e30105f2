package app_test

import (
	"context"
	"math"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	"mesh.dev/internal/names"
	"mesh.dev/internal/verify"
	signerv1 "mesh.dev/proto/mesh/signer/v1"
	typev1 "mesh.dev/proto/mesh/type/v1"
	"mesh.dev/services/signer/internal/audit"
)

// TestRevisionFloorFarAheadIsRefused: a revision floor the composer asks
// for is taken as a node's next revision. One far ahead of the clock (up
// to the largest there is) left the node no revision above it: it could
// take no manifest ever after, and the next request wrapped to the clock,
// a revision going back. A floor more than MaxAhead ahead is refused,
// nothing is assigned, and the node's revisions go on from the clock.
func TestRevisionFloorFarAheadIsRefused(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	r := w.start(t)
	c := w.composer(t, r)
	epoch := fence(t, c)
	sign := func(floor uint64) (uint64, error) {
		resp, err := c.SignManifests(context.Background(), &signerv1.SignManifestsRequest{FencingEpoch: epoch,
			Manifests: []*signerv1.ManifestItem{{Node: "ace", RevisionFloor: floor, Wants: []*typev1.Want{nodeWant(t, "ace")}}}})
		if err != nil {
			return 0, err
		}
		return resp.GetManifests()[0].GetRevision(), nil
	}
	first, err := sign(0)
	if err != nil {
		t.Fatal(err)
	}
	for _, floor := range []uint64{math.MaxUint64, uint64(time.Now().Add(verify.MaxAhead + time.Hour).UnixMilli())} {
		_, err := sign(floor)
		mustCode(t, err, codes.InvalidArgument, "manifests[0] (ace): revision_floor", "ahead of the signer's clock")
	}
	next, err := sign(0)
	if err != nil {
		t.Fatal(err)
	}
	if next <= first || next > uint64(time.Now().Add(time.Minute).UnixMilli()) {
		t.Fatalf("revision after the refused floors: %d (before %d); want the next one from the clock", next, first)
	}
	// A floor within MaxAhead is honoured.
	near := uint64(time.Now().Add(time.Hour).UnixMilli())
	if got, err := sign(near); err != nil || got != near {
		t.Fatalf("a floor an hour ahead: revision %d, %v; want %d", got, err, near)
	}
}

// TestKeyRetiredOrRevokedByANewKeysetSignsNothing: a newer keyset the
// roots signed that no longer lists the signer's key as ACTIVE was not
// taken (the signer kept serving the old one, where its key was ACTIVE,
// and went on signing: a RETIRED key's manifests still verify on engines).
// It is taken, served, and the signer signs nothing more.
func TestKeyRetiredOrRevokedByANewKeysetSignsNothing(t *testing.T) {
	t.Parallel()
	for _, state := range []typev1.KeyState{typev1.KeyState_KEY_STATE_RETIRED, typev1.KeyState_KEY_STATE_REVOKED} {
		t.Run(state.String(), func(t *testing.T) {
			t.Parallel()
			w := newWorld(t)
			r := w.start(t)
			c := w.composer(t, r)
			epoch := fence(t, c)
			ctx := context.Background()
			ks2 := proto.Clone(w.trust.Keyset).(*typev1.Keyset)
			ks2.Version = 2
			ks2.Keys[0].State = state
			writeLater(t, w.cfg.KeysetFile, w.trust.SignKeyset(t, ks2, w.trust.RootKeys...))
			got, err := c.GetKeyset(ctx, &signerv1.GetKeysetRequest{})
			if err != nil || got.GetVersion() != 2 {
				t.Fatalf("GetKeyset after the key was %s: version %d, %v; want 2", state, got.GetVersion(), err)
			}
			_, err = c.SignManifests(ctx, &signerv1.SignManifestsRequest{FencingEpoch: epoch,
				Manifests: []*signerv1.ManifestItem{{Node: "ace", Wants: []*typev1.Want{nodeWant(t, "ace")}}}})
			mustCode(t, err, codes.FailedPrecondition, "not ACTIVE in keyset version 2")
		})
	}
}

// TestRefusalWithTheCatalogDownIsAudited: a request the signer refuses
// because it cannot reach the catalog to check it leaves a refused record
// in the audit log, as every other refusal does, and answers UNAVAILABLE.
func TestRefusalWithTheCatalogDownIsAudited(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	r := w.start(t)
	c := w.composer(t, r)
	epoch := fence(t, c)
	fp, arts := w.release("sshd")
	w.catalog.SetDown(true)
	ctx := context.Background()
	for _, call := range []struct {
		name string
		do   func() error
	}{
		{"SignCompositions", func() error {
			_, err := c.SignCompositions(ctx, &signerv1.SignCompositionsRequest{FencingEpoch: epoch,
				Compositions: []*typev1.Composition{moduleComposition("ace", "sshd", fp, 100)}})
			return err
		}},
		{"SignManifests", func() error {
			_, err := c.SignManifests(ctx, &signerv1.SignManifestsRequest{FencingEpoch: epoch,
				Manifests: []*signerv1.ManifestItem{{Node: "ace", Wants: []*typev1.Want{wantOf(t, "ace", "sshd", fp, arts, names.Digest([]byte("x")))}}}})
			return err
		}},
	} {
		before := len(auditRecords(t, w.stateDir))
		err := call.do()
		mustCode(t, err, codes.Unavailable)
		recs := auditRecords(t, w.stateDir)[before:]
		if len(recs) != 1 || recs[0].Kind != audit.KindRefused {
			t.Errorf("%s with the catalog down: audit records %+v; want one refused record", call.name, recs)
		}
	}
}
