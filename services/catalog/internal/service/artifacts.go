package service

import (
	"context"
	"errors"
	"io"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"google.golang.org/grpc/codes"

	"mesh.dev/internal/lint"
	"mesh.dev/internal/names"
	"mesh.dev/internal/natsx"
	catalogv1 "mesh.dev/proto/mesh/catalog/v1"
	"mesh.dev/services/catalog/internal/store"
)

// errUploadEnded ends the object store's read of an upload that did not
// finish; the store then purges what it wrote.
var errUploadEnded = errors.New("upload ended before its last byte")

// UploadArtifact stores an artifact streamed by the client (see the
// protocol in catalog.proto). The bytes go into the object store as they
// arrive and are hashed on the way; the object exists only once its last
// chunk matched the declared digest and size, so a mismatch, a client that
// goes away or a stalled upload leaves nothing stored. An artifact already
// held is answered right after the header (created false) and the client's
// next Send returns io.EOF.
func (s *Server) UploadArtifact(stream catalogv1.CatalogService_UploadArtifactServer) error {
	const method = "UploadArtifact"
	ctx, span := s.start(stream.Context(), method)
	defer span.End()
	resp, err := s.upload(ctx, stream)
	if err != nil {
		return s.fail(ctx, span, method, err)
	}
	span.SetAttributes(attrDigest.String(resp.GetDigest()), attribute.Int64("mesh.artifact.size", resp.GetSize()),
		attribute.Bool("mesh.created", resp.GetCreated()))
	return stream.SendAndClose(resp)
}

type received struct {
	msg *catalogv1.UploadArtifactRequest
	err error
}

func (s *Server) upload(ctx context.Context, stream catalogv1.CatalogService_UploadArtifactServer) (*catalogv1.UploadArtifactResponse, error) {
	first, err := stream.Recv()
	if errors.Is(err, io.EOF) {
		return nil, invalidf("header: the stream ended before the header")
	}
	if err != nil {
		return nil, err
	}
	h := first.GetHeader()
	if h == nil {
		return nil, invalidf("header: the first message must carry the header (digest and size), not a chunk")
	}
	digest, size := h.GetDigest(), h.GetSize()
	if err := names.CheckDigest("header.digest", digest); err != nil {
		return nil, invalidf("%v", err)
	}
	if size < 0 || size > lint.MaxArtifactSize {
		return nil, invalidf("header.size %d is outside 0..%d (the artifact size limit)", size, lint.MaxArtifactSize)
	}

	unlock, err := s.uploads.lock(ctx, digest)
	if err != nil {
		return nil, err
	}
	defer unlock()
	heldSize, held, err := s.store.ArtifactHeld(ctx, digest)
	if err != nil {
		return nil, err
	}
	if held {
		if heldSize != size {
			return nil, invalidf("header.size %d is not the size of artifact %s, which is held (%d bytes)", size, digest, heldSize)
		}
		return &catalogv1.UploadArtifactResponse{Digest: digest, Size: size, Created: false}, nil
	}

	// The put must not end with the client's context: its purge of a
	// failed put needs a live one. The upload ends it through the pipe.
	putCtx, cancelPut := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelPut()
	pr, pw := io.Pipe()
	putDone := make(chan error, 1)
	go func() {
		err := s.store.PutArtifact(putCtx, digest, size, pr)
		pr.CloseWithError(errUploadEnded) // unblocks a writer if the put failed early
		putDone <- err
	}()
	abort := func(cause error) {
		pw.CloseWithError(cause)
		if err := <-putDone; err != nil && !errors.Is(err, cause) {
			s.log.DebugContext(ctx, "aborted upload's put", "digest", digest, "error", err)
		}
	}

	// Receive in a goroutine so that a stalled client is noticed.
	msgs := make(chan received)
	quit := make(chan struct{})
	defer close(quit)
	go func() {
		for {
			m, err := stream.Recv()
			select {
			case msgs <- received{m, err}:
			case <-quit:
				return
			}
			if err != nil {
				return
			}
		}
	}()

	idle := time.NewTimer(s.idle)
	defer idle.Stop()
	deadline := time.NewTimer(s.maxUp)
	defer deadline.Stop()
	var n int64
	for {
		select {
		case r := <-msgs:
			if errors.Is(r.err, io.EOF) {
				pw.Close()
				if err := <-putDone; err != nil {
					var mm *store.MismatchError
					if errors.As(err, &mm) {
						return nil, invalidf("artifact does not match its header: %v; nothing was stored", mm)
					}
					return nil, err
				}
				s.m.artifacts.Add(ctx, 1)
				s.m.artifactBytes.Add(ctx, size)
				s.log.InfoContext(ctx, "artifact stored", "digest", digest, "size", size, "caller", caller(ctx))
				return &catalogv1.UploadArtifactResponse{Digest: digest, Size: size, Created: true}, nil
			}
			if r.err != nil {
				abort(errUploadEnded)
				return nil, r.err
			}
			if r.msg.GetHeader() != nil {
				abort(errUploadEnded)
				return nil, invalidf("header: a second header after %d bytes; nothing was stored", n)
			}
			chunk := r.msg.GetChunk()
			if n+int64(len(chunk)) > size {
				abort(errUploadEnded)
				return nil, invalidf("chunk: more bytes than the %d declared; nothing was stored", size)
			}
			if _, err := pw.Write(chunk); err != nil {
				// The put ended early; its error says why.
				if perr := <-putDone; perr != nil {
					return nil, perr
				}
				return nil, err
			}
			n += int64(len(chunk))
			idle.Reset(s.idle)
		case <-idle.C:
			abort(errUploadEnded)
			return nil, coded(codes.DeadlineExceeded, "no chunk for %s after %d of %d bytes: upload abandoned; nothing was stored", s.idle, n, size)
		case <-deadline.C:
			abort(errUploadEnded)
			return nil, coded(codes.DeadlineExceeded, "upload still running after %s, at %d of %d bytes: abandoned; nothing was stored", s.maxUp, n, size)
		case <-ctx.Done():
			abort(errUploadEnded)
			return nil, ctx.Err()
		}
	}
}

