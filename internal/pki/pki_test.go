package pki

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"io"
	"io/fs"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"mesh.dev/internal/identity"
)

const td = "mesh.test"

func newCA(t *testing.T) *CA {
	t.Helper()
	ca, err := NewCA(td, 24*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	return ca
}

func id(t *testing.T, role identity.Role, name string) identity.Identity {
	t.Helper()
	i, err := identity.New(td, role, name)
	if err != nil {
		t.Fatal(err)
	}
	return i
}

func parseCert(t *testing.T, certPEM []byte) *x509.Certificate {
	t.Helper()
	block, _ := pem.Decode(certPEM)
	if block == nil || block.Type != "CERTIFICATE" {
		t.Fatalf("no CERTIFICATE block in %q", certPEM)
	}
	c, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestNewCA(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		td       string
		validity time.Duration
		wantErr  string
	}{
		{name: "ok", td: "mesh.local", validity: time.Hour},
		{name: "default validity", td: "mesh.local"},
		{name: "underscore", td: "mesh_local"},
		{name: "bad trust domain", td: "Mesh", wantErr: "has characters outside"},
		{name: "empty trust domain", td: "", wantErr: "trust domain is empty"},
		{name: "negative validity", td: "mesh.local", validity: -time.Hour, wantErr: "is negative"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			ca, err := NewCA(tt.td, tt.validity)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("NewCA() error = %v, want it to contain %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			c := parseCert(t, ca.CertPEM())
			if !c.IsCA || c.MaxPathLen != 0 || !c.MaxPathLenZero {
				t.Errorf("IsCA=%v MaxPathLen=%d, want a CA that signs only leaves", c.IsCA, c.MaxPathLen)
			}
			if ca.TrustDomain() != tt.td {
				t.Errorf("TrustDomain() = %q, want %q", ca.TrustDomain(), tt.td)
			}
			want := tt.validity
			if want == 0 {
				want = DefaultCAValidity
			}
			if got := c.NotAfter.Sub(c.NotBefore); got < want || got > want+backdate+time.Minute {
				t.Errorf("validity %s, want about %s", got, want)
			}
			if _, err := ParseCA(ca.CertPEM(), ca.KeyPEM()); err != nil {
				t.Errorf("ParseCA of a new CA: %v", err)
			}
		})
	}
}

func TestIssue(t *testing.T) {
	t.Parallel()
	ca := newCA(t)
	loopback := []string{"127.0.0.1", "::1"}
	tests := []struct {
		name    string
		id      identity.Identity
		opts    IssueOptions
		wantURI string
		wantDNS []string
		wantIPs []string
		wantErr string
	}{
		{name: "service", id: id(t, identity.RoleSigner, ""), wantURI: "spiffe://mesh.test/service/signer", wantDNS: []string{"localhost", "signer"}, wantIPs: loopback},
		{name: "service extra SANs", id: id(t, identity.RoleComposer, ""),
			opts:    IssueOptions{DNSNames: []string{"composer.example", "localhost"}, IPAddresses: []net.IP{net.ParseIP("10.0.0.1"), net.ParseIP("127.0.0.1")}},
			wantURI: "spiffe://mesh.test/service/composer", wantDNS: []string{"localhost", "composer", "composer.example"}, wantIPs: []string{"127.0.0.1", "::1", "10.0.0.1"}},
		{name: "no default SANs", id: id(t, identity.RoleCatalog, ""), opts: IssueOptions{NoDefaultSANs: true, DNSNames: []string{"catalog.example"}},
			wantURI: "spiffe://mesh.test/service/catalog", wantDNS: []string{"catalog.example"}},
		{name: "node", id: id(t, identity.RoleNode, "ace"), wantURI: "spiffe://mesh.test/node/ace", wantDNS: []string{"localhost"}, wantIPs: loopback},
		{name: "operator", id: id(t, identity.RoleOperator, "admin"), wantURI: "spiffe://mesh.test/operator/admin"},
		{name: "builder", id: id(t, identity.RoleBuilder, "ci"), wantURI: "spiffe://mesh.test/builder/ci"},
		{name: "other trust domain", id: identity.Identity{TrustDomain: "other", Role: identity.RoleNode, Name: "ace"}, wantErr: `is of trust domain "other", the ca's is "mesh.test"`},
		{name: "invalid identity", id: identity.Identity{TrustDomain: td, Role: identity.RoleNode, Name: "Ace"}, wantErr: `node name "Ace" is not a DNS label`},
		{name: "zero identity", wantErr: "trust domain is empty"},
		{name: "not after before not before", id: id(t, identity.RoleNode, "ace"), opts: IssueOptions{NotAfter: time.Now().Add(-time.Hour)}, wantErr: "is not after not before"},
		{name: "negative validity", id: id(t, identity.RoleNode, "ace"), opts: IssueOptions{Validity: -time.Second}, wantErr: "is negative"},
		{name: "no URI override", opts: IssueOptions{URIs: []*url.URL{}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			certPEM, keyPEM, err := ca.Issue(tt.id, tt.opts)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("Issue() error = %v, want it to contain %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if _, err := tls.X509KeyPair(certPEM, keyPEM); err != nil {
				t.Fatalf("issued pair does not load: %v", err)
			}
			c := parseCert(t, certPEM)
			var uris []string
			for _, u := range c.URIs {
				uris = append(uris, u.String())
			}
			if tt.wantURI == "" {
				if len(uris) != 0 {
					t.Errorf("URI SANs = %v, want none", uris)
				}
			} else if !slices.Equal(uris, []string{tt.wantURI}) {
				t.Errorf("URI SANs = %v, want [%s]", uris, tt.wantURI)
			}
			if !slices.Equal(c.DNSNames, tt.wantDNS) {
				t.Errorf("DNS SANs = %v, want %v", c.DNSNames, tt.wantDNS)
			}
			var ips []string
			for _, ip := range c.IPAddresses {
				ips = append(ips, ip.String())
			}
			if !slices.Equal(ips, tt.wantIPs) {
				t.Errorf("IP SANs = %v, want %v", ips, tt.wantIPs)
			}
			if !slices.Equal(c.ExtKeyUsage, []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}) {
				t.Errorf("ExtKeyUsage = %v, want server and client auth", c.ExtKeyUsage)
			}
			if c.IsCA {
				t.Error("issued certificate is a CA")
			}
			if _, err := c.Verify(x509.VerifyOptions{Roots: ca.Pool(), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}); err != nil {
				t.Errorf("issued certificate does not verify against its CA: %v", err)
			}
		})
	}
}

