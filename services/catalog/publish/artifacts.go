package publish

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"hash"
	"io"
	"os"

	"google.golang.org/grpc"

	"mesh.dev/internal/names"
	catalogv1 "mesh.dev/proto/mesh/catalog/v1"
)

// UploadChunkSize is the size of each UploadArtifact chunk message.
const UploadChunkSize = 512 << 10

// Uploader is the part of the catalog client uploads use.
type Uploader interface {
	UploadArtifact(ctx context.Context, opts ...grpc.CallOption) (grpc.ClientStreamingClient[catalogv1.UploadArtifactRequest, catalogv1.UploadArtifactResponse], error)
}

// Downloader is the part of the catalog client downloads use.
type Downloader interface {
	DownloadArtifact(ctx context.Context, in *catalogv1.DownloadArtifactRequest, opts ...grpc.CallOption) (grpc.ServerStreamingClient[catalogv1.DownloadArtifactResponse], error)
}

// Upload streams size bytes of r to the catalog as the artifact of digest.
// When the catalog already holds it, it answers after the header and the
// rest of r is not sent (created false).
func Upload(ctx context.Context, c Uploader, digest string, size int64, r io.Reader) (*catalogv1.UploadArtifactResponse, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel() // ends the stream if we return early
	stream, err := c.UploadArtifact(ctx)
	if err != nil {
		return nil, err
	}
	header := &catalogv1.UploadArtifactRequest{Msg: &catalogv1.UploadArtifactRequest_Header{Header: &catalogv1.ArtifactHeader{Digest: digest, Size: size}}}
	if err := stream.Send(header); err != nil && !errors.Is(err, io.EOF) {
		return nil, err
	}
	buf := make([]byte, UploadChunkSize)
	for {
		n, rerr := io.ReadFull(r, buf)
		if n > 0 {
			err := stream.Send(&catalogv1.UploadArtifactRequest{Msg: &catalogv1.UploadArtifactRequest_Chunk{Chunk: buf[:n]}})
			if errors.Is(err, io.EOF) {
				break // the catalog answered already; CloseAndRecv says how
			}
			if err != nil {
				return nil, err
			}
		}
		if errors.Is(rerr, io.EOF) || errors.Is(rerr, io.ErrUnexpectedEOF) {
			break
		}
		if rerr != nil {
			return nil, rerr
		}
	}
	resp, err := stream.CloseAndRecv()
	if err != nil {
		return nil, err
	}
	if resp.GetDigest() != digest || resp.GetSize() != size {
		return nil, fmt.Errorf("the catalog answered for %s (%d bytes), not %s (%d bytes)", resp.GetDigest(), resp.GetSize(), digest, size)
	}
	return resp, nil
}

// UploadFile uploads a file as an artifact, hashing it first.
func UploadFile(ctx context.Context, c Uploader, file string) (*catalogv1.UploadArtifactResponse, error) {
	digest, size, err := fileDigest(file)
	if err != nil {
		return nil, err
	}
	f, err := os.Open(file)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	// io.LimitReader: a file that grew since it was hashed sends what was
	// hashed, and the catalog refuses it if its bytes changed.
	resp, err := Upload(ctx, c, digest, size, io.LimitReader(f, size))
	if err != nil {
		return nil, fmt.Errorf("upload %s: %w", file, err)
	}
	return resp, nil
}

// Download writes the artifact of digest from offset on to w and returns its
// size. The bytes are hashed on the way after h, which holds the bytes
// before offset (nil: offset must be 0); a digest mismatch at the end is an
// error, and w then holds bytes to discard.
func Download(ctx context.Context, c Downloader, digest string, offset int64, h hash.Hash, w io.Writer) (int64, error) {
	if h == nil {
		if offset != 0 {
			return 0, errors.New("download: a resumed download needs the hash of the bytes before its offset")
		}
		h = sha256.New()
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := c.DownloadArtifact(ctx, &catalogv1.DownloadArtifactRequest{Digest: digest, Offset: offset})
	if err != nil {
		return 0, err
	}
	size := int64(-1)
	at := offset
	for {
		msg, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return 0, err
		}
		if size < 0 {
			size = msg.GetSize()
		}
		if msg.GetOffset() != at {
			return 0, fmt.Errorf("download %s: chunk at offset %d, expected %d", digest, msg.GetOffset(), at)
		}
		chunk := msg.GetChunk()
		if at+int64(len(chunk)) > size {
			return 0, fmt.Errorf("download %s: more than the %d bytes announced", digest, size)
		}
		h.Write(chunk)
		if _, err := w.Write(chunk); err != nil {
			return 0, err
		}
		at += int64(len(chunk))
	}
	if size < 0 {
		return 0, fmt.Errorf("download %s: the stream ended before its first message", digest)
	}
	if at != size {
		return 0, fmt.Errorf("download %s: the stream ended at byte %d of %d", digest, at, size)
	}
	if got := names.DigestOfSum(h.Sum(nil)); got != digest {
		return 0, fmt.Errorf("download %s: the bytes received have digest %s", digest, got)
	}
	return size, nil
}

// DownloadFile downloads an artifact into file. The bytes go to file+".part"
// first and are renamed to file once their digest is checked; with resume,
// a .part file left by an interrupted download is continued from its end.
func DownloadFile(ctx context.Context, c Downloader, digest, file string, resume bool) (int64, error) {
	part := file + ".part"
	flags := os.O_CREATE | os.O_WRONLY | os.O_TRUNC
	if resume {
		flags = os.O_CREATE | os.O_RDWR
	}
	f, err := os.OpenFile(part, flags, 0o644)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	h := sha256.New()
	offset := int64(0)
	if resume {
		if offset, err = io.Copy(h, f); err != nil {
			return 0, fmt.Errorf("resume from %s: %w", part, err)
		}
	}
	size, err := Download(ctx, c, digest, offset, h, f)
	if err != nil {
		return 0, err
	}
	if err := f.Sync(); err != nil {
		return 0, err
	}
	if err := f.Close(); err != nil {
		return 0, err
	}
	if err := os.Rename(part, file); err != nil {
		return 0, err
	}
	return size, nil
}
