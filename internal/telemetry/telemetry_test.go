package telemetry

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/baggage"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"
)

// keptExporter keeps its spans through Shutdown (InMemoryExporter clears
// them), so a test can look at what a Shutdown flushed.
type keptExporter struct{ *tracetest.InMemoryExporter }

func (keptExporter) Shutdown(context.Context) error { return nil }

func newTelemetry(t *testing.T, cfg Config) *Telemetry {
	t.Helper()
	if cfg.LogOutput == nil {
		cfg.LogOutput = io.Discard
	}
	tel, err := setup(t.Context(), cfg, func(string) string { return "" })
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	t.Cleanup(func() { _ = tel.Shutdown(context.Background()) })
	return tel
}

func serviceNameOf(s tracetest.SpanStub) string {
	v, _ := s.Resource.Set().Value(semconv.ServiceNameKey)
	return v.AsString()
}

func TestSpansCarryServiceName(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		services []string
	}{
		{name: "one service", services: []string{"catalog"}},
		// The dev mesh: four services in one process, each with its own
		// provider and name, none of them global.
		{name: "four services in one process", services: []string{"catalog", "signer", "composer", "nodeengine"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			exps := make([]*tracetest.InMemoryExporter, len(tt.services))
			for i, svc := range tt.services {
				exps[i] = tracetest.NewInMemoryExporter()
				tel := newTelemetry(t, Config{
					ServiceName:    svc,
					ServiceVersion: "v0.0.1",
					SpanProcessor:  sdktrace.NewSimpleSpanProcessor(exps[i]),
				})
				_, span := tel.TracerProvider.Tracer("test").Start(t.Context(), "op-"+svc)
				span.End()
			}
			for i, svc := range tt.services {
				spans := exps[i].GetSpans()
				if len(spans) != 1 {
					t.Fatalf("%s: got %d spans, want 1", svc, len(spans))
				}
				if got := serviceNameOf(spans[0]); got != svc {
					t.Errorf("%s: span service.name = %q", svc, got)
				}
				if got := spans[0].Name; got != "op-"+svc {
					t.Errorf("%s: span name = %q", svc, got)
				}
				v, _ := spans[0].Resource.Set().Value(semconv.ServiceVersionKey)
				if v.AsString() != "v0.0.1" {
					t.Errorf("%s: service.version = %q", svc, v.AsString())
				}
			}
		})
	}
}

// TestServiceNameFromEnvironment is not parallel: it sets the environment.
func TestServiceNameFromEnvironment(t *testing.T) {
	t.Setenv("OTEL_SERVICE_NAME", "from-env")
	t.Setenv("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment.name=test")
	exp := tracetest.NewInMemoryExporter()
	var logs bytes.Buffer
	tel := newTelemetry(t, Config{ServiceName: "from-config", LogOutput: &logs, SpanProcessor: sdktrace.NewSimpleSpanProcessor(exp)})
	_, span := tel.TracerProvider.Tracer("test").Start(t.Context(), "op")
	span.End()
	spans := exp.GetSpans()
	if len(spans) != 1 {
		t.Fatalf("got %d spans, want 1", len(spans))
	}
	if got := serviceNameOf(spans[0]); got != "from-env" {
		t.Errorf("service.name = %q, want from-env", got)
	}
	if v, _ := spans[0].Resource.Set().Value("deployment.environment.name"); v.AsString() != "test" {
		t.Errorf("OTEL_RESOURCE_ATTRIBUTES not honoured: %q", v.AsString())
	}
	tel.Logger.Info("hello")
	if !strings.Contains(logs.String(), `"service":"from-env"`) {
		t.Errorf("log line does not name the service from the environment: %s", logs.String())
	}
}

