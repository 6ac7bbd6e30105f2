package main

import (
	"context"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	composerv1 "mesh.dev/proto/mesh/composer/v1"
)

// TestWaitConvergedIsLive: while the fleet converges, the table is printed
// again whenever a node moves, each time after a progress line; once every
// node converged the final table is printed and WaitConverged returns.
func TestWaitConvergedIsLive(t *testing.T) {
	t.Parallel()
	seen := timestamppb.New(time.Now())
	node := func(name string, converged bool, applied uint64) *composerv1.NodeStatus {
		return &composerv1.NodeStatus{Node: name, Converged: converged, ManifestRevision: 7, AppliedRevision: applied, LastSeen: seen}
	}
	steps := [][]*composerv1.NodeStatus{
		{node("ace", false, 0), node("bay", false, 0)},
		{node("ace", true, 7), node("bay", false, 0)},
		{node("ace", true, 7), node("bay", true, 7)},
	}
	var mu sync.Mutex
	calls := 0
	fetch := func(context.Context) ([]*composerv1.NodeStatus, error) {
		mu.Lock()
		defer mu.Unlock()
		st := steps[min(calls, len(steps)-1)]
		calls++
		return st, nil
	}
	var out strings.Builder
	if err := WaitConverged(context.Background(), &out, fetch, nil, 2, false); err != nil {
		t.Fatal(err)
	}
	got := out.String()
	for _, want := range []string{"0/2 nodes converged", "1/2 nodes converged", "2/2 nodes converged"} {
		if !strings.Contains(got, want) {
			t.Errorf("no %q in:\n%s", want, got)
		}
	}
	if n := strings.Count(got, "NODE "); n != 3 {
		t.Errorf("the table was printed %d times, want 3 (each state once):\n%s", n, got)
	}
	last := got[strings.LastIndex(got, "NODE "):]
	if !strings.Contains(last, "bay   r7/r7") || strings.Contains(last, "CONVERGING") {
		t.Errorf("the last table does not show every node converged:\n%s", last)
	}
}

// TestWaitConvergedSaysWhy: with why, the live table names under it, in one
// line each, why every node that is not converged is not.
func TestWaitConvergedSaysWhy(t *testing.T) {
	t.Parallel()
	seen := timestamppb.New(time.Now())
	held := &composerv1.NodeStatus{Node: "ace", ManifestRevision: 7, AppliedRevision: 7, LastSeen: seen, Modules: []*composerv1.ModuleStatus{
		{Module: "users", WantedDigest: "sha256:aa", AppliedDigest: "sha256:bb", Hold: &composerv1.Hold{Module: "users", Reason: "MANUAL policy: approve the move"}},
	}}
	failed := &composerv1.NodeStatus{Node: "bay", ManifestRevision: 9, AppliedRevision: 8, LastSeen: seen, Modules: []*composerv1.ModuleStatus{
		{Module: "motd", WantedDigest: "sha256:cc", State: composerv1.AttemptState_ATTEMPT_STATE_FAILED,
			ReasonCode: composerv1.ReasonCode_REASON_CODE_DIGEST_MISMATCH, Reason: "composition bytes are not the manifest's digest"},
	}}
	never := &composerv1.NodeStatus{Node: "cod", ManifestRevision: 3}
	done := []*composerv1.NodeStatus{
		{Node: "ace", Converged: true, ManifestRevision: 7, AppliedRevision: 7, LastSeen: seen},
		{Node: "bay", Converged: true, ManifestRevision: 9, AppliedRevision: 9, LastSeen: seen},
		{Node: "cod", Converged: true, ManifestRevision: 3, AppliedRevision: 3, LastSeen: seen},
	}
	fetch := fetchSteps(answer([]*composerv1.NodeStatus{held, failed, never}, nil), answer(done, nil))
	var out strings.Builder
	if err := WaitConverged(context.Background(), &out, fetch, nil, 3, true); err != nil {
		t.Fatal(err)
	}
	got := out.String()
	for _, want := range []string{
		"  ace: users held: MANUAL policy: approve the move\n",
		"  bay: motd FAILED DIGEST_MISMATCH: composition bytes are not the manifest's digest\n",
		"  cod: its engine has not connected yet\n",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("no %q in:\n%s", want, got)
		}
	}
	last := got[strings.LastIndex(got, "NODE "):]
	if strings.Contains(last, "  ace:") {
		t.Errorf("the converged table still gives reasons:\n%s", last)
	}
}

