package rig

import (
	"context"
	"io"
	"sync"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"mesh.dev/internal/grpcserver"
	"mesh.dev/internal/identity"
	"mesh.dev/internal/testutil"
	composerv1 "mesh.dev/proto/mesh/composer/v1"
	typev1 "mesh.dev/proto/mesh/type/v1"
	composerapp "mesh.dev/services/composer/app"
)

// Hostile is a composer that serves what its test tells it: on each Sync
// stream the keyset, then every manifest pushed so far and each one pushed
// later; compositions and objects by key and digest. It runs the real
// grpcserver with the composer's certificate and authorization policy, so
// the engine talks to it exactly as to a composer: a compromised composer
// that holds signed content.
type Hostile struct {
	composerv1.UnimplementedComposerServiceServer
	composerv1.UnimplementedSyncServiceServer

	Addr   string
	keyset *typev1.Envelope

	mu        sync.Mutex
	manifests []*typev1.Envelope
	changed   chan struct{}
	comps     map[string]*typev1.Envelope
	objects   map[string][]byte
	reports   int
}

// StartHostile serves a hostile composer sending keyset first.
func (m *Mesh) StartHostile(t testing.TB, keyset *typev1.Envelope) *Hostile {
	t.Helper()
	h := &Hostile{keyset: keyset, changed: make(chan struct{}), comps: map[string]*typev1.Envelope{}, objects: map[string][]byte{}}
	h.Addr, _ = testutil.StartServerConfig(t, grpcserver.Config{
		TLS: m.PKI.ServerTLS(t, m.PKI.Identity(identity.RoleComposer, "")), Policy: composerapp.Policy(), Logger: Logger(t),
	}, func(r grpc.ServiceRegistrar) {
		composerv1.RegisterComposerServiceServer(r, h)
		composerv1.RegisterSyncServiceServer(r, h)
	})
	return h
}

// Serve makes a composition available by key and objects by digest.
func (h *Hostile) Serve(key string, env *typev1.Envelope, objects map[string][]byte) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.comps[key] = env
	for d, b := range objects {
		h.objects[d] = b
	}
}

// Push sends a manifest on every stream, now and on each new one.
func (h *Hostile) Push(env *typev1.Envelope) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.manifests = append(h.manifests, env)
	close(h.changed)
	h.changed = make(chan struct{})
}

// Reports returns how many Reports the engines sent.
func (h *Hostile) Reports() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.reports
}

// Sync sends the keyset and the pushed manifests, and reads reports.
func (h *Hostile) Sync(stream grpc.BidiStreamingServer[composerv1.SyncRequest, composerv1.SyncResponse]) error {
	if _, err := stream.Recv(); err != nil {
		return err
	}
	if err := stream.Send(&composerv1.SyncResponse{Msg: &composerv1.SyncResponse_Keyset{Keyset: h.keyset}}); err != nil {
		return err
	}
	errc := make(chan error, 1)
	go func() {
		for {
			if _, err := stream.Recv(); err != nil {
				errc <- err
				return
			}
			h.mu.Lock()
			h.reports++
			h.mu.Unlock()
		}
	}()
	sent := 0
	for {
		h.mu.Lock()
		pending := h.manifests[sent:]
		changed := h.changed
		h.mu.Unlock()
		for _, env := range pending {
			if err := stream.Send(&composerv1.SyncResponse{Msg: &composerv1.SyncResponse_Manifest{Manifest: env}}); err != nil {
				return err
			}
			sent++
		}
		select {
		case <-changed:
		case err := <-errc:
			if err == io.EOF {
				return nil
			}
			return err
		case <-stream.Context().Done():
			return stream.Context().Err()
		}
	}
}

// GetComposition serves a composition by key.
func (h *Hostile) GetComposition(_ context.Context, req *composerv1.GetCompositionRequest) (*composerv1.GetCompositionResponse, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	env, ok := h.comps[req.GetKey()]
	if !ok {
		return nil, status.Errorf(codes.NotFound, "no composition %s", req.GetKey())
	}
	return &composerv1.GetCompositionResponse{Composition: env}, nil
}

// GetObject streams an object's bytes, whatever digest they have.
func (h *Hostile) GetObject(req *composerv1.GetObjectRequest, stream grpc.ServerStreamingServer[composerv1.GetObjectResponse]) error {
	h.mu.Lock()
	b, ok := h.objects[req.GetDigest()]
	h.mu.Unlock()
	if !ok {
		return status.Errorf(codes.NotFound, "no object %s", req.GetDigest())
	}
	const chunk = 32 << 10
	for off := 0; ; off += chunk {
		end := min(off+chunk, len(b))
		msg := &composerv1.GetObjectResponse{Offset: int64(off), Chunk: b[off:end]}
		if off == 0 {
			msg.Size = int64(len(b))
		}
		if err := stream.Send(msg); err != nil {
			return err
		}
		if end == len(b) {
			return nil
		}
	}
}
