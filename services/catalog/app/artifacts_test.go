package app_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	"mesh.dev/internal/config"
	"mesh.dev/internal/identity"
	"mesh.dev/internal/lint"
	"mesh.dev/internal/names"
	catalogv1 "mesh.dev/proto/mesh/catalog/v1"
	typev1 "mesh.dev/proto/mesh/type/v1"
)

func randomBytes(t testing.TB, n int) []byte {
	t.Helper()
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return b
}

// download reads an artifact from offset and returns its bytes and the size
// the first message announced.
func download(t testing.TB, c catalogv1.CatalogServiceClient, digest string, offset int64) ([]byte, int64, error) {
	t.Helper()
	stream, err := c.DownloadArtifact(context.Background(), &catalogv1.DownloadArtifactRequest{Digest: digest, Offset: offset})
	if err != nil {
		return nil, 0, err
	}
	var out []byte
	size := int64(-1)
	for {
		m, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return out, size, nil
		}
		if err != nil {
			return nil, 0, err
		}
		if size < 0 {
			size = m.GetSize()
		}
		if m.GetOffset() != offset+int64(len(out)) {
			t.Fatalf("chunk at %d, want %d", m.GetOffset(), offset+int64(len(out)))
		}
		out = append(out, m.GetChunk()...)
	}
}

// heldNothing checks that the artifacts store holds no object under digest
// and no chunk of any unfinished upload.
func heldNothing(t testing.TB, r *running, digest string) {
	t.Helper()
	eventually(t, "the aborted upload's chunks are purged", func() (bool, error) {
		n, err := r.catalog.Store.ChunkSubjects(context.Background())
		return n == 0, err
	})
	if _, held, err := r.catalog.Store.ArtifactHeld(context.Background(), digest); err != nil || held {
		t.Fatalf("artifact %s held after a refused upload (%v)", digest, err)
	}
	if _, err := r.catalog.Store.Artifacts().GetInfo(context.Background(), digest, jetstream.GetObjectInfoShowDeleted()); !errors.Is(err, jetstream.ErrObjectNotFound) {
		t.Fatalf("object %s has metadata after a refused upload: %v", digest, err)
	}
}