// TestWaitConvergedNamesTheMissing: a node named that has no status keeps
// the wait going, is said in the progress line, and the timeout's error
// names it and every node not converged.
func TestWaitConvergedNamesTheMissing(t *testing.T) {
	t.Parallel()
	seen := timestamppb.New(time.Now())
	fetch := func(context.Context) ([]*composerv1.NodeStatus, error) {
		return []*composerv1.NodeStatus{
			{Node: "ace", Converged: true, ManifestRevision: 7, AppliedRevision: 7, LastSeen: seen},
			{Node: "bay", ManifestRevision: 7, AppliedRevision: 6, LastSeen: seen},
		}, nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 1200*time.Millisecond)
	defer cancel()
	var out strings.Builder
	err := WaitConverged(ctx, &out, fetch, []string{"ace", "bay", "nosuch"}, 3, false)
	if err == nil || !strings.Contains(err.Error(), "not converged: bay, nosuch (no status)") {
		t.Errorf("error %v does not name bay and nosuch", err)
	}
	if got := out.String(); !strings.Contains(got, `1/2 nodes converged; no status yet of "nosuch"`) {
		t.Errorf("the progress line does not name nosuch:\n%s", got)
	}
	if n := strings.Count(out.String(), "nodes converged"); n != 1 {
		t.Errorf("the unchanged progress line was printed %d times, want once:\n%s", n, out.String())
	}
}

// An engine that refuses a manifest whose compositions are all applied
// already (a blocked engine, a refused renewal) says why on its attempts,
// not in its digests: status --why and the --wait line say it, the node's
// own module first (where the engine puts a refusal).
func TestWhySaysARefusalOfAManifestWhoseCompositionsAreApplied(t *testing.T) {
	t.Parallel()
	const reason = "kept high-water marks unreadable, nothing is applied until it is repaired"
	mod := func(m string) *composerv1.ModuleStatus {
		return &composerv1.ModuleStatus{Module: m, WantedDigest: "sha256:" + m, AppliedDigest: "sha256:" + m,
			State: composerv1.AttemptState_ATTEMPT_STATE_FAILED, ReasonCode: composerv1.ReasonCode_REASON_CODE_STATE_UNREADABLE, Reason: reason}
	}
	st := &composerv1.NodeStatus{Node: "dev-2", ManifestRevision: 9, AppliedRevision: 8, LastSeen: timestamppb.New(time.Now()),
		Modules: []*composerv1.ModuleStatus{mod("motd"), mod("node")}}
	var out strings.Builder
	RenderStatus(&out, []*composerv1.NodeStatus{st}, true, time.Now())
	if !strings.Contains(out.String(), "last attempt FAILED STATE_UNREADABLE: "+reason) {
		t.Errorf("status --why does not say why the manifest is not applied:\n%s", out.String())
	}
	if i, j := strings.Index(out.String(), "  node:"), strings.Index(out.String(), "  motd:"); i < 0 || j < 0 || i > j {
		t.Errorf("status --why does not list the node's own module first:\n%s", out.String())
	}
	if r := notConvergedBecause(st); r != "node FAILED STATE_UNREADABLE: "+reason {
		t.Errorf("the --wait line says %q", r)
	}
}

