package apply

import (
	"context"
	"path/filepath"
	"testing"

	"mesh.dev/internal/names"
	typev1 "mesh.dev/proto/mesh/type/v1"
	"mesh.dev/services/nodeengine/internal/state"
)

// filledComposition is the node's own composition with filled paths.
func filledComposition(res []*typev1.Resource, filled []string, adoption ...string) *Composition {
	c := nodeComposition(res, adoption...)
	c.Comp.Filled = filled
	return c
}

// TestFilledFileNotReplacedByAnotherType: a filled file is the
// provisioner's (its ledger record: not created, not adopted); a later
// version declaring its path a directory or a symlink, or a path under it
// (which makes it a directory), once removed it and kept nothing to put
// back. Prepare refuses the type change.
func TestFilledFileNotReplacedByAnotherType(t *testing.T) {
	for _, tt := range []struct {
		name string
		// present: the provisioner has written the file.
		present bool
		second  []*typev1.Resource
		words   string
	}{
		{"declared a directory", true, []*typev1.Resource{dirRes("node:secret", "/srv/secret", 0o755)},
			"node:secret: /srv/secret is the provisioner's (filled) file, not the engine's to replace with a dir"},
		{"declared a symlink", true, []*typev1.Resource{linkRes("node:secret", "/srv/secret", "other")},
			"node:secret: /srv/secret is the provisioner's (filled) file, not the engine's to replace with a symlink"},
		{"a parent of a declared path, not yet written", false, []*typev1.Resource{fileRes("node:x", "/srv/secret/x", "x\n")},
			"node:x: /srv/secret is the provisioner's (filled) file, not the engine's to replace with a dir"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			a, root := testApplier(t)
			secret := filepath.Join(root, "srv", "secret")
			if tt.present {
				writeFile(t, secret, "provisioned\n")
			}
			r := &typev1.Resource{Id: "node:secret", Type: typev1.ResourceType_RESOURCE_TYPE_FILE, Path: "/srv/secret", Mode: 0o600}
			ledger, _ := applyPlan(t, a, map[string]*state.LedgerRecord{}, true, filledComposition([]*typev1.Resource{r}, []string{"/srv/secret"}))
			if rec := ledger["/srv/secret"]; rec == nil || !rec.Filled || rec.Created {
				t.Fatalf("the filled file's record: %+v", rec)
			}
			before := tree(t, root)
			prep := a.Prepare(Plan{Compositions: []*Composition{nodeComposition(tt.second)}, Ledger: ledger, Removals: true})
			if len(prep.Failures) == 0 {
				// Not refused: show what the apply does (to a file the
				// provisioner writes meanwhile, when it had not yet).
				if !tt.present {
					writeFile(t, secret, "provisioned late\n")
					before = tree(t, root)
				}
				a.Stage(context.Background(), prep, noFetch{})
				a.Execute(context.Background(), prep, ledger, memStore{}, Meta{})
			}
			sameTree(t, "the apply", before, tree(t, root))
			wantFailure(t, "prepare", prep.Failures[names.NodeModule], codeUnmanaged, tt.words)
		})
	}
}

// TestFilledFileTakenOverOnlyByAdoption: a filled file declared with
// content by a later version once became the engine's (created): it was
// overwritten with no copy kept and deleted when the resource left. It is
// now taken over as any path the engine did not make: by adoption, its
// prior content kept and put back; without adoption it is refused.
func TestFilledFileTakenOverOnlyByAdoption(t *testing.T) {
	filled := &typev1.Resource{Id: "node:passwd", Type: typev1.ResourceType_RESOURCE_TYPE_FILE, Path: "/srv/passwd", Mode: 0o644}
	hostile := fileRes("node:passwd", "/srv/passwd", "hostile\n")
	const words = "node:passwd: /srv/passwd is filled by the provisioner, not the engine's to write: declaring its content needs adoption"
	for _, present := range []bool{true, false} {
		name := map[bool]string{true: "refused", false: "refused before the provisioner wrote it"}[present]
		t.Run(name, func(t *testing.T) {
			a, root := testApplier(t)
			if present {
				writeFile(t, filepath.Join(root, "srv", "passwd"), "pre-existing\n")
			}
			ledger, _ := applyPlan(t, a, map[string]*state.LedgerRecord{}, true, filledComposition([]*typev1.Resource{filled}, []string{"/srv/passwd"}))
			before := tree(t, root)
			prep := a.Prepare(Plan{Compositions: []*Composition{nodeComposition([]*typev1.Resource{hostile})}, Ledger: ledger, Removals: true})
			if len(prep.Failures) == 0 {
				// Not refused: show what the apply, and the resource's
				// leaving, do.
				a.Stage(context.Background(), prep, noFetch{})
				res, _ := a.Execute(context.Background(), prep, ledger, memStore{}, Meta{})
				applyPlan(t, a, res.Ledger, true, nodeComposition(nil))
			}
			sameTree(t, "the apply", before, tree(t, root))
			wantFailure(t, "prepare", prep.Failures[names.NodeModule], codeUnmanaged, words)
		})
	}
	t.Run("adopted", func(t *testing.T) {
		a, root := testApplier(t)
		p := filepath.Join(root, "srv", "passwd")
		writeFile(t, p, "pre-existing\n")
		ledger, _ := applyPlan(t, a, map[string]*state.LedgerRecord{}, true, filledComposition([]*typev1.Resource{filled}, []string{"/srv/passwd"}))
		ledger, res := applyPlan(t, a, ledger, true, nodeComposition([]*typev1.Resource{hostile}, "/srv/passwd"))
		if len(res.Failed) > 0 {
			t.Fatalf("execute: %v", res.Failed)
		}
		rec := ledger["/srv/passwd"]
		if rec == nil || rec.Created || rec.Filled || rec.Adopted == nil || rec.Adopted.Digest != names.Digest([]byte("pre-existing\n")) {
			t.Fatalf("the adopted file's record: %+v (prior %+v)", rec, rec.Adopted)
		}
		if got := readFile(t, p); got != "hostile\n" {
			t.Fatalf("/srv/passwd holds %q", got)
		}
		applyPlan(t, a, ledger, true, nodeComposition(nil))
		if got := readFile(t, p); got != "pre-existing\n" {
			t.Errorf("after the resource left /srv/passwd holds %q, want its prior content back", got)
		}
	})
}
