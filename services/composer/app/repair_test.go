package app_test

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"mesh.dev/internal/envelope"
	"mesh.dev/internal/identity"
	"mesh.dev/internal/names"
	"mesh.dev/internal/natsx"
	composerv1 "mesh.dev/proto/mesh/composer/v1"
	ct "mesh.dev/services/composer/internal/composertest"
)

// raw returns the stored bytes of a key.
func raw(t testing.TB, w *ct.World, bucket, key string) []byte {
	t.Helper()
	e, err := w.KV(t, bucket).Get(context.Background(), key)
	ct.Must(t, err)
	return bytes.Clone(e.Value)
}

// putRaw writes bytes straight into a key, no CAS: what someone who can
// write to NATS and holds no key can do.
func putRaw(t testing.TB, w *ct.World, bucket, key string, b []byte) uint64 {
	t.Helper()
	rev, err := w.KV(t, bucket).Put(context.Background(), key, b)
	ct.Must(t, err)
	return rev
}

// repaired waits until a node's assignment wants fps above revision floor
// and every composition it names is held and verifies.
func repaired(t testing.TB, w *ct.World, node string, fps map[string]string, floor uint64) *composerv1.Assignment {
	t.Helper()
	var a *composerv1.Assignment
	ct.WaitFor(t, node+" repaired", 30*time.Second, func() (bool, string) {
		var err error
		if a, _, err = w.Assignment(t, node); err != nil {
			return false, err.Error()
		}
		for m, fp := range fps {
			if ct.Want(a, m).GetFingerprint() != fp {
				return false, fmt.Sprintf("wants %s at %s, not %s", m, ct.Want(a, m).GetFingerprint(), fp)
			}
		}
		if a.GetManifestRevision() <= floor {
			return false, fmt.Sprintf("manifest revision %d, not above %d", a.GetManifestRevision(), floor)
		}
		if _, err := w.CheckAssignment(t, a); err != nil {
			return false, err.Error()
		}
		return true, ""
	})
	return a
}

// TestReplayedAssignmentAndComposition: an old signed assignment is written
// straight into a node's key of bucket assignments, and an old signed
// composition into the key its current manifest names. Both verify; the
// composer, which did not write them, recomposes the node: the assignment
// wants the current release again, at a manifest revision above the
// replayed and the current one, and the key holds the composition its
// want names.
func TestReplayedAssignmentAndComposition(t *testing.T) {
	t.Parallel()
	w := ct.New(t)
	c := w.StartComposer(t, "one")
	motd1 := w.Release(t, ct.Motd("1.0"), nil)
	c.PutNode(t, ct.Spec("a", "motd"))
	old := w.Converged(t, "a", map[string]string{"motd": motd1})
	oldAssignment := raw(t, w, natsx.BucketAssignments, "a")
	oldComposition := raw(t, w, natsx.BucketCompositions, ct.Want(old, "motd").GetCompositionKey())
	motd2 := w.Release(t, ct.Motd("2.0"), nil)
	cur := w.Converged(t, "a", map[string]string{"motd": motd2})

	putRaw(t, w, natsx.BucketCompositions, ct.Want(cur, "motd").GetCompositionKey(), oldComposition)
	putRaw(t, w, natsx.BucketAssignments, "a", oldAssignment)
	a := repaired(t, w, "a", map[string]string{"motd": motd2}, cur.GetManifestRevision())
	if got := ct.Want(a, "motd").GetCompositionDigest(); got != ct.Want(cur, "motd").GetCompositionDigest() {
		t.Errorf("the repaired want names digest %s, the current one was %s", got, ct.Want(cur, "motd").GetCompositionDigest())
	}
}

// TestCorruptCompositionRewritten: bytes that do not decode are written
// straight into the key of a wanted composition. A node reading it gets
// DATA_LOSS saying so (not INTERNAL), and the composer writes the
// composition again by CAS at that revision (DESIGN.md §5.2 step 2); once
// an engine reports it refused it, the composer signs the manifest again,
// once, so that the engine tries again at once.
func TestCorruptCompositionRewritten(t *testing.T) {
	t.Parallel()
	w := ct.New(t)
	c := w.StartComposer(t, "one")
	motd := w.Release(t, ct.Motd("1.0"), nil)
	c.PutNode(t, ct.Spec("a", "motd"))
	a := w.Converged(t, "a", map[string]string{"motd": motd})
	key := ct.Want(a, "motd").GetCompositionKey()
	putRaw(t, w, natsx.BucketCompositions, key, bytes.Repeat([]byte{0xff, 0x00, 0x13}, 100))

	node := composerv1.NewComposerServiceClient(w.As(t, c.Addr, identity.RoleNode, "a"))
	_, err := node.GetComposition(context.Background(), &composerv1.GetCompositionRequest{Key: key})
	if st, _ := status.FromError(err); st.Code() != codes.DataLoss || !strings.Contains(st.Message(), "does not decode") {
		t.Errorf("GetComposition of a key holding bad bytes: %v; want DATA_LOSS saying it does not decode", err)
	}
	// Written again, the manifest as it was: no engine refused it yet.
	repaired(t, w, "a", map[string]string{"motd": motd}, 0)
	if _, err := node.GetComposition(context.Background(), &composerv1.GetCompositionRequest{Key: key}); err != nil {
		t.Errorf("GetComposition after the repair: %v", err)
	}
	settled(t, w, c)
	if got, _, _ := w.Assignment(t, "a"); got.GetManifestRevision() != a.GetManifestRevision() {
		t.Errorf("the repair signed the manifest again (r%d → r%d) with no refusal reported", a.GetManifestRevision(), got.GetManifestRevision())
	}

	// An engine that read it before the repair reports its fetch failed:
	// the manifest is signed again so that it tries again at once, and
	// only once.
	w.Put(t, natsx.BucketHaves, "a", failedHaves(a, "motd", composerv1.ReasonCode_REASON_CODE_FETCH_FAILED))
	again := repaired(t, w, "a", map[string]string{"motd": motd}, a.GetManifestRevision())
	w.Put(t, natsx.BucketHaves, "a", failedHaves(again, "motd", composerv1.ReasonCode_REASON_CODE_FETCH_FAILED))
	settled(t, w, c)
	if got, _, _ := w.Assignment(t, "a"); got.GetManifestRevision() != again.GetManifestRevision() {
		t.Errorf("a refusal of the manifest signed after the repair signed it again (r%d → r%d)", again.GetManifestRevision(), got.GetManifestRevision())
	}
}

