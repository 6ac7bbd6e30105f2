// Package compose runs mesh scaled out in containers (deploy/compose): a
// 3-server JetStream cluster, the catalog, the signer, two composers and
// three node engines, each in its own container with its own certificate,
// and puts it through faults.
package compose

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/types/known/structpb"

	"mesh.dev/cmd/meshctl/backup"
	"mesh.dev/internal/natsx"
	"mesh.dev/internal/pki"
	catalogv1 "mesh.dev/proto/mesh/catalog/v1"
	composerv1 "mesh.dev/proto/mesh/composer/v1"
	nodeenginev1 "mesh.dev/proto/mesh/nodeengine/v1"
	"mesh.dev/services/catalog/publish"
	"mesh.dev/tests/internal/natsprobe"
)

// Time bounds of the phases; a run on a 2-CPU machine takes a few minutes
// in all once the images are built.
const (
	buildTimeout    = 15 * time.Minute
	startTimeout    = 3 * time.Minute
	convergeTimeout = 5 * time.Minute
)

var nodes = []string{"ace", "bay", "cod"}

// placed is what each node runs: modules and their params.
var placed = map[string][]string{
	"ace": {"motd", "sshd", "ca-bundle"},
	"bay": {"motd", "node-exporter"},
	"cod": {"motd", "sshd", "node-exporter", "ca-bundle"},
}

func nodeSpec(t *testing.T, node string, ip string) *composerv1.NodeSpec {
	t.Helper()
	params := map[string]map[string]any{
		"sshd":          {"port": 22},
		"node-exporter": {"port": 9100, "collectors": []any{"cpu", "meminfo"}},
	}
	facts, err := structpb.NewStruct(map[string]any{"ip": ip})
	if err != nil {
		t.Fatal(err)
	}
	spec := &composerv1.NodeSpec{Node: node, Labels: map[string]string{"fleet": "compose"}, Facts: facts}
	for _, m := range placed[node] {
		var p *structpb.Struct
		if params[m] != nil {
			if p, err = structpb.NewStruct(params[m]); err != nil {
				t.Fatal(err)
			}
		}
		spec.Modules = append(spec.Modules, &composerv1.PlacedModule{Module: m, Params: p})
	}
	return spec
}

func publishOptions(module string) publish.Options {
	return publish.Options{NoGit: true, Repository: "https://git.example/mesh.git", Path: "examples/modules/" + module}
}