func TestTraceparentRoundTrip(t *testing.T) {
	t.Parallel()
	traceID, _ := trace.TraceIDFromHex("4bf92f3577b34da6a3ce929d0e0e4736")
	spanID, _ := trace.SpanIDFromHex("00f067aa0ba902b7")
	state, _ := trace.ParseTraceState("mesh=1,other=2")
	tests := []struct {
		name      string
		sc        trace.SpanContext
		wantState string
	}{
		{
			name: "sampled",
			sc:   trace.NewSpanContext(trace.SpanContextConfig{TraceID: traceID, SpanID: spanID, TraceFlags: trace.FlagsSampled}),
		},
		{
			name: "not sampled",
			sc:   trace.NewSpanContext(trace.SpanContextConfig{TraceID: traceID, SpanID: spanID}),
		},
		{
			name:      "with tracestate",
			sc:        trace.NewSpanContext(trace.SpanContextConfig{TraceID: traceID, SpanID: spanID, TraceFlags: trace.FlagsSampled, TraceState: state}),
			wantState: "mesh=1,other=2",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			ctx := trace.ContextWithSpanContext(t.Context(), tt.sc)
			tp, ts := Traceparent(ctx)
			if tp == "" {
				t.Fatal("empty traceparent")
			}
			if ts != tt.wantState {
				t.Errorf("tracestate = %q, want %q", ts, tt.wantState)
			}
			got := trace.SpanContextFromContext(ContextWithTraceparent(t.Context(), tp, ts))
			if !got.IsRemote() {
				t.Error("span context is not remote")
			}
			if !got.Equal(tt.sc.WithRemote(true)) {
				t.Errorf("round trip = %v, want %v", got, tt.sc)
			}

			// A span started under it joins the trace with it as parent.
			exp := tracetest.NewInMemoryExporter()
			tel := newTelemetry(t, Config{ServiceName: "rt", SpanProcessor: sdktrace.NewSimpleSpanProcessor(exp)})
			_, span := tel.TracerProvider.Tracer("test").Start(ContextWithTraceparent(t.Context(), tp, ts), "child")
			span.End()
			if sc := span.SpanContext(); sc.TraceID() != traceID {
				t.Errorf("child trace id = %s, want %s", sc.TraceID(), traceID)
			}
			if spans := exp.GetSpans(); tt.sc.IsSampled() && (len(spans) != 1 || spans[0].Parent.SpanID() != spanID) {
				t.Errorf("sampled child not exported with the remote parent: %+v", spans)
			}
		})
	}
}

func TestContextWithTraceparentInvalid(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, traceparent, tracestate string
	}{
		{name: "empty"},
		{name: "garbage", traceparent: "not a traceparent"},
		{name: "zero trace id", traceparent: "00-00000000000000000000000000000000-00f067aa0ba902b7-01"},
		{name: "zero span id", traceparent: "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01"},
		{name: "version ff", traceparent: "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"},
		{name: "short", traceparent: "00-4bf92f35-00f067aa0ba902b7-01", tracestate: "a=b"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.WithValue(t.Context(), struct{}{}, "marker")
			if got := ContextWithTraceparent(ctx, tt.traceparent, tt.tracestate); got != ctx {
				t.Errorf("invalid input changed the context: %v", trace.SpanContextFromContext(got))
			}
		})
	}
	if tp, ts := Traceparent(t.Context()); tp != "" || ts != "" {
		t.Errorf("Traceparent of a context with no span = %q, %q", tp, ts)
	}
}

func TestHeaderRoundTrip(t *testing.T) {
	t.Parallel()
	traceID, _ := trace.TraceIDFromHex("0af7651916cd43dd8448eb211c80319c")
	spanID, _ := trace.SpanIDFromHex("b7ad6b7169203331")
	sc := trace.NewSpanContext(trace.SpanContextConfig{TraceID: traceID, SpanID: spanID, TraceFlags: trace.FlagsSampled})
	member, _ := baggage.NewMember("node", "n1")
	bag, _ := baggage.New(member)

	tests := []struct {
		name      string
		header    func() nats.Header
		wantValid bool
		wantBag   string
	}{
		{
			name: "span and baggage",
			header: func() nats.Header {
				h := nats.Header{}
				InjectHeader(baggage.ContextWithBaggage(trace.ContextWithSpanContext(context.Background(), sc), bag), h)
				return h
			},
			wantValid: true,
			wantBag:   "n1",
		},
		{
			name: "canonical key from another client",
			header: func() nats.Header {
				h := nats.Header{}
				h["Traceparent"] = []string{"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}
				return h
			},
			wantValid: true,
		},
		{
			name: "no span",
			header: func() nats.Header {
				h := nats.Header{}
				InjectHeader(context.Background(), h)
				if len(h) != 0 {
					panic("header written without a span")
				}
				return h
			},
		},
		{name: "nil header", header: func() nats.Header { return nil }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			h := tt.header()
			if tt.wantValid && h.Get("traceparent") == "" {
				if _, ok := h["Traceparent"]; !ok {
					t.Fatalf("no traceparent key written: %v", h)
				}
			}
			got := trace.SpanContextFromContext(ExtractHeader(t.Context(), h))
			if got.IsValid() != tt.wantValid {
				t.Fatalf("extracted valid = %v, want %v", got.IsValid(), tt.wantValid)
			}
			if tt.wantValid && (got.TraceID() != traceID || got.SpanID() != spanID) {
				t.Errorf("extracted %v, want %v", got, sc)
			}
			if b := baggage.FromContext(ExtractHeader(t.Context(), h)).Member("node").Value(); b != tt.wantBag {
				t.Errorf("baggage node = %q, want %q", b, tt.wantBag)
			}
		})
	}
}

