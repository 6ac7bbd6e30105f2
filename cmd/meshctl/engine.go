package main

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/types/known/timestamppb"

	nodeenginev1 "mesh.dev/proto/mesh/nodeengine/v1"
)

func init() { register(newEngineCmd) }

// withEngine runs a command against the node engine admin API at
// --nodeengine (an operator, or the node itself).
func withEngine(run func(cmd *cobra.Command, args []string, c nodeenginev1.NodeEngineServiceClient) error) func(*cobra.Command, []string) error {
	return func(cmd *cobra.Command, args []string) error {
		cc, err := dial(conn.nodeengine)
		if err != nil {
			return err
		}
		defer cc.Close()
		return run(cmd, args, nodeenginev1.NewNodeEngineServiceClient(cc))
	}
}

func newEngineCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "engine",
		Short: "One node engine's local admin API (--nodeengine): status, views, again",
		Long: `engine asks one node engine, at --nodeengine (loopback by default on the
node), what it holds: what it applied and why anything is not, the entries and
wants it keeps, and asks the catalog again for an entry.`,
	}
	cmd.AddCommand(&cobra.Command{
		Use:   "status",
		Short: "The engine's applied and pending manifests, each module's attempt with its reason, holds, drift",
		Args:  cobra.NoArgs,
		RunE: withEngine(func(cmd *cobra.Command, _ []string, c nodeenginev1.NodeEngineServiceClient) error {
			st, err := c.GetStatus(cmd.Context(), &nodeenginev1.GetStatusRequest{})
			if err != nil {
				return err
			}
			if wantJSON() {
				return printJSON(cmd, st)
			}
			RenderEngineStatus(cmd.OutOrStdout(), st, time.Now())
			return nil
		}),
	})
	cmd.AddCommand(&cobra.Command{
		Use:   "manifest",
		Short: "Print the signed manifest the engine applied (JSON, for meshctl verify)",
		Args:  cobra.NoArgs,
		RunE: withEngine(func(cmd *cobra.Command, _ []string, c nodeenginev1.NodeEngineServiceClient) error {
			st, err := c.GetStatus(cmd.Context(), &nodeenginev1.GetStatusRequest{})
			if err != nil {
				return err
			}
			if st.GetAppliedManifest() == nil {
				return fmt.Errorf("the engine of %s has applied no manifest", st.GetNode())
			}
			return printJSON(cmd, st.GetAppliedManifest())
		}),
	})
	cmd.AddCommand(&cobra.Command{
		Use:   "views",
		Short: "The entries (every state) and wants the engine keeps",
		Args:  cobra.NoArgs,
		RunE: withEngine(func(cmd *cobra.Command, _ []string, c nodeenginev1.NodeEngineServiceClient) error {
			v, err := c.FirstViews(cmd.Context(), &nodeenginev1.FirstViewsRequest{})
			if err != nil {
				return err
			}
			if wantJSON() {
				return printJSON(cmd, v)
			}
			RenderFirstViews(cmd.OutOrStdout(), v)
			return nil
		}),
	})
	cmd.AddCommand(&cobra.Command{
		Use:   "again FINGERPRINT",
		Short: "Drop a kept entry (its module holds until the answer) and ask the catalog again",
		Args:  cobra.ExactArgs(1),
		RunE: withEngine(func(cmd *cobra.Command, args []string, c nodeenginev1.NodeEngineServiceClient) error {
			if _, err := c.EntryAgain(cmd.Context(), &nodeenginev1.EntryAgainRequest{Fingerprint: args[0]}); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "entry %s asked again\n", args[0])
			return nil
		}),
	})
	return cmd
}

// RenderEngineStatus prints an engine's status: a header of what it
// applied and how it is connected, the reason it applies nothing when it
// does not, then each module's applied composition and last attempt.
func RenderEngineStatus(w io.Writer, st *nodeenginev1.GetStatusResponse, now time.Time) {
	fmt.Fprintf(w, "node %s: applied %s", st.GetNode(), manifestWords(st.GetApplied()))
	if st.GetPending() != nil {
		fmt.Fprintf(w, ", pending %s", manifestWords(st.GetPending()))
	}
	fmt.Fprintf(w, "; high-water r%d; keyset v%d\n", st.GetHighWater(), st.GetKeysetVersion())
	switch {
	case st.GetConnected():
		fmt.Fprintf(w, "connected; last sync %s\n", ago(st.GetLastSync(), now))
	case st.GetConnectionError() != "":
		fmt.Fprintf(w, "not connected: %s (last sync %s)\n", st.GetConnectionError(), ago(st.GetLastSync(), now))
	default:
		fmt.Fprintf(w, "not connected (last sync %s)\n", ago(st.GetLastSync(), now))
	}
	if st.GetBlocked() != "" {
		fmt.Fprintf(w, "BLOCKED: %s\n", st.GetBlocked())
	}
	if st.GetStale() != "" {
		fmt.Fprintf(w, "%s\n", st.GetStale())
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "MODULE\tAPPLIED\tATTEMPT\tSINCE\tREASON")
	for _, h := range st.GetHaves() {
		a := h.GetAttempt()
		state, reason := "-", ""
		if a != nil {
			state = strings.TrimPrefix(a.GetState().String(), "ATTEMPT_STATE_")
			if c := a.GetReasonCode().String(); a.GetReasonCode() != 0 {
				reason = strings.TrimPrefix(c, "REASON_CODE_") + ": "
			}
			reason += a.GetReason()
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", h.GetModule(), orDash(shortDigest(h.GetApplied().GetDigest())), state, ago(a.GetSince(), now), reason)
	}
	tw.Flush()
	for _, h := range st.GetHolds() {
		fmt.Fprintf(w, "held %s: %s: %s\n", h.GetModule(), strings.TrimPrefix(h.GetCode().String(), "REASON_CODE_"), h.GetWords())
	}
	if len(st.GetDrift()) > 0 {
		fmt.Fprintf(w, "drift corrected on the last pass: %s\n", strings.Join(st.GetDrift(), ", "))
	}
}

// RenderFirstViews prints the entries and wants an engine keeps.
func RenderFirstViews(w io.Writer, v *nodeenginev1.FirstViewsResponse) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ENTRY\tMODULE\tSTATE\tSINCE\tERROR")
	for _, e := range v.GetEntries() {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", shortFP(e.GetFingerprint()), orDash(e.GetModule()),
			strings.TrimPrefix(e.GetState().String(), "ENTRY_STATE_"), stamp(e.GetSince()), e.GetError())
	}
	tw.Flush()
	tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "WANT\tFINGERPRINT\tSINCE")
	for _, wv := range v.GetWants() {
		fmt.Fprintf(tw, "%s\t%s\t%s\n", wv.GetModule(), shortFP(wv.GetWant().GetFingerprint()), stamp(wv.GetSince()))
	}
	tw.Flush()
}

func manifestWords(m *nodeenginev1.ManifestView) string {
	if m == nil {
		return "nothing"
	}
	words := fmt.Sprintf("r%d", m.GetRevision())
	if m.GetExpiresAt() != nil {
		words += " (expires " + m.GetExpiresAt().AsTime().UTC().Format(time.RFC3339) + ")"
	}
	return words
}

func ago(t *timestamppb.Timestamp, now time.Time) string {
	if t == nil {
		return "never"
	}
	return now.Sub(t.AsTime()).Round(time.Second).String() + " ago"
}

func stamp(t *timestamppb.Timestamp) string {
	if t == nil {
		return "-"
	}
	return t.AsTime().UTC().Format(time.RFC3339)
}
