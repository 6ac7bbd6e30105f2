package main

import (
	"context"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protojson"

	"mesh.dev/cmd/meshctl/onebox"
	"mesh.dev/internal/names"
	composerv1 "mesh.dev/proto/mesh/composer/v1"
)

// composerFixture is a catalog, a signer and a composer in this process
// (no node engines) with the example modules published, and the operator's
// certificate files as meshctl's flags expect.
type composerFixture struct {
	m   *onebox.Mesh
	dir string
	// fps are the example modules' registered fingerprints.
	fps map[string]string
}

func startComposer(t *testing.T, ctx context.Context) *composerFixture {
	t.Helper()
	dir := t.TempDir()
	m, err := onebox.Start(ctx, onebox.Options{DataDir: filepath.Join(dir, "mesh")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		m.Stop()
		if err := m.Err(); err != nil {
			t.Errorf("the mesh ended with %v", err)
		}
	})
	published, err := m.PublishModules(ctx, filepath.Join("..", "..", "examples", "modules"))
	if err != nil {
		t.Fatal(err)
	}
	f := &composerFixture{m: m, dir: dir, fps: map[string]string{}}
	for _, p := range published {
		f.fps[p.Module] = p.Fingerprint
	}
	return f
}

// run runs meshctl as the operator admin against the fixture's composer.
// The commands share package-level flag state, so these tests do not run
// in parallel.
func (f *composerFixture) run(t *testing.T, ctx context.Context, args ...string) (string, error) {
	t.Helper()
	return meshctl(ctx, append([]string{"--certs-dir", f.m.CertsDir, "--identity", "operator-admin", "--composer", f.m.Composer}, args...)...)
}

