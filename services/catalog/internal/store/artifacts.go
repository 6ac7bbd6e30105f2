package store

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"hash"
	"io"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"mesh.dev/internal/names"
	"mesh.dev/internal/natsx"
)

// ErrMismatch marks an artifact whose bytes are not what its uploader
// declared; nothing was stored.
var ErrMismatch = errors.New("artifact does not match its declared digest and size")

// ErrOffset marks a read from an offset past an artifact's end.
var ErrOffset = errors.New("offset past the artifact's end")

// MismatchError says how the bytes received differ from the declaration.
type MismatchError struct {
	Digest    string
	Size      int64
	GotDigest string
	GotSize   int64
}

func (e *MismatchError) Error() string {
	if e.GotSize != e.Size {
		return fmt.Sprintf("received %d bytes, %d declared (digest %s of what came)", e.GotSize, e.Size, e.GotDigest)
	}
	return fmt.Sprintf("received bytes of digest %s, %s declared", e.GotDigest, e.Digest)
}

// Is makes errors.Is(err, ErrMismatch) true.
func (e *MismatchError) Is(target error) bool { return target == ErrMismatch }

// objectDigest returns a digest in the object store's own notation, which
// ObjectInfo.Digest holds: "SHA-256=" + base64url of the sum.
func objectDigest(digest string) (string, error) {
	sum, err := names.DigestBytes(digest)
	if err != nil {
		return "", err
	}
	return "SHA-256=" + base64.URLEncoding.EncodeToString(sum), nil
}

// ArtifactHeld reports whether the object store holds an artifact under its
// digest whose bytes have that digest, and its size. An object under the
// name with other bytes (written by hand) counts as not held, so an upload
// replaces it.
func (s *Store) ArtifactHeld(ctx context.Context, digest string) (int64, bool, error) {
	want, err := objectDigest(digest)
	if err != nil {
		return 0, false, err
	}
	ctx, span := s.tracer.Start(ctx, "object.info "+natsx.ObjectStoreArtifacts, trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(attribute.String("object.name", digest)))
	defer span.End()
	info, err := s.artifacts.GetInfo(ctx, digest)
	span.SetAttributes(attribute.Bool("object.found", err == nil))
	if errors.Is(err, jetstream.ErrObjectNotFound) {
		return 0, false, nil
	}
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
		return 0, false, fmt.Errorf("artifact %s: info: %w", digest, natsx.MapError(err))
	}
	if info.Deleted {
		return 0, false, nil
	}
	if info.Digest != want {
		s.log.Warn("artifacts holds an object whose bytes are not its name's digest; it counts as not held",
			"object", digest, "object_digest", info.Digest)
		return 0, false, nil
	}
	return int64(info.Size), true, nil
}

// PutArtifact stores exactly size bytes read from r under digest, checking
// while they stream that they have that digest. A reader that ends early,
// holds other bytes or fails leaves nothing stored: the object store writes
// an object's metadata, which makes it exist, only after its last chunk, and
// purges the chunks of a put that fails before. A mismatch is an error
// wrapping ErrMismatch (a *MismatchError). ctx should not be the uploader's:
// a cancelled ctx also cancels the purge; end the put by failing r instead.
func (s *Store) PutArtifact(ctx context.Context, digest string, size int64, r io.Reader) error {
	want, err := names.DigestBytes(digest)
	if err != nil {
		return err
	}
	v := &verifier{r: r, h: sha256.New(), want: want, digest: digest, size: size}
	if _, err := natsx.PutObject(ctx, s.artifacts, digest, v, size, s.opts...); err != nil {
		return err
	}
	return nil
}

// verifier hashes what it reads and, at the end of its reader, fails with a
// *MismatchError unless the bytes had the declared digest and size.
type verifier struct {
	r      io.Reader
	h      hash.Hash
	want   []byte
	digest string
	size   int64
	n      int64
}

