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

// ServiceConfig is the `nats:` section of a service's configuration: either
// an embedded server with JetStream in a data dir (the one-machine default,
// with sync_interval always) or an external server or cluster.
type ServiceConfig struct {
	// EmbeddedDir runs an embedded server storing JetStream there.
	EmbeddedDir string `yaml:"embedded_dir"`
	// EmbeddedListen is the embedded server's client address
	// (default 127.0.0.1 on a random port).
	EmbeddedListen string `yaml:"embedded_listen"`
	// URL is an external server or cluster (comma-separated).
	URL string `yaml:"url"`
	// CAFile, CertFile, KeyFile: TLS to the external server.
	CAFile   string `yaml:"ca_file"`
	CertFile string `yaml:"cert_file"`
	KeyFile  string `yaml:"key_file"`
	// CredsFile is a NATS credentials file (the service's NATS user).
	CredsFile string `yaml:"creds_file"`
	// Replicas of every bucket the service creates: 1 on one server, 3 on
	// a cluster.
	Replicas int `yaml:"replicas"`
}

// Validate names what is wrong with the section.
func (c ServiceConfig) Validate() error {
	switch {
	case c.EmbeddedDir == "" && c.URL == "":
		return errors.New("config: nats.embedded_dir or nats.url is required")
	case c.EmbeddedDir != "" && c.URL != "":
		return errors.New("config: nats.embedded_dir and nats.url exclude each other")
	case c.Replicas < 0 || c.Replicas > 5:
		return fmt.Errorf("config: nats.replicas %d is outside 1..5", c.Replicas)
	case c.EmbeddedDir != "" && c.Replicas > 1:
		return fmt.Errorf("config: nats.replicas %d needs a cluster (nats.url), not an embedded server", c.Replicas)
	}
	return nil
}

// ReplicaCount returns the replicas to create buckets with (default 1).
func (c ServiceConfig) ReplicaCount() int { return max(c.Replicas, 1) }

// Open starts the embedded server or connects to the external one and
// returns the connection, JetStream, and a close function that also stops an
// embedded server.
func (c ServiceConfig) Open(ctx context.Context, name string, log *slog.Logger) (*nats.Conn, jetstream.JetStream, func(), error) {
	if err := c.Validate(); err != nil {
		return nil, nil, nil, err
	}
	if c.URL != "" {
		nc, js, err := Connect(ctx, ConnConfig{URL: c.URL, Name: name, CAFile: c.CAFile, CertFile: c.CertFile, KeyFile: c.KeyFile, CredsFile: c.CredsFile, Logger: log})
		if err != nil {
			return nil, nil, nil, err
		}
		return nc, js, nc.Close, nil
	}
	cfg := EmbeddedConfig{DataDir: c.EmbeddedDir, SyncAlways: true, ServerName: name}
	if c.EmbeddedListen != "" {
		host, port, err := net.SplitHostPort(c.EmbeddedListen)
		if err != nil {
			return nil, nil, nil, fmt.Errorf("config: nats.embedded_listen %q: %w", c.EmbeddedListen, err)
		}
		p, err := strconv.Atoi(port)
		if err != nil {
			return nil, nil, nil, fmt.Errorf("config: nats.embedded_listen %q: port: %w", c.EmbeddedListen, err)
		}
		cfg.Host, cfg.Port = host, p
	}
	e, err := StartEmbedded(cfg)
	if err != nil {
		return nil, nil, nil, err
	}
	nc, js, err := Connect(ctx, ConnConfig{Name: name, InProcess: e.Server(), Logger: log})
	if err != nil {
		e.Shutdown()
		return nil, nil, nil, err
	}
	return nc, js, func() { nc.Close(); e.Shutdown() }, nil
}