func (f *composerFixture) must(t *testing.T, ctx context.Context, args ...string) string {
	t.Helper()
	out, err := f.run(t, ctx, args...)
	if err != nil {
		t.Fatalf("meshctl %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return out
}

// specFile writes a node spec file as an operator would.
func (f *composerFixture) specFile(t *testing.T, name, yaml string) string {
	t.Helper()
	p := filepath.Join(f.dir, name+".yaml")
	if err := os.WriteFile(p, []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// committed waits until the composer committed an assignment of each node
// (or recorded a compose error), and returns their statuses.
func (f *composerFixture) committed(t *testing.T, ctx context.Context, nodes ...string) map[string]*composerv1.NodeStatus {
	t.Helper()
	out := map[string]*composerv1.NodeStatus{}
	err := waitUntil(ctx, "nodes composed", func(ctx context.Context) (bool, string) {
		sts, err := f.m.Status(ctx)
		if err != nil {
			return false, err.Error()
		}
		for _, st := range sts {
			out[st.GetNode()] = st
		}
		for _, n := range nodes {
			if st := out[n]; st.GetManifestRevision() == 0 && st.GetLastError() == "" {
				return false, n + " not composed yet"
			}
		}
		return true, ""
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// lines returns the lines of out that match a pattern.
func lines(out, pattern string) []string {
	re := regexp.MustCompile(pattern)
	var got []string
	for _, l := range strings.Split(out, "\n") {
		if re.MatchString(l) {
			got = append(got, l)
		}
	}
	return got
}

// TestNodeCommands covers meshctl node put, get, ls (with a selector),
// declaration and rm against a real composer, as an operator reads them.
func TestNodeCommands(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	f := startComposer(t, ctx)
	web := f.specFile(t, "web", `node: web-1
labels: {env: dev, role: web}
facts: {ip: 10.0.0.7}
modules:
  - module: motd
  - module: sshd
    params: {port: 2222}
`)
	db := f.specFile(t, "db", `node: db-1
labels: {env: dev, role: db}
modules:
  - module: motd
`)
	if out := f.must(t, ctx, "node", "put", web, db); out != "node web-1 at revision 1\nnode db-1 at revision 2\n" {
		t.Errorf("node put said %q", out)
	}
	out, err := f.run(t, ctx, "node", "put", "--create", web)
	if err == nil || !strings.Contains(err.Error(), web) {
		t.Errorf("node put --create of an existing node: %v\n%s", err, out)
	}

	// get: the spec as stored, in protojson.
	got := &composerv1.GetNodeResponse{}
	if err := protojson.Unmarshal([]byte(f.must(t, ctx, "node", "get", "web-1")), got); err != nil {
		t.Fatal(err)
	}
	if s := got.GetSpec(); s.GetNode() != "web-1" || s.GetLabels()["role"] != "web" || len(s.GetModules()) != 2 ||
		s.GetModules()[1].GetParams().GetFields()["port"].GetNumberValue() != 2222 || got.GetRevision() != 1 {
		t.Errorf("node get: %v", got)
	}
	if out, err := f.run(t, ctx, "node", "get", "nobody"); err == nil || !strings.Contains(err.Error(), "NotFound") {
		t.Errorf("node get of an unknown node: %v\n%s", err, out)
	}

	// ls: one line per node, labels and modules.
	ls := f.must(t, ctx, "node", "ls")
	if want := []string{`^NODE\s+LABELS\s+MODULES$`, `^db-1\s+env=dev,role=db\s+motd$`, `^web-1\s+env=dev,role=web\s+motd,sshd$`}; len(lines(ls, `\S`)) != 3 ||
		len(lines(ls, want[0])) != 1 || len(lines(ls, want[1])) != 1 || len(lines(ls, want[2])) != 1 {
		t.Errorf("node ls:\n%s", ls)
	}
	if sel := f.must(t, ctx, "node", "ls", "-l", "role=db"); len(lines(sel, `^db-1\s`)) != 1 || len(lines(sel, `^web-1\s`)) != 0 {
		t.Errorf("node ls -l role=db:\n%s", sel)
	}

	// declaration: the modules' resources rendered for the node (its
	// facts and params), ids prefixed, at the registered fingerprints.
	decl := &composerv1.Declaration{}
	if err := protojson.Unmarshal([]byte(f.must(t, ctx, "node", "declaration", "web-1")), decl); err != nil {
		t.Fatal(err)
	}
	byID := map[string]string{}
	for _, r := range decl.GetResources() {
		byID[r.GetId()] = string(r.GetInline())
	}
	if c := byID["sshd:config"]; !strings.Contains(c, "ListenAddress 10.0.0.7\nPort 2222\n") || !strings.Contains(c, "on web-1:") {
		t.Errorf("sshd:config rendered as %q", c)
	}
	if _, ok := byID["motd:motd"]; !ok || decl.GetFingerprints()["sshd"] != f.fps["sshd"] {
		t.Errorf("declaration ids %v, fingerprints %v", byID, decl.GetFingerprints())
	}

	// rm: the spec goes, and with it everything derived.
	f.committed(t, ctx, "db-1")
	if out := f.must(t, ctx, "node", "rm", "db-1"); out != "node db-1 deleted\n" {
		t.Errorf("node rm said %q", out)
	}
	if out, err := f.run(t, ctx, "node", "rm", "db-1"); err == nil || !strings.Contains(err.Error(), "no node spec of db-1") {
		t.Errorf("node rm of a deleted node: %v\n%s", err, out)
	}
	if err := waitUntil(ctx, "db-1's derived state removed", func(ctx context.Context) (bool, string) {
		out, err := f.run(t, ctx, "compositions", "db-1")
		if err != nil {
			// Nothing left of a node with no spec is NOT_FOUND.
			return strings.Contains(err.Error(), "no node spec of db-1, and no composition of it is kept"), err.Error()
		}
		return len(lines(out, `^db-1\.`)) == 0, out
	}); err != nil {
		t.Error(err)
	}
	if ls := f.must(t, ctx, "node", "ls"); len(lines(ls, `^db-1\s`)) != 0 {
		t.Errorf("node ls after rm:\n%s", ls)
	}
}

// TestPlanApplyCompositionsStatus covers meshctl plan (-f), apply,
// compositions and status --why against a real composer: what a plan shows
// per node, applying a plan whose inputs did not move and one whose did,
// the compositions a node holds, and why nodes are not converged.
func TestPlanApplyCompositionsStatus(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	f := startComposer(t, ctx)
	web := f.specFile(t, "web", `node: web-1
labels: {role: web}
facts: {ip: 10.0.0.7}
modules:
  - {module: motd}
  - {module: sshd, params: {port: 22}}
`)
	// postgres is MANUAL: its first placement waits for an approval.
	db := f.specFile(t, "db", `node: db-1
labels: {role: db}
facts: {ip: 10.0.0.8}
modules:
  - {module: motd}
  - {module: postgres, params: {max_connections: 100, shared_buffers: 128MB, clients: [10.0.0.0/24]}}
`)
	// sshd needs the fact ip: a compose error naming node, module and
	// resource.
	bad := f.specFile(t, "bad", `node: bad-1
modules:
  - {module: sshd, params: {port: 22}}
`)
	f.must(t, ctx, "node", "put", web, db, bad)
	f.committed(t, ctx, "web-1", "db-1", "bad-1")

	motdKey := "web-1.motd." + names.FingerprintHex(f.fps["motd"])
	sshdKey := "web-1.sshd." + names.FingerprintHex(f.fps["sshd"])
	pgKey := "db-1.postgres." + names.FingerprintHex(f.fps["postgres"])

	// plan: the nodes' compositions with their judgements, the holds, and
	// the input revisions read; nothing to write once composed.
	planFile := filepath.Join(f.dir, "plan.json")
	plan := f.must(t, ctx, "plan", "-f", planFile, "web-1", "db-1")
	for _, want := range []string{
		`^node web-1: no change \(spec r1, haves r0, assignment r\d+\)$`,
		`^    ` + regexp.QuoteMeta(motdKey) + `\s+sha256:[0-9a-f]{12}\s+NEW\s+new: 1 path$`,
		`^    ` + regexp.QuoteMeta(sshdKey) + `\s+sha256:[0-9a-f]{12}\s+NEW\s+new: 4 paths$`,
		`^    web-1\.node\s+sha256:[0-9a-f]{12}\s+NEW\s+new: 0 paths$`,
		`^node db-1: no change \(spec r2, haves r0, assignment r\d+\)$`,
		`^  hold postgres sha256:[0-9a-f]{12}: policy MANUAL \(from manifest\) holds NEW until approved: a major version needs pg_upgrade`,
	} {
		if len(lines(plan, want)) != 1 {
			t.Errorf("plan has no line %s:\n%s", want, plan)
		}
	}
	if len(lines(plan, `^\s+\*`)) != 0 {
		t.Errorf("a plan of composed nodes marks writes:\n%s", plan)
	}
	saved := &composerv1.PlanResponse{}
	b, err := os.ReadFile(planFile)
	if err != nil {
		t.Fatal(err)
	}
	if err := protojson.Unmarshal(b, saved); err != nil || len(saved.GetNodes()) != 2 || saved.GetNodes()[0].GetNode() != "db-1" ||
		saved.GetNodes()[1].GetInputs().GetSpecRevision() != 1 {
		t.Fatalf("plan -f wrote %v (%v)", saved, err)
	}

	// apply: a plan whose inputs did not move is applied.
	if out := f.must(t, ctx, "apply", planFile); out != "applied db-1\napplied web-1\n" {
		t.Errorf("apply said %q", out)
	}
	// db-1's spec moves: the plan is stale for it, and apply fails.
	f.must(t, ctx, "node", "put", f.specFile(t, "db", `node: db-1
labels: {role: db, rack: r1}
facts: {ip: 10.0.0.8}
modules:
  - {module: motd}
  - {module: postgres, params: {max_connections: 100, shared_buffers: 128MB, clients: [10.0.0.0/24]}}
`))
	out, err := f.run(t, ctx, "apply", planFile)
	if err == nil || err.Error() != "some nodes were not applied" {
		t.Errorf("apply of a stale plan: %v", err)
	}
	if len(lines(out, `^applied web-1$`)) != 1 ||
		len(lines(out, `^stale db-1: the plan's inputs moved for node db-1: planned spec r2, .*; now r4, .* \(plan again\)$`)) != 1 {
		t.Errorf("apply of a stale plan said:\n%s", out)
	}

	// compositions: what a node holds, wanted or not, with judgements.
	comps := f.must(t, ctx, "compositions", "db-1")
	for _, want := range []string{
		`^KEY\s+DIGEST\s+WANTED\s+WRITTEN\s+JUDGEMENT\s+WORDS$`,
		`^db-1\.motd\.[0-9a-f]{64}\s+sha256:[0-9a-f]{12}\s+true\s+\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ\s+NEW\s+new: 1 path$`,
		// The held first placement is written, not wanted.
		`^` + regexp.QuoteMeta(pgKey) + `\s+sha256:[0-9a-f]{12}\s+false\s+\S+\s+NEW\s+new: \d+ paths$`,
		`^db-1\.node\s+sha256:[0-9a-f]{12}\s+true\s`,
	} {
		if len(lines(comps, want)) != 1 {
			t.Errorf("compositions has no line %s:\n%s", want, comps)
		}
	}

	// status --why: every node, and why none is converged.
	f.committed(t, ctx, "db-1")
	why := f.must(t, ctx, "status", "--why")
	for _, want := range []string{
		`^NODE\s+MANIFEST\s+MODULES\s+STATE\s+LAST SEEN$`,
		`^web-1\s+r\d+/r0\s+0/3 applied\s+NEVER SEEN\s+never$`,
		`^bad-1\s+r0/r0\s+0/0 applied\s+ERROR\s+never$`,
		`^bad-1:$`,
		`^  compose error: node bad-1, module sshd, resource sshd:config: .*map has no entry for key "ip"$`,
		`^web-1:$`,
		`^  manifest r\d+ is wanted, the engine applied r0$`,
		`^  motd: wanted ` + names.FingerprintHex(f.fps["motd"])[:12] + `, applied -; the engine has not reported this module yet$`,
		`^  node: wanted sha256:[0-9a-f]{12}, applied -; the engine has not reported this module yet$`,
		`^  postgres: wanted -, applied -; held: policy MANUAL \(from manifest\) holds NEW until approved: a major version`,
		`^  the node's engine has never connected$`,
	} {
		if len(lines(why, want)) == 0 {
			t.Errorf("status --why has no line %s:\n%s", want, why)
		}
	}
	// Without --why only the table.
	if plain := f.must(t, ctx, "status", "web-1"); len(lines(plain, `\S`)) != 2 || len(lines(plain, `^web-1\s`)) != 1 {
		t.Errorf("status web-1:\n%s", plain)
	}
}
