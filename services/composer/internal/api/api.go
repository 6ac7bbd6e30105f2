// Package api implements mesh.composer.v1.ComposerService: node specs,
// declarations, plans and applies, approvals, holds, status, and the reads
// node engines make of their own compositions and objects.
package api

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"sort"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"mesh.dev/internal/authz"
	"mesh.dev/internal/envelope"
	"mesh.dev/internal/identity"
	"mesh.dev/internal/lint"
	"mesh.dev/internal/names"
	"mesh.dev/internal/natsx"
	"mesh.dev/internal/verify"
	composerv1 "mesh.dev/proto/mesh/composer/v1"
	typev1 "mesh.dev/proto/mesh/type/v1"
	"mesh.dev/services/composer/internal/compose"
	"mesh.dev/services/composer/internal/pass"
	"mesh.dev/services/composer/internal/store"
)

// Declarer renders a node's declaration with the current catalog.
type Declarer interface {
	Declaration(ctx context.Context, spec *composerv1.NodeSpec) (*composerv1.Declaration, error)
}

// Leader tells whether this replica holds the lease and who does.
type Leader interface {
	Held() bool
	Holder() string
}

// Config is what the server needs.
type Config struct {
	Store    *store.Store
	Passer   *pass.Passer
	Declarer Declarer
	Lease    Leader
	Logger   *slog.Logger
	// Recompose, when set, asks for a pass of a node soon: a read that
	// finds one of the node's compositions corrupt asks for its repair.
	Recompose func(node, reason string)
	// Keyring, when set, is the current keyset: GetComposition with a
	// digest may then answer from the compositions the store holds in
	// memory when one of their signatures is by a key it lets verify.
	Keyring func() *verify.Keyring
	// Now stamps approvals; tests pin it.
	Now func() *timestamppb.Timestamp
	// LastSeen, when set, tells when a node's engine was last heard (the
	// Sync hub's, in memory): a status read answers with it when it is
	// newer than the one the status holds, which is persisted at most
	// every 5 minutes (DESIGN.md §6 step 4).
	LastSeen func(node string) time.Time
}

// Server implements ComposerService.
type Server struct {
	composerv1.UnsafeComposerServiceServer
	cfg Config
	log *slog.Logger
}

var _ composerv1.ComposerServiceServer = (*Server)(nil)

// New returns the server.
func New(cfg Config) *Server {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Now == nil {
		cfg.Now = timestamppb.Now
	}
	return &Server{cfg: cfg, log: cfg.Logger}
}

// Register registers the service.
func (s *Server) Register(r grpc.ServiceRegistrar) { composerv1.RegisterComposerServiceServer(r, s) }

// Policy is the ComposerService authorization table: operators do
// everything; a node reads only its own compositions and the objects they
// name.
func Policy() authz.Policy {
	op := authz.Allow(identity.RoleOperator)
	keyNode := authz.SelfFrom(func(r *composerv1.GetCompositionRequest) (string, error) {
		k, err := names.ParseCompositionKey(r.GetKey())
		return k.Node, err
	})
	objNode := authz.SelfFrom(func(r *composerv1.GetObjectRequest) (string, error) {
		k, err := names.ParseCompositionKey(r.GetCompositionKey())
		return k.Node, err
	})
	return authz.Policy{
		composerv1.ComposerService_PutNode_FullMethodName:          op,
		composerv1.ComposerService_GetNode_FullMethodName:          op,
		composerv1.ComposerService_ListNodes_FullMethodName:        op,
		composerv1.ComposerService_DeleteNode_FullMethodName:       op,
		composerv1.ComposerService_GetDeclaration_FullMethodName:   op,
		composerv1.ComposerService_Plan_FullMethodName:             op,
		composerv1.ComposerService_Apply_FullMethodName:            op,
		composerv1.ComposerService_Approve_FullMethodName:          op,
		composerv1.ComposerService_ListApprovals_FullMethodName:    op,
		composerv1.ComposerService_RevokeApproval_FullMethodName:   op,
		composerv1.ComposerService_ListHolds_FullMethodName:        op,
		composerv1.ComposerService_GetStatus_FullMethodName:        op,
		composerv1.ComposerService_ListStatus_FullMethodName:       op,
		composerv1.ComposerService_ListCompositions_FullMethodName: op,
		composerv1.ComposerService_GetComposition_FullMethodName:   authz.Allow(identity.RoleOperator, identity.RoleNode).Self(keyNode),
		composerv1.ComposerService_GetObject_FullMethodName:        authz.Allow(identity.RoleOperator, identity.RoleNode).Self(objNode),
	}
}