func TestMetricsEndpoint(t *testing.T) {
	t.Parallel()
	tel := newTelemetry(t, Config{ServiceName: "metrics-test", MetricsAddr: "127.0.0.1:0"})
	if tel.MetricsAddr == nil {
		t.Fatal("MetricsAddr not set")
	}
	counter, err := tel.MeterProvider.Meter("mesh.dev/test").Int64Counter("mesh.test.requests")
	if err != nil {
		t.Fatal(err)
	}
	counter.Add(t.Context(), 3)

	body := get(t, "http://"+tel.MetricsAddr.String()+"/metrics")
	for _, want := range []string{
		"mesh_test_requests_total",    // the OTel counter
		"go_goroutines",               // the Go runtime collector
		"process_open_fds",            // the process collector
		`service_name="metrics-test"`, // target_info carries the resource
	} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	if !strings.Contains(body, "mesh_test_requests_total{") || !strings.Contains(body, "} 3") {
		t.Errorf("counter value not served:\n%s", grep(body, "mesh_test_requests"))
	}
}

func TestShutdownFlushes(t *testing.T) {
	t.Parallel()
	exp := keptExporter{tracetest.NewInMemoryExporter()}
	reader := sdkmetric.NewManualReader()
	tel, err := setup(t.Context(), Config{
		ServiceName:  "flush",
		MetricsAddr:  "127.0.0.1:0",
		LogOutput:    io.Discard,
		SpanExporter: exp, // batched: nothing is exported before a flush
		MetricReader: reader,
	}, func(string) string { return "" })
	if err != nil {
		t.Fatal(err)
	}
	_, span := tel.TracerProvider.Tracer("test").Start(t.Context(), "pending")
	span.End()
	url := "http://" + tel.MetricsAddr.String() + "/metrics"
	get(t, url)

	if err := tel.Shutdown(t.Context()); err != nil {
		t.Fatalf("shutdown: %v", err)
	}
	if spans := exp.GetSpans(); len(spans) != 1 || spans[0].Name != "pending" {
		t.Errorf("shutdown did not flush the batched span: %v", spans)
	}
	if _, err := http.Get(url); err == nil {
		t.Error("metrics server still serves after shutdown")
	}
	if err := tel.Shutdown(t.Context()); err != nil {
		t.Errorf("second shutdown: %v", err)
	}
}

func TestLoggerCarriesServiceAndTrace(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	tel := newTelemetry(t, Config{ServiceName: "logger", LogOutput: &buf, LogLevel: slog.LevelDebug})
	ctx, span := tel.TracerProvider.Tracer("test").Start(t.Context(), "op")
	tel.Logger.DebugContext(ctx, "with span", "key", "k1")
	span.End()
	tel.Logger.Info("without span")

	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 2 {
		t.Fatalf("got %d lines: %q", len(lines), buf.String())
	}
	var first, second map[string]any
	if err := json.Unmarshal([]byte(lines[0]), &first); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal([]byte(lines[1]), &second); err != nil {
		t.Fatal(err)
	}
	if first["service"] != "logger" || first["key"] != "k1" || first["trace_id"] != span.SpanContext().TraceID().String() {
		t.Errorf("first line = %v", first)
	}
	if _, ok := second["trace_id"]; ok || second["service"] != "logger" {
		t.Errorf("second line = %v", second)
	}
}

