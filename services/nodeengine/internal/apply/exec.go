package apply

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"syscall"

	"google.golang.org/protobuf/proto"

	"mesh.dev/internal/names"
	typev1 "mesh.dev/proto/mesh/type/v1"
	"mesh.dev/services/nodeengine/internal/state"
)

// Source fetches the content of a file resource held elsewhere (an object
// of the composer or an artifact of the catalog) into w. The applier hashes
// what it writes and cuts it at the declared size; a source should stop at
// the size too, so an endless stream cannot fill the disk.
type Source interface {
	Fetch(ctx context.Context, c *Composition, r *typev1.Resource, digest string, size int64, w io.Writer) error
}

// Store is what Execute needs of the engine's state.
type Store interface {
	PutJournal(j *state.Journal) error
	Commit(c *state.Commit) error
}

// ErrSizeExceeded is returned by a cut writer given more than its limit.
var ErrSizeExceeded = errors.New("more bytes than the declared size")

// CutWriter hashes what it writes and refuses to go past a limit.
type CutWriter struct {
	W     io.Writer
	Limit int64
	N     int64
	h     hash.Hash
}

// NewCutWriter returns a writer to w that stops at limit bytes.
func NewCutWriter(w io.Writer, limit int64) *CutWriter {
	return &CutWriter{W: w, Limit: limit, h: sha256.New()}
}

// Write writes up to the limit and fails with ErrSizeExceeded beyond it.
func (c *CutWriter) Write(p []byte) (int, error) {
	if c.N+int64(len(p)) > c.Limit {
		return 0, ErrSizeExceeded
	}
	n, err := c.W.Write(p)
	c.h.Write(p[:n])
	c.N += int64(n)
	return n, err
}

// Digest returns the digest of what was written.
func (c *CutWriter) Digest() string { return names.DigestOfSum(c.h.Sum(nil)) }

func (a *Applier) stagePath(digest string) string {
	return filepath.Join(a.stageDir, digest[len(names.DigestPrefix):])
}

func (a *Applier) adoptedPath(digest string) string {
	return filepath.Join(a.adoptedDir, digest[len(names.DigestPrefix):])
}

// Stage fetches the content the prepared writes need into the state dir and
// keeps the prior content of paths being adopted. It returns the modules
// whose content could not be had (FETCH_FAILED, SIZE_EXCEEDED,
// DIGEST_MISMATCH); nothing is written under the prefixes.
func (a *Applier) Stage(ctx context.Context, p *Prepared, src Source) map[string]*Failure {
	failed := map[string]*Failure{}
	for _, it := range p.stage {
		if _, ok := failed[it.module]; ok {
			continue
		}
		if f := a.stageOne(ctx, it, src); f != nil {
			failed[it.module] = f
		}
	}
	roots := newDirRoots()
	defer roots.reset()
	for _, it := range p.adopt {
		if err := a.keepPrior(it, roots); err != nil {
			if _, ok := failed[it.module]; !ok {
				failed[it.module] = fail(codeWrite, "keep the prior content of adopted %s: %v", it.rel, err)
			}
		}
	}
	return failed
}

func (a *Applier) stageOne(ctx context.Context, it stageItem, src Source) *Failure {
	dst := a.stagePath(it.digest)
	if _, err := os.Stat(dst); err == nil {
		return nil
	}
	tmp, err := os.CreateTemp(a.stageDir, ".fetch-*")
	if err != nil {
		return fail(codeWrite, "%s: stage: %v", it.res.GetId(), err)
	}
	defer os.Remove(tmp.Name())
	defer tmp.Close()
	cw := NewCutWriter(tmp, it.size)
	// Inline content is never staged: the op carries it (Op.InJournal).
	err = src.Fetch(ctx, it.comp, it.res, it.digest, it.size, cw)
	what := describe(it)
	switch {
	case errors.Is(err, ErrSizeExceeded):
		return fail(codeSize, "%s: %s is longer than its declared size %d", it.res.GetId(), what, it.size)
	case err != nil:
		var f *Failure
		if errors.As(err, &f) {
			return f
		}
		return fail(codeFetch, "%s: fetch %s: %v", it.res.GetId(), what, err)
	case cw.N != it.size:
		return fail(codeDigest, "%s: %s is %d bytes, declared %d", it.res.GetId(), what, cw.N, it.size)
	case cw.Digest() != it.digest:
		return fail(codeDigest, "%s: %s has digest %s, declared %s", it.res.GetId(), what, cw.Digest(), it.digest)
	}
	if err := tmp.Sync(); err != nil {
		return fail(codeWrite, "%s: stage: %v", it.res.GetId(), err)
	}
	if err := os.Rename(tmp.Name(), dst); err != nil {
		return fail(codeWrite, "%s: stage: %v", it.res.GetId(), err)
	}
	return nil
}

