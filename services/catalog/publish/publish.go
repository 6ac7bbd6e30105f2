package publish

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/url"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"mesh.dev/internal/names"
	catalogv1 "mesh.dev/proto/mesh/catalog/v1"
	typev1 "mesh.dev/proto/mesh/type/v1"
)

// Client is the part of the catalog client publishing uses; a
// catalogv1.CatalogServiceClient is one. The caller needs the builder role
// (uploads and builds are the builders').
type Client interface {
	Uploader
	GetEntry(ctx context.Context, in *catalogv1.GetEntryRequest, opts ...grpc.CallOption) (*catalogv1.GetEntryResponse, error)
	PutEntry(ctx context.Context, in *catalogv1.PutEntryRequest, opts ...grpc.CallOption) (*catalogv1.PutEntryResponse, error)
	GetBuild(ctx context.Context, in *catalogv1.GetBuildRequest, opts ...grpc.CallOption) (*catalogv1.GetBuildResponse, error)
	PutBuild(ctx context.Context, in *catalogv1.PutBuildRequest, opts ...grpc.CallOption) (*catalogv1.PutBuildResponse, error)
	RegisterModule(ctx context.Context, in *catalogv1.RegisterModuleRequest, opts ...grpc.CallOption) (*catalogv1.RegisterModuleResponse, error)
}

// Options says where a module comes from and what else to do. The zero
// value asks git.
type Options struct {
	// Repository is part of the fingerprint. Default: git's remote
	// "origin" (credentials removed); else file://<git root>; else
	// file://<the directory's parent>.
	Repository string
	// Path is the module's directory in the repository, part of the
	// fingerprint. Default: relative to the git root; else the directory's
	// name.
	Path string
	// Commit is the commit recorded in a new entry. Default: git HEAD when
	// the module directory has no uncommitted change, else none.
	Commit string
	// NoGit never runs git.
	NoGit bool
	// Problems, Warnings and Unknown are what external checks found; they
	// make the verdict (problems: FAIL; warnings or unknown: WARN).
	Problems, Warnings, Unknown []string
	// Artifacts replaces artifact files by ref.
	Artifacts map[string]string
	// NoRegister records the entry and the build but registers nothing.
	NoRegister bool
}

// Result says what publishing did.
type Result struct {
	Module      string
	Fingerprint string
	Entry       *catalogv1.Entry
	// EntryCreated is false when the catalog held the entry already (it
	// keeps the first commit with that source).
	EntryCreated bool
	// Uploaded is how many artifacts were stored (held ones are not).
	Uploaded int
	// BuildRecorded is false when the build was DONE already.
	BuildRecorded bool
	// Registered is true when the registration changed.
	Registered   bool
	Registration *catalogv1.Registration
	// Notes say what was kept as the catalog held it.
	Notes []string
}

// Changed reports whether publishing changed anything in the catalog.
func (r *Result) Changed() bool {
	return r.EntryCreated || r.Uploaded > 0 || r.BuildRecorded || r.Registered
}

// ErrFailed marks a module whose verdict is FAIL: its entry and build are
// recorded, but it is not registered.
var ErrFailed = errors.New("verdict FAIL")

// Dir publishes the module in dir: it builds the entry (source digest,
// canonical manifest, fingerprint), puts it unless the catalog holds it,
// uploads the artifacts the catalog does not hold, records the DONE build
// unless it is DONE, and registers the module at the fingerprint. Run again
// with nothing changed, it changes nothing.
func Dir(ctx context.Context, c Client, dir string, opts Options) (*Result, error) {
	mod, err := Load(dir, opts.Artifacts)
	if err != nil {
		return nil, err
	}
	return Publish(ctx, c, mod, opts)
}

