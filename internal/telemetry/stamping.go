package telemetry

import (
	"context"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/embedded"
	"go.opentelemetry.io/otel/trace/noop"
)

// stampingProvider is the tracer provider of a service that exports no
// spans: recording them would cost every RPC, KV call and pass its span's
// allocations and attributes for nothing (about 4 % of a fleet-wide
// change's CPU in bench converge, more with the GC it causes). Its spans
// record nothing, yet each carries a span ID of its own under its parent's
// trace, so that log lines still carry a trace_id to follow a change across
// the services' logs, and the trace context still crosses gRPC, NATS
// headers and manifests to services that do export. Whether a span is
// marked sampled is the OTEL_TRACES_SAMPLER sampler's decision, as the
// SDK's would have been (parentbased_always_on by default).
type stampingProvider struct {
	embedded.TracerProvider
	sampler sdktrace.Sampler
}

var _ trace.TracerProvider = stampingProvider{}

func (p stampingProvider) Tracer(string, ...trace.TracerOption) trace.Tracer {
	return stampingTracer{sampler: p.sampler}
}

type stampingTracer struct {
	embedded.Tracer
	sampler sdktrace.Sampler
}

func (t stampingTracer) Start(ctx context.Context, name string, opts ...trace.SpanStartOption) (context.Context, trace.Span) {
	cfg := trace.NewSpanStartConfig(opts...)
	parentCtx := ctx
	if cfg.NewRoot() {
		parentCtx = trace.ContextWithSpanContext(ctx, trace.SpanContext{})
	}
	parent := trace.SpanContextFromContext(parentCtx)
	scc := trace.SpanContextConfig{TraceID: parent.TraceID()}
	for !scc.TraceID.IsValid() {
		binary.BigEndian.PutUint64(scc.TraceID[:8], rand.Uint64())
		binary.BigEndian.PutUint64(scc.TraceID[8:], rand.Uint64())
	}
	for !scc.SpanID.IsValid() {
		binary.BigEndian.PutUint64(scc.SpanID[:], rand.Uint64())
	}
	res := t.sampler.ShouldSample(sdktrace.SamplingParameters{ParentContext: parentCtx, TraceID: scc.TraceID, Name: name,
		Kind: cfg.SpanKind(), Attributes: cfg.Attributes(), Links: cfg.Links()})
	scc.TraceState = res.Tracestate
	scc.TraceFlags = parent.TraceFlags() &^ trace.FlagsSampled
	if res.Decision == sdktrace.RecordAndSample {
		scc.TraceFlags |= trace.FlagsSampled
	}
	s := stampedSpan{sc: trace.NewSpanContext(scc)}
	return trace.ContextWithSpan(ctx, s), s
}

// stampedSpan records nothing; it only has its span context.
type stampedSpan struct {
	noop.Span
	sc trace.SpanContext
}

func (s stampedSpan) SpanContext() trace.SpanContext { return s.sc }

// samplerFromEnv is the sampler OTEL_TRACES_SAMPLER and
// OTEL_TRACES_SAMPLER_ARG name, as the SDK reads them; an unknown sampler
// or a bad ratio is an error naming the variable.
func samplerFromEnv(getenv func(string) string) (sdktrace.Sampler, error) {
	name := strings.ToLower(strings.TrimSpace(getenv("OTEL_TRACES_SAMPLER")))
	ratio := func() (float64, error) {
		arg := strings.TrimSpace(getenv("OTEL_TRACES_SAMPLER_ARG"))
		if arg == "" {
			return 1, nil
		}
		r, err := strconv.ParseFloat(arg, 64)
		if err != nil || r < 0 || r > 1 {
			return 0, fmt.Errorf("OTEL_TRACES_SAMPLER_ARG: %q is not a ratio between 0 and 1", arg)
		}
		return r, nil
	}
	switch name {
	case "", "parentbased_always_on":
		return sdktrace.ParentBased(sdktrace.AlwaysSample()), nil
	case "always_on":
		return sdktrace.AlwaysSample(), nil
	case "always_off":
		return sdktrace.NeverSample(), nil
	case "parentbased_always_off":
		return sdktrace.ParentBased(sdktrace.NeverSample()), nil
	case "traceidratio", "parentbased_traceidratio":
		r, err := ratio()
		if err != nil {
			return nil, err
		}
		if name == "traceidratio" {
			return sdktrace.TraceIDRatioBased(r), nil
		}
		return sdktrace.ParentBased(sdktrace.TraceIDRatioBased(r)), nil
	}
	return nil, fmt.Errorf("OTEL_TRACES_SAMPLER: sampler %q is not supported (always_on, always_off, traceidratio and their parentbased_ forms)", name)
}