// toStatus turns an error into a gRPC status: validation → INVALID_ARGUMENT
// naming the field, absent → NOT_FOUND, CAS conflict → ABORTED, not the
// lease holder or an object whose bytes do not come → UNAVAILABLE, else INTERNAL with the detail only logged.
func (s *Server) toStatus(ctx context.Context, method string, err error) error {
	var fe *fieldError
	var le *lint.Error
	switch {
	case err == nil:
		return nil
	case errors.As(err, &fe), errors.As(err, &le):
		return status.Error(codes.InvalidArgument, err.Error())
	case errors.Is(err, errInvalid), errors.Is(err, names.ErrInvalid):
		return status.Error(codes.InvalidArgument, err.Error())
	case errors.Is(err, errNotFound):
		return status.Error(codes.NotFound, err.Error())
	case errors.Is(err, store.ErrConflict):
		return status.Error(codes.Aborted, err.Error())
	case errors.Is(err, errNotLeader):
		return status.Error(codes.Unavailable, err.Error())
	case errors.Is(err, errPrecondition):
		return status.Error(codes.FailedPrecondition, err.Error())
	case errors.Is(err, natsx.ErrObjectStalled):
		// Its bytes do not come (put again meanwhile, or chunks lost): the
		// engine retries, and its FETCH_FAILED makes the composer check the
		// object and put it again when it is damaged.
		s.log.WarnContext(ctx, "request failed", "method", method, "error", err)
		return status.Error(codes.Unavailable, err.Error())
	case errors.Is(err, context.Canceled):
		return status.Error(codes.Canceled, err.Error())
	case errors.Is(err, context.DeadlineExceeded):
		return status.Error(codes.DeadlineExceeded, err.Error())
	}
	s.log.ErrorContext(ctx, "request failed", "method", method, "error", err)
	return status.Error(codes.Internal, "internal error; see the composer's log")
}

var (
	errInvalid      = errors.New("invalid argument")
	errNotFound     = errors.New("not found")
	errNotLeader    = errors.New("this composer does not hold the lease")
	errPrecondition = errors.New("failed precondition")
)

func checkNodeArg(field, node string) error {
	if err := names.CheckNode(node); err != nil {
		return invalid(field, "%v", err)
	}
	return nil
}

// PutNode creates or replaces a node spec.
func (s *Server) PutNode(ctx context.Context, req *composerv1.PutNodeRequest) (*composerv1.PutNodeResponse, error) {
	if err := ValidateSpec(req.GetSpec()); err != nil {
		return nil, s.toStatus(ctx, "PutNode", err)
	}
	rev, err := s.cfg.Store.PutSpec(ctx, req.GetSpec(), req.GetExpectedRevision(), req.GetCreateOnly())
	if err != nil {
		return nil, s.toStatus(ctx, "PutNode", err)
	}
	return &composerv1.PutNodeResponse{Revision: rev}, nil
}

// GetNode returns a node spec.
func (s *Server) GetNode(ctx context.Context, req *composerv1.GetNodeRequest) (*composerv1.GetNodeResponse, error) {
	if err := checkNodeArg("node", req.GetNode()); err != nil {
		return nil, s.toStatus(ctx, "GetNode", err)
	}
	spec, rev, err := s.cfg.Store.Spec(ctx, req.GetNode())
	if errors.Is(err, store.ErrNotFound) {
		return nil, s.toStatus(ctx, "GetNode", fmt.Errorf("%w: no node spec of %s", errNotFound, req.GetNode()))
	}
	if err != nil {
		return nil, s.toStatus(ctx, "GetNode", err)
	}
	return &composerv1.GetNodeResponse{Spec: spec, Revision: rev}, nil
}

