package lint

import (
	"fmt"
	"path"
	"slices"
	"strings"
	"text/template"
	"text/template/parse"
	"unicode/utf8"

	"mesh.dev/internal/canonical"
	"mesh.dev/internal/names"
	typev1 "mesh.dev/proto/mesh/type/v1"
)

// Limits of module manifests (DESIGN.md §3, §8). Each is explicit so a
// refusal can name it.
const (
	// MaxManifestSize is the largest encoded module manifest; it leaves
	// room in a 1 MiB entry for everything else an entry holds.
	MaxManifestSize = 512 << 10
	// MaxVersionLen bounds a manifest's version and a need's min_version.
	MaxVersionLen = 64
	// MaxVersionPartDigits bounds each dot-separated number of a version,
	// so that every part compares as a uint64.
	MaxVersionPartDigits = 9
	// MaxDataPaths is the most data paths a manifest may declare.
	MaxDataPaths = 256
	// MaxNeeds is the most needs a manifest may declare.
	MaxNeeds = 64
	// MaxNeedCap is the largest cap of one need: how many nodes running the
	// needed module a node hears of (0 means DefaultNeedCap).
	MaxNeedCap = 256
	// DefaultNeedCap is the cap of a need that sets none.
	DefaultNeedCap = 16
	// MaxSelectorLabels is the most labels one need's selector may match.
	MaxSelectorLabels = 16
	// MaxLabelLen bounds a selector's label keys and values.
	MaxLabelLen = 63
	// MaxWhyLen bounds an upgrade policy's why.
	MaxWhyLen = 1024
)

// Template keys: module templates are rendered over exactly these (DESIGN.md
// §4): .Node is the node's name, .Facts and .Params are maps.
var templateKeys = map[string]bool{"Node": true, "Facts": true, "Params": true}

// ParseTemplate parses a module template the one way mesh renders them: Go
// text/template with missingkey=error and no functions beyond the builtins
// (none of which reach outside the template's data). The catalog checks with
// it and the composer renders with it, so a template the catalog accepts
// parses the same when rendered.
func ParseTemplate(name, src string) (*template.Template, error) {
	return template.New(name).Option("missingkey=error").Parse(src)
}

// CheckModuleManifest checks a module manifest's form: module name, version,
// each resource template (name, type, path, mode, owner, group, content,
// target, template syntax), data paths, the upgrade policy, needs and the
// encoded size. Errors are *Error naming the field, e.g. "resources[2].path".
func CheckModuleManifest(m *typev1.ModuleManifest) error {
	return checkModuleManifest("", m)
}

// checkModuleManifest is CheckModuleManifest with every field name prefixed.
func checkModuleManifest(prefix string, m *typev1.ModuleManifest) error {
	if m == nil {
		return errf(strings.TrimSuffix(prefix, "."), "no manifest")
	}
	if err := names.CheckModule(m.GetModule()); err != nil {
		return errf(prefix+"module", "%v", err)
	}
	if err := checkVersion(prefix+"version", m.GetVersion(), true); err != nil {
		return err
	}
	if n := len(m.GetResources()); n > MaxResources {
		return errf(prefix+"resources", "%d resources, over the limit of %d", n, MaxResources)
	}
	byName := map[string]int{}
	byPath := map[string]int{}
	for i, r := range m.GetResources() {
		field := fmt.Sprintf("%sresources[%d]", prefix, i)
		literal, err := checkResourceTemplate(field, r)
		if err != nil {
			return err
		}
		if j, ok := byName[r.GetName()]; ok {
			return errf(field+".name", "%q is also the name of resources[%d]", r.GetName(), j)
		}
		byName[r.GetName()] = i
		// Templated paths can only collide once rendered; the composer
		// refuses that, naming both ids.
		if literal {
			if j, ok := byPath[r.GetPath()]; ok {
				return errf(field+".path", "2 resources declare %s: %s, %s", r.GetPath(),
					names.ResourceID(m.GetModule(), m.GetResources()[j].GetName()), names.ResourceID(m.GetModule(), r.GetName()))
			}
			byPath[r.GetPath()] = i
		}
	}
	if n := len(m.GetDataPaths()); n > MaxDataPaths {
		return errf(prefix+"data_paths", "%d data paths, over the limit of %d", n, MaxDataPaths)
	}
	if err := CheckPathList(prefix+"data_paths", m.GetDataPaths()); err != nil {
		return err
	}
	for i, p := range m.GetDataPaths() {
		if p == "/" {
			return errf(fmt.Sprintf("%sdata_paths[%d]", prefix, i), "the root directory cannot be a data path")
		}
		if !Literal(p) {
			return errf(fmt.Sprintf("%sdata_paths[%d]", prefix, i), "%q: data paths are not templates", p)
		}
	}
	if err := checkPolicy(prefix+"upgrade", m.GetUpgrade()); err != nil {
		return err
	}
	if err := checkNeeds(prefix+"needs", m.GetModule(), m.GetNeeds()); err != nil {
		return err
	}
	if n := canonical.Size(m); n > MaxManifestSize {
		return errf(strings.TrimSuffix(prefix, ".")+"manifest", "%d bytes encoded, over the limit of %d", n, MaxManifestSize)
	}
	return nil
}

