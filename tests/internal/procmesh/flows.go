package procmesh

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protojson"

	composerv1 "mesh.dev/proto/mesh/composer/v1"
)

// Identities the mesh's certificates are made for (meshctl certs init).
const (
	Operator = "operator-admin"
	Builder  = "builder-ci"
)

// MeshctlErr runs the meshctl binary as an identity of the mesh's certs dir
// (operator-admin, builder-ci, node-ace, ...) against the mesh's services
// and returns its combined output.
func (m *Mesh) MeshctlErr(identity string, args ...string) (string, error) {
	full := append([]string{"--certs-dir", m.CertsDir, "--identity", identity,
		"--catalog", m.Catalog, "--composer", m.Composer, "--signer", m.Signer}, args...)
	root, err := RepoRoot()
	if err != nil {
		return "", err
	}
	return runCommand(nil, root, m.Bin.Meshctl, full...)
}

// Meshctl is MeshctlErr that fails the test when meshctl fails.
func (m *Mesh) Meshctl(identity string, args ...string) string {
	m.t.Helper()
	out, err := m.MeshctlErr(identity, args...)
	if err != nil {
		m.t.Fatalf("meshctl --identity %s %s: %v\n%s", identity, strings.Join(args, " "), err, out)
	}
	return out
}

// Published is one line of `meshctl -o json catalog publish`.
type Published struct {
	Dir           string `json:"dir"`
	Module        string `json:"module"`
	Fingerprint   string `json:"fingerprint"`
	EntryCreated  bool   `json:"entry_created"`
	Uploaded      int    `json:"uploaded"`
	BuildRecorded bool   `json:"build_recorded"`
	Registered    bool   `json:"registered"`
	Seq           uint64 `json:"seq"`
}

// Publish publishes module directories as the builder
// (`meshctl catalog publish DIR...`) and returns what it did, by module.
func (m *Mesh) Publish(extra []string, dirs ...string) map[string]Published {
	m.t.Helper()
	args := append([]string{"-o", "json", "catalog", "publish"}, extra...)
	out := m.Meshctl(Builder, append(args, dirs...)...)
	res := map[string]Published{}
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if !strings.HasPrefix(line, "{") {
			continue
		}
		var p Published
		if err := json.Unmarshal([]byte(line), &p); err != nil {
			m.t.Fatalf("meshctl catalog publish printed %q: %v", line, err)
		}
		res[p.Module] = p
	}
	if len(res) != len(dirs) {
		m.t.Fatalf("meshctl catalog publish of %d dirs reported %d modules:\n%s", len(dirs), len(res), out)
	}
	return res
}

// ExampleModuleDirs returns the directories of the repository's example
// modules (examples/modules/*/module.yaml), sorted.
func ExampleModuleDirs(t testing.TB) []string {
	t.Helper()
	root, err := RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	files, err := filepath.Glob(filepath.Join(root, "examples", "modules", "*", "module.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no example modules under %s: %v", root, err)
	}
	var dirs []string
	for _, f := range files {
		dirs = append(dirs, filepath.Dir(f))
	}
	sort.Strings(dirs)
	return dirs
}

// NodeSpecYAML is the spec file of the i-th node (from 0): every node runs
// sshd, motd, users, node-exporter and ca-bundle; the first also runs
// postgres and the backup that needs it.
func NodeSpecYAML(i int, node string) string {
	role := "web"
	extra := ""
	if i == 0 {
		role = "db"
		extra = fmt.Sprintf(`  - module: postgres
    params: {max_connections: 100, shared_buffers: 128MB, clients: [10.0.0.0/24]}
  - module: backup
    params: {target: "s3://backups/%s", schedule: daily}
`, node)
	}
	return fmt.Sprintf(`# written by the multi-process end-to-end test
node: %s
labels: {env: test, role: %s}
facts: {ip: 10.0.0.%d}
modules:
  - module: ca-bundle
  - module: motd
  - module: node-exporter
    params: {port: 9100, collectors: [cpu, meminfo, filesystem]}
  - module: sshd
    params: {port: 22}
  - module: users
    params: {users: [alice, bob]}
%s`, node, role, 10+i, extra)
}

// PutNodes writes each engine's spec file (NodeSpecYAML) and puts them as
// the operator with `meshctl node put FILE...`.
func (m *Mesh) PutNodes() {
	m.t.Helper()
	var files []string
	for i, e := range m.Engines {
		files = append(files, m.writeFile(filepath.Join("specs", e.Node+".yaml"), NodeSpecYAML(i, e.Node)))
	}
	out := m.Meshctl(Operator, append([]string{"node", "put"}, files...)...)
	for _, e := range m.Engines {
		if !strings.Contains(out, "node "+e.Node+" at revision") {
			m.t.Fatalf("meshctl node put did not put %s:\n%s", e.Node, out)
		}
	}
}

// Statuses returns every node's status (`meshctl -o json status`).
func (m *Mesh) Statuses() ([]*composerv1.NodeStatus, error) {
	out, err := m.MeshctlErr(Operator, "-o", "json", "status")
	if err != nil {
		return nil, fmt.Errorf("meshctl status: %w: %s", err, out)
	}
	resp := &composerv1.ListStatusResponse{}
	if err := protojson.Unmarshal([]byte(out), resp); err != nil {
		return nil, fmt.Errorf("meshctl -o json status printed %q: %w", out, err)
	}
	return resp.GetStatuses(), nil
}

