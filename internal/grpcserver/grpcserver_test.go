package grpcserver_test

import (
	"context"
	"crypto/tls"
	"errors"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthgrpc "google.golang.org/grpc/health/grpc_health_v1"
	reflectionv1 "google.golang.org/grpc/reflection/grpc_reflection_v1"
	reflectionv1alpha "google.golang.org/grpc/reflection/grpc_reflection_v1alpha"
	"google.golang.org/grpc/status"

	"mesh.dev/internal/authz"
	"mesh.dev/internal/grpcserver"
	"mesh.dev/internal/identity"
	"mesh.dev/internal/pki"
	"mesh.dev/internal/testutil"
	signerv1 "mesh.dev/proto/mesh/signer/v1"
)

func signerPolicy() authz.Policy {
	return authz.Policy{
		signerv1.SignerService_SignCompositions_FullMethodName: authz.Allow(identity.RoleComposer),
		signerv1.SignerService_SignManifests_FullMethodName:    authz.Allow(identity.RoleComposer),
		signerv1.SignerService_Fence_FullMethodName:            authz.Allow(identity.RoleComposer),
		signerv1.SignerService_GetKeyset_FullMethodName:        authz.AnyAuthenticated(),
	}
}

func registerSigner(srv signerv1.SignerServiceServer) func(grpc.ServiceRegistrar) {
	return func(s grpc.ServiceRegistrar) { signerv1.RegisterSignerServiceServer(s, srv) }
}

// waitFor polls cond until it holds or the deadline passes.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		<-tick.C
	}
}

func TestBuildRefuses(t *testing.T) {
	t.Parallel()
	p := testutil.NewPKI(t)
	good := p.ServerTLS(t, p.Identity(identity.RoleSigner, ""))
	mutate := func(f func(*tls.Config)) *tls.Config {
		c := good.Clone()
		f(c)
		return c
	}
	partial := signerPolicy()
	delete(partial, signerv1.SignerService_Fence_FullMethodName)
	delete(partial, signerv1.SignerService_SignManifests_FullMethodName)
	tests := []struct {
		name    string
		cfg     grpcserver.Config
		wantErr string
	}{
		{name: "methods without policy", cfg: grpcserver.Config{TLS: good, Policy: partial},
			wantErr: "no policy entry for /mesh.signer.v1.SignerService/Fence, /mesh.signer.v1.SignerService/SignManifests"},
		{name: "no policy", cfg: grpcserver.Config{TLS: good},
			wantErr: "no policy entry for /mesh.signer.v1.SignerService/Fence, /mesh.signer.v1.SignerService/GetKeyset, /mesh.signer.v1.SignerService/SignCompositions, /mesh.signer.v1.SignerService/SignManifests"},
		{name: "no tls", cfg: grpcserver.Config{Policy: signerPolicy()}, wantErr: "no tls config"},
		{name: "client cert optional", cfg: grpcserver.Config{Policy: signerPolicy(), TLS: mutate(func(c *tls.Config) { c.ClientAuth = tls.VerifyClientCertIfGiven })},
			wantErr: "must require and verify client certificates"},
		{name: "client cert unverified", cfg: grpcserver.Config{Policy: signerPolicy(), TLS: mutate(func(c *tls.Config) { c.ClientAuth = tls.RequireAnyClientCert })},
			wantErr: "must require and verify client certificates"},
		{name: "TLS 1.2", cfg: grpcserver.Config{Policy: signerPolicy(), TLS: mutate(func(c *tls.Config) { c.MinVersion = tls.VersionTLS12 })},
			wantErr: "must require TLS 1.3"},
		{name: "no client CAs", cfg: grpcserver.Config{Policy: signerPolicy(), TLS: mutate(func(c *tls.Config) { c.ClientCAs = nil })},
			wantErr: "no client CAs"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			tt.cfg.Logger = slog.New(slog.DiscardHandler)
			srv, err := grpcserver.Build(tt.cfg, registerSigner(signerv1.UnimplementedSignerServiceServer{}))
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("Build() = %v, %v; want an error containing %q", srv, err, tt.wantErr)
			}
		})
	}
}