func TestIssueNeverOutlivesCA(t *testing.T) {
	t.Parallel()
	ca := newCA(t) // valid for a day
	certPEM, _, err := ca.Issue(id(t, identity.RoleNode, "ace"), IssueOptions{Validity: 48 * time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := parseCert(t, certPEM).NotAfter, ca.Certificate().NotAfter; !got.Equal(want) {
		t.Fatalf("NotAfter = %s, want the CA's %s", got, want)
	}
}

// TestNameConstraint shows that a certificate the CA signs for another
// trust domain, or a subdomain of its own, fails chain verification.
func TestNameConstraint(t *testing.T) {
	t.Parallel()
	ca := newCA(t)
	tests := []struct {
		uri string
		ok  bool
	}{
		{"spiffe://mesh.test/node/ace", true},
		{"spiffe://other.test/node/ace", false},
		{"spiffe://sub.mesh.test/node/ace", false},
	}
	for _, tt := range tests {
		t.Run(tt.uri, func(t *testing.T) {
			t.Parallel()
			u, _ := url.Parse(tt.uri)
			certPEM, _, err := ca.Issue(identity.Identity{}, IssueOptions{URIs: []*url.URL{u}})
			if err != nil {
				t.Fatal(err)
			}
			_, err = parseCert(t, certPEM).Verify(x509.VerifyOptions{Roots: ca.Pool(), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}})
			if tt.ok && err != nil {
				t.Fatalf("Verify: %v", err)
			}
			if !tt.ok && err == nil {
				t.Fatal("Verify accepted a certificate outside the CA's trust domain")
			}
		})
	}
}

func TestWriteAndLoadCA(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "certs")
	ca := newCA(t)
	if err := WriteCA(dir, ca); err != nil {
		t.Fatal(err)
	}
	assertMode(t, filepath.Join(dir, CAKeyFile), 0o600)
	assertMode(t, filepath.Join(dir, CACertFile), 0o644)
	assertMode(t, dir, 0o700|fs.ModeDir)

	loaded, err := LoadCA(filepath.Join(dir, CACertFile), filepath.Join(dir, CAKeyFile))
	if err != nil {
		t.Fatal(err)
	}
	if loaded.TrustDomain() != td {
		t.Errorf("TrustDomain() = %q, want %q", loaded.TrustDomain(), td)
	}
	// A certificate the loaded CA issues verifies against the original.
	certPEM, _, err := loaded.Issue(id(t, identity.RoleNode, "ace"), IssueOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := parseCert(t, certPEM).Verify(x509.VerifyOptions{Roots: ca.Pool(), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}); err != nil {
		t.Fatalf("certificate of the loaded CA does not verify against the original: %v", err)
	}

	if err := WriteCA(dir, newCA(t)); err == nil || !strings.Contains(err.Error(), "refusing to overwrite") {
		t.Fatalf("second WriteCA error = %v, want a refusal", err)
	}
	if again, _ := os.ReadFile(filepath.Join(dir, CAKeyFile)); string(again) != string(ca.KeyPEM()) {
		t.Fatal("a refused WriteCA changed the key")
	}
	other := newCA(t)
	if err := WriteCA(dir, other, Force()); err != nil {
		t.Fatalf("WriteCA with Force: %v", err)
	}
	if again, _ := os.ReadFile(filepath.Join(dir, CAKeyFile)); string(again) != string(other.KeyPEM()) {
		t.Fatal("WriteCA with Force did not replace the key")
	}
	assertMode(t, filepath.Join(dir, CAKeyFile), 0o600)
}

func TestParseCAErrors(t *testing.T) {
	t.Parallel()
	ca := newCA(t)
	leafPEM, leafKey, err := ca.Issue(id(t, identity.RoleNode, "ace"), IssueOptions{})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name          string
		cert, key     []byte
		wantErrSubstr string
	}{
		{"not a CA", leafPEM, leafKey, "certificate is not a CA"},
		{"key mismatch", ca.CertPEM(), leafKey, "ca key does not match"},
		{"no certificate", nil, ca.KeyPEM(), "no CERTIFICATE PEM block"},
		{"two certificates", append(ca.CertPEM(), newCA(t).CertPEM()...), ca.KeyPEM(), "holds 2 certificates"},
		{"no key", ca.CertPEM(), nil, "no PEM block in key file"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if _, err := ParseCA(tt.cert, tt.key); err == nil || !strings.Contains(err.Error(), tt.wantErrSubstr) {
				t.Fatalf("ParseCA() error = %v, want it to contain %q", err, tt.wantErrSubstr)
			}
		})
	}
}

