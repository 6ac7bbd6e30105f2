package engine

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"google.golang.org/grpc"

	catalogv1 "mesh.dev/proto/mesh/catalog/v1"
	composerv1 "mesh.dev/proto/mesh/composer/v1"
	typev1 "mesh.dev/proto/mesh/type/v1"
	"mesh.dev/services/nodeengine/internal/apply"
	"mesh.dev/services/nodeengine/internal/entries"
	"mesh.dev/services/nodeengine/internal/picture"
)

// Composer is what the engine asks of the composer besides Sync: its own
// compositions and the objects they name.
type Composer interface {
	GetComposition(ctx context.Context, in *composerv1.GetCompositionRequest, opts ...grpc.CallOption) (*composerv1.GetCompositionResponse, error)
	GetObject(ctx context.Context, in *composerv1.GetObjectRequest, opts ...grpc.CallOption) (grpc.ServerStreamingClient[composerv1.GetObjectResponse], error)
}

// Catalog is what the engine asks of the catalog: entries and artifacts.
type Catalog interface {
	entries.Catalog
	DownloadArtifact(ctx context.Context, in *catalogv1.DownloadArtifactRequest, opts ...grpc.CallOption) (grpc.ServerStreamingClient[catalogv1.DownloadArtifactResponse], error)
}

// source fetches objects from the composer and artifacts from the catalog
// for the applier, stopping at the declared size.
type source struct {
	composer Composer
	catalog  Catalog
	deadline time.Duration
	// stall cuts a stream that sends nothing for that long.
	stall time.Duration
}

var _ apply.Source = (*source)(nil)

// chunk is one message of an object or artifact stream.
type chunk interface {
	GetSize() int64
	GetOffset() int64
	GetChunk() []byte
}

func copyStream[T chunk](recv func() (T, error), declared int64, w io.Writer) error {
	var off int64
	for first := true; ; first = false {
		m, err := recv()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		if first && m.GetSize() > declared {
			return fmt.Errorf("the server says %d bytes: %w", m.GetSize(), apply.ErrSizeExceeded)
		}
		if m.GetOffset() != off {
			return fmt.Errorf("chunk at offset %d, expected %d", m.GetOffset(), off)
		}
		if _, err := w.Write(m.GetChunk()); err != nil {
			return err
		}
		off += int64(len(m.GetChunk()))
	}
}

// errStalled is the cause of a fetch cut for sending nothing.
var errStalled = errors.New("stalled")

// Fetch streams an object or artifact into w, within the fetch deadline and
// cutting a stream that sends nothing for the stall time (a server whose own
// read lost its reply would otherwise hold the pass to the deadline).
func (s *source) Fetch(ctx context.Context, c *apply.Composition, r *typev1.Resource, digest string, size int64, w io.Writer) error {
	ctx, cancel := context.WithTimeout(ctx, s.deadline)
	defer cancel()
	ctx, stop := context.WithCancelCause(ctx)
	defer stop(nil)
	idle := time.AfterFunc(s.stall, func() { stop(errStalled) })
	defer idle.Stop()
	stalled := func(err error) error {
		if err != nil && errors.Is(context.Cause(ctx), errStalled) {
			return fmt.Errorf("nothing received for %s: %w", s.stall, err)
		}
		return err
	}
	switch x := r.GetContent().(type) {
	case *typev1.Resource_Object:
		if s.composer == nil {
			return errors.New("no composer connection")
		}
		st, err := s.composer.GetObject(ctx, &composerv1.GetObjectRequest{CompositionKey: c.Key, Digest: x.Object.GetDigest()})
		if err != nil {
			return stalled(err)
		}
		return stalled(copyStream(recvResetting(st.Recv, idle, s.stall), size, w))
	case *typev1.Resource_Artifact:
		if s.catalog == nil {
			return errors.New("no catalog connection")
		}
		st, err := s.catalog.DownloadArtifact(ctx, &catalogv1.DownloadArtifactRequest{Digest: digest})
		if err != nil {
			return fmt.Errorf("%s: %w", picture.ArtifactURL(c.Module, x.Artifact, digest), stalled(err))
		}
		return stalled(copyStream(recvResetting(st.Recv, idle, s.stall), size, w))
	}
	return fmt.Errorf("%s has no fetchable content", r.GetId())
}

// recvResetting restarts the stall timer at each message received.
func recvResetting[T any](recv func() (T, error), idle *time.Timer, stall time.Duration) func() (T, error) {
	return func() (T, error) {
		m, err := recv()
		if err == nil {
			idle.Reset(stall)
		}
		return m, err
	}
}