// checkVersion checks dot-separated numbers ("1.4.2"); an empty version is
// an error only when required.
func checkVersion(field, v string, required bool) error {
	if v == "" {
		if required {
			return errf(field, "is required (dot-separated numbers, e.g. 1.4.2)")
		}
		return nil
	}
	if len(v) > MaxVersionLen {
		return errf(field, "%q is longer than %d characters", v, MaxVersionLen)
	}
	for _, part := range strings.Split(v, ".") {
		if part == "" || len(part) > MaxVersionPartDigits || strings.Trim(part, "0123456789") != "" {
			return errf(field, "%q is not dot-separated numbers of 1 to %d digits (e.g. 1.4.2)", v, MaxVersionPartDigits)
		}
	}
	return nil
}

// checkResourceTemplate checks one resource template and reports whether its
// path is literal (holds no template action).
func checkResourceTemplate(field string, r *typev1.ResourceTemplate) (literal bool, err error) {
	if err := names.CheckResourceName(r.GetName()); err != nil {
		return false, errf(field+".name", "%v", err)
	}
	literal, err = checkPathTemplate(field+".path", r.GetPath())
	if err != nil {
		return false, err
	}
	if r.GetMode() > MaxMode {
		return false, errf(field+".mode", "%o is over %o", r.GetMode(), MaxMode)
	}
	if err := checkName(field+".owner", r.GetOwner()); err != nil {
		return false, err
	}
	if err := checkName(field+".group", r.GetGroup()); err != nil {
		return false, err
	}
	switch r.GetType() {
	case typev1.ResourceType_RESOURCE_TYPE_FILE:
		if r.GetTarget() != "" {
			return false, errf(field+".target", "a file has no target")
		}
		switch c := r.GetContent().(type) {
		case *typev1.ResourceTemplate_Text:
			if !utf8.ValidString(c.Text) {
				return false, errf(field+".text", "is not valid UTF-8 (use raw for bytes)")
			}
			if _, err := checkTemplate(field+".text", c.Text); err != nil {
				return false, err
			}
		case *typev1.ResourceTemplate_Raw:
		case *typev1.ResourceTemplate_Artifact:
			if err := CheckArtifactRef(field+".artifact", c.Artifact); err != nil {
				return false, err
			}
		default:
			return false, errf(field+".content", "a file needs text, raw or artifact content")
		}
	case typev1.ResourceType_RESOURCE_TYPE_DIRECTORY:
		if r.GetContent() != nil {
			return false, errf(field+".content", "a directory has no content")
		}
		if r.GetTarget() != "" {
			return false, errf(field+".target", "a directory has no target")
		}
	case typev1.ResourceType_RESOURCE_TYPE_SYMLINK:
		if r.GetContent() != nil {
			return false, errf(field+".content", "a symlink has no content")
		}
		if err := checkTargetTemplate(field+".target", r.GetTarget()); err != nil {
			return false, err
		}
	default:
		return false, errf(field+".type", "%v is not FILE, DIRECTORY or SYMLINK", r.GetType())
	}
	if r.GetUserList() && r.GetType() != typev1.ResourceType_RESOURCE_TYPE_FILE {
		return false, errf(field+".user_list", "only a file can be a user list")
	}
	return literal, nil
}

// checkPathTemplate checks the template of an absolute clean path. A
// template without actions must be such a path itself; one with actions must
// start with a literal "/" and be clean with each action standing for one
// path segment, which catches "/etc/{{ .Params.d }}/../shadow" at put time.
// The rendered path is checked again when a node's declaration is made.
func checkPathTemplate(field, src string) (literal bool, err error) {
	if len(src) > names.MaxPathLen {
		return false, errf(field, "is %d bytes, over the limit of %d", len(src), names.MaxPathLen)
	}
	shape, err := checkTemplate(field, src)
	if err != nil {
		return false, err
	}
	if shape == src {
		if err := names.CheckPath(field, src); err != nil {
			return false, named(field, err)
		}
		if src == "/" {
			return false, errf(field, "the root directory cannot be a resource")
		}
		return true, nil
	}
	if !strings.HasPrefix(src, "/") {
		return false, errf(field, "%q does not start with a literal /", src)
	}
	if path.Clean(shape) != shape {
		return false, errf(field, "%q is not clean once each action stands for one path segment (%q)", src, shape)
	}
	return false, nil
}

