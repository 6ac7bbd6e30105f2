// Package otlpsink is an OTLP/gRPC receiver for tests: the mesh's processes
// export their spans (and metrics) to it, as they would to a collector, and
// the test reads the spans back.
package otlpsink

import (
	"context"
	"encoding/hex"
	"fmt"
	"net"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	metricsv1 "go.opentelemetry.io/proto/otlp/collector/metrics/v1"
	tracev1 "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonv1 "go.opentelemetry.io/proto/otlp/common/v1"
	otlptracev1 "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/grpc"
)

// Span is one received span.
type Span struct {
	TraceID  string
	SpanID   string
	ParentID string
	Name     string
	Kind     otlptracev1.Span_SpanKind
	// Service is the resource's service.name; Instance its
	// service.instance.id.
	Service  string
	Instance string
	Attrs    map[string]string
	Start    time.Time
	End      time.Time
	Error    string
}

// String names the span for a test log.
func (s Span) String() string {
	who := s.Service
	if s.Instance != "" {
		who += "/" + s.Instance
	}
	var attrs []string
	for k, v := range s.Attrs {
		if strings.HasPrefix(k, "mesh.") || strings.HasPrefix(k, "rpc.method") || strings.HasPrefix(k, "nats.") || strings.HasPrefix(k, "kv.") {
			attrs = append(attrs, k+"="+v)
		}
	}
	sort.Strings(attrs)
	return fmt.Sprintf("%s %q [%s] %s", who, s.Name, s.SpanID, strings.Join(attrs, " "))
}

// Sink is a running receiver.
type Sink struct {
	// Addr is its loopback host:port.
	Addr string

	tracev1.UnimplementedTraceServiceServer
	metrics metricsSink

	mu    sync.Mutex
	spans []Span
}

type metricsSink struct {
	metricsv1.UnimplementedMetricsServiceServer
	mu      sync.Mutex
	exports int
}

func (m *metricsSink) Export(_ context.Context, _ *metricsv1.ExportMetricsServiceRequest) (*metricsv1.ExportMetricsServiceResponse, error) {
	m.mu.Lock()
	m.exports++
	m.mu.Unlock()
	return &metricsv1.ExportMetricsServiceResponse{}, nil
}

// Start serves OTLP/gRPC (traces and metrics, no TLS) on a loopback port
// until the test ends.
func Start(t testing.TB) *Sink {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &Sink{Addr: lis.Addr().String()}
	srv := grpc.NewServer(grpc.MaxRecvMsgSize(64 << 20))
	tracev1.RegisterTraceServiceServer(srv, s)
	metricsv1.RegisterMetricsServiceServer(srv, &s.metrics)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(lis)
	}()
	t.Cleanup(func() {
		srv.Stop()
		<-done
	})
	return s
}

// Endpoint is the OTEL_EXPORTER_OTLP_ENDPOINT value naming the sink.
func (s *Sink) Endpoint() string { return "http://" + s.Addr }

// Env is the environment that makes a mesh process export to the sink,
// batching for at most 100 ms so that spans arrive soon after they end.
func (s *Sink) Env() []string {
	return []string{
		"OTEL_EXPORTER_OTLP_ENDPOINT=" + s.Endpoint(),
		"OTEL_EXPORTER_OTLP_INSECURE=true",
		"OTEL_BSP_SCHEDULE_DELAY=100",
		"OTEL_METRIC_EXPORT_INTERVAL=1000",
	}
}

// MetricExports is how many metric exports arrived.
func (s *Sink) MetricExports() int {
	s.metrics.mu.Lock()
	defer s.metrics.mu.Unlock()
	return s.metrics.exports
}

