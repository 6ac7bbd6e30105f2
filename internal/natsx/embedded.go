package natsx

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// DefaultMaxPayload is the embedded server's max_payload: room for a 1 MiB KV
// value with its headers, and for object chunks, with margin.
const DefaultMaxPayload = 8 << 20

// readyTimeout bounds how long StartEmbedded waits for the server, which
// includes recovering the JetStream data directory after a restart.
const readyTimeout = 30 * time.Second

// EmbeddedConfig configures an in-process nats-server with JetStream, the
// one-machine default and the server tests run against.
type EmbeddedConfig struct {
	// DataDir is the JetStream store directory; required.
	DataDir string
	// Host is the client listen host; "" means 127.0.0.1.
	Host string
	// Port is the client port; 0 picks a free one (see Embedded.Config).
	Port int
	// SyncAlways fsyncs every JetStream write before acknowledging it
	// (sync_interval: always). The one-machine default runs with it
	// (DESIGN.md §9); tests usually do not, for speed.
	SyncAlways bool
	// ServerName names the server; "" lets the server pick its id.
	ServerName string
	// MaxPayload is the largest message the server accepts; 0 means
	// DefaultMaxPayload. It must leave room for a MaxValueSize value and its
	// headers.
	MaxPayload int32
	// JetStreamMaxStore caps the file store in bytes; 0 means no cap.
	JetStreamMaxStore int64
	// Logger, when set, receives the server's log lines.
	Logger *slog.Logger
}

// Embedded is a running in-process nats-server with JetStream.
type Embedded struct {
	cfg EmbeddedConfig
	srv *server.Server
}

// StartEmbedded starts a nats-server with JetStream stored in cfg.DataDir and
// waits until it accepts clients.
func StartEmbedded(cfg EmbeddedConfig) (*Embedded, error) {
	if cfg.DataDir == "" {
		return nil, errors.New("embedded nats: data dir is required")
	}
	if cfg.Host == "" {
		cfg.Host = "127.0.0.1"
	}
	if cfg.MaxPayload == 0 {
		cfg.MaxPayload = DefaultMaxPayload
	}
	if min := int32(MaxValueSize + MaxHeaderBytes); cfg.MaxPayload < min {
		return nil, fmt.Errorf("embedded nats: max payload %d is below %d (a max-size value and its headers)", cfg.MaxPayload, min)
	}
	if cfg.Port < 0 {
		return nil, fmt.Errorf("embedded nats: invalid port %d", cfg.Port)
	}
	port := cfg.Port
	if port == 0 {
		port = server.RANDOM_PORT
	}
	storeMax := cfg.JetStreamMaxStore
	if storeMax == 0 {
		storeMax = -1
	}
	opts := &server.Options{
		ServerName:         cfg.ServerName,
		Host:               cfg.Host,
		Port:               port,
		MaxPayload:         cfg.MaxPayload,
		JetStream:          true,
		StoreDir:           cfg.DataDir,
		JetStreamMaxStore:  storeMax,
		JetStreamMaxMemory: -1,
		// The embedding process owns signals and its own exit.
		NoSigs: true,
	}
	if cfg.SyncAlways {
		// What `sync_interval: always` in a config file sets.
		opts.SyncAlways = true
		opts.SyncInterval = 2 * time.Minute
	}

	srv, err := server.NewServer(opts)
	if err != nil {
		return nil, fmt.Errorf("embedded nats: %w", err)
	}
	// The logger is always installed: without one the server drops the fatal
	// message that says why JetStream did not start.
	log := &serverLogger{log: cfg.Logger}
	debug := cfg.Logger != nil && cfg.Logger.Enabled(context.Background(), slog.LevelDebug)
	srv.SetLoggerV2(log, debug, false, false)
	srv.Start()
	// Wait in short steps: a server that failed at start (its fatal message
	// says why) never becomes ready, and should not cost the whole timeout.
	for deadline := time.Now().Add(readyTimeout); !srv.ReadyForConnections(50 * time.Millisecond); {
		msg := log.fatal()
		if msg == "" && time.Now().Before(deadline) {
			continue
		}
		srv.Shutdown()
		srv.WaitForShutdown()
		if msg != "" {
			return nil, fmt.Errorf("embedded nats: %s", msg)
		}
		return nil, fmt.Errorf("embedded nats: not ready for connections after %s", readyTimeout)
	}
	if !srv.JetStreamEnabled() {
		srv.Shutdown()
		srv.WaitForShutdown()
		return nil, fmt.Errorf("embedded nats: jetstream not enabled: %s", log.fatal())
	}
	if addr, ok := srv.Addr().(*net.TCPAddr); ok {
		cfg.Port = addr.Port
	}
	return &Embedded{cfg: cfg, srv: srv}, nil
}

// ClientURL returns the nats:// URL clients connect to.
func (e *Embedded) ClientURL() string { return e.srv.ClientURL() }

// Server returns the running server, for in-process connections
// (ConnConfig.InProcess) and inspection.
func (e *Embedded) Server() *server.Server { return e.srv }

// Config returns the configuration the server runs with, its port resolved,
// so that a restart on the same data dir and port can reuse it.
func (e *Embedded) Config() EmbeddedConfig { return e.cfg }

// Shutdown stops the server and waits until it has stopped, which flushes
// and closes the JetStream store. It may be called more than once.
func (e *Embedded) Shutdown() {
	e.srv.Shutdown()
	e.srv.WaitForShutdown()
}

// serverLogger adapts the server's printf-style logger to slog and keeps the
// first fatal message.
type serverLogger struct {
	log *slog.Logger

	mu       sync.Mutex
	fatalMsg string
}

func (l *serverLogger) fatal() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.fatalMsg
}

func (l *serverLogger) emit(level slog.Level, format string, v []any) {
	if l.log != nil {
		l.log.Log(context.Background(), level, fmt.Sprintf(format, v...), "component", "nats-server")
	}
}

func (l *serverLogger) Noticef(format string, v ...any) { l.emit(slog.LevelInfo, format, v) }
func (l *serverLogger) Warnf(format string, v ...any)   { l.emit(slog.LevelWarn, format, v) }
func (l *serverLogger) Errorf(format string, v ...any)  { l.emit(slog.LevelError, format, v) }
func (l *serverLogger) Debugf(format string, v ...any)  { l.emit(slog.LevelDebug, format, v) }
func (l *serverLogger) Tracef(format string, v ...any)  { l.emit(slog.LevelDebug-4, format, v) }

// Fatalf records the message instead of exiting: the server is embedded, and
// StartEmbedded returns the message as its error.
func (l *serverLogger) Fatalf(format string, v ...any) {
	l.mu.Lock()
	if l.fatalMsg == "" {
		l.fatalMsg = fmt.Sprintf(format, v...)
	}
	l.mu.Unlock()
	l.emit(slog.LevelError, format, v)
}
