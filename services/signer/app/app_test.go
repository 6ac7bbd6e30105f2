package app_test

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"mesh.dev/internal/canonical"
	"mesh.dev/internal/envelope"
	"mesh.dev/internal/identity"
	"mesh.dev/internal/keyfile"
	"mesh.dev/internal/names"
	"mesh.dev/internal/testutil"
	"mesh.dev/internal/verify"
	catalogv1 "mesh.dev/proto/mesh/catalog/v1"
	signerv1 "mesh.dev/proto/mesh/signer/v1"
	typev1 "mesh.dev/proto/mesh/type/v1"
	"mesh.dev/services/signer/app"
	"mesh.dev/services/signer/internal/audit"
)

func TestSignCompositionsReturnsVerifiableBytes(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	r := w.start(t)
	c := w.composer(t, r)
	epoch := fence(t, c)
	fp, _ := w.release("sshd")
	comps := []*typev1.Composition{moduleComposition("ace", "sshd", fp, 4096), nodeComposition("ace")}
	resp, err := c.SignCompositions(context.Background(), &signerv1.SignCompositionsRequest{FencingEpoch: epoch, Compositions: comps})
	if err != nil {
		t.Fatal(err)
	}
	ring, err := verify.Keyset(w.trust.Roots, w.trust.KeysetEnvelope)
	if err != nil {
		t.Fatal(err)
	}
	for i, item := range resp.GetItems() {
		env := item.GetEnvelope()
		if item.GetDigest() != names.Digest(env.GetPayload()) {
			t.Errorf("item %d: digest is not over the returned bytes", i)
		}
		if _, err := ring.Verify(env, typev1.PayloadType_PAYLOAD_TYPE_COMPOSITION, time.Now()); err != nil {
			t.Errorf("item %d does not verify: %v", i, err)
		}
		got := &typev1.Composition{}
		if err := canonical.Decode(env.GetPayload(), got); err != nil || !proto.Equal(got, comps[i]) {
			t.Errorf("item %d: signed bytes decode to %v, %v", i, got, err)
		}
	}
}

func TestFencing(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	r := w.start(t)
	c := w.composer(t, r)
	req := func(epoch uint64) error {
		_, err := c.SignCompositions(context.Background(), &signerv1.SignCompositionsRequest{FencingEpoch: epoch, Compositions: []*typev1.Composition{nodeComposition("ace")}})
		return err
	}
	mustCode(t, req(0), codes.FailedPrecondition, "call Fence first")
	first := fence(t, c)
	if err := req(first); err != nil {
		t.Fatal(err)
	}
	second := fence(t, c)
	if second != first+1 {
		t.Fatalf("epochs %d then %d", first, second)
	}
	// The old leader, paused while another took the lease, cannot sign.
	mustCode(t, req(first), codes.FailedPrecondition, "below the signer's")
	mustCode(t, req(second+1), codes.FailedPrecondition, "never handed out")
	_, err := c.SignManifests(context.Background(), &signerv1.SignManifestsRequest{FencingEpoch: first, Manifests: []*signerv1.ManifestItem{{Node: "ace", Wants: []*typev1.Want{nodeWant(t, "ace")}}}})
	mustCode(t, err, codes.FailedPrecondition, "below the signer's")

	// The epoch survives a restart.
	r.stop()
	r2 := w.start(t)
	c2 := w.composer(t, r2)
	_, err = c2.SignCompositions(context.Background(), &signerv1.SignCompositionsRequest{FencingEpoch: first, Compositions: []*typev1.Composition{nodeComposition("ace")}})
	mustCode(t, err, codes.FailedPrecondition, "below the signer's")
	if third := fence(t, c2); third != second+1 {
		t.Fatalf("epoch after restart %d, want %d", third, second+1)
	}
}

// auditRecords reads the audit log as records. A last line without its
// newline is a write the signer never finished (killed mid-write; audit
// verify calls it torn): not a record.
func auditRecords(t *testing.T, stateDir string) []audit.Record {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(stateDir, "audit.log"))
	if err != nil {
		t.Fatal(err)
	}
	if i := bytes.LastIndexByte(b, '\n'); i+1 < len(b) {
		b = b[:i+1]
	}
	var out []audit.Record
	for line := range bytes.Lines(b) {
		var r audit.Record
		if err := json.Unmarshal(line, &r); err != nil {
			t.Fatal(err)
		}
		out = append(out, r)
	}
	return out
}

