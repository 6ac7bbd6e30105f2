package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"mesh.dev/internal/natsx"
)

// TestLoadConfigNATS pins where the composer's JetStream is: the embedded
// server mesh-catalog runs on the machine when neither file nor flags name
// one, and whatever is given explicitly otherwise, flags over the file.
func TestLoadConfigNATS(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	file := func(name, nats string) string {
		p := filepath.Join(dir, name+".yaml")
		body := "cert_file: /c/composer.pem\nkey_file: /c/composer-key.pem\nca_file: /c/ca.pem\nroots_file: /etc/mesh/roots.json\n" +
			"signer_addr: 127.0.0.1:7402\ncatalog_addr: 127.0.0.1:7401\n" + nats
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	none := file("none", "")
	cluster := file("cluster", "nats:\n  url: tls://nats-0:4222\n  cert_file: /c/composer.pem\n  key_file: /c/composer-key.pem\n  ca_file: /c/ca.pem\n  replicas: 3\n")

	cases := []struct {
		name    string
		args    []string
		want    natsx.ServiceConfig
		wantErr string
	}{
		{"nothing: the catalog's embedded server", []string{"--config", none}, natsx.ServiceConfig{URL: "nats://127.0.0.1:4222"}, ""},
		{"the file's cluster", []string{"--config", cluster},
			natsx.ServiceConfig{URL: "tls://nats-0:4222", CertFile: "/c/composer.pem", KeyFile: "/c/composer-key.pem", CAFile: "/c/ca.pem", Replicas: 3}, ""},
		{"flags name a cluster", []string{"--config", none, "--nats-url", "tls://nats:4222", "--nats-ca", "/n/ca.pem", "--nats-creds", "/n/composer.creds", "--nats-replicas", "3"},
			natsx.ServiceConfig{URL: "tls://nats:4222", CAFile: "/n/ca.pem", CredsFile: "/n/composer.creds", Replicas: 3}, ""},
		{"a flag URL over the file's", []string{"--config", cluster, "--nats-url", "tls://other:4222"},
			natsx.ServiceConfig{URL: "tls://other:4222", CertFile: "/c/composer.pem", KeyFile: "/c/composer-key.pem", CAFile: "/c/ca.pem", Replicas: 3}, ""},
		{"an embedded server of its own", []string{"--config", none, "--nats-embedded-dir", "/data/nats"},
			natsx.ServiceConfig{EmbeddedDir: "/data/nats"}, ""},
		{"TLS without a URL", []string{"--config", none, "--nats-ca", "/n/ca.pem"}, natsx.ServiceConfig{},
			"config: nats.url is required with nats.ca_file, cert_file, key_file or creds_file"},
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
			if cfg.SignerAddr != "127.0.0.1:7402" {
				t.Errorf("the rest of the file: %+v", cfg)
			}
		})
	}
	if !strings.Contains(usage, natsx.DefaultEmbeddedURL) {
		t.Errorf("usage does not name the default %s:\n%s", natsx.DefaultEmbeddedURL, usage)
	}
}
