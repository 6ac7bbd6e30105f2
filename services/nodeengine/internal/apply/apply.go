// Package apply puts compositions on disk (DESIGN.md §7 "Apply"): one
// os.Root per allowed prefix, each resource through the longest prefix that
// contains it; refusals for paths that escape, leave the prefixes or pass
// through a symlink (at Prepare, and again when each op opens its
// directory), for special files and for existing paths the engine does not
// manage; files written through a temp file, fsync, rename
// and directory fsync; mode and owner set on a descriptor opened with
// O_NOFOLLOW; a ledger of every path the engine put there; and an intent
// journal written before disk is touched, so a crash mid-apply is finished on
// restart.
//
// An apply is three steps. Prepare reads the disk and plans the ops without
// writing anything, refusing a composition (by module) that it cannot apply
// safely. Stage fetches the content the ops need into the state dir, hashed
// while streamed and cut at the declared size. Execute journals the ops,
// runs them and commits the ledger and the applied compositions.
package apply

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"

	"mesh.dev/internal/names"
	composerv1 "mesh.dev/proto/mesh/composer/v1"
	typev1 "mesh.dev/proto/mesh/type/v1"
	"mesh.dev/services/nodeengine/internal/state"
)

// Reason codes of refusals and failures.
const (
	codePathEscape     = composerv1.ReasonCode_REASON_CODE_PATH_ESCAPE
	codeThroughSymlink = composerv1.ReasonCode_REASON_CODE_PATH_THROUGH_SYMLINK
	codeOutside        = composerv1.ReasonCode_REASON_CODE_PATH_OUTSIDE_PREFIXES
	codeSpecial        = composerv1.ReasonCode_REASON_CODE_SPECIAL_FILE
	codeUnmanaged      = composerv1.ReasonCode_REASON_CODE_UNMANAGED_PATH
	codeConflict       = composerv1.ReasonCode_REASON_CODE_PATH_CONFLICT
	codeWrite          = composerv1.ReasonCode_REASON_CODE_WRITE_FAILED
	codePartMissing    = composerv1.ReasonCode_REASON_CODE_PART_MISSING
	codeFetch          = composerv1.ReasonCode_REASON_CODE_FETCH_FAILED
	codeDigest         = composerv1.ReasonCode_REASON_CODE_DIGEST_MISMATCH
	codeSize           = composerv1.ReasonCode_REASON_CODE_SIZE_EXCEEDED
)

// Default modes of a resource whose mode is 0 (proto3 cannot tell an unset
// mode from 0, and a file nobody may read is never what a module meant).
const (
	DefaultFileMode = 0o644
	DefaultDirMode  = 0o755
)

// Failure is why a module's composition was not applied, with its code.
type Failure struct {
	Code   composerv1.ReasonCode
	Reason string
}

func (f *Failure) Error() string { return f.Reason }

func fail(code composerv1.ReasonCode, format string, args ...any) *Failure {
	return &Failure{Code: code, Reason: fmt.Sprintf(format, args...)}
}

// Composition is one composition to have in effect.
type Composition struct {
	// Module is the composition's module, "node" for the node's own.
	Module string
	Key    string
	Comp   *typev1.Composition
	// Env is the signed envelope, recorded as applied once its ops are done.
	Env *typev1.Envelope
	// Parts are the artifacts of the want's build record by ref (the
	// entry's declarations with the want's digests).
	Parts map[string]*typev1.Artifact
}

// Config is what an Applier needs.
type Config struct {
	// Root is prepended to every path: "/" in production, a directory of
	// its own for each engine of a dev mesh or test.
	Root string
	// Prefixes are the absolute clean paths the engine may write under.
	Prefixes []string
	// StateDir holds stage/ (fetched content waiting to be written) and
	// adopted/ (the prior content of adopted paths).
	StateDir string
	Logger   *slog.Logger
	// AfterOp, when set, is called after each op of an apply or replay has
	// run, with the ops done and the journal's count (a test hook: the
	// fault harness kills the engine there; nil in production).
	AfterOp func(done, total int)
	// DirSyncFault, when set, is asked after each directory fsync of an
	// apply; an error it returns counts as the fsync's (a test hook; nil
	// in production).
	DirSyncFault func(dir string) error
}

type prefix struct {
	path string
	root *os.Root
	// real is the prefix's path below the engine's root as it lies on
	// disk (the administrator's symlinks on the way followed).
	real string
}

// Applier applies compositions under its prefixes.
type Applier struct {
	prefixes   []prefix // longest first
	stageDir   string
	adoptedDir string
	log        *slog.Logger
	euid, egid int
	afterOp    func(done, total int)
	syncFault  func(dir string) error

	mu     sync.Mutex
	warned map[string]bool
}

