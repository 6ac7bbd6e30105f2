package natsx

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// MaxReplicas is the largest replica count of a JetStream stream.
const MaxReplicas = 5

// ServiceConfig is the `nats:` section of a service's configuration: either
// an embedded server with JetStream in a data dir (the one-machine default,
// with sync_interval always, whose client address the other services of the
// machine connect to) or an external server or cluster. Exactly one of the
// two is set.
type ServiceConfig struct {
	// EmbeddedDir runs an embedded server storing JetStream there.
	EmbeddedDir string `yaml:"embedded_dir"`
	// EmbeddedListen is the embedded server's client address. It has no
	// authentication: keep it on loopback.
	EmbeddedListen string `yaml:"embedded_listen"`
	// URL is an external server or cluster (comma-separated URLs).
	URL string `yaml:"url"`
	// CAFile, CertFile, KeyFile: TLS to the external server (the client
	// certificate maps to the service's NATS user).
	CAFile   string `yaml:"ca_file"`
	CertFile string `yaml:"cert_file"`
	KeyFile  string `yaml:"key_file"`
	// CredsFile is a NATS credentials file.
	CredsFile string `yaml:"creds_file"`
	// Replicas of every bucket the service creates: 1 on one server, 3 on
	// a 3-server cluster.
	Replicas int `yaml:"replicas"`
}

// The one-machine default (DESIGN.md §9): mesh-catalog runs the embedded
// server, listening on DefaultEmbeddedListen, and the other services of the
// machine connect to it at DefaultEmbeddedURL.
const (
	DefaultEmbeddedListen = "127.0.0.1:4222"
	DefaultEmbeddedURL    = "nats://" + DefaultEmbeddedListen
)

// unset reports whether the section says nothing about where JetStream is:
// no embedded dir, no URL and nothing only a URL uses.
func (c ServiceConfig) unset() bool {
	return c.EmbeddedDir == "" && c.URL == "" && !c.external()
}

// external reports whether a key only a URL uses is set.
func (c ServiceConfig) external() bool {
	return c.CAFile != "" || c.CertFile != "" || c.KeyFile != "" || c.CredsFile != ""
}

// DefaultEmbedded makes an unset section an embedded server storing in
// dir, so that a service configured with nothing else runs on its own
// JetStream. Explicit configuration always wins.
func (c *ServiceConfig) DefaultEmbedded(dir string) {
	if c.unset() {
		c.EmbeddedDir = dir
	}
}

// DefaultURL makes an unset section connect to url (for the services that
// use the embedded server another one runs). Explicit configuration always
// wins.
func (c *ServiceConfig) DefaultURL(url string) {
	if c.unset() {
		c.URL = url
	}
}

// Defaults fills in the replica count (1) and, for an embedded server, its
// listen address when unset.
func (c *ServiceConfig) Defaults(embeddedListen string) {
	if c.EmbeddedDir != "" && c.EmbeddedListen == "" {
		c.EmbeddedListen = embeddedListen
	}
	if c.Replicas == 0 {
		c.Replicas = 1
	}
}

// Validate names what is wrong with the section.
func (c ServiceConfig) Validate() error {
	switch {
	case c.EmbeddedDir == "" && c.URL == "" && c.external():
		return errors.New("config: nats.url is required with nats.ca_file, cert_file, key_file or creds_file")
	case c.EmbeddedDir == "" && c.URL == "":
		return errors.New("config: nats.embedded_dir or nats.url is required")
	case c.EmbeddedDir != "" && c.URL != "":
		return errors.New("config: give nats.embedded_dir or nats.url, not both")
	case c.Replicas < 0 || c.Replicas > MaxReplicas:
		return fmt.Errorf("config: nats.replicas %d is outside 1..%d", c.Replicas, MaxReplicas)
	case c.EmbeddedDir != "" && c.Replicas > 1:
		return fmt.Errorf("config: nats.replicas is %d, but an embedded server holds 1 replica", c.Replicas)
	case c.EmbeddedDir != "" && (c.CAFile != "" || c.CertFile != "" || c.KeyFile != "" || c.CredsFile != ""):
		return errors.New("config: nats.ca_file, cert_file, key_file and creds_file are for nats.url, not an embedded server")
	}
	if c.EmbeddedDir != "" && c.EmbeddedListen != "" {
		if _, _, err := splitHostPort(c.EmbeddedListen); err != nil {
			return fmt.Errorf("config: nats.embedded_listen: %w", err)
		}
	}
	return nil
}

// ReplicaCount returns the replicas to create buckets with (default 1).
func (c ServiceConfig) ReplicaCount() int { return max(c.Replicas, 1) }

func splitHostPort(addr string) (string, int, error) {
	host, p, err := net.SplitHostPort(addr)
	if err != nil {
		return "", 0, err
	}
	port, err := strconv.Atoi(p)
	if err != nil || port < 0 || port > 65535 {
		return "", 0, fmt.Errorf("port %q is not 0..65535", p)
	}
	return host, port, nil
}

// Opened is a service's open JetStream.
type Opened struct {
	Conn      *nats.Conn
	JetStream jetstream.JetStream
	// Embedded is the embedded server, nil when connected to another one.
	Embedded *Embedded
	// Description says where JetStream is, for the start-up log.
	Description string
}

// Close closes the connection and stops an embedded server.
func (o *Opened) Close() {
	if o.Conn != nil {
		o.Conn.Close()
	}
	if o.Embedded != nil {
		o.Embedded.Shutdown()
	}
}

// Connect starts the embedded server (connecting in-process) or connects to
// the external one.
func (c ServiceConfig) Connect(ctx context.Context, name string, log *slog.Logger) (*Opened, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	if log == nil {
		log = slog.Default()
	}
	conn := ConnConfig{URL: c.URL, Name: name, CAFile: c.CAFile, CertFile: c.CertFile, KeyFile: c.KeyFile, CredsFile: c.CredsFile, Logger: log}
	o := &Opened{Description: c.URL}
	if c.EmbeddedDir != "" {
		cfg := EmbeddedConfig{DataDir: c.EmbeddedDir, SyncAlways: true, ServerName: name, Logger: log}
		if c.EmbeddedListen != "" {
			host, port, err := splitHostPort(c.EmbeddedListen)
			if err != nil {
				return nil, fmt.Errorf("config: nats.embedded_listen: %w", err)
			}
			if ip := net.ParseIP(host); host != "localhost" && (ip == nil || !ip.IsLoopback()) {
				log.Warn("the embedded NATS server listens beyond loopback and has no authentication", "listen", c.EmbeddedListen)
			}
			cfg.Host, cfg.Port = host, port
		}
		e, err := StartEmbedded(cfg)
		if err != nil {
			return nil, err
		}
		o.Embedded = e
		o.Description = "embedded " + e.ClientURL() + " storing in " + c.EmbeddedDir
		conn.URL, conn.InProcess = "", e.Server()
	}
	nc, js, err := Connect(ctx, conn)
	if err != nil {
		o.Close()
		return nil, err
	}
	o.Conn, o.JetStream = nc, js
	return o, nil
}

// Open is Connect returning the connection, JetStream and a close function.
func (c ServiceConfig) Open(ctx context.Context, name string, log *slog.Logger) (*nats.Conn, jetstream.JetStream, func(), error) {
	o, err := c.Connect(ctx, name, log)
	if err != nil {
		return nil, nil, nil, err
	}
	return o.Conn, o.JetStream, o.Close, nil
}