// checkTargetTemplate checks a symlink target template: required, at most
// MaxPathLen, and clean when it is a literal absolute path.
func checkTargetTemplate(field, src string) error {
	if src == "" {
		return errf(field, "a symlink needs a target")
	}
	if len(src) > names.MaxPathLen {
		return errf(field, "is %d bytes, over the limit of %d", len(src), names.MaxPathLen)
	}
	shape, err := checkTemplate(field, src)
	if err != nil {
		return err
	}
	if strings.IndexByte(shape, 0) >= 0 {
		return errf(field, "holds a NUL byte")
	}
	if shape == src && strings.HasPrefix(src, "/") {
		if err := names.CheckPath(field, src); err != nil {
			return named(field, err)
		}
	}
	return nil
}

// checkTemplate parses src as ParseTemplate does and checks that the fields
// it reads from the top-level data are .Node, .Facts or .Params (a typo
// would otherwise fail on every node at render time). It returns src's shape:
// its top-level text with every other node replaced by "x".
func checkTemplate(field, src string) (string, error) {
	t, err := ParseTemplate(field, src)
	if err != nil {
		return "", errf(field, "template does not parse: %v", trimTemplateErr(field, err))
	}
	if err := checkTemplateWork(field, t); err != nil {
		return "", err
	}
	if t.Tree == nil || t.Tree.Root == nil {
		// A template that only defines others renders nothing.
		return "", nil
	}
	for _, n := range t.Tree.Root.Nodes {
		if err := checkNode(field, n, true); err != nil {
			return "", err
		}
	}
	var shape strings.Builder
	for _, n := range t.Tree.Root.Nodes {
		if tn, ok := n.(*parse.TextNode); ok {
			shape.Write(tn.Text)
		} else {
			shape.WriteString("x")
		}
	}
	return shape.String(), nil
}

// trimTemplateErr drops the "template: <name>:" prefix, which repeats the
// field the error is reported under.
func trimTemplateErr(name string, err error) string {
	if rest, ok := strings.CutPrefix(err.Error(), "template: "+name+":"); ok {
		return "line " + rest
	}
	return err.Error()
}

// checkNode checks the fields a node reads; rootDot says whether dot is the
// template's data at this point (inside range and with it is not).
func checkNode(field string, n parse.Node, rootDot bool) error {
	switch n := n.(type) {
	case *parse.ListNode:
		if n == nil {
			return nil
		}
		for _, c := range n.Nodes {
			if err := checkNode(field, c, rootDot); err != nil {
				return err
			}
		}
	case *parse.ActionNode:
		return checkNode(field, n.Pipe, rootDot)
	case *parse.PipeNode:
		if n == nil {
			return nil
		}
		for _, c := range n.Cmds {
			if err := checkNode(field, c, rootDot); err != nil {
				return err
			}
		}
	case *parse.CommandNode:
		for _, a := range n.Args {
			if err := checkNode(field, a, rootDot); err != nil {
				return err
			}
		}
	case *parse.FieldNode:
		if rootDot {
			return checkKey(field, n.Ident, n.String())
		}
	case *parse.VariableNode:
		// $ is the template's data wherever it appears in the main template.
		if len(n.Ident) > 1 && n.Ident[0] == "$" {
			return checkKey(field, n.Ident[1:], n.String())
		}
	case *parse.IfNode:
		return checkBranch(field, &n.BranchNode, rootDot, rootDot)
	case *parse.RangeNode:
		return checkBranch(field, &n.BranchNode, false, rootDot)
	case *parse.WithNode:
		return checkBranch(field, &n.BranchNode, false, rootDot)
	case *parse.TemplateNode:
		return checkNode(field, n.Pipe, rootDot)
	}
	return nil
}

func checkBranch(field string, b *parse.BranchNode, listDot, elseDot bool) error {
	if err := checkNode(field, b.Pipe, elseDot); err != nil {
		return err
	}
	if err := checkNode(field, b.List, listDot); err != nil {
		return err
	}
	return checkNode(field, b.ElseList, elseDot)
}