// A module the engine holds at its wanted digest (a need no longer met)
// leaves the node converged, said as a hold with the engine's words.
func TestEngineHoldAtTheWantedDigestSaid(t *testing.T) {
	t.Parallel()
	st := &composerv1.NodeStatus{Node: "dev-1", Converged: true, ManifestRevision: 9, AppliedRevision: 9, LastSeen: timestamppb.New(time.Now()),
		Modules: []*composerv1.ModuleStatus{{Module: "backup", WantedDigest: "sha256:b", AppliedDigest: "sha256:b",
			State: composerv1.AttemptState_ATTEMPT_STATE_HELD, ReasonCode: composerv1.ReasonCode_REASON_CODE_NEED_UNMET, Reason: "needs postgres >= 16"}}}
	var out strings.Builder
	RenderStatus(&out, []*composerv1.NodeStatus{st}, true, time.Now())
	for _, want := range []string{"CONVERGED (holds)", "backup: wanted", "HELD NEED_UNMET: needs postgres >= 16"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("status --why lacks %q:\n%s", want, out.String())
		}
	}
	if r := notConvergedBecause(st); r != "runs what it may; backup HELD NEED_UNMET: needs postgres >= 16" {
		t.Errorf("the --wait line says %q", r)
	}
}

// A status read refused for who asks ends --wait at once with the refusal;
// one that fails for a while (the composer unreachable) is said and asked
// again.
func TestWaitEndsAtOnceOnALastingError(t *testing.T) {
	t.Parallel()
	denied := status.Error(codes.PermissionDenied, "builder/ci may not call /mesh.composer.v1.ComposerService/ListStatus")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	start := time.Now()
	err := WaitConverged(ctx, io.Discard, func(context.Context) ([]*composerv1.NodeStatus, error) { return nil, denied }, nil, 0, false)
	if took := time.Since(start); took > time.Second || status.Code(err) != codes.PermissionDenied {
		t.Errorf("WaitConverged took %s and returned %v, want PERMISSION_DENIED at once", took.Round(time.Millisecond), err)
	}

	refused := answer(nil, status.Error(codes.Unavailable, "connection refused"))
	fetch := fetchSteps(refused, refused,
		answer([]*composerv1.NodeStatus{{Node: "ace", Converged: true, ManifestRevision: 7, AppliedRevision: 7, LastSeen: timestamppb.Now()}}, nil))
	var out strings.Builder
	if err := WaitConverged(ctx, &out, fetch, nil, 1, false); err != nil {
		t.Fatalf("WaitConverged: %v\n%s", err, out.String())
	}
	if n := strings.Count(out.String(), "status not read (asked again): rpc error: code = Unavailable desc = connection refused"); n != 1 {
		t.Errorf("the unavailable composer said %d times, want once:\n%s", n, out.String())
	}
}

// A fleet that converged within the last poll before the deadline is
// converged: the last read decides.
func TestWaitConvergedAtTheDeadline(t *testing.T) {
	t.Parallel()
	seen := timestamppb.New(time.Now())
	ctx, cancel := context.WithTimeout(context.Background(), 700*time.Millisecond)
	defer cancel()
	fetch := func(context.Context) ([]*composerv1.NodeStatus, error) {
		return []*composerv1.NodeStatus{{Node: "ace", Converged: ctx.Err() != nil, ManifestRevision: 7, AppliedRevision: 7, LastSeen: seen}}, nil
	}
	var out strings.Builder
	if err := WaitConverged(ctx, &out, fetch, nil, 1, false); err != nil {
		t.Errorf("WaitConverged: %v, though its last read shows every node converged:\n%s", err, out.String())
	}
}

// fetchReply is one answer of a status read.
type fetchReply struct {
	sts []*composerv1.NodeStatus
	err error
}

func answer(sts []*composerv1.NodeStatus, err error) fetchReply { return fetchReply{sts, err} }

// fetchSteps is a status read answering replies in turn, the last one from
// then on.
func fetchSteps(replies ...fetchReply) func(context.Context) ([]*composerv1.NodeStatus, error) {
	var mu sync.Mutex
	calls := 0
	return func(context.Context) ([]*composerv1.NodeStatus, error) {
		mu.Lock()
		defer mu.Unlock()
		r := replies[min(calls, len(replies)-1)]
		calls++
		return r.sts, r.err
	}
}
