package app_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"mesh.dev/internal/telemetry"
	catalogv1 "mesh.dev/proto/mesh/catalog/v1"
	ct "mesh.dev/services/composer/internal/composertest"
)

// TestTrace covers the spans of DESIGN.md §10 and the trace of §6: a pass,
// each node, each write, each sign call and each KV call are spans of one
// trace that continues from the catalog change (RegisterModule) that caused
// the pass, through the signer, into the signed manifest.
func TestTrace(t *testing.T) {
	t.Parallel()
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	w := ct.New(t, ct.Options{TracerProvider: tp})
	c := w.StartComposer(t, "one")
	c.PutNode(t, ct.Spec("ace", "motd"))
	// The pass the new spec causes is over before the registration comes.
	ct.WaitFor(t, "spec passed", 10*time.Second, func() (bool, string) {
		return w.Passes()["ace"] > 0 && c.Reconciler.Pending() == 0, "not yet"
	})
	fp := w.Publish(t, ct.Motd("1.0"), nil, ct.PublishOptions{})
	resp, err := w.Catalog.RegisterModule(context.Background(), &catalogv1.RegisterModuleRequest{Module: "motd", Fingerprint: fp})
	ct.Must(t, err)
	cause := trace.SpanContextFromContext(telemetry.ContextWithTraceparent(context.Background(), resp.GetRegistration().GetTraceparent(), ""))
	if !cause.IsValid() {
		t.Fatalf("the registration carries no trace context: %q", resp.GetRegistration().GetTraceparent())
	}
	a := w.Converged(t, "ace", map[string]string{"motd": fp})
	m, err := w.CheckAssignment(t, a)
	ct.Must(t, err)
	if got := trace.SpanContextFromContext(telemetry.ContextWithTraceparent(context.Background(), m.GetTraceparent(), "")); got.TraceID() != cause.TraceID() {
		t.Errorf("the manifest carries trace %s, the registration %s", got.TraceID(), cause.TraceID())
	}

	var spans tracetest.SpanStubs
	byID := map[trace.SpanID]tracetest.SpanStub{}
	ct.WaitFor(t, "spans of the trace ended", 10*time.Second, func() (bool, string) {
		spans = nil
		for _, s := range exp.GetSpans() {
			if s.SpanContext.TraceID() == cause.TraceID() {
				spans = append(spans, s)
				byID[s.SpanContext.SpanID()] = s
			}
		}
		var names []string
		for _, s := range spans {
			names = append(names, s.Name)
		}
		for _, want := range []string{"composer.write.assignment", "composer.sign.manifests"} {
			if !slices.Contains(names, want) {
				return false, fmt.Sprintf("spans %v", names)
			}
		}
		return true, ""
	})
	find := func(pred func(tracetest.SpanStub) bool) []tracetest.SpanStub {
		var out []tracetest.SpanStub
		for _, s := range spans {
			if pred(s) {
				out = append(out, s)
			}
		}
		return out
	}
	named := func(name string) []tracetest.SpanStub {
		return find(func(s tracetest.SpanStub) bool { return s.Name == name })
	}
	// ancestor reports whether a is an ancestor of s within the trace.
	ancestor := func(a, s tracetest.SpanStub) bool {
		for p := s.Parent; p.IsValid(); {
			if p.SpanID() == a.SpanContext.SpanID() {
				return true
			}
			parent, ok := byID[p.SpanID()]
			if !ok {
				return false
			}
			p = parent.Parent
		}
		return false
	}
	passes := find(func(s tracetest.SpanStub) bool {
		return s.Name == "composer.pass" && s.Parent.SpanID() == cause.SpanID()
	})
	if len(passes) != 1 {
		t.Fatalf("%d composer.pass spans are children of the registration's span", len(passes))
	}
	nodes := find(func(s tracetest.SpanStub) bool { return s.Name == "composer.pass.node" && ancestor(passes[0], s) })
	if len(nodes) != 1 {
		t.Fatalf("%d node spans under the pass", len(nodes))
	}
	node := nodes[0]
	for _, want := range []string{
		"composer.write.composition", "composer.write.judgement", "composer.write.assignment",
		"composer.sign.compositions", "composer.sign.manifests",
		"kv.create compositions", "kv.create composed", "kv.update assignments",
	} {
		got := named(want)
		if len(got) == 0 || !ancestor(node, got[0]) {
			t.Errorf("no %s span under the node's pass", want)
		}
	}
	// The spec is the one the nodes watch delivered: the pass does not
	// read it again (nor, once the watch delivered it, the assignment).
	if got := find(func(s tracetest.SpanStub) bool { return s.Name == "kv.get nodes" && ancestor(node, s) }); len(got) != 0 {
		t.Errorf("the node's pass read its spec again (%d kv.get nodes spans) though the watch delivered it", len(got))
	}
	// The signer's side of each sign call is in the trace too.
	if got := find(func(s tracetest.SpanStub) bool { return strings.HasPrefix(s.Name, "signer.Sign") && ancestor(node, s) }); len(got) < 2 {
		t.Errorf("%d signer spans under the node's pass, want its SignCompositions and SignManifests", len(got))
		for _, s := range spans {
			t.Logf("%s %s parent %s", s.Name, s.SpanContext.SpanID(), s.Parent.SpanID())
		}
	}
}