// failedHaves is an engine's report that it applied a's manifest but for
// module, whose attempt failed with code.
func failedHaves(a *composerv1.Assignment, module string, code composerv1.ReasonCode) *composerv1.HaveRecord {
	rec := &composerv1.HaveRecord{Node: a.GetNode(), ReportSeq: uint64(time.Now().UnixNano()),
		Applied: &composerv1.ManifestRef{Revision: a.GetManifestRevision(), Digest: a.GetManifestDigest()}, HighWater: a.GetManifestRevision()}
	for _, want := range a.GetWants() {
		hv := &composerv1.Have{Module: want.GetModule(),
			Applied: &composerv1.AppliedRef{Fingerprint: want.GetFingerprint(), Key: want.GetCompositionKey(), Digest: want.GetCompositionDigest()},
			Attempt: &composerv1.Attempt{Fingerprint: want.GetFingerprint(), Key: want.GetCompositionKey(), Digest: want.GetCompositionDigest(),
				State: composerv1.AttemptState_ATTEMPT_STATE_APPLIED}}
		if want.GetModule() == module {
			hv.Applied = nil
			hv.Attempt.State, hv.Attempt.ReasonCode, hv.Attempt.Reason = composerv1.AttemptState_ATTEMPT_STATE_FAILED, code, "refused by a test"
		}
		rec.Haves = append(rec.Haves, hv)
	}
	return rec
}

// TestGetCompositionByDigest: a node asking for a composition by the digest
// its manifest names is answered with those very bytes from the memory of
// the composer that wrote them, even once the bucket holds bad bytes (which
// a read without the digest reports as DATA_LOSS); asked with another
// digest, the composer reads the bucket.
func TestGetCompositionByDigest(t *testing.T) {
	t.Parallel()
	w := ct.New(t)
	c := w.StartComposer(t, "one")
	motd := w.Release(t, ct.Motd("1.0"), nil)
	c.PutNode(t, ct.Spec("a", "motd"))
	a := w.Converged(t, "a", map[string]string{"motd": motd})
	want := ct.Want(a, "motd")
	node := composerv1.NewComposerServiceClient(w.As(t, c.Addr, identity.RoleNode, "a"))
	ctx := context.Background()
	putRaw(t, w, natsx.BucketCompositions, want.GetCompositionKey(), bytes.Repeat([]byte{0xff, 0x00, 0x13}, 100))

	resp, err := node.GetComposition(ctx, &composerv1.GetCompositionRequest{Key: want.GetCompositionKey(), Digest: want.GetCompositionDigest()})
	if err != nil {
		t.Fatalf("GetComposition by digest: %v", err)
	}
	if got := envelope.Digest(resp.GetComposition()); got != want.GetCompositionDigest() || resp.GetDigest() != got {
		t.Errorf("answered digest %s (said %s), want %s", got, resp.GetDigest(), want.GetCompositionDigest())
	}
	other := names.Digest([]byte("another composition"))
	for _, digest := range []string{"", other} {
		_, err := node.GetComposition(ctx, &composerv1.GetCompositionRequest{Key: want.GetCompositionKey(), Digest: digest})
		if st, _ := status.FromError(err); st.Code() != codes.DataLoss {
			t.Errorf("GetComposition with digest %q of a key holding bad bytes: %v; want DATA_LOSS", digest, err)
		}
	}
	_, err = node.GetComposition(ctx, &composerv1.GetCompositionRequest{Key: want.GetCompositionKey(), Digest: "sha256:nothex"})
	if st, _ := status.FromError(err); st.Code() != codes.InvalidArgument || !strings.Contains(st.Message(), "digest") {
		t.Errorf("GetComposition with a malformed digest: %v; want INVALID_ARGUMENT naming digest", err)
	}
}
