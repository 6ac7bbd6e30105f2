// Package grpcserver builds every mesh gRPC server the same way: mutual TLS
// 1.3, authorization by a policy that must name every registered method
// (DESIGN.md §8), OpenTelemetry tracing and metrics, panic recovery,
// keepalive enforcement, explicit message limits, gRPC health and server
// reflection (DESIGN.md §10), and a graceful stop bounded in time.
package grpcserver

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"time"

	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthgrpc "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/reflection"
	"google.golang.org/grpc/stats"
	"google.golang.org/grpc/status"

	"mesh.dev/internal/authz"
	"mesh.dev/internal/grpcclient"
	"mesh.dev/internal/pki"
	"mesh.dev/internal/telemetry"
)

// DefaultMaxMsgSize is the default limit on a message received or sent,
// 4 MiB; clients of grpcclient use the same.
const DefaultMaxMsgSize = grpcclient.DefaultMaxMsgSize

// DefaultGracePeriod is how long Serve lets calls finish after its context
// is done before it cuts the remaining ones off.
const DefaultGracePeriod = 10 * time.Second

// Config describes a server. TLS is required.
type Config struct {
	// Addr is the TCP address Listen and Serve listen on, e.g. ":7001" or
	// "127.0.0.1:0".
	Addr string
	// Listener, when set, is served instead of listening on Addr (tests and
	// the one-process dev mesh open theirs first to learn the address).
	Listener net.Listener
	// TLS must require TLS 1.3 and verified client certificates
	// (pki.ServerTLS does); Build refuses anything weaker.
	TLS *tls.Config
	// Policy must hold a rule for every method registered; the platform's
	// health and reflection rules (authz.PlatformRules) are added, and an
	// entry of Policy for one of those methods wins.
	Policy authz.Policy
	// Logger receives denials, recovered panics and lifecycle events;
	// slog.Default when nil.
	Logger *slog.Logger
	// MaxRecvMsgSize and MaxSendMsgSize default to DefaultMaxMsgSize.
	MaxRecvMsgSize, MaxSendMsgSize int
	// ServerOptions are applied after the builder's own; interceptors given
	// here run inside authorization and see the caller's identity.
	ServerOptions []grpc.ServerOption
	// GracePeriod defaults to DefaultGracePeriod.
	GracePeriod time.Duration
	// TracerProvider and MeterProvider default to the otel globals.
	TracerProvider trace.TracerProvider
	MeterProvider  metric.MeterProvider
	// MaxConcurrentHandshakes bounds TLS handshakes in progress, so a
	// reconnect storm of a whole fleet queues instead of starving the
	// server's CPU; 0 means DefaultMaxConcurrentHandshakes.
	MaxConcurrentHandshakes int
	// MaxConnectionAge closes connections older than this (gRPC adds
	// ±10% jitter) so long-lived streams rebalance across replicas; 0
	// keeps connections forever.
	MaxConnectionAge time.Duration
}

// DefaultMaxConcurrentHandshakes is the handshake bound when none is set:
// a handshake costs about 2 ms of CPU, so this keeps a storm to a few
// cores' worth at a time.
const DefaultMaxConcurrentHandshakes = 64

// Server is a built gRPC server, ready to listen and serve once.
type Server struct {
	grpc   *grpc.Server
	health *health.Server
	cfg    Config
	log    *slog.Logger

	mu     sync.Mutex
	lis    net.Listener
	served bool
}

