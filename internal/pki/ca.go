// Package pki is mesh's development certificate authority and its TLS
// configurations: a CA per trust domain issuing one certificate per identity
// with exactly one SPIFFE URI SAN (DESIGN.md §8), files laid out the way
// meshctl certs writes them, and TLS 1.3 mutual-authentication configs that
// pick up rotated leaf certificates without a restart.
package pki

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"net/url"
	"os"
	"slices"
	"time"

	"mesh.dev/internal/identity"
)

// DefaultCAValidity is how long a CA made by NewCA is valid when no validity
// is given.
const DefaultCAValidity = 365 * 24 * time.Hour

// DefaultValidity is how long an issued certificate is valid when neither
// IssueOptions.Validity nor NotAfter is given. Certificates never outlive
// their CA.
const DefaultValidity = 365 * 24 * time.Hour

// backdate is subtracted from "now" for NotBefore so that a certificate is
// usable at once on machines whose clocks run a little behind the issuer's.
const backdate = 5 * time.Minute

// CA is a certificate authority of one trust domain. Its certificate carries
// the trust domain as the URI SAN spiffe://<trust-domain> and a name
// constraint permitting URI SANs in exactly that trust domain, so a
// certificate it signs for another trust domain fails chain verification.
type CA struct {
	cert        *x509.Certificate
	key         crypto.Signer
	certPEM     []byte
	keyPEM      []byte
	trustDomain string
}

// NewCA creates a self-signed ECDSA P-256 CA for trustDomain, valid for
// validity (DefaultCAValidity when zero).
func NewCA(trustDomain string, validity time.Duration) (*CA, error) {
	if err := identity.ValidateTrustDomain(trustDomain); err != nil {
		return nil, err
	}
	if validity < 0 {
		return nil, fmt.Errorf("ca validity %s is negative", validity)
	}
	if validity == 0 {
		validity = DefaultCAValidity
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generate ca key: %w", err)
	}
	serial, err := newSerial()
	if err != nil {
		return nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: "mesh CA " + trustDomain, Organization: []string{"mesh"}},
		NotBefore:             now.Add(-backdate),
		NotAfter:              now.Add(validity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
		URIs:                  []*url.URL{{Scheme: "spiffe", Host: trustDomain}},
		// Exactly the trust domain: its subdomains would be other trust
		// domains that authorization does not tell apart.
		PermittedURIDomains: []string{trustDomain},
		ExcludedURIDomains:  []string{"." + trustDomain},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, fmt.Errorf("create ca certificate: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("parse ca certificate: %w", err)
	}
	keyPEM, err := encodeKey(key)
	if err != nil {
		return nil, err
	}
	return &CA{
		cert:        cert,
		key:         key,
		certPEM:     pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		keyPEM:      keyPEM,
		trustDomain: trustDomain,
	}, nil
}

// LoadCA reads a CA written by WriteCA.
func LoadCA(certFile, keyFile string) (*CA, error) {
	certPEM, err := os.ReadFile(certFile)
	if err != nil {
		return nil, fmt.Errorf("read ca certificate: %w", err)
	}
	keyPEM, err := os.ReadFile(keyFile)
	if err != nil {
		return nil, fmt.Errorf("read ca key: %w", err)
	}
	ca, err := ParseCA(certPEM, keyPEM)
	if err != nil {
		return nil, fmt.Errorf("ca %s: %w", certFile, err)
	}
	return ca, nil
}

// ParseCA reads a CA from PEM: one certificate and its private key. The
// certificate must be a CA naming its trust domain as spiffe://<td>.
func ParseCA(certPEM, keyPEM []byte) (*CA, error) {
	certs, err := parseCertificates(certPEM)
	if err != nil {
		return nil, err
	}
	if len(certs) != 1 {
		return nil, fmt.Errorf("ca file holds %d certificates, want 1", len(certs))
	}
	cert := certs[0]
	if !cert.IsCA {
		return nil, errors.New("certificate is not a CA")
	}
	td, err := caTrustDomain(cert)
	if err != nil {
		return nil, err
	}
	key, err := parseKey(keyPEM)
	if err != nil {
		return nil, err
	}
	if !publicKeysEqual(cert.PublicKey, key.Public()) {
		return nil, errors.New("ca key does not match the ca certificate")
	}
	return &CA{
		cert:        cert,
		key:         key,
		certPEM:     pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: cert.Raw}),
		keyPEM:      slices.Clone(keyPEM),
		trustDomain: td,
	}, nil
}

