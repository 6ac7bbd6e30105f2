package main

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"mesh.dev/internal/identity"
	"mesh.dev/internal/pki"
)

// runMeshctl runs meshctl with args and returns its output. The commands
// share package-level flag state (the root's connection flags), so these
// tests do not run in parallel.
func runMeshctl(t *testing.T, args ...string) (string, error) {
	t.Helper()
	root := newRootCmd()
	var out bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&out)
	root.SetArgs(args)
	err := root.ExecuteContext(t.Context())
	return out.String(), err
}

// checkCert loads the pair written under basename in dir, checks the key's
// mode, verifies the certificate against dir's CA and returns it.
func checkCert(t *testing.T, dir, basename string) *x509.Certificate {
	t.Helper()
	certFile, keyFile := pki.Paths(dir, basename)
	fi, err := os.Stat(keyFile)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("%s has mode %v, want 0600", keyFile, fi.Mode().Perm())
	}
	pair, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		t.Fatalf("%s: %v", basename, err)
	}
	caPEM, err := os.ReadFile(filepath.Join(dir, pki.CACertFile))
	if err != nil {
		t.Fatal(err)
	}
	block, _ := pem.Decode(caPEM)
	caCert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AddCert(caCert)
	if _, err := pair.Leaf.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		t.Errorf("%s does not verify against ca.pem: %v", basename, err)
	}
	return pair.Leaf
}

func sans(c *x509.Certificate) (uris, dns, ips []string) {
	for _, u := range c.URIs {
		uris = append(uris, u.String())
	}
	for _, ip := range c.IPAddresses {
		ips = append(ips, ip.String())
	}
	return uris, c.DNSNames, ips
}

func TestCertsInit(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "certs")
	out, err := runMeshctl(t, "certs", "init", "--dir", dir, "--trust-domain", "mesh.example", "--validity", "48h")
	if err != nil {
		t.Fatalf("certs init: %v\n%s", err, out)
	}
	fi, err := os.Stat(filepath.Join(dir, pki.CAKeyFile))
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("ca-key.pem: %v, mode %v; want 0600", err, fi.Mode().Perm())
	}
	ca, err := pki.LoadCA(filepath.Join(dir, pki.CACertFile), filepath.Join(dir, pki.CAKeyFile))
	if err != nil {
		t.Fatal(err)
	}
	if ca.TrustDomain() != "mesh.example" {
		t.Errorf("trust domain %q, want mesh.example", ca.TrustDomain())
	}
	if d := time.Until(ca.Certificate().NotAfter); d < 47*time.Hour || d > 49*time.Hour {
		t.Errorf("CA valid for another %s, want about 48h", d)
	}
	tests := []struct {
		basename string
		uri      string
		dns      []string
		ips      []string
	}{
		{"catalog", "spiffe://mesh.example/service/catalog", []string{"localhost", "catalog"}, []string{"127.0.0.1", "::1"}},
		{"signer", "spiffe://mesh.example/service/signer", []string{"localhost", "signer"}, []string{"127.0.0.1", "::1"}},
		{"composer", "spiffe://mesh.example/service/composer", []string{"localhost", "composer"}, []string{"127.0.0.1", "::1"}},
		{"operator-admin", "spiffe://mesh.example/operator/admin", nil, nil},
		{"builder-ci", "spiffe://mesh.example/builder/ci", nil, nil},
	}
	for _, tt := range tests {
		c := checkCert(t, dir, tt.basename)
		uris, dns, ips := sans(c)
		if !slices.Equal(uris, []string{tt.uri}) || !slices.Equal(dns, tt.dns) || !slices.Equal(ips, tt.ips) {
			t.Errorf("%s: SANs URI %v DNS %v IP %v; want %s %v %v", tt.basename, uris, dns, ips, tt.uri, tt.dns, tt.ips)
		}
		if id, err := identity.FromCertificate(c); err != nil || id.URI().String() != tt.uri {
			t.Errorf("%s: identity %v, %v", tt.basename, id, err)
		}
		if !strings.Contains(out, tt.basename+".pem") {
			t.Errorf("output does not name %s.pem:\n%s", tt.basename, out)
		}
	}

	// A second init refuses and changes nothing; --force replaces.
	before, _ := os.ReadFile(filepath.Join(dir, pki.CAKeyFile))
	if _, err := runMeshctl(t, "certs", "init", "--dir", dir); err == nil || !strings.Contains(err.Error(), "pass --force") {
		t.Fatalf("second init: %v, want a refusal naming --force", err)
	}
	if after, _ := os.ReadFile(filepath.Join(dir, pki.CAKeyFile)); !bytes.Equal(before, after) {
		t.Fatal("a refused init changed the CA key")
	}
	if out, err := runMeshctl(t, "certs", "init", "--dir", dir, "--force"); err != nil {
		t.Fatalf("init --force: %v\n%s", err, out)
	}
	if after, _ := os.ReadFile(filepath.Join(dir, pki.CAKeyFile)); bytes.Equal(before, after) {
		t.Fatal("init --force kept the old CA key")
	}
	checkCert(t, dir, "signer")
}

