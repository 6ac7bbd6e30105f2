package app_test

import (
	"os"
	"testing"

	"mesh.dev/internal/names"
	composerv1 "mesh.dev/proto/mesh/composer/v1"
	typev1 "mesh.dev/proto/mesh/type/v1"
)

func artifactFile(module, name, p, ref string) *typev1.Resource {
	return &typev1.Resource{Id: module + ":" + name, Module: module, Type: typev1.ResourceType_RESOURCE_TYPE_FILE, Path: p, Mode: 0o755,
		Owner: "root", Group: "root", Content: &typev1.Resource_Artifact{Artifact: ref}}
}

// TestArtifactsFromTheBuildRecord writes an artifact through the module's
// build record (DESIGN.md §7: the entry's declarations with the want's
// parts), downloaded by its digest; a part the entry does not declare is
// never fetched, even when the want gives its digest.
func TestArtifactsFromTheBuildRecord(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	r := w.start(t)
	bin := []byte("#!/bin/sh\necho web\n")
	extra := []byte("not declared by the entry")
	w.catalog.mu.Lock()
	w.catalog.artifacts[names.Digest(bin)] = bin
	w.catalog.artifacts[names.Digest(extra)] = extra
	w.catalog.mu.Unlock()
	fp := w.release("web", "1.0.0", nil, "binary:web")
	binPart := &typev1.Artifact{Ref: "binary:web", Digest: names.Digest(bin), Size: int64(len(bin))}

	c := moduleComp("web", fp, artifactFile("web", "bin", "/opt/app/web", "binary:web"))
	c.parts = []*typev1.Artifact{binPart}
	m := w.publish(manifestOpts{}, c, nodeComp())
	r.waitApplied(t, m)
	if got := readFile(t, w.path("/opt/app/web")); got != string(bin) {
		t.Fatalf("artifact written as %q", got)
	}

	c2 := moduleComp("web", fp, artifactFile("web", "bin", "/opt/app/web", "binary:web"), artifactFile("web", "extra", "/opt/app/extra", "binary:extra"))
	c2.parts = []*typev1.Artifact{{Ref: "binary:extra", Digest: names.Digest(extra), Size: int64(len(extra))}, binPart}
	w.publish(manifestOpts{}, c2, nodeComp())
	a := r.waitAttempt(t, "web", stateFailed, composerv1.ReasonCode_REASON_CODE_PART_MISSING)
	if want := "web:extra: artifact binary:extra is not in the build record (the entry's artifacts with the want's digests)"; a.GetReason() != want {
		t.Errorf("reason %q, want %q", a.GetReason(), want)
	}
	if _, err := os.Lstat(w.path("/opt/app/extra")); !os.IsNotExist(err) {
		t.Errorf("the undeclared artifact was written: %v", err)
	}
	w.catalog.mu.Lock()
	defer w.catalog.mu.Unlock()
	if n := w.catalog.downloads[names.Digest(extra)]; n != 0 {
		t.Errorf("the undeclared artifact was downloaded %d times", n)
	}
}
