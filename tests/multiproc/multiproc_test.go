// Package multiproc runs the mesh as deploy/ runs it — a nats-server process
// configured as deploy/nats's (TLS 1.3, certificates mapped to per-service
// users) and each service its own process, built from this tree,
// configured by YAML files, over loopback mTLS with certificates and keys
// made by meshctl — and drives it with the meshctl binary as a builder and
// an operator would.
package multiproc

import (
	"context"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"mesh.dev/internal/natsx"
	"mesh.dev/tests/internal/natsprobe"
	"mesh.dev/tests/internal/procmesh"
)

func TestMain(m *testing.M) { os.Exit(procmesh.Main(m)) }

// convergeTimeout bounds each convergence; the fleet usually converges in
// seconds, but this machine may be busy with other tests.
const convergeTimeout = 3 * time.Minute

// TestMultiProcess registers the example modules, places them on three
// nodes, approves the first placements MANUAL modules hold, converges, then
// publishes an edited module and converges again, checking the files each
// engine wrote into its root; then backs JetStream up and restores it as
// the operators' NATS users of deploy/nats (backupAndRestore).
func TestMultiProcess(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the whole mesh as processes")
	}
	start := time.Now()
	m := procmesh.Start(t, procmesh.Options{})
	t.Logf("mesh started in %.1fs: nats %s, catalog %s, signer %s, composer %s", time.Since(start).Seconds(), m.NATSURL, m.Catalog, m.Signer, m.Composer)

	// Register the example modules as the builder, exactly as
	// examples/modules/publish.sh does.
	dirs := procmesh.ExampleModuleDirs(t)
	published := m.Publish(nil, dirs...)
	for module, p := range published {
		if !p.EntryCreated || !p.BuildRecorded || !p.Registered {
			t.Errorf("publish %s: %+v, want entry, DONE build and registration", module, p)
		}
	}
	if _, ok := published["node-exporter"]; !ok || published["node-exporter"].Uploaded == 0 {
		t.Errorf("publish node-exporter uploaded no artifact: %+v", published["node-exporter"])
	}
	// Publishing again changes nothing.
	for module, p := range m.Publish(nil, dirs...) {
		if p.EntryCreated || p.Registered || p.Fingerprint != published[module].Fingerprint {
			t.Errorf("second publish of %s: %+v, want no change at %s", module, p, published[module].Fingerprint)
		}
	}

	// Place them as the operator, approve the first placements the MANUAL
	// modules hold and converge.
	m.PutNodes()
	approved := m.ApproveFirstPlacements(convergeTimeout)
	if got := strings.Join(approved["postgres"], ","); got != m.Engines[0].Node {
		t.Errorf("first placement of postgres approved on %q, want %s (MANUAL holds it)", got, m.Engines[0].Node)
	}
	if got := len(approved["users"]); got != len(m.Engines) {
		t.Errorf("first placement of users approved on %d nodes, want %d (MANUAL holds it)", got, len(m.Engines))
	}
	m.WaitFor("3 engines converged", convergeTimeout, m.Converged)
	if out := m.Meshctl(procmesh.Operator, "status", "--wait", "--timeout", "1m"); !strings.Contains(out, "3/3 nodes converged") {
		t.Errorf("meshctl status --wait printed:\n%s", out)
	}
	for i, e := range m.Engines {
		wantFile(t, e.Root, "etc/motd", e.Node)
		wantFile(t, e.Root, "etc/ssh/sshd_config", "10.0.0.")
		_, err := os.Stat(filepath.Join(e.Root, "etc/postgresql/16/main/postgresql.conf"))
		if runsPostgres := i == 0; runsPostgres != (err == nil) {
			t.Errorf("%s: postgresql.conf present %v, want %v", e.Node, err == nil, runsPostgres)
		}
	}

	// Every process serves Prometheus metrics on its own port.
	for name, addr := range m.Metrics {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		body, err := procmesh.HTTPGet(ctx, "http://"+addr+"/metrics")
		cancel()
		if err != nil || !strings.Contains(body, "go_goroutines") {
			t.Errorf("%s /metrics: %v", name, err)
		}
	}

	// Change a module: publish an edited copy of motd (policy AUTO), and
	// converge again with every engine applying it.
	edited := filepath.Join(t.TempDir(), "motd")
	procmesh.CopyDir(t, filepath.Join(filepath.Dir(dirs[0]), "motd"), edited)
	const line = "  changed by the multi-process end-to-end test"
	appendFile(t, filepath.Join(edited, "files", "motd"), line+"\n")
	changed := m.Publish(nil, edited)["motd"]
	if !changed.Registered || changed.Fingerprint == published["motd"].Fingerprint {
		t.Fatalf("publish of the edited motd: %+v, want a new registration", changed)
	}
	m.WaitFor("3 engines converged on the edited motd", convergeTimeout, m.ModuleAt("motd", changed.Fingerprint))
	for _, e := range m.Engines {
		wantFile(t, e.Root, "etc/motd", line)
		wantFile(t, e.Root, "etc/motd", e.Node)
	}
	sts, err := m.Statuses()
	if err != nil {
		t.Fatal(err)
	}
	for _, st := range sts {
		for _, ms := range st.GetModules() {
			if ms.GetModule() != "motd" && ms.GetAppliedFingerprint() != published[ms.GetModule()].Fingerprint {
				t.Errorf("%s: %s moved to %s, only motd changed", st.GetNode(), ms.GetModule(), ms.GetAppliedFingerprint())
			}
		}
	}

	backupAndRestore(t, m)

	// The signer's audit log is an intact hash chain once it stopped.
	if err := m.Proc("mesh-signer").Stop(); err != nil {
		t.Fatal(err)
	}
	out, err := procmesh.Run("", nil, m.Bin.Signer, "audit", "verify", "--state-dir", filepath.Join(m.Dir, "signer", "state"))
	if err != nil || !strings.Contains(out, "chain intact") {
		t.Errorf("mesh-signer audit verify: %v\n%s", err, out)
	}
	t.Logf("multi-process end to end in %.1fs", time.Since(start).Seconds())
}