// TestComposeFleet brings the compose deployment up, publishes the example
// modules, places them on three nodes and waits until every engine applied
// its manifest; then kills the lease-holding composer and the NATS server
// leading the assignments stream, cuts one engine off the network, publishes
// a new version of a module, heals, and checks that the fleet converges on
// it and that nothing JetStream acknowledged was lost.
func TestComposeFleet(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: the compose test builds the images and runs ten containers")
	}
	cli := composeCLI(t)
	root := repoRoot(t)
	ctx := t.Context()
	began := time.Now()

	// Images and the deployment's certificates, keys and configuration.
	bctx, cancel := context.WithTimeout(ctx, buildTimeout)
	defer cancel()
	if _, err := run(bctx, os.Environ(), "bash", filepath.Join(root, "deploy", "images", "build.sh")); err != nil {
		t.Fatal(err)
	}
	t.Logf("images built in %s", time.Since(began).Round(time.Second))
	dir := filepath.Join(deploymentParent(t), "deploy")
	bin := filepath.Join(imagesDir(root), ".bin")
	if _, err := run(bctx, os.Environ(), "bash", filepath.Join(root, "deploy", "compose", "gen.sh"), "--bin", bin, dir); err != nil {
		t.Fatal(err)
	}

	d := newDeployment(t, cli, root, dir)
	t.Cleanup(d.down)
	// Engines start once their node specs exist: an engine without one is
	// refused and backs off (up to minutes), which would only slow the test.
	d.compose(startTimeout, "up", "-d", "nats-0", "nats-1", "nats-2", "catalog", "signer", "composer-1", "composer-2")

	builder := catalogv1.NewCatalogServiceClient(d.dial(d.addr("catalog", 7401), "pki", "builder-ci"))
	composers := map[string]composerv1.ComposerServiceClient{}
	for _, c := range []string{"composer-1", "composer-2"} {
		composers[c] = composerv1.NewComposerServiceClient(d.dial(d.addr(c, 7403), "pki", "operator-admin"))
	}
	natsURL := strings.Join([]string{
		"tls://" + d.addr("nats-0", 4222), "tls://" + d.addr("nats-1", 4222), "tls://" + d.addr("nats-2", 4222),
	}, ",")
	catalogJS := connectNATS(t, natsURL, dir, "catalog", "catalog")
	composerJS := connectNATS(t, natsURL, dir, "composer-1", "composer")

	// The example modules, published as the builder.
	fps := map[string]string{}
	eventually(t, "catalog serving", startTimeout, func() error {
		_, err := builder.ListModules(ctx, &catalogv1.ListModulesRequest{})
		return err
	})
	for _, m := range []string{"motd", "sshd", "ca-bundle", "node-exporter"} {
		res, err := publish.Dir(ctx, builder, filepath.Join(root, "examples", "modules", m), publishOptions(m))
		if err != nil {
			t.Fatal(err)
		}
		fps[m] = res.Fingerprint
	}

	// Node specs, as the operator, through whichever composer answers.
	eventually(t, "composers serving", startTimeout, func() error {
		for name, c := range composers {
			if _, err := c.ListStatus(ctx, &composerv1.ListStatusRequest{}); err != nil {
				return fmt.Errorf("%s: %w", name, err)
			}
		}
		return nil
	})
	for i, n := range nodes {
		if _, err := composers["composer-1"].PutNode(ctx, &composerv1.PutNodeRequest{Spec: nodeSpec(t, n, fmt.Sprintf("10.0.0.%d", i+1))}); err != nil {
			t.Fatalf("put node %s: %v", n, err)
		}
	}

	d.compose(startTimeout, "up", "-d", "node-ace", "node-bay", "node-cod")
	engines := map[string]nodeenginev1.NodeEngineServiceClient{}
	for _, n := range nodes {
		engines[n] = nodeenginev1.NewNodeEngineServiceClient(d.dial(d.addr("node-"+n, 7404), "pki", "operator-admin"))
	}
	all := &fleet{t: t, composers: composers, engines: engines}
	eventually(t, "fleet converged", convergeTimeout, func() error { return all.converged(ctx, nodes, fps) })
	t.Logf("converged %s after start", time.Since(began).Round(time.Second))

	revisions := watchRevisions(t, engines)
	acked := snapshot(t, catalogJS, composerJS, nodes)
	if v := permissionViolations(t, d); v != "" {
		t.Errorf("NATS refused a service's own traffic:\n%s", v)
	}

	// A backup of the converged fleet, taken as the deployment takes one:
	// the compose backup job on the private network, as the read-only NATS
	// user operator/backup. That user is refused writes.
	archive := d.backup(bin, natsURL)
	atBackup := maps.Clone(fps)
	checkBackupUser(t, natsURL, dir)

	// Faults: the lease holder, the NATS server leading the assignments
	// stream, and one engine's network.
	holder := leaseHolder(t, composerJS)
	leader := streamLeader(t, composerJS, "KV_"+natsx.BucketAssignments)
	survivor := "composer-1"
	if holder == survivor {
		survivor = "composer-2"
	}
	t.Logf("killing %s (lease holder) and %s (leader of the assignments stream); cutting node-cod off", holder, leader)
	holderID, leaderID, codID := d.container(holder), d.container(leader), d.container("node-cod")
	d.docker("kill", holderID)
	d.docker("kill", leaderID)
	d.docker("network", "disconnect", d.network(), codID)

	// A new version of motd while all three hold.
	changed := changedModule(t, filepath.Join(root, "examples", "modules", "motd"))
	eventually(t, "new motd published", startTimeout, func() error {
		res, err := publish.Dir(ctx, builder, changed, publishOptions("motd"))
		if err != nil {
			return err
		}
		if res.Fingerprint == fps["motd"] {
			return errors.New("the changed module has the old fingerprint")
		}
		fps["motd"] = res.Fingerprint
		return nil
	})
	live := &fleet{t: t, composers: map[string]composerv1.ComposerServiceClient{survivor: composers[survivor]}, engines: engines}
	eventually(t, "ace and bay converged on the new motd without "+holder+", "+leader+" and cod", convergeTimeout, func() error {
		return live.converged(ctx, []string{"ace", "bay"}, fps)
	})
	if err := live.converged(ctx, []string{"cod"}, fps); err == nil {
		t.Fatal("cod converged on the new motd while cut off the network")
	}
	ackedDuring := snapshot(t, catalogJS, composerJS, nodes)

	// Heal.
	d.docker("start", holderID)
	d.docker("start", leaderID)
	d.docker("network", "connect", d.network(), codID)
	eventually(t, "fleet converged after healing", convergeTimeout, func() error {
		return all.converged(ctx, nodes, fps)
	})

	// Nothing acknowledged was lost, no engine went back, and every node
	// has the new motd on disk.
	for _, s := range []map[string]map[string]kvRecord{acked, ackedDuring} {
		checkKept(t, s, catalogJS, composerJS)
	}
	revisions.stop()
	if v := revisions.regressions(); len(v) > 0 {
		t.Errorf("applied manifest revisions went backwards: %v", v)
	}
	for _, n := range nodes {
		motd := d.file(d.container("node-"+n), "/node/etc/motd")
		if !strings.Contains(motd, n) || !strings.Contains(motd, changedLine) {
			t.Errorf("node %s: /etc/motd is %q, want the new version naming the node", n, motd)
		}
	}
	if v := permissionViolations(t, d); v != "" {
		t.Errorf("NATS refused a service's own traffic:\n%s", v)
	}

	restoreIntoEmptyCluster(t, d, archive, natsURL, engines, all, atBackup)
	if v := permissionViolations(t, d); v != "" {
		t.Errorf("NATS refused a service's own traffic after the restore:\n%s", v)
	}
	checkLeastPrivilege(t, natsURL, dir, catalogJS, composerJS)
	t.Logf("whole run %s", time.Since(began).Round(time.Second))
}

