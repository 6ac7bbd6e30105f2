package natsx_test

import (
	"context"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"mesh.dev/internal/identity"
	"mesh.dev/internal/natsx"
	"mesh.dev/internal/testutil"
)

var discard = slog.New(slog.DiscardHandler)

// roundTrip proves a connection is usable for what the catalog does with
// it: it creates a bucket with the §9 settings, writes and reads a value.
func roundTrip(t *testing.T, o *natsx.Opened) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	kv, err := natsx.EnsureKV(ctx, o.JetStream, natsx.KVSpec{Bucket: "tls-test", History: 1, Replicas: 1})
	if err != nil {
		t.Fatalf("ensure kv over %s: %v", o.Description, err)
	}
	if _, err := kv.Put(ctx, "k", []byte("v")); err != nil {
		t.Fatalf("put: %v", err)
	}
	if e, err := kv.Get(ctx, "k"); err != nil || string(e.Value) != "v" {
		t.Fatalf("get: %q, %v", e.Value, err)
	}
}

// TestServiceConfigTLS connects as mesh-catalog does with --nats-url,
// --nats-ca, --nats-cert, --nats-key and --nats-creds (natsx.ServiceConfig,
// which those flags fill) to a real TLS-only nats-server: with the client
// certificate mapped to its user as deploy/nats does, and with a .creds
// file of an operator-mode account. A CA that did not sign the server and a
// login the server does not know are refused.
func TestServiceConfigTLS(t *testing.T) {
	t.Parallel()
	p := testutil.NewPKI(t)
	other := testutil.NewPKI(t)
	catalog := p.Identity(identity.RoleCatalog, "")
	byCert := testutil.StartTLSJetStream(t, p, testutil.NATSAuth{CertUsers: []identity.Identity{catalog}})
	byCreds := testutil.StartTLSJetStream(t, p, testutil.NATSAuth{Creds: true})

	catalogCert, catalogKey, _ := p.Files(t, catalog)
	builderCert, builderKey, _ := p.Files(t, p.Identity(identity.RoleBuilder, "ci"))
	otherCert, otherKey, _ := other.Files(t, other.Identity(identity.RoleCatalog, ""))
	creds := byCreds.CredsFile(t, "mesh-catalog")
	foreign := byCreds.ForeignCredsFile(t, "stranger")

	cases := []struct {
		name    string
		cfg     natsx.ServiceConfig
		wantErr string
	}{
		{"certificate mapped to its user", natsx.ServiceConfig{URL: byCert.URL, CAFile: byCert.CAFile, CertFile: catalogCert, KeyFile: catalogKey}, ""},
		{"creds file", natsx.ServiceConfig{URL: byCreds.URL, CAFile: byCreds.CAFile, CredsFile: creds}, ""},
		{"wrong ca", natsx.ServiceConfig{URL: byCert.URL, CAFile: other.CAFile(), CertFile: catalogCert, KeyFile: catalogKey},
			"tls: failed to verify certificate: x509: certificate signed by unknown authority"},
		{"wrong ca with creds", natsx.ServiceConfig{URL: byCreds.URL, CAFile: other.CAFile(), CredsFile: creds},
			"x509: certificate signed by unknown authority"},
		{"certificate of no user", natsx.ServiceConfig{URL: byCert.URL, CAFile: byCert.CAFile, CertFile: builderCert, KeyFile: builderKey},
			"nats: Authorization Violation"},
		{"certificate of another ca", natsx.ServiceConfig{URL: byCert.URL, CAFile: byCert.CAFile, CertFile: otherCert, KeyFile: otherKey},
			"remote error: tls: unknown certificate authority|connection closed by remote after TLS handshake"},
		{"no client certificate", natsx.ServiceConfig{URL: byCert.URL, CAFile: byCert.CAFile},
			"remote error: tls: certificate required|connection closed by remote after TLS handshake"},
		{"no creds", natsx.ServiceConfig{URL: byCreds.URL, CAFile: byCreds.CAFile}, "nats: Authorization Violation"},
		{"creds of an account the server does not know", natsx.ServiceConfig{URL: byCreds.URL, CAFile: byCreds.CAFile, CredsFile: foreign},
			"nats: Authorization Violation"},
		{"no ca", natsx.ServiceConfig{URL: byCreds.URL, CredsFile: creds}, "x509: certificate signed by unknown authority"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
			defer cancel()
			o, err := c.cfg.Connect(ctx, "mesh-catalog", discard)
			if c.wantErr == "" {
				if err != nil {
					t.Fatalf("Connect: %v", err)
				}
				defer o.Close()
				if !o.Conn.TLSRequired() {
					t.Error("the connection is not TLS")
				}
				roundTrip(t, o)
				return
			}
			if err == nil {
				o.Close()
				t.Fatalf("Connect succeeded, want %q", c.wantErr)
			}
			// The server's alert after a TLS 1.3 handshake races the
			// client's first write: either may tell the client first.
			if !slices.ContainsFunc(strings.Split(c.wantErr, "|"), func(want string) bool { return strings.Contains(err.Error(), want) }) {
				t.Fatalf("Connect: %v, want %q", err, c.wantErr)
			}
		})
	}
}

// TestConnUserPassword connects with a user and password (natsx.ConnConfig;
// the service configuration takes a creds file instead) over TLS.
func TestConnUserPassword(t *testing.T) {
	t.Parallel()
	p := testutil.NewPKI(t)
	s := testutil.StartTLSJetStream(t, p, testutil.NATSAuth{Passwords: map[string]string{"mesh": "s3cret"}})
	cases := []struct {
		name, user, password, wantErr string
	}{
		{"right password", "mesh", "s3cret", ""},
		{"wrong password", "mesh", "guess", "nats: Authorization Violation"},
		{"unknown user", "root", "s3cret", "nats: Authorization Violation"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
			defer cancel()
			nc, _, err := natsx.Connect(ctx, natsx.ConnConfig{URL: s.URL, CAFile: s.CAFile, User: c.user, Password: c.password, Logger: discard})
			if c.wantErr == "" {
				if err != nil {
					t.Fatalf("Connect: %v", err)
				}
				defer nc.Close()
				if err := nc.Flush(); err != nil || !nc.TLSRequired() {
					t.Fatalf("flush: %v, tls %v", err, nc.TLSRequired())
				}
				return
			}
			if err == nil {
				nc.Close()
				t.Fatalf("Connect succeeded, want %q", c.wantErr)
			}
			if !strings.Contains(err.Error(), c.wantErr) {
				t.Fatalf("Connect: %v, want %q", err, c.wantErr)
			}
		})
	}
}
