// Package grpcurl runs `meshctl dev` on a fresh data dir, runs every
// command line it prints exactly as printed (the grpcurl commands and the
// meshctl one), and uses the pinned grpcurl to list and describe every
// service, call a read RPC of each with the right role's certificate, and be
// refused with the wrong role's and without a certificate (DESIGN.md §10:
// grpcurl works with -cacert -cert -key and nothing else).
package grpcurl

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"

	catalogv1 "mesh.dev/proto/mesh/catalog/v1"
	composerv1 "mesh.dev/proto/mesh/composer/v1"
	nodeenginev1 "mesh.dev/proto/mesh/nodeengine/v1"
	signerv1 "mesh.dev/proto/mesh/signer/v1"
	"mesh.dev/tests/internal/procmesh"
)

func TestMain(m *testing.M) { os.Exit(procmesh.Main(m)) }

// devTimeout bounds how long meshctl dev takes to converge and print its
// help; it converges in seconds on an idle machine.
const devTimeout = 4 * time.Minute

// printed is what meshctl dev printed once the fleet converged.
type printed struct {
	grpcurl []string // the grpcurl command lines, as printed
	export  string   // the export line for meshctl
	meshctl []string // the meshctl command lines
	// From the first grpcurl line: the certificate flags and the address of
	// each service.
	ca, cert, key string
	catalog       string
	signer        string
	composer      string
	engines       map[string]string // node → admin address
}

func TestMeshctlDevGrpcurl(t *testing.T) {
	if testing.Short() {
		t.Skip("builds meshctl and runs the dev mesh")
	}
	start := time.Now()
	bin := procmesh.Build(t)
	procmesh.Tool(t, "grpcurl")
	root, err := procmesh.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	// A fresh data dir and free ports (--base-port 0), so that it runs
	// beside anyone's meshctl dev on 7400.
	dataDir := filepath.Join(t.TempDir(), "dev")
	dev := procmesh.Spawn(t, "meshctl-dev", root, nil, bin.Meshctl, "dev", "--data-dir", dataDir, "--base-port", "0", "--timeout", "3m")
	t.Cleanup(func() {
		if t.Failed() {
			b, _ := os.ReadFile(filepath.Join(dataDir, "logs", "mesh.log"))
			if len(b) > 64<<10 {
				b = b[len(b)-64<<10:]
			}
			t.Logf("=== the end of meshctl dev's log ===\n%s", b)
		}
	})
	out := waitPrinted(t, dev, "running; Ctrl-C stops")
	if !strings.Contains(out, "the fleet converged") {
		t.Fatalf("meshctl dev did not converge:\n%s", out)
	}
	p := parse(t, out)
	t.Logf("meshctl dev converged and printed its commands after %.1fs", time.Since(start).Seconds())

	t.Run("printed commands", func(t *testing.T) { testPrinted(t, root, p) })
	t.Run("list and describe", func(t *testing.T) { testDescribe(t, root, p) })
	t.Run("roles", func(t *testing.T) { testRoles(t, root, p) })
	t.Run("signer as the composer", func(t *testing.T) { testSignerAsComposer(t, root, p) })
	t.Run("catalog GetEntry", func(t *testing.T) { testGetEntry(t, root, p) })
	t.Run("no certificate", func(t *testing.T) { testNoCertificate(t, root, p) })

	if err := dev.Interrupt(time.Minute); err != nil {
		t.Errorf("meshctl dev on Ctrl-C: %v", err)
	}
	if out := dev.Output(1 << 20); !strings.Contains(out, "stopping") {
		t.Errorf("meshctl dev did not say it stopped:\n%s", out)
	}
	t.Logf("grpcurl end to end in %.1fs", time.Since(start).Seconds())
}