// deploymentParent is where gen.sh writes the deployment: the test's temp
// dir, or with MESH_COMPOSE_KEEP=1 one that outlives the test, as a failed
// project is then left up.
func deploymentParent(t *testing.T) string {
	if os.Getenv("MESH_COMPOSE_KEEP") != "1" {
		return t.TempDir()
	}
	dir, err := os.MkdirTemp("", "mesh-compose-")
	if err != nil {
		t.Fatal(err)
	}
	return dir
}

// imagesDir is where deploy/images/build.sh puts binaries and image
// contexts (MESH_IMAGES_DIR, as the script reads it).
func imagesDir(root string) string {
	if d := os.Getenv("MESH_IMAGES_DIR"); d != "" {
		return d
	}
	return filepath.Join(root, "bin", "images")
}

// jobAttempts bounds how often the backup and restore jobs run before the
// test fails. Both read streams through R1 ordered consumers, which the
// servers place on any replica; in two of six runs here such a read got no
// message for 30 s although the stream held some and every replica was
// current (backup reading catalog-entries, restore reading nodes back),
// which fails the job. An operator's schedule runs the job again
// (mesh-backup.service restarts on failure, the CronJob retries); so does
// this test, logging each failure with the streams' cluster state.
const jobAttempts = 3

// backup runs the compose backup job and returns the archive it wrote,
// checked offline with the meshctl binary of bin.
func (d *deployment) backup(bin, natsURL string) string {
	d.t.Helper()
	var out string
	for attempt := 1; ; attempt++ {
		start := time.Now()
		var err error
		if out, err = d.tryCompose(5*time.Minute, "run", "--rm", "-T", "backup"); err == nil {
			d.t.Logf("backup job took %s:\n%s", time.Since(start).Round(100*time.Millisecond), out)
			break
		}
		d.t.Logf("backup job, attempt %d of %d: %v\n%s", attempt, jobAttempts, err, d.streamsState(natsURL))
		if attempt == jobAttempts {
			d.t.Fatal("the backup job failed every time")
		}
	}
	archives, _ := filepath.Glob(filepath.Join(d.dir, "backups", "mesh-backup-*.tar"))
	if len(archives) != 1 || !strings.Contains(out, "verified") {
		d.t.Fatalf("the backup job wrote %v:\n%s", archives, out)
	}
	ctx, cancel := context.WithTimeout(d.t.Context(), time.Minute)
	defer cancel()
	verified, err := run(ctx, os.Environ(), filepath.Join(bin, "meshctl"), "backup", "verify", archives[0])
	if err != nil || !strings.Contains(verified, ": OK (") {
		d.t.Fatalf("meshctl backup verify: %v\n%s", err, verified)
	}
	for _, bucket := range []string{natsx.BucketNodes, natsx.BucketAssignments, natsx.BucketCatalogEntries, natsx.ObjectStoreArtifacts} {
		if !regexp.MustCompile(`(?m)^\s+` + regexp.QuoteMeta(bucket) + `\s+[1-9]`).MatchString(verified) {
			d.t.Errorf("the archive holds nothing of %s:\n%s", bucket, verified)
		}
	}
	return archives[0]
}

// restore runs the compose restore job on an archive of the backups
// directory. An attempt after a failed one passes --force: the first may
// have written part of the archive (docs/backup.md: --force finishes an
// interrupted restore).
func (d *deployment) restore(archive, natsURL string) string {
	d.t.Helper()
	args := []string{"run", "--rm", "-T", "restore"}
	for attempt := 1; ; attempt++ {
		start := time.Now()
		out, err := d.tryCompose(5*time.Minute, append(args, "/backups/"+filepath.Base(archive))...)
		if err == nil {
			d.t.Logf("restore job took %s:\n%s", time.Since(start).Round(100*time.Millisecond), out)
			return out
		}
		d.t.Logf("restore job, attempt %d of %d: %v\n%s", attempt, jobAttempts, err, d.streamsState(natsURL))
		if attempt == jobAttempts || strings.Contains(out, "restore refused") {
			d.t.Fatal("the restore job failed every time")
		}
		args = []string{"run", "--rm", "-T", "restore", "--force"}
	}
}

// streamsState describes the cluster state of every stream an archive
// holds, as operator/backup sees it, for a failed job's log.
func (d *deployment) streamsState(natsURL string) string {
	ctx, cancel := context.WithTimeout(d.t.Context(), 30*time.Second)
	defer cancel()
	cert, key := pki.Paths(filepath.Join(d.dir, "backup"), "operator-backup")
	u, err := natsprobe.Connect(ctx, natsURL, "compose-test-state", filepath.Join(d.dir, "pki", pki.CACertFile), cert, key)
	if err != nil {
		return fmt.Sprintf("(stream state: %v)", err)
	}
	defer u.Close()
	var b strings.Builder
	for _, bucket := range backup.Buckets {
		name := "KV_" + bucket
		if bucket == natsx.ObjectStoreArtifacts || bucket == natsx.ObjectStoreObjects {
			name = "OBJ_" + bucket
		}
		fmt.Fprintf(&b, "  %s: ", name)
		s, err := u.JS.Stream(ctx, name)
		if err != nil {
			fmt.Fprintf(&b, "%v\n", err)
			continue
		}
		info := s.CachedInfo()
		fmt.Fprintf(&b, "%d messages, last %d", info.State.Msgs, info.State.LastSeq)
		if c := info.Cluster; c != nil {
			fmt.Fprintf(&b, ", leader %s", c.Leader)
			for _, r := range c.Replicas {
				fmt.Fprintf(&b, "; %s current %v lag %d active %s offline %v", r.Name, r.Current, r.Lag, r.Active.Round(time.Millisecond), r.Offline)
			}
		}
		b.WriteString("\n")
	}
	return b.String()
}

