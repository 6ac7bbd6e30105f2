package telemetry

import (
	"context"
	"log/slog"
	"os"

	"go.opentelemetry.io/otel/trace"
)

// newLogger returns a JSON logger that names the service on every line.
func newLogger(cfg Config, serviceName string) *slog.Logger {
	out := cfg.LogOutput
	if out == nil {
		out = os.Stderr
	}
	h := slog.NewJSONHandler(out, &slog.HandlerOptions{Level: cfg.LogLevel})
	return slog.New(traceHandler{h}).With(slog.String("service", serviceName))
}

// traceHandler adds the trace_id and span_id of the record's context, so a
// log line can be found from a trace and the other way round. Only the
// *Context logging calls carry a context; the others log without ids.
type traceHandler struct{ slog.Handler }

func (h traceHandler) Handle(ctx context.Context, r slog.Record) error {
	if sc := trace.SpanContextFromContext(ctx); sc.IsValid() {
		r.AddAttrs(
			slog.String("trace_id", sc.TraceID().String()),
			slog.String("span_id", sc.SpanID().String()),
		)
	}
	return h.Handler.Handle(ctx, r)
}

func (h traceHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	return traceHandler{h.Handler.WithAttrs(attrs)}
}

func (h traceHandler) WithGroup(name string) slog.Handler {
	return traceHandler{h.Handler.WithGroup(name)}
}