func TestRefusedBatchSignsNothing(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	r := w.start(t)
	c := w.composer(t, r)
	epoch := fence(t, c)
	fp, _ := w.release("sshd")
	unreleased := names.FingerprintPrefix + strings.Repeat("ee", 32)

	bad := moduleComposition("ace", "sshd", fp, 100)
	bad.Resources[1].Path = "/etc/sshd/../shadow"
	wrongType := moduleComposition("ace", "sshd", fp, 100)
	wrongType.Resources[0].Type = typev1.ResourceType_RESOURCE_TYPE_FILE
	wrongType.Resources[0].Content = &typev1.Resource_Inline{Inline: []byte("x")}
	extra := moduleComposition("ace", "sshd", fp, 100)
	extra.Resources = append(extra.Resources, &typev1.Resource{Id: "sshd:zz", Module: "sshd", Type: typev1.ResourceType_RESOURCE_TYPE_FILE, Path: "/usr/local/bin/zz", Content: &typev1.Resource_Inline{}})
	missing := moduleComposition("ace", "sshd", fp, 100)
	missing.Resources = missing.Resources[:3]
	outside := nodeComposition("ace")
	outside.Resources[0].Path = "/etc/shadow"
	outsideFilled := nodeComposition("ace")
	outsideFilled.Filled = []string{"/root/.ssh/authorized_keys"}
	failFP := w.catalog.Release(sshdManifest("motd"), catalogv1.BuildState_BUILD_STATE_DONE, catalogv1.Verdict_VERDICT_FAIL)
	pendingFP := w.catalog.Release(sshdManifest("ntp"), catalogv1.BuildState_BUILD_STATE_PENDING, catalogv1.Verdict_VERDICT_PASS)
	// An entry that is not the one its fingerprint names: same resources,
	// another manifest.
	otherFP, _ := w.release("vpn")
	otherManifest := sshdManifest("vpn")
	otherManifest.Version = "9.9.9"
	w.catalog.SetManifest(otherFP, otherManifest)

	cases := []struct {
		name     string
		comp     *typev1.Composition
		code     codes.Code
		contains []string
	}{
		{"path traversal", bad, codes.InvalidArgument, []string{"compositions[1]", "resources[1].path", "not clean"}},
		{"type not the manifest's", wrongType, codes.FailedPrecondition, []string{"sshd:dir", "the manifest says"}},
		{"resource not in the manifest", extra, codes.FailedPrecondition, []string{"sshd:zz", "not in the manifest"}},
		{"resource of the manifest missing", missing, codes.FailedPrecondition, []string{"sshd:bin", "missing"}},
		{"unknown fingerprint", moduleComposition("ace", "sshd", unreleased, 100), codes.FailedPrecondition, []string{"no entry of " + unreleased}},
		{"verdict FAIL", moduleComposition("ace", "motd", failFP, 100), codes.FailedPrecondition, []string{"verdict FAIL"}},
		{"build not DONE", moduleComposition("ace", "ntp", pendingFP, 100), codes.FailedPrecondition, []string{"not DONE"}},
		{"entry not recomputing to its fingerprint", moduleComposition("ace", "vpn", otherFP, 100), codes.FailedPrecondition, []string{"entry of " + otherFP + " recomputes to"}},
		{"entry of another module", moduleComposition("ace", "motd", fp, 100), codes.FailedPrecondition, []string{"entry of module \"sshd\""}},
		{"own path outside the prefixes", outside, codes.FailedPrecondition, []string{"/etc/shadow", "outside the own prefixes"}},
		{"own filled path outside the prefixes", outsideFilled, codes.FailedPrecondition, []string{"filled[0]", "outside the own prefixes"}},
	}
	for _, tc := range cases {
		before := len(auditRecords(t, w.stateDir))
		batch := []*typev1.Composition{nodeComposition("bob"), tc.comp}
		_, err := c.SignCompositions(context.Background(), &signerv1.SignCompositionsRequest{FencingEpoch: epoch, Compositions: batch})
		t.Run(tc.name, func(t *testing.T) {
			mustCode(t, err, tc.code, tc.contains...)
			recs := auditRecords(t, w.stateDir)[before:]
			if len(recs) != 1 || recs[0].Kind != audit.KindRefused {
				t.Fatalf("audit records after a refusal: %+v, want one refused record", recs)
			}
		})
	}
	if _, err := audit.Verify(filepath.Join(w.stateDir, "audit.log")); err != nil {
		t.Fatal(err)
	}
}