func TestWriteIssued(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	ca := newCA(t)
	node := id(t, identity.RoleNode, "ace")
	certPEM, keyPEM, err := ca.Issue(node, IssueOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got := Basename(node); got != "node-ace" {
		t.Fatalf("Basename(node/ace) = %q", got)
	}
	if got := Basename(id(t, identity.RoleSigner, "")); got != "signer" {
		t.Fatalf("Basename(service/signer) = %q", got)
	}
	if err := WriteIssued(dir, Basename(node), certPEM, keyPEM); err != nil {
		t.Fatal(err)
	}
	certFile, keyFile := Paths(dir, "node-ace")
	if certFile != filepath.Join(dir, "node-ace.pem") || keyFile != filepath.Join(dir, "node-ace-key.pem") {
		t.Fatalf("Paths() = %s, %s", certFile, keyFile)
	}
	assertMode(t, keyFile, 0o600)
	assertMode(t, certFile, 0o644)
	if _, err := tls.LoadX509KeyPair(certFile, keyFile); err != nil {
		t.Fatal(err)
	}
	if err := WriteIssued(dir, "node-ace", certPEM, keyPEM); err == nil || !strings.Contains(err.Error(), "refusing to overwrite") {
		t.Fatalf("second WriteIssued error = %v, want a refusal", err)
	}
	if err := WriteIssued(dir, "node-ace", certPEM, keyPEM, Force()); err != nil {
		t.Fatal(err)
	}
	if err := WriteIssued(dir, "../escape", certPEM, keyPEM); err == nil {
		t.Fatal("WriteIssued accepted a basename with a path")
	}
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		if strings.Contains(e.Name(), ".tmp-") {
			t.Errorf("temporary file %s left behind", e.Name())
		}
	}
}

