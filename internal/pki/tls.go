package pki

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"sync"

	"mesh.dev/internal/identity"
)

// ServerTLS returns a TLS 1.3 server config that presents the certificate in
// certFile and keyFile and requires every client to present a certificate
// verified against the CAs in caFile. The certificate files are re-read on a
// handshake after they change (see WriteIssued), so a rotated certificate is
// served without a restart; the CA pool is read once.
func ServerTLS(certFile, keyFile, caFile string) (*tls.Config, error) {
	pool, err := loadPool(caFile)
	if err != nil {
		return nil, err
	}
	r, err := newReloader(certFile, keyFile)
	if err != nil {
		return nil, err
	}
	return serverConfig(pool, r.get), nil
}

// ClientTLS returns a TLS 1.3 client config that presents the certificate in
// certFile and keyFile and verifies the server's certificate against the CAs
// in caFile. ServerName is left empty: gRPC sets it from the target's
// authority, so dialing "localhost:port" or "127.0.0.1:port" matches a
// service's default SANs. The certificate files are re-read on a handshake
// after they change; the CA pool is read once.
func ClientTLS(certFile, keyFile, caFile string) (*tls.Config, error) {
	pool, err := loadPool(caFile)
	if err != nil {
		return nil, err
	}
	r, err := newReloader(certFile, keyFile)
	if err != nil {
		return nil, err
	}
	return clientConfig(pool, r.get), nil
}

// ServerTLSFromPEM is ServerTLS from PEM held in memory.
func ServerTLSFromPEM(certPEM, keyPEM, caPEM []byte) (*tls.Config, error) {
	pool, pair, err := fromPEM(certPEM, keyPEM, caPEM)
	if err != nil {
		return nil, err
	}
	return serverConfig(pool, func() (*tls.Certificate, error) { return pair, nil }), nil
}

// ClientTLSFromPEM is ClientTLS from PEM held in memory.
func ClientTLSFromPEM(certPEM, keyPEM, caPEM []byte) (*tls.Config, error) {
	pool, pair, err := fromPEM(certPEM, keyPEM, caPEM)
	if err != nil {
		return nil, err
	}
	return clientConfig(pool, func() (*tls.Certificate, error) { return pair, nil }), nil
}

// RequireService returns a copy of cfg that also refuses a handshake unless
// the peer's verified certificate is of the service role, in this client's
// own trust domain when its certificate says which. A client dialing a
// service uses it: the host name alone does not say which service answered
// (a node's certificate holds "localhost" too).
func RequireService(cfg *tls.Config, role identity.Role) *tls.Config {
	out := cfg.Clone()
	prev := cfg.VerifyConnection
	own := clientTrustDomain(cfg)
	out.VerifyConnection = func(cs tls.ConnectionState) error {
		if prev != nil {
			if err := prev(cs); err != nil {
				return err
			}
		}
		if len(cs.VerifiedChains) == 0 || len(cs.VerifiedChains[0]) == 0 {
			return errors.New("peer presented no verified certificate")
		}
		id, err := identity.FromCertificate(cs.VerifiedChains[0][0])
		if err != nil {
			return fmt.Errorf("peer: %w", err)
		}
		if id.Role != role {
			return fmt.Errorf("peer is %s, not the %s service", id.URI(), role)
		}
		if own != "" && id.TrustDomain != own {
			return fmt.Errorf("peer is %s, of trust domain %q, not this client's %q", id.URI(), id.TrustDomain, own)
		}
		return nil
	}
	return out
}

// clientTrustDomain is the trust domain of a client config's own
// certificate, "" when it cannot be read.
func clientTrustDomain(cfg *tls.Config) string {
	var cert *tls.Certificate
	switch {
	case len(cfg.Certificates) > 0:
		cert = &cfg.Certificates[0]
	case cfg.GetClientCertificate != nil:
		c, err := cfg.GetClientCertificate(&tls.CertificateRequestInfo{})
		if err != nil {
			return ""
		}
		cert = c
	}
	td, err := TrustDomainOf(cert)
	if err != nil {
		return ""
	}
	return td
}

