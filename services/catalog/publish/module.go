// Package publish turns a module directory into a catalog entry, uploads
// its artifacts, records its DONE build and registers it: what `meshctl
// catalog publish` and a CI pipeline do, and what the dev mesh and the
// end-to-end tests call as a Go function.
//
// A module directory holds module.yaml and the files it names:
//
//	module: sshd                  # the module name (a DNS label)
//	version: 9.6.1                # dot-separated numbers
//	packages: [openssh-server]    # informational
//	upgrade:
//	  policy: AUTO                # AUTO, MANUAL or PINNED
//	  why: ""                     # required for MANUAL and PINNED
//	data_paths: [/var/lib/x]      # absolute, clean, sorted: never removed by engines
//	needs:
//	  - module: postgres
//	    selector: {role: db}      # optional node label selector
//	    cap: 4                    # optional, at most 256 (0: 16)
//	    min_version: "16.2"       # optional
//	resources:
//	  - name: config              # the resource id becomes <module>:<name>
//	    type: file                # file, directory or symlink
//	    path: /etc/ssh/sshd_config   # a template over .Node, .Facts and .Params
//	    mode: "0600"              # octal
//	    owner: root
//	    group: root
//	    source: files/sshd_config # content from a file of the directory…
//	    render: true              # …rendered as a template (default) or, false, used as bytes
//	    # text: "inline template"  # or inline template text
//	    # artifact: binary:sshd    # or an artifact of the build
//	    # target: /etc/x          # a symlink's target (a template)
//	    # user_list: true         # the file only lists users
//	artifacts:
//	  - ref: binary:sshd          # kind:name, named by a resource
//	    file: bin/sshd            # the local file to upload (relative to the directory)
//
// Unknown keys are refused. The source digest covers every file under the
// directory (except .git), so it changes with any edit.
package publish

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"

	"mesh.dev/internal/canonical"
	"mesh.dev/internal/lint"
	"mesh.dev/internal/names"
	typev1 "mesh.dev/proto/mesh/type/v1"
)

// ManifestFile is the name of the module file in a module directory.
const ManifestFile = "module.yaml"

// MaxSourceFiles bounds the files of a module directory, and
// MaxSourceBytes their total size: a module is configuration, not a
// dataset; large payloads are artifacts.
const (
	MaxSourceFiles = 10000
	MaxSourceBytes = 64 << 20
)

// ModuleFile is module.yaml.
type ModuleFile struct {
	Module    string         `yaml:"module"`
	Version   string         `yaml:"version"`
	Packages  []string       `yaml:"packages"`
	Upgrade   *UpgradeFile   `yaml:"upgrade"`
	DataPaths []string       `yaml:"data_paths"`
	Needs     []NeedFile     `yaml:"needs"`
	Resources []ResourceFile `yaml:"resources"`
	Artifacts []ArtifactFile `yaml:"artifacts"`
}

// UpgradeFile is a module's upgrade policy.
type UpgradeFile struct {
	Policy string `yaml:"policy"`
	Why    string `yaml:"why"`
}

// NeedFile is one need of a module.
type NeedFile struct {
	Module     string            `yaml:"module"`
	Selector   map[string]string `yaml:"selector"`
	Cap        uint32            `yaml:"cap"`
	MinVersion string            `yaml:"min_version"`
}

// ResourceFile is one resource template of a module.
type ResourceFile struct {
	Name  string `yaml:"name"`
	Type  string `yaml:"type"`
	Path  string `yaml:"path"`
	Mode  Mode   `yaml:"mode"`
	Owner string `yaml:"owner"`
	Group string `yaml:"group"`
	// Exactly one of Text, Source and Artifact for a file.
	Text     *string `yaml:"text"`
	Source   string  `yaml:"source"`
	Render   *bool   `yaml:"render"`
	Artifact string  `yaml:"artifact"`
	Target   string  `yaml:"target"`
	UserList bool    `yaml:"user_list"`
}

