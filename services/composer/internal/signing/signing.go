// Package signing is the composer's client of the signer: it carries the
// lease's fencing epoch on every request and splits large batches.
package signing

import (
	"context"
	"fmt"

	"google.golang.org/grpc"

	"mesh.dev/internal/lint"
	signerv1 "mesh.dev/proto/mesh/signer/v1"
	typev1 "mesh.dev/proto/mesh/type/v1"
)

// Client is the part of the signer the composer calls.
type Client interface {
	SignCompositions(ctx context.Context, in *signerv1.SignCompositionsRequest, opts ...grpc.CallOption) (*signerv1.SignCompositionsResponse, error)
	SignManifests(ctx context.Context, in *signerv1.SignManifestsRequest, opts ...grpc.CallOption) (*signerv1.SignManifestsResponse, error)
	Fence(ctx context.Context, in *signerv1.FenceRequest, opts ...grpc.CallOption) (*signerv1.FenceResponse, error)
	GetKeyset(ctx context.Context, in *signerv1.GetKeysetRequest, opts ...grpc.CallOption) (*signerv1.GetKeysetResponse, error)
}

// Signer signs with the current fencing epoch.
type Signer struct {
	client Client
	epoch  func() uint64
}

// New returns a Signer; epoch reads the lease's current epoch.
func New(client Client, epoch func() uint64) *Signer { return &Signer{client: client, epoch: epoch} }

// Fence asks the signer for a new epoch.
func (s *Signer) Fence(ctx context.Context, holder string) (uint64, error) {
	resp, err := s.client.Fence(ctx, &signerv1.FenceRequest{Holder: holder})
	if err != nil {
		return 0, err
	}
	return resp.GetEpoch(), nil
}

// SignCompositions signs compositions in batches of at most lint.MaxBatch.
func (s *Signer) SignCompositions(ctx context.Context, comps []*typev1.Composition) ([]*signerv1.SignedItem, error) {
	out := make([]*signerv1.SignedItem, 0, len(comps))
	for start := 0; start < len(comps); start += lint.MaxBatch {
		end := min(start+lint.MaxBatch, len(comps))
		resp, err := s.client.SignCompositions(ctx, &signerv1.SignCompositionsRequest{FencingEpoch: s.epoch(), Compositions: comps[start:end]})
		if err != nil {
			return nil, err
		}
		if len(resp.GetItems()) != end-start {
			return nil, fmt.Errorf("signer returned %d items for %d", len(resp.GetItems()), end-start)
		}
		out = append(out, resp.GetItems()...)
	}
	return out, nil
}

// SignManifests signs manifests in batches of at most lint.MaxBatch.
func (s *Signer) SignManifests(ctx context.Context, items []*signerv1.ManifestItem) ([]*signerv1.SignedManifest, error) {
	out := make([]*signerv1.SignedManifest, 0, len(items))
	for start := 0; start < len(items); start += lint.MaxBatch {
		end := min(start+lint.MaxBatch, len(items))
		resp, err := s.client.SignManifests(ctx, &signerv1.SignManifestsRequest{FencingEpoch: s.epoch(), Manifests: items[start:end]})
		if err != nil {
			return nil, err
		}
		if len(resp.GetManifests()) != end-start {
			return nil, fmt.Errorf("signer returned %d manifests for %d", len(resp.GetManifests()), end-start)
		}
		out = append(out, resp.GetManifests()...)
	}
	return out, nil
}