// TestGetConfigForClientChecked shows that a per-client config cannot
// weaken what Build checked on the base config.
func TestGetConfigForClientChecked(t *testing.T) {
	t.Parallel()
	p := testutil.NewPKI(t)
	base := p.ServerTLS(t, p.Identity(identity.RoleSigner, ""))
	weak := base.Clone()
	weak.ClientAuth = tls.RequestClientCert
	cfg := base.Clone()
	cfg.GetConfigForClient = func(*tls.ClientHelloInfo) (*tls.Config, error) { return weak, nil }
	addr, _ := testutil.StartServerConfig(t, grpcserver.Config{TLS: cfg, Policy: signerPolicy()},
		registerSigner(signerv1.UnimplementedSignerServiceServer{}))
	conn := testutil.Dial(t, p, addr, p.Identity(identity.RoleComposer, ""))
	_, err := signerv1.NewSignerServiceClient(conn).GetKeyset(t.Context(), &signerv1.GetKeysetRequest{})
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("GetKeyset through a weakened per-client config: %v, want Unavailable", err)
	}
}

func TestHealthAndReflection(t *testing.T) {
	t.Parallel()
	p := testutil.NewPKI(t)
	addr, srv := testutil.StartServer(t, p, p.Identity(identity.RoleSigner, ""), signerPolicy(),
		registerSigner(signerv1.UnimplementedSignerServiceServer{}))
	if srv.Addr() == nil || srv.Addr().String() != addr {
		t.Fatalf("Addr() = %v, want %s", srv.Addr(), addr)
	}
	// Dialing by name works as well as by address with the default SANs.
	_, port, _ := net.SplitHostPort(addr)
	for _, target := range []string{addr, net.JoinHostPort("localhost", port)} {
		t.Run(target, func(t *testing.T) {
			t.Parallel()
			conn := testutil.Dial(t, p, target, p.Identity(identity.RoleOperator, "admin"))
			health := healthgrpc.NewHealthClient(conn)
			for _, svc := range []string{"", "mesh.signer.v1.SignerService"} {
				resp, err := health.Check(t.Context(), &healthgrpc.HealthCheckRequest{Service: svc})
				if err != nil {
					t.Fatalf("health check %q: %v", svc, err)
				}
				if resp.GetStatus() != healthgrpc.HealthCheckResponse_SERVING {
					t.Errorf("health of %q = %s, want SERVING", svc, resp.GetStatus())
				}
			}

			want := []string{"grpc.health.v1.Health", "grpc.reflection.v1.ServerReflection", "grpc.reflection.v1alpha.ServerReflection", "mesh.signer.v1.SignerService"}
			v1, err := reflectionv1.NewServerReflectionClient(conn).ServerReflectionInfo(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			if err := v1.Send(&reflectionv1.ServerReflectionRequest{MessageRequest: &reflectionv1.ServerReflectionRequest_ListServices{}}); err != nil {
				t.Fatal(err)
			}
			resp, err := v1.Recv()
			if err != nil {
				t.Fatalf("reflection v1: %v", err)
			}
			var got []string
			for _, s := range resp.GetListServicesResponse().GetService() {
				got = append(got, s.GetName())
			}
			slices.Sort(got)
			if !slices.Equal(got, want) {
				t.Errorf("reflection v1 services = %v, want %v", got, want)
			}
			// Describing a service needs its file descriptor: what grpcurl
			// asks for.
			if err := v1.Send(&reflectionv1.ServerReflectionRequest{MessageRequest: &reflectionv1.ServerReflectionRequest_FileContainingSymbol{FileContainingSymbol: "mesh.signer.v1.SignerService"}}); err != nil {
				t.Fatal(err)
			}
			if resp, err := v1.Recv(); err != nil || len(resp.GetFileDescriptorResponse().GetFileDescriptorProto()) == 0 {
				t.Errorf("reflection v1 file of SignerService: %v, %v", resp, err)
			}

			alpha, err := reflectionv1alpha.NewServerReflectionClient(conn).ServerReflectionInfo(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			if err := alpha.Send(&reflectionv1alpha.ServerReflectionRequest{MessageRequest: &reflectionv1alpha.ServerReflectionRequest_ListServices{}}); err != nil {
				t.Fatal(err)
			}
			aresp, err := alpha.Recv()
			if err != nil {
				t.Fatalf("reflection v1alpha: %v", err)
			}
			if n := len(aresp.GetListServicesResponse().GetService()); n != len(want) {
				t.Errorf("reflection v1alpha lists %d services, want %d", n, len(want))
			}
		})
	}
}

func TestClientWithoutCertificate(t *testing.T) {
	t.Parallel()
	p := testutil.NewPKI(t)
	addr, _ := testutil.StartServer(t, p, p.Identity(identity.RoleSigner, ""), signerPolicy(),
		registerSigner(signerv1.UnimplementedSignerServiceServer{}))
	conn := testutil.DialTLS(t, addr, p.NoCertClientTLS())
	_, err := healthgrpc.NewHealthClient(conn).Check(t.Context(), &healthgrpc.HealthCheckRequest{})
	// The client learns of the refusal as an alert or a broken connection,
	// whichever comes first: either way it is Unavailable.
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("health check without a client certificate: %v, want Unavailable", err)
	}
}

// controlled is a signer whose Fence blocks until released (or the call is
// cancelled) and whose GetKeyset panics.
type controlled struct {
	signerv1.UnimplementedSignerServiceServer
	entered chan struct{}
	release chan struct{}
}

func (c *controlled) Fence(ctx context.Context, _ *signerv1.FenceRequest) (*signerv1.FenceResponse, error) {
	close(c.entered)
	select {
	case <-c.release:
		return &signerv1.FenceResponse{}, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

func (c *controlled) GetKeyset(context.Context, *signerv1.GetKeysetRequest) (*signerv1.GetKeysetResponse, error) {
	panic("boom")
}

func newControlled() *controlled {
	return &controlled{entered: make(chan struct{}), release: make(chan struct{})}
}

// serve builds and serves a server on 127.0.0.1:0 until the returned cancel
// is called; wait returns Serve's result once it returned.
func serve(t *testing.T, p *testutil.PKI, cfg grpcserver.Config, srv signerv1.SignerServiceServer) (_ *grpcserver.Server, addr string, cancel context.CancelFunc, wait func() error) {
	t.Helper()
	cfg.Addr = "127.0.0.1:0"
	cfg.TLS = p.ServerTLS(t, p.Identity(identity.RoleSigner, ""))
	cfg.Policy = signerPolicy()
	s, err := grpcserver.Build(cfg, registerSigner(srv))
	if err != nil {
		t.Fatal(err)
	}
	if s.Addr() != nil {
		t.Fatalf("Addr() before Listen = %v, want nil", s.Addr())
	}
	a, err := s.Listen()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx) }()
	wait = sync.OnceValue(func() error { return <-done })
	t.Cleanup(func() {
		cancel()
		_ = wait()
	})
	return s, a.String(), cancel, wait
}

// TestGracefulStop shows that a call running when Serve's context ends is
// let finish while health reports NOT_SERVING, and that Serve then returns
// nil.
func TestGracefulStop(t *testing.T) {
	t.Parallel()
	p := testutil.NewPKI(t)
	impl := newControlled()
	srv, addr, cancel, wait := serve(t, p, grpcserver.Config{GracePeriod: time.Minute, Logger: slog.New(slog.DiscardHandler)}, impl)
	conn := testutil.Dial(t, p, addr, p.Identity(identity.RoleComposer, ""))
	callErr := make(chan error, 1)
	go func() {
		_, err := signerv1.NewSignerServiceClient(conn).Fence(context.Background(), &signerv1.FenceRequest{})
		callErr <- err
	}()
	<-impl.entered
	cancel()
	waitFor(t, "NOT_SERVING", func() bool {
		resp, err := srv.Health().Check(context.Background(), &healthgrpc.HealthCheckRequest{})
		return err == nil && resp.GetStatus() == healthgrpc.HealthCheckResponse_NOT_SERVING
	})
	// The call is still running: it has not been released.
	select {
	case err := <-callErr:
		t.Fatalf("the running call ended before it was released: %v", err)
	default:
	}
	close(impl.release)
	if err := <-callErr; err != nil {
		t.Fatalf("the running call failed: %v", err)
	}
	if err := wait(); err != nil {
		t.Fatalf("Serve: %v", err)
	}
	if err := srv.Serve(context.Background()); err == nil {
		t.Fatal("a second Serve succeeded")
	}
}

// TestGracePeriodOver shows that calls still running at the end of the
// grace period are cut off and Serve returns.
func TestGracePeriodOver(t *testing.T) {
	t.Parallel()
	p := testutil.NewPKI(t)
	impl := newControlled()
	_, addr, cancel, wait := serve(t, p, grpcserver.Config{GracePeriod: 50 * time.Millisecond, Logger: slog.New(slog.DiscardHandler)}, impl)
	conn := testutil.Dial(t, p, addr, p.Identity(identity.RoleComposer, ""))
	callErr := make(chan error, 1)
	go func() {
		_, err := signerv1.NewSignerServiceClient(conn).Fence(context.Background(), &signerv1.FenceRequest{})
		callErr <- err
	}()
	<-impl.entered
	cancel()
	if err := wait(); err != nil {
		t.Fatalf("Serve: %v", err)
	}
	if err := <-callErr; status.Code(err) != codes.Unavailable {
		t.Fatalf("the cut-off call: %v, want Unavailable", err)
	}
}

func TestPanicRecovered(t *testing.T) {
	t.Parallel()
	p := testutil.NewPKI(t)
	sink := &syncWriter{w: &strings.Builder{}}
	log := slog.New(slog.NewJSONHandler(sink, nil))
	_, addr, _, _ := serve(t, p, grpcserver.Config{Logger: log}, newControlled())
	conn := testutil.Dial(t, p, addr, p.Identity(identity.RoleNode, "ace"))
	client := signerv1.NewSignerServiceClient(conn)
	_, err := client.GetKeyset(t.Context(), &signerv1.GetKeysetRequest{})
	if status.Code(err) != codes.Internal || strings.Contains(err.Error(), "boom") {
		t.Fatalf("GetKeyset: %v, want Internal without the panic's text", err)
	}
	// The server lives on.
	if _, err := healthgrpc.NewHealthClient(conn).Check(t.Context(), &healthgrpc.HealthCheckRequest{}); err != nil {
		t.Fatalf("health after a panic: %v", err)
	}
	logged := sink.String()
	if !strings.Contains(logged, `"msg":"panic in handler"`) || !strings.Contains(logged, `"panic":"boom"`) || !strings.Contains(logged, "GetKeyset") {
		t.Fatalf("log %q does not record the panic with its method", logged)
	}
}

// syncWriter serialises writes from the server's goroutines.
type syncWriter struct {
	mu sync.Mutex
	w  *strings.Builder
}

func (s *syncWriter) Write(b []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.Write(b)
}

func (s *syncWriter) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.String()
}

