// Package testutil holds test helpers shared by mesh's packages and
// services: a throwaway PKI, mTLS gRPC servers and clients, and an embedded
// JetStream.
package testutil

import (
	"crypto/tls"
	"net/url"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"mesh.dev/internal/identity"
	"mesh.dev/internal/pki"
)

// TrustDomain is the trust domain of every PKI NewPKI makes.
const TrustDomain = "mesh.test"

// PKI is a CA of TrustDomain whose files live in a test's temporary
// directory.
type PKI struct {
	CA *pki.CA
	// Dir holds ca.pem, ca-key.pem and the certificates Files wrote.
	Dir string

	mu    sync.Mutex
	files map[identity.Identity][2]string
}

// NewPKI makes a new CA valid for a day and writes it to a temporary
// directory.
func NewPKI(t testing.TB) *PKI {
	t.Helper()
	ca, err := pki.NewCA(TrustDomain, 24*time.Hour)
	if err != nil {
		t.Fatalf("testutil: new ca: %v", err)
	}
	dir := t.TempDir()
	if err := pki.WriteCA(dir, ca); err != nil {
		t.Fatalf("testutil: write ca: %v", err)
	}
	return &PKI{CA: ca, Dir: dir, files: map[identity.Identity][2]string{}}
}

// Identity returns the identity of role and name in the PKI's trust
// domain; a service's name is filled in when empty. It does not validate,
// so tests can build malformed identities.
func (p *PKI) Identity(role identity.Role, name string) identity.Identity {
	if role.IsService() && name == "" {
		name = string(role)
	}
	return identity.Identity{TrustDomain: p.CA.TrustDomain(), Role: role, Name: name}
}

// CAFile returns the path of ca.pem.
func (p *PKI) CAFile() string { return filepath.Join(p.Dir, pki.CACertFile) }

// Issue issues a certificate for id with opts and returns its PEM.
func (p *PKI) Issue(t testing.TB, id identity.Identity, opts pki.IssueOptions) (certPEM, keyPEM []byte) {
	t.Helper()
	certPEM, keyPEM, err := p.CA.Issue(id, opts)
	if err != nil {
		t.Fatalf("testutil: issue %s: %v", id, err)
	}
	return certPEM, keyPEM
}

// Files returns the certificate, key and CA files of id, issuing and
// writing the certificate the first time id is asked for.
func (p *PKI) Files(t testing.TB, id identity.Identity) (certFile, keyFile, caFile string) {
	t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	if f, ok := p.files[id]; ok {
		return f[0], f[1], p.CAFile()
	}
	certPEM, keyPEM := p.Issue(t, id, pki.IssueOptions{})
	base := pki.Basename(id)
	if err := pki.WriteIssued(p.Dir, base, certPEM, keyPEM); err != nil {
		t.Fatalf("testutil: write %s: %v", id, err)
	}
	certFile, keyFile = pki.Paths(p.Dir, base)
	p.files[id] = [2]string{certFile, keyFile}
	return certFile, keyFile, p.CAFile()
}

// ServerTLS returns a server config presenting id's certificate from files
// (so the reloading path is the one tested).
func (p *PKI) ServerTLS(t testing.TB, id identity.Identity) *tls.Config {
	t.Helper()
	cfg, err := pki.ServerTLS(p.Files(t, id))
	if err != nil {
		t.Fatalf("testutil: server tls for %s: %v", id, err)
	}
	return cfg
}

// ClientTLS returns a client config presenting id's certificate from files.
func (p *PKI) ClientTLS(t testing.TB, id identity.Identity) *tls.Config {
	t.Helper()
	cfg, err := pki.ClientTLS(p.Files(t, id))
	if err != nil {
		t.Fatalf("testutil: client tls for %s: %v", id, err)
	}
	return cfg
}

// ClientTLSWith returns a client config presenting a certificate issued for
// id with opts, held in memory; the helpers for odd certificates below use
// it.
func (p *PKI) ClientTLSWith(t testing.TB, id identity.Identity, opts pki.IssueOptions) *tls.Config {
	t.Helper()
	certPEM, keyPEM := p.Issue(t, id, opts)
	cfg, err := pki.ClientTLSFromPEM(certPEM, keyPEM, p.CA.CertPEM())
	if err != nil {
		t.Fatalf("testutil: client tls for %s: %v", id, err)
	}
	return cfg
}

// ExpiredClientTLS presents a certificate of id that expired an hour ago.
func (p *PKI) ExpiredClientTLS(t testing.TB, id identity.Identity) *tls.Config {
	t.Helper()
	now := time.Now()
	return p.ClientTLSWith(t, id, pki.IssueOptions{NotBefore: now.Add(-2 * time.Hour), NotAfter: now.Add(-time.Hour)})
}

// NotYetValidClientTLS presents a certificate of id valid from an hour from
// now.
func (p *PKI) NotYetValidClientTLS(t testing.TB, id identity.Identity) *tls.Config {
	t.Helper()
	now := time.Now()
	return p.ClientTLSWith(t, id, pki.IssueOptions{NotBefore: now.Add(time.Hour), NotAfter: now.Add(2 * time.Hour)})
}

// URISANsClientTLS presents a certificate of this CA whose URI SANs are
// exactly uris (none when empty), for malformed-identity tests. A URI
// outside the trust domain fails the handshake (the CA's name constraint).
func (p *PKI) URISANsClientTLS(t testing.TB, uris ...string) *tls.Config {
	t.Helper()
	parsed := []*url.URL{}
	for _, s := range uris {
		u, err := url.Parse(s)
		if err != nil {
			t.Fatalf("testutil: uri %q: %v", s, err)
		}
		parsed = append(parsed, u)
	}
	return p.ClientTLSWith(t, identity.Identity{}, pki.IssueOptions{URIs: parsed})
}

// NoURISANClientTLS presents a certificate of this CA with no URI SAN.
func (p *PKI) NoURISANClientTLS(t testing.TB) *tls.Config {
	t.Helper()
	return p.URISANsClientTLS(t)
}

// TwoURISANsClientTLS presents a certificate of this CA with two valid
// SPIFFE IDs, which names no single identity.
func (p *PKI) TwoURISANsClientTLS(t testing.TB) *tls.Config {
	t.Helper()
	return p.URISANsClientTLS(t,
		p.Identity(identity.RoleOperator, "admin").URI().String(),
		p.Identity(identity.RoleNode, "ace").URI().String())
}

// OtherCAClientTLS presents a certificate of id issued by another CA of the
// same trust domain, while trusting this PKI's CA for the server.
func (p *PKI) OtherCAClientTLS(t testing.TB, id identity.Identity) *tls.Config {
	t.Helper()
	cfg := NewPKI(t).ClientTLSWith(t, id, pki.IssueOptions{})
	cfg.RootCAs = p.CA.Pool()
	return cfg
}

// NoCertClientTLS trusts this PKI's CA and presents no certificate.
func (p *PKI) NoCertClientTLS() *tls.Config {
	return &tls.Config{MinVersion: tls.VersionTLS13, RootCAs: p.CA.Pool()}
}