// Export receives spans.
func (s *Sink) Export(_ context.Context, req *tracev1.ExportTraceServiceRequest) (*tracev1.ExportTraceServiceResponse, error) {
	var got []Span
	for _, rs := range req.GetResourceSpans() {
		res := attrs(rs.GetResource().GetAttributes())
		for _, ss := range rs.GetScopeSpans() {
			for _, sp := range ss.GetSpans() {
				got = append(got, Span{
					TraceID: hex.EncodeToString(sp.GetTraceId()), SpanID: hex.EncodeToString(sp.GetSpanId()),
					ParentID: hex.EncodeToString(sp.GetParentSpanId()), Name: sp.GetName(), Kind: sp.GetKind(),
					Service: res["service.name"], Instance: res["service.instance.id"], Attrs: attrs(sp.GetAttributes()),
					Start: time.Unix(0, int64(sp.GetStartTimeUnixNano())), End: time.Unix(0, int64(sp.GetEndTimeUnixNano())),
					Error: errorOf(sp),
				})
			}
		}
	}
	s.mu.Lock()
	s.spans = append(s.spans, got...)
	s.mu.Unlock()
	return &tracev1.ExportTraceServiceResponse{}, nil
}

func errorOf(sp *otlptracev1.Span) string {
	if sp.GetStatus().GetCode() == otlptracev1.Status_STATUS_CODE_ERROR {
		return sp.GetStatus().GetMessage()
	}
	return ""
}

// Spans returns every span received so far.
func (s *Sink) Spans() []Span {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Span(nil), s.spans...)
}

func attrs(kvs []*commonv1.KeyValue) map[string]string {
	out := make(map[string]string, len(kvs))
	for _, kv := range kvs {
		out[kv.GetKey()] = value(kv.GetValue())
	}
	return out
}

func value(v *commonv1.AnyValue) string {
	switch x := v.GetValue().(type) {
	case *commonv1.AnyValue_StringValue:
		return x.StringValue
	case *commonv1.AnyValue_IntValue:
		return fmt.Sprint(x.IntValue)
	case *commonv1.AnyValue_BoolValue:
		return fmt.Sprint(x.BoolValue)
	case *commonv1.AnyValue_DoubleValue:
		return fmt.Sprint(x.DoubleValue)
	case *commonv1.AnyValue_ArrayValue:
		var parts []string
		for _, e := range x.ArrayValue.GetValues() {
			parts = append(parts, value(e))
		}
		return "[" + strings.Join(parts, ",") + "]"
	}
	return ""
}

// Trace is the spans of one trace, by span id.
type Trace map[string]Span

// TraceOf returns the spans of one trace received so far.
func (s *Sink) TraceOf(traceID string) Trace {
	tr := Trace{}
	for _, sp := range s.Spans() {
		if sp.TraceID == traceID {
			tr[sp.SpanID] = sp
		}
	}
	return tr
}

// Path returns the span and its ancestors, the span first; broken reports
// the parent id that is not in the trace when the walk does not reach a span
// with no parent.
func (tr Trace) Path(sp Span) (path []Span, broken string) {
	seen := map[string]bool{}
	for {
		path = append(path, sp)
		if sp.ParentID == "" || sp.ParentID == "0000000000000000" {
			return path, ""
		}
		if seen[sp.SpanID] {
			return path, sp.ParentID + " (a cycle)"
		}
		seen[sp.SpanID] = true
		parent, ok := tr[sp.ParentID]
		if !ok {
			return path, sp.ParentID
		}
		sp = parent
	}
}

// Tree renders the trace as an indented tree for a test log.
func (tr Trace) Tree() string {
	children := map[string][]Span{}
	var roots []Span
	for _, sp := range tr {
		if _, ok := tr[sp.ParentID]; ok {
			children[sp.ParentID] = append(children[sp.ParentID], sp)
		} else {
			roots = append(roots, sp)
		}
	}
	byStart := func(s []Span) {
		sort.Slice(s, func(i, j int) bool { return s[i].Start.Before(s[j].Start) })
	}
	var b strings.Builder
	var walk func(sp Span, depth int)
	walk = func(sp Span, depth int) {
		fmt.Fprintf(&b, "%s%s", strings.Repeat("  ", depth), sp)
		if sp.ParentID != "" && depth == 0 {
			fmt.Fprintf(&b, " (parent %s not received)", sp.ParentID)
		}
		b.WriteString("\n")
		kids := children[sp.SpanID]
		byStart(kids)
		for _, k := range kids {
			walk(k, depth+1)
		}
	}
	byStart(roots)
	for _, r := range roots {
		walk(r, 0)
	}
	return b.String()
}