// TrustDomainOf returns the trust domain of a certificate's identity; ""
// for no certificate.
func TrustDomainOf(cert *tls.Certificate) (string, error) {
	if cert == nil || len(cert.Certificate) == 0 {
		return "", nil
	}
	leaf := cert.Leaf
	if leaf == nil {
		var err error
		if leaf, err = x509.ParseCertificate(cert.Certificate[0]); err != nil {
			return "", err
		}
	}
	id, err := identity.FromCertificate(leaf)
	if err != nil {
		return "", err
	}
	return id.TrustDomain, nil
}

func serverConfig(pool *x509.CertPool, get func() (*tls.Certificate, error)) *tls.Config {
	return &tls.Config{
		MinVersion:                  tls.VersionTLS13,
		DynamicRecordSizingDisabled: true,
		ClientAuth:                  tls.RequireAndVerifyClientCert,
		ClientCAs:                   pool,
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
			return get()
		},
	}
}

func clientConfig(pool *x509.CertPool, get func() (*tls.Certificate, error)) *tls.Config {
	return &tls.Config{
		MinVersion:                  tls.VersionTLS13,
		DynamicRecordSizingDisabled: true,
		RootCAs:                     pool,
		// Always present the certificate: left to crypto/tls, a client whose
		// certificate the server's CA list does not name sends none, and the
		// server's error then hides which certificate was refused.
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			return get()
		},
	}
}

func fromPEM(certPEM, keyPEM, caPEM []byte) (*x509.CertPool, *tls.Certificate, error) {
	pool, err := parsePool(caPEM)
	if err != nil {
		return nil, nil, err
	}
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, nil, fmt.Errorf("load key pair: %w", err)
	}
	return pool, &pair, nil
}

func loadPool(caFile string) (*x509.CertPool, error) {
	data, err := os.ReadFile(caFile)
	if err != nil {
		return nil, fmt.Errorf("read ca bundle: %w", err)
	}
	pool, err := parsePool(data)
	if err != nil {
		return nil, fmt.Errorf("ca bundle %s: %w", caFile, err)
	}
	return pool, nil
}

// parsePool reads a bundle of CA certificates; a bundle may hold an old and
// a new CA while the CA is rotated.
func parsePool(caPEM []byte) (*x509.CertPool, error) {
	certs, err := parseCertificates(caPEM)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	for _, c := range certs {
		if !c.IsCA {
			return nil, fmt.Errorf("ca bundle holds %q, which is not a CA", c.Subject.CommonName)
		}
		pool.AddCert(c)
	}
	return pool, nil
}

// reloader serves a key pair from files and re-reads it when either file
// changed, keeping the last good pair while the files do not form one (for
// instance between the writes of a new key and its certificate).
type reloader struct {
	certFile, keyFile string

	mu       sync.Mutex
	pair     *tls.Certificate
	certStat os.FileInfo
	keyStat  os.FileInfo
}

func newReloader(certFile, keyFile string) (*reloader, error) {
	r := &reloader{certFile: certFile, keyFile: keyFile}
	if err := r.load(); err != nil {
		return nil, err
	}
	return r, nil
}

func (r *reloader) load() error {
	certStat, err := os.Stat(r.certFile)
	if err != nil {
		return fmt.Errorf("load key pair: %w", err)
	}
	keyStat, err := os.Stat(r.keyFile)
	if err != nil {
		return fmt.Errorf("load key pair: %w", err)
	}
	pair, err := tls.LoadX509KeyPair(r.certFile, r.keyFile)
	if err != nil {
		return fmt.Errorf("load key pair %s, %s: %w", r.certFile, r.keyFile, err)
	}
	r.pair, r.certStat, r.keyStat = &pair, certStat, keyStat
	return nil
}

// get returns the current pair. It runs on every handshake, so an unchanged
// pair costs two stats.
func (r *reloader) get() (*tls.Certificate, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.changed() {
		// On failure the last good pair stays; the next handshake retries.
		_ = r.load()
	}
	return r.pair, nil
}

func (r *reloader) changed() bool {
	certStat, err := os.Stat(r.certFile)
	if err != nil {
		return false
	}
	keyStat, err := os.Stat(r.keyFile)
	if err != nil {
		return false
	}
	return statChanged(r.certStat, certStat) || statChanged(r.keyStat, keyStat)
}

// statChanged compares identity as well as time and size: WriteIssued
// renames a new file into place, which a coarse mtime alone could miss.
func statChanged(old, cur os.FileInfo) bool {
	return !os.SameFile(old, cur) || !old.ModTime().Equal(cur.ModTime()) || old.Size() != cur.Size()
}
