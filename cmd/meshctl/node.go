package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"
	"sort"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"
	"go.yaml.in/yaml/v3"
	"google.golang.org/protobuf/encoding/protojson"

	composerv1 "mesh.dev/proto/mesh/composer/v1"
	typev1 "mesh.dev/proto/mesh/type/v1"
)

func init() {
	register(newNodeCmd)
	register(newPlanCmd)
	register(newApplyCmd)
	register(newApproveCmd)
	register(newHoldsCmd)
	register(newCompositionsCmd)
	register(newCompositionCmd)
}

// withComposer adapts a command body that calls the composer: it dials with
// the connection flags and closes the connection after.
func withComposer(run func(cmd *cobra.Command, args []string, c composerv1.ComposerServiceClient) error) func(*cobra.Command, []string) error {
	return func(cmd *cobra.Command, args []string) error {
		cc, err := dial(conn.composer)
		if err != nil {
			return err
		}
		defer cc.Close()
		return run(cmd, args, composerv1.NewComposerServiceClient(cc))
	}
}

// enumPrefixes lets spec files say FILE or AUTO instead of the full enum
// value names protojson wants.
var enumPrefixes = map[string]string{"type": "RESOURCE_TYPE_", "policy": "UPGRADE_POLICY_"}

// normalizeEnums walks a decoded YAML document and prefixes short enum
// names.
func normalizeEnums(v any) any {
	switch x := v.(type) {
	case map[string]any:
		for k, val := range x {
			if s, ok := val.(string); ok {
				if p, known := enumPrefixes[k]; known && s != "" && !strings.HasPrefix(strings.ToUpper(s), p) {
					x[k] = p + strings.ToUpper(s)
					continue
				}
			}
			x[k] = normalizeEnums(val)
		}
	case []any:
		for i := range x {
			x[i] = normalizeEnums(x[i])
		}
	}
	return v
}

// readSpec reads a node spec from a YAML or JSON file (protojson field
// names; unknown fields refused).
func readSpec(path string) (*composerv1.NodeSpec, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var doc any
	if err := yaml.Unmarshal(b, &doc); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	j, err := json.Marshal(normalizeEnums(doc))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	spec := &composerv1.NodeSpec{}
	if err := protojson.Unmarshal(j, spec); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return spec, nil
}

func newNodeCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "node", Short: "Node specs: put, get, ls, rm, declaration"}
	var expect uint64
	var create bool
	put := &cobra.Command{
		Use:   "put FILE...",
		Short: "Create or replace node specs from YAML/JSON files",
		Args:  cobra.MinimumNArgs(1),
		RunE: withComposer(func(cmd *cobra.Command, args []string, c composerv1.ComposerServiceClient) error {
			for _, f := range args {
				spec, err := readSpec(f)
				if err != nil {
					return err
				}
				resp, err := c.PutNode(cmd.Context(), &composerv1.PutNodeRequest{Spec: spec, ExpectedRevision: expect, CreateOnly: create})
				if err != nil {
					return fmt.Errorf("%s: %w", f, err)
				}
				fmt.Fprintf(cmd.OutOrStdout(), "node %s at revision %d\n", spec.GetNode(), resp.GetRevision())
			}
			return nil
		}),
	}
	put.Flags().Uint64Var(&expect, "expect-revision", 0, "write only if the spec is at this revision")
	put.Flags().BoolVar(&create, "create", false, "write only if the node has no spec")
	get := &cobra.Command{
		Use: "get NODE", Short: "Print a node spec", Args: cobra.ExactArgs(1),
		RunE: withComposer(func(cmd *cobra.Command, args []string, c composerv1.ComposerServiceClient) error {
			resp, err := c.GetNode(cmd.Context(), &composerv1.GetNodeRequest{Node: args[0]})
			if err != nil {
				return err
			}
			return printJSON(cmd, resp)
		}),
	}
	var selector []string
	ls := &cobra.Command{
		Use: "ls", Short: "List node specs", Args: cobra.NoArgs,
		RunE: withComposer(func(cmd *cobra.Command, _ []string, c composerv1.ComposerServiceClient) error {
			sel, err := parseSelector(selector)
			if err != nil {
				return err
			}
			resp, err := c.ListNodes(cmd.Context(), &composerv1.ListNodesRequest{Selector: sel})
			if err != nil {
				return err
			}
			if wantJSON() {
				return printJSON(cmd, resp)
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "NODE\tLABELS\tMODULES")
			for _, s := range resp.GetSpecs() {
				var mods []string
				for _, pm := range s.GetModules() {
					mods = append(mods, pm.GetModule())
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\n", s.GetNode(), labelsString(s.GetLabels()), strings.Join(mods, ","))
			}
			return tw.Flush()
		}),
	}
	ls.Flags().StringSliceVarP(&selector, "selector", "l", nil, "label selector key=value (repeatable)")
	rm := &cobra.Command{
		Use: "rm NODE", Short: "Delete a node spec (its engine is refused from then on)", Args: cobra.ExactArgs(1),
		RunE: withComposer(func(cmd *cobra.Command, args []string, c composerv1.ComposerServiceClient) error {
			if _, err := c.DeleteNode(cmd.Context(), &composerv1.DeleteNodeRequest{Node: args[0]}); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "node %s deleted\n", args[0])
			return nil
		}),
	}
	decl := &cobra.Command{
		Use: "declaration NODE", Short: "Render a node's declaration", Args: cobra.ExactArgs(1),
		RunE: withComposer(func(cmd *cobra.Command, args []string, c composerv1.ComposerServiceClient) error {
			resp, err := c.GetDeclaration(cmd.Context(), &composerv1.GetDeclarationRequest{Node: args[0]})
			if err != nil {
				return err
			}
			return printJSON(cmd, resp.GetDeclaration())
		}),
	}
	cmd.AddCommand(put, get, ls, rm, decl)
	return cmd
}

func labelsString(l map[string]string) string {
	keys := make([]string, 0, len(l))
	for k := range l {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = k + "=" + l[k]
	}
	return strings.Join(parts, ",")
}

func parseSelector(pairs []string) (*typev1.LabelSelector, error) {
	if len(pairs) == 0 {
		return nil, nil
	}
	sel := &typev1.LabelSelector{MatchLabels: map[string]string{}}
	for _, p := range pairs {
		k, v, ok := strings.Cut(p, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("selector %q: want key=value", p)
		}
		sel.MatchLabels[k] = v
	}
	return sel, nil
}

// printPlan writes a plan as a table of compositions and holds per node.
func printPlan(cmd *cobra.Command, plan *composerv1.PlanResponse) error {
	out := cmd.OutOrStdout()
	for _, np := range plan.GetNodes() {
		change := "no change"
		if np.GetChanges() {
			change = "changes"
		}
		fmt.Fprintf(out, "node %s: %s (spec r%d, haves r%d, assignment r%d)\n", np.GetNode(), change,
			np.GetInputs().GetSpecRevision(), np.GetInputs().GetHavesRevision(), np.GetInputs().GetAssignmentRevision())
		if np.GetError() != "" {
			fmt.Fprintf(out, "  error: %s\n", np.GetError())
		}
		tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
		for _, c := range np.GetCompositions() {
			w := " "
			if c.GetWrite() {
				w = "*"
			}
			fmt.Fprintf(tw, "  %s %s\t%s\t%s\t%s\n", w, c.GetKey(), shortDigest(c.GetDigest()), judgementWord(c.GetJudgement()), c.GetWords())
		}
		tw.Flush()
		for _, h := range np.GetHolds() {
			fmt.Fprintf(out, "  hold %s %s: %s\n", h.GetModule(), shortDigest(h.GetCompositionDigest()), h.GetReason())
		}
		if len(np.GetMoved()) > 0 {
			fmt.Fprintf(out, "  moved into %s.node: %s\n", np.GetNode(), strings.Join(np.GetMoved(), ", "))
		}
	}
	return nil
}