// ArtifactFile is an artifact of the module's build and the local file
// holding it.
type ArtifactFile struct {
	Ref  string `yaml:"ref"`
	File string `yaml:"file"`
}

// Mode is a permission mode written in octal ("0644", 0644 or "0o644").
type Mode uint32

// UnmarshalYAML reads the scalar as octal digits, whatever YAML would make
// of it.
func (m *Mode) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind != yaml.ScalarNode {
		return fmt.Errorf("line %d: mode must be octal digits such as \"0644\"", n.Line)
	}
	s := strings.TrimPrefix(strings.TrimPrefix(n.Value, "0o"), "0O")
	v, err := strconv.ParseUint(s, 8, 32)
	if err != nil || v > lint.MaxMode {
		return fmt.Errorf("line %d: mode %q is not octal 0 to 7777", n.Line, n.Value)
	}
	*m = Mode(v)
	return nil
}

// Module is a loaded module directory.
type Module struct {
	// Dir is the directory, as given.
	Dir string
	// Manifest and its canonical bytes.
	Manifest      *typev1.ModuleManifest
	ManifestBytes []byte
	Packages      []string
	// Files are the directory's files as the source digest covers them.
	Files        []names.SourceFile
	SourceDigest string
	// Artifacts are sorted by ref.
	Artifacts []LocalArtifact
	// Warnings are what the local checks found (see Load).
	Warnings []string
}

// LocalArtifact is an artifact the build uploads from a local file.
type LocalArtifact struct {
	Ref    string
	Kind   string
	File   string
	Digest string
	Size   int64
}

// Load reads a module directory: module.yaml, the files it names and the
// source digest over every file. overrides replaces artifact files by ref
// (CI passes the files it built). The manifest is checked as the catalog
// checks it; what is allowed but suspect (world-writable or set-id modes)
// becomes a warning.
func Load(dir string, overrides map[string]string) (*Module, error) {
	mf, err := readModuleFile(filepath.Join(dir, ManifestFile))
	if err != nil {
		return nil, err
	}
	mod := &Module{Dir: dir, Packages: mf.Packages}
	if mod.Files, err = sourceFiles(dir); err != nil {
		return nil, err
	}
	if mod.SourceDigest, err = names.ComputeSourceDigest(mod.Files); err != nil {
		return nil, fmt.Errorf("%s: %w", dir, err)
	}
	if mod.Manifest, err = mf.manifest(dir); err != nil {
		return nil, fmt.Errorf("%s: %w", filepath.Join(dir, ManifestFile), err)
	}
	if err := lint.CheckModuleManifest(mod.Manifest); err != nil {
		return nil, fmt.Errorf("%s: %w", filepath.Join(dir, ManifestFile), err)
	}
	if mod.ManifestBytes, err = canonical.Marshal(mod.Manifest); err != nil {
		return nil, err
	}
	if mod.Artifacts, err = mf.artifacts(dir, lint.ArtifactRefs(mod.Manifest), overrides); err != nil {
		return nil, fmt.Errorf("%s: %w", filepath.Join(dir, ManifestFile), err)
	}
	for i, r := range mod.Manifest.GetResources() {
		if r.GetMode()&0o002 != 0 {
			mod.Warnings = append(mod.Warnings, fmt.Sprintf("resources[%d] (%s) mode %04o is world-writable", i, r.GetName(), r.GetMode()))
		}
		if r.GetMode()&0o6000 != 0 {
			mod.Warnings = append(mod.Warnings, fmt.Sprintf("resources[%d] (%s) mode %04o sets setuid or setgid", i, r.GetName(), r.GetMode()))
		}
	}
	return mod, nil
}

func readModuleFile(file string) (*ModuleFile, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	dec := yaml.NewDecoder(strings.NewReader(string(b)))
	dec.KnownFields(true)
	var mf ModuleFile
	if err := dec.Decode(&mf); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, fmt.Errorf("%s is empty", file)
		}
		return nil, fmt.Errorf("%s: %w", file, err)
	}
	return &mf, nil
}

