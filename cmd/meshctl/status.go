package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"mesh.dev/internal/names"
	composerv1 "mesh.dev/proto/mesh/composer/v1"
)

func init() { register(newStatusCmd) }

func newStatusCmd() *cobra.Command {
	var why, wait bool
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:   "status [NODE...]",
		Short: "Each node: wanted vs applied, and with --why the reason for anything not applied",
		Long: `status prints each node's manifest revision (wanted/applied), how many modules
run what they should, and a state. --why adds, for every node not converged, each
module's wanted and applied fingerprint, the engine's last attempt with its reason
code and words, held moves with their reasons, and the last compose error.
--wait prints progress until every listed node converged or --timeout passes.`,
		RunE: withComposer(func(cmd *cobra.Command, args []string, c composerv1.ComposerServiceClient) error {
			fetch := func(ctx context.Context) ([]*composerv1.NodeStatus, error) {
				resp, err := c.ListStatus(ctx, &composerv1.ListStatusRequest{})
				if err != nil {
					return nil, err
				}
				var out []*composerv1.NodeStatus
				for _, st := range resp.GetStatuses() {
					if len(args) == 0 || slices.Contains(args, st.GetNode()) {
						out = append(out, st)
					}
				}
				return out, nil
			}
			if !wait {
				sts, err := fetch(cmd.Context())
				if err != nil {
					return err
				}
				if wantJSON() {
					err = printJSON(cmd, &composerv1.ListStatusResponse{Statuses: sts})
				} else {
					RenderStatus(cmd.OutOrStdout(), sts, why, time.Now())
				}
				if missing := missingNodes(sts, args); len(missing) > 0 {
					return errors.Join(err, fmt.Errorf("no status of %s: no such node, or not composed yet (meshctl node ls lists the nodes)", quoteList(missing)))
				}
				return err
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), timeout)
			defer cancel()
			return WaitConverged(ctx, cmd.OutOrStdout(), fetch, args, len(args), why)
		}),
	}
	cmd.Flags().BoolVar(&why, "why", false, "explain every node that is not converged")
	cmd.Flags().BoolVar(&wait, "wait", false, "print progress until converged or --timeout")
	cmd.Flags().DurationVar(&timeout, "timeout", 5*time.Minute, "how long --wait waits")
	return cmd
}