func wantFile(t *testing.T, root, rel, contains string) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, rel))
	if err != nil {
		t.Errorf("%v", err)
		return
	}
	if !strings.Contains(string(b), contains) {
		t.Errorf("%s holds %q, want it to contain %q", filepath.Join(root, rel), b, contains)
	}
}

func appendFile(t *testing.T, path, s string) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString(s); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
}

// backupAndRestore backs JetStream up as the backup operator's NATS user
// (deploy/nats), verifies the archive, checks that user can neither write
// nor delete nor read beyond the truth, and restores the archive into a
// second, empty nats-server as the restore operator's user, which may not
// delete a stream either.
func backupAndRestore(t *testing.T, m *procmesh.Mesh) {
	t.Helper()
	archive := filepath.Join(t.TempDir(), "mesh-backup.tar")
	out, err := procmesh.Run("", nil, m.Bin.Meshctl, append([]string{"backup", "--out", archive}, m.NATSFlags(m.NATSURL, "operator-backup")...)...)
	if err != nil || !strings.Contains(out, "verified") {
		t.Fatalf("meshctl backup as operator/backup: %v\n%s", err, out)
	}
	out, err = procmesh.Run("", nil, m.Bin.Meshctl, "backup", "verify", archive)
	if err != nil || !strings.Contains(out, ": OK (") {
		t.Fatalf("meshctl backup verify: %v\n%s", err, out)
	}
	for _, bucket := range []string{natsx.BucketNodes, natsx.BucketAssignments, natsx.BucketCatalogEntries, natsx.ObjectStoreArtifacts} {
		if !regexp.MustCompile(`(?m)^\s+` + regexp.QuoteMeta(bucket) + `\s+[1-9]`).MatchString(out) {
			t.Errorf("the archive holds nothing of %s:\n%s", bucket, out)
		}
	}

	backupUser := connectNATS(t, m, m.NATSURL, "operator-backup")
	spec := "$KV." + natsx.BucketNodes + "." + m.Engines[0].Node
	refused(t, backupUser, spec, func(ctx context.Context, js jetstream.JetStream) error {
		_, err := js.Publish(ctx, spec, []byte("overwritten"))
		return err
	})
	refused(t, backupUser, "$JS.API.STREAM.DELETE.KV_"+natsx.BucketNodes, func(ctx context.Context, js jetstream.JetStream) error {
		return js.DeleteStream(ctx, "KV_"+natsx.BucketNodes)
	})
	refused(t, backupUser, "$JS.API.STREAM.INFO.KV_"+natsx.BucketHaves, func(ctx context.Context, js jetstream.JetStream) error {
		_, err := js.Stream(ctx, "KV_"+natsx.BucketHaves)
		return err
	})
	if _, err := backupUser.JS.Stream(t.Context(), "KV_"+natsx.BucketNodes); err != nil {
		t.Errorf("backup cannot read the nodes stream: %v", err)
	}

	url, _ := m.StartNATS("nats-restored")
	out, err = procmesh.Run("", nil, m.Bin.Meshctl, append([]string{"restore"}, append(m.NATSFlags(url, "operator-restore"), archive)...)...)
	if err != nil || !strings.Contains(out, "restored the backup") {
		t.Fatalf("meshctl restore as operator/restore into an empty nats-server: %v\n%s", err, out)
	}
	restoreUser := connectNATS(t, m, url, "operator-restore")
	refused(t, restoreUser, "$JS.API.STREAM.DELETE.KV_"+natsx.BucketAssignments, func(ctx context.Context, js jetstream.JetStream) error {
		return js.DeleteStream(ctx, "KV_"+natsx.BucketAssignments)
	})
	st, err := restoreUser.JS.Stream(t.Context(), "KV_"+natsx.BucketAssignments)
	if err != nil {
		t.Fatalf("restored assignments: %v", err)
	}
	if n := st.CachedInfo().State.NumSubjects; n != uint64(len(m.Engines)) {
		t.Errorf("the restored assignments hold %d keys, want one per node (%d)", n, len(m.Engines))
	}
	// The servers refused only what was tried above, and only to the
	// operators (procmesh fails the test for any refusal of a service).
	refusals := m.NATSRefusals()
	for _, line := range refusals {
		if !strings.Contains(line, "/operator/backup") && !strings.Contains(line, "/operator/restore") {
			t.Errorf("NATS refused: %s", line)
		}
	}
	t.Logf("NATS refused the operators %d times, as tried:\n%s", len(refusals), strings.Join(refusals, "\n"))
}

// connectNATS connects to a nats-server of the mesh with an identity's
// certificate, as the NATS user it maps to.
func connectNATS(t *testing.T, m *procmesh.Mesh, url, basename string) *natsprobe.User {
	t.Helper()
	ca, cert, key := m.CertFiles(basename)
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	u, err := natsprobe.Connect(ctx, url, "multiproc-"+basename, ca, cert, key)
	if err != nil {
		t.Fatalf("NATS as %s: %v", basename, err)
	}
	t.Cleanup(u.Close)
	return u
}

// refused checks that the server refuses u the publish to subject that do
// makes.
func refused(t *testing.T, u *natsprobe.User, subject string, do func(context.Context, jetstream.JetStream) error) {
	t.Helper()
	if err := u.Refused(t.Context(), 20*time.Second, subject, do); err != nil {
		t.Error(err)
	}
}
