package main

import (
	"context"
	"encoding/json"
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
	"google.golang.org/protobuf/encoding/protojson"

	"mesh.dev/internal/canonical"
	"mesh.dev/internal/identity"
	"mesh.dev/internal/names"
	catalogv1 "mesh.dev/proto/mesh/catalog/v1"
	typev1 "mesh.dev/proto/mesh/type/v1"
	"mesh.dev/services/catalog/publish"
)

func init() { register(newCatalogCmd) }

// catalogTimeout bounds each unary catalog call of meshctl; streams (upload,
// download, watch, publish) run until done or interrupted.
const catalogTimeout = 30 * time.Second

func newCatalogCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "catalog",
		Short: "Module entries, builds, artifacts and registrations (the catalog service)",
		Long: `Talk to the catalog at --catalog (env MESH_CATALOG) with the certificate of
--identity. Operators put entries and register modules; builders (e.g.
--identity builder-ci) also upload artifacts and record builds, so publish
runs as a builder.`,
	}
	cmd.AddCommand(
		newCatalogPutCmd(), newCatalogGetCmd(), newCatalogLsCmd(), newCatalogBuildCmd(),
		newCatalogUploadCmd(), newCatalogDownloadCmd(), newCatalogRegisterCmd(),
		newCatalogModulesCmd(), newCatalogWatchCmd(), newCatalogPublishCmd(),
	)
	return cmd
}

// withCatalog dials the catalog and runs fn with a client.
func withCatalog(fn func(c catalogv1.CatalogServiceClient) error) error {
	cc, err := dial(conn.catalog)
	if err != nil {
		return err
	}
	defer cc.Close()
	return fn(catalogv1.NewCatalogServiceClient(cc))
}

func unary(cmd *cobra.Command) (context.Context, context.CancelFunc) {
	return context.WithTimeout(cmd.Context(), catalogTimeout)
}

func newCatalogPutCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "put FILE",
		Short: "Store an entry written as JSON or YAML (fingerprint, digests and needs are filled in when absent)",
		Long: `Store an entry. FILE holds a mesh.catalog.v1.Entry in its JSON form (or the
same as YAML); "manifest" may be a mesh.type.v1.ModuleManifest object rather
than base64 canonical bytes, enum values may be short (PASS, FILE, MANUAL),
and manifest_digest, needs, artifact kinds and the fingerprint are computed
when absent. The output of "meshctl catalog get FP -o json" is such a file.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			e, err := readEntryFile(args[0])
			if err != nil {
				return err
			}
			return withCatalog(func(c catalogv1.CatalogServiceClient) error {
				ctx, cancel := unary(cmd)
				defer cancel()
				resp, err := c.PutEntry(ctx, &catalogv1.PutEntryRequest{Entry: e})
				if err != nil {
					return err
				}
				if wantJSON() {
					return printJSON(cmd, resp)
				}
				what := "stored"
				if !resp.GetCreated() {
					what = "already held"
				}
				fmt.Fprintf(cmd.OutOrStdout(), "entry %s of module %s %s\n", resp.GetFingerprint(), e.GetModule(), what)
				return nil
			})
		},
	}
}

func newCatalogGetCmd() *cobra.Command {
	var manifest bool
	cmd := &cobra.Command{
		Use:   "get FP",
		Short: "Show the entry of a fingerprint and its build",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return withCatalog(func(c catalogv1.CatalogServiceClient) error {
				ctx, cancel := unary(cmd)
				defer cancel()
				resp, err := c.GetEntry(ctx, &catalogv1.GetEntryRequest{Fingerprint: args[0]})
				if err != nil {
					return err
				}
				e := resp.GetEntry()
				m := &typev1.ModuleManifest{}
				if err := canonical.Decode(e.GetManifest(), m); err != nil {
					return fmt.Errorf("entry %s: %w", e.GetFingerprint(), err)
				}
				if manifest {
					return printJSON(cmd, m)
				}
				if wantJSON() {
					return printJSON(cmd, e)
				}
				b, err := c.GetBuild(ctx, &catalogv1.GetBuildRequest{Fingerprint: args[0]})
				if err != nil && !isNotFound(err) {
					return err
				}
				printEntry(cmd.OutOrStdout(), e, m, b.GetBuild())
				return nil
			})
		},
	}
	cmd.Flags().BoolVar(&manifest, "manifest", false, "print the decoded module manifest as JSON")
	return cmd
}

func printEntry(w io.Writer, e *catalogv1.Entry, m *typev1.ModuleManifest, b *catalogv1.Build) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	row := func(k, v string) { fmt.Fprintf(tw, "%s:\t%s\n", k, v) }
	row("fingerprint", e.GetFingerprint())
	row("module", e.GetModule()+" "+m.GetVersion())
	row("repository", e.GetRepository())
	row("path", e.GetPath())
	row("commit", orNone(e.GetCommit()))
	row("source digest", e.GetSourceDigest())
	row("manifest digest", e.GetManifestDigest())
	row("verdict", shortEnum(e.GetVerdict().String()))
	for _, p := range e.GetProblems() {
		row("  problem", p)
	}
	for _, p := range e.GetWarnings() {
		row("  warning", p)
	}
	for _, p := range e.GetUnknown() {
		row("  unknown", p)
	}
	row("upgrade", strings.TrimSpace(shortEnum(m.GetUpgrade().GetPolicy().String())+" "+m.GetUpgrade().GetWhy()))
	if len(m.GetDataPaths()) > 0 {
		row("data paths", strings.Join(m.GetDataPaths(), " "))
	}
	for _, n := range m.GetNeeds() {
		row("needs", n.GetModule())
	}
	row("resources", strconv.Itoa(len(m.GetResources())))
	for _, r := range m.GetResources() {
		row("  "+names.ResourceID(e.GetModule(), r.GetName()), fmt.Sprintf("%s %s %04o", shortEnum(r.GetType().String()), r.GetPath(), r.GetMode()))
	}
	row("created", e.GetCreatedAt().AsTime().Format(time.RFC3339))
	if b == nil {
		row("build", "none")
	} else {
		row("build", shortEnum(b.GetState().String())+" by "+b.GetRecordedBy()+" at "+b.GetUpdatedAt().AsTime().Format(time.RFC3339))
		if b.GetReason() != "" {
			row("  reason", b.GetReason())
		}
		for _, a := range b.GetArtifacts() {
			row("  "+a.GetRef(), fmt.Sprintf("%s %d bytes", a.GetDigest(), a.GetSize()))
		}
	}
	tw.Flush()
}

// shortEnum drops an enum value's type prefix: VERDICT_PASS → PASS.
func shortEnum(s string) string {
	for _, p := range []string{"VERDICT_", "BUILD_STATE_", "RESOURCE_TYPE_", "UPGRADE_POLICY_"} {
		if rest, ok := strings.CutPrefix(s, p); ok {
			return rest
		}
	}
	return s
}

func orNone(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func newCatalogLsCmd() *cobra.Command {
	var module string
	var limit int
	cmd := &cobra.Command{
		Use:   "ls",
		Short: "List entries by fingerprint, optionally of one module",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return withCatalog(func(c catalogv1.CatalogServiceClient) error {
				var all []*catalogv1.Entry
				token := ""
				for {
					ctx, cancel := unary(cmd)
					resp, err := c.ListEntries(ctx, &catalogv1.ListEntriesRequest{Module: module, PageToken: token})
					cancel()
					if err != nil {
						return err
					}
					all = append(all, resp.GetEntries()...)
					token = resp.GetNextPageToken()
					if token == "" || (limit > 0 && len(all) >= limit) {
						break
					}
				}
				if limit > 0 && len(all) > limit {
					all = all[:limit]
				}
				if wantJSON() {
					return printJSON(cmd, &catalogv1.ListEntriesResponse{Entries: all})
				}
				tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
				fmt.Fprintln(tw, "FINGERPRINT\tMODULE\tVERSION\tVERDICT\tCOMMIT\tCREATED")
				for _, e := range all {
					m := &typev1.ModuleManifest{}
					_ = canonical.Decode(e.GetManifest(), m) // a version is only shown
					fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", e.GetFingerprint(), e.GetModule(), m.GetVersion(),
						shortEnum(e.GetVerdict().String()), short(e.GetCommit(), 12), e.GetCreatedAt().AsTime().Format(time.RFC3339))
				}
				return tw.Flush()
			})
		},
	}
	cmd.Flags().StringVar(&module, "module", "", "only entries of this module")
	cmd.Flags().IntVar(&limit, "limit", 0, "list at most this many (0: all)")
	return cmd
}

func short(s string, n int) string {
	if s == "" {
		return "-"
	}
	if len(s) > n {
		return s[:n]
	}
	return s
}

var buildStates = map[string]catalogv1.BuildState{
	"pending": catalogv1.BuildState_BUILD_STATE_PENDING,
	"done":    catalogv1.BuildState_BUILD_STATE_DONE,
	"failed":  catalogv1.BuildState_BUILD_STATE_FAILED,
}

func newCatalogBuildCmd() *cobra.Command {
	var state, reason string
	var artifacts []string
	cmd := &cobra.Command{
		Use:   "build FP --state done|pending|failed [--artifact REF=FILE|REF=DIGEST:SIZE]...",
		Short: "Record the build of an entry, uploading artifact files first",
		Long: `Record the build of an entry (builders). Each --artifact names an artifact