// ListNodes returns node specs by name, optionally by selector.
func (s *Server) ListNodes(ctx context.Context, req *composerv1.ListNodesRequest) (*composerv1.ListNodesResponse, error) {
	if err := ValidateLabels("selector.match_labels", req.GetSelector().GetMatchLabels()); err != nil {
		return nil, s.toStatus(ctx, "ListNodes", err)
	}
	specs, _, err := s.cfg.Store.Specs(ctx)
	if err != nil {
		return nil, s.toStatus(ctx, "ListNodes", err)
	}
	out := &composerv1.ListNodesResponse{}
	for _, sp := range specs {
		if compose.Matches(req.GetSelector(), sp.GetLabels()) {
			out.Specs = append(out.Specs, sp)
		}
	}
	return out, nil
}

// DeleteNode removes a node spec; the lease holder then removes what was
// derived for it, and its engine is refused from then on.
func (s *Server) DeleteNode(ctx context.Context, req *composerv1.DeleteNodeRequest) (*composerv1.DeleteNodeResponse, error) {
	if err := checkNodeArg("node", req.GetNode()); err != nil {
		return nil, s.toStatus(ctx, "DeleteNode", err)
	}
	if _, _, err := s.cfg.Store.Spec(ctx, req.GetNode()); errors.Is(err, store.ErrNotFound) {
		return nil, s.toStatus(ctx, "DeleteNode", fmt.Errorf("%w: no node spec of %s", errNotFound, req.GetNode()))
	}
	if err := s.cfg.Store.Nodes.Delete(ctx, req.GetNode()); err != nil {
		return nil, s.toStatus(ctx, "DeleteNode", err)
	}
	return &composerv1.DeleteNodeResponse{}, nil
}

// GetDeclaration renders a node's declaration.
func (s *Server) GetDeclaration(ctx context.Context, req *composerv1.GetDeclarationRequest) (*composerv1.GetDeclarationResponse, error) {
	if err := checkNodeArg("node", req.GetNode()); err != nil {
		return nil, s.toStatus(ctx, "GetDeclaration", err)
	}
	spec, _, err := s.cfg.Store.Spec(ctx, req.GetNode())
	if errors.Is(err, store.ErrNotFound) {
		return nil, s.toStatus(ctx, "GetDeclaration", fmt.Errorf("%w: no node spec of %s", errNotFound, req.GetNode()))
	}
	if err != nil {
		return nil, s.toStatus(ctx, "GetDeclaration", err)
	}
	d, err := s.cfg.Declarer.Declaration(ctx, spec)
	var re *compose.RenderError
	if errors.As(err, &re) || errors.Is(err, compose.ErrPathConflict) {
		return nil, s.toStatus(ctx, "GetDeclaration", fmt.Errorf("%w: %v", errPrecondition, err))
	}
	if err != nil {
		return nil, s.toStatus(ctx, "GetDeclaration", err)
	}
	return &composerv1.GetDeclarationResponse{Declaration: d}, nil
}

