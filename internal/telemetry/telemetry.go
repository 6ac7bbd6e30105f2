// Package telemetry sets up the logs, traces and metrics of one mesh service.
//
// Everything is configured by the standard OTEL_* environment variables plus a
// small Config; nothing is global unless Config.Global asks for it, because the
// one-process dev mesh runs four services side by side, each with its own
// TracerProvider, MeterProvider and service.name.
package telemetry

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlpmetric/otlpmetricgrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"
)

// Config says how one service's telemetry is set up. The zero value is usable:
// JSON logs at info level to stderr, spans given IDs that logs carry and
// propagation passes on but neither recorded nor exported, metrics kept but
// not served.
type Config struct {
	// ServiceName is the service.name resource attribute and the "service"
	// field of every log line; OTEL_SERVICE_NAME overrides it.
	ServiceName string
	// ServiceVersion is the service.version resource attribute.
	ServiceVersion string
	// MetricsAddr is the listen address of the Prometheus /metrics endpoint;
	// "" serves nothing and ":0" picks a free port (see Telemetry.MetricsAddr).
	MetricsAddr string
	// LogLevel is the lowest level logged.
	LogLevel slog.Level
	// LogOutput receives the JSON log lines; nil means os.Stderr.
	LogOutput io.Writer
	// Global installs the providers and the propagator as the otel globals.
	// Leave it false when several services share one process.
	Global bool

	// SpanExporter, when set, receives every ended span through a batching
	// processor, in addition to any OTLP exporter the environment asks for.
	SpanExporter sdktrace.SpanExporter
	// SpanProcessor, when set, is registered as is (tests use a synchronous
	// one so that spans are visible as soon as they end).
	SpanProcessor sdktrace.SpanProcessor
	// MetricReader, when set, is registered in addition to the Prometheus
	// exporter (tests use sdkmetric.NewManualReader).
	MetricReader sdkmetric.Reader
}

// Telemetry holds what Setup built. Shutdown releases it.
type Telemetry struct {
	// Logger writes JSON lines carrying the service name and, when the
	// context of a record holds a span, its trace_id and span_id.
	Logger *slog.Logger
	// TracerProvider creates this service's spans: the SDK's when anything
	// exports or processes them, else one that records nothing but still
	// gives each span its IDs (see stampingProvider).
	TracerProvider trace.TracerProvider
	// MeterProvider creates this service's instruments.
	MeterProvider *sdkmetric.MeterProvider
	// Registry is the Prometheus registry served at /metrics; it holds the
	// OTel metrics and the Go runtime and process collectors.
	Registry *prometheus.Registry
	// MetricsAddr is the address /metrics listens on, nil when not served.
	MetricsAddr net.Addr

	shutdownOnce sync.Once
	shutdownErr  error
	metricsSrv   *http.Server
	metricsDone  chan struct{}
}

// Setup builds the logger, the tracer and meter providers and, when
// cfg.MetricsAddr is set, starts serving /metrics. It fails when an OTEL_*
// variable names an exporter or protocol this build cannot honour, so that a
// misconfiguration shows at start rather than as missing traces.
func Setup(ctx context.Context, cfg Config) (*Telemetry, error) {
	return setup(ctx, cfg, os.Getenv)
}

