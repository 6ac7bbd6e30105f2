package faults

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	"mesh.dev/internal/envelope"
	"mesh.dev/internal/identity"
	"mesh.dev/internal/names"
	"mesh.dev/internal/natsx"
	composerv1 "mesh.dev/proto/mesh/composer/v1"
	nodeenginev1 "mesh.dev/proto/mesh/nodeengine/v1"
	typev1 "mesh.dev/proto/mesh/type/v1"
	"mesh.dev/services/catalog/publish"
	"mesh.dev/tests/internal/procmesh"
)

// Modules every node runs (all AUTO: every move goes through without an
// approval): a per-node template, a file over 64 KiB (the object store), a
// binary artifact, and the one scenarios change.
var Modules = []string{"ca-bundle", "motd", "node-exporter", "sshd"}

// ConvergeBound is how soon after a fault is healed the fleet must have
// converged (invariant 4). Convergence takes a few seconds on an idle
// machine; the bound leaves room for CI's two shared cores and for the
// engines' reconnect backoff (up to a second here).
const ConvergeBound = 90 * time.Second

// Expect is the fingerprint every node must run, by module.
type Expect map[string]string

func publishOptions(module string) publish.Options {
	return publish.Options{NoGit: true, Repository: "https://git.example/mesh.git", Path: "examples/modules/" + module}
}

func moduleDir(module string) string {
	root, err := procmesh.RepoRoot()
	if err != nil {
		panic(err)
	}
	return filepath.Join(root, "examples", "modules", module)
}

// PublishAll publishes every module of Modules as the builder and returns
// their fingerprints.
func (m *Mesh) PublishAll() Expect {
	out := Expect{}
	for _, mod := range Modules {
		out[mod] = m.publish(mod, moduleDir(mod))
	}
	return out
}

func (m *Mesh) publish(module, dir string) string {
	m.t.Helper()
	var fp string
	m.Eventually("publish "+module, time.Minute, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		res, err := publish.Dir(ctx, m.catalogClient, dir, publishOptions(module))
		if err != nil {
			return err
		}
		fp = res.Fingerprint
		return nil
	})
	return fp
}

// PublishMotd publishes a new version of motd whose file says tag, and
// returns its fingerprint.
func (m *Mesh) PublishMotd(tag string) string {
	m.t.Helper()
	dst := filepath.Join(m.t.TempDir(), "motd")
	must(m.t, os.CopyFS(dst, os.DirFS(moduleDir("motd"))))
	file := filepath.Join(dst, "files", "motd")
	b, err := os.ReadFile(file)
	must(m.t, err)
	must(m.t, os.WriteFile(file, append(b, []byte("  fault harness: "+tag+"\n")...), 0o644))
	return m.publish("motd", dst)
}

// NodeSpec is the spec of a node of the harness: every module of Modules.
func NodeSpec(node string, i int) *composerv1.NodeSpec {
	params := map[string]map[string]any{
		"sshd":          {"port": 22},
		"node-exporter": {"port": 9100, "collectors": []any{"cpu", "meminfo"}},
	}
	facts, _ := structpb.NewStruct(map[string]any{"ip": fmt.Sprintf("10.0.0.%d", 10+i)})
	spec := &composerv1.NodeSpec{Node: node, Labels: map[string]string{"fleet": "faults"}, Facts: facts}
	for _, mod := range Modules {
		var p *structpb.Struct
		if params[mod] != nil {
			p, _ = structpb.NewStruct(params[mod])
		}
		spec.Modules = append(spec.Modules, &composerv1.PlacedModule{Module: mod, Params: p})
	}
	return spec
}

// Operator calls a composer replica that runs, as the operator.
func (m *Mesh) Operator(fn func(ctx context.Context, c composerv1.ComposerServiceClient) error) error {
	var last error
	for _, c := range m.Composers {
		if !c.Running() {
			continue
		}
		conn := m.dial(c.Addr, identity.RoleOperator, "admin")
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		last = fn(ctx, composerv1.NewComposerServiceClient(conn))
		cancel()
		conn.Close()
		if last == nil {
			return nil
		}
	}
	if last == nil {
		last = errors.New("no composer replica runs")
	}
	return last
}