func judgementWord(j composerv1.Judgement) string {
	if j == composerv1.Judgement_JUDGEMENT_UNSPECIFIED {
		// A hold with nothing to judge yet (no registration, a build
		// not done): its reason says why.
		return "-"
	}
	return strings.TrimPrefix(j.String(), "JUDGEMENT_")
}

func shortDigest(d string) string {
	if i := strings.IndexByte(d, ':'); i >= 0 && len(d) > i+13 {
		return d[:i+13]
	}
	return d
}

func newPlanCmd() *cobra.Command {
	var selector []string
	var out string
	cmd := &cobra.Command{
		Use:   "plan [NODE...]",
		Short: "Show what a pass would write for nodes (all, or by name/selector); -f saves the plan for apply",
		RunE: withComposer(func(cmd *cobra.Command, args []string, c composerv1.ComposerServiceClient) error {
			sel, err := parseSelector(selector)
			if err != nil {
				return err
			}
			plan, err := c.Plan(cmd.Context(), &composerv1.PlanRequest{Nodes: args, Selector: sel})
			if err != nil {
				return err
			}
			if out != "" {
				b, err := protojson.MarshalOptions{Multiline: true}.Marshal(plan)
				if err != nil {
					return err
				}
				if err := os.WriteFile(out, b, 0o644); err != nil {
					return err
				}
			}
			if wantJSON() {
				return printJSON(cmd, plan)
			}
			return printPlan(cmd, plan)
		}),
	}
	cmd.Flags().StringSliceVarP(&selector, "selector", "l", nil, "label selector key=value (repeatable)")
	cmd.Flags().StringVarP(&out, "file", "f", "", "also write the plan to this file (for meshctl apply)")
	return cmd
}

func newApplyCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "apply PLAN.json",
		Short: "Commit a saved plan: each node whose inputs did not move; names those that need a new plan",
		Args:  cobra.ExactArgs(1),
		RunE: withComposer(func(cmd *cobra.Command, args []string, c composerv1.ComposerServiceClient) error {
			b, err := os.ReadFile(args[0])
			if err != nil {
				return err
			}
			plan := &composerv1.PlanResponse{}
			if err := protojson.Unmarshal(b, plan); err != nil {
				return fmt.Errorf("%s: %w", args[0], err)
			}
			resp, err := c.Apply(cmd.Context(), &composerv1.ApplyRequest{Nodes: plan.GetNodes()})
			if err != nil {
				return err
			}
			if wantJSON() {
				return printJSON(cmd, resp)
			}
			out := cmd.OutOrStdout()
			for _, n := range resp.GetApplied() {
				fmt.Fprintf(out, "applied %s\n", n)
			}
			for _, s := range resp.GetStale() {
				fmt.Fprintf(out, "stale %s: %s (plan again)\n", s.GetNode(), s.GetReason())
			}
			for _, f := range resp.GetFailed() {
				fmt.Fprintf(out, "failed %s: %s\n", f.GetNode(), f.GetError())
			}
			if len(resp.GetStale())+len(resp.GetFailed()) > 0 {
				return errors.New("some nodes were not applied")
			}
			return nil
		}),
	}
}

