package apply

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	composerv1 "mesh.dev/proto/mesh/composer/v1"
	typev1 "mesh.dev/proto/mesh/type/v1"

	"mesh.dev/internal/testutil"
)

func fileRes(id, p, content string) *typev1.Resource {
	return &typev1.Resource{Id: id, Type: typev1.ResourceType_RESOURCE_TYPE_FILE, Path: p, Mode: 0o644,
		Content: &typev1.Resource_Inline{Inline: []byte(content)}}
}

func dirRes(id, p string, mode uint32) *typev1.Resource {
	return &typev1.Resource{Id: id, Type: typev1.ResourceType_RESOURCE_TYPE_DIRECTORY, Path: p, Mode: mode}
}

func linkRes(id, p, target string) *typev1.Resource {
	return &typev1.Resource{Id: id, Type: typev1.ResourceType_RESOURCE_TYPE_SYMLINK, Path: p, Target: target}
}

// tree describes every entry under dir (not following symlinks): type,
// mode, owner, and a file's content digest or a symlink's target.
func tree(t *testing.T, dir string) map[string]string {
	t.Helper()
	return treeSkipping(t, dir, "")
}

// treeSkipping is tree leaving out the directory skip ("": none).
func treeSkipping(t *testing.T, dir, skip string) map[string]string {
	t.Helper()
	return testutil.Tree(t, dir, skip)
}

// sameTree fails when two trees differ, naming each difference.
func sameTree(t *testing.T, what string, before, after map[string]string) {
	t.Helper()
	for p, d := range before {
		if after[p] != d {
			t.Errorf("%s changed %s: %q became %q", what, p, d, after[p])
		}
	}
	for p, d := range after {
		if _, ok := before[p]; !ok {
			t.Errorf("%s made %s (%s)", what, p, d)
		}
	}
}

// wantFailure fails unless f has the code and says every one of words.
func wantFailure(t *testing.T, what string, f *Failure, code composerv1.ReasonCode, words ...string) {
	t.Helper()
	if f == nil {
		t.Fatalf("%s: no failure, want %v saying %q", what, code, words)
	}
	if f.Code != code {
		t.Errorf("%s: code %v, want %v (reason %q)", what, f.Code, code, f.Reason)
	}
	for _, w := range words {
		if !strings.Contains(f.Reason, w) {
			t.Errorf("%s: reason %q does not say %q", what, f.Reason, w)
		}
	}
}

// prepareStaged prepares and stages a plan that must have no failures.
func prepareStaged(t *testing.T, a *Applier, plan Plan) *Prepared {
	t.Helper()
	prep := a.Prepare(plan)
	if len(prep.Failures) > 0 {
		t.Fatalf("prepare: %v", prep.Failures)
	}
	if f := a.Stage(context.Background(), prep, noFetch{}); len(f) > 0 {
		t.Fatalf("stage: %v", f)
	}
	return prep
}

func writeFile(t *testing.T, p, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
}

func readFile(t *testing.T, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