// selected returns the nodes a plan names: by name and selector.
func (s *Server) selected(ctx context.Context, nodes []string, sel *typev1.LabelSelector) ([]string, error) {
	for i, n := range nodes {
		if err := checkNodeArg(fmt.Sprintf("nodes[%d]", i), n); err != nil {
			return nil, err
		}
	}
	if err := ValidateLabels("selector.match_labels", sel.GetMatchLabels()); err != nil {
		return nil, err
	}
	specs, _, err := s.cfg.Store.Specs(ctx)
	if err != nil {
		return nil, err
	}
	var out []string
	known := map[string]bool{}
	for _, sp := range specs {
		known[sp.GetNode()] = true
		if (len(nodes) == 0 || slices.Contains(nodes, sp.GetNode())) && compose.Matches(sel, sp.GetLabels()) {
			out = append(out, sp.GetNode())
		}
	}
	// A node named that has no spec is a mistake to say, not a node to
	// leave out of the answer.
	var unknown []string
	for _, n := range nodes {
		if !known[n] && !slices.Contains(unknown, n) {
			unknown = append(unknown, n)
		}
	}
	if len(unknown) > 0 {
		return nil, fmt.Errorf("%w: no node spec of %s", errNotFound, strings.Join(unknown, ", "))
	}
	sort.Strings(out)
	return out, nil
}

// Plan returns per node what a pass would write.
func (s *Server) Plan(ctx context.Context, req *composerv1.PlanRequest) (*composerv1.PlanResponse, error) {
	nodes, err := s.selected(ctx, req.GetNodes(), req.GetSelector())
	if err != nil {
		return nil, s.toStatus(ctx, "Plan", err)
	}
	out := &composerv1.PlanResponse{}
	for _, n := range nodes {
		res, err := s.cfg.Passer.Run(ctx, n, pass.Plan, nil)
		np := &composerv1.NodePlan{Node: n}
		if res != nil {
			fill(np, res)
		}
		if err != nil {
			np.Error = err.Error()
		}
		out.Nodes = append(out.Nodes, np)
	}
	return out, nil
}

func fill(np *composerv1.NodePlan, res *pass.Result) {
	np.Inputs, np.Wants, np.Holds, np.Moved, np.Changes = res.Inputs, res.Wants, res.Holds, res.Moved, res.Changes
	for _, c := range res.Compositions {
		np.Compositions = append(np.Compositions, &composerv1.CompositionPlan{Key: c.Key, Digest: c.Digest,
			Judgement: c.Judged.Judgement, Words: c.Judged.Words, UserListOnly: c.Judged.UserListOnly, Write: c.Written})
	}
	if res.Err != nil {
		np.Error = res.Err.Error()
	}
}

// Apply commits each planned node whose inputs did not move.
func (s *Server) Apply(ctx context.Context, req *composerv1.ApplyRequest) (*composerv1.ApplyResponse, error) {
	if !s.cfg.Lease.Held() {
		return nil, s.toStatus(ctx, "Apply", fmt.Errorf("%w; the holder is %q", errNotLeader, s.cfg.Lease.Holder()))
	}
	out := &composerv1.ApplyResponse{}
	for i, np := range req.GetNodes() {
		if err := checkNodeArg(fmt.Sprintf("nodes[%d].node", i), np.GetNode()); err != nil {
			return nil, s.toStatus(ctx, "Apply", err)
		}
		if np.GetInputs() == nil {
			return nil, s.toStatus(ctx, "Apply", invalid(fmt.Sprintf("nodes[%d].inputs", i), "is required: apply a plan as Plan returned it"))
		}
	}
	for _, np := range req.GetNodes() {
		res, err := s.cfg.Passer.Run(ctx, np.GetNode(), pass.Write, np.GetInputs())
		switch {
		case errors.Is(err, pass.ErrStale):
			out.Stale = append(out.Stale, &composerv1.StalePlan{Node: np.GetNode(), Reason: err.Error()})
		case err != nil:
			out.Failed = append(out.Failed, &composerv1.FailedApply{Node: np.GetNode(), Error: err.Error()})
		case res.Err != nil:
			out.Failed = append(out.Failed, &composerv1.FailedApply{Node: np.GetNode(), Error: res.Err.Error()})
		default:
			out.Applied = append(out.Applied, np.GetNode())
		}
	}
	return out, nil
}

func newID() string {
	var b [8]byte
	rand.Read(b[:])
	return "ap-" + hex.EncodeToString(b[:])
}