func TestMaxMessageSize(t *testing.T) {
	t.Parallel()
	p := testutil.NewPKI(t)
	_, addr, _, _ := serve(t, p, grpcserver.Config{MaxRecvMsgSize: 1024, Logger: slog.New(slog.DiscardHandler)}, signerv1.UnimplementedSignerServiceServer{})
	conn := testutil.Dial(t, p, addr, p.Identity(identity.RoleComposer, ""))
	// A health check names a service: a long name exceeds the limit.
	_, err := healthgrpc.NewHealthClient(conn).Check(t.Context(), &healthgrpc.HealthCheckRequest{Service: strings.Repeat("x", 2048)})
	if status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("oversized request: %v, want ResourceExhausted", err)
	}
}

// TestTracing shows the otel stats handler uses the configured provider
// and leaves health checks out.
func TestTracing(t *testing.T) {
	t.Parallel()
	p := testutil.NewPKI(t)
	rec := tracetest.NewSpanRecorder()
	tp := trace.NewTracerProvider(trace.WithSpanProcessor(rec))
	_, addr, _, _ := serve(t, p, grpcserver.Config{TracerProvider: tp, Logger: slog.New(slog.DiscardHandler)}, signerv1.UnimplementedSignerServiceServer{})
	conn := testutil.Dial(t, p, addr, p.Identity(identity.RoleComposer, ""))
	if _, err := healthgrpc.NewHealthClient(conn).Check(t.Context(), &healthgrpc.HealthCheckRequest{}); err != nil {
		t.Fatal(err)
	}
	_, _ = signerv1.NewSignerServiceClient(conn).GetKeyset(t.Context(), &signerv1.GetKeysetRequest{})
	waitFor(t, "a server span", func() bool { return len(rec.Ended()) > 0 })
	for _, s := range rec.Ended() {
		if strings.Contains(s.Name(), "Health") {
			t.Errorf("health check traced: %s", s.Name())
		}
	}
	if name := rec.Ended()[0].Name(); name != "mesh.signer.v1.SignerService/GetKeyset" {
		t.Errorf("span %q, want mesh.signer.v1.SignerService/GetKeyset", name)
	}
}