// New opens one os.Root per prefix, creating a missing prefix directory
// (0755), and the state dir's stage/ and adopted/. A prefix whose path below
// cfg.Root passes through a symlink that is not the administrator's is
// refused (openPrefix).
func New(cfg Config) (*Applier, error) {
	if cfg.Root == "" {
		return nil, errors.New("apply: no root")
	}
	if len(cfg.Prefixes) == 0 {
		return nil, errors.New("apply: no allowed prefix")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	a := &Applier{
		stageDir: filepath.Join(cfg.StateDir, "stage"), adoptedDir: filepath.Join(cfg.StateDir, "adopted"),
		log: cfg.Logger, euid: os.Geteuid(), egid: os.Getegid(), warned: map[string]bool{}, afterOp: cfg.AfterOp, syncFault: cfg.DirSyncFault,
	}
	for _, d := range []string{a.stageDir, a.adoptedDir} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, fmt.Errorf("apply: %w", err)
		}
	}
	seen := map[string]bool{}
	for i, p := range cfg.Prefixes {
		if err := names.CheckPath(fmt.Sprintf("allow_prefix[%d]", i), p); err != nil {
			a.Close()
			return nil, fmt.Errorf("apply: %w", err)
		}
		if seen[p] {
			continue
		}
		seen[p] = true
		r, real, err := openPrefix(cfg.Root, p)
		if err != nil {
			a.Close()
			var se *symlinkError
			if errors.As(err, &se) {
				return nil, fmt.Errorf("apply: prefix %s passes through the symlink %s -> %s, which is not the administrator's (it or its directory owned by another user, or that directory writable by others): the engine's writes would land where it points", p, se.path, se.target)
			}
			return nil, fmt.Errorf("apply: prefix %s: %w", p, err)
		}
		for _, o := range a.prefixes {
			// Two prefixes that are one directory, or one inside the other,
			// on disk but not as declared would key one file under two
			// paths in the ledger.
			if (names.Within(real, o.real) || names.Within(o.real, real)) && !names.Within(p, o.path) && !names.Within(o.path, p) {
				r.Close()
				a.Close()
				return nil, fmt.Errorf("apply: prefix %s is %s on this machine and prefix %s is %s: one directory under two prefixes would be managed under two paths; allow one of them", p, real, o.path, o.real)
			}
		}
		a.prefixes = append(a.prefixes, prefix{path: p, root: r, real: real})
	}
	sort.Slice(a.prefixes, func(i, j int) bool { return len(a.prefixes[i].path) > len(a.prefixes[j].path) })
	return a, nil
}

// maxPrefixLinks bounds the symlinks followed on the way to one prefix
// (as the kernel's ELOOP does).
const maxPrefixLinks = 40

// errPrefixLoop is a prefix whose way goes through more than
// maxPrefixLinks symlinks.
var errPrefixLoop = fmt.Errorf("more than %d symlinks on the way (a loop?)", maxPrefixLinks)

// openPrefix opens the prefix p below root one component at a time,
// making a missing one (0755), and returns it with its path below root as
// it lies on disk (no symlink in it). A component that is a symlink is
// followed only when the machine's administrator made it: the symlink and
// the directory holding it owned by root or the engine's own user, and that
// directory writable by no one else (trustedLink) — an OS layout such as
// /opt -> var/opt. Any other is refused (openDir's symlinkError): a user
// able to put one there would put every write of the engine wherever it
// points. A target is resolved inside root (an absolute one from root; a
// ".." goes to the parent of the directory reached, as the kernel's does,
// and stops at root), so a prefix never leaves it. root itself is taken as
// given.
func openPrefix(root, p string) (*os.Root, string, error) {
	if err := os.MkdirAll(root, DefaultDirMode); err != nil {
		return nil, "", err
	}
	euid := os.Geteuid()
	split := func(q string) []string { return strings.Split(strings.Trim(q, "/"), "/") }
	rest := split(p)
	links := 0
walk:
	for {
		r, err := os.OpenRoot(root)
		if err != nil {
			return nil, "", err
		}
		at := "/" // r's path below root, every component a directory
		for i, name := range rest {
			switch name {
			case "", ".":
				continue
			case "..":
				// The parent of the directory reached: walked again
				// from root.
				r.Close()
				rest = append(split(path.Dir(at)), rest[i+1:]...)
				continue walk
			}
			host := filepath.Join(root, filepath.FromSlash(path.Join(at, name)))
			// mkdirat follows no symlink: one lying there is found below.
			if err := r.Mkdir(name, DefaultDirMode); err != nil && !errors.Is(err, fs.ErrExist) {
				r.Close()
				return nil, "", err
			}
			sub, err := openDir(r, name, host)
			var se *symlinkError
			if errors.As(err, &se) && trustedLink(r, name, euid) {
				r.Close()
				if links++; links > maxPrefixLinks {
					return nil, "", fmt.Errorf("%s: %w", host, errPrefixLoop)
				}
				// Start again from root on the path it points at.
				next := split(se.target)
				if !strings.HasPrefix(se.target, "/") {
					next = append(split(at), next...)
				}
				rest = append(next, rest[i+1:]...)
				continue walk
			}
			r.Close()
			if err != nil {
				return nil, "", err
			}
			r, at = sub, path.Join(at, name)
		}
		return r, at, nil
	}
}