func TestManifests(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	w.cfg.ManifestLifetime = 0 // the default, 24 h
	r := w.start(t)
	c := w.composer(t, r)
	epoch := fence(t, c)
	fp, parts := w.release("sshd")
	ring, _ := verify.Keyset(w.trust.Roots, w.trust.KeysetEnvelope)

	sign := func(floor uint64, wants ...*typev1.Want) (*signerv1.SignedManifest, error) {
		resp, err := c.SignManifests(context.Background(), &signerv1.SignManifestsRequest{FencingEpoch: epoch, Manifests: []*signerv1.ManifestItem{
			{Node: "ace", RevisionFloor: floor, Wants: wants, Traceparent: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"},
		}})
		if err != nil {
			return nil, err
		}
		return resp.GetManifests()[0], nil
	}
	wants := []*typev1.Want{nodeWant(t, "ace"), wantOf(t, "ace", "sshd", fp, parts, names.Digest([]byte("c")))}
	first, err := sign(0, wants...)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	if rev := first.GetRevision(); rev < uint64(now.Add(-time.Minute).UnixMilli()) {
		t.Errorf("first revision %d is below the clock", rev)
	}
	m, digest, err := ring.Manifest(first.GetItem().GetEnvelope(), "ace", now)
	if err != nil {
		t.Fatal(err)
	}
	if digest != first.GetItem().GetDigest() || m.GetRevision() != first.GetRevision() || m.GetKeysetVersion() != 1 ||
		!strings.HasPrefix(m.GetTraceparent(), "00-4bf92f") {
		t.Errorf("manifest %v digest %s", m, digest)
	}
	if life := m.GetExpiresAt().AsTime().Sub(m.GetIssuedAt().AsTime()); life != 24*time.Hour {
		t.Errorf("lifetime %s, want 24h", life)
	}
	second, err := sign(0, wants...)
	if err != nil || second.GetRevision() <= first.GetRevision() {
		t.Fatalf("second revision %d after %d (%v)", second.GetRevision(), first.GetRevision(), err)
	}
	floor := uint64(now.Add(time.Hour).UnixMilli())
	third, err := sign(floor, wants...)
	if err != nil || third.GetRevision() != floor {
		t.Fatalf("with floor %d: revision %d (%v)", floor, third.GetRevision(), err)
	}

	// Parts that are not the build's artifacts are refused.
	badParts := []*typev1.Want{nodeWant(t, "ace"), wantOf(t, "ace", "sshd", fp, []*typev1.Artifact{{Ref: "binary:sshd", Digest: names.Digest([]byte("evil")), Size: 4}}, names.Digest([]byte("c")))}
	_, err = sign(0, badParts...)
	mustCode(t, err, codes.FailedPrecondition, "parts are not the build's artifacts")
	_, err = sign(0, wantOf(t, "bob", "sshd", fp, parts, names.Digest([]byte("c"))))
	mustCode(t, err, codes.InvalidArgument, "composition_key")

	// Revisions stay monotonic across a restart, even with the clock behind.
	r.stop()
	r2 := w.start(t)
	c = w.composer(t, r2)
	epoch = fence(t, c)
	fourth, err := sign(0, wants...)
	if err != nil || fourth.GetRevision() != floor+1 {
		t.Fatalf("after restart: revision %d, want %d (%v)", fourth.GetRevision(), floor+1, err)
	}
}

func TestRefusesToStartWithoutAnActiveKey(t *testing.T) {
	t.Parallel()
	now := time.Now()
	cases := []struct {
		name   string
		keyset func(w *world) *typev1.Envelope
		want   string
	}{
		{"key retired", func(w *world) *typev1.Envelope {
			ks := proto.Clone(w.trust.Keyset).(*typev1.Keyset)
			ks.Keys[0].State = typev1.KeyState_KEY_STATE_RETIRED
			return w.trust.SignKeyset(t, ks, w.trust.RootKeys...)
		}, "is KEY_STATE_RETIRED"},
		{"key not listed", func(w *world) *typev1.Envelope {
			ks := proto.Clone(w.trust.Keyset).(*typev1.Keyset)
			ks.Keys = []*typev1.KeysetKey{testutil.KeysetKeyOf(testutil.NewKey(t), typev1.KeyState_KEY_STATE_ACTIVE, now, now.Add(time.Hour))}
			return w.trust.SignKeyset(t, ks, w.trust.RootKeys...)
		}, "is not listed"},
		{"keyset not signed by the roots", func(w *world) *typev1.Envelope {
			return w.trust.SignKeyset(t, w.trust.Keyset, testutil.NewKey(t))
		}, "keyset not trusted"},
		{"keyset expired", func(w *world) *typev1.Envelope {
			ks := proto.Clone(w.trust.Keyset).(*typev1.Keyset)
			ks.ExpiresAt = timestamppb.New(now.Add(-time.Minute))
			return w.trust.SignKeyset(t, ks, w.trust.RootKeys...)
		}, "keyset expired"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			w := newWorld(t)
			if err := keyfile.WriteJSON(w.cfg.KeysetFile, tc.keyset(w), 0o644); err != nil {
				t.Fatal(err)
			}
			_, err := app.New(context.Background(), w.cfg, app.Options{Catalog: w.catalog})
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "refusing to start") {
				t.Fatalf("New = %v, want a refusal containing %q", err, tc.want)
			}
		})
	}
}