func describe(it stageItem) string {
	switch x := it.res.GetContent().(type) {
	case *typev1.Resource_Object:
		return "object " + x.Object.GetDigest() + " of " + it.comp.Key
	case *typev1.Resource_Artifact:
		_, name, _ := cutRef(x.Artifact)
		return "artifact-store://" + it.comp.Module + "/" + name + "/blobs/" + it.digest
	}
	return "inline content"
}

func cutRef(ref string) (kind, name string, ok bool) {
	for i := 0; i < len(ref); i++ {
		if ref[i] == ':' {
			return ref[:i], ref[i+1:], true
		}
	}
	return "", ref, false
}

// keepPrior copies an adopted file's current content to adopted/<digest>.
func (a *Applier) keepPrior(it adoptItem, roots *dirRoots) error {
	dst := a.adoptedPath(it.digest)
	if _, err := os.Stat(dst); err == nil {
		return nil
	}
	in, name, err := roots.at(it.prefix, it.rel)
	if err != nil {
		return err
	}
	f, err := in.OpenFile(name, openFlags, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	tmp, err := os.CreateTemp(a.adoptedDir, ".prior-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	defer tmp.Close()
	h := sha256.New()
	if _, err := copyBuffered(io.MultiWriter(tmp, h), f); err != nil {
		return err
	}
	if got := names.DigestOfSum(h.Sum(nil)); got != it.digest {
		return fmt.Errorf("changed while being adopted (%s, was %s)", got, it.digest)
	}
	if err := tmp.Sync(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), dst)
}

// Meta says what an Execute records besides the ledger.
type Meta struct {
	Revision uint64
	// Manifest is recorded as the applied manifest (nil: unchanged).
	Manifest *typev1.Envelope
	// Drop lists modules whose applied composition goes.
	Drop        []string
	Traceparent string
	// Settle are the modules that leave the kept rollback when none of
	// their ops fails (state.Journal.Settle).
	Settle []string
}

// Result is what an Execute (or Replay) did.
type Result struct {
	// Failed are the modules with an op that failed (WRITE_FAILED).
	Failed map[string]*Failure
	// Applied are the modules whose composition is now recorded applied.
	Applied map[string]bool
	// Ledger is the ledger after the ops.
	Ledger map[string]*state.LedgerRecord
	// Ops is how many ops ran.
	Ops int
	// CommitErr is set when the ops ran but the commit failed: the journal
	// stays and is replayed by the next pass or start.
	CommitErr error
	// Journal is the journal written (nil when there were no ops).
	Journal *state.Journal
	// Rollback are the modules of the journal's compositions this apply
	// left part-way (an op failed after others changed the ledger), with
	// the records before of the paths those ops changed; Settled the
	// modules that left the kept rollback. The commit records both.
	Rollback *state.Rollback
	Settled  []string
}

// Execute journals the prepared ops, runs them and commits. An error means
// the journal could not be written and nothing was touched.
func (a *Applier) Execute(ctx context.Context, p *Prepared, ledger map[string]*state.LedgerRecord, store Store, meta Meta) (*Result, error) {
	j := &state.Journal{ID: randHex(), Revision: meta.Revision, Ops: p.ops, Compositions: map[string][]byte{}, Drop: meta.Drop, Traceparent: meta.Traceparent, Settle: meta.Settle}
	if meta.Manifest != nil {
		b, err := proto.MarshalOptions{Deterministic: true}.Marshal(meta.Manifest)
		if err != nil {
			return nil, err
		}
		j.Manifest = b
	}
	for m, c := range p.mods {
		b, err := proto.MarshalOptions{Deterministic: true}.Marshal(c.Env)
		if err != nil {
			return nil, err
		}
		j.Compositions[m] = b
	}
	// A pass without ops still commits what it records, and needs no
	// journal: nothing on disk can be left half.
	if len(j.Ops) > 0 {
		if err := store.PutJournal(j); err != nil {
			return nil, err
		}
	}
	res := a.Replay(ctx, j, ledger, store)
	if len(j.Ops) > 0 {
		res.Journal = j
	}
	return res, nil
}

// Replay runs a journal's ops (each idempotent, so a journal left by a crash
// is finished) and commits the ledger and the applied compositions of the
// modules whose ops all succeeded.
func (a *Applier) Replay(ctx context.Context, j *state.Journal, ledger map[string]*state.LedgerRecord, store Store) *Result {
	res := &Result{Failed: map[string]*Failure{}, Applied: map[string]bool{}, Ledger: map[string]*state.LedgerRecord{}}
	for p, r := range ledger {
		res.Ledger[p] = r
	}
	// Owners and groups are looked up once per apply, not once per op.
	ids := newIDs()
	syncs := &dirSyncs{modules: map[dirKey][]string{}}
	roots := newDirRoots()
	defer roots.reset()
	// opFailed are the modules an op failed for (not only a directory's
	// fsync): those may be left part-way.
	opFailed := map[string]bool{}
	for _, op := range j.Ops {
		m := opModule(op)
		rec, err := a.runOp(op, ids, roots, func(k dirKey) { syncs.add(k, m) })
		res.Ops++
		if a.afterOp != nil {
			a.afterOp(res.Ops, len(j.Ops))
		}
		if err != nil {
			opFailed[m] = true
			if _, ok := res.Failed[m]; !ok {
				res.Failed[m] = opFailure(op.Path, err)
			}
			a.log.Error("apply op failed", slog.String("op", op.Kind), slog.String("path", op.Path), slog.String("module", m), slog.Any("error", err))
			continue
		}
		if rec == nil {
			delete(res.Ledger, op.Path)
		} else {
			res.Ledger[op.Path] = rec
		}
	}
	// Every directory an op renamed, made or removed something in is
	// fsynced once, after the last op and before the commit: nothing is
	// recorded applied before it is durable. A module whose directory does
	// not sync is not recorded applied; the next pass tries it again.
	for _, k := range syncs.order {
		// Reached as the ops reached it, never through a symlink: a
		// directory a write opened is still open here, whatever was
		// renamed since.
		r, err := roots.dir(k.prefix, k.dir)
		if err == nil {
			err = syncDir(r)
		}
		if err == nil && a.syncFault != nil {
			err = a.syncFault(k.path())
		}
		var se *symlinkError
		if errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ENOTDIR) || errors.As(err, &se) {
			// A later op removed or replaced it: that op changed its
			// parent, which is synced.
			continue
		}
		if err != nil {
			for _, m := range syncs.modules[k] {
				if _, ok := res.Failed[m]; !ok {
					res.Failed[m] = fail(codeWrite, "fsync of directory %s: %v", k.path(), err)
				}
			}
			a.log.Error("directory fsync failed", slog.String("dir", k.path()), slog.Any("error", err))
		}
	}
	res.Rollback = halves(j, ledger, res, opFailed)
	for _, m := range j.Settle {
		// A directory that did not sync leaves the module whole on disk:
		// its next pass syncs and records it, nothing is to be rolled back.
		if !opFailed[m] {
			res.Settled = append(res.Settled, m)
		}
	}
	c := &state.Commit{Compositions: map[string]*typev1.Envelope{}, ClearJournal: true, Rollback: res.Rollback, Settled: res.Settled}
	for p, r := range res.Ledger {
		if old, ok := ledger[p]; !ok || !sameRecord(old, r) {
			c.LedgerPut = append(c.LedgerPut, r)
		}
	}
	for p := range ledger {
		if _, ok := res.Ledger[p]; !ok {
			c.LedgerDelete = append(c.LedgerDelete, p)
		}
	}
	sort.Slice(c.LedgerPut, func(i, k int) bool { return c.LedgerPut[i].Path < c.LedgerPut[k].Path })
	sort.Strings(c.LedgerDelete)
	if len(j.Manifest) > 0 {
		env := &typev1.Envelope{}
		if err := proto.Unmarshal(j.Manifest, env); err == nil {
			c.Manifest = env
		}
	}
	for m, b := range j.Compositions {
		if _, failed := res.Failed[m]; failed {
			continue
		}
		env := &typev1.Envelope{}
		if err := proto.Unmarshal(b, env); err != nil {
			continue
		}
		c.Compositions[m] = env
		res.Applied[m] = true
	}
	c.Drop = j.Drop
	if err := store.Commit(c); err != nil {
		res.CommitErr = err
		return res
	}
	// A prior is kept by digest: it goes only when no record still holds
	// it (a restore that failed keeps its record; another adopted path
	// may have had the same content).
	var held map[string]bool
	for _, op := range j.Ops {
		if op.Kind == state.OpWrite && !op.InJournal {
			os.Remove(a.stagePath(op.Stage))
		}
		if op.Kind == state.OpRestore && op.Stage != "" {
			if held == nil {
				held = map[string]bool{}
				for _, r := range res.Ledger {
					if r.Adopted != nil && r.Adopted.Type == state.TypeFile {
						held[r.Adopted.Digest] = true
					}
				}
			}
			if !held[op.Stage] {
				os.Remove(a.adoptedPath(op.Stage))
			}
		}
	}
	return res
}