func TestServeListenerAndErrors(t *testing.T) {
	t.Parallel()
	p := testutil.NewPKI(t)
	s, err := grpcserver.Build(grpcserver.Config{
		TLS:    p.ServerTLS(t, p.Identity(identity.RoleSigner, "")),
		Policy: signerPolicy(),
		Logger: slog.New(slog.DiscardHandler),
	}, registerSigner(signerv1.UnimplementedSignerServiceServer{}))
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.ServeListener(ctx, lis) }()
	conn := testutil.Dial(t, p, lis.Addr().String(), p.Identity(identity.RoleBuilder, "ci"))
	if _, err := healthgrpc.NewHealthClient(conn).Check(t.Context(), &healthgrpc.HealthCheckRequest{}); err != nil {
		t.Fatalf("health on ServeListener: %v", err)
	}
	if got := s.Addr(); got == nil || got.String() != lis.Addr().String() {
		t.Errorf("Addr() = %v, want %s", got, lis.Addr())
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("ServeListener: %v", err)
	}

	// A listener that fails makes Serve return its error.
	s2, err := grpcserver.Build(grpcserver.Config{
		TLS:    p.ServerTLS(t, p.Identity(identity.RoleSigner, "")),
		Policy: signerPolicy(),
		Logger: slog.New(slog.DiscardHandler),
	}, registerSigner(signerv1.UnimplementedSignerServiceServer{}))
	if err != nil {
		t.Fatal(err)
	}
	bad, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	bad.Close()
	if err := s2.ServeListener(context.Background(), bad); err == nil || errors.Is(err, context.Canceled) {
		t.Fatalf("ServeListener on a closed listener: %v, want its error", err)
	}
}