// Approve stores an approval of a module's composition digests.
func (s *Server) Approve(ctx context.Context, req *composerv1.ApproveRequest) (*composerv1.ApproveResponse, error) {
	if err := names.CheckModule(req.GetModule()); err != nil {
		return nil, s.toStatus(ctx, "Approve", invalid("module", "%v", err))
	}
	if len(req.GetDigests()) == 0 {
		return nil, s.toStatus(ctx, "Approve", invalid("digests", "name at least one composition digest a Plan showed"))
	}
	if n := len(req.GetDigests()); n > MaxApprovalDigests {
		return nil, s.toStatus(ctx, "Approve", invalid("digests", "%d digests, over the limit of %d per approval", n, MaxApprovalDigests))
	}
	for i, d := range req.GetDigests() {
		if !names.ValidDigest(d) {
			return nil, s.toStatus(ctx, "Approve", invalid(fmt.Sprintf("digests[%d]", i),
				"%q is not a digest (sha256: + 64 lowercase hex: the full digest, as meshctl plan -o json shows it)", d))
		}
	}
	if err := ValidateLabels("selector.match_labels", req.GetSelector().GetMatchLabels()); err != nil {
		return nil, s.toStatus(ctx, "Approve", err)
	}
	if len(req.GetNote()) > 1024 {
		return nil, s.toStatus(ctx, "Approve", invalid("note", "longer than 1024 bytes"))
	}
	digests := slices.Clone(req.GetDigests())
	slices.Sort(digests)
	a := &composerv1.Approval{Id: newID(), Module: req.GetModule(), Digests: slices.Compact(digests), Selector: req.GetSelector(),
		CreatedAt: s.cfg.Now(), Note: req.GetNote()}
	if id, ok := identity.FromContext(ctx); ok {
		a.ApprovedBy = id.String()
	}
	b, err := proto.Marshal(a)
	if err != nil {
		return nil, s.toStatus(ctx, "Approve", err)
	}
	if _, err := s.cfg.Store.Approvals.Create(ctx, a.GetId(), b); err != nil {
		return nil, s.toStatus(ctx, "Approve", err)
	}
	return &composerv1.ApproveResponse{Approval: a}, nil
}

// ListApprovals returns stored approvals.
func (s *Server) ListApprovals(ctx context.Context, req *composerv1.ListApprovalsRequest) (*composerv1.ListApprovalsResponse, error) {
	if req.GetModule() != "" {
		if err := names.CheckModule(req.GetModule()); err != nil {
			return nil, s.toStatus(ctx, "ListApprovals", invalid("module", "%v", err))
		}
	}
	all, err := s.cfg.Store.ApprovalsList(ctx)
	if err != nil {
		return nil, s.toStatus(ctx, "ListApprovals", err)
	}
	out := &composerv1.ListApprovalsResponse{}
	for _, a := range all {
		if req.GetModule() == "" || a.GetModule() == req.GetModule() {
			out.Approvals = append(out.Approvals, a)
		}
	}
	return out, nil
}

// RevokeApproval deletes an approval.
func (s *Server) RevokeApproval(ctx context.Context, req *composerv1.RevokeApprovalRequest) (*composerv1.RevokeApprovalResponse, error) {
	if !strings.HasPrefix(req.GetId(), "ap-") || len(req.GetId()) != 19 {
		return nil, s.toStatus(ctx, "RevokeApproval", invalid("id", "%q is not an approval id", req.GetId()))
	}
	if _, _, err := s.cfg.Store.Approval(ctx, req.GetId()); errors.Is(err, store.ErrNotFound) {
		return nil, s.toStatus(ctx, "RevokeApproval", fmt.Errorf("%w: no approval %s", errNotFound, req.GetId()))
	}
	if err := s.cfg.Store.Approvals.Delete(ctx, req.GetId()); err != nil {
		return nil, s.toStatus(ctx, "RevokeApproval", err)
	}
	return &composerv1.RevokeApprovalResponse{}, nil
}

