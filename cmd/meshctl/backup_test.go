package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	"mesh.dev/cmd/meshctl/onebox"
	"mesh.dev/internal/envelope"
	"mesh.dev/internal/identity"
	"mesh.dev/internal/names"
	"mesh.dev/internal/natsx"
	composerv1 "mesh.dev/proto/mesh/composer/v1"
	nodeenginev1 "mesh.dev/proto/mesh/nodeengine/v1"
	typev1 "mesh.dev/proto/mesh/type/v1"
)

// meshctl runs meshctl with args and returns what it printed.
func meshctl(ctx context.Context, args ...string) (string, error) {
	root := newRootCmd()
	out := &syncBuffer{}
	root.SetOut(out)
	root.SetErr(out)
	root.SetArgs(args)
	err := root.ExecuteContext(ctx)
	return out.String(), err
}

// waitUntil polls cond until it holds or ctx ends; cond says why not.
func waitUntil(ctx context.Context, what string, cond func(context.Context) (bool, string)) error {
	last := ""
	for {
		ok, why := cond(ctx)
		if ok {
			return nil
		}
		last = why
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s: %w; last: %s", what, ctx.Err(), last)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// engineView is what a node engine runs: its applied manifest and wants.
type engineView struct {
	revision  uint64
	digest    string
	highWater uint64
	// wants maps each module to the composition digest it wants.
	wants map[string]string
}

func engineStatus(ctx context.Context, m *onebox.Mesh, e onebox.Engine) (*nodeenginev1.GetStatusResponse, error) {
	conn, err := m.Dial(e.Admin, identity.RoleOperator, "admin")
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	return nodeenginev1.NewNodeEngineServiceClient(conn).GetStatus(ctx, &nodeenginev1.GetStatusRequest{})
}

func viewOf(st *nodeenginev1.GetStatusResponse) engineView {
	v := engineView{revision: st.GetApplied().GetRevision(), digest: st.GetApplied().GetDigest(), highWater: st.GetHighWater(), wants: map[string]string{}}
	for _, w := range st.GetWants() {
		v.wants[w.GetModule()] = w.GetCompositionDigest()
	}
	return v
}

// refusals returns the attempts of an engine's haves that failed: a
// refused manifest shows as a FAILED attempt of module node.
func refusals(st *nodeenginev1.GetStatusResponse) []string {
	var out []string
	for _, h := range st.GetHaves() {
		if a := h.GetAttempt(); a.GetState() == composerv1.AttemptState_ATTEMPT_STATE_FAILED {
			out = append(out, fmt.Sprintf("%s: %s %s", h.GetModule(), a.GetReasonCode(), a.GetReason()))
		}
	}
	return out
}

// converged waits until the composer reports every node converged and
// every engine has applied the manifest its assignment holds; meanwhile it
// records every failed attempt an engine reports.
func converged(ctx context.Context, m *onebox.Mesh, failed map[string]bool, logs *syncBuffer) error {
	err := waitConverged(ctx, m, failed)
	if err != nil && logs != nil {
		l := logs.String()
		err = fmt.Errorf("%w\n--- the end of the mesh's log:\n%s", err, l[max(0, len(l)-32<<10):])
	}
	return err
}

func waitConverged(ctx context.Context, m *onebox.Mesh, failed map[string]bool) error {
	asg, err := natsx.OpenKV(ctx, m.JetStream, natsx.BucketAssignments)
	if err != nil {
		return err
	}
	return waitUntil(ctx, "the fleet converges", func(ctx context.Context) (bool, string) {
		ok, why := true, ""
		for _, e := range m.Engines {
			st, err := engineStatus(ctx, m, e)
			if err != nil {
				return false, fmt.Sprintf("%s: %v", e.Node, err)
			}
			for _, r := range refusals(st) {
				failed[e.Node+" "+r] = true
			}
			a, err := asg.Get(ctx, e.Node)
			if err != nil {
				ok, why = false, fmt.Sprintf("%s has no assignment: %v", e.Node, err)
				continue
			}
			held := &composerv1.Assignment{}
			if err := proto.Unmarshal(a.Value, held); err != nil {
				return false, err.Error()
			}
			if st.GetApplied().GetRevision() != held.GetManifestRevision() || st.GetApplied().GetDigest() != held.GetManifestDigest() {
				ok, why = false, fmt.Sprintf("%s applied revision %d, its assignment holds %d", e.Node, st.GetApplied().GetRevision(), held.GetManifestRevision())
				continue
			}
			// The engine's own pass on that manifest has run: an engine
			// just restarted has its kept manifest applied before it.
			wanted := map[string]string{}
			for _, w := range held.GetWants() {
				wanted[w.GetModule()] = w.GetCompositionDigest()
			}
			if got := viewOf(st).wants; !mapsEqual(got, wanted) {
				ok, why = false, fmt.Sprintf("%s has not passed on its manifest yet: it wants %v, the assignment %v", e.Node, got, wanted)
			}
		}
		if !ok {
			return false, why
		}
		sts, err := m.Status(ctx)
		if err != nil {
			return false, err.Error()
		}
		if len(sts) != len(m.Engines) {
			return false, fmt.Sprintf("%d statuses", len(sts))
		}
		for _, st := range sts {
			if !st.GetConverged() {
				return false, fmt.Sprintf("%s not converged (status written %s): last error %q, manifest r%d, applied r%d, modules %v",
					st.GetNode(), st.GetUpdatedAt().AsTime().Format(time.RFC3339Nano), st.GetLastError(), st.GetManifestRevision(), st.GetAppliedRevision(), st.GetModules())
			}
		}
		return true, ""
	})
}

func keysOf(ctx context.Context, js jetstream.JetStream, bucket string) ([]string, error) {
	kv, err := natsx.OpenKV(ctx, js, bucket)
	if err != nil {
		return nil, err
	}
	return kv.ListKeys(ctx)
}

func objectNames(ctx context.Context, js jetstream.JetStream, store string) ([]string, error) {
	obs, err := js.ObjectStore(ctx, store)
	if err != nil {
		return nil, err
	}
	infos, err := obs.List(ctx)
	if errors.Is(err, jetstream.ErrNoObjectsFound) {
		return nil, nil
	}
	var out []string
	for _, i := range infos {
		out = append(out, i.Name)
	}
	sort.Strings(out)
	return out, err
}

// TestBackupRestoreFleet runs a mesh to convergence with the example
// modules, copies the signer's state dir while it is stopped, backs
// JetStream up, changes one node's spec after the backup (so that node's
// engine runs a manifest newer than any the backup or the signer's copy
// knows), loses JetStream and the signer's state, restores both into a
// fresh JetStream and the signer's state dir and starts the services again
// with the engines' state dirs as they were. The fleet must converge back
// to the backup's intent with no engine refusing anything, every revision
// above what each engine had, and the derived buckets rebuilt.
func TestBackupRestoreFleet(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a whole mesh twice")
	}
	ctx, cancel := context.WithTimeout(t.Context(), 4*time.Minute)
	defer cancel()
	dir := t.TempDir()
	const nodes = 3

	logs := &syncBuffer{}
	m, err := onebox.Start(ctx, onebox.Options{DataDir: dir, Nodes: nodes, LogOutput: logs})
	if err != nil {
		t.Fatal(err)
	}
	running := m
	t.Cleanup(func() {
		if running != nil {
			running.Stop()
		}
	})
	if _, err := m.PublishModules(ctx, filepath.Join("..", "..", "examples", "modules")); err != nil {
		t.Fatal(err)
	}
	if err := m.PutDevNodes(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := m.ApproveFirstPlacements(ctx); err != nil {
		t.Fatal(err)
	}
	failed := map[string]bool{}
	if err := converged(ctx, m, failed, logs); err != nil {
		t.Fatal(err)
	}

	// The signer's state dir is copied while the signer is stopped
	// (DESIGN.md §9), then the mesh runs on.
	m.Stop()
	signerCopy := filepath.Join(t.TempDir(), "signer")
	if err := os.CopyFS(signerCopy, os.DirFS(filepath.Join(dir, "signer"))); err != nil {
		t.Fatal(err)
	}
	if m, err = onebox.Start(ctx, onebox.Options{DataDir: dir, Nodes: nodes, LogOutput: logs}); err != nil {
		t.Fatal(err)
	}
	running = m
	if err := converged(ctx, m, failed, logs); err != nil {
		t.Fatal(err)
	}

	// What the backup holds: each engine's manifest and wants, and the
	// derived data the composer made.
	backedUp := map[string]engineView{}
	for _, e := range m.Engines {
		st, err := engineStatus(ctx, m, e)
		if err != nil {
			t.Fatal(err)
		}
		backedUp[e.Node] = viewOf(st)
	}
	compositionsBefore, err := keysOf(ctx, m.JetStream, natsx.BucketCompositions)
	if err != nil {
		t.Fatal(err)
	}
	objectsBefore, err := objectNames(ctx, m.JetStream, natsx.ObjectStoreObjects)
	if err != nil {
		t.Fatal(err)
	}

	start := time.Now()
	out, err := meshctl(ctx, "backup", "--nats-url", m.NATSURL, "--out", filepath.Join(dir, "backups")+string(os.PathSeparator))
	if err != nil {
		t.Fatalf("meshctl backup: %v\n%s", err, out)
	}
	t.Logf("backup took %s:\n%s", time.Since(start).Round(time.Millisecond), out)
	archives, _ := filepath.Glob(filepath.Join(dir, "backups", "mesh-backup-*.tar"))
	if len(archives) != 1 || !strings.Contains(out, "verified") {
		t.Fatalf("backup wrote %v", archives)
	}
	archive := archives[0]
	if out, err := meshctl(ctx, "backup", "verify", archive); err != nil || !strings.Contains(out, ": OK") {
		t.Fatalf("meshctl backup verify: %v\n%s", err, out)
	}

	// After the backup, dev-2 moves on: its sshd listens on another port,
	// and its engine applies a manifest the backup does not hold.
	changed := onebox.NodeName(2)
	if err := putSpec(ctx, m, 2, func(s *composerv1.NodeSpec) {
		for _, pm := range s.GetModules() {
			if pm.GetModule() == "sshd" {
				pm.Params.Fields["port"] = structpb.NewNumberValue(2222)
			}
		}
	}); err != nil {
		t.Fatal(err)
	}
	var beyond uint64
	if err := waitUntil(ctx, changed+" applies its new spec", func(ctx context.Context) (bool, string) {
		for _, e := range m.Engines {
			if e.Node != changed {
				continue
			}
			st, err := engineStatus(ctx, m, e)
			if err != nil {
				return false, err.Error()
			}
			beyond = st.GetHighWater()
			return st.GetApplied().GetRevision() > backedUp[changed].revision && st.GetApplied().GetRevision() == st.GetHighWater(),
				fmt.Sprintf("applied %d", st.GetApplied().GetRevision())
		}
		return false, "no engine"
	}); err != nil {
		t.Fatal(err)
	}
	if err := converged(ctx, m, failed, logs); err != nil {
		t.Fatal(err)
	}
	highWater := map[string]uint64{}
	for _, e := range m.Engines {
		st, err := engineStatus(ctx, m, e)
		if err != nil {
			t.Fatal(err)
		}
		highWater[e.Node] = st.GetHighWater()
	}
	m.Stop()
	running = nil
	if len(failed) > 0 {
		t.Fatalf("engines reported failures before the restore: %v", failed)
	}

	// JetStream is lost, and so is the signer's machine: a fresh
	// JetStream gets the backup, the signer its copied state dir, older
	// than the revision dev-2's engine has applied since.
	if err := os.Rename(filepath.Join(dir, "nats"), filepath.Join(dir, "nats-lost")); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(filepath.Join(dir, "signer"), filepath.Join(dir, "signer-lost")); err != nil {
		t.Fatal(err)
	}
	if err := os.CopyFS(filepath.Join(dir, "signer"), os.DirFS(signerCopy)); err != nil {
		t.Fatal(err)
	}
	emb, err := natsx.StartEmbedded(natsx.EmbeddedConfig{DataDir: filepath.Join(dir, "nats"), SyncAlways: true})
	if err != nil {
		t.Fatal(err)
	}
	start = time.Now()
	out, err = meshctl(ctx, "restore", "--nats-url", emb.ClientURL(), archive)
	if err != nil {
		emb.Shutdown()
		t.Fatalf("meshctl restore: %v\n%s", err, out)
	}
	t.Logf("restore took %s:\n%s", time.Since(start).Round(time.Millisecond), out)
	// A second restore finds the truth there and refuses.
	out, err = meshctl(ctx, "restore", "--nats-url", emb.ClientURL(), archive)
	emb.Shutdown()
	if err == nil || !strings.Contains(err.Error(), "restore refused") {
		t.Fatalf("a restore into a restored JetStream: %v\n%s", err, out)
	}

	// The mesh again, on the restored JetStream, with the same signer
	// state dir and the same engines' state dirs.
	logs2 := &syncBuffer{}
	m2, err := onebox.Start(ctx, onebox.Options{DataDir: dir, Nodes: nodes, LogOutput: logs2})
	if err != nil {
		t.Fatal(err)
	}
	running = m2
	start = time.Now()
	if err := converged(ctx, m2, failed, logs2); err != nil {
		t.Fatal(err)
	}
	t.Logf("the fleet converged %s after the restart on the restored JetStream", time.Since(start).Round(time.Millisecond))

	// No engine refused anything: no failed attempt seen while converging,
	// no refusal in any engine's log.
	if len(failed) > 0 {
		t.Errorf("engines reported failures after the restore: %v", failed)
	}
	for _, line := range strings.Split(logs2.String(), "\n") {
		if strings.Contains(line, `"msg":"refused"`) || strings.Contains(line, "REVISION_CONFLICT") {
			t.Errorf("after the restore: %s", line)
		}
	}
	// Each engine runs the backup's intent again, under a revision above
	// every one it had seen.
	for _, e := range m2.Engines {
		st, err := engineStatus(ctx, m2, e)
		if err != nil {
			t.Fatal(err)
		}
		v, was := viewOf(st), backedUp[e.Node]
		if !mapsEqual(v.wants, was.wants) {
			t.Errorf("%s wants %v after the restore; the backup's intent is %v", e.Node, v.wants, was.wants)
		}
		if v.revision < highWater[e.Node] {
			t.Errorf("%s runs revision %d, below the %d it had applied before", e.Node, v.revision, highWater[e.Node])
		}
		if e.Node == changed && v.revision <= beyond {
			t.Errorf("%s runs revision %d; it must be re-signed above %d", e.Node, v.revision, beyond)
		}
	}

	// Derived buckets are rebuilt: every wanted composition with its
	// judgement, each node's haves and status, the same objects.
	asgKV, err := natsx.OpenKV(ctx, m2.JetStream, natsx.BucketAssignments)
	if err != nil {
		t.Fatal(err)
	}
	compositions, err := keysOf(ctx, m2.JetStream, natsx.BucketCompositions)
	if err != nil {
		t.Fatal(err)
	}
	composed, err := keysOf(ctx, m2.JetStream, natsx.BucketComposed)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range m2.Engines {
		a, err := asgKV.Get(ctx, e.Node)
		if err != nil {
			t.Fatal(err)
		}
		held := &composerv1.Assignment{}
		if err := proto.Unmarshal(a.Value, held); err != nil {
			t.Fatal(err)
		}
		man := &typev1.Manifest{}
		if err := envelope.Open(held.GetManifest(), typev1.PayloadType_PAYLOAD_TYPE_MANIFEST, man); err != nil {
			t.Fatal(err)
		}
		for _, w := range man.GetWants() {
			if !slices.Contains(compositions, w.GetCompositionKey()) {
				t.Errorf("composition %s is not rebuilt", w.GetCompositionKey())
			}
			if w.GetModule() != names.NodeModule && !slices.Contains(composed, w.GetCompositionKey()) {
				t.Errorf("the judgement of %s is not rebuilt", w.GetCompositionKey())
			}
		}
	}
	for _, bucket := range []string{natsx.BucketHaves, natsx.BucketStatus} {
		keys, err := keysOf(ctx, m2.JetStream, bucket)
		if err != nil {
			t.Fatal(err)
		}
		if len(keys) != nodes {
			t.Errorf("%s holds %v after the restore", bucket, keys)
		}
	}
	var wantedBefore []string
	for _, k := range compositionsBefore {
		if kk, err := names.ParseCompositionKey(k); err == nil && kk.Node != changed {
			wantedBefore = append(wantedBefore, k)
		}
	}
	for _, k := range wantedBefore {
		if !slices.Contains(compositions, k) {
			t.Errorf("composition %s of an unchanged node is not rebuilt", k)
		}
	}
	if err := waitUntil(ctx, "the objects are rebuilt", func(ctx context.Context) (bool, string) {
		after, err := objectNames(ctx, m2.JetStream, natsx.ObjectStoreObjects)
		if err != nil {
			return false, err.Error()
		}
		missing := []string{}
		for _, o := range objectsBefore {
			if !slices.Contains(after, o) {
				missing = append(missing, o)
			}
		}
		return len(missing) == 0, fmt.Sprintf("missing %v", missing)
	}); err != nil {
		t.Error(err)
	}
	t.Logf("%d compositions, %d objects before; %d compositions after", len(compositionsBefore), len(objectsBefore), len(compositions))
}

// putSpec changes the i-th dev node's spec as the operator.
func putSpec(ctx context.Context, m *onebox.Mesh, i int, change func(*composerv1.NodeSpec)) error {
	conn, err := m.Dial(m.Composer, identity.RoleOperator, "admin")
	if err != nil {
		return err
	}
	defer conn.Close()
	spec := onebox.DevSpec(i)
	change(spec)
	_, err = composerv1.NewComposerServiceClient(conn).PutNode(ctx, &composerv1.PutNodeRequest{Spec: spec})
	return err
}

func mapsEqual(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

// copyModule copies an example module into dir/<name> and lets change
// edit the copy.
func copyModule(t *testing.T, dir, name string, change func(moduleDir string)) {
	t.Helper()
	src := filepath.Join("..", "..", "examples", "modules", name)
	dst := filepath.Join(dir, name)
	if err := os.CopyFS(dst, os.DirFS(src)); err != nil {
		t.Fatal(err)
	}
	change(dst)
}

// TestBackupRestoreKeepsHeldMove backs up a mesh in which a MANUAL module's
// new release is held on a node (the node keeps wanting the release it
// runs), restores it into a fresh JetStream and checks that the node still
// wants what it ran: the held want must survive although compositions are
// derived and not in the backup.
func TestBackupRestoreKeepsHeldMove(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a whole mesh twice")
	}
	ctx, cancel := context.WithTimeout(t.Context(), 4*time.Minute)
	defer cancel()
	dir := t.TempDir()
	m, err := onebox.Start(ctx, onebox.Options{DataDir: dir, Nodes: 1, LogOutput: &syncBuffer{}})
	if err != nil {
		t.Fatal(err)
	}
	running := m
	t.Cleanup(func() {
		if running != nil {
			running.Stop()
		}
	})
	if _, err := m.PublishModules(ctx, filepath.Join("..", "..", "examples", "modules")); err != nil {
		t.Fatal(err)
	}
	if err := m.PutDevNodes(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := m.ApproveFirstPlacements(ctx); err != nil {
		t.Fatal(err)
	}
	failed := map[string]bool{}
	if err := converged(ctx, m, failed, nil); err != nil {
		t.Fatal(err)
	}
	// A new postgres release: MANUAL, so the node holds it.
	mods := filepath.Join(t.TempDir(), "modules")
	copyModule(t, mods, "postgres", func(d string) {
		f, err := os.OpenFile(filepath.Join(d, "files", "postgresql.conf"), os.O_APPEND|os.O_WRONLY, 0)
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintln(f, "# a change an operator must approve")
		f.Close()
	})
	if _, err := m.PublishModules(ctx, mods); err != nil {
		t.Fatal(err)
	}
	node := onebox.NodeName(1)
	if err := waitUntil(ctx, "postgres is held", func(ctx context.Context) (bool, string) {
		sts, err := m.Status(ctx)
		if err != nil || len(sts) != 1 {
			return false, fmt.Sprint(err)
		}
		for _, h := range sts[0].GetHolds() {
			if h.GetModule() == "postgres" && h.GetCompositionDigest() != "" {
				return sts[0].GetConverged(), "not converged"
			}
		}
		return false, "no hold"
	}); err != nil {
		t.Fatal(err)
	}
	st, err := engineStatus(ctx, m, m.Engines[0])
	if err != nil {
		t.Fatal(err)
	}
	backedUp := viewOf(st)

	archive := filepath.Join(dir, "backup.tar")
	if out, err := meshctl(ctx, "backup", "--nats-url", m.NATSURL, "--out", archive); err != nil {
		t.Fatalf("meshctl backup: %v\n%s", err, out)
	}
	m.Stop()
	running = nil
	if err := os.Rename(filepath.Join(dir, "nats"), filepath.Join(dir, "nats-lost")); err != nil {
		t.Fatal(err)
	}
	emb, err := natsx.StartEmbedded(natsx.EmbeddedConfig{DataDir: filepath.Join(dir, "nats"), SyncAlways: true})
	if err != nil {
		t.Fatal(err)
	}
	out, err := meshctl(ctx, "restore", "--nats-url", emb.ClientURL(), archive)
	emb.Shutdown()
	if err != nil {
		t.Fatalf("meshctl restore: %v\n%s", err, out)
	}
	logs := &syncBuffer{}
	m2, err := onebox.Start(ctx, onebox.Options{DataDir: dir, Nodes: 1, LogOutput: logs})
	if err != nil {
		t.Fatal(err)
	}
	running = m2
	if err := converged(ctx, m2, failed, logs); err != nil {
		t.Fatal(err)
	}
	st, err = engineStatus(ctx, m2, m2.Engines[0])
	if err != nil {
		t.Fatal(err)
	}
	if got := viewOf(st); !mapsEqual(got.wants, backedUp.wants) {
		t.Errorf("%s wants %v after the restore; the backup's intent is %v", node, got.wants, backedUp.wants)
	}
	// The move is still held, waiting for its approval.
	sts, err := m2.Status(ctx)
	if err != nil || len(sts) != 1 {
		t.Fatalf("status: %v", err)
	}
	held := false
	for _, h := range sts[0].GetHolds() {
		held = held || h.GetModule() == "postgres" && h.GetCompositionDigest() != "" && h.GetCompositionDigest() != backedUp.wants["postgres"]
	}
	if !held {
		t.Errorf("the postgres move is not held after the restore: %v", sts[0].GetHolds())
	}
	if len(failed) > 0 {
		t.Errorf("engines reported failures: %v", failed)
	}
}

func TestBackupCommandFiles(t *testing.T) {
	dir := t.TempDir()
	existing := filepath.Join(dir, "taken.tar")
	if err := os.WriteFile(existing, []byte("an older backup"), 0o600); err != nil {
		t.Fatal(err)
	}
	// An existing archive is never overwritten; nothing is connected to.
	if out, err := meshctl(t.Context(), "backup", "--nats-url", "nats://127.0.0.1:1", "--out", existing); err == nil || !strings.Contains(err.Error(), "exists") {
		t.Fatalf("backup over an existing file: %v\n%s", err, out)
	}
	// A backup that fails leaves no file behind.
	failed := filepath.Join(dir, "failed.tar")
	if _, err := meshctl(t.Context(), "backup", "--nats-url", "nats://127.0.0.1:1", "--out", failed); err == nil {
		t.Fatal("a backup of an unreachable server succeeded")
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 1 {
		t.Errorf("a failed backup left %v", entries)
	}
	// verify names what is wrong and fails.
	if out, err := meshctl(t.Context(), "backup", "verify", existing); err == nil || !strings.Contains(err.Error(), "archive is corrupt") {
		t.Fatalf("verify of a file that is no archive: %v\n%s", err, out)
	}
	if _, err := meshctl(t.Context(), "restore", "--nats-url", "nats://127.0.0.1:1", filepath.Join(dir, "none.tar")); err == nil {
		t.Fatal("restore of a missing file succeeded")
	}
}