func assertMode(t *testing.T, path string, want fs.FileMode) {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if got := fi.Mode(); got != want {
		t.Errorf("mode of %s = %v, want %v", path, got, want)
	}
}

// handshake runs a TLS handshake over an in-memory pipe and returns what
// each side saw. In TLS 1.3 the client finishes before the server has
// checked the client's certificate, so the client also reads the server's
// first byte, which is where a refusal of its certificate shows.
func handshake(t *testing.T, clientCfg, serverCfg *tls.Config) (clientErr, serverErr error) {
	t.Helper()
	c, s := net.Pipe()
	deadline := time.Now().Add(10 * time.Second)
	_ = c.SetDeadline(deadline)
	_ = s.SetDeadline(deadline)
	done := make(chan error, 1)
	go func() {
		// Closing the raw pipe, not the TLS conn: close_notify would block
		// on the synchronous pipe until the other side read it.
		defer s.Close()
		srv := tls.Server(s, serverCfg)
		if err := srv.Handshake(); err != nil {
			done <- err
			return
		}
		_, err := srv.Write([]byte{1})
		done <- err
	}()
	cli := tls.Client(c, clientCfg)
	clientErr = cli.Handshake()
	if clientErr == nil {
		_, clientErr = io.ReadFull(cli, make([]byte, 1))
	}
	c.Close()
	return clientErr, <-done
}

