package main

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"mesh.dev/internal/grpcclient"
	"mesh.dev/internal/identity"
	"mesh.dev/internal/pki"
)

// Connection flags shared by every command that calls a service. Each falls
// back to an environment variable, so an operator sets them once:
//
//	MESH_CERTS_DIR   directory with ca.pem and <identity>.pem/-key.pem (default ./certs)
//	MESH_IDENTITY    the certificate to use from it, e.g. operator-admin (default)
//	MESH_CA, MESH_CERT, MESH_KEY  explicit files (override the two above)
//	MESH_CATALOG, MESH_COMPOSER, MESH_SIGNER, MESH_NODEENGINE  service addresses
type connFlags struct {
	certsDir, identity string
	ca, cert, key      string
	catalog, composer  string
	signer, nodeengine string
	output             string
}

var conn connFlags

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// addConnFlags adds the connection flags as persistent flags of root.
func addConnFlags(root *cobra.Command) {
	f := root.PersistentFlags()
	f.StringVar(&conn.certsDir, "certs-dir", envOr("MESH_CERTS_DIR", "certs"), "directory with ca.pem and <identity>.pem (env MESH_CERTS_DIR)")
	f.StringVar(&conn.identity, "identity", envOr("MESH_IDENTITY", "operator-admin"), "certificate to use from --certs-dir, e.g. operator-admin, builder-ci (env MESH_IDENTITY)")
	f.StringVar(&conn.ca, "ca", os.Getenv("MESH_CA"), "CA certificate file (env MESH_CA; default <certs-dir>/ca.pem)")
	f.StringVar(&conn.cert, "cert", os.Getenv("MESH_CERT"), "client certificate file (env MESH_CERT)")
	f.StringVar(&conn.key, "key", os.Getenv("MESH_KEY"), "client key file (env MESH_KEY)")
	f.StringVar(&conn.catalog, "catalog", envOr("MESH_CATALOG", "localhost:7401"), "catalog address (env MESH_CATALOG)")
	f.StringVar(&conn.signer, "signer", envOr("MESH_SIGNER", "localhost:7402"), "signer address (env MESH_SIGNER)")
	f.StringVar(&conn.composer, "composer", envOr("MESH_COMPOSER", "localhost:7403"), "composer address (env MESH_COMPOSER)")
	f.StringVar(&conn.nodeengine, "nodeengine", envOr("MESH_NODEENGINE", "localhost:7404"), "node engine admin address (env MESH_NODEENGINE)")
	f.StringVarP(&conn.output, "output", "o", "text", "output format: text or json")
	root.PersistentPreRunE = func(*cobra.Command, []string) error {
		if o := strings.ToLower(conn.output); o != "text" && o != "json" {
			return fmt.Errorf("--output %q: want text or json", conn.output)
		}
		return nil
	}
}

func init() { rootHooks = append(rootHooks, addConnFlags) }

// tlsFiles returns the CA, certificate and key files the flags name.
func (c *connFlags) tlsFiles() (ca, cert, key string) {
	ca, cert, key = c.ca, c.cert, c.key
	if ca == "" {
		ca = filepath.Join(c.certsDir, pki.CACertFile)
	}
	if cert == "" || key == "" {
		dc, dk := pki.Paths(c.certsDir, c.identity)
		if cert == "" {
			cert = dc
		}
		if key == "" {
			key = dk
		}
	}
	return ca, cert, key
}

func (c *connFlags) clientTLS() (*tls.Config, error) {
	ca, cert, key := c.tlsFiles()
	cfg, err := pki.ClientTLS(cert, key, ca)
	if err != nil {
		return nil, fmt.Errorf("client certificate (--certs-dir %s --identity %s, or --ca/--cert/--key): %w", c.certsDir, c.identity, err)
	}
	return cfg, nil
}

// dial connects to a service address over mTLS with the flags' certificate.
func dial(addr string) (*grpc.ClientConn, error) {
	if addr == "" {
		return nil, errors.New("no service address")
	}
	cfg, err := conn.clientTLS()
	if err != nil {
		return nil, err
	}
	return grpcclient.Dial(addr, cfg)
}

// printJSON writes a message as protojson to the command's output.
func printJSON(cmd *cobra.Command, m proto.Message) error {
	b, err := protojson.MarshalOptions{Multiline: true, Indent: "  ", EmitUnpopulated: false}.Marshal(m)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintln(cmd.OutOrStdout(), string(b))
	return err
}

// wantJSON reports whether -o json was given.
func wantJSON() bool { return strings.EqualFold(conn.output, "json") }

// callerIdentity is the identity of the certificate the flags name, read
// from its file (ok false when it cannot be read: the call says why).
func callerIdentity() (identity.Identity, bool) {
	_, certFile, _ := conn.tlsFiles()
	b, err := os.ReadFile(certFile)
	if err != nil {
		return identity.Identity{}, false
	}
	blk, _ := pem.Decode(b)
	if blk == nil {
		return identity.Identity{}, false
	}
	cert, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		return identity.Identity{}, false
	}
	id, err := identity.FromCertificate(cert)
	return id, err == nil
}