the entry declares and either a local file, which is uploaded, or the digest
and size of one already uploaded. A DONE build needs every declared artifact
and never changes afterwards.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			st, ok := buildStates[strings.ToLower(state)]
			if !ok {
				return fmt.Errorf("--state %q is not done, pending or failed", state)
			}
			return withCatalog(func(c catalogv1.CatalogServiceClient) error {
				var arts []*typev1.Artifact
				for _, a := range artifacts {
					art, err := buildArtifact(cmd.Context(), c, a)
					if err != nil {
						return err
					}
					arts = append(arts, art)
				}
				slices.SortFunc(arts, func(a, b *typev1.Artifact) int { return strings.Compare(a.GetRef(), b.GetRef()) })
				ctx, cancel := unary(cmd)
				defer cancel()
				resp, err := c.PutBuild(ctx, &catalogv1.PutBuildRequest{Build: &catalogv1.Build{
					Fingerprint: args[0], State: st, Artifacts: arts, Reason: reason,
				}})
				if err != nil {
					return err
				}
				if wantJSON() {
					return printJSON(cmd, resp)
				}
				fmt.Fprintf(cmd.OutOrStdout(), "build of %s is %s (%d artifacts)\n", args[0], shortEnum(resp.GetBuild().GetState().String()), len(arts))
				return nil
			})
		},
	}
	cmd.Flags().StringVar(&state, "state", "", "done, pending or failed (required)")
	cmd.Flags().StringVar(&reason, "reason", "", "why a build failed, or a note")
	cmd.Flags().StringArrayVar(&artifacts, "artifact", nil, "REF=FILE to upload, or REF=DIGEST:SIZE already uploaded (repeatable)")
	_ = cmd.MarkFlagRequired("state")
	return cmd
}

// buildArtifact resolves one --artifact REF=FILE or REF=DIGEST:SIZE.
func buildArtifact(ctx context.Context, c catalogv1.CatalogServiceClient, arg string) (*typev1.Artifact, error) {
	ref, val, ok := strings.Cut(arg, "=")
	if !ok || ref == "" || val == "" {
		return nil, fmt.Errorf("--artifact %q is not REF=FILE or REF=DIGEST:SIZE", arg)
	}
	if strings.HasPrefix(val, names.DigestPrefix) {
		i := strings.LastIndexByte(val, ':')
		size, err := strconv.ParseInt(val[i+1:], 10, 64)
		if i <= len(names.DigestPrefix) || err != nil || !names.ValidDigest(val[:i]) {
			return nil, fmt.Errorf("--artifact %q: %q is not DIGEST:SIZE", arg, val)
		}
		return &typev1.Artifact{Ref: ref, Digest: val[:i], Size: size}, nil
	}
	up, err := publish.UploadFile(ctx, c, val)
	if err != nil {
		return nil, err
	}
	return &typev1.Artifact{Ref: ref, Digest: up.GetDigest(), Size: up.GetSize()}, nil
}

func newCatalogUploadCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "upload FILE...",
		Short: "Upload files as artifacts (builders); one already held is not sent again",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return withCatalog(func(c catalogv1.CatalogServiceClient) error {
				for _, f := range args {
					resp, err := publish.UploadFile(cmd.Context(), c, f)
					if err != nil {
						return err
					}
					if wantJSON() {
						if err := printJSON(cmd, resp); err != nil {
							return err
						}
						continue
					}
					what := "stored"
					if !resp.GetCreated() {
						what = "already held"
					}
					fmt.Fprintf(cmd.OutOrStdout(), "%s %s %d bytes %s\n", f, resp.GetDigest(), resp.GetSize(), what)
				}
				return nil
			})
		},
	}
}

func newCatalogDownloadCmd() *cobra.Command {
	var resume bool
	cmd := &cobra.Command{
		Use:   "download DIGEST FILE",
		Short: "Download an artifact into FILE (- for standard output), checking its digest",
		Long: `Download an artifact. The bytes go to FILE.part and are renamed to FILE once
their digest is checked; --resume continues a FILE.part an interrupted
download left.`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			digest, file := args[0], args[1]
			return withCatalog(func(c catalogv1.CatalogServiceClient) error {
				if file == "-" {
					_, err := publish.Download(cmd.Context(), c, digest, 0, nil, cmd.OutOrStdout())
					return err
				}
				size, err := publish.DownloadFile(cmd.Context(), c, digest, file, resume)
				if err != nil {
					return err
				}
				fmt.Fprintf(cmd.ErrOrStderr(), "%s: %d bytes of %s\n", file, size, digest)
				return nil
			})
		},
	}
	cmd.Flags().BoolVar(&resume, "resume", false, "continue FILE.part from its end")
	return cmd
}

func newCatalogRegisterCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "register MODULE FP",
		Short: "Make a module run at a fingerprint of one of its entries",
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			return withCatalog(func(c catalogv1.CatalogServiceClient) error {
				ctx, cancel := unary(cmd)
				defer cancel()
				resp, err := c.RegisterModule(ctx, &catalogv1.RegisterModuleRequest{Module: args[0], Fingerprint: args[1]})
				if err != nil {
					return err
				}
				if wantJSON() {
					return printJSON(cmd, resp)
				}
				r := resp.GetRegistration()
				if resp.GetChanged() {
					fmt.Fprintf(cmd.OutOrStdout(), "module %s runs at %s (registration %d)\n", r.GetModule(), r.GetFingerprint(), r.GetSeq())
				} else {
					fmt.Fprintf(cmd.OutOrStdout(), "module %s already runs at %s (registration %d)\n", r.GetModule(), r.GetFingerprint(), r.GetSeq())
				}
				return nil
			})
		},
	}
}

func newCatalogModulesCmd() *cobra.Command {
	var history bool
	cmd := &cobra.Command{
		Use:   "modules [MODULE]",
		Short: "List module registrations, or show one module's (with --history, every one)",
		Args:  cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return withCatalog(func(c catalogv1.CatalogServiceClient) error {
				ctx, cancel := unary(cmd)
				defer cancel()
				var regs []*catalogv1.Registration
				if len(args) == 1 {
					resp, err := c.GetModule(ctx, &catalogv1.GetModuleRequest{Module: args[0], History: history})
					if err != nil {
						return err
					}
					if wantJSON() {
						return printJSON(cmd, resp)
					}
					regs = []*catalogv1.Registration{resp.GetRegistration()}
					if history {
						regs = resp.GetHistory()
					}
				} else {
					resp, err := c.ListModules(ctx, &catalogv1.ListModulesRequest{})
					if err != nil {
						return err
					}
					if wantJSON() {
						return printJSON(cmd, resp)
					}
					regs = resp.GetRegistrations()
				}
				tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
				fmt.Fprintln(tw, "MODULE\tSEQ\tFINGERPRINT\tREGISTERED\tBY")
				for _, r := range regs {
					fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\n", r.GetModule(), r.GetSeq(), r.GetFingerprint(),
						r.GetRegisteredAt().AsTime().Format(time.RFC3339), r.GetRegisteredBy())
				}
				return tw.Flush()
			})
		},
	}
	cmd.Flags().BoolVar(&history, "history", false, "with MODULE: every registration, oldest first")
	return cmd
}

func newCatalogWatchCmd() *cobra.Command {
	var from uint64
	cmd := &cobra.Command{
		Use:   "watch",
		Short: "Stream registrations: the current ones, a caught-up line, then every change (until interrupted)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return withCatalog(func(c catalogv1.CatalogServiceClient) error {
				stream, err := c.WatchModules(cmd.Context(), &catalogv1.WatchModulesRequest{FromRevision: from})
				if err != nil {
					return err
				}
				out := cmd.OutOrStdout()
				for {
					m, err := stream.Recv()
					if err != nil {
						if errors.Is(err, io.EOF) || cmd.Context().Err() != nil {
							return nil
						}
						return err
					}
					if wantJSON() {
						b, err := protojson.Marshal(m)
						if err != nil {
							return err
						}
						fmt.Fprintln(out, string(b))
						continue
					}
					r := m.GetRegistration()
					switch {
					case m.GetCaughtUp():
						fmt.Fprintf(out, "revision %d: caught up\n", m.GetRevision())
					case !names.HasFingerprint(r.GetFingerprint()):
						fmt.Fprintf(out, "revision %d: %s has no registration\n", m.GetRevision(), r.GetModule())
					default:
						fmt.Fprintf(out, "revision %d: %s runs at %s (registration %d by %s)\n", m.GetRevision(), r.GetModule(), r.GetFingerprint(), r.GetSeq(), r.GetRegisteredBy())
					}
				}
			})
		},
	}
	cmd.Flags().Uint64Var(&from, "from-revision", 0, "only registrations changed after this revision")
	return cmd
}

