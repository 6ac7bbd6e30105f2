// Package natsconf derives the configuration of a one-server test NATS from
// deploy/nats/nats-server.conf, the production cluster's, so that tests run
// nats-server exactly as deploy/ does — JetStream with sync_interval always,
// TLS 1.3 with verify_and_map, the same users with the same permissions —
// with only what one loopback server in a test directory must change:
// addresses, file paths, the trust domain of the user names, and no
// cluster block.
package natsconf

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"runtime"

	"mesh.dev/internal/identity"
	"mesh.dev/internal/pki"
)

// DeployFile is the production configuration, relative to the repository.
const DeployFile = "deploy/nats/nats-server.conf"

// DeployTrustDomain is the trust domain deploy/'s user names are in
// (meshctl certs' default); gen.sh --trust-domain rewrites it the same way.
const DeployTrustDomain = "mesh.local"

// Options say where the test server listens and keeps its files.
type Options struct {
	// ServerName of the server.
	ServerName string
	// Listen and Monitor are the client and HTTP monitoring addresses
	// (host:port).
	Listen, Monitor string
	// CertsDir holds ca.pem, server.pem and server-key.pem (the files
	// deploy/ mounts at /etc/nats/certs).
	CertsDir string
	// StoreDir is the JetStream store.
	StoreDir string
	// TrustDomain of the users' SPIFFE IDs; DeployTrustDomain when empty.
	TrustDomain string
}

// Deploy returns the bytes of deploy/nats/nats-server.conf.
func Deploy() ([]byte, error) {
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		return nil, errors.New("natsconf: no caller")
	}
	root := filepath.Join(filepath.Dir(file), "..", "..", "..")
	return os.ReadFile(filepath.Join(root, DeployFile))
}

// SingleServer rewrites the production configuration conf for one test
// server. Every rewrite must find exactly what it replaces, so a change to
// deploy/'s file that this would silently miss fails here instead.
func SingleServer(conf []byte, o Options) ([]byte, error) {
	td := o.TrustDomain
	if td == "" {
		td = DeployTrustDomain
	}
	out, err := withoutBlock(conf, "cluster")
	if err != nil {
		return nil, err
	}
	for _, r := range []struct {
		what, re, with string
		n              int // how many times it must match; 0: at least once
	}{
		{"server_name", `(?m)^server_name: .*$`, "server_name: " + quote(o.ServerName), 1},
		{"listen", `(?m)^listen: "0\.0\.0\.0:4222"$`, "listen: " + quote(o.Listen), 1},
		{"http", `(?m)^http: "0\.0\.0\.0:8222"$`, "http: " + quote(o.Monitor), 1},
		{"store_dir", `store_dir: "/data/jetstream"`, "store_dir: " + quote(o.StoreDir), 1},
		{"certificate paths", `"/etc/nats/certs/`, `"` + filepath.ToSlash(o.CertsDir) + "/", 3},
		{"user names", `"spiffe://` + regexp.QuoteMeta(DeployTrustDomain) + `/`, `"spiffe://` + td + "/", 0},
	} {
		re := regexp.MustCompile(r.re)
		got := len(re.FindAllIndex(out, -1))
		if got == 0 || (r.n > 0 && got != r.n) {
			return nil, fmt.Errorf("natsconf: %s: %s matches %d times in %s, want %d", r.what, r.re, got, DeployFile, max(r.n, 1))
		}
		out = re.ReplaceAllLiteral(out, []byte(r.with))
	}
	return out, nil
}

func quote(s string) string { return fmt.Sprintf("%q", s) }

// withoutBlock removes the top-level block `name { ... }` (with the comment
// lines right above it), reading past braces in strings and comments.
func withoutBlock(conf []byte, name string) ([]byte, error) {
	re := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(name) + `\s*\{`)
	loc := re.FindAllIndex(conf, -1)
	if len(loc) != 1 {
		return nil, fmt.Errorf("natsconf: %d top-level %s blocks in %s, want 1", len(loc), name, DeployFile)
	}
	start, i := loc[0][0], loc[0][1]
	depth := 1
	for depth > 0 {
		if i >= len(conf) {
			return nil, fmt.Errorf("natsconf: the %s block of %s does not end", name, DeployFile)
		}
		switch c := conf[i]; {
		case c == '"' || c == '\'':
			j := bytes.IndexByte(conf[i+1:], c)
			if j < 0 {
				return nil, fmt.Errorf("natsconf: an unterminated string in %s", DeployFile)
			}
			i += j + 1
		case c == '#' || (c == '/' && i+1 < len(conf) && conf[i+1] == '/'):
			j := bytes.IndexByte(conf[i:], '\n')
			if j < 0 {
				j = len(conf) - i
			}
			i += j - 1
		case c == '{':
			depth++
		case c == '}':
			depth--
		}
		i++
	}
	// The comments right above the block describe it.
	for start > 0 {
		prev := bytes.LastIndexByte(conf[:start-1], '\n') + 1
		if !bytes.HasPrefix(bytes.TrimSpace(conf[prev:start]), []byte("#")) {
			break
		}
		start = prev
	}
	rest := conf[i:]
	rest = bytes.TrimPrefix(rest, []byte("\n"))
	return append(append(bytes.Clone(conf[:start]), "# (no cluster: one test server)\n"...), rest...), nil
}

// WriteServerCerts writes into dir what deploy/ mounts at /etc/nats/certs
// for a server on loopback: the CA's certificate as ca.pem and a server
// certificate of that CA as server.pem and server-key.pem, naming localhost
// and 127.0.0.1. Like gen.sh's, it carries no URI SAN: a NATS server is no
// mesh identity.
func WriteServerCerts(ca *pki.CA, dir string) error {
	certPEM, keyPEM, err := ca.Issue(identity.Identity{}, pki.IssueOptions{
		URIs: []*url.URL{}, NoDefaultSANs: true,
		DNSNames: []string{"localhost"}, IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
	})
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	for name, b := range map[string][]byte{"ca.pem": ca.CertPEM(), "server.pem": certPEM, "server-key.pem": keyPEM} {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
			return err
		}
	}
	return nil
}
