package telemetry

import (
	"context"
	"strings"

	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel/propagation"
)

// propagator is the mesh's wire format for trace context: W3C Trace Context
// and Baggage. NATS headers and signed manifests are the mesh's own protocol,
// so their format is fixed here rather than taken from OTEL_PROPAGATORS or the
// global propagator, which differ between processes.
var propagator = propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})

// Propagator returns the composite W3C Trace Context + Baggage propagator the
// mesh uses on every hop (gRPC metadata, NATS headers, manifests).
func Propagator() propagation.TextMapPropagator { return propagator }

// InjectHeader writes the trace context and baggage of ctx into h (the
// traceparent, tracestate and baggage keys). h must not be nil.
func InjectHeader(ctx context.Context, h nats.Header) {
	propagator.Inject(ctx, natsHeaderCarrier(h))
}

// ExtractHeader returns ctx with the remote span context and baggage found in
// h; ctx is returned unchanged when h holds none or holds an invalid one.
func ExtractHeader(ctx context.Context, h nats.Header) context.Context {
	if len(h) == 0 {
		return ctx
	}
	return propagator.Extract(ctx, natsHeaderCarrier(h))
}

// Traceparent returns the W3C traceparent and tracestate of the span in ctx,
// both "" when ctx holds no valid span context. Sync manifests carry them.
func Traceparent(ctx context.Context) (traceparent, tracestate string) {
	c := propagation.MapCarrier{}
	propagation.TraceContext{}.Inject(ctx, c)
	return c["traceparent"], c["tracestate"]
}

// ContextWithTraceparent returns ctx with the span context that traceparent
// and tracestate describe as its remote parent, so spans started from it join
// that trace. Invalid input returns ctx unchanged.
func ContextWithTraceparent(ctx context.Context, traceparent, tracestate string) context.Context {
	if traceparent == "" {
		return ctx
	}
	c := propagation.MapCarrier{"traceparent": traceparent}
	if tracestate != "" {
		c["tracestate"] = tracestate
	}
	return propagation.TraceContext{}.Extract(ctx, c)
}

// natsHeaderCarrier adapts nats.Header to a TextMapCarrier. NATS header keys
// are case-sensitive, so keys are written exactly as the propagator names
// them (lower case, as W3C spells them) and read case-insensitively, so that a
// header written by another client as "Traceparent" is still found.
type natsHeaderCarrier nats.Header

func (c natsHeaderCarrier) Get(key string) string {
	if v := c[key]; len(v) > 0 {
		return v[0]
	}
	for k, v := range c {
		if len(v) > 0 && strings.EqualFold(k, key) {
			return v[0]
		}
	}
	return ""
}

func (c natsHeaderCarrier) Set(key, value string) {
	for k := range c {
		if k != key && strings.EqualFold(k, key) {
			delete(c, k)
		}
	}
	c[key] = []string{value}
}

func (c natsHeaderCarrier) Keys() []string {
	keys := make([]string, 0, len(c))
	for k := range c {
		keys = append(keys, k)
	}
	return keys
}