func setup(ctx context.Context, cfg Config, getenv func(string) string) (_ *Telemetry, err error) {
	res, resErr := newResource(ctx, cfg)
	if res == nil || (resErr != nil && !errors.Is(resErr, resource.ErrPartialResource)) {
		return nil, fmt.Errorf("telemetry resource: %w", resErr)
	}
	serviceName := cfg.ServiceName
	if v, ok := res.Set().Value(semconv.ServiceNameKey); ok {
		serviceName = v.AsString()
	}

	t := &Telemetry{Logger: newLogger(cfg, serviceName)}
	routeErrors(t.Logger)
	if resErr != nil {
		// A detector that failed (say, the host name) leaves its attributes
		// out; that is no reason for a service not to start.
		t.Logger.Warn("telemetry resource is partial", "err", resErr)
	}
	// A failure after a provider exists must not leak its exporters or the
	// listener, so everything built so far is shut down on the way out.
	defer func() {
		if err != nil {
			_ = t.Shutdown(context.WithoutCancel(ctx))
		}
	}()

	tpOpts := []sdktrace.TracerProviderOption{sdktrace.WithResource(res)}
	recorded := false
	wantOTLPTraces, err := exporterWanted(getenv, "TRACES")
	if err != nil {
		return nil, err
	}
	if wantOTLPTraces {
		exp, err := otlptracegrpc.New(ctx)
		if err != nil {
			return nil, fmt.Errorf("otlp trace exporter: %w", err)
		}
		tpOpts = append(tpOpts, sdktrace.WithBatcher(exp))
		recorded = true
	}
	if cfg.SpanExporter != nil {
		tpOpts = append(tpOpts, sdktrace.WithBatcher(cfg.SpanExporter))
		recorded = true
	}
	if cfg.SpanProcessor != nil {
		tpOpts = append(tpOpts, sdktrace.WithSpanProcessor(cfg.SpanProcessor))
		recorded = true
	}
	// OTEL_TRACES_SAMPLER (parentbased_always_on by default) decides which
	// spans are sampled whether they are recorded or only stamped; one it
	// cannot honour fails the start, as an exporter it cannot does.
	sampler, err := samplerFromEnv(getenv)
	if err != nil {
		return nil, err
	}
	if recorded {
		t.TracerProvider = sdktrace.NewTracerProvider(append(tpOpts, sdktrace.WithSampler(sampler))...)
	} else {
		t.TracerProvider = stampingProvider{sampler: sampler}
	}

	t.Registry = prometheus.NewRegistry()
	if err := t.Registry.Register(collectors.NewGoCollector()); err != nil {
		return nil, fmt.Errorf("register go collector: %w", err)
	}
	if err := t.Registry.Register(collectors.NewProcessCollector(collectors.ProcessCollectorOpts{})); err != nil {
		return nil, fmt.Errorf("register process collector: %w", err)
	}
	promExp, err := otelprom.New(otelprom.WithRegisterer(t.Registry))
	if err != nil {
		return nil, fmt.Errorf("prometheus exporter: %w", err)
	}
	mpOpts := []sdkmetric.Option{sdkmetric.WithResource(res), sdkmetric.WithReader(promExp)}
	wantOTLPMetrics, err := exporterWanted(getenv, "METRICS")
	if err != nil {
		return nil, err
	}
	if wantOTLPMetrics {
		exp, err := otlpmetricgrpc.New(ctx)
		if err != nil {
			return nil, fmt.Errorf("otlp metric exporter: %w", err)
		}
		mpOpts = append(mpOpts, sdkmetric.WithReader(sdkmetric.NewPeriodicReader(exp)))
	}
	if cfg.MetricReader != nil {
		mpOpts = append(mpOpts, sdkmetric.WithReader(cfg.MetricReader))
	}
	t.MeterProvider = sdkmetric.NewMeterProvider(mpOpts...)

	if cfg.MetricsAddr != "" {
		if err := t.serveMetrics(cfg.MetricsAddr); err != nil {
			return nil, err
		}
	}

	if cfg.Global {
		otel.SetTracerProvider(t.TracerProvider)
		otel.SetMeterProvider(t.MeterProvider)
		otel.SetTextMapPropagator(Propagator())
	}
	return t, nil
}

func newResource(ctx context.Context, cfg Config) (*resource.Resource, error) {
	attrs := []attribute.KeyValue{}
	if cfg.ServiceName != "" {
		attrs = append(attrs, semconv.ServiceName(cfg.ServiceName))
	}
	if cfg.ServiceVersion != "" {
		attrs = append(attrs, semconv.ServiceVersion(cfg.ServiceVersion))
	}
	// Later options win, so the environment (OTEL_SERVICE_NAME,
	// OTEL_RESOURCE_ATTRIBUTES) overrides the config.
	return resource.New(ctx,
		resource.WithTelemetrySDK(),
		resource.WithHost(),
		resource.WithProcessPID(),
		resource.WithSchemaURL(semconv.SchemaURL),
		resource.WithAttributes(attrs...),
		resource.WithFromEnv(),
	)
}

