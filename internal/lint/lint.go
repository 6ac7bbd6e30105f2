// Package lint checks the form of what mesh signs and applies, and holds the
// explicit limits of DESIGN.md §8. The signer lints before signing, the
// composer before asking, and node engines again before applying, so a
// malformed composition is refused wherever it appears.
package lint

import (
	"fmt"
	"strings"

	"mesh.dev/internal/canonical"
	"mesh.dev/internal/names"
	typev1 "mesh.dev/proto/mesh/type/v1"
)

// Limits. Each is explicit so a refusal can name it.
const (
	// MaxInlineContent is the largest inline file content; larger content
	// moves to the object store (DESIGN.md §5.2).
	MaxInlineContent = 64 << 10
	// MaxCompositionSize is the largest encoded composition.
	MaxCompositionSize = 256 << 10
	// MaxKVValue is the largest value any bucket holds.
	MaxKVValue = 1 << 20
	// MaxResources is the most resources one composition may hold.
	MaxResources = 4096
	// MaxBatch is the most items one sign request may carry.
	MaxBatch = 1000
	// MaxWants is the most wants one manifest may carry.
	MaxWants = 512
	// MaxParts is the most artifact parts one want may carry.
	MaxParts = 64
	// MaxObjectSize is the largest object a composition may name.
	MaxObjectSize = 1 << 30
	// MaxNameLen bounds the name part of an artifact ref.
	MaxNameLen = 128
	// MaxAccountLen bounds owners, groups and accounts: Linux's utmp user
	// name size.
	MaxAccountLen = 32
	// MaxMode is the largest permission value (setuid, setgid, sticky and
	// rwx for all).
	MaxMode = 0o7777
)

// Error is a lint failure naming the field it found wrong.
type Error struct {
	Field string
	Msg   string
	// named is set when Msg already names the field.
	named bool
}

func (e *Error) Error() string {
	if e.named {
		return e.Msg
	}
	return e.Field + ": " + e.Msg
}

// named wraps an error whose message already names the field.
func named(field string, err error) error {
	if err == nil {
		return nil
	}
	return &Error{Field: field, Msg: err.Error(), named: true}
}

func errf(field, format string, args ...any) error {
	return &Error{Field: field, Msg: fmt.Sprintf(format, args...)}
}

// CheckComposition checks a composition's form: names, key fields, each
// resource, sorted unique paths, the node's own fields only on the node's
// own, and the encoded size.
func CheckComposition(c *typev1.Composition) error {
	if err := names.CheckNode(c.GetNode()); err != nil {
		return errf("node", "%v", err)
	}
	own := c.GetModule() == names.NodeModule
	if own {
		if c.GetFingerprint() != "" {
			return errf("fingerprint", "the node's own composition has no fingerprint, got %q", c.GetFingerprint())
		}
		if c.GetData() || len(c.GetDataPaths()) > 0 {
			return errf("data", "the node's own composition holds no data paths")
		}
	} else {
		if err := names.CheckModule(c.GetModule()); err != nil {
			return errf("module", "%v", err)
		}
		if err := names.CheckFingerprint("fingerprint", c.GetFingerprint()); err != nil {
			return errf("fingerprint", "%v", err)
		}
		if len(c.GetAdoption()) > 0 {
			return errf("adoption", "only the node's own composition adopts paths")
		}
		if c.GetProvisionerAccount() != "" {
			return errf("provisioner_account", "only the node's own composition names a provisioner account")
		}
		if c.GetData() != (len(c.GetDataPaths()) > 0) {
			return errf("data", "the data flag is %v with %d data paths", c.GetData(), len(c.GetDataPaths()))
		}
	}
	if n := len(c.GetResources()); n > MaxResources {
		return errf("resources", "%d resources, over the limit of %d", n, MaxResources)
	}
	for i, r := range c.GetResources() {
		field := fmt.Sprintf("resources[%d]", i)
		if err := CheckResource(field, r); err != nil {
			return err
		}
		if own {
			if r.GetModule() != "" {
				return errf(field+".module", "a resource of the node's own composition has no module, got %q", r.GetModule())
			}
		} else if r.GetModule() != c.GetModule() || names.ModuleOfID(r.GetId()) != c.GetModule() {
			return errf(field, "resource %s (module %q) is not of module %q", r.GetId(), r.GetModule(), c.GetModule())
		}
		if i > 0 {
			prev := c.GetResources()[i-1]
			if prev.GetPath() == r.GetPath() {
				return errf(field+".path", "2 resources declare %s: %s, %s", r.GetPath(), prev.GetId(), r.GetId())
			}
			if prev.GetPath() > r.GetPath() {
				return errf(field+".path", "resources are not sorted by path at %s", r.GetPath())
			}
		}
	}
	for _, list := range []struct {
		field string
		paths []string
	}{{"filled", c.GetFilled()}, {"adoption", c.GetAdoption()}, {"data_paths", c.GetDataPaths()}} {
		if err := CheckPathList(list.field, list.paths); err != nil {
			return err
		}
	}
	if err := checkName("provisioner_account", c.GetProvisionerAccount()); err != nil {
		return err
	}
	if n := canonical.Size(c); n > MaxCompositionSize {
		return errf("composition", "%d bytes encoded, over the limit of %d", n, MaxCompositionSize)
	}
	return nil
}