// trustedLink reports whether the symlink name in dir was made by the
// machine's administrator: it and dir owned by root or by uid, and dir
// writable by its owner alone.
func trustedLink(dir *os.Root, name string, uid int) bool {
	owner := func(fi fs.FileInfo) (int, bool) {
		st, ok := fi.Sys().(*syscall.Stat_t)
		if !ok {
			return 0, false
		}
		return int(st.Uid), true
	}
	link, err := dir.Lstat(name)
	if err != nil {
		return false
	}
	parent, err := dir.Stat(".")
	if err != nil {
		return false
	}
	lu, ok1 := owner(link)
	pu, ok2 := owner(parent)
	return ok1 && ok2 && (lu == 0 || lu == uid) && (pu == 0 || pu == uid) && parent.Mode().Perm()&0o022 == 0
}

// Close closes the roots.
func (a *Applier) Close() {
	for _, p := range a.prefixes {
		p.root.Close()
	}
}

// locate returns the prefix holding p (the longest) and p relative to it.
func (a *Applier) locate(p string) (*prefix, string, bool) {
	for i := range a.prefixes {
		pr := &a.prefixes[i]
		if names.Within(p, pr.path) {
			rel := strings.TrimPrefix(strings.TrimPrefix(p, pr.path), "/")
			if rel == "" {
				rel = "."
			}
			return pr, rel, true
		}
	}
	return nil, "", false
}

// Within reports whether p lies under an allowed prefix.
func (a *Applier) Within(p string) bool {
	_, _, ok := a.locate(p)
	return ok
}

// Plan is what Prepare plans from.
type Plan struct {
	// Compositions in the order they apply: modules' by key, the node's own
	// last. Each path must be declared once (the engine holds conflicts).
	Compositions []*Composition
	// Ledger is the current ledger (not modified).
	Ledger map[string]*state.LedgerRecord
	// Removals lets paths no composition declares leave; it is off while
	// stale or when a composition of the manifest could not be applied.
	Removals bool
	// Undo are paths that leave, when no composition declares them, even
	// with Removals off: those an apply that failed part-way created for a
	// module being rolled back (state.Rollback).
	Undo map[string]bool
	// Adoption adds to the adoption list of the node's own composition in
	// Compositions: a plan without it (a rollback of other modules) keeps
	// the node's adopted paths adoptable.
	Adoption []string
}

type stageItem struct {
	module string
	comp   *Composition
	res    *typev1.Resource
	digest string
	size   int64
}

type adoptItem struct {
	module string
	prefix *prefix
	rel    string
	digest string
}

// Prepared is a planned apply.
type Prepared struct {
	// Failures are the modules refused, with why; when any is set, nothing
	// else of the Prepared may be used: drop them and prepare again.
	Failures map[string]*Failure
	// Drift lists the managed paths whose disk differs from the ledger.
	Drift []string
	// Notes are remarks per module that do not fail it (a filled file not
	// yet written, an owner that cannot be set when not root).
	Notes map[string][]string

	ops   []state.Op
	stage []stageItem
	adopt []adoptItem
	mods  map[string]*Composition
	// ways caches what lies on the directories between a prefix and the
	// declared paths, by absolute path: many paths share them.
	ways map[string]disk
	// roots are the directories looked in, for the time of Prepare (which
	// changes nothing on disk).
	roots *dirRoots
}

// Ops returns the planned ops.
func (p *Prepared) Ops() []state.Op { return p.ops }

func (p *Prepared) refuse(module string, f *Failure) {
	if _, ok := p.Failures[module]; !ok {
		p.Failures[module] = f
	}
}

func (p *Prepared) note(module, s string) {
	p.Notes[module] = append(p.Notes[module], s)
}

// desired is one declared path.
type desired struct {
	comp *Composition
	res  *typev1.Resource
	rec  *state.LedgerRecord
}

func contentDigest(c *Composition, r *typev1.Resource) (string, int64, *Failure) {
	switch x := r.GetContent().(type) {
	case *typev1.Resource_Inline:
		return names.Digest(x.Inline), int64(len(x.Inline)), nil
	case *typev1.Resource_Object:
		return x.Object.GetDigest(), x.Object.GetSize(), nil
	case *typev1.Resource_Artifact:
		p, ok := c.Parts[x.Artifact]
		if !ok || !names.ValidDigest(p.GetDigest()) {
			return "", 0, fail(codePartMissing, "%s: artifact %s is not in the build record (the entry's artifacts with the want's digests)", r.GetId(), x.Artifact)
		}
		return p.GetDigest(), p.GetSize(), nil
	}
	return "", 0, fail(codeWrite, "%s: a file without content", r.GetId())
}