func newCatalogPublishCmd() *cobra.Command {
	var o publish.Options
	var artifacts []string
	cmd := &cobra.Command{
		Use:   "publish DIR...",
		Short: "Publish module directories: entry, artifacts, DONE build, registration (what CI runs; needs a builder identity)",
		Long: `Publish each module directory: compute its source digest, build its entry
from module.yaml, upload its artifacts, record the DONE build and register
the module at the new fingerprint. Nothing changes when nothing changed.
Repository, path and commit come from git unless given. The format of
module.yaml is documented in the package mesh.dev/services/catalog/publish
and examples are in examples/modules.`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if o.Path != "" && len(args) > 1 {
				return errors.New("--path names one module's directory: give one DIR with it")
			}
			if len(artifacts) > 0 {
				o.Artifacts = map[string]string{}
				for _, a := range artifacts {
					ref, file, ok := strings.Cut(a, "=")
					if !ok || ref == "" || file == "" {
						return fmt.Errorf("--artifact %q is not REF=FILE", a)
					}
					o.Artifacts[ref] = file
				}
			}
			// Said before anything is written: an operator may store an
			// entry but not its build or artifacts, which would leave the
			// publish half done.
			if id, ok := callerIdentity(); ok && id.Role != identity.RoleBuilder {
				return fmt.Errorf("publishing needs a builder identity, e.g. --identity builder-ci (this certificate is %s)", id)
			}
			return withCatalog(func(c catalogv1.CatalogServiceClient) error {
				var errs []error
				enc := json.NewEncoder(cmd.OutOrStdout())
				for _, dir := range args {
					res, err := publish.Dir(cmd.Context(), c, dir, o)
					if status.Code(err) == codes.PermissionDenied {
						err = fmt.Errorf("%w (publishing needs a builder identity, e.g. --identity builder-ci)", err)
					}
					if err != nil {
						errs = append(errs, err)
					}
					if res == nil {
						continue
					}
					if !wantJSON() {
						printPublished(cmd.OutOrStdout(), dir, res)
						continue
					}
					if err := enc.Encode(published{
						Dir: dir, Module: res.Module, Fingerprint: res.Fingerprint, EntryCreated: res.EntryCreated,
						Uploaded: res.Uploaded, BuildRecorded: res.BuildRecorded, Registered: res.Registered,
						Seq: res.Registration.GetSeq(), Notes: res.Notes,
					}); err != nil {
						return err
					}
				}
				return errors.Join(errs...)
			})
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.Repository, "repository", "", "repository of the modules (default: git remote origin)")
	f.StringVar(&o.Path, "path", "", "the module's directory in the repository (default: from git)")
	f.StringVar(&o.Commit, "commit", "", "commit to record (default: git HEAD when the directory is clean)")
	f.BoolVar(&o.NoGit, "no-git", false, "do not ask git")
	f.BoolVar(&o.NoRegister, "no-register", false, "record entry and build, register nothing")
	f.StringArrayVar(&o.Problems, "problem", nil, "a problem found by a check (makes the verdict FAIL; repeatable)")
	f.StringArrayVar(&o.Warnings, "warning", nil, "a warning found by a check (makes the verdict WARN; repeatable)")
	f.StringArrayVar(&artifacts, "artifact", nil, "REF=FILE: upload FILE as the artifact REF instead of module.yaml's (repeatable)")
	return cmd
}

func printPublished(w io.Writer, dir string, r *publish.Result) {
	var did []string
	if r.EntryCreated {
		did = append(did, "entry stored")
	}
	if r.Uploaded > 0 {
		did = append(did, fmt.Sprintf("%d artifacts uploaded", r.Uploaded))
	}
	if r.BuildRecorded {
		did = append(did, "build DONE")
	}
	if r.Registered {
		did = append(did, fmt.Sprintf("registered (%d)", r.Registration.GetSeq()))
	}
	if len(did) == 0 {
		did = append(did, "unchanged")
	}
	fmt.Fprintf(w, "%s: %s %s: %s\n", dir, r.Module, r.Fingerprint, strings.Join(did, ", "))
	for _, n := range r.Notes {
		fmt.Fprintf(w, "  note: %s\n", n)
	}
}

// published is a publish result as -o json prints it, one object a line.
type published struct {
	Dir           string   `json:"dir"`
	Module        string   `json:"module"`
	Fingerprint   string   `json:"fingerprint"`
	EntryCreated  bool     `json:"entry_created"`
	Uploaded      int      `json:"uploaded"`
	BuildRecorded bool     `json:"build_recorded"`
	Registered    bool     `json:"registered"`
	Seq           uint64   `json:"seq,omitempty"`
	Notes         []string `json:"notes,omitempty"`
}

func isNotFound(err error) bool { return status.Code(err) == codes.NotFound }
