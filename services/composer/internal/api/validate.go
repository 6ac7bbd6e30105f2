package api

import (
	"fmt"
	"regexp"

	"google.golang.org/protobuf/proto"

	"mesh.dev/internal/lint"
	"mesh.dev/internal/names"
	composerv1 "mesh.dev/proto/mesh/composer/v1"
	typev1 "mesh.dev/proto/mesh/type/v1"
)

// Limits of a node spec.
const (
	// MaxSpecSize bounds an encoded node spec (it is one KV value).
	MaxSpecSize = 512 << 10
	// MaxParamsSize bounds the encoded facts, and the params of one module.
	MaxParamsSize = 64 << 10
	// MaxPlaced is the most modules one node may place.
	MaxPlaced = 256
	// MaxLabels is the most labels one node may carry.
	MaxLabels = 64
	// MaxWhy bounds the reason given with a policy override.
	MaxWhy = 1024
	// MaxApprovalDigests is the most composition digests one approval may
	// name (a plan's worth for a module; far under one KV value).
	MaxApprovalDigests = 4096
)

var labelKeyRE = regexp.MustCompile(`^[A-Za-z0-9]([A-Za-z0-9._/-]{0,61}[A-Za-z0-9])?$`)
var labelValueRE = regexp.MustCompile(`^([A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?)?$`)

func invalid(field, format string, args ...any) error {
	return &fieldError{field: field, msg: fmt.Sprintf(format, args...)}
}

// fieldError is a validation failure naming its field.
type fieldError struct{ field, msg string }

func (e *fieldError) Error() string { return e.field + ": " + e.msg }

// ValidateSpec checks a node spec and names the first field that is wrong.
func ValidateSpec(s *composerv1.NodeSpec) error {
	if s == nil {
		return invalid("spec", "is required")
	}
	if err := names.CheckNode(s.GetNode()); err != nil {
		return invalid("spec.node", "%v", err)
	}
	if err := ValidateLabels("spec.labels", s.GetLabels()); err != nil {
		return err
	}
	if n := proto.Size(s.GetFacts()); n > MaxParamsSize {
		return invalid("spec.facts", "%d bytes encoded, over the limit of %d", n, MaxParamsSize)
	}
	if len(s.GetModules()) > MaxPlaced {
		return invalid("spec.modules", "%d modules, over the limit of %d", len(s.GetModules()), MaxPlaced)
	}
	placed := map[string]bool{}
	for i, pm := range s.GetModules() {
		field := fmt.Sprintf("spec.modules[%d]", i)
		if err := names.CheckModule(pm.GetModule()); err != nil {
			return invalid(field+".module", "%v", err)
		}
		if placed[pm.GetModule()] {
			return invalid(field+".module", "%s is placed twice", pm.GetModule())
		}
		placed[pm.GetModule()] = true
		if n := proto.Size(pm.GetParams()); n > MaxParamsSize {
			return invalid(field+".params", "%d bytes encoded, over the limit of %d", n, MaxParamsSize)
		}
	}
	paths := map[string]string{}
	for i, r := range s.GetResources() {
		field := fmt.Sprintf("spec.resources[%d]", i)
		check := r
		if in, ok := r.GetContent().(*typev1.Resource_Inline); ok && len(in.Inline) > lint.MaxInlineContent {
			// Writing moves large content to the object store.
			check = proto.Clone(r).(*typev1.Resource)
			check.Content = &typev1.Resource_Inline{}
		}
		if err := lint.CheckResource(field, check); err != nil {
			return err
		}
		if m := r.GetModule(); m != "" {
			if err := names.CheckModule(m); err != nil {
				return invalid(field+".module", "%v", err)
			}
			if names.ModuleOfID(r.GetId()) != m {
				return invalid(field+".id", "%s does not start with its module %s", r.GetId(), m)
			}
		}
		if other, dup := paths[r.GetPath()]; dup {
			return invalid(field+".path", "2 resources declare %s: %s, %s", r.GetPath(), other, r.GetId())
		}
		paths[r.GetPath()] = r.GetId()
	}
	for _, list := range []struct {
		field string
		paths []string
	}{{"spec.adoption", s.GetAdoption()}, {"spec.filled", s.GetFilled()}} {
		for i, p := range list.paths {
			if err := names.CheckPath(fmt.Sprintf("%s[%d]", list.field, i), p); err != nil {
				return invalid(fmt.Sprintf("%s[%d]", list.field, i), "%v", err)
			}
		}
	}
	if err := lint.CheckAccount("spec.provisioner_account", s.GetProvisionerAccount()); err != nil {
		return err
	}
	for m, p := range s.GetPolicies() {
		field := fmt.Sprintf("spec.policies[%s]", m)
		if err := names.CheckModule(m); err != nil {
			return invalid(field, "%v", err)
		}
		switch p.GetPolicy() {
		case typev1.UpgradePolicy_UPGRADE_POLICY_AUTO, typev1.UpgradePolicy_UPGRADE_POLICY_MANUAL, typev1.UpgradePolicy_UPGRADE_POLICY_PINNED:
		case typev1.UpgradePolicy_UPGRADE_POLICY_UNSPECIFIED:
			return invalid(field+".policy", "is unset (AUTO, MANUAL or PINNED)")
		default:
			return invalid(field+".policy", "%d is not AUTO, MANUAL or PINNED", p.GetPolicy())
		}
		if len(p.GetWhy()) > MaxWhy {
			return invalid(field+".why", "%d bytes, over the limit of %d", len(p.GetWhy()), MaxWhy)
		}
	}
	if n := proto.Size(s); n > MaxSpecSize {
		return invalid("spec", "%d bytes encoded, over the limit of %d", n, MaxSpecSize)
	}
	return nil
}

// ValidateLabels checks label keys and values.
func ValidateLabels(field string, labels map[string]string) error {
	if len(labels) > MaxLabels {
		return invalid(field, "%d labels, over the limit of %d", len(labels), MaxLabels)
	}
	for k, v := range labels {
		if !labelKeyRE.MatchString(k) {
			return invalid(field, "key %q is not a label key", k)
		}
		if !labelValueRE.MatchString(v) {
			return invalid(field+"["+k+"]", "value %q is not a label value", v)
		}
	}
	return nil
}