func typeOfResource(t typev1.ResourceType) string {
	switch t {
	case typev1.ResourceType_RESOURCE_TYPE_FILE:
		return state.TypeFile
	case typev1.ResourceType_RESOURCE_TYPE_DIRECTORY:
		return state.TypeDir
	case typev1.ResourceType_RESOURCE_TYPE_SYMLINK:
		return state.TypeSymlink
	}
	return ""
}

func modeOf(r *state.LedgerRecord) uint32 {
	if r.Mode != 0 {
		return r.Mode
	}
	if r.Type == state.TypeDir {
		return DefaultDirMode
	}
	return DefaultFileMode
}

func inAny(p string, list []string) bool {
	for _, d := range list {
		if names.Within(p, d) {
			return true
		}
	}
	return false
}

// CheckTarget judges a symlink's target: a relative target is resolved from
// the link's directory; one that climbs out of the link's prefix escapes,
// and any resolved target outside every prefix is refused.
func (a *Applier) CheckTarget(linkPath, target string) *Failure {
	resolved := target
	if !strings.HasPrefix(target, "/") {
		resolved = path.Join(path.Dir(linkPath), target)
		if pr, _, ok := a.locate(linkPath); ok && hasDotDot(target) && !names.Within(resolved, pr.path) {
			return fail(codePathEscape, "symlink %s: target %s escapes its prefix %s", linkPath, target, pr.path)
		}
	} else if hasDotDot(target) {
		return fail(codePathEscape, "symlink %s: target %s holds ..", linkPath, target)
	}
	if !a.Within(path.Clean(resolved)) {
		return fail(codeOutside, "symlink %s: target %s is outside the allowed prefixes", linkPath, target)
	}
	return nil
}

// CheckPath judges a declared path before anything else: ".." escapes and
// paths outside the prefixes.
func (a *Applier) CheckPath(p string) *Failure {
	if hasDotDot(p) {
		return fail(codePathEscape, "%s escapes with ..", p)
	}
	// Only an absolute clean path is planned: "/srv//x" would make Prepare
	// walk ancestors that never reach the prefix.
	if err := names.CheckPath("path", p); err != nil {
		return fail(codePathEscape, "%s is not an absolute clean path", p)
	}
	if !a.Within(p) {
		return fail(codeOutside, "%s is outside the allowed prefixes", p)
	}
	return nil
}

// Prepare plans an apply from the disk and the ledger, writing nothing.
func (a *Applier) Prepare(plan Plan) *Prepared {
	p := &Prepared{Failures: map[string]*Failure{}, Notes: map[string][]string{}, mods: map[string]*Composition{}, ways: map[string]disk{}, roots: newDirRoots()}
	defer p.roots.reset()
	ids := newIDs()
	want := map[string]*desired{}
	var order []*desired
	adoption := map[string]bool{}
	for _, ap := range plan.Adoption {
		adoption[ap] = true
	}
	for _, c := range plan.Compositions {
		p.mods[c.Module] = c
		if c.Module == names.NodeModule {
			for _, ap := range c.Comp.GetAdoption() {
				adoption[ap] = true
			}
		}
	}
	for _, c := range plan.Compositions {
		filled := map[string]bool{}
		for _, f := range c.Comp.GetFilled() {
			if ff := a.CheckPath(f); ff != nil {
				p.refuse(c.Module, fail(ff.Code, "filled path %s", ff.Reason))
			}
			filled[f] = true
		}
		for _, ap := range c.Comp.GetAdoption() {
			if ff := a.CheckPath(ap); ff != nil {
				p.refuse(c.Module, fail(ff.Code, "adopted path %s", ff.Reason))
			}
		}
		for _, r := range c.Comp.GetResources() {
			if f := a.CheckPath(r.GetPath()); f != nil {
				p.refuse(c.Module, fail(f.Code, "%s: %s", r.GetId(), f.Reason))
				continue
			}
			rec := &state.LedgerRecord{
				Path: r.GetPath(), Type: typeOfResource(r.GetType()), Module: c.Module, ID: r.GetId(), Key: c.Key,
				Mode: r.GetMode(), Owner: r.GetOwner(), Group: r.GetGroup(),
				Filled: r.GetType() == typev1.ResourceType_RESOURCE_TYPE_FILE && filled[r.GetPath()],
				Data:   inAny(r.GetPath(), c.Comp.GetDataPaths()),
			}
			switch rec.Type {
			case state.TypeFile:
				if !rec.Filled {
					d, size, f := contentDigest(c, r)
					if f != nil {
						p.refuse(c.Module, f)
						continue
					}
					rec.Digest, rec.Size = d, size
				}
			case state.TypeSymlink:
				if f := a.CheckTarget(r.GetPath(), r.GetTarget()); f != nil {
					p.refuse(c.Module, f)
					continue
				}
				rec.Digest = r.GetTarget()
			case "":
				p.refuse(c.Module, fail(codeWrite, "%s: type %v", r.GetId(), r.GetType()))
				continue
			}
			if prev, dup := want[r.GetPath()]; dup {
				ids := []string{prev.res.GetId(), r.GetId()}
				sort.Strings(ids)
				f := fail(codeConflict, "2 resources declare %s: %s, %s", r.GetPath(), ids[0], ids[1])
				p.refuse(c.Module, f)
				p.refuse(prev.comp.Module, f)
				continue
			}
			d := &desired{comp: c, res: r, rec: rec}
			want[r.GetPath()] = d
			order = append(order, d)
		}
	}
	if len(p.Failures) > 0 {
		return p
	}

	made := map[string]bool{} // absolute paths a planned op creates
	for _, d := range order {
		a.prepareOne(p, plan, d, want, made, adoption, ids)
	}
	if len(p.Failures) > 0 {
		return p
	}
	if plan.Removals || len(plan.Undo) > 0 {
		a.prepareRemovals(p, plan, want, made)
	}
	sort.Strings(p.Drift)
	return p
}