func TestHandshake(t *testing.T) {
	t.Parallel()
	ca := newCA(t)
	otherCA := newCA(t)
	issue := func(ca *CA, i identity.Identity, opts IssueOptions) (certPEM, keyPEM []byte) {
		certPEM, keyPEM, err := ca.Issue(i, opts)
		if err != nil {
			t.Fatal(err)
		}
		return certPEM, keyPEM
	}
	server := func(ca *CA, opts IssueOptions) *tls.Config {
		certPEM, keyPEM := issue(ca, id(t, identity.RoleComposer, ""), opts)
		cfg, err := ServerTLSFromPEM(certPEM, keyPEM, ca.CertPEM())
		if err != nil {
			t.Fatal(err)
		}
		return cfg
	}
	client := func(ca *CA, opts IssueOptions, serverName string) *tls.Config {
		certPEM, keyPEM := issue(ca, id(t, identity.RoleNode, "ace"), opts)
		// Clients verify servers against the mesh CA whatever signed their
		// own certificate.
		cfg, err := ClientTLSFromPEM(certPEM, keyPEM, ca.CertPEM())
		if err != nil {
			t.Fatal(err)
		}
		cfg.RootCAs = ca.Pool()
		cfg.ServerName = serverName
		return cfg
	}
	past := IssueOptions{NotBefore: time.Now().Add(-2 * time.Hour), NotAfter: time.Now().Add(-time.Hour)}
	future := IssueOptions{NotBefore: time.Now().Add(time.Hour), NotAfter: time.Now().Add(2 * time.Hour)}
	tls12 := client(ca, IssueOptions{}, "localhost")
	tls12.MinVersion, tls12.MaxVersion = tls.VersionTLS12, tls.VersionTLS12
	otherClient := client(otherCA, IssueOptions{}, "localhost")
	otherClient.RootCAs = ca.Pool()
	noCert := client(ca, IssueOptions{}, "localhost")
	noCert.GetClientCertificate = nil

	tests := []struct {
		name      string
		client    *tls.Config
		server    *tls.Config
		wantError string // in either side's error; empty for success
	}{
		{name: "localhost", client: client(ca, IssueOptions{}, "localhost"), server: server(ca, IssueOptions{})},
		{name: "127.0.0.1", client: client(ca, IssueOptions{}, "127.0.0.1"), server: server(ca, IssueOptions{})},
		{name: "::1", client: client(ca, IssueOptions{}, "::1"), server: server(ca, IssueOptions{})},
		{name: "role name", client: client(ca, IssueOptions{}, "composer"), server: server(ca, IssueOptions{})},
		{name: "unknown host", client: client(ca, IssueOptions{}, "example.com"), server: server(ca, IssueOptions{}), wantError: "certificate is valid for"},
		{name: "client expired", client: client(ca, past, "localhost"), server: server(ca, IssueOptions{}), wantError: "remote error: tls: expired certificate"},
		{name: "client not yet valid", client: client(ca, future, "localhost"), server: server(ca, IssueOptions{}), wantError: "certificate has expired or is not yet valid: current time"},
		{name: "client of another CA", client: otherClient, server: server(ca, IssueOptions{}), wantError: "unknown authority"},
		{name: "client without certificate", client: noCert, server: server(ca, IssueOptions{}), wantError: "client didn't provide a certificate"},
		{name: "server expired", client: client(ca, IssueOptions{}, "localhost"), server: server(ca, past), wantError: "certificate has expired or is not yet valid: current time"},
		{name: "server not yet valid", client: client(ca, IssueOptions{}, "localhost"), server: server(ca, future), wantError: "expired or is not yet valid"},
		{name: "server of another CA", client: client(ca, IssueOptions{}, "localhost"), server: server(otherCA, IssueOptions{}), wantError: "unknown authority"},
		{name: "TLS 1.2 client", client: tls12, server: server(ca, IssueOptions{}), wantError: "protocol version"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			clientErr, serverErr := handshake(t, tt.client, tt.server)
			if tt.wantError == "" {
				if clientErr != nil || serverErr != nil {
					t.Fatalf("handshake failed: client %v, server %v", clientErr, serverErr)
				}
				return
			}
			if clientErr == nil || serverErr == nil {
				t.Fatalf("handshake succeeded on one side: client %v, server %v", clientErr, serverErr)
			}
			both := clientErr.Error() + " | " + serverErr.Error()
			if !strings.Contains(both, tt.wantError) {
				t.Fatalf("handshake errors %q, want one containing %q", both, tt.wantError)
			}
		})
	}
}

// TestRequireService: a client dialing a service takes only that service's
// certificate: a node's certificate also holds localhost, so the host name
// alone does not tell it from the composer.
func TestRequireService(t *testing.T) {
	t.Parallel()
	ca := newCA(t)
	issue := func(i identity.Identity) (certPEM, keyPEM []byte) {
		certPEM, keyPEM, err := ca.Issue(i, IssueOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return certPEM, keyPEM
	}
	certPEM, keyPEM := issue(id(t, identity.RoleNode, "ace"))
	base, err := ClientTLSFromPEM(certPEM, keyPEM, ca.CertPEM())
	if err != nil {
		t.Fatal(err)
	}
	base.ServerName = "localhost"
	tests := []struct {
		name    string
		server  identity.Identity
		refusal string
	}{
		{name: "the service", server: id(t, identity.RoleComposer, "")},
		{name: "a node posing as the composer", server: id(t, identity.RoleNode, "bob"), refusal: "not the composer service"},
		{name: "another service", server: id(t, identity.RoleCatalog, ""), refusal: "not the composer service"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			sc, sk := issue(tt.server)
			srv, err := ServerTLSFromPEM(sc, sk, ca.CertPEM())
			if err != nil {
				t.Fatal(err)
			}
			clientErr, _ := handshake(t, RequireService(base, identity.RoleComposer), srv)
			if tt.refusal == "" && clientErr != nil {
				t.Fatalf("handshake: %v", clientErr)
			}
			if tt.refusal != "" && (clientErr == nil || !strings.Contains(clientErr.Error(), tt.refusal)) {
				t.Fatalf("client error = %v, want a refusal of the peer: %q", clientErr, tt.refusal)
			}
		})
	}
}

