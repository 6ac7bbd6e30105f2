package natsx

import "flag"

// FlagDefault says, for the flags' help, where a service's JetStream is
// when neither its file nor its flags say: an embedded server storing in
// EmbeddedDir, or the server at URL.
type FlagDefault struct {
	EmbeddedDir string
	URL         string
}

// Flags are the --nats-* flags of a service with a nats: section; Apply
// lays what they gave over the section read from the file.
type Flags struct {
	over ServiceConfig
}

// RegisterFlags registers the --nats-* flags on fs: --nats-embedded-dir,
// --nats-embedded-listen, --nats-url, --nats-ca, --nats-cert, --nats-key,
// --nats-creds and --nats-replicas.
func RegisterFlags(fs *flag.FlagSet, def FlagDefault) *Flags {
	f := &Flags{}
	embedded := "run an embedded NATS server with JetStream stored in this directory (kept in DIR/jetstream)"
	url := "URL(s) of an external NATS server or cluster (comma-separated), instead of an embedded server"
	switch {
	case def.EmbeddedDir != "":
		embedded += "; the default, in " + def.EmbeddedDir + ", when neither nats.url nor --nats-url is given"
	case def.URL != "":
		url = "URL(s) of the NATS server or cluster (comma-separated); default " + def.URL +
			" when neither nats.embedded_dir nor --nats-embedded-dir is given: the embedded server mesh-catalog runs on this machine"
	}
	fs.StringVar(&f.over.EmbeddedDir, "nats-embedded-dir", "", embedded)
	fs.StringVar(&f.over.EmbeddedListen, "nats-embedded-listen", "", "client address of the embedded server (default "+DefaultEmbeddedListen+"; no authentication: keep it on loopback)")
	fs.StringVar(&f.over.URL, "nats-url", "", url)
	fs.StringVar(&f.over.CAFile, "nats-ca", "", "CA file verifying the NATS server (TLS 1.3)")
	fs.StringVar(&f.over.CertFile, "nats-cert", "", "client certificate file for NATS (mutual TLS; the server may map it to a user)")
	fs.StringVar(&f.over.KeyFile, "nats-key", "", "key file of --nats-cert")
	fs.StringVar(&f.over.CredsFile, "nats-creds", "", "NATS credentials file (user JWT and seed)")
	fs.IntVar(&f.over.Replicas, "nats-replicas", 0, "replicas of the service's buckets (1, or 3 on a 3-server cluster)")
	return f
}

// Apply lays the flags given over cfg: a URL replaces an embedded server of
// the file and an embedded dir replaces a URL; every other flag given wins
// over its key.
func (f *Flags) Apply(cfg *ServiceConfig) {
	o := f.over
	if o.URL != "" {
		cfg.EmbeddedDir, cfg.EmbeddedListen = "", ""
	}
	if o.EmbeddedDir != "" {
		cfg.URL = ""
	}
	for _, kv := range []struct {
		dst *string
		v   string
	}{
		{&cfg.EmbeddedDir, o.EmbeddedDir}, {&cfg.EmbeddedListen, o.EmbeddedListen}, {&cfg.URL, o.URL},
		{&cfg.CAFile, o.CAFile}, {&cfg.CertFile, o.CertFile}, {&cfg.KeyFile, o.KeyFile}, {&cfg.CredsFile, o.CredsFile},
	} {
		if kv.v != "" {
			*kv.dst = kv.v
		}
	}
	if o.Replicas != 0 {
		cfg.Replicas = o.Replicas
	}
}