func abs(pr *prefix, rel string) string {
	if rel == "." {
		return pr.path
	}
	if pr.path == "/" {
		return "/" + rel
	}
	return pr.path + "/" + rel
}

// prepareOne plans the ops of one declared path.
func (a *Applier) prepareOne(p *Prepared, plan Plan, d *desired, want map[string]*desired, made map[string]bool, adoption map[string]bool, ids *ids) {
	module := d.comp.Module
	r, rec := d.res, d.rec
	pr, rel, _ := a.locate(r.GetPath())

	// The directories between the prefix and the path: none may be a
	// symlink (the words say whether it is absolute or leaves the prefix);
	// missing ones are made.
	var missing []string
	for _, anc := range ancestors(rel) {
		ap := abs(pr, anc)
		if made[ap] {
			continue
		}
		if len(missing) > 0 {
			missing = append(missing, anc)
			continue
		}
		dk, cached := p.ways[ap]
		if !cached {
			var err error
			if dk, err = look(pr.root, anc, false); err != nil {
				p.refuse(module, a.lookFailure(r.GetId(), ap, err))
				return
			}
			p.ways[ap] = dk
		}
		switch {
		case !dk.exists:
			missing = append(missing, anc)
		case dk.special != "":
			p.refuse(module, fail(codeSpecial, "%s: %s lies on the way and is a %s", r.GetId(), ap, dk.special))
			return
		case dk.typ == state.TypeSymlink:
			if strings.HasPrefix(dk.target, "/") {
				p.refuse(module, fail(codeThroughSymlink, "%s: %s passes through the absolute symlink %s -> %s", r.GetId(), r.GetPath(), ap, dk.target))
				return
			}
			if !names.Within(path.Join(path.Dir(ap), dk.target), pr.path) {
				p.refuse(module, fail(codePathEscape, "%s: %s passes through the symlink %s -> %s, which leaves %s", r.GetId(), r.GetPath(), ap, dk.target, pr.path))
				return
			}
			// One that stays in the prefix is refused too: os.Root would
			// follow it, and the path would name another path than the
			// one the ledger keys it by (conf.d -> ../sudoers.d).
			p.refuse(module, throughSymlink(r.GetId()+": "+r.GetPath(), ap, dk.target))
			return
		case dk.typ != state.TypeDir:
			p.refuse(module, fail(codeWrite, "%s: %s lies on the way and is not a directory", r.GetId(), ap))
			return
		case declaredOther(want, ap):
			// A directory today, declared a symlink (say): the path
			// would pass through it once applied.
			p.refuse(module, underDeclared(r, ap, want))
			return
		}
	}
	for _, anc := range missing {
		ap := abs(pr, anc)
		if f := notOursToReplace(r.GetId(), plan.Ledger[ap], state.TypeDir); f != nil {
			p.refuse(module, f)
			return
		}
		made[ap] = true
		var arec *state.LedgerRecord
		if declaredOther(want, ap) {
			p.refuse(module, underDeclared(r, ap, want))
			return
		} else if w, ok := want[ap]; ok {
			arec = cloneRec(w.rec)
			arec.Created = true
			if old := plan.Ledger[ap]; old != nil {
				// The declared directory's own record is this one (its
				// prepare is skipped as made): what the ledger knew of
				// it stays — adopted, the engine's, a data path — and
				// its vanishing is drift.
				arec.Created, arec.Adopted = old.Created, cloneRec(old).Adopted
				arec.Data = arec.Data || old.Data
				if !old.Retained {
					p.Drift = append(p.Drift, ap)
				}
			}
		} else if old, ok := plan.Ledger[ap]; ok && old.Type == state.TypeDir {
			arec = cloneRec(old)
			arec.Retained = false
		} else {
			arec = &state.LedgerRecord{Path: ap, Type: state.TypeDir, Module: module, Mode: DefaultDirMode, Created: true, Implicit: true}
		}
		p.addOp(state.Op{Kind: state.OpMkdir, Path: ap, Module: module, Record: arec, Prev: plan.Ledger[ap]})
	}
	if made[r.GetPath()] {
		return // made above as a parent of an earlier path, with this record
	}

	// An adopted path is hashed whatever type is declared: its prior
	// content is kept by digest to be restored later.
	hash, sizes := contentSizes(rec, plan.Ledger[r.GetPath()], adoption[r.GetPath()])
	dk, err := p.roots.look(pr, rel, hash, sizes...)
	if err != nil {
		p.refuse(module, a.lookFailure(r.GetId(), r.GetPath(), err))
		return
	}
	if dk.special != "" {
		p.refuse(module, fail(codeSpecial, "%s: %s is a %s", r.GetId(), r.GetPath(), dk.special))
		return
	}
	old := plan.Ledger[r.GetPath()]
	if f := notOursToReplace(r.GetId(), old, rec.Type); f != nil {
		p.refuse(module, f)
		return
	}
	switch {
	case old != nil && old.Filled && !rec.Filled && !old.Created && old.Adopted == nil:
		// The provisioner's file, now declared with content: the engine
		// takes it over only as it takes over any path it did not make,
		// by adoption, keeping what is there to put back.
		rec.Data = rec.Data || old.Data
		switch {
		case !adoption[r.GetPath()]:
			p.refuse(module, fail(codeUnmanaged, "%s: %s is filled by the provisioner, not the engine's to write: declaring its content needs adoption", r.GetId(), r.GetPath()))
			return
		case !dk.exists:
			rec.Created = true
		default:
			rec.Adopted = p.adoptPrior(module, pr, rel, dk)
		}
	case old != nil:
		rec.Created, rec.Adopted = old.Created, old.Adopted
		// A data path stays one: a relabel to a composition that lists no
		// data path (a module's resource moving to the node's own) or a
		// version that dropped it must not make the file removable.
		rec.Data = rec.Data || old.Data
	case !dk.exists:
		rec.Created = !rec.Filled
	case rec.Filled:
		rec.Created = false
	case adoption[r.GetPath()]:
		rec.Adopted = p.adoptPrior(module, pr, rel, dk)
	default:
		p.refuse(module, fail(codeUnmanaged, "%s: %s exists and is not managed by this engine (not in its ledger, not adopted)", r.GetId(), r.GetPath()))
		return
	}

	uid, err := ids.user(rec.Owner)
	if err == nil {
		var gid int
		gid, err = ids.group(rec.Group)
		if err == nil {
			a.prepareContent(p, d, pr, rel, dk, old, uid, gid)
			return
		}
	}
	p.refuse(module, fail(codeWrite, "%s: %v", r.GetId(), err))
}