// opModule is the module an op is done for: a removal's is its record's.
func opModule(op state.Op) string {
	if op.Module == "" && op.Prev != nil {
		return op.Prev.Module
	}
	return op.Module
}

// halves finds the modules of the journal's compositions an op failed for
// after others of theirs changed the ledger (left part-way), with the
// records before of the paths their ops changed. A module whose ops all
// ran and only a directory's fsync failed is not half: its next pass
// syncs it. A module leaving (no composition in the journal) whose
// removal failed is not either: the next pass removes it again.
func halves(j *state.Journal, before map[string]*state.LedgerRecord, res *Result, opFailed map[string]bool) *state.Rollback {
	var rb *state.Rollback
	for _, op := range j.Ops {
		m := opModule(op)
		if _, applying := j.Compositions[m]; !applying || !opFailed[m] {
			continue
		}
		was, now := before[op.Path], res.Ledger[op.Path]
		if sameRecord(was, now) {
			continue
		}
		if rb == nil {
			rb = &state.Rollback{Modules: map[string]string{}, Paths: map[string]state.RollbackPath{}}
		}
		rb.Modules[m] = res.Failed[m].Reason
		rb.Paths[op.Path] = state.RollbackPath{Module: m, Before: was}
	}
	return rb
}

// TempPrefix starts the name of every temp file or symlink the applier
// makes beside a path before renaming it into place; no other file is named
// so.
const TempPrefix = ".mesh-tmp-"