func TestExporterWanted(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		signal  string
		env     map[string]string
		want    bool
		wantErr string
	}{
		{name: "nothing set", signal: "TRACES"},
		{name: "endpoint", signal: "TRACES", env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317"}, want: true},
		{name: "signal endpoint", signal: "TRACES", env: map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4317"}, want: true},
		{name: "other signal endpoint", signal: "METRICS", env: map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4317"}},
		{name: "endpoint but none", signal: "TRACES", env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317", "OTEL_TRACES_EXPORTER": "none"}},
		{name: "explicit otlp without endpoint", signal: "TRACES", env: map[string]string{"OTEL_TRACES_EXPORTER": "otlp"}, want: true},
		{name: "sdk disabled", signal: "TRACES", env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317", "OTEL_SDK_DISABLED": "true"}},
		{name: "metrics prometheus", signal: "METRICS", env: map[string]string{"OTEL_METRICS_EXPORTER": "prometheus"}},
		{name: "metrics otlp and prometheus", signal: "METRICS", env: map[string]string{"OTEL_METRICS_EXPORTER": "otlp, prometheus"}, want: true},
		{name: "grpc protocol", signal: "TRACES", env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, want: true},
		{name: "unknown exporter", signal: "TRACES", env: map[string]string{"OTEL_TRACES_EXPORTER": "zipkin"}, wantErr: `exporter "zipkin" is not supported`},
		{name: "http protocol", signal: "TRACES", env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf"}, wantErr: `protocol "http/protobuf" is not supported`},
		{name: "signal protocol wins", signal: "TRACES", env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "grpc"}, want: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := exporterWanted(func(k string) string { return tt.env[k] }, tt.signal)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got != tt.want {
				t.Errorf("wanted = %v, want %v", got, tt.want)
			}
		})
	}
}

// TestSetupRefusesBadEnvironment is not parallel: it sets the environment.
func TestSetupRefusesBadEnvironment(t *testing.T) {
	t.Setenv("OTEL_TRACES_EXPORTER", "jaeger")
	_, err := Setup(t.Context(), Config{ServiceName: "bad", MetricsAddr: "127.0.0.1:0", LogOutput: io.Discard})
	if err == nil || !strings.Contains(err.Error(), "OTEL_TRACES_EXPORTER") {
		t.Fatalf("err = %v, want one naming OTEL_TRACES_EXPORTER", err)
	}
}

// TestGlobal is not parallel: it changes the otel globals.
func TestGlobal(t *testing.T) {
	prevTP, prevMP, prevProp := otel.GetTracerProvider(), otel.GetMeterProvider(), otel.GetTextMapPropagator()
	t.Cleanup(func() {
		otel.SetTracerProvider(prevTP)
		otel.SetMeterProvider(prevMP)
		otel.SetTextMapPropagator(prevProp)
	})
	tel := newTelemetry(t, Config{ServiceName: "global", Global: true})
	if otel.GetTracerProvider() != tel.TracerProvider {
		t.Error("tracer provider not global")
	}
	if otel.GetMeterProvider() != tel.MeterProvider {
		t.Error("meter provider not global")
	}
	fields := otel.GetTextMapPropagator().Fields()
	for _, want := range []string{"traceparent", "baggage"} {
		if !strings.Contains(strings.Join(fields, ","), want) {
			t.Errorf("global propagator lacks %s: %v", want, fields)
		}
	}
}

func get(t *testing.T, url string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %s: %s", url, resp.Status, b)
	}
	return string(b)
}

func grep(s, substr string) string {
	var out []string
	for line := range strings.SplitSeq(s, "\n") {
		if strings.Contains(line, substr) {
			out = append(out, line)
		}
	}
	return strings.Join(out, "\n")
}

// TestSDKErrorsLoggedOncePerWhile: the SDK's own errors go to the log at
// WARN, a repeat within the period left out and counted in the next line.
func TestSDKErrorsLoggedOncePerWhile(t *testing.T) {
	var buf bytes.Buffer
	now := time.Now()
	h := &errorLog{log: slog.New(slog.NewTextHandler(&buf, nil)), every: time.Minute, now: func() time.Time { return now },
		last: map[string]time.Time{}, dropped: map[string]int{}}
	refused := errors.New("traces export: connect: connection refused")
	for range 3 {
		h.Handle(refused)
	}
	h.Handle(errors.New("another"))
	if n := strings.Count(buf.String(), "connection refused"); n != 1 {
		t.Fatalf("logged %d times within the period, want once:\n%s", n, buf.String())
	}
	now = now.Add(time.Minute)
	h.Handle(refused)
	if !strings.Contains(buf.String(), `level=WARN msg=opentelemetry error="traces export: connect: connection refused" repeats_not_logged=2`) {
		t.Fatalf("the next line does not count the 2 repeats:\n%s", buf.String())
	}
	if !strings.Contains(buf.String(), "error=another") {
		t.Errorf("another error was not logged:\n%s", buf.String())
	}
}

// TestSpansWithNothingExportingRecordNothing: with no exporter and no
// processor a span records nothing, yet carries IDs of its own under its
// parent's trace, and its trace context passes on as a traceparent.
func TestSpansWithNothingExportingRecordNothing(t *testing.T) {
	t.Parallel()
	tel := newTelemetry(t, Config{ServiceName: "quiet", LogOutput: io.Discard})
	if _, ok := tel.TracerProvider.(*sdktrace.TracerProvider); ok {
		t.Fatal("the SDK's provider with nothing to export to")
	}
	tr := tel.TracerProvider.Tracer("test")
	ctx, root := tr.Start(t.Context(), "root")
	if root.IsRecording() {
		t.Error("a span records with nothing exporting")
	}
	rsc := root.SpanContext()
	if !rsc.IsValid() || !rsc.IsSampled() {
		t.Fatalf("root span context %v: want valid and sampled", rsc)
	}
	cctx, child := tr.Start(ctx, "child")
	csc := child.SpanContext()
	if csc.TraceID() != rsc.TraceID() || csc.SpanID() == rsc.SpanID() || !csc.SpanID().IsValid() {
		t.Fatalf("child %v of root %v: want the root's trace with a span ID of its own", csc, rsc)
	}
	tp, _ := Traceparent(cctx)
	if want := "00-" + rsc.TraceID().String() + "-" + csc.SpanID().String() + "-01"; tp != want {
		t.Fatalf("traceparent %q, want %q", tp, want)
	}
	// A remote parent not sampled stays not sampled.
	remote := ContextWithTraceparent(t.Context(), "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00", "")
	_, sp := tr.Start(remote, "remote child")
	if sc := sp.SpanContext(); sc.IsSampled() || sc.TraceID().String() != "0af7651916cd43dd8448eb211c80319c" {
		t.Fatalf("child of an unsampled remote parent: %v", sc)
	}
	_, other := tr.Start(ctx, "new root", trace.WithNewRoot())
	if other.SpanContext().TraceID() == rsc.TraceID() {
		t.Fatal("WithNewRoot kept the parent's trace")
	}
}

// TestSamplerFromTheEnvironment: with nothing exporting, OTEL_TRACES_SAMPLER
// still decides which spans are marked sampled, as the SDK's sampler would;
// one that cannot be honoured fails the start naming the variable.
func TestSamplerFromTheEnvironment(t *testing.T) {
	t.Parallel()
	sampledParent := "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
	tests := []struct {
		sampler, arg         string
		root, childOfSampled bool
		err                  string
	}{
		{sampler: "", root: true, childOfSampled: true},
		{sampler: "always_off", root: false, childOfSampled: false},
		{sampler: "parentbased_always_off", root: false, childOfSampled: true},
		{sampler: "traceidratio", arg: "0", root: false, childOfSampled: false},
		{sampler: "parentbased_traceidratio", arg: "1", root: true, childOfSampled: true},
		{sampler: "xray", err: "OTEL_TRACES_SAMPLER"},
		{sampler: "traceidratio", arg: "2", err: "OTEL_TRACES_SAMPLER_ARG"},
	}
	for _, tt := range tests {
		t.Run(tt.sampler+"/"+tt.arg, func(t *testing.T) {
			t.Parallel()
			env := map[string]string{"OTEL_TRACES_SAMPLER": tt.sampler, "OTEL_TRACES_SAMPLER_ARG": tt.arg}
			tel, err := setup(t.Context(), Config{ServiceName: "quiet", LogOutput: io.Discard}, func(k string) string { return env[k] })
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("setup: %v, want an error naming %s", err, tt.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			defer tel.Shutdown(context.Background())
			tr := tel.TracerProvider.Tracer("test")
			_, root := tr.Start(t.Context(), "root")
			_, child := tr.Start(ContextWithTraceparent(t.Context(), sampledParent, ""), "child")
			if got := root.SpanContext().IsSampled(); got != tt.root {
				t.Errorf("root sampled = %v, want %v", got, tt.root)
			}
			if got := child.SpanContext().IsSampled(); got != tt.childOfSampled {
				t.Errorf("child of a sampled parent sampled = %v, want %v", got, tt.childOfSampled)
			}
			if !root.SpanContext().IsValid() || !child.SpanContext().IsValid() {
				t.Error("a span without IDs")
			}
		})
	}
}