// CheckResource checks one rendered resource.
func CheckResource(field string, r *typev1.Resource) error {
	if err := names.CheckResourceID(r.GetId()); err != nil {
		return errf(field+".id", "%v", err)
	}
	if err := names.CheckPath(field+".path", r.GetPath()); err != nil {
		return named(field+".path", err)
	}
	if r.GetPath() == "/" {
		return errf(field+".path", "the root directory cannot be a resource")
	}
	if r.GetMode() > MaxMode {
		return errf(field+".mode", "%o is over %o", r.GetMode(), MaxMode)
	}
	if err := checkName(field+".owner", r.GetOwner()); err != nil {
		return err
	}
	if err := checkName(field+".group", r.GetGroup()); err != nil {
		return err
	}
	switch r.GetType() {
	case typev1.ResourceType_RESOURCE_TYPE_FILE:
		if r.GetTarget() != "" {
			return errf(field+".target", "a file has no target")
		}
		switch c := r.GetContent().(type) {
		case *typev1.Resource_Inline:
			if n := len(c.Inline); n > MaxInlineContent {
				return errf(field+".inline", "%d bytes inline, over the limit of %d (move it to the object store)", n, MaxInlineContent)
			}
		case *typev1.Resource_Object:
			if err := names.CheckDigest(field+".object.digest", c.Object.GetDigest()); err != nil {
				return named(field+".object.digest", err)
			}
			if s := c.Object.GetSize(); s < 0 || s > MaxObjectSize {
				return errf(field+".object.size", "%d is outside 0..%d", s, MaxObjectSize)
			}
		case *typev1.Resource_Artifact:
			if err := CheckArtifactRef(field+".artifact", c.Artifact); err != nil {
				return err
			}
		default:
			return errf(field+".content", "a file needs inline, object or artifact content")
		}
	case typev1.ResourceType_RESOURCE_TYPE_DIRECTORY:
		if r.GetContent() != nil || r.GetTarget() != "" {
			return errf(field, "a directory has no content and no target")
		}
	case typev1.ResourceType_RESOURCE_TYPE_SYMLINK:
		if r.GetContent() != nil {
			return errf(field+".content", "a symlink has no content")
		}
		t := r.GetTarget()
		if t == "" || len(t) > names.MaxPathLen || strings.IndexByte(t, 0) >= 0 {
			return errf(field+".target", "a symlink needs a target of 1 to %d bytes without NUL", names.MaxPathLen)
		}
	default:
		return errf(field+".type", "%v is not FILE, DIRECTORY or SYMLINK", r.GetType())
	}
	if r.GetUserList() && r.GetType() != typev1.ResourceType_RESOURCE_TYPE_FILE {
		return errf(field+".user_list", "only a file can be a user list")
	}
	return nil
}

// CheckPathList checks that every path is absolute and clean and the list is
// sorted and unique.
func CheckPathList(field string, paths []string) error {
	for i, p := range paths {
		f := fmt.Sprintf("%s[%d]", field, i)
		if err := names.CheckPath(f, p); err != nil {
			return named(f, err)
		}
		if i > 0 && paths[i-1] >= p {
			return errf(f, "%q is not sorted and unique", p)
		}
	}
	return nil
}