// SweepTemps removes the temp files and symlinks a stop in the middle of a
// write left beside the paths of a journal's ops (the replay writes through
// temp files of its own), so a crash leaves nothing of its own behind.
func (a *Applier) SweepTemps(j *state.Journal) {
	dirs := map[string]bool{}
	for _, op := range j.Ops {
		dirs[path.Dir(op.Path)] = true
	}
	roots := newDirRoots()
	defer roots.reset()
	for d := range dirs {
		pr, rel, ok := a.locate(d)
		if !ok {
			continue
		}
		// Never through a symlink: a temp name in the directory it points
		// at is not one the engine left.
		dir, err := roots.dir(pr, rel)
		if err != nil {
			continue
		}
		f, err := dir.Open(".")
		if err != nil {
			continue
		}
		entries, err := f.Readdirnames(-1)
		f.Close()
		if err != nil {
			continue
		}
		removed := false
		for _, name := range entries {
			if !strings.HasPrefix(name, TempPrefix) {
				continue
			}
			fi, err := dir.Lstat(name)
			if err != nil || !(fi.Mode().IsRegular() || fi.Mode()&fs.ModeSymlink != 0) {
				continue
			}
			if err := dir.Remove(name); err != nil {
				a.log.Warn("a temp file a stop left could not be removed", slog.String("path", path.Join(d, name)), slog.Any("error", err))
				continue
			}
			removed = true
		}
		if removed {
			if err := syncDir(dir); err != nil {
				a.log.Warn("sync a directory after removing temp files", slog.String("path", d), slog.Any("error", err))
			}
		}
	}
}