// ListHolds returns held moves per node, from the assignments.
func (s *Server) ListHolds(ctx context.Context, req *composerv1.ListHoldsRequest) (*composerv1.ListHoldsResponse, error) {
	var nodes []string
	if req.GetNode() != "" {
		if err := checkNodeArg("node", req.GetNode()); err != nil {
			return nil, s.toStatus(ctx, "ListHolds", err)
		}
		nodes = []string{req.GetNode()}
	} else {
		keys, err := s.cfg.Store.Assignments.ListKeys(ctx)
		if err != nil {
			return nil, s.toStatus(ctx, "ListHolds", err)
		}
		nodes = keys
		sort.Strings(nodes)
	}
	out := &composerv1.ListHoldsResponse{}
	for _, n := range nodes {
		a, _, err := s.cfg.Store.Assignment(ctx, n)
		if errors.Is(err, store.ErrNotFound) {
			continue
		}
		if err != nil {
			return nil, s.toStatus(ctx, "ListHolds", err)
		}
		if len(a.GetHolds()) > 0 {
			out.Nodes = append(out.Nodes, &composerv1.NodeHolds{Node: n, Holds: a.GetHolds()})
		}
	}
	return out, nil
}

// GetStatus returns one node's status.
func (s *Server) GetStatus(ctx context.Context, req *composerv1.GetStatusRequest) (*composerv1.GetStatusResponse, error) {
	if err := checkNodeArg("node", req.GetNode()); err != nil {
		return nil, s.toStatus(ctx, "GetStatus", err)
	}
	st, _, err := s.cfg.Store.NodeStatus(ctx, req.GetNode())
	if errors.Is(err, store.ErrNotFound) {
		return nil, s.toStatus(ctx, "GetStatus", fmt.Errorf("%w: no status of %s", errNotFound, req.GetNode()))
	}
	if err != nil {
		return nil, s.toStatus(ctx, "GetStatus", err)
	}
	s.seenNow(st)
	return &composerv1.GetStatusResponse{Status: st}, nil
}

// seenNow sets a status's last seen to the hub's, when newer.
func (s *Server) seenNow(st *composerv1.NodeStatus) {
	if s.cfg.LastSeen == nil {
		return
	}
	if seen := s.cfg.LastSeen(st.GetNode()); !seen.IsZero() && (st.GetLastSeen() == nil || seen.After(st.GetLastSeen().AsTime())) {
		st.LastSeen = timestamppb.New(seen)
	}
}

// ListStatus returns every node's status, by node.
func (s *Server) ListStatus(ctx context.Context, _ *composerv1.ListStatusRequest) (*composerv1.ListStatusResponse, error) {
	keys, err := s.cfg.Store.Status.ListKeys(ctx)
	if err != nil {
		return nil, s.toStatus(ctx, "ListStatus", err)
	}
	sort.Strings(keys)
	out := &composerv1.ListStatusResponse{}
	for _, k := range keys {
		st, _, err := s.cfg.Store.NodeStatus(ctx, k)
		if errors.Is(err, store.ErrNotFound) {
			continue
		}
		if err != nil {
			return nil, s.toStatus(ctx, "ListStatus", err)
		}
		s.seenNow(st)
		out.Statuses = append(out.Statuses, st)
	}
	return out, nil
}