func (v *verifier) Read(p []byte) (int, error) {
	n, err := v.r.Read(p)
	v.h.Write(p[:n])
	v.n += int64(n)
	if errors.Is(err, io.EOF) {
		if sum := v.h.Sum(nil); v.n != v.size || !bytes.Equal(sum, v.want) {
			return n, &MismatchError{Digest: v.digest, Size: v.size, GotDigest: names.DigestOfSum(sum), GotSize: v.n}
		}
	}
	return n, err
}

// OpenArtifact opens an artifact for reading from offset on and returns its
// size. The reader fails at the end when the stored bytes do not match their
// digest. It returns an error wrapping natsx.ErrNotFound when the artifact is
// not held and ErrOffset when offset is past its end.
func (s *Store) OpenArtifact(ctx context.Context, digest string, offset int64) (io.ReadCloser, int64, error) {
	size, held, err := s.ArtifactHeld(ctx, digest)
	if err != nil {
		return nil, 0, err
	}
	if !held {
		return nil, 0, fmt.Errorf("artifact %s: %w", digest, natsx.ErrNotFound)
	}
	if offset < 0 || offset > size {
		return nil, size, fmt.Errorf("offset %d of a %d-byte artifact: %w", offset, size, ErrOffset)
	}
	rc, _, err := natsx.GetObject(ctx, s.artifacts, digest, offset, s.opts...)
	if err != nil {
		return nil, 0, err
	}
	return rc, size, nil
}

// chunkSubjectPrefix is where the object store keeps an object's chunks:
// "$O.<bucket>.C.<nuid>".
var chunkSubjectPrefix = "$O." + natsx.ObjectStoreArtifacts + ".C."

// SweepOrphanChunks purges chunks no object's metadata names: those of a
// put that never finished because the process writing it died (a failed put
// purges its own). Chunks written within minAge are kept, since a put may
// still be writing them. It returns how many objects' chunks it purged.
func (s *Store) SweepOrphanChunks(ctx context.Context, minAge time.Duration) (int, error) {
	stream, err := s.js.Stream(ctx, "OBJ_"+natsx.ObjectStoreArtifacts)
	if err != nil {
		return 0, fmt.Errorf("sweep artifacts: %w", err)
	}
	// Subjects first, then the objects: an object finished in between is
	// then seen as live.
	info, err := stream.Info(ctx, jetstream.WithSubjectFilter(chunkSubjectPrefix+">"))
	if err != nil {
		return 0, fmt.Errorf("sweep artifacts: stream info: %w", err)
	}
	if len(info.State.Subjects) == 0 {
		return 0, nil
	}
	objects, err := s.artifacts.List(ctx, jetstream.ListObjectsShowDeleted())
	if err != nil && !errors.Is(err, jetstream.ErrNoObjectsFound) {
		return 0, fmt.Errorf("sweep artifacts: list: %w", err)
	}
	live := map[string]bool{}
	for _, o := range objects {
		if !o.Deleted {
			live[o.NUID] = true
		}
	}
	purged := 0
	for subject := range info.State.Subjects {
		nuid := strings.TrimPrefix(subject, chunkSubjectPrefix)
		if live[nuid] {
			continue
		}
		if minAge > 0 {
			m, err := stream.GetLastMsgForSubject(ctx, subject)
			if err != nil || time.Since(m.Time) < minAge {
				continue
			}
		}
		if err := stream.Purge(ctx, jetstream.WithPurgeSubject(subject)); err != nil {
			return purged, fmt.Errorf("sweep artifacts: purge %s: %w", subject, err)
		}
		s.log.Info("purged the chunks of an unfinished artifact upload", "subject", subject)
		purged++
	}
	return purged, nil
}

// ChunkSubjects returns how many chunk subjects the artifacts store holds,
// for tests that check an interrupted upload left nothing behind.
func (s *Store) ChunkSubjects(ctx context.Context) (int, error) {
	stream, err := s.js.Stream(ctx, "OBJ_"+natsx.ObjectStoreArtifacts)
	if err != nil {
		return 0, err
	}
	info, err := stream.Info(ctx, jetstream.WithSubjectFilter(chunkSubjectPrefix+">"))
	if err != nil {
		return 0, err
	}
	return len(info.State.Subjects), nil
}
