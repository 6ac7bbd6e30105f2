// Package onebox runs the whole mesh in one process: an embedded JetStream,
// the catalog, the signer, the composer and N node engines, each applying
// into its own root dir, over real mTLS with a dev CA under a data dir.
// `meshctl dev` is its command line; end-to-end tests use it too. A second
// start on the same data dir reuses everything it made.
package onebox

import (
	"crypto/ed25519"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	"mesh.dev/internal/envelope"
	"mesh.dev/internal/identity"
	"mesh.dev/internal/keyfile"
	"mesh.dev/internal/pki"
	"mesh.dev/internal/verify"
	typev1 "mesh.dev/proto/mesh/type/v1"
)

// TrustDomain of the dev mesh's certificates.
const TrustDomain = "mesh.dev.local"

// layout names the files under a data dir.
type layout struct {
	dir   string
	nodes string // each node's root and state dir live under it
}

func (l layout) certs() string      { return filepath.Join(l.dir, "certs") }
func (l layout) keys() string       { return filepath.Join(l.dir, "keys") }
func (l layout) rootKey() string    { return filepath.Join(l.keys(), "root-key.pem") }
func (l layout) roots() string      { return filepath.Join(l.keys(), "roots.json") }
func (l layout) signingKey() string { return filepath.Join(l.keys(), "signer-key.pem") }
func (l layout) keyset() string     { return filepath.Join(l.keys(), "keyset.json") }
func (l layout) nats() string       { return filepath.Join(l.dir, "nats") }
func (l layout) signerState() string {
	return filepath.Join(l.dir, "signer")
}
func (l layout) node(name string) string { return filepath.Join(l.nodes, name) }

// certFiles returns the certificate, key and CA files of an identity.
func (l layout) certFiles(id identity.Identity) (cert, key, ca string) {
	cert, key = pki.Paths(l.certs(), pki.Basename(id))
	return cert, key, filepath.Join(l.certs(), pki.CACertFile)
}

func exists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// ensureCerts makes the CA (once) and a certificate for every identity that
// has none.
func (l layout) ensureCerts(ids []identity.Identity) error {
	caCert, caKey := filepath.Join(l.certs(), pki.CACertFile), filepath.Join(l.certs(), pki.CAKeyFile)
	var ca *pki.CA
	var err error
	if exists(caCert) {
		if ca, err = pki.LoadCA(caCert, caKey); err != nil {
			return fmt.Errorf("dev CA: %w", err)
		}
	} else {
		if ca, err = pki.NewCA(TrustDomain, 10*365*24*time.Hour); err != nil {
			return err
		}
		if err := pki.WriteCA(l.certs(), ca); err != nil {
			return err
		}
	}
	for _, id := range ids {
		id.TrustDomain = ca.TrustDomain()
		cert, _, _ := l.certFiles(id)
		if exists(cert) {
			continue
		}
		certPEM, keyPEM, err := ca.Issue(id, pki.IssueOptions{})
		if err != nil {
			return fmt.Errorf("issue %s: %w", id, err)
		}
		if err := pki.WriteIssued(l.certs(), pki.Basename(id), certPEM, keyPEM); err != nil {
			return err
		}
	}
	return nil
}

// ensureTrust makes the root key, the pinned roots, the signer's online key
// and a keyset listing it (once), and signs a fresh keyset when the held one
// is due to expire within a week.
func (l layout) ensureTrust(now time.Time) error {
	if err := os.MkdirAll(l.keys(), 0o700); err != nil {
		return err
	}
	var root ed25519.PrivateKey
	var err error
	if exists(l.rootKey()) {
		root, err = keyfile.Load(l.rootKey())
	} else {
		root, err = keyfile.Generate(l.rootKey())
	}
	if err != nil {
		return fmt.Errorf("root key: %w", err)
	}
	rootPub := root.Public().(ed25519.PublicKey)
	roots := &typev1.TrustRoots{Threshold: 1, Keys: []*typev1.RootKey{{Id: envelope.KeyID(rootPub), PublicKey: rootPub}}}
	if !exists(l.roots()) {
		if err := keyfile.WriteJSON(l.roots(), roots, 0o644); err != nil {
			return err
		}
	}
	var signing ed25519.PrivateKey
	if exists(l.signingKey()) {
		signing, err = keyfile.Load(l.signingKey())
	} else {
		signing, err = keyfile.Generate(l.signingKey())
	}
	if err != nil {
		return fmt.Errorf("signer key: %w", err)
	}
	version := uint64(1)
	if exists(l.keyset()) {
		env := &typev1.Envelope{}
		if err := keyfile.ReadJSON(l.keyset(), env); err == nil {
			if ring, err := verify.Keyset(roots, env); err == nil {
				if !ring.Expired(now.Add(7 * 24 * time.Hour)) {
					return nil
				}
				version = ring.Version() + 1
			}
		}
	}
	pub := signing.Public().(ed25519.PublicKey)
	ks := &typev1.Keyset{
		Version: version, IssuedAt: timestamppb.New(now), ExpiresAt: timestamppb.New(now.Add(90 * 24 * time.Hour)),
		Keys: []*typev1.KeysetKey{{Id: envelope.KeyID(pub), PublicKey: pub, State: typev1.KeyState_KEY_STATE_ACTIVE,
			NotBefore: timestamppb.New(now.Add(-time.Hour)), NotAfter: timestamppb.New(now.Add(365 * 24 * time.Hour))}},
	}
	env, _, err := envelope.Seal(typev1.PayloadType_PAYLOAD_TYPE_KEYSET, ks)
	if err != nil {
		return err
	}
	if err := envelope.SignWith(env, root); err != nil {
		return err
	}
	return keyfile.WriteJSON(l.keyset(), env, 0o644)
}

// prepareNode makes a node's root and state dirs.
func (l layout) prepareNode(name string) (root, state string, err error) {
	root, state = filepath.Join(l.node(name), "root"), filepath.Join(l.node(name), "state")
	for _, d := range []string{root, state} {
		if err := os.MkdirAll(d, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
			return "", "", err
		}
	}
	return root, state, nil
}