// ListCompositions returns a node's held compositions with their judgements.
func (s *Server) ListCompositions(ctx context.Context, req *composerv1.ListCompositionsRequest) (*composerv1.ListCompositionsResponse, error) {
	if err := checkNodeArg("node", req.GetNode()); err != nil {
		return nil, s.toStatus(ctx, "ListCompositions", err)
	}
	metas, err := s.cfg.Store.Compositions.ListMeta(ctx, req.GetNode()+".>")
	if err != nil {
		return nil, s.toStatus(ctx, "ListCompositions", err)
	}
	if len(metas) == 0 {
		// Nothing kept: say whether the node exists at all.
		if _, _, err := s.cfg.Store.Spec(ctx, req.GetNode()); errors.Is(err, store.ErrNotFound) {
			return nil, s.toStatus(ctx, "ListCompositions", fmt.Errorf("%w: no node spec of %s, and no composition of it is kept", errNotFound, req.GetNode()))
		}
	}
	asg, _, _ := s.cfg.Store.Assignment(ctx, req.GetNode())
	wanted := map[string]bool{}
	for _, w := range asg.GetWants() {
		wanted[w.GetCompositionKey()] = true
	}
	out := &composerv1.ListCompositionsResponse{}
	for _, m := range metas {
		if k, err := names.ParseCompositionKey(m.Key); err != nil || k.Node != req.GetNode() {
			continue
		}
		info := &composerv1.CompositionInfo{Key: m.Key, Revision: m.Revision, WrittenAt: timestamppb.New(m.Created), Wanted: wanted[m.Key]}
		if env, _, _, err := s.cfg.Store.Composition(ctx, m.Key); err == nil {
			info.Digest = envelope.Digest(env)
		}
		if rec, _, err := s.cfg.Store.Record(ctx, m.Key); err == nil {
			info.Judgement = rec
		}
		out.Compositions = append(out.Compositions, info)
	}
	sort.Slice(out.Compositions, func(i, j int) bool { return out.Compositions[i].GetKey() < out.Compositions[j].GetKey() })
	return out, nil
}

// GetComposition returns a signed composition (a node only its own: the
// policy checks the key's node against the caller).
func (s *Server) GetComposition(ctx context.Context, req *composerv1.GetCompositionRequest) (*composerv1.GetCompositionResponse, error) {
	if _, err := names.ParseCompositionKey(req.GetKey()); err != nil {
		return nil, s.toStatus(ctx, "GetComposition", invalid("key", "%v", err))
	}
	if req.GetDigest() != "" {
		if !names.ValidDigest(req.GetDigest()) {
			return nil, s.toStatus(ctx, "GetComposition", invalid("digest", "%q is not a digest (sha256: + 64 lowercase hex)", req.GetDigest()))
		}
		if env, ok := s.cfg.Store.CompositionOf(req.GetKey(), req.GetDigest()); ok && s.verifiable(env) {
			return &composerv1.GetCompositionResponse{Composition: env, Digest: req.GetDigest()}, nil
		}
	}
	env, _, _, err := s.cfg.Store.Composition(ctx, req.GetKey())
	if errors.Is(err, store.ErrNotFound) {
		return nil, s.toStatus(ctx, "GetComposition", fmt.Errorf("%w: no composition %s", errNotFound, req.GetKey()))
	}
	if errors.Is(err, store.ErrCorrupt) {
		return nil, s.corrupt(ctx, "GetComposition", req.GetKey(), err)
	}
	if err != nil {
		return nil, s.toStatus(ctx, "GetComposition", err)
	}
	return &composerv1.GetCompositionResponse{Composition: env, Digest: envelope.Digest(env)}, nil
}

// verifiable reports whether a signature of env is by a key the current
// keyset lets verify now: a composition signed again after a rotation by
// another replica is read from the bucket rather than answered with
// signatures an engine would refuse.
func (s *Server) verifiable(env *typev1.Envelope) bool {
	if s.cfg.Keyring == nil {
		return false
	}
	ring := s.cfg.Keyring()
	if ring == nil {
		return false
	}
	now := time.Now()
	for _, sig := range env.GetSignatures() {
		if ring.Usable(sig.GetKeyId(), now) == nil {
			return true
		}
	}
	return false
}

// corrupt answers a read of a composition key whose stored value does not
// decode (DESIGN.md §5.2.2: present with no content, replaced by the next
// pass): DATA_LOSS, saying so, and a pass of the node is asked for, so
// the lease holder writes it again.
func (s *Server) corrupt(ctx context.Context, method, key string, err error) error {
	s.log.WarnContext(ctx, "a composition key holds a value that does not decode; asking for its node's pass", "method", method, "key", key, "error", err)
	if k, perr := names.ParseCompositionKey(key); perr == nil && s.cfg.Recompose != nil {
		s.cfg.Recompose(k.Node, "composition "+key+" read and found not to decode")
	}
	return status.Errorf(codes.DataLoss, "composition %s holds a value that does not decode; the composer writes it again, retry later", key)
}

