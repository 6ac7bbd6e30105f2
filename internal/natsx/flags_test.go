package natsx

import (
	"flag"
	"io"
	"strings"
	"testing"
)

func TestServiceConfigDefaults(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name    string
		cfg     ServiceConfig
		apply   func(c *ServiceConfig)
		want    ServiceConfig
		wantErr string
	}{
		{"embedded default", ServiceConfig{}, func(c *ServiceConfig) { c.DefaultEmbedded("/var/lib/x") },
			ServiceConfig{EmbeddedDir: "/var/lib/x", EmbeddedListen: DefaultEmbeddedListen, Replicas: 1}, ""},
		{"url default", ServiceConfig{}, func(c *ServiceConfig) { c.DefaultURL(DefaultEmbeddedURL) },
			ServiceConfig{URL: "nats://127.0.0.1:4222", Replicas: 1}, ""},
		{"an explicit url wins over the embedded default", ServiceConfig{URL: "tls://n:4222"}, func(c *ServiceConfig) { c.DefaultEmbedded("/var/lib/x") },
			ServiceConfig{URL: "tls://n:4222", Replicas: 1}, ""},
		{"an explicit embedded dir wins over the url default", ServiceConfig{EmbeddedDir: "/d"}, func(c *ServiceConfig) { c.DefaultURL(DefaultEmbeddedURL) },
			ServiceConfig{EmbeddedDir: "/d", EmbeddedListen: DefaultEmbeddedListen, Replicas: 1}, ""},
		{"creds alone get no embedded default", ServiceConfig{CredsFile: "c.creds"}, func(c *ServiceConfig) { c.DefaultEmbedded("/var/lib/x") },
			ServiceConfig{}, "config: nats.url is required with nats.ca_file, cert_file, key_file or creds_file"},
		{"a cert alone gets no url default", ServiceConfig{CertFile: "c.pem", KeyFile: "k.pem"}, func(c *ServiceConfig) { c.DefaultURL(DefaultEmbeddedURL) },
			ServiceConfig{}, "config: nats.url is required with"},
		{"no default at all", ServiceConfig{}, func(*ServiceConfig) {}, ServiceConfig{}, "config: nats.embedded_dir or nats.url is required"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			cfg := c.cfg
			c.apply(&cfg)
			cfg.Defaults(DefaultEmbeddedListen)
			err := cfg.Validate()
			if c.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), c.wantErr) {
					t.Fatalf("Validate = %v, want %q", err, c.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if cfg != c.want {
				t.Fatalf("got %+v, want %+v", cfg, c.want)
			}
		})
	}
}

func TestFlagsHelpNamesTheDefault(t *testing.T) {
	t.Parallel()
	help := func(def FlagDefault) string {
		fs := flag.NewFlagSet("serve", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		RegisterFlags(fs, def)
		var b strings.Builder
		fs.SetOutput(&b)
		fs.PrintDefaults()
		return b.String()
	}
	if h := help(FlagDefault{EmbeddedDir: "/var/lib/mesh-catalog"}); !strings.Contains(h, "the default, in /var/lib/mesh-catalog, when neither nats.url nor --nats-url is given") {
		t.Errorf("embedded default not in the help:\n%s", h)
	}
	if h := help(FlagDefault{URL: DefaultEmbeddedURL}); !strings.Contains(h, "default nats://127.0.0.1:4222 when neither nats.embedded_dir nor --nats-embedded-dir is given") {
		t.Errorf("url default not in the help:\n%s", h)
	}
}