// TestReload shows that file-backed configs pick up a rotated certificate
// at the next handshake and keep the last good pair while the files do not
// match.
func TestReload(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	ca := newCA(t)
	if err := WriteCA(dir, ca); err != nil {
		t.Fatal(err)
	}
	composer := id(t, identity.RoleComposer, "")
	write := func(i identity.Identity) *x509.Certificate {
		certPEM, keyPEM, err := ca.Issue(i, IssueOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if err := WriteIssued(dir, Basename(i), certPEM, keyPEM, Force()); err != nil {
			t.Fatal(err)
		}
		return parseCert(t, certPEM)
	}
	first := write(composer)
	node := id(t, identity.RoleNode, "ace")
	write(node)
	caFile := filepath.Join(dir, CACertFile)
	sc, sk := Paths(dir, Basename(composer))
	srv, err := ServerTLS(sc, sk, caFile)
	if err != nil {
		t.Fatal(err)
	}
	cc, ck := Paths(dir, Basename(node))
	cli, err := ClientTLS(cc, ck, caFile)
	if err != nil {
		t.Fatal(err)
	}
	cli.ServerName = "localhost"

	served := func() string {
		var got *x509.Certificate
		c := cli.Clone()
		c.VerifyConnection = func(cs tls.ConnectionState) error {
			got = cs.PeerCertificates[0]
			return nil
		}
		if clientErr, serverErr := handshake(t, c, srv); clientErr != nil || serverErr != nil {
			t.Fatalf("handshake: client %v, server %v", clientErr, serverErr)
		}
		return got.SerialNumber.String()
	}
	if got := served(); got != first.SerialNumber.String() {
		t.Fatalf("served serial %s, want the first %s", got, first.SerialNumber)
	}
	second := write(composer)
	if got := served(); got != second.SerialNumber.String() {
		t.Fatalf("after rotation served serial %s, want the second %s", got, second.SerialNumber)
	}
	// A key without its certificate: the last good pair is kept.
	_, strayKey, err := ca.Issue(composer, IssueOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(sk, strayKey, 0o600); err != nil {
		t.Fatal(err)
	}
	if got := served(); got != second.SerialNumber.String() {
		t.Fatalf("with mismatched files served serial %s, want the last good %s", got, second.SerialNumber)
	}
	third := write(composer)
	if got := served(); got != third.SerialNumber.String() {
		t.Fatalf("after the pair matched again served serial %s, want %s", got, third.SerialNumber)
	}
}

func TestLoadErrors(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	ca := newCA(t)
	if err := WriteCA(dir, ca); err != nil {
		t.Fatal(err)
	}
	caFile := filepath.Join(dir, CACertFile)
	certPEM, keyPEM, err := ca.Issue(id(t, identity.RoleNode, "ace"), IssueOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := WriteIssued(dir, "node-ace", certPEM, keyPEM); err != nil {
		t.Fatal(err)
	}
	cert, key := Paths(dir, "node-ace")
	missing := filepath.Join(dir, "missing.pem")
	tests := []struct {
		name                string
		cert, key, ca       string
		wantErr             string
		wantNotExistWrapped bool
	}{
		{name: "missing ca", cert: cert, key: key, ca: missing, wantErr: "read ca bundle", wantNotExistWrapped: true},
		{name: "missing cert", cert: missing, key: key, ca: caFile, wantErr: "load key pair", wantNotExistWrapped: true},
		{name: "leaf as ca", cert: cert, key: key, ca: cert, wantErr: "which is not a CA"},
		{name: "swapped", cert: key, key: cert, ca: caFile, wantErr: "load key pair"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			for name, fn := range map[string]func(string, string, string) (*tls.Config, error){"server": ServerTLS, "client": ClientTLS} {
				_, err := fn(tt.cert, tt.key, tt.ca)
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Errorf("%s: error = %v, want it to contain %q", name, err, tt.wantErr)
				}
				if tt.wantNotExistWrapped && !errors.Is(err, fs.ErrNotExist) {
					t.Errorf("%s: error %v does not wrap fs.ErrNotExist", name, err)
				}
			}
		})
	}
}