// operatorNATS connects to the cluster as operator/backup or
// operator/restore, with the certificate gen.sh put in backup/ or restore/.
func operatorNATS(t *testing.T, url, dir, op string) *natsprobe.User {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	cert, key := pki.Paths(filepath.Join(dir, op), "operator-"+op)
	u, err := natsprobe.Connect(ctx, url, "compose-test-"+op, filepath.Join(dir, "pki", pki.CACertFile), cert, key)
	if err != nil {
		t.Fatalf("NATS as operator/%s: %v", op, err)
	}
	t.Cleanup(u.Close)
	return u
}

// refused checks that NATS refuses u the publish to subject that do makes.
func refused(t *testing.T, u *natsprobe.User, subject string, do func(context.Context, jetstream.JetStream) error) {
	t.Helper()
	if err := u.Refused(t.Context(), 30*time.Second, subject, do); err != nil {
		t.Error(err)
	}
}

// checkBackupUser checks that operator/backup reads the truth and may not
// write it, delete it, or read what no archive holds.
func checkBackupUser(t *testing.T, url, dir string) {
	t.Helper()
	u := operatorNATS(t, url, dir, "backup")
	if _, err := u.JS.Stream(t.Context(), "KV_"+natsx.BucketAssignments); err != nil {
		t.Errorf("operator/backup cannot read the assignments: %v", err)
	}
	spec := "$KV." + natsx.BucketNodes + ".ace"
	refused(t, u, spec, func(ctx context.Context, js jetstream.JetStream) error {
		_, err := js.Publish(ctx, spec, []byte("overwritten by the backup user"))
		return err
	})
	refused(t, u, "$JS.API.STREAM.DELETE.KV_"+natsx.BucketAssignments, func(ctx context.Context, js jetstream.JetStream) error {
		return js.DeleteStream(ctx, "KV_"+natsx.BucketAssignments)
	})
	refused(t, u, "$JS.API.STREAM.UPDATE.KV_"+natsx.BucketNodes, func(ctx context.Context, js jetstream.JetStream) error {
		_, err := js.UpdateStream(ctx, jetstream.StreamConfig{Name: "KV_" + natsx.BucketNodes, Subjects: []string{"$KV." + natsx.BucketNodes + ".>"}, MaxMsgsPerSubject: 1})
		return err
	})
	refused(t, u, "$JS.API.STREAM.INFO.KV_"+natsx.BucketHaves, func(ctx context.Context, js jetstream.JetStream) error {
		_, err := js.Stream(ctx, "KV_"+natsx.BucketHaves)
		return err
	})
}

