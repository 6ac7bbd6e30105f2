package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"mesh.dev/internal/natsx"
	"mesh.dev/services/catalog/app"
)

// TestLoadConfigNATS pins where the catalog's JetStream is for each mix of
// file and flags: an embedded server in app.DefaultEmbeddedDir when neither
// names one, and whatever is given explicitly otherwise, flags over the
// file.
func TestLoadConfigNATS(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	file := func(name, nats string) string {
		p := filepath.Join(dir, name+".yaml")
		body := "cert_file: /etc/mesh/certs/catalog.pem\nkey_file: /etc/mesh/certs/catalog-key.pem\nca_file: /etc/mesh/certs/ca.pem\n" + nats
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	none := file("none", "")
	embedded := file("embedded", "nats:\n  embedded_dir: /srv/jetstream\n  embedded_listen: 127.0.0.1:14222\n")
	cluster := file("cluster", "nats:\n  url: tls://nats-0:4222,tls://nats-1:4222\n  ca_file: /etc/mesh/nats-ca.pem\n  creds_file: /etc/mesh/catalog.creds\n  replicas: 3\n")
	caOnly := file("ca-only", "nats:\n  ca_file: /etc/mesh/nats-ca.pem\n")

	cases := []struct {
		name    string
		args    []string
		want    natsx.ServiceConfig
		wantErr string
	}{
		{"nothing: the embedded default", []string{"--config", none},
			natsx.ServiceConfig{EmbeddedDir: "/var/lib/mesh-catalog", EmbeddedListen: "127.0.0.1:4222", Replicas: 1}, ""},
		{"the file's embedded server", []string{"--config", embedded},
			natsx.ServiceConfig{EmbeddedDir: "/srv/jetstream", EmbeddedListen: "127.0.0.1:14222", Replicas: 1}, ""},
		{"the file's cluster", []string{"--config", cluster},
			natsx.ServiceConfig{URL: "tls://nats-0:4222,tls://nats-1:4222", CAFile: "/etc/mesh/nats-ca.pem", CredsFile: "/etc/mesh/catalog.creds", Replicas: 3}, ""},
		{"flags name a cluster over the embedded default", []string{"--config", none, "--nats-url", "tls://nats:4222",
			"--nats-ca", "/c/ca.pem", "--nats-cert", "/c/catalog.pem", "--nats-key", "/c/catalog-key.pem", "--nats-creds", "/c/catalog.creds", "--nats-replicas", "3"},
			natsx.ServiceConfig{URL: "tls://nats:4222", CAFile: "/c/ca.pem", CertFile: "/c/catalog.pem", KeyFile: "/c/catalog-key.pem", CredsFile: "/c/catalog.creds", Replicas: 3}, ""},
		{"a flag URL replaces the file's embedded server", []string{"--config", embedded, "--nats-url", "nats://10.0.0.1:4222"},
			natsx.ServiceConfig{URL: "nats://10.0.0.1:4222", Replicas: 1}, ""},
		{"a flag embedded dir replaces the file's URL", []string{"--config", file("url", "nats:\n  url: nats://10.0.0.1:4222\n"), "--nats-embedded-dir", "/data/nats"},
			natsx.ServiceConfig{EmbeddedDir: "/data/nats", EmbeddedListen: "127.0.0.1:4222", Replicas: 1}, ""},
		{"a flag embedded listen", []string{"--config", none, "--nats-embedded-listen", "127.0.0.1:5222"},
			natsx.ServiceConfig{EmbeddedDir: "/var/lib/mesh-catalog", EmbeddedListen: "127.0.0.1:5222", Replicas: 1}, ""},
		{"a CA without a URL is no embedded server", []string{"--config", caOnly}, natsx.ServiceConfig{},
			"config: nats.url is required with nats.ca_file, cert_file, key_file or creds_file"},
		{"creds flag without a URL", []string{"--config", none, "--nats-creds", "/c/catalog.creds"}, natsx.ServiceConfig{},
			"config: nats.url is required with nats.ca_file, cert_file, key_file or creds_file"},
		{"the cluster's creds over an embedded server", []string{"--config", cluster, "--nats-embedded-dir", "/data/nats"}, natsx.ServiceConfig{},
			"config: nats.replicas is 3, but an embedded server holds 1 replica"},
		{"an argument", []string{"--config", none, "extra"}, natsx.ServiceConfig{}, `serve takes no arguments, got ["extra"]`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			cfg, err := loadConfig(c.args)
			if c.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), c.wantErr) {
					t.Fatalf("loadConfig = %v, want %q", err, c.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if cfg.NATS != c.want {
				t.Fatalf("nats:\n got %+v\nwant %+v", cfg.NATS, c.want)
			}
			if cfg.CertFile != "/etc/mesh/certs/catalog.pem" || cfg.Listen != app.DefaultListen {
				t.Errorf("the rest of the file: %+v", cfg)
			}
		})
	}
}

// TestUsageNamesTheDefault checks that the help says where an unconfigured
// catalog keeps its data.
func TestUsageNamesTheDefault(t *testing.T) {
	t.Parallel()
	for _, want := range []string{app.DefaultEmbeddedDir, app.DefaultEmbeddedListen} {
		if !strings.Contains(usage, want) {
			t.Errorf("usage does not name %s:\n%s", want, usage)
		}
	}
}