// DownloadArtifact streams an artifact from an offset.
func (s *Server) DownloadArtifact(req *catalogv1.DownloadArtifactRequest, stream catalogv1.CatalogService_DownloadArtifactServer) error {
	const method = "DownloadArtifact"
	ctx, span := s.start(stream.Context(), method, attrDigest.String(req.GetDigest()), attribute.Int64("mesh.offset", req.GetOffset()))
	defer span.End()
	if err := s.download(ctx, req, stream); err != nil {
		return s.fail(ctx, span, method, err)
	}
	return nil
}

func (s *Server) download(ctx context.Context, req *catalogv1.DownloadArtifactRequest, stream catalogv1.CatalogService_DownloadArtifactServer) error {
	digest, offset := req.GetDigest(), req.GetOffset()
	if err := names.CheckDigest("digest", digest); err != nil {
		return invalidf("%v", err)
	}
	if offset < 0 {
		return invalidf("offset %d is negative", offset)
	}
	r, size, err := s.store.OpenArtifact(ctx, digest, offset)
	switch {
	case errors.Is(err, natsx.ErrNotFound):
		return notFoundf("no artifact %s", digest)
	case errors.Is(err, store.ErrOffset):
		return invalidf("offset %d is beyond the artifact's size %d", offset, size)
	case err != nil:
		return err
	}
	defer r.Close()
	buf := make([]byte, DownloadChunkSize)
	first := true
	at := offset
	for {
		n, err := io.ReadFull(r, buf)
		if n > 0 || first {
			msg := &catalogv1.DownloadArtifactResponse{Offset: at, Chunk: buf[:n]}
			if first {
				msg.Size = size
			}
			if serr := stream.Send(msg); serr != nil {
				return serr
			}
			s.m.servedBytes.Add(ctx, int64(n))
			at += int64(n)
			first = false
		}
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return nil
		}
		if err != nil {
			return err
		}
	}
}