// Publish is Dir for a loaded module.
func Publish(ctx context.Context, c Client, mod *Module, opts Options) (*Result, error) {
	entry, notes, err := NewEntry(ctx, mod, opts)
	if err != nil {
		return nil, err
	}
	fp := entry.GetFingerprint()
	res := &Result{Module: entry.GetModule(), Fingerprint: fp, Entry: entry, Notes: notes}
	fail := func(step string, err error) (*Result, error) {
		return res, fmt.Errorf("publish %s (%s): %s: %w", mod.Dir, fp, step, err)
	}

	held, err := c.GetEntry(ctx, &catalogv1.GetEntryRequest{Fingerprint: fp})
	switch status.Code(err) {
	case codes.OK:
		res.Entry = held.GetEntry()
		if held.GetEntry().GetCommit() != entry.GetCommit() {
			res.Notes = append(res.Notes, fmt.Sprintf("the entry is held with commit %q, the first with this source", held.GetEntry().GetCommit()))
		}
	case codes.NotFound:
		put, err := c.PutEntry(ctx, &catalogv1.PutEntryRequest{Entry: entry})
		if err != nil {
			return fail("put entry", err)
		}
		res.EntryCreated = put.GetCreated()
	default:
		return fail("get entry", err)
	}

	if err := publishBuild(ctx, c, mod, res); err != nil {
		return fail("build", err)
	}
	if res.Entry.GetVerdict() == catalogv1.Verdict_VERDICT_FAIL {
		return res, fmt.Errorf("publish %s (%s): %w (%s): the entry and build are recorded; the module is not registered",
			mod.Dir, fp, ErrFailed, strings.Join(res.Entry.GetProblems(), "; "))
	}
	if opts.NoRegister {
		return res, nil
	}
	reg, err := c.RegisterModule(ctx, &catalogv1.RegisterModuleRequest{Module: res.Module, Fingerprint: fp})
	if err != nil {
		return fail("register", err)
	}
	res.Registered, res.Registration = reg.GetChanged(), reg.GetRegistration()
	return res, nil
}

// publishBuild uploads the artifacts and records the DONE build, unless the
// build is DONE already.
func publishBuild(ctx context.Context, c Client, mod *Module, res *Result) error {
	b, err := c.GetBuild(ctx, &catalogv1.GetBuildRequest{Fingerprint: res.Fingerprint})
	switch status.Code(err) {
	case codes.OK:
		if b.GetBuild().GetState() == catalogv1.BuildState_BUILD_STATE_DONE {
			for _, held := range b.GetBuild().GetArtifacts() {
				for _, local := range mod.Artifacts {
					if local.Ref == held.GetRef() && local.Digest != held.GetDigest() {
						res.Notes = append(res.Notes, fmt.Sprintf("artifact %s: the DONE build holds %s; %s (%s) is not used",
							held.GetRef(), held.GetDigest(), local.File, local.Digest))
					}
				}
			}
			return nil
		}
	case codes.NotFound:
	default:
		return err
	}
	arts := make([]*typev1.Artifact, 0, len(mod.Artifacts))
	for _, a := range mod.Artifacts {
		up, err := UploadFile(ctx, c, a.File)
		if err != nil {
			return fmt.Errorf("artifact %s: %w", a.Ref, err)
		}
		if up.GetDigest() != a.Digest {
			return fmt.Errorf("artifact %s: %s changed since it was hashed", a.Ref, a.File)
		}
		if up.GetCreated() {
			res.Uploaded++
		}
		arts = append(arts, &typev1.Artifact{Ref: a.Ref, Digest: a.Digest, Size: a.Size})
	}
	if _, err := c.PutBuild(ctx, &catalogv1.PutBuildRequest{Build: &catalogv1.Build{
		Fingerprint: res.Fingerprint, State: catalogv1.BuildState_BUILD_STATE_DONE, Artifacts: arts,
	}}); err != nil {
		return err
	}
	res.BuildRecorded = true
	return nil
}

