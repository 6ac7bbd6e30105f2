package lint

import (
	"bytes"
	"fmt"
	"path"
	"slices"
	"strings"
	"unicode/utf8"

	"google.golang.org/protobuf/proto"

	"mesh.dev/internal/canonical"
	"mesh.dev/internal/names"
	catalogv1 "mesh.dev/proto/mesh/catalog/v1"
	typev1 "mesh.dev/proto/mesh/type/v1"
)

// Limits of catalog entries and builds (DESIGN.md §3, §8).
const (
	// MaxEntrySize is the largest encoded entry: one KV value.
	MaxEntrySize = MaxKVValue
	// MaxRepositoryLen bounds an entry's repository.
	MaxRepositoryLen = 1024
	// MaxSourcePathLen bounds an entry's path in its repository.
	MaxSourcePathLen = 1024
	// MaxPackages is the most packages an entry may list.
	MaxPackages = 256
	// MaxPackageLen bounds one package name.
	MaxPackageLen = 128
	// MaxVerdictInputs is the most problems, warnings or unknowns an entry
	// may list, each.
	MaxVerdictInputs = 256
	// MaxVerdictInputLen bounds one problem, warning or unknown.
	MaxVerdictInputLen = 1024
	// MaxReasonLen bounds a build's reason.
	MaxReasonLen = 4096
	// MaxArtifactSize is the largest artifact the catalog stores.
	MaxArtifactSize = MaxObjectSize
)

// CheckEntry checks a catalog entry as the catalog takes it and a node
// engine receives it: every field's form; the manifest is canonical bytes of
// a valid module manifest of the entry's module, manifest_digest is their
// digest and needs are the manifest's; the verdict agrees with its inputs;
// the artifacts are sorted and exactly those the manifest's resources name;
// the fingerprint is the one recomputed (DESIGN.md §3; the commit and
// created_at are not part of it). It returns the decoded manifest. Errors
// are *Error naming the field, e.g. "entry.manifest.resources[0].path".
func CheckEntry(e *catalogv1.Entry) (*typev1.ModuleManifest, error) {
	if e == nil {
		return nil, errf("entry", "is required")
	}
	if err := names.CheckFingerprint("entry.fingerprint", e.GetFingerprint()); err != nil {
		return nil, named("entry.fingerprint", err)
	}
	if err := names.CheckModule(e.GetModule()); err != nil {
		return nil, errf("entry.module", "%v", err)
	}
	if err := checkRepository(e.GetRepository()); err != nil {
		return nil, err
	}
	if err := checkSourcePath(e.GetPath()); err != nil {
		return nil, err
	}
	if err := names.CheckDigest("entry.source_digest", e.GetSourceDigest()); err != nil {
		return nil, named("entry.source_digest", err)
	}
	if c := e.GetCommit(); c != "" && !isCommit(c) {
		return nil, errf("entry.commit", "%q is not a full commit id (40 or 64 lowercase hex), or empty", c)
	}

	m, err := checkManifestBytes(e)
	if err != nil {
		return nil, err
	}

	if len(e.GetNeeds()) != len(m.GetNeeds()) {
		return nil, errf("entry.needs", "%d needs, the manifest declares %d: they must be the manifest's needs", len(e.GetNeeds()), len(m.GetNeeds()))
	}
	for i, n := range e.GetNeeds() {
		if !proto.Equal(n, m.GetNeeds()[i]) {
			return nil, errf(fmt.Sprintf("entry.needs[%d]", i), "differs from the manifest's needs[%d]", i)
		}
	}
	if err := checkPackages(e.GetPackages()); err != nil {
		return nil, err
	}
	if err := checkVerdict(e); err != nil {
		return nil, err
	}
	if err := checkDecls(e.GetArtifacts(), ArtifactRefs(m)); err != nil {
		return nil, err
	}

	want := names.ComputeFingerprint(e.GetModule(), e.GetRepository(), e.GetPath(), e.GetSourceDigest(), e.GetManifestDigest())
	if e.GetFingerprint() != want {
		return nil, errf("entry.fingerprint", "%s does not match %s, the fingerprint of module, repository, path, source_digest and manifest_digest", e.GetFingerprint(), want)
	}
	if n := canonical.Size(e); n > MaxEntrySize {
		return nil, errf("entry", "%d bytes encoded, over the limit of %d", n, MaxEntrySize)
	}
	return m, nil
}