// checkKey checks a field chain read from the template's data.
func checkKey(field string, ident []string, text string) error {
	if !templateKeys[ident[0]] {
		return errf(field, "{{ %s }} reads .%s: templates see only .Node, .Facts and .Params", text, ident[0])
	}
	if ident[0] == "Node" && len(ident) > 1 {
		return errf(field, "{{ %s }}: .Node is the node's name, a string with no fields", text)
	}
	return nil
}

// checkPolicy checks an upgrade policy: set, and with a why unless AUTO.
func checkPolicy(field string, p *typev1.Policy) error {
	if p == nil {
		return errf(field, "is required (AUTO, MANUAL or PINNED)")
	}
	switch p.GetPolicy() {
	case typev1.UpgradePolicy_UPGRADE_POLICY_AUTO:
	case typev1.UpgradePolicy_UPGRADE_POLICY_MANUAL, typev1.UpgradePolicy_UPGRADE_POLICY_PINNED:
		if strings.TrimSpace(p.GetWhy()) == "" {
			return errf(field+".why", "%v needs a why", p.GetPolicy())
		}
	default:
		return errf(field+".policy", "%v is not AUTO, MANUAL or PINNED", p.GetPolicy())
	}
	if err := checkText(field+".why", p.GetWhy(), MaxWhyLen); err != nil {
		return err
	}
	return nil
}

// checkNeeds checks a manifest's needs: valid, unique module names other
// than the module's own, caps within MaxNeedCap, selectors and versions.
func checkNeeds(field, module string, needs []*typev1.Need) error {
	if len(needs) > MaxNeeds {
		return errf(field, "%d needs, over the limit of %d", len(needs), MaxNeeds)
	}
	seen := map[string]int{}
	for i, n := range needs {
		f := fmt.Sprintf("%s[%d]", field, i)
		if err := names.CheckModule(n.GetModule()); err != nil {
			return errf(f+".module", "%v", err)
		}
		if n.GetModule() == module {
			return errf(f+".module", "module %q cannot need itself", module)
		}
		if j, ok := seen[n.GetModule()]; ok {
			return errf(f+".module", "%q is also needed by %s[%d]", n.GetModule(), field, j)
		}
		seen[n.GetModule()] = i
		if n.GetCap() > MaxNeedCap {
			return errf(f+".cap", "%d is over the limit of %d", n.GetCap(), MaxNeedCap)
		}
		if err := checkVersion(f+".min_version", n.GetMinVersion(), false); err != nil {
			return err
		}
		labels := n.GetSelector().GetMatchLabels()
		if len(labels) > MaxSelectorLabels {
			return errf(f+".selector", "%d labels, over the limit of %d", len(labels), MaxSelectorLabels)
		}
		for k, v := range labels {
			if !validLabelPart(k, false) {
				return errf(f+".selector", "label key %q is not 1 to %d characters of [A-Za-z0-9._/-]", k, MaxLabelLen)
			}
			if !validLabelPart(v, true) {
				return errf(f+".selector", "label %s value %q is not up to %d characters of [A-Za-z0-9._-]", k, v, MaxLabelLen)
			}
		}
	}
	return nil
}

func validLabelPart(s string, value bool) bool {
	if (!value && s == "") || len(s) > MaxLabelLen {
		return false
	}
	for _, r := range s {
		ok := r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '.' || r == '_' || r == '-' || (!value && r == '/')
		if !ok {
			return false
		}
	}
	return true
}

// checkText checks free text: valid UTF-8 without control characters other
// than newline and tab, at most max bytes.
func checkText(field, s string, max int) error {
	if len(s) > max {
		return errf(field, "is %d bytes, over the limit of %d", len(s), max)
	}
	if !utf8.ValidString(s) {
		return errf(field, "is not valid UTF-8")
	}
	for _, r := range s {
		if (r < ' ' && r != '\n' && r != '\t') || r == 0x7f {
			return errf(field, "holds the control character %U", r)
		}
	}
	return nil
}

// ArtifactRefs returns the artifact refs a manifest's resources name, sorted
// and unique.
func ArtifactRefs(m *typev1.ModuleManifest) []string {
	seen := map[string]bool{}
	var refs []string
	for _, r := range m.GetResources() {
		if a, ok := r.GetContent().(*typev1.ResourceTemplate_Artifact); ok && !seen[a.Artifact] {
			seen[a.Artifact] = true
			refs = append(refs, a.Artifact)
		}
	}
	slices.Sort(refs)
	return refs
}