// NewEntry builds the entry of a loaded module: repository, path and commit
// from opts or git, the verdict from opts' checks and the module's
// warnings, and the fingerprint. It also returns notes on what git said.
func NewEntry(ctx context.Context, mod *Module, opts Options) (*catalogv1.Entry, []string, error) {
	src, notes, err := source(ctx, mod.Dir, opts)
	if err != nil {
		return nil, nil, err
	}
	e := &catalogv1.Entry{
		Module: mod.Manifest.GetModule(), Repository: src.repository, Path: src.path, SourceDigest: mod.SourceDigest,
		Commit: src.commit, Manifest: mod.ManifestBytes, ManifestDigest: names.Digest(mod.ManifestBytes),
		Needs: mod.Manifest.GetNeeds(), Packages: mod.Packages,
		Problems: opts.Problems, Warnings: append(append([]string{}, mod.Warnings...), opts.Warnings...), Unknown: opts.Unknown,
	}
	switch {
	case len(e.Problems) > 0:
		e.Verdict = catalogv1.Verdict_VERDICT_FAIL
	case len(e.Warnings)+len(e.Unknown) > 0:
		e.Verdict = catalogv1.Verdict_VERDICT_WARN
	default:
		e.Verdict = catalogv1.Verdict_VERDICT_PASS
	}
	for _, a := range mod.Artifacts {
		e.Artifacts = append(e.Artifacts, &catalogv1.ArtifactDecl{Ref: a.Ref, Kind: a.Kind})
	}
	e.Fingerprint = names.ComputeFingerprint(e.Module, e.Repository, e.Path, e.SourceDigest, e.ManifestDigest)
	return e, notes, nil
}

type sourceInfo struct {
	repository, path, commit string
}

// gitTimeout bounds each git command.
const gitTimeout = 10 * time.Second

// source works out repository, path and commit.
func source(ctx context.Context, dir string, opts Options) (sourceInfo, []string, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return sourceInfo{}, nil, err
	}
	s := sourceInfo{repository: opts.Repository, path: opts.Path, commit: opts.Commit}
	var notes []string
	root := ""
	if !opts.NoGit {
		root, _ = git(ctx, abs, "rev-parse", "--show-toplevel")
	}
	if root != "" {
		if s.repository == "" {
			if origin, err := git(ctx, abs, "remote", "get-url", "origin"); err == nil && origin != "" {
				s.repository = withoutCredentials(origin)
			} else {
				s.repository = "file://" + filepath.ToSlash(root)
			}
		}
		if s.path == "" {
			rel, err := filepath.Rel(root, evalSymlinks(abs))
			if err != nil {
				return sourceInfo{}, nil, err
			}
			s.path = filepath.ToSlash(rel)
		}
		if s.commit == "" {
			dirty, _ := git(ctx, abs, "status", "--porcelain", "--", ".")
			head, err := git(ctx, abs, "rev-parse", "HEAD")
			switch {
			case err != nil:
				notes = append(notes, "git has no commit yet; the entry carries none")
			case dirty != "":
				notes = append(notes, "the module directory has uncommitted changes; the entry carries no commit")
			default:
				s.commit = head
			}
		}
	} else {
		if s.repository == "" {
			s.repository = "file://" + filepath.ToSlash(filepath.Dir(abs))
		}
		if s.path == "" {
			s.path = filepath.Base(abs)
		}
	}
	return s, notes, nil
}

func evalSymlinks(p string) string {
	if r, err := filepath.EvalSymlinks(p); err == nil {
		return r
	}
	return p
}

// git runs git in dir and returns its trimmed output.
func git(ctx context.Context, dir string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, gitTimeout)
	defer cancel()
	var out, errOut bytes.Buffer
	cmd := exec.CommandContext(ctx, "git", append([]string{"-C", dir}, args...)...)
	cmd.Stdout, cmd.Stderr = &out, &errOut
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("git %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(errOut.String()))
	}
	return strings.TrimSpace(out.String()), nil
}

// withoutCredentials drops a user and password from a remote URL: they must
// not end up in a fingerprint.
func withoutCredentials(remote string) string {
	u, err := url.Parse(remote)
	if err != nil || u.User == nil || u.Scheme == "" {
		return remote
	}
	u.User = nil
	return u.String()
}