// restoreIntoEmptyCluster restores the archive as docs/backup.md
// "Restoring" says: the catalog, the signer and the composers stop, the
// three NATS servers come back with empty stores (a fresh cluster under
// the same names and certificates), the compose restore job writes the
// archive as operator/restore, and the services start again. The engines
// keep running with their state: each has applied manifests newer than the
// backup's (motd moved on after it), so the composer must re-sign above
// each one's high-water mark. The fleet must converge on the backup's
// intent (fps) with no engine refusing anything and no applied revision
// going back.
func restoreIntoEmptyCluster(t *testing.T, d *deployment, archive, natsURL string, engines map[string]nodeenginev1.NodeEngineServiceClient, all *fleet, fps map[string]string) {
	ctx := t.Context()
	began := time.Now()
	highWater := map[string]uint64{}
	for n, e := range engines {
		st, err := e.GetStatus(ctx, &nodeenginev1.GetStatusRequest{})
		if err != nil {
			t.Fatalf("engine %s: %v", n, err)
		}
		highWater[n] = st.GetHighWater()
	}
	revisions := watchRevisions(t, engines)

	d.compose(2*time.Minute, "stop", "-t", "10", "composer-1", "composer-2", "catalog", "signer")
	d.compose(2*time.Minute, "stop", "-t", "10", "nats-0", "nats-1", "nats-2")
	for i := range 3 {
		if err := os.RemoveAll(filepath.Join(d.dir, fmt.Sprintf("nats-%d", i), "data", "jetstream")); err != nil {
			t.Fatal(err)
		}
	}
	d.compose(startTimeout, "start", "nats-0", "nats-1", "nats-2")
	u := operatorNATS(t, natsURL, d.dir, "restore")
	eventually(t, "an empty JetStream cluster answering", startTimeout, func() error {
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		_, err := u.JS.Stream(cctx, "KV_"+natsx.BucketNodes)
		if errors.Is(err, jetstream.ErrStreamNotFound) {
			return nil
		}
		if err == nil {
			return errors.New("the nodes stream is still there")
		}
		return err
	})

	restoreStart := time.Now()
	if out := d.restore(archive, natsURL); !strings.Contains(out, "restored the backup") {
		t.Fatalf("the restore job:\n%s", out)
	}
	refused(t, u, "$JS.API.STREAM.DELETE.KV_"+natsx.BucketNodes, func(ctx context.Context, js jetstream.JetStream) error {
		return js.DeleteStream(ctx, "KV_"+natsx.BucketNodes)
	})
	if info, err := u.JS.Stream(ctx, "KV_"+natsx.BucketAssignments); err != nil || info.CachedInfo().Config.Replicas != 3 {
		t.Fatalf("the restored assignments: %v (want R3)", err)
	}

	d.compose(startTimeout, "start", "signer", "catalog", "composer-1", "composer-2")
	failed := map[string]bool{}
	eventually(t, "fleet converged on the backup's intent after the restore", convergeTimeout, func() error {
		for n, e := range engines {
			cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			st, err := e.GetStatus(cctx, &nodeenginev1.GetStatusRequest{})
			cancel()
			if err != nil {
				continue
			}
			for _, h := range st.GetHaves() {
				if a := h.GetAttempt(); a.GetState() == composerv1.AttemptState_ATTEMPT_STATE_FAILED {
					failed[fmt.Sprintf("%s %s: %s %s", n, h.GetModule(), a.GetReasonCode(), a.GetReason())] = true
				}
			}
		}
		if err := all.converged(ctx, nodes, fps); err != nil {
			return err
		}
		// Converged on the backup's intent means above each engine's
		// high-water mark, with the backed-up motd on disk: a status that
		// reads converged before the engines moved is not enough.
		for n, e := range engines {
			cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			st, err := e.GetStatus(cctx, &nodeenginev1.GetStatusRequest{})
			cancel()
			if err != nil {
				return fmt.Errorf("engine %s: %w", n, err)
			}
			if got := st.GetApplied().GetRevision(); got <= highWater[n] {
				return fmt.Errorf("engine %s still runs revision %d (high-water before the restore %d): %s", n, got, highWater[n], engineSummary(st))
			}
			if motd := d.file(d.container("node-"+n), "/node/etc/motd"); strings.Contains(motd, changedLine) {
				return fmt.Errorf("node %s still has the changed motd at revision %d", n, st.GetApplied().GetRevision())
			}
		}
		return nil
	})
	revisions.stop()
	if len(failed) > 0 {
		t.Errorf("engines reported failed attempts after the restore: %v", slices.Sorted(maps.Keys(failed)))
	}
	if v := revisions.regressions(); len(v) > 0 {
		t.Errorf("applied manifest revisions went backwards across the restore: %v", v)
	}
	for n, e := range engines {
		st, err := e.GetStatus(ctx, &nodeenginev1.GetStatusRequest{})
		if err != nil {
			t.Fatalf("engine %s: %v", n, err)
		}
		if got := st.GetApplied().GetRevision(); got <= highWater[n] {
			t.Errorf("engine %s applied revision %d after the restore, not above the %d it had before", n, got, highWater[n])
		}
		for _, line := range strings.Split(d.docker("logs", "--since", restoreStart.Format(time.RFC3339), d.container("node-"+n)), "\n") {
			if strings.Contains(line, `"msg":"refused"`) || strings.Contains(line, "REVISION_CONFLICT") {
				t.Errorf("engine %s after the restore: %s", n, line)
			}
		}
		motd := d.file(d.container("node-"+n), "/node/etc/motd")
		if !strings.Contains(motd, n) || strings.Contains(motd, changedLine) {
			t.Errorf("node %s: /etc/motd is %q after the restore, want the backed-up version", n, motd)
		}
	}
	t.Logf("restored into an empty cluster and converged in %s", time.Since(began).Round(time.Second))
}

// fleet asks composers and engines whether nodes converged.
type fleet struct {
	t         *testing.T
	composers map[string]composerv1.ComposerServiceClient
	engines   map[string]nodeenginev1.NodeEngineServiceClient
}

