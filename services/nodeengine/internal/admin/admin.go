// Package admin implements mesh.nodeengine.v1.NodeEngineService, the node
// engine's local admin API (DESIGN.md §7): GetStatus, FirstViews and
// EntryAgain.
package admin

import (
	"context"
	"fmt"
	"log/slog"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"mesh.dev/internal/authz"
	"mesh.dev/internal/identity"
	"mesh.dev/internal/names"
	nodeenginev1 "mesh.dev/proto/mesh/nodeengine/v1"
)

// Engine is what the admin API reads and asks of the engine.
type Engine interface {
	Node() string
	Status() *nodeenginev1.GetStatusResponse
	FirstViews() *nodeenginev1.FirstViewsResponse
	EntryAgain(fp string) bool
}

// Server serves the admin API.
type Server struct {
	nodeenginev1.UnsafeNodeEngineServiceServer
	engine Engine
	log    *slog.Logger
}

var _ nodeenginev1.NodeEngineServiceServer = (*Server)(nil)

// New returns the admin API of an engine.
func New(e Engine, log *slog.Logger) *Server {
	if log == nil {
		log = slog.Default()
	}
	return &Server{engine: e, log: log}
}

// Register registers the service.
func (s *Server) Register(r grpc.ServiceRegistrar) {
	nodeenginev1.RegisterNodeEngineServiceServer(r, s)
}

// Policy is the admin API's authorization table: operators and the node
// itself (node:self, the engine's own node identity) read and ask again.
func Policy(node string) authz.Policy {
	self := func(any) (string, error) { return node, nil }
	rule := authz.Allow(identity.RoleOperator, identity.RoleNode).Self(self)
	return authz.Policy{
		nodeenginev1.NodeEngineService_GetStatus_FullMethodName:  rule,
		nodeenginev1.NodeEngineService_FirstViews_FullMethodName: rule,
		nodeenginev1.NodeEngineService_EntryAgain_FullMethodName: rule,
	}
}

// GetStatus returns the engine's status.
func (s *Server) GetStatus(context.Context, *nodeenginev1.GetStatusRequest) (*nodeenginev1.GetStatusResponse, error) {
	return s.engine.Status(), nil
}

// FirstViews returns the entries and wants the engine knows.
func (s *Server) FirstViews(context.Context, *nodeenginev1.FirstViewsRequest) (*nodeenginev1.FirstViewsResponse, error) {
	return s.engine.FirstViews(), nil
}

// EntryAgain drops a kept entry and asks the catalog again.
func (s *Server) EntryAgain(ctx context.Context, req *nodeenginev1.EntryAgainRequest) (*nodeenginev1.EntryAgainResponse, error) {
	fp := req.GetFingerprint()
	if err := names.CheckFingerprint("fingerprint", fp); err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	if !s.engine.EntryAgain(fp) {
		return nil, status.Error(codes.NotFound, fmt.Sprintf("no entry of %s is kept", fp))
	}
	caller, _ := identity.FromContext(ctx)
	s.log.InfoContext(ctx, "entry asked again", slog.String("fingerprint", fp), slog.String("caller", caller.String()))
	return &nodeenginev1.EntryAgainResponse{}, nil
}