// caTrustDomain reads the trust domain a CA certificate names in its single
// URI SAN spiffe://<td>.
func caTrustDomain(cert *x509.Certificate) (string, error) {
	if len(cert.URIs) != 1 {
		return "", fmt.Errorf("ca certificate has %d URI SANs, want 1 naming the trust domain (spiffe://<td>)", len(cert.URIs))
	}
	u := cert.URIs[0]
	if u.Scheme != "spiffe" || (u.Path != "" && u.Path != "/") || u.Host == "" {
		return "", fmt.Errorf("ca certificate URI SAN %q does not name a trust domain (spiffe://<td>)", u)
	}
	if err := identity.ValidateTrustDomain(u.Host); err != nil {
		return "", fmt.Errorf("ca certificate: %w", err)
	}
	return u.Host, nil
}

// CertPEM returns the CA certificate in PEM, the content of ca.pem.
func (ca *CA) CertPEM() []byte { return slices.Clone(ca.certPEM) }

// KeyPEM returns the CA's private key in PEM (PKCS #8), the content of
// ca-key.pem.
func (ca *CA) KeyPEM() []byte { return slices.Clone(ca.keyPEM) }

// Certificate returns the parsed CA certificate.
func (ca *CA) Certificate() *x509.Certificate { return ca.cert }

// TrustDomain returns the trust domain the CA issues for.
func (ca *CA) TrustDomain() string { return ca.trustDomain }

// Pool returns a certificate pool holding only this CA.
func (ca *CA) Pool() *x509.CertPool {
	pool := x509.NewCertPool()
	pool.AddCert(ca.cert)
	return pool
}

// IssueOptions shape an issued certificate. The zero value issues a
// certificate valid from a few minutes ago for DefaultValidity with the
// identity's default SANs.
type IssueOptions struct {
	// DNSNames and IPAddresses are added to the default SANs.
	DNSNames    []string
	IPAddresses []net.IP
	// NoDefaultSANs leaves out the default DNS and IP SANs (DefaultSANs).
	NoDefaultSANs bool
	// NotBefore defaults to now minus a few minutes of clock skew.
	NotBefore time.Time
	// NotAfter, when set, wins over Validity.
	NotAfter time.Time
	// Validity is counted from now; DefaultValidity when zero.
	Validity time.Duration
	// URIs, when not nil, replaces the identity's URI SAN: an empty non-nil
	// slice issues a certificate with no URI SAN. It exists for tests of
	// malformed certificates; the identity is then not validated.
	URIs []*url.URL
}

// DefaultSANs returns the DNS and IP SANs a certificate of id gets unless
// IssueOptions.NoDefaultSANs: services are reached as localhost, by their
// role name and on the loopback addresses; nodes serve their local admin API
// on loopback; operators and builders only act as clients and get none.
func DefaultSANs(id identity.Identity) (dns []string, ips []net.IP) {
	loopback := []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback}
	switch {
	case id.IsService():
		return []string{"localhost", string(id.Role)}, loopback
	case id.Role == identity.RoleNode:
		return []string{"localhost"}, loopback
	}
	return nil, nil
}