// converged returns nil when, as a composer sees it, every node runs every
// placed module at the fingerprint in fps with the wanted digest applied,
// and its engine reports the manifest revision the composer holds.
func (f *fleet) converged(ctx context.Context, nodes []string, fps map[string]string) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	var statuses []*composerv1.NodeStatus
	var errs []error
	for name, c := range f.composers {
		resp, err := c.ListStatus(ctx, &composerv1.ListStatusRequest{})
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", name, err))
			continue
		}
		statuses = resp.GetStatuses()
		break
	}
	if statuses == nil {
		return errors.Join(errs...)
	}
	for _, n := range nodes {
		i := slices.IndexFunc(statuses, func(s *composerv1.NodeStatus) bool { return s.GetNode() == n })
		if i < 0 {
			return fmt.Errorf("node %s has no status", n)
		}
		st := statuses[i]
		if !st.GetConverged() {
			return fmt.Errorf("node %s not converged: %s", n, summary(st))
		}
		for _, m := range placed[n] {
			j := slices.IndexFunc(st.GetModules(), func(ms *composerv1.ModuleStatus) bool { return ms.GetModule() == m })
			if j < 0 {
				return fmt.Errorf("node %s: no status of %s", n, m)
			}
			ms := st.GetModules()[j]
			if ms.GetWantedFingerprint() != fps[m] || ms.GetAppliedFingerprint() != fps[m] || ms.GetAppliedDigest() != ms.GetWantedDigest() {
				return fmt.Errorf("node %s: %s", n, summary(st))
			}
		}
		es, err := f.engines[n].GetStatus(ctx, &nodeenginev1.GetStatusRequest{})
		if err != nil {
			return fmt.Errorf("engine %s: %w", n, err)
		}
		if got := es.GetApplied().GetRevision(); got != st.GetManifestRevision() {
			return fmt.Errorf("engine %s applied manifest revision %d, the composer holds %d", n, got, st.GetManifestRevision())
		}
	}
	return nil
}

// engineSummary is what an engine says it runs, module by module.
func engineSummary(st *nodeenginev1.GetStatusResponse) string {
	var b strings.Builder
	fmt.Fprintf(&b, "applied r%d high-water %d", st.GetApplied().GetRevision(), st.GetHighWater())
	for _, h := range st.GetHaves() {
		fmt.Fprintf(&b, "; %s applied %s %s %s", h.GetModule(), short(h.GetApplied().GetFingerprint()), h.GetAttempt().GetState(), h.GetAttempt().GetReason())
	}
	return b.String()
}

func summary(st *composerv1.NodeStatus) string {
	var b strings.Builder
	fmt.Fprintf(&b, "manifest %d applied %d", st.GetManifestRevision(), st.GetAppliedRevision())
	if e := st.GetLastError(); e != "" {
		fmt.Fprintf(&b, ", last error %q", e)
	}
	for _, m := range st.GetModules() {
		fmt.Fprintf(&b, "; %s wanted %s applied %s %s %s", m.GetModule(), short(m.GetWantedFingerprint()), short(m.GetAppliedFingerprint()), m.GetState(), m.GetReason())
	}
	return b.String()
}

func short(fp string) string {
	if len(fp) > 12 {
		return fp[:12]
	}
	return fp
}

// changedLine is what the new version of motd adds.
const changedLine = "Changed by the compose test."

// changedModule copies a module directory and changes its content and
// version: a new source snapshot of the same module, hence a new
// fingerprint.
func changedModule(t *testing.T, src string) string {
	t.Helper()
	dst := filepath.Join(t.TempDir(), filepath.Base(src))
	if err := os.CopyFS(dst, os.DirFS(src)); err != nil {
		t.Fatal(err)
	}
	motd := filepath.Join(dst, "files", "motd")
	b, err := os.ReadFile(motd)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(motd, append(b, []byte("  "+changedLine+"\n")...), 0o644); err != nil {
		t.Fatal(err)
	}
	manifest := filepath.Join(dst, "module.yaml")
	m, err := os.ReadFile(manifest)
	if err != nil {
		t.Fatal(err)
	}
	m = bytes.Replace(m, []byte("version: 1.0.2"), []byte("version: 1.0.3"), 1)
	if err := os.WriteFile(manifest, m, 0o644); err != nil {
		t.Fatal(err)
	}
	return dst
}

// file reads one file out of a container (docker cp works without a shell
// in the image).
func (d *deployment) file(container, path string) string {
	d.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "docker", "cp", container+":"+path, "-")
	out, err := cmd.Output()
	if err != nil {
		d.t.Fatalf("docker cp %s:%s: %v", container, path, err)
	}
	tr := tar.NewReader(bytes.NewReader(out))
	if _, err := tr.Next(); err != nil {
		d.t.Fatalf("docker cp %s:%s: %v", container, path, err)
	}
	b, err := io.ReadAll(tr)
	if err != nil {
		d.t.Fatal(err)
	}
	return string(b)
}

// revisionWatch polls every engine's applied manifest revision and records
// any that is lower than one seen before. An engine that cannot be reached
// (cut off, restarting) is skipped for that round.
type revisionWatch struct {
	cancel context.CancelFunc
	done   chan struct{}
	mu     sync.Mutex
	seen   map[string]uint64
	back   []string
}

func watchRevisions(t *testing.T, engines map[string]nodeenginev1.NodeEngineServiceClient) *revisionWatch {
	ctx, cancel := context.WithCancel(context.Background())
	w := &revisionWatch{cancel: cancel, done: make(chan struct{}), seen: map[string]uint64{}}
	go func() {
		defer close(w.done)
		tick := time.NewTicker(500 * time.Millisecond)
		defer tick.Stop()
		for {
			for n, e := range engines {
				cctx, c := context.WithTimeout(ctx, 2*time.Second)
				st, err := e.GetStatus(cctx, &nodeenginev1.GetStatusRequest{})
				c()
				if err != nil {
					continue
				}
				rev := st.GetApplied().GetRevision()
				w.mu.Lock()
				if rev < w.seen[n] {
					w.back = append(w.back, fmt.Sprintf("%s: %d after %d", n, rev, w.seen[n]))
				}
				w.seen[n] = max(w.seen[n], rev)
				w.mu.Unlock()
			}
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	}()
	t.Cleanup(w.stop)
	return w
}

func (w *revisionWatch) stop() { w.cancel(); <-w.done }

func (w *revisionWatch) regressions() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.back)
}