func TestCertsInitNoDefaults(t *testing.T) {
	dir := t.TempDir()
	if out, err := runMeshctl(t, "certs", "init", "--dir", dir, "--no-defaults"); err != nil {
		t.Fatalf("certs init: %v\n%s", err, out)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	if want := []string{"ca-key.pem", "ca.pem"}; !slices.Equal(names, want) {
		t.Fatalf("files %v, want %v", names, want)
	}
	ca, err := pki.LoadCA(filepath.Join(dir, pki.CACertFile), filepath.Join(dir, pki.CAKeyFile))
	if err != nil || ca.TrustDomain() != "mesh.local" {
		t.Fatalf("default trust domain: %v, %v; want mesh.local", ca, err)
	}
}

func TestCertsIssue(t *testing.T) {
	dir := t.TempDir()
	if out, err := runMeshctl(t, "certs", "init", "--dir", dir, "--no-defaults"); err != nil {
		t.Fatalf("certs init: %v\n%s", err, out)
	}
	tests := []struct {
		name     string
		args     []string
		basename string
		uri      string
		dns      []string
		ips      []string
		wantErr  string
	}{
		{name: "node", args: []string{"--role", "node", "--name", "ace"}, basename: "node-ace",
			uri: "spiffe://mesh.local/node/ace", dns: []string{"localhost"}, ips: []string{"127.0.0.1", "::1"}},
		{name: "node extra SANs", args: []string{"--role", "node", "--name", "bob", "--dns", "bob.example", "--ip", "10.0.0.5,fd00::5"}, basename: "node-bob",
			uri: "spiffe://mesh.local/node/bob", dns: []string{"localhost", "bob.example"}, ips: []string{"127.0.0.1", "::1", "10.0.0.5", "fd00::5"}},
		{name: "service", args: []string{"--role", "composer", "--dns", "composer.example", "--validity", "1h"}, basename: "composer",
			uri: "spiffe://mesh.local/service/composer", dns: []string{"localhost", "composer", "composer.example"}, ips: []string{"127.0.0.1", "::1"}},
		{name: "operator", args: []string{"--role", "operator", "--name", "ops"}, basename: "operator-ops", uri: "spiffe://mesh.local/operator/ops"},
		{name: "no default SANs", args: []string{"--role", "signer", "--no-default-sans", "--dns", "signer.example"}, basename: "signer",
			uri: "spiffe://mesh.local/service/signer", dns: []string{"signer.example"}},
		{name: "existing", args: []string{"--role", "node", "--name", "ace"}, wantErr: "node-ace.pem exists; pass --force"},
		{name: "unknown role", args: []string{"--role", "admin", "--name", "x"}, wantErr: `--role "admin": want one of catalog, signer, composer, node, operator, builder`},
		{name: "bad name", args: []string{"--role", "node", "--name", "Ace"}, wantErr: `node name "Ace" is not a DNS label`},
		{name: "missing name", args: []string{"--role", "builder"}, wantErr: "--name is required for role builder"},
		{name: "misnamed service", args: []string{"--role", "catalog", "--name", "cat"}, wantErr: `service catalog must be named "catalog"`},
		{name: "bad ip", args: []string{"--role", "node", "--name", "cat", "--ip", "10.0.0"}, wantErr: `--ip "10.0.0" is not an IP address`},
		{name: "missing role", args: []string{"--name", "x"}, wantErr: `required flag(s) "role" not set`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out, err := runMeshctl(t, append([]string{"certs", "issue", "--dir", dir}, tt.args...)...)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("error = %v, want it to contain %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("certs issue: %v\n%s", err, out)
			}
			if !strings.Contains(out, tt.basename+".pem") || !strings.Contains(out, tt.uri) {
				t.Errorf("output does not name the files and identity:\n%s", out)
			}
			uris, dns, ips := sans(checkCert(t, dir, tt.basename))
			if !slices.Equal(uris, []string{tt.uri}) || !slices.Equal(dns, tt.dns) || !slices.Equal(ips, tt.ips) {
				t.Errorf("SANs URI %v DNS %v IP %v; want %s %v %v", uris, dns, ips, tt.uri, tt.dns, tt.ips)
			}
		})
	}
	// --force replaces a certificate and its key.
	_, before := pki.Paths(dir, "node-ace")
	old, _ := os.ReadFile(before)
	if out, err := runMeshctl(t, "certs", "issue", "--dir", dir, "--role", "node", "--name", "ace", "--force"); err != nil {
		t.Fatalf("issue --force: %v\n%s", err, out)
	}
	if now, _ := os.ReadFile(before); bytes.Equal(old, now) {
		t.Fatal("issue --force kept the old key")
	}
	checkCert(t, dir, "node-ace")
}

func TestCertsIssueWithoutCA(t *testing.T) {
	_, err := runMeshctl(t, "certs", "issue", "--dir", t.TempDir(), "--role", "node", "--name", "ace")
	if err == nil || !strings.Contains(err.Error(), "run meshctl certs init first") {
		t.Fatalf("issue without a CA: %v, want a hint to run init", err)
	}
}