// sourceFiles lists every regular file under dir (but .git), sorted by
// slash-separated relative path, with git's view of its mode (0755 when any
// execute bit is set, else 0644) so that checkouts with different umasks
// agree on the source digest.
func sourceFiles(dir string) ([]names.SourceFile, error) {
	var files []names.SourceFile
	var total int64
	root := os.DirFS(dir)
	err := fs.WalkDir(root, ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if d.Name() == ".git" {
				return fs.SkipDir
			}
			return nil
		}
		if !d.Type().IsRegular() {
			return fmt.Errorf("%s: %s is not a regular file (only regular files are published)", dir, p)
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		if len(files) == MaxSourceFiles {
			return fmt.Errorf("%s: more than %d files", dir, MaxSourceFiles)
		}
		if total += info.Size(); total > MaxSourceBytes {
			return fmt.Errorf("%s: files over %d bytes in all (large payloads are artifacts)", dir, MaxSourceBytes)
		}
		digest, _, err := fileDigest(filepath.Join(dir, filepath.FromSlash(p)))
		if err != nil {
			return err
		}
		mode := uint32(0o644)
		if info.Mode().Perm()&0o111 != 0 {
			mode = 0o755
		}
		files = append(files, names.SourceFile{Path: p, Mode: mode, Digest: digest})
		return nil
	})
	if err != nil {
		return nil, err
	}
	slices.SortFunc(files, func(a, b names.SourceFile) int { return strings.Compare(a.Path, b.Path) })
	return files, nil
}

// fileDigest returns the digest and size of a file.
func fileDigest(file string) (string, int64, error) {
	f, err := os.Open(file)
	if err != nil {
		return "", 0, err
	}
	defer f.Close()
	h := sha256.New()
	n, err := io.Copy(h, f)
	if err != nil {
		return "", 0, fmt.Errorf("%s: %w", file, err)
	}
	return names.DigestOfSum(h.Sum(nil)), n, nil
}

var resourceTypes = map[string]typev1.ResourceType{
	"file":      typev1.ResourceType_RESOURCE_TYPE_FILE,
	"directory": typev1.ResourceType_RESOURCE_TYPE_DIRECTORY,
	"symlink":   typev1.ResourceType_RESOURCE_TYPE_SYMLINK,
}

var policies = map[string]typev1.UpgradePolicy{
	"AUTO":   typev1.UpgradePolicy_UPGRADE_POLICY_AUTO,
	"MANUAL": typev1.UpgradePolicy_UPGRADE_POLICY_MANUAL,
	"PINNED": typev1.UpgradePolicy_UPGRADE_POLICY_PINNED,
}

