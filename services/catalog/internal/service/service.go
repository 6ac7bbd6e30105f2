// Package service implements mesh.catalog.v1.CatalogService (DESIGN.md §3):
// immutable entries by fingerprint, builds, module registrations with their
// history and a watch, and artifacts in the object store, all checked before
// anything is written so that a refused write changes nothing.
package service

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	otelcodes "go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"

	"mesh.dev/internal/identity"
	catalogv1 "mesh.dev/proto/mesh/catalog/v1"
	"mesh.dev/services/catalog/internal/store"
)

// TracerName is the instrumentation scope of the catalog's spans and
// metrics.
const TracerName = "mesh.dev/services/catalog"

// Defaults of Config.
const (
	// DefaultUploadIdleTimeout ends an upload that sends no chunk for this
	// long; what it sent is purged.
	DefaultUploadIdleTimeout = time.Minute
	// MaxUploadDuration ends any upload still running after this long, so
	// that chunks older than twice this belong to no live upload and may be
	// swept (store.SweepOrphanChunks).
	MaxUploadDuration = 6 * time.Hour
	// DownloadChunkSize is the size of each DownloadArtifact message, well
	// under the 4 MiB gRPC message limit.
	DownloadChunkSize = 256 << 10
	// MaxHistory is the most registrations GetModule returns (the newest).
	MaxHistory = 1000
	// casAttempts bounds the retries of a registration that lost a
	// compare-and-set to a concurrent one before ABORTED is returned.
	casAttempts = 5
)

// Config is what a Server needs.
type Config struct {
	Store *store.Store
	// UploadIdleTimeout defaults to DefaultUploadIdleTimeout.
	UploadIdleTimeout time.Duration
	// UploadMaxDuration defaults to MaxUploadDuration, and may not exceed it.
	UploadMaxDuration time.Duration
	// Now defaults to time.Now.
	Now            func() time.Time
	TracerProvider trace.TracerProvider
	MeterProvider  metric.MeterProvider
	Logger         *slog.Logger
}

// Server serves the catalog.
type Server struct {
	catalogv1.UnsafeCatalogServiceServer

	store  *store.Store
	now    func() time.Time
	idle   time.Duration
	maxUp  time.Duration
	tracer trace.Tracer
	log    *slog.Logger
	m      metrics

	// uploads serialises uploads of one digest, so that two never write the
	// same object at once (the loser's chunks would be orphaned).
	uploads keyedLock

	stopOnce sync.Once
	stopping chan struct{}
}

var _ catalogv1.CatalogServiceServer = (*Server)(nil)

// New returns a Server over cfg.Store.
func New(cfg Config) (*Server, error) {
	if cfg.Store == nil {
		return nil, errors.New("catalog: no store")
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.UploadIdleTimeout <= 0 {
		cfg.UploadIdleTimeout = DefaultUploadIdleTimeout
	}
	if cfg.UploadMaxDuration <= 0 || cfg.UploadMaxDuration > MaxUploadDuration {
		cfg.UploadMaxDuration = MaxUploadDuration
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.TracerProvider == nil {
		cfg.TracerProvider = trace.NewNoopTracerProvider()
	}
	s := &Server{
		store: cfg.Store, now: cfg.Now, idle: cfg.UploadIdleTimeout, maxUp: cfg.UploadMaxDuration,
		tracer: cfg.TracerProvider.Tracer(TracerName), log: cfg.Logger,
		uploads: keyedLock{held: map[string]chan struct{}{}}, stopping: make(chan struct{}),
	}
	s.m = newMetrics(cfg.MeterProvider)
	return s, nil
}

// Register registers the service.
func (s *Server) Register(r grpc.ServiceRegistrar) { catalogv1.RegisterCatalogServiceServer(r, s) }

// Stop ends the WatchModules streams (UNAVAILABLE, resume from the last
// revision), so that a graceful stop does not wait for them.
func (s *Server) Stop() { s.stopOnce.Do(func() { close(s.stopping) }) }

// caller names the identity the interceptors put in ctx.
func caller(ctx context.Context) string {
	if id, ok := identity.FromContext(ctx); ok {
		return id.String()
	}
	return "in-process"
}

// start begins the span of one RPC.
func (s *Server) start(ctx context.Context, method string, attrs ...attribute.KeyValue) (context.Context, trace.Span) {
	return s.tracer.Start(ctx, "catalog."+method, trace.WithAttributes(attrs...))
}

// fail records err on the span and returns it as a gRPC status.
func (s *Server) fail(ctx context.Context, span trace.Span, method string, err error) error {
	st := s.toStatus(ctx, method, err)
	span.RecordError(err)
	span.SetStatus(otelcodes.Error, err.Error())
	s.m.refused(ctx, method, st)
	return st
}

// keyedLock is a mutex per key whose wait ends with a context.
type keyedLock struct {
	mu   sync.Mutex
	held map[string]chan struct{}
}

// lock waits until key is free or ctx ends, and returns the unlock.
func (k *keyedLock) lock(ctx context.Context, key string) (func(), error) {
	for {
		k.mu.Lock()
		ch, busy := k.held[key]
		if !busy {
			ch = make(chan struct{})
			k.held[key] = ch
			k.mu.Unlock()
			return func() {
				k.mu.Lock()
				delete(k.held, key)
				k.mu.Unlock()
				close(ch)
			}, nil
		}
		k.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// attribute keys of the catalog's spans and metrics.
var (
	attrFingerprint = attribute.Key("mesh.fingerprint")
	attrModule      = attribute.Key("mesh.module")
	attrDigest      = attribute.Key("mesh.artifact.digest")
)