// Build constructs the server, registers the services through register,
// then health and reflection, and refuses to return a server when a
// registered method has no rule in the policy; the error names every such
// method.
func Build(cfg Config, register ...func(grpc.ServiceRegistrar)) (*Server, error) {
	tlsCfg, err := checkTLS(cfg.TLS)
	if err != nil {
		return nil, fmt.Errorf("grpcserver: %w", err)
	}
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	if cfg.MaxRecvMsgSize <= 0 {
		cfg.MaxRecvMsgSize = DefaultMaxMsgSize
	}
	if cfg.MaxSendMsgSize <= 0 {
		cfg.MaxSendMsgSize = DefaultMaxMsgSize
	}
	if cfg.GracePeriod <= 0 {
		cfg.GracePeriod = DefaultGracePeriod
	}
	policy := authz.Merge(authz.PlatformRules(), cfg.Policy)
	td, err := ownTrustDomain(tlsCfg)
	if err != nil {
		return nil, fmt.Errorf("grpcserver: %w", err)
	}

	// The propagator is set here rather than taken from the otel global
	// (see grpcclient.Dial).
	otelOpts := []otelgrpc.Option{otelgrpc.WithPropagators(telemetry.Propagator())}
	if cfg.TracerProvider != nil {
		otelOpts = append(otelOpts, otelgrpc.WithTracerProvider(cfg.TracerProvider))
	}
	if cfg.MeterProvider != nil {
		otelOpts = append(otelOpts, otelgrpc.WithMeterProvider(cfg.MeterProvider))
	}
	// Health probes every few seconds would drown the traces that matter.
	otelOpts = append(otelOpts, otelgrpc.WithFilter(func(info *stats.RPCTagInfo) bool {
		return !strings.HasPrefix(info.FullMethodName, "/"+healthgrpc.Health_ServiceDesc.ServiceName+"/")
	}))

	if cfg.MaxConcurrentHandshakes <= 0 {
		cfg.MaxConcurrentHandshakes = DefaultMaxConcurrentHandshakes
	}
	keepaliveParams := keepalive.ServerParameters{
		// Find dead peers of long-lived idle streams (Sync).
		Time:    time.Minute,
		Timeout: 20 * time.Second,
	}
	if cfg.MaxConnectionAge > 0 {
		keepaliveParams.MaxConnectionAge = cfg.MaxConnectionAge
		keepaliveParams.MaxConnectionAgeGrace = time.Minute
	}
	limit := newHandshakeLimit(cfg.MaxConcurrentHandshakes)
	opts := append([]grpc.ServerOption{
		grpc.Creds(limit.creds(credentials.NewTLS(limit.onHello(tlsCfg)))),
		grpc.ConnectionTimeout(HandshakeTimeout),
		grpc.StatsHandler(otelgrpc.NewServerHandler(otelOpts...)),
		// Recovery is outermost so that a panic in authorization (a
		// NodeSelf extractor, say) is caught too.
		grpc.ChainUnaryInterceptor(recoverUnary(log), authz.UnaryInterceptor(policy, log, authz.InTrustDomain(td))),
		grpc.ChainStreamInterceptor(recoverStream(log), authz.StreamInterceptor(policy, log, authz.InTrustDomain(td))),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{
			MinTime:             grpcclient.KeepaliveMinTime,
			PermitWithoutStream: false,
		}),
		grpc.KeepaliveParams(keepaliveParams),
		grpc.InitialWindowSize(1 << 20), grpc.InitialConnWindowSize(4 << 20), grpc.WriteBufferSize(256 << 10), grpc.ReadBufferSize(256 << 10),
		grpc.MaxRecvMsgSize(cfg.MaxRecvMsgSize),
		grpc.MaxSendMsgSize(cfg.MaxSendMsgSize),
	}, cfg.ServerOptions...)
	gs := grpc.NewServer(opts...)

	for _, r := range register {
		r(gs)
	}
	services := gs.GetServiceInfo()

	hs := health.NewServer()
	healthgrpc.RegisterHealthServer(gs, hs)
	reflection.Register(gs)
	hs.SetServingStatus("", healthgrpc.HealthCheckResponse_SERVING)
	for name := range services {
		hs.SetServingStatus(name, healthgrpc.HealthCheckResponse_SERVING)
	}

	var missing []string
	registered := map[string]bool{}
	for name, info := range gs.GetServiceInfo() {
		for _, m := range info.Methods {
			full := "/" + name + "/" + m.Name
			registered[full] = true
			if _, ok := policy[full]; !ok {
				missing = append(missing, full)
			}
		}
	}
	if len(missing) > 0 {
		slices.Sort(missing)
		gs.Stop()
		return nil, fmt.Errorf("grpcserver: no policy entry for %s", strings.Join(missing, ", "))
	}
	for m := range policy {
		if !registered[m] {
			// Not fatal: one policy may serve builds that register fewer
			// services, but a typo shows up here.
			log.Warn("policy entry names no registered method", slog.String("method", m))
		}
	}
	return &Server{grpc: gs, health: hs, cfg: cfg, log: log}, nil
}

// checkTLS refuses configs that would let a client in without a verified
// certificate or below TLS 1.3, and returns a copy whose per-client configs
// are held to the same.
// ownTrustDomain reads the trust domain of the server's own certificate:
// callers of another are refused. A config that picks its certificate per
// client (GetConfigForClient) has none to read, and no check.
func ownTrustDomain(c *tls.Config) (string, error) {
	var cert *tls.Certificate
	switch {
	case c.GetCertificate != nil:
		got, err := c.GetCertificate(&tls.ClientHelloInfo{})
		if err != nil {
			return "", fmt.Errorf("server certificate: %w", err)
		}
		cert = got
	case len(c.Certificates) > 0:
		cert = &c.Certificates[0]
	}
	td, err := pki.TrustDomainOf(cert)
	if err != nil {
		return "", fmt.Errorf("server certificate: %w", err)
	}
	return td, nil
}

func checkTLS(c *tls.Config) (*tls.Config, error) {
	if c == nil {
		return nil, errors.New("no tls config: mesh servers require mutual TLS")
	}
	if err := checkServerConfig(c); err != nil {
		return nil, err
	}
	c = c.Clone()
	if get := c.GetConfigForClient; get != nil {
		c.GetConfigForClient = func(hello *tls.ClientHelloInfo) (*tls.Config, error) {
			cc, err := get(hello)
			if err != nil || cc == nil {
				return cc, err
			}
			if err := checkServerConfig(cc); err != nil {
				return nil, fmt.Errorf("config for client: %w", err)
			}
			return cc, nil
		}
	}
	return c, nil
}