// manifest builds the typed manifest, reading sources from dir.
func (mf *ModuleFile) manifest(dir string) (*typev1.ModuleManifest, error) {
	m := &typev1.ModuleManifest{Module: mf.Module, Version: mf.Version, DataPaths: mf.DataPaths}
	if mf.Upgrade != nil {
		p, ok := policies[strings.ToUpper(mf.Upgrade.Policy)]
		if !ok {
			return nil, fmt.Errorf("upgrade.policy %q is not AUTO, MANUAL or PINNED", mf.Upgrade.Policy)
		}
		m.Upgrade = &typev1.Policy{Policy: p, Why: mf.Upgrade.Why}
	}
	for _, n := range mf.Needs {
		need := &typev1.Need{Module: n.Module, Cap: n.Cap, MinVersion: n.MinVersion}
		if len(n.Selector) > 0 {
			need.Selector = &typev1.LabelSelector{MatchLabels: n.Selector}
		}
		m.Needs = append(m.Needs, need)
	}
	for i, r := range mf.Resources {
		field := fmt.Sprintf("resources[%d]", i)
		typ, ok := resourceTypes[r.Type]
		if !ok {
			return nil, fmt.Errorf("%s.type %q is not file, directory or symlink", field, r.Type)
		}
		rt := &typev1.ResourceTemplate{
			Name: r.Name, Type: typ, Path: r.Path, Mode: uint32(r.Mode), Owner: r.Owner, Group: r.Group,
			Target: r.Target, UserList: r.UserList,
		}
		n := 0
		if r.Text != nil {
			n++
			rt.Content = &typev1.ResourceTemplate_Text{Text: *r.Text}
		}
		if r.Source != "" {
			n++
			b, err := readSource(dir, r.Source)
			if err != nil {
				return nil, fmt.Errorf("%s.source: %w", field, err)
			}
			if r.Render == nil || *r.Render {
				rt.Content = &typev1.ResourceTemplate_Text{Text: string(b)}
			} else {
				rt.Content = &typev1.ResourceTemplate_Raw{Raw: b}
			}
		} else if r.Render != nil {
			return nil, fmt.Errorf("%s.render applies to a source only", field)
		}
		if r.Artifact != "" {
			n++
			rt.Content = &typev1.ResourceTemplate_Artifact{Artifact: r.Artifact}
		}
		if n > 1 {
			return nil, fmt.Errorf("%s: give one of text, source and artifact", field)
		}
		m.Resources = append(m.Resources, rt)
	}
	return m, nil
}

// readSource reads a file of the module directory, refusing paths that
// leave it: content must be covered by the source digest.
func readSource(dir, rel string) ([]byte, error) {
	clean := path.Clean(rel)
	if path.IsAbs(rel) || clean == ".." || strings.HasPrefix(clean, "../") || filepath.IsAbs(rel) {
		return nil, fmt.Errorf("%q leaves the module directory", rel)
	}
	return os.ReadFile(filepath.Join(dir, filepath.FromSlash(clean)))
}

// artifacts resolves the artifact files and hashes them; refs are the
// artifacts the manifest's resources name.
func (mf *ModuleFile) artifacts(dir string, refs []string, overrides map[string]string) ([]LocalArtifact, error) {
	files := map[string]string{}
	for i, a := range mf.Artifacts {
		if err := lint.CheckArtifactRef(fmt.Sprintf("artifacts[%d].ref", i), a.Ref); err != nil {
			return nil, err
		}
		if _, dup := files[a.Ref]; dup {
			return nil, fmt.Errorf("artifacts[%d].ref %q is listed twice", i, a.Ref)
		}
		if !slices.Contains(refs, a.Ref) {
			return nil, fmt.Errorf("artifacts[%d].ref %q is named by no resource", i, a.Ref)
		}
		f := a.File
		if f != "" && !filepath.IsAbs(f) {
			f = filepath.Join(dir, filepath.FromSlash(f))
		}
		files[a.Ref] = f
	}
	for ref, f := range overrides {
		if !slices.Contains(refs, ref) {
			return nil, fmt.Errorf("artifact %q given on the command line is named by no resource", ref)
		}
		files[ref] = f
	}
	out := make([]LocalArtifact, 0, len(refs))
	for _, ref := range refs {
		f := files[ref]
		if f == "" {
			return nil, fmt.Errorf("artifact %q is named by a resource but no artifacts entry gives its file", ref)
		}
		digest, size, err := fileDigest(f)
		if err != nil {
			return nil, fmt.Errorf("artifact %s: %w", ref, err)
		}
		if size > lint.MaxArtifactSize {
			return nil, fmt.Errorf("artifact %s: %s is %d bytes, over the limit of %d", ref, f, size, lint.MaxArtifactSize)
		}
		kind, _, _ := strings.Cut(ref, ":")
		out = append(out, LocalArtifact{Ref: ref, Kind: kind, File: f, Digest: digest, Size: size})
	}
	return out, nil
}
