// Package traced runs the multi-process mesh with every process exporting
// OTLP to a receiver in the test, and checks that one trace runs from a
// module's registration to every node's apply and report (DESIGN.md §6,
// §10).
package traced

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	otlptracev1 "go.opentelemetry.io/proto/otlp/trace/v1"

	"mesh.dev/tests/internal/otlpsink"
	"mesh.dev/tests/internal/procmesh"
)

func TestMain(m *testing.M) { os.Exit(procmesh.Main(m)) }

const (
	convergeTimeout = 3 * time.Minute
	// traceTimeout bounds how long the spans of the trace take to arrive
	// once the fleet converged (each process batches for 100 ms).
	traceTimeout = time.Minute
	// registerMethod is the otelgrpc name of the catalog's RegisterModule.
	registerMethod = "mesh.catalog.v1.CatalogService/RegisterModule"
	getEntryMethod = "mesh.catalog.v1.CatalogService/GetEntry"
)

// TestTraceFromRegistrationToApply publishes an edited module into a
// converged fleet and checks the trace its registration starts: the
// catalog's RegisterModule span is its root, and it holds the catalog's
// registration write, the composer's pass and each node's pass, the
// signer's signatures, the composer's JetStream writes, each engine's apply
// and the composer's record of each engine's report, each reaching the root
// through its parents and through the hops that caused it.
func TestTraceFromRegistrationToApply(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the whole mesh as processes")
	}
	start := time.Now()
	sink := otlpsink.Start(t)
	m := procmesh.Start(t, procmesh.Options{
		Env: sink.Env(),
		// The three engines share a service name; the instance tells them
		// apart, as it would on a fleet.
		NodeEnv: func(node string) []string { return []string{"OTEL_RESOURCE_ATTRIBUTES=service.instance.id=" + node} },
	})

	dirs := procmesh.ExampleModuleDirs(t)
	published := m.Publish(nil, dirs...)
	m.PutNodes()
	m.ApproveFirstPlacements(convergeTimeout)
	m.WaitFor("3 engines converged", convergeTimeout, m.Converged)

	edited := filepath.Join(t.TempDir(), "motd")
	procmesh.CopyDir(t, filepath.Join(filepath.Dir(dirs[0]), "motd"), edited)
	f, err := os.OpenFile(filepath.Join(edited, "files", "motd"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString("  traced change\n"); err != nil {
		t.Fatal(err)
	}
	f.Close()
	changeStart := time.Now()
	changed := m.Publish(nil, edited)["motd"]
	if !changed.Registered || changed.Fingerprint == published["motd"].Fingerprint {
		t.Fatalf("publish of the edited motd: %+v, want a new registration", changed)
	}
	m.WaitFor("3 engines converged on the edited motd", convergeTimeout, m.ModuleAt("motd", changed.Fingerprint))

	nodes := make([]string, 0, len(m.Engines))
	for _, e := range m.Engines {
		nodes = append(nodes, e.Node)
	}
	deadline := time.Now().Add(traceTimeout)
	var tr otlpsink.Trace
	for {
		var problems []string
		tr, problems = checkTrace(sink, changeStart, nodes)
		if len(problems) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Logf("the trace of the registration (%d spans):\n%s", len(tr), tr.Tree())
			t.Fatalf("the trace of the registration of motd %s is not whole after %s:\n  %s", changed.Fingerprint, traceTimeout, strings.Join(problems, "\n  "))
		}
		time.Sleep(200 * time.Millisecond)
	}
	services := map[string]int{}
	for _, sp := range tr {
		services[sp.Service]++
	}
	t.Logf("one trace of %d spans from RegisterModule to every apply (by service: %v); %d metric exports", len(tr), services, sink.MetricExports())
	if sink.MetricExports() == 0 {
		t.Errorf("no process exported metrics over OTLP")
	}
	if os.Getenv("MESH_TRACE_TREE") != "" {
		t.Logf("%s", tr.Tree())
	}
	t.Logf("traced end to end in %.1fs", time.Since(start).Seconds())
}

