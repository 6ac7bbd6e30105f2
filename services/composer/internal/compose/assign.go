package compose

import (
	"fmt"
	"slices"

	composerv1 "mesh.dev/proto/mesh/composer/v1"
	typev1 "mesh.dev/proto/mesh/type/v1"
)

// Where a policy came from.
const (
	PolicyFromNodeSpec = "node-spec"
	PolicyFromManifest = "manifest"
	PolicyFromDefault  = "default"
)

// Policy is a module's upgrade policy on a node and where it came from.
type Policy struct {
	Policy typev1.UpgradePolicy
	From   string
	Why    string
}

// ResolvePolicy returns the node spec's override for a module, else the
// manifest's policy, else AUTO.
func ResolvePolicy(spec *composerv1.NodeSpec, module string, manifest *typev1.ModuleManifest) Policy {
	if p, ok := spec.GetPolicies()[module]; ok && p.GetPolicy() != typev1.UpgradePolicy_UPGRADE_POLICY_UNSPECIFIED {
		return Policy{Policy: p.GetPolicy(), From: PolicyFromNodeSpec, Why: p.GetWhy()}
	}
	if p := manifest.GetUpgrade(); p.GetPolicy() != typev1.UpgradePolicy_UPGRADE_POLICY_UNSPECIFIED {
		return Policy{Policy: p.GetPolicy(), From: PolicyFromManifest, Why: p.GetWhy()}
	}
	return Policy{Policy: typev1.UpgradePolicy_UPGRADE_POLICY_AUTO, From: PolicyFromDefault}
}

// Approves reports whether an approval lets a node with these labels move a
// module to a composition digest.
func Approves(a *composerv1.Approval, module, digest string, labels map[string]string) bool {
	if a.GetModule() != module || !slices.Contains(a.GetDigests(), digest) {
		return false
	}
	for k, v := range a.GetSelector().GetMatchLabels() {
		if labels[k] != v {
			return false
		}
	}
	return true
}

// Matches reports whether labels satisfy a selector (an empty one selects
// everything).
func Matches(sel *typev1.LabelSelector, labels map[string]string) bool {
	for k, v := range sel.GetMatchLabels() {
		if labels[k] != v {
			return false
		}
	}
	return true
}

// Move is one module's move decision.
type Move struct {
	Module string
	Judged Judged
	Policy Policy
	// Approved is set when an approval covers the new composition's digest.
	Approved bool
	// Placed is set when the node has no want for the module yet (a first
	// placement rather than a move between versions).
	Placed bool
}

// Decide applies the assigner's policy rules (DESIGN.md §5.3) and returns
// whether the want moves to the new composition, and when it does not, why:
// AUTO moves unless the change touches data; MANUAL holds unless SAME or
// confined to user_list files; PINNED never moves an existing want — not
// even to a SAME composition, whose fingerprint may run other artifacts —
// and approvals do not change that; an approval lets a held AUTO or MANUAL
// move, or a PINNED first placement, go.
func Decide(m Move) (bool, string) {
	j := m.Judged.Judgement
	name := policyName(m.Policy.Policy)
	held := func(what string) (bool, string) {
		reason := fmt.Sprintf("policy %s (from %s) holds %s", name, m.Policy.From, what)
		if m.Policy.Why != "" {
			reason += ": " + m.Policy.Why
		}
		return false, reason
	}
	switch m.Policy.Policy {
	case typev1.UpgradePolicy_UPGRADE_POLICY_PINNED:
		if m.Placed && m.Approved {
			return true, ""
		}
		if m.Placed {
			return held("a first placement until approved")
		}
		return held(judgementName(j) + " (pinned: change the policy to move)")
	case typev1.UpgradePolicy_UPGRADE_POLICY_MANUAL:
		// A user-list change moves, but not one touching data: AUTO
		// holds that, and MANUAL is never laxer than AUTO.
		if j == composerv1.Judgement_JUDGEMENT_SAME || (m.Judged.UserListOnly && j != composerv1.Judgement_JUDGEMENT_DATA) || m.Approved {
			return true, ""
		}
		return held(judgementName(j) + " until approved")
	default:
		if j != composerv1.Judgement_JUDGEMENT_DATA || m.Approved {
			return true, ""
		}
		return held("a change touching data until approved")
	}
}

func policyName(p typev1.UpgradePolicy) string {
	switch p {
	case typev1.UpgradePolicy_UPGRADE_POLICY_MANUAL:
		return "MANUAL"
	case typev1.UpgradePolicy_UPGRADE_POLICY_PINNED:
		return "PINNED"
	}
	return "AUTO"
}

func judgementName(j composerv1.Judgement) string {
	switch j {
	case composerv1.Judgement_JUDGEMENT_NEW:
		return "NEW"
	case composerv1.Judgement_JUDGEMENT_SAME:
		return "SAME"
	case composerv1.Judgement_JUDGEMENT_ADDS:
		return "ADDS"
	case composerv1.Judgement_JUDGEMENT_CHANGES:
		return "CHANGES"
	case composerv1.Judgement_JUDGEMENT_REMOVES:
		return "REMOVES"
	case composerv1.Judgement_JUDGEMENT_DATA:
		return "DATA"
	}
	return "UNSPECIFIED"
}
