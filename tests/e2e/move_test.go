package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"

	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"

	"mesh.dev/cmd/meshctl/onebox"
	"mesh.dev/internal/envelope"
	"mesh.dev/internal/natsx"
	composerv1 "mesh.dev/proto/mesh/composer/v1"
	nodeenginev1 "mesh.dev/proto/mesh/nodeengine/v1"
	typev1 "mesh.dev/proto/mesh/type/v1"
)

// TestModuleMovedIsRelabelled moves a module's file between the module's
// own composition and the node's own, and back (DESIGN.md §5.1 rule 3, §7
// Apply): the node spec unplaces motd and declares /etc/motd as its own
// resource motd:motd (the module then has no fingerprint on the node), later
// the spec places motd again. The file is relabelled each time, never
// removed and recreated — a hard link taken before the moves still shares
// its inode — and no manifest of the run ever declares a path twice.
func TestModuleMovedIsRelabelled(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	w := startMesh(t, 3)
	audit := w.auditManifests(ctx)
	w.converge(ctx)

	const node = "dev-2"
	motd := filepath.Join(w.engine(node).Root, "etc", "motd")
	content := readFile(t, motd)
	marker := filepath.Join(w.dir, "motd-marker")
	if err := os.Link(motd, marker); err != nil {
		t.Fatal(err)
	}
	ino0, _ := inode(t, motd)
	sameFile := func(step string) {
		t.Helper()
		ino, nlink := inode(t, motd)
		if ino != ino0 || nlink != 2 {
			t.Log(audit.describe(node, "/etc/motd"))
			t.Fatalf("%s: /etc/motd is inode %d with %d links, was inode %d linked to %s: it was removed and recreated, not relabelled", step, ino, nlink, ino0, marker)
		}
		if got := readFile(t, motd); got != content {
			t.Fatalf("%s: /etc/motd is %q, was %q", step, got, content)
		}
	}

	// To the node's own: motd unplaced, its file declared by the spec.
	own := onebox.DevSpec(2)
	own.Modules = slices.DeleteFunc(own.Modules, func(p *composerv1.PlacedModule) bool { return p.GetModule() == "motd" })
	own.Resources = append(own.Resources, &typev1.Resource{
		Id: "motd:motd", Module: "motd", Type: typev1.ResourceType_RESOURCE_TYPE_FILE, Path: "/etc/motd",
		Mode: 0o644, Owner: "root", Group: "root", Content: &typev1.Resource_Inline{Inline: []byte(content)},
	})
	if _, err := w.composer.PutNode(ctx, &composerv1.PutNodeRequest{Spec: own}); err != nil {
		t.Fatal(err)
	}
	w.waitConverged(ctx, func(n string, s *nodeenginev1.GetStatusResponse) (bool, string) {
		if n != node {
			return true, ""
		}
		if wantOf(s.GetWants(), "motd") != nil || haveOf(s, "motd") != nil {
			return false, "motd still wanted or applied as a module"
		}
		return true, ""
	})
	sameFile("moved to the node's own composition")
	if got := audit.moved(node); !slices.Contains(got, "motd") {
		t.Errorf("no assignment of %s lists motd as moved (moved: %v)", node, got)
	}

	// Back to the module: motd placed again, the spec's resource gone.
	if _, err := w.composer.PutNode(ctx, &composerv1.PutNodeRequest{Spec: onebox.DevSpec(2)}); err != nil {
		t.Fatal(err)
	}
	w.waitConverged(ctx, func(n string, s *nodeenginev1.GetStatusResponse) (bool, string) {
		if n != node {
			return true, ""
		}
		if haveOf(s, "motd").GetApplied() == nil {
			return false, "motd not applied as a module"
		}
		return true, ""
	})
	sameFile("moved back to motd's composition")

	for _, err := range audit.check() {
		t.Error(err)
	}
	if n := audit.count(node); n < 3 {
		t.Errorf("the audit saw %d assignments of %s, expected at least 3", n, node)
	}
}

// manifestAudit collects every assignment and composition the composer
// writes, to check each manifest afterwards: every want's composition was
// written with the want's digest, and no path is declared by two
// compositions of one manifest.
type manifestAudit struct {
	mu           sync.Mutex
	assignments  []*composerv1.Assignment
	compositions map[string]*typev1.Composition // by digest
	errs         []error
}