// WaitFor polls the statuses until done returns nil, failing the test after
// timeout with done's last answer and `meshctl status --why`.
func (m *Mesh) WaitFor(what string, timeout time.Duration, done func([]*composerv1.NodeStatus) error) []*composerv1.NodeStatus {
	m.t.Helper()
	start := time.Now()
	deadline := start.Add(timeout)
	var last error
	for {
		sts, err := m.Statuses()
		if err == nil {
			if last = done(sts); last == nil {
				m.t.Logf("%s after %.1fs", what, time.Since(start).Seconds())
				return sts
			}
		} else {
			last = err
		}
		for _, p := range m.Procs {
			if err, ended := p.Exited(); ended {
				m.t.Fatalf("waiting for %s: %s ended: %v", what, p.Name, err)
			}
		}
		if time.Now().After(deadline) {
			why, _ := m.MeshctlErr(Operator, "status", "--why")
			m.t.Fatalf("%s: not within %s: %v\n%s", what, timeout, last, why)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// AllAssigned is a WaitFor condition: every engine's node has a manifest
// (or a compose error to show).
func (m *Mesh) AllAssigned(sts []*composerv1.NodeStatus) error {
	by := byNode(sts)
	for _, e := range m.Engines {
		st := by[e.Node]
		if st == nil || (st.GetManifestRevision() == 0 && st.GetLastError() == "") {
			return fmt.Errorf("node %s has no manifest yet", e.Node)
		}
	}
	return nil
}

// Converged is a WaitFor condition: every engine's node is converged with
// no hold, no compose error, and every module it wants applied.
func (m *Mesh) Converged(sts []*composerv1.NodeStatus) error {
	by := byNode(sts)
	for _, e := range m.Engines {
		st := by[e.Node]
		switch {
		case st == nil:
			return fmt.Errorf("node %s has no status", e.Node)
		case st.GetLastError() != "":
			return fmt.Errorf("node %s: %s", e.Node, st.GetLastError())
		case len(st.GetHolds()) > 0:
			return fmt.Errorf("node %s holds %s: %s", e.Node, st.GetHolds()[0].GetModule(), st.GetHolds()[0].GetReason())
		case !st.GetConverged():
			return fmt.Errorf("node %s is not converged (manifest r%d, applied r%d)", e.Node, st.GetManifestRevision(), st.GetAppliedRevision())
		}
		for _, ms := range st.GetModules() {
			if ms.GetWantedDigest() == "" || ms.GetAppliedDigest() != ms.GetWantedDigest() {
				return fmt.Errorf("node %s module %s: wanted %s, applied %s", e.Node, ms.GetModule(), ms.GetWantedDigest(), ms.GetAppliedDigest())
			}
		}
	}
	return nil
}

// ModuleAt is a WaitFor condition: every engine's node wants and applied
// module at fingerprint fp (and Converged holds).
func (m *Mesh) ModuleAt(module, fp string) func([]*composerv1.NodeStatus) error {
	return func(sts []*composerv1.NodeStatus) error {
		by := byNode(sts)
		for _, e := range m.Engines {
			found := false
			for _, ms := range by[e.Node].GetModules() {
				if ms.GetModule() != module {
					continue
				}
				found = true
				if ms.GetWantedFingerprint() != fp || ms.GetAppliedFingerprint() != fp {
					return fmt.Errorf("node %s module %s: wanted %s, applied %s, not %s", e.Node, module, ms.GetWantedFingerprint(), ms.GetAppliedFingerprint(), fp)
				}
			}
			if !found {
				return fmt.Errorf("node %s does not list module %s", e.Node, module)
			}
		}
		return m.Converged(sts)
	}
}

func byNode(sts []*composerv1.NodeStatus) map[string]*composerv1.NodeStatus {
	by := map[string]*composerv1.NodeStatus{}
	for _, st := range sts {
		by[st.GetNode()] = st
	}
	return by
}

// ApproveFirstPlacements approves, as the operator, every held move of a
// module a node does not run yet (a first placement of a MANUAL or PINNED
// module), once every node has a manifest: `meshctl holds` lists them and
// `meshctl approve MODULE DIGEST...` approves each module's digests, as
// `meshctl dev` does. It returns the nodes approved, by module.
func (m *Mesh) ApproveFirstPlacements(timeout time.Duration) map[string][]string {
	m.t.Helper()
	m.WaitFor("every node has a manifest", timeout, m.AllAssigned)
	out := m.Meshctl(Operator, "-o", "json", "holds")
	holds := &composerv1.ListHoldsResponse{}
	if err := protojson.Unmarshal([]byte(out), holds); err != nil {
		m.t.Fatalf("meshctl -o json holds printed %q: %v", out, err)
	}
	digests, nodes := map[string][]string{}, map[string][]string{}
	for _, n := range holds.GetNodes() {
		for _, h := range n.GetHolds() {
			if h.GetCompositionDigest() == "" || h.GetJudgement() != composerv1.Judgement_JUDGEMENT_NEW {
				continue
			}
			digests[h.GetModule()] = append(digests[h.GetModule()], h.GetCompositionDigest())
			nodes[h.GetModule()] = append(nodes[h.GetModule()], n.GetNode())
		}
	}
	for module, ds := range digests {
		out := m.Meshctl(Operator, append([]string{"approve", module, "--note", "first placement (end-to-end test)"}, ds...)...)
		if !strings.Contains(out, "approval ") {
			m.t.Fatalf("meshctl approve %s printed %q", module, out)
		}
	}
	return nodes
}

// CopyDir copies a directory tree (a module to edit).
func CopyDir(t testing.TB, src, dst string) {
	t.Helper()
	err := filepath.Walk(src, func(p string, fi os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, p)
		if err != nil {
			return err
		}
		target := filepath.Join(dst, rel)
		if fi.IsDir() {
			return os.MkdirAll(target, 0o755)
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		return os.WriteFile(target, b, fi.Mode().Perm())
	})
	if err != nil {
		t.Fatal(err)
	}
}