// emptyDigest is the digest of empty content.
var emptyDigest = names.Digest(nil)

// contentSizes says whether prepareOne needs the digest of a file lying on
// rec's path, and the sizes it must have for the digest to matter: the
// wanted content's (to find it already in place) and the ledger's (to find
// drift). An adopted path's content is kept by digest whatever its size; a
// filled file's digest is never compared.
func contentSizes(rec, old *state.LedgerRecord, adopted bool) (hash bool, sizes []int64) {
	if adopted {
		return true, nil
	}
	if rec.Type != state.TypeFile {
		return false, nil
	}
	if !rec.Filled {
		sizes = append(sizes, rec.Size)
	}
	if old != nil && old.Type == state.TypeFile && !old.Filled {
		if old.Size == 0 && old.Digest != emptyDigest {
			return true, nil // kept before records had sizes: any size
		}
		sizes = append(sizes, old.Size)
	}
	return len(sizes) > 0, sizes
}

// declaredOther reports whether ap, a directory on the way to a declared
// path, is itself declared other than a directory.
func declaredOther(want map[string]*desired, ap string) bool {
	w, ok := want[ap]
	return ok && w.rec.Type != state.TypeDir
}

// underDeclared is the refusal of r, which lies under ap, declared other
// than a directory.
func underDeclared(r *typev1.Resource, ap string, want map[string]*desired) *Failure {
	w := want[ap]
	return fail(codeWrite, "%s: %s is declared as a %s by %s, yet %s lies under it", r.GetId(), ap, w.rec.Type, w.res.GetId(), r.GetPath())
}

// adoptPrior is what lies on an adopted path, to be put back when the
// resource leaves; a file's content is kept by digest (Stage copies it).
func (p *Prepared) adoptPrior(module string, pr *prefix, rel string, dk disk) *state.Prior {
	prior := &state.Prior{Type: dk.typ, Target: dk.target, Mode: dk.mode, UID: dk.uid, GID: dk.gid}
	if dk.typ == state.TypeFile {
		prior.Digest = dk.digest
		p.adopt = append(p.adopt, adoptItem{module: module, prefix: pr, rel: rel, digest: dk.digest})
	}
	return prior
}