func TestUploadAndDownload(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	r := w.start(t)
	c := w.builder(t, r)
	content := randomBytes(t, 700<<10+123)
	art := upload(t, c, "binary:x", content)

	// Every role downloads; offsets resume.
	for _, id := range []struct {
		role identity.Role
		name string
	}{{identity.RoleNode, "ace"}, {identity.RoleComposer, ""}, {identity.RoleOperator, "admin"}, {identity.RoleSigner, ""}} {
		role := id.role
		reader := w.client(t, r, id.role, id.name)
		got, size, err := download(t, reader, art.GetDigest(), 0)
		if err != nil || !bytes.Equal(got, content) || size != int64(len(content)) {
			t.Fatalf("%s download: %d bytes, size %d, %v", role, len(got), size, err)
		}
	}
	for _, off := range []int64{1, 256 << 10, int64(len(content)) - 1, int64(len(content))} {
		got, size, err := download(t, c, art.GetDigest(), off)
		if err != nil || !bytes.Equal(got, content[off:]) || size != int64(len(content)) {
			t.Fatalf("download from %d: %d bytes, size %d, %v", off, len(got), size, err)
		}
	}
	_, _, err := download(t, c, art.GetDigest(), int64(len(content))+1)
	mustCode(t, err, codes.InvalidArgument, "offset 716924 is beyond the artifact's size 716923")
	_, _, err = download(t, c, art.GetDigest(), -1)
	mustCode(t, err, codes.InvalidArgument, "offset -1 is negative")
	missing := names.Digest([]byte("missing"))
	_, _, err = download(t, c, missing, 0)
	mustCode(t, err, codes.NotFound, "no artifact "+missing)
	_, _, err = download(t, c, "sha256:xyz", 0)
	mustCode(t, err, codes.InvalidArgument, `digest "sha256:xyz" is not a digest`)

	// The same artifact again is answered after the header: nothing is
	// sent twice and nothing is stored again.
	stream, err := c.UploadArtifact(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	send(t, stream, header(art.GetDigest(), art.GetSize()))
	resp, err := stream.CloseAndRecv()
	if err != nil || resp.GetCreated() || resp.GetDigest() != art.GetDigest() {
		t.Fatalf("dedupe: %v, %v", resp, err)
	}

	// A held digest with another size is refused after the header.
	stream, err = c.UploadArtifact(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	send(t, stream, header(art.GetDigest(), art.GetSize()+1))
	_, err = stream.CloseAndRecv()
	mustCode(t, err, codes.InvalidArgument, "header.size 716924 is not the size of artifact "+art.GetDigest()+", which is held (716923 bytes)")

	// An empty artifact is an artifact.
	empty := upload(t, c, "binary:empty", nil)
	got, size, err := download(t, c, empty.GetDigest(), 0)
	if err != nil || len(got) != 0 || size != 0 {
		t.Fatalf("empty: %v %d %v", got, size, err)
	}
}

// TestUploadRefusesMismatches checks each way an upload can disagree with
// its header: it is refused naming why, and nothing is stored.
func TestUploadRefusesMismatches(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	r := w.start(t)
	c := w.builder(t, r)
	content := randomBytes(t, 300<<10)
	digest := names.Digest(content)
	cases := []struct {
		name   string
		digest string
		msgs   []*catalogv1.UploadArtifactRequest
		code   codes.Code
		msg    string
	}{
		{"no header", digest, []*catalogv1.UploadArtifactRequest{chunk(content)}, codes.InvalidArgument, "header: the first message must carry the header"},
		{"nothing at all", digest, nil, codes.InvalidArgument, "header: the stream ended before the header"},
		{"bad digest", "sha256:12", []*catalogv1.UploadArtifactRequest{header("sha256:12", 3)}, codes.InvalidArgument, `header.digest "sha256:12" is not a digest`},
		{"negative size", digest, []*catalogv1.UploadArtifactRequest{header(digest, -1)}, codes.InvalidArgument, "header.size -1 is outside 0..1073741824"},
		{"over the size limit", digest, []*catalogv1.UploadArtifactRequest{header(digest, 1<<30+1)}, codes.InvalidArgument, "header.size 1073741825 is outside"},
		{"other bytes", digest, []*catalogv1.UploadArtifactRequest{header(digest, int64(len(content))), chunk(randomBytes(t, len(content)))},
			codes.InvalidArgument, "artifact does not match its header: received bytes of digest sha256:"},
		{"fewer bytes", digest, []*catalogv1.UploadArtifactRequest{header(digest, int64(len(content))), chunk(content[:1000])},
			codes.InvalidArgument, "received 1000 bytes, 307200 declared"},
		{"more bytes", digest, []*catalogv1.UploadArtifactRequest{header(digest, int64(len(content))), chunk(content), chunk([]byte("x"))},
			codes.InvalidArgument, "chunk: more bytes than the 307200 declared; nothing was stored"},
		{"a second header", digest, []*catalogv1.UploadArtifactRequest{header(digest, int64(len(content))), chunk(content[:10]), header(digest, 1)},
			codes.InvalidArgument, "header: a second header after 10 bytes"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			stream, err := c.UploadArtifact(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			for _, m := range tc.msgs {
				if err := stream.Send(m); err != nil {
					break // the catalog refused already; CloseAndRecv says why
				}
			}
			_, err = stream.CloseAndRecv()
			mustCode(t, err, tc.code, tc.msg)
			if names.ValidDigest(tc.digest) {
				heldNothing(t, r, tc.digest)
			}
		})
	}
}

// TestUploadInterruptedLeavesNothing cancels an upload midway: the object
// store must hold nothing under its digest and no chunk of it.
func TestUploadInterruptedLeavesNothing(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	r := w.start(t)
	c := w.builder(t, r)
	content := randomBytes(t, 3<<20)
	digest := names.Digest(content)

	ctx, cancel := context.WithCancel(context.Background())
	stream, err := c.UploadArtifact(ctx)
	if err != nil {
		t.Fatal(err)
	}
	send(t, stream, header(digest, int64(len(content))))
	half := len(content) / 2
	for off := 0; off < half; off += 64 << 10 {
		send(t, stream, chunk(content[off:off+64<<10]))
	}
	// Wait until the first half reached the object store as chunks, so the
	// cancel interrupts a put in progress rather than one not begun.
	eventually(t, "chunks of the upload in the store", func() (bool, error) {
		n, err := r.catalog.Store.ChunkSubjects(context.Background())
		return n == 1, err
	})
	cancel()
	if _, err := stream.CloseAndRecv(); codeOf(err) != codes.Canceled {
		t.Fatalf("cancelled upload: %v", err)
	}
	heldNothing(t, r, digest)

	// The artifact uploads afterwards as if nothing happened.
	upload(t, c, "binary:x", content)
	got, _, err := download(t, c, digest, 0)
	if err != nil || !bytes.Equal(got, content) {
		t.Fatalf("download after the interrupted upload: %d bytes, %v", len(got), err)
	}
}

// TestUploadStalledIsAbandoned checks that an upload sending nothing for the
// idle timeout ends and leaves nothing.
func TestUploadStalledIsAbandoned(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	w.cfg.UploadIdleTimeout = config.Duration(time.Second)
	r := w.start(t)
	c := w.builder(t, r)
	content := randomBytes(t, 1<<20)
	digest := names.Digest(content)
	stream, err := c.UploadArtifact(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	send(t, stream, header(digest, int64(len(content))))
	send(t, stream, chunk(content[:300<<10]))
	// Send nothing more: the catalog ends the stream, and a receive
	// returns its status.
	err = stream.RecvMsg(&catalogv1.UploadArtifactResponse{})
	mustCode(t, err, codes.DeadlineExceeded, "no chunk for 1s after 307200 of 1048576 bytes: upload abandoned; nothing was stored")
	heldNothing(t, r, digest)
}

// TestSweepOrphanChunks stands in for a catalog that died mid-upload: chunks
// with no object are purged, chunks of held objects are kept.
func TestSweepOrphanChunks(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	r := w.start(t)
	c := w.builder(t, r)
	content := randomBytes(t, 200<<10)
	art := upload(t, c, "binary:x", content)
	if _, err := w.js.Publish(context.Background(), "$O.artifacts.C.orphanNUID", []byte("half an upload")); err != nil {
		t.Fatal(err)
	}
	store := r.catalog.Store
	if n, err := store.SweepOrphanChunks(context.Background(), time.Hour); err != nil || n != 0 {
		t.Fatalf("sweep of young chunks: %d, %v", n, err)
	}
	n, err := store.SweepOrphanChunks(context.Background(), 0)
	if err != nil || n != 1 {
		t.Fatalf("sweep: %d, %v", n, err)
	}
	if n, err := store.ChunkSubjects(context.Background()); err != nil || n != 1 {
		t.Fatalf("chunk subjects after the sweep: %d, %v", n, err)
	}
	got, _, err := download(t, c, art.GetDigest(), 0)
	if err != nil || !bytes.Equal(got, content) {
		t.Fatalf("held artifact after the sweep: %v", err)
	}
}

func TestBuilds(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	r := w.start(t)
	c := w.builder(t, r)
	ctx := context.Background()
	e := putEntry(t, c, "sshd", "1.0")
	fp := e.GetFingerprint()
	content := []byte("#!/bin/sh\necho sshd\n")
	art := &typev1.Artifact{Ref: "binary:sshd", Digest: names.Digest(content), Size: int64(len(content))}
	put := func(b *catalogv1.Build) (*catalogv1.Build, error) {
		resp, err := c.PutBuild(ctx, &catalogv1.PutBuildRequest{Build: b})
		return resp.GetBuild(), err
	}
	done := func(arts ...*typev1.Artifact) *catalogv1.Build {
		return &catalogv1.Build{Fingerprint: fp, State: catalogv1.BuildState_BUILD_STATE_DONE, Artifacts: arts}
	}

	var tooMany []*typev1.Artifact
	for i := range lint.MaxParts + 1 {
		tooMany = append(tooMany, &typev1.Artifact{Ref: fmt.Sprintf("binary:t%03d", i), Digest: art.Digest, Size: art.Size})
	}
	unknown := names.FingerprintPrefix + "00" + fp[6:]
	cases := []struct {
		name  string
		build *catalogv1.Build
		code  codes.Code
		msg   string
	}{
		{"no build", nil, codes.InvalidArgument, "build is required"},
		{"bad fingerprint", &catalogv1.Build{Fingerprint: "x", State: catalogv1.BuildState_BUILD_STATE_PENDING}, codes.InvalidArgument, `build.fingerprint "x" is not a fingerprint`},
		{"no state", &catalogv1.Build{Fingerprint: fp}, codes.InvalidArgument, "build.state: BUILD_STATE_UNSPECIFIED is not PENDING, DONE or FAILED"},
		{"failed without a reason", &catalogv1.Build{Fingerprint: fp, State: catalogv1.BuildState_BUILD_STATE_FAILED}, codes.InvalidArgument, "build.reason: a FAILED build needs a reason"},
		{"reason too long", &catalogv1.Build{Fingerprint: fp, State: catalogv1.BuildState_BUILD_STATE_FAILED, Reason: strings.Repeat("r", lint.MaxReasonLen+1)},
			codes.InvalidArgument, "build.reason: is 4097 bytes, over the limit of 4096"},
		{"reason with a control character", &catalogv1.Build{Fingerprint: fp, State: catalogv1.BuildState_BUILD_STATE_FAILED, Reason: "cc\x00 crashed"},
			codes.InvalidArgument, "build.reason: holds the control character U+0000"},
		{"too many artifacts", done(tooMany...), codes.InvalidArgument, "build.artifacts: 65 artifacts, over the limit of 64"},
		{"bad artifact digest", done(&typev1.Artifact{Ref: "binary:sshd", Digest: "sha256:1"}), codes.InvalidArgument, `build.artifacts[0].digest "sha256:1" is not a digest`},
		{"unsorted artifacts", done(&typev1.Artifact{Ref: "binary:z", Digest: art.Digest}, &typev1.Artifact{Ref: "binary:a", Digest: art.Digest}), codes.InvalidArgument, "build.artifacts[1].ref"},
		{"no entry", &catalogv1.Build{Fingerprint: unknown, State: catalogv1.BuildState_BUILD_STATE_PENDING}, codes.NotFound, "no entry of fingerprint " + unknown},
		{"artifact the entry does not declare", done(&typev1.Artifact{Ref: "binary:other", Digest: art.Digest, Size: art.Size}), codes.FailedPrecondition,
			`build.artifacts[0].ref "binary:other" is not an artifact of entry ` + fp + " (it declares binary:sshd)"},
		{"DONE without its artifacts", done(), codes.FailedPrecondition, "a DONE build of " + fp + " needs every artifact its entry declares; missing binary:sshd"},
		{"DONE while the artifact is not held", done(art), codes.FailedPrecondition,
			"build.artifacts[0] (binary:sshd): " + art.Digest + " is not held in the object store artifacts; upload it first"},
	}
	for _, tc := range cases {
		_, err := put(tc.build)
		mustCode(t, err, tc.code, tc.msg)
	}
	if _, err := c.GetBuild(ctx, &catalogv1.GetBuildRequest{Fingerprint: fp}); codeOf(err) != codes.NotFound {
		t.Fatalf("a refused build was recorded: %v", err)
	}

	// PENDING and FAILED are recorded and may change.
	pending, err := put(&catalogv1.Build{Fingerprint: fp, State: catalogv1.BuildState_BUILD_STATE_PENDING, Reason: "building"})
	if err != nil || pending.GetRecordedBy() != "builder/ci" || pending.GetUpdatedAt() == nil {
		t.Fatalf("pending: %v, %v", pending, err)
	}
	if _, err := put(&catalogv1.Build{Fingerprint: fp, State: catalogv1.BuildState_BUILD_STATE_FAILED, Reason: "compiler crashed"}); err != nil {
		t.Fatal(err)
	}

	upload(t, c, art.GetRef(), content)
	wrongSize := proto.Clone(art).(*typev1.Artifact)
	wrongSize.Size++
	_, err = put(done(wrongSize))
	mustCode(t, err, codes.FailedPrecondition, "build.artifacts[0].size (binary:sshd): 21, but the held artifact "+art.Digest+" is 20 bytes")

	b, err := put(done(art))
	if err != nil {
		t.Fatal(err)
	}
	got, err := w.client(t, r, "signer", "").GetBuild(ctx, &catalogv1.GetBuildRequest{Fingerprint: fp})
	if err != nil || !proto.Equal(got.GetBuild(), b) {
		t.Fatalf("GetBuild: %v, %v", got, err)
	}
	// DONE is immutable: the same again is a no-op, anything else refused.
	again, err := put(done(art))
	if err != nil || !proto.Equal(again, b) {
		t.Fatalf("DONE again: %v, %v", again, err)
	}
	_, err = put(&catalogv1.Build{Fingerprint: fp, State: catalogv1.BuildState_BUILD_STATE_FAILED, Reason: "late failure"})
	mustCode(t, err, codes.AlreadyExists, "the build of "+fp+" is DONE and immutable (recorded by builder/ci)")
	got, err = c.GetBuild(ctx, &catalogv1.GetBuildRequest{Fingerprint: fp})
	if err != nil || !proto.Equal(got.GetBuild(), b) {
		t.Fatalf("the DONE build changed: %v, %v", got, err)
	}
}