// ClearStage removes staged content no journal needs (call at start when
// no journal is kept).
func (a *Applier) ClearStage() {
	ents, err := os.ReadDir(a.stageDir)
	if err != nil {
		return
	}
	for _, e := range ents {
		os.Remove(filepath.Join(a.stageDir, e.Name()))
	}
}

func randHex() string {
	var b [8]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// errAppeared is an op that found something on a path that was fresh when
// the apply was planned.
var errAppeared = errors.New("appeared since the apply was planned")

// runOp runs one op and returns the ledger record it leaves (nil: none).
// Every op works on a single name in its path's directory, opened through
// the directory roots, so no op follows a symlink on the way (see
// dirRoots). A write only writes files; any other op may remove, make or
// replace a directory, so it resets the directory roots first. (A write
// that finds an empty directory on its path removes it: a directory root
// of it could only have been opened by an earlier write into it, undone
// since by a removal op, which reset them.)
func (a *Applier) runOp(op state.Op, ids *ids, roots *dirRoots, changed func(dirKey)) (*state.LedgerRecord, error) {
	pr, rel, ok := a.locate(op.Path)
	if !ok {
		return op.Prev, fmt.Errorf("%s is outside the allowed prefixes", op.Path)
	}
	if op.Kind == state.OpForget {
		return op.Record, nil
	}
	if op.Kind != state.OpWrite {
		roots.reset()
	}
	root, name, err := roots.at(pr, rel)
	if err != nil {
		if op.Kind == state.OpRemove && errors.Is(err, fs.ErrNotExist) {
			return nil, nil // gone with its directory
		}
		return op.Prev, err
	}
	dirChanged := func() { changed(dirKey{prefix: pr, dir: path.Dir(rel)}) }
	// Nothing lay on a fresh path when the apply was planned (not in the
	// ledger, not adopted): what lies there now appeared since, and is
	// not the engine's to replace — but for what the engine itself put
	// there before a crash, which a replay finds and goes on from.
	fresh := op.Prev == nil && op.Record != nil && op.Record.Adopted == nil
	owner := func(r *state.LedgerRecord) (int, int, error) {
		uid, err := ids.user(r.Owner)
		if err != nil {
			return 0, 0, err
		}
		gid, err := ids.group(r.Group)
		return uid, gid, err
	}
	switch op.Kind {
	case state.OpWrite, state.OpMkdir, state.OpSymlink, state.OpMeta:
		uid, gid, err := owner(op.Record)
		if err != nil {
			return nil, err
		}
		r := op.Record
		switch op.Kind {
		case state.OpWrite:
			src := writeSource{path: a.stagePath(op.Stage)}
			if op.InJournal {
				src = writeSource{inline: op.Inline, inJournal: true}
			}
			err = a.writeFile(root, name, src, op.Stage, r.Size, modeOf(r), uid, gid, fresh, dirChanged)
		case state.OpMkdir:
			err = a.mkdir(root, name, modeOf(r), uid, gid, fresh, dirChanged)
		case state.OpSymlink:
			err = a.symlink(root, name, r.Digest, uid, gid, fresh, dirChanged)
		case state.OpMeta:
			err = a.meta(root, name, r.Type, modeOf(r), uid, gid)
		}
		if errors.Is(err, errAppeared) {
			return nil, fail(codeUnmanaged, "%s appeared since the apply was planned and is not managed by this engine", op.Path)
		}
		if err != nil {
			return nil, err
		}
		return r, nil
	case state.OpRemove:
		dk, err := look(root, name, false)
		if err != nil {
			return op.Prev, err
		}
		if !dk.exists {
			return nil, nil
		}
		if dk.typ != op.Prev.Type {
			a.log.Warn("path changed type since the engine made it; left in place", slog.String("path", op.Path))
			return nil, nil
		}
		if err := root.Remove(name); err != nil {
			if dk.typ == state.TypeDir && errors.Is(err, syscall.ENOTEMPTY) {
				// Someone put something in it: the directory stays, still
				// the engine's, and goes when empty.
				r := cloneRec(op.Prev)
				r.Retained = true
				return r, nil
			}
			return op.Prev, err
		}
		dirChanged()
		return nil, nil
	case state.OpRestore:
		prior := op.Prev.Adopted
		var err error
		switch prior.Type {
		case state.TypeFile:
			err = a.writeFile(root, name, writeSource{path: a.adoptedPath(prior.Digest)}, prior.Digest, -1, prior.Mode, prior.UID, prior.GID, false, dirChanged)
		case state.TypeSymlink:
			err = a.symlink(root, name, prior.Target, prior.UID, prior.GID, false, dirChanged)
		case state.TypeDir:
			// The directory comes back whatever the resource made of its
			// path (a file or symlink declared over it is removed first).
			err = a.mkdir(root, name, prior.Mode, prior.UID, prior.GID, false, dirChanged)
		}
		if err != nil {
			return op.Prev, err
		}
		return nil, nil
	}
	return op.Prev, fmt.Errorf("unknown op %q", op.Kind)
}

// opFailure is why an op failed, as its module's failure.
func opFailure(p string, err error) *Failure {
	var f *Failure
	if errors.As(err, &f) {
		return f
	}
	var se *symlinkError
	if errors.As(err, &se) {
		return throughSymlink(p, se.path, se.target)
	}
	return fail(codeWrite, "%s: %v", p, err)
}

// fdMeta sets owner and mode on an open descriptor, never on a path, so a
// symlink swapped in meanwhile cannot redirect it. The owner goes first:
// Linux clears the setuid and setgid bits of a file at every chown (root's
// too), so a mode set before it would lose them, and every later pass would
// find the same drift.
func (a *Applier) fdMeta(f *os.File, mode uint32, setMode bool, uid, gid int) error {
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var opErr error
	err = rc.Control(func(fd uintptr) {
		if (uid >= 0 || gid >= 0) && a.canOwn(uid, gid) {
			if opErr = syscall.Fchown(int(fd), uid, gid); opErr != nil {
				return
			}
		}
		if setMode {
			opErr = syscall.Fchmod(int(fd), mode)
		}
	})
	if err != nil {
		return err
	}
	return opErr
}

// writeSource is where a write's content comes from: a staged or adopted
// file, or bytes the journal holds with the op.
type writeSource struct {
	path      string
	inline    []byte
	inJournal bool
}

func (w writeSource) open() (io.ReadCloser, error) {
	if w.inJournal {
		return io.NopCloser(bytes.NewReader(w.inline)), nil
	}
	f, err := os.Open(w.path)
	if err != nil {
		return nil, fmt.Errorf("staged content: %w", err)
	}
	return f, nil
}

// writeFile puts content in place through a temp file beside the path
// (fsynced, then renamed over it); dirChanged is told when the directory
// changed, which the apply fsyncs before it commits. name is a single name
// in root (runOp). On a fresh path (runOp), only a file of this very
// content (digest, of size bytes) may lie already: the engine's own write,
// before a crash.
func (a *Applier) writeFile(root *os.Root, name string, src writeSource, digest string, size int64, mode uint32, uid, gid int, fresh bool, dirChanged func()) error {
	// Not hashed again: Prepare found other content there, and a replay
	// writing content that is already in place writes the same bytes.
	dk, err := look(root, name, false)
	if err != nil {
		return err
	}
	if fresh && dk.exists {
		if dk.typ != state.TypeFile {
			return errAppeared
		}
		if dk, err = look(root, name, true, size); err != nil {
			return err
		}
		if dk.typ != state.TypeFile || dk.digest != digest {
			return errAppeared
		}
	}
	if dk.special != "" {
		return fmt.Errorf("%s is a %s", name, dk.special)
	}
	in, err := src.open()
	if err != nil {
		return fmt.Errorf("%s: %w", digest, err)
	}
	defer in.Close()
	tmp := TempPrefix + randHex()
	f, err := root.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL|syscall.O_NOFOLLOW|syscall.O_CLOEXEC, 0o600)
	if err != nil {
		return err
	}
	ok := false
	defer func() {
		if !ok {
			f.Close()
			root.Remove(tmp)
		}
	}()
	h := sha256.New()
	if _, err := copyBuffered(io.MultiWriter(f, h), in); err != nil {
		return err
	}
	if got := names.DigestOfSum(h.Sum(nil)); got != digest {
		return fmt.Errorf("staged content has digest %s, not %s", got, digest)
	}
	if err := a.fdMeta(f, mode, true, uid, gid); err != nil {
		return err
	}
	if err := f.Sync(); err != nil {
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if dk.typ == state.TypeDir {
		if err := root.Remove(name); err != nil {
			return err
		}
	}
	if err := root.Rename(tmp, name); err != nil {
		return err
	}
	ok = true
	dirChanged()
	return nil
}

// mkdir makes the directory name in root (or finds it) and sets its mode
// and owner. What is not a directory is removed first, unless the path is
// fresh (runOp).
func (a *Applier) mkdir(root *os.Root, name string, mode uint32, uid, gid int, fresh bool, dirChanged func()) error {
	dk, err := look(root, name, false)
	if err != nil {
		return err
	}
	if fresh && dk.exists && dk.typ != state.TypeDir {
		return errAppeared
	}
	if dk.special != "" {
		return fmt.Errorf("%s is a %s", name, dk.special)
	}
	if dk.exists && dk.typ != state.TypeDir {
		if err := root.Remove(name); err != nil {
			return err
		}
		dk.exists = false
	}
	if !dk.exists {
		if err := root.Mkdir(name, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
			return err
		}
		dirChanged()
	}
	return a.meta(root, name, state.TypeDir, mode, uid, gid)
}

// meta sets the mode and owner of name in root.
func (a *Applier) meta(root *os.Root, name, typ string, mode uint32, uid, gid int) error {
	if typ == state.TypeSymlink {
		if (uid >= 0 || gid >= 0) && a.canOwn(uid, gid) {
			return root.Lchown(name, uid, gid)
		}
		return nil
	}
	f, err := root.OpenFile(name, openFlags, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	if t, special := typeOf(fi.Mode()); special != "" || t != typ {
		return fmt.Errorf("%s is a %s%s, not a %s", name, t, special, typ)
	}
	return a.fdMeta(f, mode, true, uid, gid)
}

// symlink puts the symlink name -> target in root through a temp symlink
// renamed over it. On a fresh path (runOp), only this very symlink may lie
// already.
func (a *Applier) symlink(root *os.Root, name, target string, uid, gid int, fresh bool, dirChanged func()) error {
	dk, err := look(root, name, false)
	if err != nil {
		return err
	}
	if dk.typ == state.TypeSymlink && dk.target == target {
		return a.meta(root, name, state.TypeSymlink, 0, uid, gid)
	}
	if fresh && dk.exists {
		return errAppeared
	}
	if dk.special != "" {
		return fmt.Errorf("%s is a %s", name, dk.special)
	}
	tmp := TempPrefix + randHex()
	if err := root.Symlink(target, tmp); err != nil {
		return err
	}
	if err := a.meta(root, tmp, state.TypeSymlink, 0, uid, gid); err != nil {
		root.Remove(tmp)
		return err
	}
	if dk.typ == state.TypeDir {
		if err := root.Remove(name); err != nil {
			root.Remove(tmp)
			return err
		}
	}
	if err := root.Rename(tmp, name); err != nil {
		root.Remove(tmp)
		return err
	}
	dirChanged()
	return nil
}

// dirKey is a directory of a prefix, dir relative to its root.
type dirKey struct {
	prefix *prefix
	dir    string
}

// path is the directory's path on the machine.
func (k dirKey) path() string { return path.Join(k.prefix.path, k.dir) }

// dirSyncs are the directories an apply changed, in the order first
// changed, with the modules whose ops changed each.
type dirSyncs struct {
	order   []dirKey
	modules map[dirKey][]string
}

func (s *dirSyncs) add(k dirKey, module string) {
	ms, ok := s.modules[k]
	if !ok {
		s.order = append(s.order, k)
	}
	for _, m := range ms {
		if m == module {
			return
		}
	}
	s.modules[k] = append(ms, module)
}

// syncDir fsyncs the directory root is.
func syncDir(root *os.Root) error {
	f, err := root.OpenFile(".", os.O_RDONLY|syscall.O_DIRECTORY|syscall.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}