// objectChunk is the size of GetObject's messages.
const objectChunk = 64 << 10

// GetObject streams an object a composition names: the composition must be
// the caller's (policy), exist, and name the digest — a stateless check.
func (s *Server) GetObject(req *composerv1.GetObjectRequest, stream grpc.ServerStreamingServer[composerv1.GetObjectResponse]) error {
	ctx := stream.Context()
	if _, err := names.ParseCompositionKey(req.GetCompositionKey()); err != nil {
		return s.toStatus(ctx, "GetObject", invalid("composition_key", "%v", err))
	}
	if !names.ValidDigest(req.GetDigest()) {
		return s.toStatus(ctx, "GetObject", invalid("digest", "%q is not a digest (sha256: + 64 lowercase hex)", req.GetDigest()))
	}
	if req.GetOffset() < 0 {
		return s.toStatus(ctx, "GetObject", invalid("offset", "negative"))
	}
	env, _, _, err := s.cfg.Store.Composition(ctx, req.GetCompositionKey())
	if errors.Is(err, store.ErrNotFound) {
		return s.toStatus(ctx, "GetObject", fmt.Errorf("%w: no composition %s", errNotFound, req.GetCompositionKey()))
	}
	if errors.Is(err, store.ErrCorrupt) {
		return s.corrupt(ctx, "GetObject", req.GetCompositionKey(), err)
	}
	if err != nil {
		return s.toStatus(ctx, "GetObject", err)
	}
	c := &typev1.Composition{}
	if err := envelope.Open(env, typev1.PayloadType_PAYLOAD_TYPE_COMPOSITION, c); err != nil {
		return s.corrupt(ctx, "GetObject", req.GetCompositionKey(), err)
	}
	var size int64 = -1
	for _, r := range c.GetResources() {
		if o := r.GetObject(); o != nil && o.GetDigest() == req.GetDigest() {
			size = o.GetSize()
		}
	}
	if size < 0 {
		if id, ok := identity.FromContext(ctx); ok && id.Role == identity.RoleNode {
			return status.Errorf(codes.PermissionDenied, "composition %s does not name object %s", req.GetCompositionKey(), req.GetDigest())
		}
		return s.toStatus(ctx, "GetObject", fmt.Errorf("%w: composition %s does not name object %s", errNotFound, req.GetCompositionKey(), req.GetDigest()))
	}
	if req.GetOffset() > size {
		return s.toStatus(ctx, "GetObject", invalid("offset", "%d is beyond the object's %d bytes", req.GetOffset(), size))
	}
	r, _, err := natsx.GetObject(ctx, s.cfg.Store.Objects, req.GetDigest(), req.GetOffset(), s.cfg.Store.ObjectOptions()...)
	if errors.Is(err, natsx.ErrNotFound) {
		return s.toStatus(ctx, "GetObject", fmt.Errorf("%w: object %s is not held", errNotFound, req.GetDigest()))
	}
	if err != nil {
		return s.toStatus(ctx, "GetObject", err)
	}
	defer r.Close()
	buf := make([]byte, objectChunk)
	off := req.GetOffset()
	first := true
	for {
		n, rerr := io.ReadFull(r, buf)
		if n > 0 {
			msg := &composerv1.GetObjectResponse{Offset: off, Chunk: buf[:n]}
			if first {
				msg.Size, first = size, false
			}
			if err := stream.Send(msg); err != nil {
				return err
			}
			off += int64(n)
		}
		if errors.Is(rerr, io.EOF) || errors.Is(rerr, io.ErrUnexpectedEOF) {
			break
		}
		if rerr != nil {
			return s.toStatus(ctx, "GetObject", rerr)
		}
	}
	if first {
		return stream.Send(&composerv1.GetObjectResponse{Size: size, Offset: off})
	}
	return nil
}
