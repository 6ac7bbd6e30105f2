package natsx

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// ConnConfig says how a service connects to NATS.
type ConnConfig struct {
	// URL is one or more comma-separated server URLs; required unless
	// InProcess is set.
	URL string
	// Name is the connection name the server shows (monitoring, logs).
	Name string
	// CAFile verifies the server's certificate; CertFile and KeyFile are the
	// client certificate for mutual TLS. Any of them turns TLS on, at 1.3.
	CAFile, CertFile, KeyFile string
	// CredsFile is a NATS credentials (JWT + nkey seed) file.
	CredsFile string
	// User and Password authenticate with a user; Token with a token.
	User, Password string
	Token          string
	// InProcess, when set, connects to that server without a socket (the
	// one-process dev mesh passes Embedded.Server()); URL is then ignored.
	InProcess nats.InProcessConnProvider
	// Logger receives disconnect, reconnect and async error events; nil means
	// slog.Default().
	Logger *slog.Logger
}

// Reconnect pacing: a fleet of services reconnecting to a restarted server
// must not arrive at once, hence the jitter on top of the wait.
const (
	reconnectWait      = 2 * time.Second
	reconnectJitter    = 1 * time.Second
	reconnectJitterTLS = 2 * time.Second
	// A dead TCP connection is noticed after about pingInterval*maxPingsOut
	// rather than the client default of several minutes.
	pingInterval = 20 * time.Second
	maxPingsOut  = 3
	dialTimeout  = 5 * time.Second
)

// Connect connects to NATS with infinite reconnects and returns the
// connection and a JetStream context on it. The initial connect is not
// retried: a service that cannot reach NATS at start fails with the reason.
// It returns ctx.Err() when ctx ends first.
func Connect(ctx context.Context, cfg ConnConfig) (*nats.Conn, jetstream.JetStream, error) {
	opts, err := connOptions(cfg)
	if err != nil {
		return nil, nil, err
	}
	type result struct {
		nc  *nats.Conn
		err error
	}
	done := make(chan result, 1)
	go func() {
		nc, err := nats.Connect(cfg.URL, opts...)
		done <- result{nc, err}
	}()
	var r result
	select {
	case r = <-done:
	case <-ctx.Done():
		// The dial is bounded by dialTimeout; close what it may still return.
		go func() {
			if r := <-done; r.nc != nil {
				r.nc.Close()
			}
		}()
		return nil, nil, fmt.Errorf("nats connect to %s: %w", cfg.URL, ctx.Err())
	}
	if r.err != nil {
		return nil, nil, fmt.Errorf("nats connect to %s: %w", cfg.URL, r.err)
	}
	js, err := jetstream.New(r.nc)
	if err != nil {
		r.nc.Close()
		return nil, nil, fmt.Errorf("jetstream context: %w", err)
	}
	return r.nc, js, nil
}

func connOptions(cfg ConnConfig) ([]nats.Option, error) {
	if cfg.URL == "" && cfg.InProcess == nil {
		return nil, errors.New("nats: url is required")
	}
	if (cfg.CertFile == "") != (cfg.KeyFile == "") {
		return nil, errors.New("nats: cert file and key file must be given together")
	}
	if cfg.Password != "" && cfg.User == "" {
		return nil, errors.New("nats: password given without a user")
	}
	if n := btoi(cfg.CredsFile != "") + btoi(cfg.User != "") + btoi(cfg.Token != ""); n > 1 {
		return nil, errors.New("nats: give only one of creds file, user and token")
	}
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	log = log.With("nats_name", cfg.Name)

	opts := []nats.Option{
		nats.Name(cfg.Name),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(reconnectWait),
		nats.ReconnectJitter(reconnectJitter, reconnectJitterTLS),
		nats.PingInterval(pingInterval),
		nats.MaxPingsOutstanding(maxPingsOut),
		nats.Timeout(dialTimeout),
		nats.DisconnectErrHandler(func(nc *nats.Conn, err error) {
			if err != nil {
				log.Warn("nats disconnected", "url", nc.ConnectedUrlRedacted(), "err", err)
			} else {
				log.Info("nats disconnected", "url", nc.ConnectedUrlRedacted())
			}
		}),
		nats.ReconnectHandler(func(nc *nats.Conn) {
			log.Info("nats reconnected", "url", nc.ConnectedUrlRedacted(), "reconnects", nc.Stats().Reconnects)
		}),
		nats.ClosedHandler(func(nc *nats.Conn) {
			if err := nc.LastError(); err != nil {
				log.Warn("nats connection closed", "err", err)
			} else {
				log.Debug("nats connection closed")
			}
		}),
		nats.ErrorHandler(func(_ *nats.Conn, sub *nats.Subscription, err error) {
			if sub != nil {
				log.Error("nats async error", "subject", sub.Subject, "err", err)
				return
			}
			log.Error("nats async error", "err", err)
		}),
	}
	if cfg.InProcess != nil {
		opts = append(opts, nats.InProcessServer(cfg.InProcess))
	}
	if cfg.CAFile != "" || cfg.CertFile != "" {
		// Secure first: RootCAs and ClientCert keep a config already set.
		opts = append(opts, nats.Secure(&tls.Config{MinVersion: tls.VersionTLS13}))
		if cfg.CAFile != "" {
			opts = append(opts, nats.RootCAs(cfg.CAFile))
		}
		if cfg.CertFile != "" {
			opts = append(opts, nats.ClientCert(cfg.CertFile, cfg.KeyFile))
		}
	}
	switch {
	case cfg.CredsFile != "":
		opts = append(opts, nats.UserCredentials(cfg.CredsFile))
	case cfg.User != "":
		opts = append(opts, nats.UserInfo(cfg.User, cfg.Password))
	case cfg.Token != "":
		opts = append(opts, nats.Token(cfg.Token))
	}
	return opts, nil
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}