func TestKeysetRotationIsServed(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	r := w.start(t)
	c := w.client(t, r, identity.RoleNode, "ace")
	got, err := c.GetKeyset(context.Background(), &signerv1.GetKeysetRequest{})
	if err != nil || got.GetVersion() != 1 || got.GetSigningKeyId() != envelope.KeyID(w.trust.SigningKey.Public().(ed25519.PublicKey)) {
		t.Fatalf("GetKeyset = %v, %v", got, err)
	}
	// A keyset not signed by the roots is not taken.
	ks2 := proto.Clone(w.trust.Keyset).(*typev1.Keyset)
	ks2.Version = 2
	writeLater(t, w.cfg.KeysetFile, w.trust.SignKeyset(t, ks2, testutil.NewKey(t)))
	if got, _ := c.GetKeyset(context.Background(), &signerv1.GetKeysetRequest{}); got.GetVersion() != 1 {
		t.Fatalf("an untrusted keyset was served: version %d", got.GetVersion())
	}
	// A newer keyset with a second key is.
	newKey := testutil.NewKey(t)
	ks2.Keys = append(ks2.Keys, testutil.KeysetKeyOf(newKey, typev1.KeyState_KEY_STATE_ACTIVE, time.Now(), time.Now().Add(time.Hour)))
	writeLater(t, w.cfg.KeysetFile, w.trust.SignKeyset(t, ks2, w.trust.RootKeys...))
	if got, _ := c.GetKeyset(context.Background(), &signerv1.GetKeysetRequest{}); got.GetVersion() != 2 {
		t.Fatalf("the rotated keyset was not served: version %d", got.GetVersion())
	}
}

// writeLater writes a keyset file with a modification time after the one
// before, so the reload sees a change however coarse the file system clock.
func writeLater(t *testing.T, path string, env *typev1.Envelope) {
	t.Helper()
	fi, _ := os.Stat(path)
	if err := keyfile.WriteJSON(path, env, 0o644); err != nil {
		t.Fatal(err)
	}
	later := fi.ModTime().Add(time.Second)
	os.Chtimes(path, later, later)
}

func TestSignerKeyFileMustBePrivate(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	os.Chmod(w.cfg.SigningKeyFile, 0o644)
	_, err := app.New(context.Background(), w.cfg, app.Options{Catalog: w.catalog})
	if err == nil || !strings.Contains(err.Error(), "readable by group or others") {
		t.Fatalf("New = %v", err)
	}
}
