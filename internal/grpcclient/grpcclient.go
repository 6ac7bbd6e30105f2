// Package grpcclient dials mesh services the one way every mesh client
// should: mutual TLS 1.3, OpenTelemetry tracing and metrics, keepalives the
// servers of grpcserver accept, a bounded reconnect backoff and the same
// explicit message size limit the servers use.
package grpcclient

import (
	"crypto/tls"
	"errors"
	"fmt"
	"time"

	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"

	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/keepalive"
	"mesh.dev/internal/telemetry"
)

// DefaultMaxMsgSize is the largest gRPC message mesh sends or receives,
// 4 MiB: compositions are at most 256 KiB and objects and artifacts stream
// in chunks, so anything larger is a bug or an attack (DESIGN.md §8).
// grpcserver uses the same limit.
const DefaultMaxMsgSize = 4 << 20

// Keepalive: a ping after 10 s without activity on a connection with an
// active call, dropped when unanswered for 5 s. An engine's Sync stream is
// idle between changes, and a composer replica that stalls (a paused VM, a
// GC storm) holds its connections open: within 15 s the engine knows and
// goes to another replica (the fault harness measured 18-37 s of waiting
// with 30 s + 10 s). A ping is a 17-byte frame: 10,000 engines cost a
// replica 1,000 of them a second. grpcserver's enforcement policy permits
// pings every KeepaliveMinTime, which must stay below KeepaliveTime or
// servers close connections for pinging too often.
const (
	KeepaliveTime    = 10 * time.Second
	KeepaliveTimeout = 5 * time.Second
	KeepaliveMinTime = 5 * time.Second
)

// Backoff is the reconnect backoff: from 1 s, ×1.6 with 20 % jitter, up to
// 2 minutes.
var Backoff = backoff.Config{
	BaseDelay:  time.Second,
	Multiplier: 1.6,
	Jitter:     0.2,
	MaxDelay:   2 * time.Minute,
}

// providers is a dial option that carries telemetry providers to Dial; it
// does nothing when handed to grpc itself.
type providers struct {
	grpc.EmptyDialOption
	tp trace.TracerProvider
	mp metric.MeterProvider
}

// WithTracerProvider makes Dial's connection trace to tp instead of the
// global tracer provider.
func WithTracerProvider(tp trace.TracerProvider) grpc.DialOption { return providers{tp: tp} }

// WithMeterProvider makes Dial's connection record metrics to mp instead of
// the global meter provider.
func WithMeterProvider(mp metric.MeterProvider) grpc.DialOption { return providers{mp: mp} }

// Dial returns a client connection to target (a gRPC target such as
// "localhost:7001" or "dns:///composer.example:7001") over tlsCfg, which
// must require TLS 1.3 (pki.ClientTLS does). Like grpc.NewClient it does not
// connect until the first call. opts are applied after mesh's defaults and
// so override them.
func Dial(target string, tlsCfg *tls.Config, opts ...grpc.DialOption) (*grpc.ClientConn, error) {
	if tlsCfg == nil {
		return nil, errors.New("dial: no tls config")
	}
	if tlsCfg.MinVersion < tls.VersionTLS13 {
		return nil, errors.New("dial: tls config must require TLS 1.3 (MinVersion)")
	}
	if tlsCfg.InsecureSkipVerify && tlsCfg.VerifyConnection == nil && tlsCfg.VerifyPeerCertificate == nil {
		return nil, errors.New("dial: tls config skips server verification")
	}
	// The propagator is set here rather than taken from the otel global, so
	// trace context crosses every call whether or not a process installed
	// globals (tests and the one-process dev mesh do not).
	otelOpts := []otelgrpc.Option{otelgrpc.WithPropagators(telemetry.Propagator())}
	var rest []grpc.DialOption
	for _, o := range opts {
		if p, ok := o.(providers); ok {
			if p.tp != nil {
				otelOpts = append(otelOpts, otelgrpc.WithTracerProvider(p.tp))
			}
			if p.mp != nil {
				otelOpts = append(otelOpts, otelgrpc.WithMeterProvider(p.mp))
			}
			continue
		}
		rest = append(rest, o)
	}
	all := append([]grpc.DialOption{
		grpc.WithTransportCredentials(credentials.NewTLS(tlsCfg)),
		grpc.WithStatsHandler(otelgrpc.NewClientHandler(otelOpts...)),
		grpc.WithKeepaliveParams(keepalive.ClientParameters{
			Time:                KeepaliveTime,
			Timeout:             KeepaliveTimeout,
			PermitWithoutStream: false,
		}),
		grpc.WithConnectParams(grpc.ConnectParams{Backoff: Backoff, MinConnectTimeout: 20 * time.Second}),
		grpc.WithInitialWindowSize(1 << 20), grpc.WithInitialConnWindowSize(4 << 20), grpc.WithWriteBufferSize(256 << 10), grpc.WithReadBufferSize(256 << 10),
		grpc.WithDefaultCallOptions(
			grpc.MaxCallRecvMsgSize(DefaultMaxMsgSize),
			grpc.MaxCallSendMsgSize(DefaultMaxMsgSize),
		),
	}, rest...)
	conn, err := grpc.NewClient(target, all...)
	if err != nil {
		return nil, fmt.Errorf("dial %s: %w", target, err)
	}
	return conn, nil
}