// checkManifestBytes decodes the manifest, refusing bytes that are not
// exactly its canonical encoding (everyone digests the same bytes), and
// checks it and its digest.
func checkManifestBytes(e *catalogv1.Entry) (*typev1.ModuleManifest, error) {
	b := e.GetManifest()
	if len(b) == 0 {
		return nil, errf("entry.manifest", "is required (canonical bytes of a mesh.type.v1.ModuleManifest)")
	}
	if len(b) > MaxManifestSize {
		return nil, errf("entry.manifest", "%d bytes, over the limit of %d", len(b), MaxManifestSize)
	}
	m := &typev1.ModuleManifest{}
	if err := canonical.Decode(b, m); err != nil {
		return nil, errf("entry.manifest", "%v", err)
	}
	again, err := canonical.Marshal(m)
	if err != nil {
		return nil, errf("entry.manifest", "%v", err)
	}
	if !bytes.Equal(again, b) {
		return nil, errf("entry.manifest", "is not canonical: the canonical bytes of the manifest it decodes to differ (%d bytes, not %d)", len(again), len(b))
	}
	if err := checkModuleManifest("entry.manifest.", m); err != nil {
		return nil, err
	}
	if m.GetModule() != e.GetModule() {
		return nil, errf("entry.manifest.module", "%q is not the entry's module %q", m.GetModule(), e.GetModule())
	}
	if d := names.Digest(b); e.GetManifestDigest() != d {
		return nil, errf("entry.manifest_digest", "%q is not the digest of entry.manifest (%s)", e.GetManifestDigest(), d)
	}
	return m, nil
}

func isCommit(s string) bool {
	if len(s) != 40 && len(s) != 64 {
		return false
	}
	return strings.Trim(s, "0123456789abcdef") == ""
}

// checkRepository checks a repository: 1 to MaxRepositoryLen bytes of
// UTF-8 without spaces or control characters (a URL or a host/path name).
func checkRepository(s string) error {
	if s == "" || len(s) > MaxRepositoryLen {
		return errf("entry.repository", "must be 1 to %d bytes, e.g. https://git.example/infra", MaxRepositoryLen)
	}
	if !utf8.ValidString(s) {
		return errf("entry.repository", "is not valid UTF-8")
	}
	for _, r := range s {
		if r <= ' ' || r == 0x7f {
			return errf("entry.repository", "%q holds a space or control character", s)
		}
	}
	return nil
}

// checkSourcePath checks the module's directory in its repository: "." or a
// clean relative slash-separated path that stays inside the repository.
func checkSourcePath(p string) error {
	const field = "entry.path"
	switch {
	case p == "":
		return errf(field, "is required (the module's directory in the repository, or .)")
	case len(p) > MaxSourcePathLen:
		return errf(field, "is %d bytes, over the limit of %d", len(p), MaxSourcePathLen)
	case !utf8.ValidString(p):
		return errf(field, "is not valid UTF-8")
	case strings.HasPrefix(p, "/"):
		return errf(field, "%q is absolute; it is relative to the repository's root", p)
	case path.Clean(p) != p:
		return errf(field, "%q is not clean (want %q)", p, path.Clean(p))
	case p == ".." || strings.HasPrefix(p, "../"):
		return errf(field, "%q leaves the repository", p)
	}
	for _, r := range p {
		if r < ' ' || r == 0x7f || r == '\\' {
			return errf(field, "%q holds a control character or backslash", p)
		}
	}
	return nil
}

func checkPackages(pkgs []string) error {
	if len(pkgs) > MaxPackages {
		return errf("entry.packages", "%d packages, over the limit of %d", len(pkgs), MaxPackages)
	}
	seen := map[string]int{}
	for i, p := range pkgs {
		f := fmt.Sprintf("entry.packages[%d]", i)
		if p == "" || len(p) > MaxPackageLen || !utf8.ValidString(p) {
			return errf(f, "must be 1 to %d bytes of UTF-8", MaxPackageLen)
		}
		for _, r := range p {
			if r <= ' ' || r == 0x7f {
				return errf(f, "%q holds a space or control character", p)
			}
		}
		if j, ok := seen[p]; ok {
			return errf(f, "%q repeats entry.packages[%d]", p, j)
		}
		seen[p] = i
	}
	return nil
}