// auditManifests starts watching the assignments and compositions buckets
// (before anything is written to them, so no write is missed).
func (w *world) auditManifests(ctx context.Context) *manifestAudit {
	w.t.Helper()
	a := &manifestAudit{compositions: map[string]*typev1.Composition{}}
	ctx, cancel := context.WithCancel(ctx)
	w.t.Cleanup(cancel)
	for _, bucket := range []string{natsx.BucketAssignments, natsx.BucketCompositions} {
		kv, err := w.m.JetStream.KeyValue(ctx, bucket)
		if err != nil {
			w.t.Fatalf("bucket %s: %v", bucket, err)
		}
		watch, err := kv.WatchAll(ctx, jetstream.IncludeHistory())
		if err != nil {
			w.t.Fatal(err)
		}
		go func() {
			defer watch.Stop()
			for {
				select {
				case <-ctx.Done():
					return
				case e, ok := <-watch.Updates():
					if !ok {
						return
					}
					if e != nil && e.Operation() == jetstream.KeyValuePut {
						a.take(bucket, e)
					}
				}
			}
		}()
	}
	return a
}

func (a *manifestAudit) take(bucket string, e jetstream.KeyValueEntry) {
	a.mu.Lock()
	defer a.mu.Unlock()
	switch bucket {
	case natsx.BucketAssignments:
		as := &composerv1.Assignment{}
		if err := proto.Unmarshal(e.Value(), as); err != nil {
			a.errs = append(a.errs, fmt.Errorf("assignment %s revision %d does not decode: %v", e.Key(), e.Revision(), err))
			return
		}
		a.assignments = append(a.assignments, as)
	case natsx.BucketCompositions:
		env := &typev1.Envelope{}
		c := &typev1.Composition{}
		if err := proto.Unmarshal(e.Value(), env); err != nil {
			a.errs = append(a.errs, fmt.Errorf("composition %s does not decode: %v", e.Key(), err))
			return
		}
		if err := envelope.Open(env, typev1.PayloadType_PAYLOAD_TYPE_COMPOSITION, c); err != nil {
			a.errs = append(a.errs, fmt.Errorf("composition %s does not open: %v", e.Key(), err))
			return
		}
		a.compositions[envelope.Digest(env)] = c
	}
}

// check judges every manifest seen.
func (a *manifestAudit) check() []error {
	a.mu.Lock()
	defer a.mu.Unlock()
	errs := slices.Clone(a.errs)
	for _, as := range a.assignments {
		m := &typev1.Manifest{}
		if err := envelope.Open(as.GetManifest(), typev1.PayloadType_PAYLOAD_TYPE_MANIFEST, m); err != nil {
			errs = append(errs, fmt.Errorf("%s: manifest does not open: %v", as.GetNode(), err))
			continue
		}
		declared := map[string]string{}
		for _, want := range m.GetWants() {
			c, ok := a.compositions[want.GetCompositionDigest()]
			if !ok {
				errs = append(errs, fmt.Errorf("%s manifest revision %d: composition %s (%s) was never written", as.GetNode(), m.GetRevision(), want.GetCompositionKey(), want.GetCompositionDigest()))
				continue
			}
			for _, r := range c.GetResources() {
				if other, dup := declared[r.GetPath()]; dup {
					errs = append(errs, fmt.Errorf("%s manifest revision %d declares %s twice: %s and %s", as.GetNode(), m.GetRevision(), r.GetPath(), other, r.GetId()))
				}
				declared[r.GetPath()] = r.GetId()
			}
		}
	}
	return errs
}

// describe lists the manifests of node seen, each with its wants and the
// composition declaring path.
func (a *manifestAudit) describe(node, path string) string {
	a.mu.Lock()
	defer a.mu.Unlock()
	var b strings.Builder
	for _, as := range a.assignments {
		if as.GetNode() != node {
			continue
		}
		fmt.Fprintf(&b, "manifest revision %d, moved %v, holds %v:\n", as.GetManifestRevision(), as.GetMoved(), as.GetHolds())
		for _, want := range as.GetWants() {
			c := a.compositions[want.GetCompositionDigest()]
			decl := ""
			for _, r := range c.GetResources() {
				if r.GetPath() == path {
					decl = " declares " + path + " as " + r.GetId()
				}
			}
			fmt.Fprintf(&b, "  %s %s%s\n", want.GetModule(), want.GetCompositionKey(), decl)
		}
	}
	return b.String()
}

// moved returns the modules the assignments of node listed as moved.
func (a *manifestAudit) moved(node string) []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	var out []string
	for _, as := range a.assignments {
		if as.GetNode() == node {
			out = append(out, as.GetMoved()...)
		}
	}
	sort.Strings(out)
	return slices.Compact(out)
}

// count returns how many assignments of node were seen.
func (a *manifestAudit) count(node string) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	n := 0
	for _, as := range a.assignments {
		if as.GetNode() == node {
			n++
		}
	}
	return n
}