func checkServerConfig(c *tls.Config) error {
	if c.MinVersion < tls.VersionTLS13 {
		return errors.New("tls config must require TLS 1.3 (MinVersion)")
	}
	if c.ClientAuth != tls.RequireAndVerifyClientCert {
		return fmt.Errorf("tls config must require and verify client certificates (ClientAuth is %s)", c.ClientAuth)
	}
	if c.ClientCAs == nil {
		// crypto/tls would fall back to the system roots.
		return errors.New("tls config has no client CAs")
	}
	return nil
}

func recoverUnary(log *slog.Logger) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (resp any, err error) {
		defer func() {
			if r := recover(); r != nil {
				err = recovered(ctx, log, info.FullMethod, r)
			}
		}()
		return handler(ctx, req)
	}
}

func recoverStream(log *slog.Logger) grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) (err error) {
		defer func() {
			if r := recover(); r != nil {
				err = recovered(ss.Context(), log, info.FullMethod, r)
			}
		}()
		return handler(srv, ss)
	}
}

// recovered logs a panic with its stack and answers INTERNAL without the
// detail, which is the log's, not the caller's.
func recovered(ctx context.Context, log *slog.Logger, method string, r any) error {
	log.LogAttrs(ctx, slog.LevelError, "panic in handler",
		slog.String("method", method),
		slog.Any("panic", r),
		slog.String("stack", string(debug.Stack())))
	return status.Error(codes.Internal, "internal error")
}

// Listen opens the listener on Config.Addr, so that a caller learns the
// address of ":0" before Serve. Serve calls it when it has not been called.
func (s *Server) Listen() (net.Addr, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.lis != nil {
		return s.lis.Addr(), nil
	}
	if s.cfg.Listener != nil {
		s.lis = s.cfg.Listener
		return s.lis.Addr(), nil
	}
	lis, err := net.Listen("tcp", s.cfg.Addr)
	if err != nil {
		return nil, fmt.Errorf("grpcserver: listen: %w", err)
	}
	s.lis = lis
	return lis.Addr(), nil
}

// Addr returns the address listened on, nil before Listen.
func (s *Server) Addr() net.Addr {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.lis == nil {
		return nil
	}
	return s.lis.Addr()
}

// Health returns the health server, so a service can report NOT_SERVING
// (for instance when its watch falls behind).
func (s *Server) Health() *health.Server { return s.health }

// GRPC returns the underlying gRPC server.
func (s *Server) GRPC() *grpc.Server { return s.grpc }

// Serve listens (unless Listen was called) and serves until ctx is done,
// then reports NOT_SERVING, stops gracefully and, after the grace period,
// cuts off the calls still running. It returns nil after a stop caused by
// ctx and the error of the gRPC server otherwise. A server serves once.
func (s *Server) Serve(ctx context.Context) error {
	if _, err := s.Listen(); err != nil {
		return err
	}
	s.mu.Lock()
	lis := s.lis
	s.mu.Unlock()
	return s.ServeListener(ctx, lis)
}

// Run listens (or takes Config.Listener), tells ready the address, and
// serves until ctx is done: what every service's Serve does.
func (s *Server) Run(ctx context.Context, ready func(net.Addr)) error {
	addr, err := s.Listen()
	if err != nil {
		return err
	}
	if ready != nil {
		ready(addr)
	}
	return s.Serve(ctx)
}

// ServeListener is Serve on a listener the caller opened.
func (s *Server) ServeListener(ctx context.Context, lis net.Listener) error {
	s.mu.Lock()
	if s.served {
		s.mu.Unlock()
		return errors.New("grpcserver: server already served")
	}
	if s.lis != nil && s.lis != lis {
		s.mu.Unlock()
		return fmt.Errorf("grpcserver: already listening on %s", s.lis.Addr())
	}
	s.served = true
	s.lis = lis
	s.mu.Unlock()

	errc := make(chan error, 1)
	go func() { errc <- s.grpc.Serve(lis) }()
	s.log.Info("grpc server serving", slog.String("addr", lis.Addr().String()))

	select {
	case err := <-errc:
		s.grpc.Stop()
		return fmt.Errorf("grpcserver: serve: %w", err)
	case <-ctx.Done():
	}

	// Clients watching health stop sending new work here first.
	s.health.Shutdown()
	stopped := make(chan struct{})
	go func() {
		s.grpc.GracefulStop()
		close(stopped)
	}()
	timer := time.NewTimer(s.cfg.GracePeriod)
	defer timer.Stop()
	select {
	case <-stopped:
	case <-timer.C:
		s.log.Warn("grace period over, closing remaining calls", slog.Duration("grace_period", s.cfg.GracePeriod))
		s.grpc.Stop()
		<-stopped
	}
	if err := <-errc; err != nil && !errors.Is(err, grpc.ErrServerStopped) {
		return fmt.Errorf("grpcserver: serve: %w", err)
	}
	s.log.Info("grpc server stopped", slog.String("addr", lis.Addr().String()))
	return nil
}