// PutNodes puts every engine's node spec.
func (m *Mesh) PutNodes() {
	for i, e := range m.Engines {
		m.PutNode(e.Node, i)
	}
}

// PutNode puts the spec of one node.
func (m *Mesh) PutNode(node string, i int) {
	m.t.Helper()
	m.Eventually("put node "+node, time.Minute, func() error {
		return m.Operator(func(ctx context.Context, c composerv1.ComposerServiceClient) error {
			_, err := c.PutNode(ctx, &composerv1.PutNodeRequest{Spec: NodeSpec(node, i)})
			return err
		})
	})
}

// Eventually retries fn until it succeeds, failing the test after d.
func (m *Mesh) Eventually(what string, d time.Duration, fn func() error) {
	m.t.Helper()
	deadline := time.Now().Add(d)
	for {
		err := fn()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			m.t.Fatalf("%s: not within %s: %v", what, d, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// Assignment reads a node's assignment from JetStream.
func (m *Mesh) Assignment(ctx context.Context, node string) (*composerv1.Assignment, uint64, error) {
	kv, err := m.JS.KeyValue(ctx, natsx.BucketAssignments)
	if err != nil {
		return nil, 0, err
	}
	e, err := kv.Get(ctx, node)
	if err != nil {
		return nil, 0, err
	}
	a := &composerv1.Assignment{}
	if err := proto.Unmarshal(e.Value(), a); err != nil {
		return nil, e.Revision(), err
	}
	return a, e.Revision(), nil
}

// EngineStatus asks an engine's admin API.
func (e *Engine) Status(ctx context.Context) (*nodeenginev1.GetStatusResponse, error) {
	return e.admin.GetStatus(ctx, &nodeenginev1.GetStatusRequest{})
}

// Converged says why the fleet (the nodes given, every engine's when none)
// is not converged on expect, or nil: each node's assignment wants every
// module of expect at its fingerprint, and its engine applied exactly that
// manifest and every composition it names, holds nothing, and is not stale.
func (m *Mesh) Converged(expect Expect, nodes ...string) error {
	if len(nodes) == 0 {
		for _, e := range m.Engines {
			nodes = append(nodes, e.Node)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, node := range nodes {
		a, _, err := m.Assignment(ctx, node)
		if err != nil {
			return fmt.Errorf("node %s: assignment: %w", node, err)
		}
		wants := map[string]string{}
		for _, w := range a.GetWants() {
			wants[w.GetModule()] = w.GetCompositionDigest()
			if fp, ok := expect[w.GetModule()]; ok && w.GetFingerprint() != fp {
				return fmt.Errorf("node %s wants %s at %s, not %s", node, w.GetModule(), w.GetFingerprint(), fp)
			}
		}
		for mod := range expect {
			if _, ok := wants[mod]; !ok {
				return fmt.Errorf("node %s has no want of %s (holds %v)", node, mod, a.GetHolds())
			}
		}
		st, err := m.Engine(node).Status(ctx)
		if err != nil {
			return fmt.Errorf("node %s: engine status: %w", node, err)
		}
		switch {
		case st.GetApplied().GetDigest() != a.GetManifestDigest():
			return fmt.Errorf("node %s applied manifest r%d %s, its assignment is r%d %s", node,
				st.GetApplied().GetRevision(), st.GetApplied().GetDigest(), a.GetManifestRevision(), a.GetManifestDigest())
		case st.GetStale() != "":
			return fmt.Errorf("node %s is stale: %s", node, st.GetStale())
		case len(st.GetHolds()) > 0:
			return fmt.Errorf("node %s holds %s: %s", node, st.GetHolds()[0].GetModule(), st.GetHolds()[0].GetWords())
		}
		applied := map[string]string{}
		for _, h := range st.GetHaves() {
			applied[h.GetModule()] = h.GetApplied().GetDigest()
		}
		for mod, d := range wants {
			if applied[mod] != d {
				return fmt.Errorf("node %s module %s: applied %s, wanted %s", node, mod, applied[mod], d)
			}
		}
	}
	return nil
}

// WaitConverged waits until the fleet converged on expect, failing the
// test (invariant 4) when it takes more than ConvergeBound; it returns how
// long it took.
func (m *Mesh) WaitConverged(what string, expect Expect, nodes ...string) time.Duration {
	m.t.Helper()
	start := time.Now()
	var last error
	for {
		if last = m.Converged(expect, nodes...); last == nil {
			return time.Since(start)
		}
		if time.Since(start) > ConvergeBound {
			m.t.Fatalf("invariant 4: %s: the fleet did not converge within %s of healing: %v\n%s", what, ConvergeBound, last, m.whyNot())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// whyNot is what the composer's status says of every node, for a failure.
func (m *Mesh) whyNot() string {
	var b strings.Builder
	_ = m.Operator(func(ctx context.Context, c composerv1.ComposerServiceClient) error {
		resp, err := c.ListStatus(ctx, &composerv1.ListStatusRequest{})
		if err != nil {
			return err
		}
		for _, st := range resp.GetStatuses() {
			fmt.Fprintf(&b, "  %s: manifest r%d applied r%d converged %v error %q holds %v\n", st.GetNode(), st.GetManifestRevision(),
				st.GetAppliedRevision(), st.GetConverged(), st.GetLastError(), st.GetHolds())
			for _, ms := range st.GetModules() {
				if ms.GetAppliedDigest() != ms.GetWantedDigest() {
					fmt.Fprintf(&b, "    %s: wanted %s applied %s attempt %v %s\n", ms.GetModule(), ms.GetWantedDigest(), ms.GetAppliedDigest(),
						ms.GetState(), ms.GetReason())
				}
			}
		}
		return nil
	})
	return b.String()
}

// CorruptComposition writes bytes that do not decode straight into a
// composition key, bypassing every service (a disk, an operator's nats
// CLI), and returns the key.
func (m *Mesh) CorruptComposition(ctx context.Context, key string) error {
	kv, err := m.JS.KeyValue(ctx, natsx.BucketCompositions)
	if err != nil {
		return err
	}
	m.Rec.Inject(key)
	_, err = kv.Put(ctx, key, bytes.Repeat([]byte{0xff, 0x00, 0x13}, 100))
	return err
}

// CorruptObject replaces an object of the composer's object store with
// other bytes under the same name (its digest): JetStream's own checksum
// of the new bytes is right, so only mesh's digest can catch it.
func (m *Mesh) CorruptObject(ctx context.Context, digest string) error {
	os, err := m.JS.ObjectStore(ctx, natsx.ObjectStoreObjects)
	if err != nil {
		return err
	}
	m.Rec.Inject(digest)
	_, err = os.PutBytes(ctx, digest, bytes.Repeat([]byte("not the bytes of the digest "), 3000))
	return err
}

// ObjectHeld reports whether the object store holds an object's right
// bytes (the name is the sha256 of the content).
func (m *Mesh) ObjectHeld(ctx context.Context, digest string) (bool, error) {
	os, err := m.JS.ObjectStore(ctx, natsx.ObjectStoreObjects)
	if err != nil {
		return false, err
	}
	b, err := os.GetBytes(ctx, digest)
	if errors.Is(err, jetstream.ErrObjectNotFound) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	return sha256Digest(b) == digest, nil
}

// CompositionHeld reports whether a composition key holds a value that
// decodes (the composer repaired it).
func (m *Mesh) CompositionHeld(ctx context.Context, key, digest string) (bool, error) {
	kv, err := m.JS.KeyValue(ctx, natsx.BucketCompositions)
	if err != nil {
		return false, err
	}
	e, err := kv.Get(ctx, key)
	if err != nil {
		return false, err
	}
	env, _, err := decodeComposition(e)
	return err == nil && env != nil && (digest == "" || digestOf(env) == digest), nil
}

func decodeComposition(e jetstream.KeyValueEntry) (*typev1.Envelope, *typev1.Composition, error) {
	env := &typev1.Envelope{}
	if err := proto.Unmarshal(e.Value(), env); err != nil {
		return nil, nil, err
	}
	c := &typev1.Composition{}
	if err := proto.Unmarshal(env.GetPayload(), c); err != nil {
		return nil, nil, err
	}
	return env, c, nil
}

func digestOf(env *typev1.Envelope) string { return envelope.Digest(env) }

func sha256Digest(b []byte) string { return names.Digest(b) }