// connectNATS connects to the cluster with a container's certificate, as
// that service's NATS user.
func connectNATS(t *testing.T, url, dir, container, basename string) jetstream.JetStream {
	t.Helper()
	var js jetstream.JetStream
	eventually(t, "NATS as "+basename, startTimeout, func() error {
		nc, j, err := natsx.Connect(t.Context(), natsConn(url, dir, container, basename))
		if err != nil {
			return err
		}
		t.Cleanup(nc.Close)
		js = j
		return nil
	})
	return js
}

func natsConn(url, dir, container, basename string) natsx.ConnConfig {
	return natsx.ConnConfig{
		URL: url, Name: "compose-test-" + basename,
		CAFile:   filepath.Join(dir, "pki", "ca.pem"),
		CertFile: filepath.Join(dir, container, basename+".pem"),
		KeyFile:  filepath.Join(dir, container, basename+"-key.pem"),
	}
}

// kvRecord is one key as JetStream acknowledged it.
type kvRecord struct {
	revision uint64
	value    []byte
}

// truth lists the buckets whose keys must survive (DESIGN.md §9's truth and
// what nodes run), by the service that may read them.
var truth = struct{ catalog, composer []string }{
	catalog:  []string{natsx.BucketCatalogEntries, natsx.BucketCatalogBuilds, natsx.BucketCatalogModules},
	composer: []string{natsx.BucketNodes, natsx.BucketAssignments, natsx.BucketKeysets},
}

// snapshot reads every key of the truth buckets. A key listing of an R3
// stream is an ordered consumer of its own, and right after a fault (or
// while keys are being rewritten) one listing can come back short: the read
// is retried until every bucket holds what a converged fleet must (every
// node's spec and assignment, the catalog's entries), each failed attempt
// logged with the stream's own count of messages and subjects.
func snapshot(t *testing.T, catalogJS, composerJS jetstream.JetStream, nodes []string) map[string]map[string]kvRecord {
	t.Helper()
	var out map[string]map[string]kvRecord
	eventually(t, "truth buckets read", time.Minute, func() error {
		var err error
		out, err = readTruth(t.Context(), catalogJS, composerJS, nodes)
		if err != nil {
			t.Logf("reading the truth buckets: %v (retried)", err)
		}
		return err
	})
	return out
}

func readTruth(ctx context.Context, catalogJS, composerJS jetstream.JetStream, nodes []string) (map[string]map[string]kvRecord, error) {
	out := map[string]map[string]kvRecord{}
	read := func(js jetstream.JetStream, bucket string) error {
		ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		kv, err := js.KeyValue(ctx, bucket)
		if err != nil {
			return fmt.Errorf("bucket %s: %w", bucket, err)
		}
		keys, err := kv.Keys(ctx)
		if err != nil && !errors.Is(err, jetstream.ErrNoKeysFound) {
			return fmt.Errorf("bucket %s keys: %w%s", bucket, err, streamState(ctx, js, bucket))
		}
		out[bucket] = map[string]kvRecord{}
		for _, k := range keys {
			e, err := kv.Get(ctx, k)
			if err != nil {
				return fmt.Errorf("bucket %s key %s: %w", bucket, k, err)
			}
			out[bucket][k] = kvRecord{revision: e.Revision(), value: e.Value()}
		}
		return nil
	}
	for _, b := range truth.catalog {
		if err := read(catalogJS, b); err != nil {
			return nil, err
		}
	}
	for _, b := range truth.composer {
		if err := read(composerJS, b); err != nil {
			return nil, err
		}
	}
	if len(out[natsx.BucketCatalogEntries]) == 0 {
		return nil, fmt.Errorf("bucket %s lists no keys in a converged fleet%s", natsx.BucketCatalogEntries, streamState(ctx, catalogJS, natsx.BucketCatalogEntries))
	}
	for _, b := range []string{natsx.BucketNodes, natsx.BucketAssignments} {
		for _, n := range nodes {
			if _, ok := out[b][n]; !ok {
				return nil, fmt.Errorf("bucket %s lists %d keys, not node %s%s", b, len(out[b]), n, streamState(ctx, composerJS, b))
			}
		}
	}
	return out, nil
}

// streamState is the stream's own account of a bucket, for an error.
func streamState(ctx context.Context, js jetstream.JetStream, bucket string) string {
	st, err := js.Stream(ctx, "KV_"+bucket)
	if err != nil {
		return fmt.Sprintf(" (stream info: %v)", err)
	}
	info, err := st.Info(ctx)
	if err != nil {
		return fmt.Sprintf(" (stream info: %v)", err)
	}
	leader := "none"
	if info.Cluster != nil {
		leader = info.Cluster.Leader
	}
	return fmt.Sprintf(" (the stream holds %d messages on %d subjects, leader %s)", info.State.Msgs, info.State.NumSubjects, leader)
}