// exporterWanted reports whether the OTLP exporter of a signal ("TRACES" or
// "METRICS") is asked for: explicitly by OTEL_<signal>_EXPORTER=otlp, or
// implicitly by an OTLP endpoint unless the exporter is "none". Any other
// exporter name, or an OTLP protocol other than gRPC, is an error.
func exporterWanted(getenv func(string) string, signal string) (bool, error) {
	if strings.EqualFold(strings.TrimSpace(getenv("OTEL_SDK_DISABLED")), "true") {
		return false, nil
	}
	explicit, none := false, false
	for _, name := range strings.Split(getenv("OTEL_"+signal+"_EXPORTER"), ",") {
		switch name = strings.ToLower(strings.TrimSpace(name)); name {
		case "":
		case "otlp":
			explicit = true
		case "none":
			none = true
		case "prometheus":
			// Metrics are always served to Prometheus when MetricsAddr is set.
			if signal != "METRICS" {
				return false, fmt.Errorf("OTEL_%s_EXPORTER: exporter %q is not supported (use otlp or none)", signal, name)
			}
		default:
			return false, fmt.Errorf("OTEL_%s_EXPORTER: exporter %q is not supported (use otlp or none)", signal, name)
		}
	}
	want := explicit || (!none && (getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != "" ||
		getenv("OTEL_EXPORTER_OTLP_"+signal+"_ENDPOINT") != ""))
	if !want {
		return false, nil
	}
	for _, key := range []string{"OTEL_EXPORTER_OTLP_" + signal + "_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"} {
		if p := strings.TrimSpace(getenv(key)); p != "" {
			if p != "grpc" {
				return false, fmt.Errorf("%s: protocol %q is not supported (only grpc)", key, p)
			}
			break
		}
	}
	return true, nil
}

func (t *Telemetry) serveMetrics(addr string) error {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("metrics listen on %s: %w", addr, err)
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(t.Registry, promhttp.HandlerOpts{
		Registry:          t.Registry,
		EnableOpenMetrics: true,
		ErrorLog:          slog.NewLogLogger(t.Logger.Handler(), slog.LevelError),
	}))
	t.metricsSrv = &http.Server{
		Handler:           mux,
		ReadHeaderTimeout: 10 * time.Second,
		ErrorLog:          slog.NewLogLogger(t.Logger.Handler(), slog.LevelError),
	}
	t.MetricsAddr = l.Addr()
	t.metricsDone = make(chan struct{})
	go func() {
		defer close(t.metricsDone)
		if err := t.metricsSrv.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
			t.Logger.Error("metrics server stopped", "addr", l.Addr().String(), "err", err)
		}
	}()
	return nil
}

// Shutdown stops the metrics server and flushes and stops the exporters,
// returning their errors joined. Calls after the first return the first's
// result.
func (t *Telemetry) Shutdown(ctx context.Context) error {
	t.shutdownOnce.Do(func() {
		var errs []error
		if t.metricsSrv != nil {
			if err := t.metricsSrv.Shutdown(ctx); err != nil {
				errs = append(errs, fmt.Errorf("metrics server: %w", err))
			}
			<-t.metricsDone
		}
		if tp, ok := t.TracerProvider.(*sdktrace.TracerProvider); ok {
			if err := tp.Shutdown(ctx); err != nil {
				errs = append(errs, fmt.Errorf("tracer provider: %w", err))
			}
		}
		if t.MeterProvider != nil {
			if err := t.MeterProvider.Shutdown(ctx); err != nil {
				errs = append(errs, fmt.Errorf("meter provider: %w", err))
			}
		}
		t.shutdownErr = errors.Join(errs...)
	})
	return t.shutdownErr
}

// errorsOnce routes the OpenTelemetry SDK's own errors (an exporter that
// cannot reach its collector, say) once per process, to the logger of the
// first Telemetry made: by default they go to stderr, several a minute.
var errorsOnce sync.Once

func routeErrors(log *slog.Logger) {
	errorsOnce.Do(func() {
		otel.SetErrorHandler(&errorLog{log: log, every: time.Minute, now: time.Now, last: map[string]time.Time{}, dropped: map[string]int{}})
	})
}

// errorLog logs the SDK's errors at WARN, each distinct one at most once
// per every, saying how many repeats it left out.
type errorLog struct {
	log     *slog.Logger
	every   time.Duration
	now     func() time.Time
	mu      sync.Mutex
	last    map[string]time.Time
	dropped map[string]int
}

// Handle implements otel.ErrorHandler.
func (h *errorLog) Handle(err error) {
	if err == nil {
		return
	}
	msg := err.Error()
	now := h.now()
	h.mu.Lock()
	if at, ok := h.last[msg]; ok && now.Sub(at) < h.every {
		h.dropped[msg]++
		h.mu.Unlock()
		return
	}
	if len(h.last) >= 64 {
		// Errors whose words change each time: start the count again.
		clear(h.last)
		clear(h.dropped)
	}
	n := h.dropped[msg]
	h.last[msg], h.dropped[msg] = now, 0
	h.mu.Unlock()
	h.log.Warn("opentelemetry", "error", msg, "repeats_not_logged", n)
}