// waitPrinted polls a process's output until it contains want.
func waitPrinted(t *testing.T, p *procmesh.Proc, want string) string {
	t.Helper()
	deadline := time.Now().Add(devTimeout)
	for {
		out := p.Output(1 << 20)
		if strings.Contains(out, want) {
			return out
		}
		if err, ended := p.Exited(); ended {
			t.Fatalf("%s ended (%v) before printing %q:\n%s", p.Name, err, want, out)
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s did not print %q within %s:\n%s", p.Name, want, devTimeout, out)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

var (
	grpcurlLine = regexp.MustCompile(`^\s+(\./bin/grpcurl -cacert (\S+) -cert (\S+) -key (\S+) (\S+) (\S+))(\s+# (\S+), root .*)?$`)
	exportLine  = regexp.MustCompile(`^\s+(export MESH_\S+=.*)$`)
	meshctlLine = regexp.MustCompile(`^\s+(go run ./cmd/meshctl .*)$`)
)

func parse(t *testing.T, out string) printed {
	t.Helper()
	p := printed{engines: map[string]string{}}
	for _, line := range strings.Split(out, "\n") {
		if m := grpcurlLine.FindStringSubmatch(line); m != nil {
			p.grpcurl = append(p.grpcurl, line)
			p.ca, p.cert, p.key = m[2], m[3], m[4]
			addr, what := m[5], m[6]
			switch {
			case what == "list" || strings.HasPrefix(what, "mesh.composer.v1."):
				p.composer = addr
			case strings.HasPrefix(what, "mesh.catalog.v1."):
				p.catalog = addr
			case strings.HasPrefix(what, "mesh.signer.v1."):
				p.signer = addr
			case strings.HasPrefix(what, "mesh.nodeengine.v1."):
				p.engines[m[8]] = addr
			}
			continue
		}
		if m := exportLine.FindStringSubmatch(line); m != nil {
			p.export = m[1]
		}
		if m := meshctlLine.FindStringSubmatch(line); m != nil {
			p.meshctl = append(p.meshctl, m[1])
		}
	}
	if len(p.grpcurl) != 4+3 || p.catalog == "" || p.signer == "" || p.composer == "" || len(p.engines) != 3 || p.export == "" || len(p.meshctl) != 3 {
		t.Fatalf("meshctl dev printed %d grpcurl commands (want list, ListStatus, ListModules, GetKeyset and 3 GetStatus), export %q, meshctl %q (want status, keys served, engine status):\n%s",
			len(p.grpcurl), p.export, p.meshctl, out)
	}
	if filepath.Base(p.cert) != "operator-admin.pem" {
		t.Errorf("the printed commands use %s, want the operator's certificate", p.cert)
	}
	return p
}

// shell runs a command line with bash in the repository's root, as a user
// pastes it, and returns its combined output.
func shell(root, line string) (string, error) {
	return procmesh.Run(root, nil, "bash", "-c", line)
}

// testPrinted runs every command meshctl dev printed, exactly as printed.
func testPrinted(t *testing.T, root string, p printed) {
	for _, line := range p.grpcurl {
		out, err := shell(root, line)
		if err != nil {
			t.Errorf("%s\n%v\n%s", line, err, out)
			continue
		}
		m := grpcurlLine.FindStringSubmatch(line)
		switch what, node := m[6], m[8]; what {
		case "list":
			for _, svc := range []string{"mesh.composer.v1.ComposerService", "mesh.composer.v1.SyncService", "grpc.health.v1.Health", "grpc.reflection.v1.ServerReflection"} {
				if !strings.Contains(out, svc+"\n") {
					t.Errorf("%s: %s not listed:\n%s", line, svc, out)
				}
			}
		case "mesh.composer.v1.ComposerService/ListStatus":
			var resp struct {
				Statuses []struct {
					Node      string `json:"node"`
					Converged bool   `json:"converged"`
				} `json:"statuses"`
			}
			decode(t, line, out, &resp)
			if len(resp.Statuses) != 3 {
				t.Errorf("%s: %d statuses, want 3:\n%s", line, len(resp.Statuses), out)
			}
			for _, st := range resp.Statuses {
				if !st.Converged {
					t.Errorf("%s: %s not converged", line, st.Node)
				}
			}
		case "mesh.catalog.v1.CatalogService/ListModules":
			var resp struct {
				Registrations []struct {
					Module      string `json:"module"`
					Fingerprint string `json:"fingerprint"`
				} `json:"registrations"`
			}
			decode(t, line, out, &resp)
			if want := len(procmesh.ExampleModuleDirs(t)); len(resp.Registrations) != want {
				t.Errorf("%s: %d registrations, want the %d example modules:\n%s", line, len(resp.Registrations), want, out)
			}
		case "mesh.signer.v1.SignerService/GetKeyset":
			var resp struct {
				Keyset struct {
					PayloadType string            `json:"payloadType"`
					Signatures  []json.RawMessage `json:"signatures"`
				} `json:"keyset"`
			}
			decode(t, line, out, &resp)
			if resp.Keyset.PayloadType != "PAYLOAD_TYPE_KEYSET" || len(resp.Keyset.Signatures) == 0 {
				t.Errorf("%s: not a signed keyset:\n%s", line, out)
			}
		case "mesh.nodeengine.v1.NodeEngineService/GetStatus":
			var resp struct {
				Node    string `json:"node"`
				Applied struct {
					Revision string `json:"revision"`
				} `json:"applied"`
			}
			decode(t, line, out, &resp)
			if resp.Node != node || resp.Applied.Revision == "" {
				t.Errorf("%s: node %q applied revision %q, want %s with a manifest applied:\n%s", line, resp.Node, resp.Applied.Revision, node, out)
			}
		default:
			t.Errorf("meshctl dev printed a command this test does not know: %s", line)
		}
	}
	// meshctl with the environment it prints.
	for _, cmd := range p.meshctl {
		line := p.export + " && " + cmd
		out, err := shell(root, line)
		if err != nil {
			t.Errorf("%s\n%v\n%s", line, err, out)
			continue
		}
		var ok bool
		switch {
		case strings.Contains(cmd, "meshctl status"):
			ok = strings.Count(out, "CONVERGED") == 3
		case strings.Contains(cmd, "meshctl keys served"):
			ok = strings.Contains(out, "serves keyset version 1 and signs with key ")
		case strings.Contains(cmd, "meshctl engine status"):
			ok = strings.HasPrefix(out, "node dev-1: applied r") && strings.Contains(out, "\nconnected; last sync ") &&
				strings.Contains(out, "\nnode ") && strings.Contains(out, " APPLIED ") && !strings.Contains(out, "FAILED") && !strings.Contains(out, "BLOCKED")
		default:
			t.Errorf("meshctl dev printed a meshctl command this test does not know: %s", cmd)
			continue
		}
		if !ok {
			t.Errorf("%s printed:\n%s", line, out)
		}
	}
}

func decode(t *testing.T, line, out string, v any) {
	t.Helper()
	if err := json.Unmarshal([]byte(out), v); err != nil {
		t.Errorf("%s printed no JSON (%v):\n%s", line, err, out)
	}
}

// grpcurlAs returns the grpcurl command line of the printed ones, with the
// certificate of another identity of the dev CA (its basename) and a bound
// on how long a call may take.
func (p printed) grpcurlAs(basename string, args ...string) string {
	dir := filepath.Dir(p.ca)
	return fmt.Sprintf("./bin/grpcurl -max-time 60 -cacert %s -cert %s -key %s %s", p.ca,
		filepath.Join(dir, basename+".pem"), filepath.Join(dir, basename+"-key.pem"), strings.Join(args, " "))
}

// services lists each server's address and the mesh services it must list.
func (p printed) services() []struct {
	name, addr string
	descs      []grpc.ServiceDesc
} {
	return []struct {
		name, addr string
		descs      []grpc.ServiceDesc
	}{
		{"catalog", p.catalog, []grpc.ServiceDesc{catalogv1.CatalogService_ServiceDesc}},
		{"signer", p.signer, []grpc.ServiceDesc{signerv1.SignerService_ServiceDesc}},
		{"composer", p.composer, []grpc.ServiceDesc{composerv1.ComposerService_ServiceDesc, composerv1.SyncService_ServiceDesc}},
		{"node engine dev-1", p.engines["dev-1"], []grpc.ServiceDesc{nodeenginev1.NodeEngineService_ServiceDesc}},
	}
}

// testDescribe lists every server's services and describes each, checking
// that reflection shows every RPC of this tree's API.
func testDescribe(t *testing.T, root string, p printed) {
	for _, s := range p.services() {
		line := p.grpcurlAs("operator-admin", s.addr, "list")
		out, err := shell(root, line)
		if err != nil {
			t.Errorf("%s: %s\n%v\n%s", s.name, line, err, out)
			continue
		}
		listed := strings.Fields(out)
		for _, want := range []string{"grpc.health.v1.Health", "grpc.reflection.v1.ServerReflection"} {
			if !contains(listed, want) {
				t.Errorf("%s lists %v, not %s", s.name, listed, want)
			}
		}
		for _, d := range s.descs {
			if !contains(listed, d.ServiceName) {
				t.Errorf("%s lists %v, not %s", s.name, listed, d.ServiceName)
				continue
			}
			line := p.grpcurlAs("operator-admin", s.addr, "describe", d.ServiceName)
			out, err := shell(root, line)
			if err != nil || !strings.Contains(out, d.ServiceName+" is a service:") {
				t.Errorf("%s: %s\n%v\n%s", s.name, line, err, out)
				continue
			}
			var rpcs []string
			for _, m := range d.Methods {
				rpcs = append(rpcs, m.MethodName)
			}
			for _, m := range d.Streams {
				rpcs = append(rpcs, m.StreamName)
			}
			for _, rpc := range rpcs {
				if !strings.Contains(out, "rpc "+rpc+" (") {
					t.Errorf("describe %s shows no rpc %s:\n%s", d.ServiceName, rpc, out)
				}
			}
		}
		// Every listed service but the reflection ones describes.
		for _, svc := range listed {
			if strings.HasPrefix(svc, "grpc.reflection.") {
				continue
			}
			line := p.grpcurlAs("operator-admin", s.addr, "describe", svc)
			if out, err := shell(root, line); err != nil || !strings.Contains(out, " is a service:") {
				t.Errorf("%s: %s\n%v\n%s", s.name, line, err, out)
			}
		}
	}
}

func contains(s []string, v string) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

// testRoles calls one read RPC of every service with a role allowed to
// call it, and one with a role that is not, which is refused with
// PermissionDenied.
func testRoles(t *testing.T, root string, p printed) {
	tests := []struct {
		name     string
		identity string
		addr     string
		method   string
		denied   bool
	}{
		{"catalog ListModules as builder", "builder-ci", p.catalog, "mesh.catalog.v1.CatalogService/ListModules", false},
		{"catalog ListModules as a node", "node-dev-1", p.catalog, "mesh.catalog.v1.CatalogService/ListModules", true},
		{"signer GetKeyset as a node", "node-dev-1", p.signer, "mesh.signer.v1.SignerService/GetKeyset", false},
		{"signer SignCompositions as a node", "node-dev-1", p.signer, "mesh.signer.v1.SignerService/SignCompositions", true},
		// GetKeyset is any authenticated role's: what only the composer may
		// call is refused to the operator.
		{"signer SignManifests as operator", "operator-admin", p.signer, "mesh.signer.v1.SignerService/SignManifests", true},
		{"composer ListStatus as operator", "operator-admin", p.composer, "mesh.composer.v1.ComposerService/ListStatus", false},
		{"composer ListStatus as builder", "builder-ci", p.composer, "mesh.composer.v1.ComposerService/ListStatus", true},
		{"composer ListStatus as a node", "node-dev-1", p.composer, "mesh.composer.v1.ComposerService/ListStatus", true},
		{"engine GetStatus as its node", "node-dev-1", p.engines["dev-1"], "mesh.nodeengine.v1.NodeEngineService/GetStatus", false},
		{"engine GetStatus as builder", "builder-ci", p.engines["dev-1"], "mesh.nodeengine.v1.NodeEngineService/GetStatus", true},
		{"engine GetStatus as another node", "node-dev-2", p.engines["dev-1"], "mesh.nodeengine.v1.NodeEngineService/GetStatus", true},
	}
	for _, tt := range tests {
		line := p.grpcurlAs(tt.identity, tt.addr, tt.method)
		out, err := shell(root, line)
		switch {
		case !tt.denied && err != nil:
			t.Errorf("%s: %s\n%v\n%s", tt.name, line, err, out)
		case tt.denied && (err == nil || !strings.Contains(out, "Code: PermissionDenied")):
			t.Errorf("%s: %s: want PermissionDenied, got %v:\n%s", tt.name, line, err, out)
		}
	}
}

// testSignerAsComposer lists the signer with the composer's certificate,
// the identity that calls it: the signer service, health and reflection.
func testSignerAsComposer(t *testing.T, root string, p printed) {
	line := p.grpcurlAs("composer", p.signer, "list")
	out, err := shell(root, line)
	if err != nil {
		t.Fatalf("%s\n%v\n%s", line, err, out)
	}
	for _, svc := range []string{"mesh.signer.v1.SignerService", "grpc.health.v1.Health", "grpc.reflection.v1.ServerReflection"} {
		if !contains(strings.Fields(out), svc) {
			t.Errorf("%s: %s not listed:\n%s", line, svc, out)
		}
	}
}

// testGetEntry reads a registered module's entry with the operator's
// certificate, and asks for a fingerprint the catalog holds no entry of:
// NOT_FOUND with DESIGN.md §3's words.
func testGetEntry(t *testing.T, root string, p printed) {
	line := p.grpcurlAs("operator-admin", "-d", `'{"module":"motd"}'`, p.catalog, "mesh.catalog.v1.CatalogService/GetModule")
	out, err := shell(root, line)
	if err != nil {
		t.Fatalf("%s\n%v\n%s", line, err, out)
	}
	var mod struct {
		Registration struct {
			Fingerprint string `json:"fingerprint"`
		} `json:"registration"`
	}
	decode(t, line, out, &mod)
	fp := mod.Registration.Fingerprint
	if !strings.HasPrefix(fp, "fp1:") {
		t.Fatalf("%s: no fingerprint registered for motd:\n%s", line, out)
	}
	line = p.grpcurlAs("operator-admin", "-d", fmt.Sprintf(`'{"fingerprint":%q}'`, fp), p.catalog, "mesh.catalog.v1.CatalogService/GetEntry")
	out, err = shell(root, line)
	if err != nil {
		t.Fatalf("%s\n%v\n%s", line, err, out)
	}
	var entry struct {
		Entry struct {
			Fingerprint string `json:"fingerprint"`
			Module      string `json:"module"`
		} `json:"entry"`
	}
	decode(t, line, out, &entry)
	if entry.Entry.Fingerprint != fp || entry.Entry.Module != "motd" {
		t.Errorf("%s: entry %+v, want motd at %s:\n%s", line, entry.Entry, fp, out)
	}
	unknown := "fp1:" + strings.Repeat("0", 64)
	line = p.grpcurlAs("operator-admin", "-d", fmt.Sprintf(`'{"fingerprint":%q}'`, unknown), p.catalog, "mesh.catalog.v1.CatalogService/GetEntry")
	out, err = shell(root, line)
	if err == nil || !strings.Contains(out, "Code: NotFound") || !strings.Contains(out, "Message: no entry of fingerprint "+unknown+"\n") {
		t.Errorf("%s: want NotFound %q, got %v:\n%s", line, "no entry of fingerprint "+unknown, err, out)
	}
}

// testNoCertificate: a client without a certificate gets no service. With
// TLS 1.3 the client's side of the handshake ends before the server checks
// the client's certificate, so grpcurl only sees its connection fail; a TLS
// client shows the server's alert.
func testNoCertificate(t *testing.T, root string, p printed) {
	pem, err := os.ReadFile(p.ca)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(pem)
	var wg sync.WaitGroup
	for _, s := range p.services() {
		wg.Add(1)
		go func() {
			defer wg.Done()
			line := fmt.Sprintf("./bin/grpcurl -cacert %s -connect-timeout 3 -max-time 60 %s list", p.ca, s.addr)
			out, err := shell(root, line)
			if err == nil || !strings.Contains(out, "Failed to dial target host") {
				t.Errorf("%s: %s: want a failed dial, got %v:\n%s", s.name, line, err, out)
			}
			if err := handshakeRefused(s.addr, pool); err != nil {
				t.Errorf("%s: %v", s.name, err)
			}
		}()
	}
	wg.Wait()
}

// handshakeRefused connects without a client certificate and checks that
// the server ends the handshake with "certificate required".
func handshakeRefused(addr string, pool *x509.CertPool) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	d := tls.Dialer{Config: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS13, NextProtos: []string{"h2"}}}
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err == nil {
		defer conn.Close()
		_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
		_, err = conn.Read(make([]byte, 1))
	}
	if err == nil || !strings.Contains(err.Error(), "certificate required") {
		return fmt.Errorf("a TLS client without a certificate got %v, want the server's certificate-required alert", err)
	}
	return nil
}