// CheckArtifactRef checks an artifact ref "kind:name": kind a DNS label, name
// 1 to MaxNameLen characters of [A-Za-z0-9._-] not starting with a dot.
func CheckArtifactRef(field, ref string) error {
	kind, name, ok := strings.Cut(ref, ":")
	if !ok || !names.ValidLabel(kind) {
		return errf(field, "%q is not kind:name with kind a DNS label", ref)
	}
	if name == "" || len(name) > MaxNameLen || name[0] == '.' {
		return errf(field, "%q: name must be 1 to %d characters, not starting with a dot", ref, MaxNameLen)
	}
	for _, r := range name {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '.' || r == '_' || r == '-') {
			return errf(field, "%q: name holds %q (allowed: letters, digits, . _ -)", ref, r)
		}
	}
	return nil
}

// checkName checks an owner, group or account: empty, or 1 to MaxAccountLen characters
// of [a-z0-9_.-] starting with a letter, digit or underscore (POSIX portable
// user names, and numeric ids).
func checkName(field, s string) error {
	if s == "" {
		return nil
	}
	if len(s) > MaxAccountLen {
		return errf(field, "%q is longer than %d characters", s, MaxAccountLen)
	}
	for i, r := range s {
		ok := r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '_' || (i > 0 && (r == '-' || r == '.'))
		if !ok {
			return errf(field, "%q is not a user or group name ([a-z0-9_][a-z0-9_.-]*)", s)
		}
	}
	return nil
}

// CheckWant checks the form of one want of a node (see also
// verify.CheckWants, which checks a whole signed manifest).
func CheckWant(field, node string, w *typev1.Want) error {
	if w.GetModule() == names.NodeModule {
		if w.GetFingerprint() != "" || len(w.GetParts()) > 0 {
			return errf(field, "the node's own want has no fingerprint and no parts")
		}
	} else {
		if err := names.CheckModule(w.GetModule()); err != nil {
			return errf(field+".module", "%v", err)
		}
		if err := names.CheckFingerprint(field+".fingerprint", w.GetFingerprint()); err != nil {
			return named(field+".fingerprint", err)
		}
	}
	key, err := names.CompositionKey(node, w.GetModule(), w.GetFingerprint())
	if err != nil {
		return errf(field, "%v", err)
	}
	if w.GetCompositionKey() != key {
		return errf(field+".composition_key", "%q, want %q", w.GetCompositionKey(), key)
	}
	if err := names.CheckDigest(field+".composition_digest", w.GetCompositionDigest()); err != nil {
		return named(field+".composition_digest", err)
	}
	if len(w.GetParts()) > MaxParts {
		return errf(field+".parts", "%d parts, over the limit of %d", len(w.GetParts()), MaxParts)
	}
	for j, p := range w.GetParts() {
		pf := fmt.Sprintf("%s.parts[%d]", field, j)
		if err := CheckArtifactRef(pf+".ref", p.GetRef()); err != nil {
			return err
		}
		if j > 0 && w.GetParts()[j-1].GetRef() >= p.GetRef() {
			return errf(pf+".ref", "%q is not sorted and unique", p.GetRef())
		}
		if err := names.CheckDigest(pf+".digest", p.GetDigest()); err != nil {
			return named(pf+".digest", err)
		}
		if p.GetSize() < 0 {
			return errf(pf+".size", "negative")
		}
	}
	return nil
}

// CheckWants checks a node's wants: each want, sorted unique modules, at
// most MaxWants.
func CheckWants(node string, wants []*typev1.Want) error {
	if len(wants) > MaxWants {
		return errf("wants", "%d wants, over the limit of %d", len(wants), MaxWants)
	}
	for i, w := range wants {
		field := fmt.Sprintf("wants[%d]", i)
		if err := CheckWant(field, node, w); err != nil {
			return err
		}
		if i > 0 && wants[i-1].GetModule() >= w.GetModule() {
			return errf(field+".module", "%q is not sorted and unique", w.GetModule())
		}
	}
	return nil
}

// CheckAccount checks a user, group or account name as CheckResource checks
// owners: empty, or a POSIX portable name or numeric id.
func CheckAccount(field, s string) error { return checkName(field, s) }