// WaitConverged polls statuses until every node is converged (at least
// want nodes are known, and each node of named has a status). It prints a
// progress line whenever the count changes and, when the table changed,
// the whole status table again (at most every liveEvery), so the operator
// watches each node move; the final table is printed once converged, and
// with every reason on timeout, whose error names the nodes not converged
// (unless that last read shows them all converged). A read that fails for
// a lasting reason (lasting) ends the wait at once; any other failure is
// said when it starts or changes, and asked again.
func WaitConverged(ctx context.Context, w io.Writer, fetch func(context.Context) ([]*composerv1.NodeStatus, error), named []string, want int, why bool) error {
	const liveEvery = 2 * time.Second
	lastLine, lastTable, lastErr := "", "", ""
	var printed time.Time
	start := time.Now()
	converged := func(sts []*composerv1.NodeStatus) (conv int, missing []string, done bool) {
		for _, st := range sts {
			if st.GetConverged() {
				conv++
			}
		}
		missing = missingNodes(sts, named)
		return conv, missing, len(sts) > 0 && conv == len(sts) && len(sts) >= want && len(missing) == 0
	}
	for {
		sts, err := fetch(ctx)
		switch {
		case err != nil && lasting(err):
			// Asking again cannot help (who is asking, or how).
			return fmt.Errorf("status not read: %w", err)
		case err != nil && ctx.Err() == nil && err.Error() != lastErr:
			// Said when it starts or changes, and asked again.
			fmt.Fprintf(w, "[%5.1fs] status not read (asked again): %v\n", time.Since(start).Seconds(), err)
			lastErr = err.Error()
		case err == nil:
			lastErr = ""
			conv, missing, done := converged(sts)
			line := fmt.Sprintf("%d/%d nodes converged", conv, len(sts))
			if len(missing) > 0 {
				line += "; no status yet of " + quoteList(missing)
			}
			var table strings.Builder
			RenderStatus(&table, sts, false, time.Now())
			if why {
				// The live table says in one line why each node that is
				// not converged is not (status --why has every module).
				for _, st := range sts {
					if r := notConvergedBecause(st); r != "" {
						fmt.Fprintf(&table, "  %s: %s\n", st.GetNode(), r)
					}
				}
			}
			changed := line != lastLine || (table.String() != lastTable && time.Since(printed) >= liveEvery)
			if changed && !done {
				fmt.Fprintf(w, "[%5.1fs] %s\n", time.Since(start).Seconds(), line)
				if len(sts) > 0 && table.String() != lastTable {
					fmt.Fprint(w, table.String())
				}
				lastLine, lastTable, printed = line, table.String(), time.Now()
			}
			if done {
				fmt.Fprintf(w, "[%5.1fs] %s\n", time.Since(start).Seconds(), line)
				RenderStatus(w, sts, why, time.Now())
				return nil
			}
		}
		select {
		case <-ctx.Done():
			// One last read, bounded on its own: the fleet may have
			// converged within the last poll.
			last, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			sts, err := fetch(last)
			cancel()
			if err != nil {
				return fmt.Errorf("not converged: %w (and the status could not be read: %v)", ctx.Err(), err)
			}
			if _, _, done := converged(sts); done {
				line := fmt.Sprintf("%d/%d nodes converged", len(sts), len(sts))
				fmt.Fprintf(w, "[%5.1fs] %s\n", time.Since(start).Seconds(), line)
				RenderStatus(w, sts, why, time.Now())
				return nil
			}
			RenderStatus(w, sts, true, time.Now())
			var not []string
			for _, st := range sts {
				if !st.GetConverged() {
					not = append(not, st.GetNode())
				}
			}
			for _, n := range missingNodes(sts, named) {
				not = append(not, n+" (no status)")
			}
			if len(not) == 0 {
				return fmt.Errorf("not converged: %w", ctx.Err())
			}
			return fmt.Errorf("not converged: %s: %w", strings.Join(not, ", "), ctx.Err())
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// lasting reports whether a status read failed for a reason asking again
// does not mend: the caller's identity or rights, the request itself, or a
// composer without the method. Anything else (unreachable, restarting, a
// deadline) is asked again.
func lasting(err error) bool {
	switch status.Code(err) {
	case codes.Unauthenticated, codes.PermissionDenied, codes.InvalidArgument, codes.Unimplemented:
		return true
	}
	return false
}

// missingNodes returns the nodes of named no status is of, in order.
func missingNodes(sts []*composerv1.NodeStatus, named []string) []string {
	var missing []string
	for _, n := range named {
		if !slices.ContainsFunc(sts, func(st *composerv1.NodeStatus) bool { return st.GetNode() == n }) && !slices.Contains(missing, n) {
			missing = append(missing, n)
		}
	}
	return missing
}

// quoteList is names quoted and joined by commas.
func quoteList(names []string) string {
	q := make([]string, len(names))
	for i, n := range names {
		q[i] = strconv.Quote(n)
	}
	return strings.Join(q, ", ")
}

func shortFP(fp string) string {
	if h := names.FingerprintHex(fp); h != "" {
		return h[:12]
	}
	if fp == "" {
		return "-"
	}
	return fp
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func stateWord(st *composerv1.NodeStatus) string {
	switch {
	case st.GetLastError() != "":
		return "ERROR"
	case st.GetConverged() && holding(st):
		return "CONVERGED (holds)"
	case st.GetConverged():
		return "CONVERGED"
	case st.GetLastSeen() == nil:
		return "NEVER SEEN"
	}
	for _, m := range st.GetModules() {
		if m.GetState() == composerv1.AttemptState_ATTEMPT_STATE_STALE {
			return "STALE"
		}
		if m.GetState() == composerv1.AttemptState_ATTEMPT_STATE_FAILED || m.GetState() == composerv1.AttemptState_ATTEMPT_STATE_HELD {
			return "NOT APPLIED"
		}
	}
	return "CONVERGING"
}

// inEffect reports whether a module runs its wanted composition with
// nothing to say: applied at the wanted digest, not held by the composer,
// and its engine's last attempt APPLIED (or none reported). A FAILED or
// STALE attempt at the wanted digest is where an engine says it refused a
// manifest or applies nothing (its state unreadable); a HELD one, that it
// holds the module where it is.
func inEffect(m *composerv1.ModuleStatus) bool {
	s := m.GetState()
	return m.GetWantedDigest() != "" && m.GetWantedDigest() == m.GetAppliedDigest() && m.GetHold() == nil &&
		(s == composerv1.AttemptState_ATTEMPT_STATE_APPLIED || s == composerv1.AttemptState_ATTEMPT_STATE_UNSPECIFIED)
}

// engineHeld is the first module the engine holds at its wanted digest
// (converged, yet held where it is), nil when none is.
func engineHeld(st *composerv1.NodeStatus) *composerv1.ModuleStatus {
	for _, m := range st.GetModules() {
		if m.GetState() == composerv1.AttemptState_ATTEMPT_STATE_HELD && m.GetWantedDigest() != "" && m.GetWantedDigest() == m.GetAppliedDigest() {
			return m
		}
	}
	return nil
}

// nodeFirst is the modules of a status with the node's own first: the
// engine says on it why it refused a manifest or applies nothing.
func nodeFirst(st *composerv1.NodeStatus) []*composerv1.ModuleStatus {
	ms := slices.Clone(st.GetModules())
	if i := slices.IndexFunc(ms, func(m *composerv1.ModuleStatus) bool { return m.GetModule() == names.NodeModule }); i > 0 {
		node := ms[i]
		copy(ms[1:i+1], ms[:i])
		ms[0] = node
	}
	return ms
}

// holding reports whether a node holds anything where it is: a move the
// composer holds, or a module its engine holds at the wanted digest.
func holding(st *composerv1.NodeStatus) bool {
	return len(st.GetHolds()) > 0 || engineHeld(st) != nil
}

// notConvergedBecause is the first reason a node is not converged, in one
// line; for a converged node, what it holds; "" when there is nothing to
// say.
func notConvergedBecause(st *composerv1.NodeStatus) string {
	if st.GetLastError() != "" {
		return "compose error: " + st.GetLastError()
	}
	if st.GetConverged() {
		if hs := st.GetHolds(); len(hs) > 0 {
			r := fmt.Sprintf("runs what it may; %s held: %s", hs[0].GetModule(), hs[0].GetReason())
			if len(hs) > 1 {
				r += fmt.Sprintf(" (and %d more holds)", len(hs)-1)
			}
			return r
		}
		if m := engineHeld(st); m != nil {
			return fmt.Sprintf("runs what it may; %s %s", m.GetModule(), attemptWords(m))
		}
		return ""
	}
	if st.GetLastSeen() == nil && st.GetAppliedRevision() == 0 {
		return "its engine has not connected yet"
	}
	for _, m := range nodeFirst(st) {
		if inEffect(m) {
			continue
		}
		if h := m.GetHold(); h != nil {
			return m.GetModule() + " held: " + h.GetReason()
		}
		if st := m.GetState(); st == composerv1.AttemptState_ATTEMPT_STATE_FAILED || st == composerv1.AttemptState_ATTEMPT_STATE_HELD ||
			st == composerv1.AttemptState_ATTEMPT_STATE_STALE {
			return m.GetModule() + " " + attemptWords(m)
		}
	}
	if st.GetAppliedRevision() != st.GetManifestRevision() {
		return fmt.Sprintf("manifest r%d sent, the engine reports r%d", st.GetManifestRevision(), st.GetAppliedRevision())
	}
	return "applying"
}

// attemptWords is a module's last attempt as the status prints it: its
// state, reason code and words ("FAILED DIGEST_MISMATCH: …"), each only
// when set.
func attemptWords(m *composerv1.ModuleStatus) string {
	var parts []string
	if m.GetState() != composerv1.AttemptState_ATTEMPT_STATE_UNSPECIFIED {
		parts = append(parts, strings.TrimPrefix(m.GetState().String(), "ATTEMPT_STATE_"))
	}
	if m.GetReasonCode() != composerv1.ReasonCode_REASON_CODE_UNSPECIFIED {
		parts = append(parts, strings.TrimPrefix(m.GetReasonCode().String(), "REASON_CODE_"))
	}
	words := strings.Join(parts, " ")
	if m.GetReason() != "" {
		words += ": " + m.GetReason()
	}
	return words
}

// RenderStatus writes the status table and, with why, the reasons.
func RenderStatus(w io.Writer, sts []*composerv1.NodeStatus, why bool, now time.Time) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NODE\tMANIFEST\tMODULES\tSTATE\tLAST SEEN")
	for _, st := range sts {
		applied := 0
		for _, m := range st.GetModules() {
			if m.GetWantedDigest() != "" && m.GetAppliedDigest() == m.GetWantedDigest() {
				applied++
			}
		}
		seen := "never"
		if st.GetLastSeen() != nil {
			// Last seen is persisted at most every 5 minutes (DESIGN.md §6).
			if age := now.Sub(st.GetLastSeen().AsTime()); age < 5*time.Minute+30*time.Second {
				seen = "within 5m"
			} else {
				seen = age.Round(time.Minute).String() + " ago"
			}
		}
		fmt.Fprintf(tw, "%s\tr%d/r%d\t%d/%d applied\t%s\t%s\n", st.GetNode(), st.GetManifestRevision(), st.GetAppliedRevision(),
			applied, len(st.GetModules()), stateWord(st), seen)
	}
	tw.Flush()
	if !why {
		return
	}
	for _, st := range sts {
		if st.GetConverged() && !holding(st) && st.GetLastError() == "" {
			continue
		}
		fmt.Fprintf(w, "\n%s:\n", st.GetNode())
		if st.GetLastError() != "" {
			fmt.Fprintf(w, "  compose error: %s\n", st.GetLastError())
		}
		if st.GetAppliedRevision() != st.GetManifestRevision() {
			fmt.Fprintf(w, "  manifest r%d is wanted, the engine applied r%d\n", st.GetManifestRevision(), st.GetAppliedRevision())
		}
		for _, m := range nodeFirst(st) {
			if inEffect(m) {
				continue
			}
			var b strings.Builder
			wanted, applied := shortFP(m.GetWantedFingerprint()), shortFP(m.GetAppliedFingerprint())
			if m.GetModule() == names.NodeModule {
				// The node's own composition has no fingerprint: its
				// digests say what is wanted and applied.
				wanted, applied = orDash(shortDigest(m.GetWantedDigest())), orDash(shortDigest(m.GetAppliedDigest()))
			}
			fmt.Fprintf(&b, "  %s: wanted %s, applied %s", m.GetModule(), wanted, applied)
			if words := attemptWords(m); words != "" {
				b.WriteString("; last attempt " + words)
			}
			if h := m.GetHold(); h != nil {
				fmt.Fprintf(&b, "; held: %s", h.GetReason())
			}
			if m.GetWantedDigest() != "" && m.GetAppliedDigest() == "" && m.GetState() == composerv1.AttemptState_ATTEMPT_STATE_UNSPECIFIED {
				b.WriteString("; the engine has not reported this module yet")
			}
			fmt.Fprintln(w, b.String())
		}
		if st.GetLastSeen() == nil {
			fmt.Fprintln(w, "  the node's engine has never connected")
		}
	}
}