// notOursToReplace refuses to make a path of the ledger that the engine
// neither created nor adopted (a filled file: the provisioner's) a path of
// another type: making it a directory or a symlink removes what is there,
// and nothing of it is kept to be put back.
func notOursToReplace(id string, old *state.LedgerRecord, typ string) *Failure {
	if old == nil || old.Created || old.Adopted != nil || old.Type == typ {
		return nil
	}
	if old.Filled {
		return fail(codeUnmanaged, "%s: %s is the provisioner's (filled) file, not the engine's to replace with a %s", id, old.Path, typ)
	}
	return fail(codeUnmanaged, "%s: %s is a %s the engine neither made nor adopted, not its to replace with a %s", id, old.Path, old.Type, typ)
}

// throughSymlink is the refusal of a path that passes through a symlink;
// subject names the path ("<id>: <path>" at Prepare, the path at op time).
func throughSymlink(subject, link, target string) *Failure {
	return fail(codeThroughSymlink, "%s passes through the symlink %s -> %s: a path through a symlink would name another path", subject, link, target)
}

func (a *Applier) lookFailure(id, p string, err error) *Failure {
	var se *symlinkError
	if errors.As(err, &se) {
		return throughSymlink(id+": "+p, se.path, se.target)
	}
	if strings.Contains(err.Error(), "escapes") {
		return fail(codePathEscape, "%s: %s escapes its prefix: %v", id, p, err)
	}
	return fail(codeWrite, "%s: %s: %v", id, p, err)
}

func cloneRec(r *state.LedgerRecord) *state.LedgerRecord {
	c := *r
	if r.Adopted != nil {
		pr := *r.Adopted
		c.Adopted = &pr
	}
	return &c
}

// canOwn reports whether the engine can give a path uid and gid (-1: leave
// as is). Only root can give files away; when not root, an owner other than
// the engine's own is left as is and noted once.
func (a *Applier) canOwn(uid, gid int) bool {
	return a.euid == 0 || ((uid < 0 || uid == a.euid) && (gid < 0 || gid == a.egid))
}

func (a *Applier) metaDiffers(dk disk, rec *state.LedgerRecord, uid, gid int) bool {
	if rec.Type != state.TypeSymlink && dk.mode != modeOf(rec) {
		return true
	}
	if !a.canOwn(uid, gid) {
		return false
	}
	return (uid >= 0 && dk.uid != uid) || (gid >= 0 && dk.gid != gid)
}

// prepareContent plans what a declared path needs: a write, a directory, a
// symlink, mode and owner only, or a ledger change only.
func (a *Applier) prepareContent(p *Prepared, d *desired, pr *prefix, rel string, dk disk, old *state.LedgerRecord, uid, gid int) {
	module, r, rec := d.comp.Module, d.res, d.rec
	if !a.canOwn(uid, gid) {
		a.noteOwner(p, module, rec)
	}
	if old != nil && !old.Retained && old.Type == rec.Type && driftOf(old, dk, a, uid, gid) {
		p.Drift = append(p.Drift, rec.Path)
	}
	op := state.Op{Path: rec.Path, Module: module, Record: rec, Prev: old}
	switch rec.Type {
	case state.TypeFile:
		if rec.Filled {
			switch {
			case !dk.exists:
				p.note(module, fmt.Sprintf("filled file %s is missing: its provisioner has not written it", rec.Path))
				op.Kind = state.OpForget
			case dk.typ != state.TypeFile:
				p.refuse(module, fail(codeWrite, "%s: filled path %s is a %s, not a file", r.GetId(), rec.Path, dk.typ))
				return
			case a.metaDiffers(dk, rec, uid, gid):
				op.Kind = state.OpMeta
			default:
				op.Kind = state.OpForget
			}
			break
		}
		if dk.exists && dk.typ == state.TypeFile && dk.digest == rec.Digest {
			if a.metaDiffers(dk, rec, uid, gid) {
				op.Kind = state.OpMeta
			} else {
				op.Kind = state.OpForget
			}
			break
		}
		op.Kind, op.Stage = state.OpWrite, rec.Digest
		if in, ok := r.GetContent().(*typev1.Resource_Inline); ok {
			// Signed with the composition and kept with it in the
			// journal (by reference, when the journal keeps that
			// envelope): no staged copy to write, fsync and remove.
			op.InJournal, op.Inline = true, in.Inline
			op.FromComposition = d.comp.Env != nil && op.Path == r.GetPath()
			break
		}
		_, size, _ := contentDigest(d.comp, r)
		p.stage = append(p.stage, stageItem{module: module, comp: d.comp, res: r, digest: rec.Digest, size: size})
	case state.TypeDir:
		switch {
		case dk.exists && dk.typ == state.TypeDir && !a.metaDiffers(dk, rec, uid, gid):
			op.Kind = state.OpForget
		case dk.exists && dk.typ == state.TypeDir:
			op.Kind = state.OpMeta
		default:
			op.Kind = state.OpMkdir
		}
	case state.TypeSymlink:
		switch {
		case dk.exists && dk.typ == state.TypeSymlink && dk.target == rec.Digest && !a.metaDiffers(dk, rec, uid, gid):
			op.Kind = state.OpForget
		case dk.exists && dk.typ == state.TypeSymlink && dk.target == rec.Digest:
			op.Kind = state.OpMeta
		default:
			op.Kind = state.OpSymlink
		}
	}
	if op.Kind == state.OpForget && old != nil && sameRecord(old, rec) {
		return // nothing to do
	}
	p.addOp(op)
}