// Issue signs a new ECDSA P-256 key pair's certificate for id, usable both
// as a TLS server and a TLS client, and returns both in PEM (the key in
// PKCS #8). It refuses an identity of another trust domain.
func (ca *CA) Issue(id identity.Identity, opts IssueOptions) (certPEM, keyPEM []byte, err error) {
	uris := opts.URIs
	if uris == nil {
		if err := id.Validate(); err != nil {
			return nil, nil, fmt.Errorf("issue: %w", err)
		}
		if id.TrustDomain != ca.trustDomain {
			return nil, nil, fmt.Errorf("issue: identity %s is of trust domain %q, the ca's is %q", id, id.TrustDomain, ca.trustDomain)
		}
		uris = []*url.URL{id.URI()}
	}
	now := time.Now()
	notBefore := opts.NotBefore
	if notBefore.IsZero() {
		notBefore = now.Add(-backdate)
	}
	notAfter := opts.NotAfter
	if notAfter.IsZero() {
		validity := opts.Validity
		if validity < 0 {
			return nil, nil, fmt.Errorf("issue: validity %s is negative", validity)
		}
		if validity == 0 {
			validity = DefaultValidity
		}
		notAfter = now.Add(validity)
	}
	// A certificate that outlives its CA would fail verification anyway
	// once the CA expires; saying so in the certificate is clearer.
	if notAfter.After(ca.cert.NotAfter) {
		notAfter = ca.cert.NotAfter
	}
	if !notAfter.After(notBefore) {
		return nil, nil, fmt.Errorf("issue: not after %s is not after not before %s", notAfter.Format(time.RFC3339), notBefore.Format(time.RFC3339))
	}

	var dns []string
	var ips []net.IP
	if !opts.NoDefaultSANs {
		dns, ips = DefaultSANs(id)
	}
	for _, name := range opts.DNSNames {
		if !slices.Contains(dns, name) {
			dns = append(dns, name)
		}
	}
	for _, ip := range opts.IPAddresses {
		if !slices.ContainsFunc(ips, ip.Equal) {
			ips = append(ips, ip)
		}
	}

	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("issue: generate key: %w", err)
	}
	serial, err := newSerial()
	if err != nil {
		return nil, nil, err
	}
	cn := "mesh certificate"
	if id.Validate() == nil {
		cn = id.String()
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: cn, Organization: []string{"mesh"}},
		NotBefore:             notBefore,
		NotAfter:              notAfter,
		KeyUsage:              x509.KeyUsageDigitalSignature,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		BasicConstraintsValid: true,
		DNSNames:              dns,
		IPAddresses:           ips,
		URIs:                  uris,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, key.Public(), ca.key)
	if err != nil {
		return nil, nil, fmt.Errorf("issue: create certificate: %w", err)
	}
	keyPEM, err = encodeKey(key)
	if err != nil {
		return nil, nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), keyPEM, nil
}

func newSerial() (*big.Int, error) {
	// 128 random bits: unique without bookkeeping (RFC 5280 allows 20 octets).
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 128))
	if err != nil {
		return nil, fmt.Errorf("generate serial number: %w", err)
	}
	return serial, nil
}

func encodeKey(key crypto.Signer) ([]byte, error) {
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, fmt.Errorf("encode key: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), nil
}

// parseKey reads a PKCS #8 or SEC 1 ("EC PRIVATE KEY") private key.
func parseKey(keyPEM []byte) (crypto.Signer, error) {
	block, _ := pem.Decode(keyPEM)
	if block == nil {
		return nil, errors.New("no PEM block in key file")
	}
	var key any
	var err error
	switch block.Type {
	case "PRIVATE KEY":
		key, err = x509.ParsePKCS8PrivateKey(block.Bytes)
	case "EC PRIVATE KEY":
		key, err = x509.ParseECPrivateKey(block.Bytes)
	default:
		return nil, fmt.Errorf("key PEM block is %q, want PRIVATE KEY or EC PRIVATE KEY", block.Type)
	}
	if err != nil {
		return nil, fmt.Errorf("parse key: %w", err)
	}
	signer, ok := key.(crypto.Signer)
	if !ok {
		return nil, fmt.Errorf("key of type %T cannot sign", key)
	}
	return signer, nil
}

// parseCertificates reads every CERTIFICATE block of a PEM bundle.
func parseCertificates(data []byte) ([]*x509.Certificate, error) {
	var certs []*x509.Certificate
	for {
		var block *pem.Block
		block, data = pem.Decode(data)
		if block == nil {
			break
		}
		if block.Type != "CERTIFICATE" {
			continue
		}
		cert, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			return nil, fmt.Errorf("parse certificate: %w", err)
		}
		certs = append(certs, cert)
	}
	if len(certs) == 0 {
		return nil, errors.New("no CERTIFICATE PEM block")
	}
	return certs, nil
}

func publicKeysEqual(a, b crypto.PublicKey) bool {
	ka, ok := a.(interface{ Equal(crypto.PublicKey) bool })
	return ok && ka.Equal(b)
}