// checkTrace finds the trace of the RegisterModule call made after since
// and returns it with what is missing or wrongly parented in it.
func checkTrace(sink *otlpsink.Sink, since time.Time, nodes []string) (otlpsink.Trace, []string) {
	var roots []otlpsink.Span
	for _, sp := range sink.Spans() {
		if sp.Service == "mesh-catalog" && sp.Name == registerMethod && sp.Kind == otlptracev1.Span_SPAN_KIND_SERVER && !sp.Start.Before(since) {
			roots = append(roots, sp)
		}
	}
	if len(roots) != 1 {
		return nil, []string{fmt.Sprintf("%d catalog %s server spans since the edited module was published, want 1", len(roots), registerMethod)}
	}
	root := roots[0]
	tr := sink.TraceOf(root.TraceID)
	var problems []string
	if root.ParentID != "" {
		problems = append(problems, fmt.Sprintf("the RegisterModule span has a parent %s: meshctl does not trace, so it should be the root", root.ParentID))
	}

	// Every span of the trace reaches the root through spans that arrived.
	for _, sp := range tr {
		path, broken := tr.Path(sp)
		if broken != "" {
			problems = append(problems, fmt.Sprintf("%s: parent %s is not in the trace", sp, broken))
		} else if top := path[len(path)-1]; top.SpanID != root.SpanID {
			problems = append(problems, fmt.Sprintf("%s: reaches %s, not the RegisterModule span", sp, top))
		}
	}

	// want finds spans matching a description; each must lie below an
	// ancestor matching under (when given), which proves the hop.
	want := func(what string, match func(otlpsink.Span) bool, under func(otlpsink.Span) bool, underWhat string) {
		var found, placed int
		for _, sp := range tr {
			if !match(sp) {
				continue
			}
			found++
			path, _ := tr.Path(sp)
			if under == nil {
				placed++
				continue
			}
			for _, a := range path[1:] {
				if under(a) {
					placed++
					break
				}
			}
		}
		switch {
		case found == 0:
			problems = append(problems, "no "+what)
		case placed == 0:
			problems = append(problems, fmt.Sprintf("%d %s, none below %s", found, what, underWhat))
		}
	}
	named := func(service, name string) func(otlpsink.Span) bool {
		return func(sp otlpsink.Span) bool { return sp.Service == service && sp.Name == name }
	}
	onNode := func(f func(otlpsink.Span) bool, node string) func(otlpsink.Span) bool {
		return func(sp otlpsink.Span) bool { return f(sp) && sp.Attrs["mesh.node"] == node }
	}
	kv := func(service, bucket string, ops ...string) func(otlpsink.Span) bool {
		return func(sp otlpsink.Span) bool {
			if sp.Service != service {
				return false
			}
			for _, op := range ops {
				if sp.Name == op+" "+bucket {
					return true
				}
			}
			return false
		}
	}
	isRoot := func(sp otlpsink.Span) bool { return sp.SpanID == root.SpanID }
	writes := []string{"kv.create", "kv.update", "kv.put"}

	want("catalog.RegisterModule span", named("mesh-catalog", "catalog.RegisterModule"), isRoot, "the RegisterModule server span")
	want("catalog write of the registration (kv.* catalog-modules)", kv("mesh-catalog", "catalog-modules", writes...), named("mesh-catalog", "catalog.RegisterModule"), "catalog.RegisterModule")
	want("composer.pass span", named("mesh-composer", "composer.pass"), named("mesh-catalog", "catalog.RegisterModule"), "catalog.RegisterModule")
	for _, node := range nodes {
		passNode := onNode(named("mesh-composer", "composer.pass.node"), node)
		want("composer.pass.node span of "+node, passNode, named("mesh-composer", "composer.pass"), "composer.pass")
	}
	anyPassNode := named("mesh-composer", "composer.pass.node")
	want("signer.SignCompositions span", named("mesh-signer", "signer.SignCompositions"), anyPassNode, "composer.pass.node")
	want("signer.SignManifests span", named("mesh-signer", "signer.SignManifests"), anyPassNode, "composer.pass.node")
	want("composer write of a composition (kv.* compositions)", kv("mesh-composer", "compositions", writes...), anyPassNode, "composer.pass.node")
	want("composer write of an assignment (kv.* assignments)", kv("mesh-composer", "assignments", writes...), anyPassNode, "composer.pass.node")
	for _, node := range nodes {
		apply := func(sp otlpsink.Span) bool {
			return sp.Service == "mesh-nodeengine" && sp.Instance == node && sp.Name == "nodeengine.pass" && sp.Attrs["mesh.node"] == node
		}
		want("nodeengine.pass (apply) span of "+node, apply, onNode(anyPassNode, node), "composer.pass.node of "+node)
		want("engine's catalog GetEntry of "+node, func(sp otlpsink.Span) bool {
			return sp.Service == "mesh-nodeengine" && sp.Instance == node && sp.Name == getEntryMethod && sp.Kind == otlptracev1.Span_SPAN_KIND_CLIENT
		}, apply, "nodeengine.pass of "+node)
		report := onNode(named("mesh-composer", "composer.sync.report"), node)
		want("composer.sync.report span of "+node, report, apply, "nodeengine.pass of "+node)
		want("composer write of the haves of "+node+" (kv.* haves)", func(sp otlpsink.Span) bool {
			return kv("mesh-composer", "haves", writes...)(sp)
		}, report, "composer.sync.report of "+node)
	}
	sort.Strings(problems)
	return tr, dedupe(problems)
}

func dedupe(s []string) []string {
	var out []string
	for i, v := range s {
		if i == 0 || v != s[i-1] {
			out = append(out, v)
		}
	}
	return out
}