// TestGrpcurl shows DESIGN.md §10's promise: grpcurl with -cacert, -cert and
// -key and nothing else lists, describes and calls a server. It runs when
// grpcurl is on PATH or built into the repository's bin/ (make tools).
func TestGrpcurl(t *testing.T) {
	t.Parallel()
	bin, err := exec.LookPath("grpcurl")
	if err != nil {
		bin, err = filepath.Abs(filepath.Join("..", "..", "bin", "grpcurl"))
		if _, statErr := os.Stat(bin); err != nil || statErr != nil {
			t.Skip("grpcurl not found on PATH or in bin/")
		}
	}
	p := testutil.NewPKI(t)
	addr, _ := testutil.StartServer(t, p, p.Identity(identity.RoleSigner, ""), signerPolicy(),
		registerSigner(signerv1.UnimplementedSignerServiceServer{}))
	cert, key, ca := p.Files(t, p.Identity(identity.RoleOperator, "admin"))
	_, port, _ := net.SplitHostPort(addr)
	tests := []struct {
		name string
		args []string
		want string
	}{
		{name: "list", args: []string{addr, "list"}, want: "mesh.signer.v1.SignerService"},
		{name: "describe", args: []string{addr, "describe", "mesh.signer.v1.SignerService"}, want: "rpc GetKeyset"},
		{name: "health by name", args: []string{net.JoinHostPort("localhost", port), "grpc.health.v1.Health/Check"}, want: `"status": "SERVING"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			args := append([]string{"-cacert", ca, "-cert", cert, "-key", key}, tt.args...)
			out, err := exec.CommandContext(t.Context(), bin, args...).CombinedOutput()
			if err != nil {
				t.Fatalf("grpcurl %v: %v\n%s", tt.args, err, out)
			}
			if !strings.Contains(string(out), tt.want) {
				t.Fatalf("grpcurl %v printed %s, want %q in it", tt.args, out, tt.want)
			}
		})
	}
}

// TestCallerOfAnotherTrustDomainRefused: a server whose CA bundle also
// holds another trust domain's CA (federation, a migration) completes the
// handshake of that domain's workloads, but gives them none of its roles.
func TestCallerOfAnotherTrustDomainRefused(t *testing.T) {
	t.Parallel()
	p := testutil.NewPKI(t)
	other, err := pki.NewCA("other.test", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	cfg := p.ServerTLS(t, p.Identity(identity.RoleSigner, ""))
	cfg.ClientCAs.AddCert(other.Certificate())
	s, err := grpcserver.Build(grpcserver.Config{Addr: "127.0.0.1:0", TLS: cfg, Policy: signerPolicy()},
		registerSigner(signerv1.UnimplementedSignerServiceServer{}))
	if err != nil {
		t.Fatal(err)
	}
	a, err := s.Listen()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	go s.Serve(ctx)
	t.Cleanup(cancel)

	composer := identity.Identity{TrustDomain: "other.test", Role: identity.RoleComposer, Name: "composer"}
	certPEM, keyPEM, err := other.Issue(composer, pki.IssueOptions{})
	if err != nil {
		t.Fatal(err)
	}
	clientCfg, err := pki.ClientTLSFromPEM(certPEM, keyPEM, p.CA.CertPEM())
	if err != nil {
		t.Fatal(err)
	}
	_, err = signerv1.NewSignerServiceClient(testutil.DialTLS(t, a.String(), clientCfg)).GetKeyset(t.Context(), &signerv1.GetKeysetRequest{})
	if status.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), `spiffe://other.test/service/composer is of trust domain "other.test"; this server serves "mesh.test"`) {
		t.Fatalf("a composer of another trust domain: %v, want PermissionDenied naming both trust domains", err)
	}
	// The same role in the server's trust domain passes authorization.
	_, err = signerv1.NewSignerServiceClient(testutil.DialTLS(t, a.String(), p.ClientTLS(t, p.Identity(identity.RoleComposer, "")))).GetKeyset(t.Context(), &signerv1.GetKeysetRequest{})
	if status.Code(err) != codes.Unimplemented {
		t.Fatalf("a composer of the server's trust domain: %v, want Unimplemented (authorized)", err)
	}
}