func newApproveCmd() *cobra.Command {
	var selector []string
	var note string
	cmd := &cobra.Command{
		Use:   "approve MODULE DIGEST...",
		Short: "Let held moves of a module to these composition digests (from plan or holds) go ahead",
		Args:  cobra.MinimumNArgs(2),
		RunE: withComposer(func(cmd *cobra.Command, args []string, c composerv1.ComposerServiceClient) error {
			sel, err := parseSelector(selector)
			if err != nil {
				return err
			}
			resp, err := c.Approve(cmd.Context(), &composerv1.ApproveRequest{Module: args[0], Digests: args[1:], Selector: sel, Note: note})
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "approval %s of %s (%d digests)\n", resp.GetApproval().GetId(), args[0], len(resp.GetApproval().GetDigests()))
			// An approval may come before the move it lets through (from
			// a plan); say so when no held move names these digests now,
			// the usual sign of a mistyped module or digest.
			if holds, err := c.ListHolds(cmd.Context(), &composerv1.ListHoldsRequest{}); err == nil {
				matched := 0
				for _, nh := range holds.GetNodes() {
					for _, h := range nh.GetHolds() {
						if h.GetModule() == args[0] && slices.Contains(args[1:], h.GetCompositionDigest()) {
							matched++
						}
					}
				}
				if matched == 0 {
					fmt.Fprintf(cmd.ErrOrStderr(), "note: no move of %s held now names these digests (meshctl holds lists them); the approval lets one through when it does\n", args[0])
				} else {
					fmt.Fprintf(cmd.OutOrStdout(), "lets %d held moves through\n", matched)
				}
			}
			return nil
		}),
	}
	cmd.Flags().StringSliceVarP(&selector, "selector", "l", nil, "only nodes with these labels key=value")
	cmd.Flags().StringVar(&note, "note", "", "why (kept with the approval)")
	return cmd
}

func newHoldsCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "holds [NODE]",
		Short: "List held moves and why they are held",
		Args:  cobra.MaximumNArgs(1),
		RunE: withComposer(func(cmd *cobra.Command, args []string, c composerv1.ComposerServiceClient) error {
			req := &composerv1.ListHoldsRequest{}
			if len(args) == 1 {
				req.Node = args[0]
			}
			resp, err := c.ListHolds(cmd.Context(), req)
			if err != nil {
				return err
			}
			if wantJSON() {
				return printJSON(cmd, resp)
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "NODE\tMODULE\tDIGEST\tJUDGEMENT\tREASON")
			for _, n := range resp.GetNodes() {
				for _, h := range n.GetHolds() {
					fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", n.GetNode(), h.GetModule(), h.GetCompositionDigest(), judgementWord(h.GetJudgement()), h.GetReason())
				}
			}
			return tw.Flush()
		}),
	}
}

func newCompositionsCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "compositions NODE",
		Short: "List a node's held compositions with their judgements",
		Args:  cobra.ExactArgs(1),
		RunE: withComposer(func(cmd *cobra.Command, args []string, c composerv1.ComposerServiceClient) error {
			resp, err := c.ListCompositions(cmd.Context(), &composerv1.ListCompositionsRequest{Node: args[0]})
			if err != nil {
				return err
			}
			if wantJSON() {
				return printJSON(cmd, resp)
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "KEY\tDIGEST\tWANTED\tWRITTEN\tJUDGEMENT\tWORDS")
			for _, ci := range resp.GetCompositions() {
				fmt.Fprintf(tw, "%s\t%s\t%v\t%s\t%s\t%s\n", ci.GetKey(), shortDigest(ci.GetDigest()), ci.GetWanted(),
					ci.GetWrittenAt().AsTime().Format("2006-01-02T15:04:05Z"), judgementWord(ci.GetJudgement().GetJudgement()), ci.GetJudgement().GetWords())
			}
			return tw.Flush()
		}),
	}
}

func newCompositionCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "composition KEY",
		Short: "Print a signed composition the composer holds (JSON, for meshctl verify)",
		Args:  cobra.ExactArgs(1),
		RunE: withComposer(func(cmd *cobra.Command, args []string, c composerv1.ComposerServiceClient) error {
			resp, err := c.GetComposition(cmd.Context(), &composerv1.GetCompositionRequest{Key: args[0]})
			if err != nil {
				return err
			}
			return printJSON(cmd, resp.GetComposition())
		}),
	}
}