// immutable buckets never change a key once written; the others may only
// move a key forward.
func immutable(bucket, key string) bool {
	switch bucket {
	case natsx.BucketCatalogEntries, natsx.BucketCatalogBuilds:
		return true
	case natsx.BucketCatalogModules:
		return strings.Contains(key, ".") // <module>.<seq> history keys
	}
	return false
}

// checkKept checks that every key of a snapshot is still there, at its
// revision or a later one, with the same bytes where keys are immutable.
func checkKept(t *testing.T, snap map[string]map[string]kvRecord, catalogJS, composerJS jetstream.JetStream) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	n := 0
	for bucket, keys := range snap {
		js := composerJS
		if slices.Contains(truth.catalog, bucket) {
			js = catalogJS
		}
		kv, err := js.KeyValue(ctx, bucket)
		if err != nil {
			t.Fatalf("bucket %s: %v", bucket, err)
		}
		for k, was := range keys {
			e, err := kv.Get(ctx, k)
			if err != nil {
				t.Errorf("%s/%s (revision %d, acknowledged) is gone: %v", bucket, k, was.revision, err)
				continue
			}
			switch {
			case e.Revision() < was.revision:
				t.Errorf("%s/%s went back from revision %d to %d", bucket, k, was.revision, e.Revision())
			case immutable(bucket, k) && !bytes.Equal(e.Value(), was.value):
				t.Errorf("%s/%s changed", bucket, k)
			}
			n++
		}
	}
	t.Logf("%d acknowledged keys of %d buckets kept", n, len(snap))
}

// leaseHolder reads who holds the composer lease.
func leaseHolder(t *testing.T, js jetstream.JetStream) string {
	t.Helper()
	var holder string
	eventually(t, "lease holder known", startTimeout, func() error {
		kv, err := js.KeyValue(t.Context(), natsx.BucketComposerLease)
		if err != nil {
			return err
		}
		e, err := kv.Get(t.Context(), natsx.KeyLeaseLeader)
		if err != nil {
			return err
		}
		var rec struct {
			Holder string `json:"holder"`
		}
		if err := json.Unmarshal(e.Value(), &rec); err != nil {
			return err
		}
		if rec.Holder != "composer-1" && rec.Holder != "composer-2" {
			return fmt.Errorf("lease held by %q", rec.Holder)
		}
		holder = rec.Holder
		return nil
	})
	return holder
}

// streamLeader names the NATS server leading a stream.
func streamLeader(t *testing.T, js jetstream.JetStream, stream string) string {
	t.Helper()
	s, err := js.Stream(t.Context(), stream)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if info.Cluster == nil || !strings.HasPrefix(info.Cluster.Leader, "nats-") {
		t.Fatalf("stream %s has no leader: %+v", stream, info.Cluster)
	}
	if len(info.Cluster.Replicas) != 2 || info.Config.Replicas != 3 {
		t.Fatalf("stream %s has %d replicas besides its leader, config %d: want R3", stream, len(info.Cluster.Replicas), info.Config.Replicas)
	}
	return info.Cluster.Leader
}

// permissionViolations returns the NATS servers' log lines saying a client
// was refused something.
func permissionViolations(t *testing.T, d *deployment) string {
	t.Helper()
	var b strings.Builder
	for _, s := range []string{"nats-0", "nats-1", "nats-2"} {
		out, err := d.tryCompose(time.Minute, "logs", "--no-color", s)
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(out, "\n") {
			// The operators' users are refused on purpose (checkBackupUser).
			if strings.Contains(line, "/operator/backup") || strings.Contains(line, "/operator/restore") {
				continue
			}
			if strings.Contains(line, "Violation") || strings.Contains(line, "Authorization Error") {
				b.WriteString(line + "\n")
			}
		}
	}
	return b.String()
}

// checkLeastPrivilege checks that each service's NATS user reaches only its
// own buckets and that a node's certificate, of the same CA, is no NATS
// user at all.
func checkLeastPrivilege(t *testing.T, url, dir string, catalogJS, composerJS jetstream.JetStream) {
	t.Helper()
	refused := func(who string, js jetstream.JetStream, bucket string) {
		ctx, cancel := context.WithTimeout(t.Context(), 3*time.Second)
		defer cancel()
		if _, err := js.KeyValue(ctx, bucket); err == nil {
			t.Errorf("the %s's NATS user reads bucket %s", who, bucket)
		}
	}
	refused("composer", composerJS, natsx.BucketCatalogEntries)
	refused("composer", composerJS, natsx.BucketCatalogModules)
	refused("catalog", catalogJS, natsx.BucketNodes)
	refused("catalog", catalogJS, natsx.BucketAssignments)
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if nc, _, err := natsx.Connect(ctx, natsConn(url, dir, "node-ace", "node-ace")); err == nil {
		nc.Close()
		t.Error("a node's certificate connected to NATS")
	}
}