// checkVerdict checks the verdict against its inputs: PASS has none, WARN
// has warnings or unknowns and no problems, FAIL has problems. A builder
// therefore cannot call a build with problems a pass.
func checkVerdict(e *catalogv1.Entry) error {
	lists := []struct {
		field string
		items []string
	}{{"entry.problems", e.GetProblems()}, {"entry.warnings", e.GetWarnings()}, {"entry.unknown", e.GetUnknown()}}
	for _, l := range lists {
		if len(l.items) > MaxVerdictInputs {
			return errf(l.field, "%d items, over the limit of %d", len(l.items), MaxVerdictInputs)
		}
		for i, s := range l.items {
			f := fmt.Sprintf("%s[%d]", l.field, i)
			if strings.TrimSpace(s) == "" {
				return errf(f, "is empty")
			}
			if err := checkText(f, s, MaxVerdictInputLen); err != nil {
				return err
			}
		}
	}
	problems, notes := len(e.GetProblems()), len(e.GetWarnings())+len(e.GetUnknown())
	switch v := e.GetVerdict(); v {
	case catalogv1.Verdict_VERDICT_PASS:
		if problems+notes > 0 {
			return errf("entry.verdict", "PASS with %d problems, %d warnings and %d unknown (want WARN or FAIL)", problems, len(e.GetWarnings()), len(e.GetUnknown()))
		}
	case catalogv1.Verdict_VERDICT_WARN:
		if problems > 0 {
			return errf("entry.verdict", "WARN with %d problems (want FAIL)", problems)
		}
		if notes == 0 {
			return errf("entry.verdict", "WARN with no warnings and no unknown (want PASS)")
		}
	case catalogv1.Verdict_VERDICT_FAIL:
		if problems == 0 {
			return errf("entry.verdict", "FAIL names no problems")
		}
	default:
		return errf("entry.verdict", "%v is not PASS, WARN or FAIL", v)
	}
	return nil
}

// checkDecls checks an entry's artifact declarations: sorted by ref,
// unique, kind agreeing with the ref, and exactly the refs the manifest's
// resources name.
func checkDecls(decls []*catalogv1.ArtifactDecl, refs []string) error {
	if len(decls) > MaxParts {
		return errf("entry.artifacts", "%d artifacts, over the limit of %d", len(decls), MaxParts)
	}
	declared := make([]string, 0, len(decls))
	for i, d := range decls {
		f := fmt.Sprintf("entry.artifacts[%d]", i)
		if err := CheckArtifactRef(f+".ref", d.GetRef()); err != nil {
			return err
		}
		if i > 0 && decls[i-1].GetRef() >= d.GetRef() {
			return errf(f+".ref", "%q is not sorted and unique", d.GetRef())
		}
		kind, _, _ := strings.Cut(d.GetRef(), ":")
		if d.GetKind() != kind {
			return errf(f+".kind", "%q is not the kind of ref %q (%q)", d.GetKind(), d.GetRef(), kind)
		}
		if !slices.Contains(refs, d.GetRef()) {
			return errf(f+".ref", "%q is named by no resource of the manifest", d.GetRef())
		}
		declared = append(declared, d.GetRef())
	}
	for _, ref := range refs {
		if !slices.Contains(declared, ref) {
			return errf("entry.artifacts", "the manifest names artifact %q, which the entry does not declare", ref)
		}
	}
	return nil
}

// CheckBuildArtifacts checks the form of a build's artifacts: sorted by ref,
// unique, valid refs, digests and sizes.
func CheckBuildArtifacts(field string, arts []*typev1.Artifact) error {
	if len(arts) > MaxParts {
		return errf(field, "%d artifacts, over the limit of %d", len(arts), MaxParts)
	}
	for i, a := range arts {
		f := fmt.Sprintf("%s[%d]", field, i)
		if err := CheckArtifactRef(f+".ref", a.GetRef()); err != nil {
			return err
		}
		if i > 0 && arts[i-1].GetRef() >= a.GetRef() {
			return errf(f+".ref", "%q is not sorted and unique", a.GetRef())
		}
		if err := names.CheckDigest(f+".digest", a.GetDigest()); err != nil {
			return named(f+".digest", err)
		}
		if s := a.GetSize(); s < 0 || s > MaxArtifactSize {
			return errf(f+".size", "%d is outside 0..%d", s, MaxArtifactSize)
		}
	}
	return nil
}

// CheckReason checks a build's reason.
func CheckReason(field, s string) error { return checkText(field, s, MaxReasonLen) }