func (a *Applier) noteOwner(p *Prepared, module string, rec *state.LedgerRecord) {
	msg := fmt.Sprintf("owner %s:%s of %s not set: the engine is not running as root", rec.Owner, rec.Group, rec.Path)
	p.note(module, msg)
	a.mu.Lock()
	defer a.mu.Unlock()
	if !a.warned[rec.Path] {
		a.warned[rec.Path] = true
		a.log.Warn("owner not set: the engine is not running as root", slog.String("path", rec.Path), slog.String("owner", rec.Owner), slog.String("group", rec.Group))
	}
}

// driftOf reports whether the disk differs from what the ledger says the
// engine put there.
func driftOf(old *state.LedgerRecord, dk disk, a *Applier, uid, gid int) bool {
	if old.Filled {
		return false
	}
	if !dk.exists || dk.typ != old.Type {
		return true
	}
	switch old.Type {
	case state.TypeFile:
		if dk.digest != old.Digest {
			return true
		}
	case state.TypeSymlink:
		if dk.target != old.Digest {
			return true
		}
	}
	if old.Type != state.TypeSymlink && dk.mode != modeOf(old) {
		return true
	}
	if a.canOwn(uid, gid) && old.Owner != "" && uid >= 0 && dk.uid != uid {
		return true
	}
	if a.canOwn(uid, gid) && old.Group != "" && gid >= 0 && dk.gid != gid {
		return true
	}
	return false
}

func sameRecord(a, b *state.LedgerRecord) bool {
	if a == nil || b == nil {
		return a == b
	}
	ac, bc := *a, *b
	ac.Adopted, bc.Adopted = nil, nil
	if ac != bc {
		return false
	}
	if (a.Adopted == nil) != (b.Adopted == nil) {
		return false
	}
	return a.Adopted == nil || *a.Adopted == *b.Adopted
}

func (p *Prepared) addOp(op state.Op) { p.ops = append(p.ops, op) }

// prepareRemovals plans the leaving of ledger paths no composition declares,
// deepest first: data paths are kept (retained), adopted paths get their
// prior content back, paths the engine did not create are only forgotten,
// and directories go only when empty.
func (a *Applier) prepareRemovals(p *Prepared, plan Plan, want map[string]*desired, made map[string]bool) {
	var gone []string
	for path := range plan.Ledger {
		if _, ok := want[path]; ok || made[path] || !plan.Removals && !plan.Undo[path] {
			continue
		}
		gone = append(gone, path)
	}
	sort.Sort(sort.Reverse(sort.StringSlice(gone)))
	for _, path := range gone {
		old := plan.Ledger[path]
		pr, rel, ok := a.locate(path)
		if !ok {
			continue // its prefix is no longer allowed: never touched again
		}
		if old.Type == state.TypeDir && underAny(path, want, made) {
			continue // still holds what is declared
		}
		op := state.Op{Path: path, Module: old.Module, Prev: old}
		switch {
		case old.Data:
			if old.Retained {
				continue
			}
			r := cloneRec(old)
			r.Retained = true
			op.Kind, op.Record = state.OpForget, r
		case old.Adopted != nil:
			op.Kind = state.OpRestore
			if old.Adopted.Type == state.TypeFile {
				op.Stage = old.Adopted.Digest
			}
		case !old.Created:
			op.Kind = state.OpForget
		default:
			dk, err := p.roots.look(pr, rel, false)
			var se *symlinkError
			switch {
			case errors.As(err, &se):
				// The path now names another path: what is there is not
				// what the engine made. Leave it, forget it.
				op.Kind = state.OpForget
				p.note(old.Module, fmt.Sprintf("%s now passes through the symlink %s -> %s; left in place", path, se.path, se.target))
			case err != nil || !dk.exists:
				op.Kind = state.OpForget
			case dk.typ != old.Type:
				// Not what the engine put there: leave it, forget it.
				op.Kind = state.OpForget
				p.note(old.Module, fmt.Sprintf("%s is no longer a %s the engine made; left in place", path, old.Type))
			default:
				op.Kind = state.OpRemove
			}
		}
		p.addOp(op)
	}
}

func underAny(dir string, want map[string]*desired, made map[string]bool) bool {
	for p := range want {
		if p != dir && names.Within(p, dir) {
			return true
		}
	}
	for p := range made {
		if p != dir && names.Within(p, dir) {
			return true
		}
	}
	return false
}
