package apply

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path"
	"path/filepath"
	"runtime/debug"
	"slices"
	"sort"
	"strings"
	"syscall"
	"testing"

	"mesh.dev/internal/lint"
	"mesh.dev/internal/names"
	"mesh.dev/internal/testutil"
	typev1 "mesh.dev/proto/mesh/type/v1"
	"mesh.dev/services/nodeengine/internal/state"
)

// fuzzPrefixes are the allowed prefixes of the fuzzed applier.
var fuzzPrefixes = []string{"/srv", "/etc/app"}

// fuzzDisk is a temporary machine for one fuzz input: root (the engine's
// root, holding the prefixes and things the engine must not touch),
// outside (a sibling of root that symlinks planted in the prefixes point
// at) and the state dir.
type fuzzDisk struct {
	dir, root, outside, state string
	// adopted is the host path of the path the node's own composition
	// adopts: the engine may take it over.
	adopted string
}

// newFuzzDisk plants, before the applier opens its roots: an absolute
// symlink out of root (srv/abs), a relative one that climbs out
// (srv/rel), a relative one that stays (srv/in -> sub), a FIFO, a file the
// engine does not manage, and root/etc/passwd outside the prefixes.
func newFuzzDisk(t *testing.T) *fuzzDisk {
	d := &fuzzDisk{dir: t.TempDir()}
	d.root, d.outside, d.state = filepath.Join(d.dir, "root"), filepath.Join(d.dir, "outside"), filepath.Join(d.dir, "state")
	for _, p := range []string{d.outside, filepath.Join(d.root, "srv", "sub"), filepath.Join(d.root, "etc")} {
		if err := os.MkdirAll(p, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	files := map[string]string{
		filepath.Join(d.outside, "secret"):               "outside secret\n",
		filepath.Join(d.root, "etc", "passwd"):           "root:x:0:0::/root:/bin/sh\n",
		filepath.Join(d.root, "srv", "sub", "unmanaged"): "not the engine's\n",
	}
	for p, c := range files {
		if err := os.WriteFile(p, []byte(c), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	links := map[string]string{
		filepath.Join(d.root, "srv", "abs"): d.outside,
		filepath.Join(d.root, "srv", "rel"): "../../outside",
		filepath.Join(d.root, "srv", "in"):  "sub",
		filepath.Join(d.root, "srv", "up"):  "../etc",
	}
	for p, target := range links {
		if err := os.Symlink(target, p); err != nil {
			t.Fatal(err)
		}
	}
	if err := syscall.Mkfifo(filepath.Join(d.root, "srv", "fifo"), 0o644); err != nil {
		t.Fatal(err)
	}
	return d
}

// snapshot describes every entry under dir (not following symlinks),
// leaving out the state dir.
func (d *fuzzDisk) snapshot(t *testing.T) map[string]string {
	return treeSkipping(t, d.dir, d.state)
}

// managed reports whether a host path lies in a prefix dir of root, where
// the engine may write.
func (d *fuzzDisk) managed(p string) bool {
	for _, pr := range fuzzPrefixes {
		dir := filepath.Join(d.root, filepath.FromSlash(pr))
		if p == dir || strings.HasPrefix(p, dir+"/") {
			return true
		}
	}
	return false
}

// planted are the entries newFuzzDisk made inside the prefixes: unmanaged,
// so no apply may change them.
func (d *fuzzDisk) planted(p string) bool {
	if p == d.adopted {
		return false
	}
	for _, name := range []string{"abs", "rel", "in", "up", "fifo", "sub/unmanaged"} {
		if p == filepath.Join(d.root, "srv", filepath.FromSlash(name)) {
			return true
		}
	}
	return false
}

// checkChanges fails when anything outside the prefixes, or planted in
// them, changed between two snapshots.
func (d *fuzzDisk) checkChanges(t *testing.T, what string, before, after map[string]string) {
	t.Helper()
	for p, desc := range before {
		if after[p] != desc && (!d.managed(p) || d.planted(p)) {
			t.Fatalf("%s changed %s: %q became %q", what, p, desc, after[p])
		}
	}
	for p, desc := range after {
		if _, ok := before[p]; !ok && !d.managed(p) {
			t.Fatalf("%s created %s (%s) outside the prefixes", what, p, desc)
		}
	}
}

type memStore struct{}

func (memStore) PutJournal(*state.Journal) error { return nil }
func (memStore) Commit(*state.Commit) error      { return nil }

// fuzzResource builds a resource of the fuzzed path, type, target and mode.
func fuzzResource(name, p string, typ uint8, target string, mode uint32, content []byte) *typev1.Resource {
	r := &typev1.Resource{Id: "m:" + name, Path: p, Type: typev1.ResourceType(typ % 4), Mode: mode & 0o7777}
	switch r.GetType() {
	case typev1.ResourceType_RESOURCE_TYPE_FILE:
		r.Content = &typev1.Resource_Inline{Inline: content}
	case typev1.ResourceType_RESOURCE_TYPE_SYMLINK:
		r.Target = target
	}
	return r
}

// FuzzApply sends arbitrary paths, symlink targets and modes through the
// engine's path checks, Prepare, Stage and Execute on a temporary root
// holding hostile symlinks (absolute and climbing out of root), a FIFO and
// files the engine does not manage: CheckPath and CheckTarget only accept
// what lies in the prefixes; Prepare writes nothing; and whatever is
// applied — a first manifest and then a second that removes what the first
// declared — nothing outside the prefixes, nor anything planted in them,
// is ever changed or created.
func FuzzApply(f *testing.F) {
	seeds := testutil.NewFuzzSeeds(f)
	type res struct {
		p      string
		typ    uint8
		target string
	}
	for _, s := range []struct {
		a, b, c res
		mode    uint32
		content []byte
		adopt   string
	}{
		{res{"/srv/app", 2, ""}, res{"/srv/app/conf", 1, ""}, res{"/etc/app/link", 3, "/srv/app/conf"}, 0o640, []byte("port 22\n"), ""},
		{res{"/srv/abs/secret", 1, ""}, res{"/srv/rel/new", 1, ""}, res{"/srv/in/x", 1, ""}, 0o644, []byte("pwned"), ""},
		{res{"/srv/../etc/passwd", 1, ""}, res{"/etc/passwd", 1, ""}, res{"/srv/up/passwd", 1, ""}, 0o644, []byte("pwned"), ""},
		{res{"/srv/l1", 3, "../../outside/secret"}, res{"/srv/l2", 3, "/etc/passwd"}, res{"/srv/l3", 3, ".."}, 0, nil, ""},
		{res{"/srv/l4", 3, "sub/../../.."}, res{"/etc/app/l5", 3, "../../srv"}, res{"/srv/l6", 3, "/srv/./abs"}, 0, nil, ""},
		{res{"/srv/fifo", 1, ""}, res{"/srv/sub/unmanaged", 1, ""}, res{"/srv/abs", 2, ""}, 0o7777, []byte("x"), ""},
		{res{"/srv//x", 1, ""}, res{"/srv/./y", 1, ""}, res{"srv/z", 1, ""}, 0o644, []byte("x"), ""},
		{res{"/srv/sub/unmanaged", 1, ""}, res{"/srv/new", 2, ""}, res{"/srv/new/f", 1, ""}, 0o600, []byte("adopted"), "/srv/sub/unmanaged"},
		{res{"/srv/d", 2, ""}, res{"/srv/d/l", 3, "/srv/abs"}, res{"/srv/d/l/f", 1, ""}, 0o755, []byte("x"), ""},
		{res{"/", 2, ""}, res{"/srv", 2, ""}, res{"/etc/app", 3, "/srv"}, 0o755, nil, "/etc/passwd"},
	} {
		seeds.Add(s.a.p, s.a.typ, s.a.target, s.b.p, s.b.typ, s.b.target, s.c.p, s.c.typ, s.c.target, s.mode, s.content, s.adopt)
	}
	f.Fuzz(func(t *testing.T, pa string, ta uint8, xa string, pb string, tb uint8, xb string, pc string, tc uint8, xc string, mode uint32, content []byte, adopt string) {
		// A panic fails this input, not the whole test binary.
		defer func() {
			if r := recover(); r != nil {
				t.Fatalf("panic: %v\n%s", r, debug.Stack())
			}
		}()
		d := newFuzzDisk(t)
		a, err := New(Config{Root: d.root, Prefixes: fuzzPrefixes, StateDir: d.state, Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			t.Fatal(err)
		}
		defer a.Close()
		start := d.snapshot(t)
		if adopt != "" {
			d.adopted = filepath.Join(d.root, filepath.FromSlash(adopt))
		}

		ra := fuzzResource("a", pa, ta, xa, mode, content)
		rb := fuzzResource("b", pb, tb, xb, mode, content)
		rc := fuzzResource("c", pc, tc, xc, mode, content)
		for _, r := range []*typev1.Resource{ra, rb, rc} {
			checkPathVerdicts(t, a, r)
		}

		ledger := map[string]*state.LedgerRecord{}
		for round, rs := range [][]*typev1.Resource{{ra, rb}, {rb, rc}} {
			comp := &typev1.Composition{Node: "ace", Module: names.NodeModule, Resources: slices.Clone(rs)}
			sort.Slice(comp.Resources, func(i, j int) bool { return comp.Resources[i].GetPath() < comp.Resources[j].GetPath() })
			if round == 0 && adopt != "" {
				comp.Adoption = []string{adopt}
			}
			// What the engine checks of a verified composition before it
			// plans anything (engine.composition): each path, then lint.
			if engineRefuses(a, comp) {
				continue
			}
			plan := Plan{Compositions: []*Composition{{Module: names.NodeModule, Key: "ace.node", Comp: comp, Env: &typev1.Envelope{}}},
				Ledger: ledger, Removals: round == 1}
			before := d.snapshot(t)
			prep := a.Prepare(plan)
			if after := d.snapshot(t); len(after) != len(before) {
				t.Fatalf("round %d: Prepare changed the disk", round)
			} else {
				d.checkChanges(t, "Prepare", before, after)
				for p, desc := range before {
					if after[p] != desc {
						t.Fatalf("round %d: Prepare changed %s", round, p)
					}
				}
			}
			if len(prep.Failures) > 0 {
				continue
			}
			for _, op := range prep.Ops() {
				if !a.Within(op.Path) || hasDotDot(op.Path) {
					t.Fatalf("round %d: planned %s of %s, outside the prefixes", round, op.Kind, op.Path)
				}
				if op.Kind == state.OpSymlink {
					if f := a.CheckTarget(op.Path, op.Record.Digest); f != nil {
						t.Fatalf("round %d: planned symlink %s -> %s: %v", round, op.Path, op.Record.Digest, f)
					}
				}
			}
			if fails := a.Stage(context.Background(), prep, noFetch{}); len(fails) > 0 {
				continue
			}
			res, err := a.Execute(context.Background(), prep, ledger, memStore{}, Meta{})
			if err != nil {
				t.Fatalf("round %d: Execute: %v", round, err)
			}
			ledger = res.Ledger
			d.checkChanges(t, fmt.Sprintf("round %d", round), before, d.snapshot(t))
		}
		d.checkChanges(t, "the applies", start, d.snapshot(t))
	})
}

// engineRefuses reports whether the engine refuses a composition before
// planning: a path CheckPath refuses, or a composition that does not lint.
func engineRefuses(a *Applier, c *typev1.Composition) bool {
	for _, r := range c.GetResources() {
		if a.CheckPath(r.GetPath()) != nil {
			return true
		}
	}
	return lint.CheckComposition(c) != nil
}

// checkPathVerdicts checks CheckPath and CheckTarget against what they
// promise: an accepted path is within a prefix without "..", an accepted
// symlink target resolves within a prefix.
func checkPathVerdicts(t *testing.T, a *Applier, r *typev1.Resource) {
	t.Helper()
	if f := a.CheckPath(r.GetPath()); f == nil {
		if hasDotDot(r.GetPath()) || !a.Within(r.GetPath()) {
			t.Fatalf("CheckPath accepted %q", r.GetPath())
		}
	} else if f.Code != codePathEscape && f.Code != codeOutside {
		t.Fatalf("CheckPath(%q) = %v with code %v", r.GetPath(), f, f.Code)
	}
	if r.GetType() != typev1.ResourceType_RESOURCE_TYPE_SYMLINK {
		return
	}
	if f := a.CheckTarget(r.GetPath(), r.GetTarget()); f == nil {
		resolved := r.GetTarget()
		if !strings.HasPrefix(resolved, "/") {
			resolved = path.Join(path.Dir(r.GetPath()), resolved)
		}
		if !a.Within(path.Clean(resolved)) {
			t.Fatalf("CheckTarget accepted %q -> %q, which resolves to %q", r.GetPath(), r.GetTarget(), path.Clean(resolved))
		}
	}
}
