package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"mesh.dev/cmd/meshctl/onebox"
	"mesh.dev/internal/identity"
	composerv1 "mesh.dev/proto/mesh/composer/v1"
)

func init() { register(newDevCmd) }

func newDevCmd() *cobra.Command {
	var (
		nodes      int
		dataDir    string
		basePort   int
		otlp       string
		modulesDir string
		timeout    time.Duration
	)
	cmd := &cobra.Command{
		Use:   "dev",
		Short: "Run the whole mesh in one process: embedded NATS, catalog, signer, composer and N node engines",
		Long: `dev starts an embedded JetStream, the catalog, the signer, the composer and --nodes
node engines in this process, over real mTLS with a dev CA kept in --data-dir. It
publishes the example modules, places them on the nodes, and prints a status table
until the fleet converged; then it prints the grpcurl commands to ask each service
and keeps running until interrupted. Each engine applies into
<data-dir>/nodes/<name>/root. A second run reuses the data dir.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			out := cmd.OutOrStdout()
			if otlp != "" {
				os.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", otlpURL(otlp))
				if os.Getenv("OTEL_EXPORTER_OTLP_INSECURE") == "" {
					os.Setenv("OTEL_EXPORTER_OTLP_INSECURE", "true")
				}
			}
			if err := os.MkdirAll(filepath.Join(dataDir, "logs"), 0o700); err != nil {
				return err
			}
			logPath := filepath.Join(dataDir, "logs", "mesh.log")
			logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
			if err != nil {
				return err
			}
			defer logFile.Close()

			ctx := cmd.Context()
			fmt.Fprintf(out, "starting the mesh in %s (%d nodes; logs in %s)\n", dataDir, nodes, logPath)
			m, err := onebox.Start(ctx, onebox.Options{DataDir: dataDir, Nodes: nodes, BasePort: basePort, LogOutput: logFile})
			if err != nil {
				return err
			}
			defer m.Stop()
			fmt.Fprintf(out, "catalog %s  signer %s  composer %s  nats %s\n", m.Catalog, m.Signer, m.Composer, m.NATSURL)

			if modulesDir != "" {
				results, err := m.PublishModules(ctx, modulesDir)
				if err != nil {
					return fmt.Errorf("publish %s: %w", modulesDir, err)
				}
				for _, r := range results {
					what := "unchanged"
					if r.Changed() {
						what = "published"
					}
					fmt.Fprintf(out, "module %-14s %s %s\n", r.Module, shortFP(r.Fingerprint), what)
				}
			}
			if err := m.PutDevNodes(ctx); err != nil {
				return err
			}
			fmt.Fprintf(out, "placed modules on %d nodes; converging...\n", nodes)
			actx, acancel := context.WithTimeout(ctx, timeout)
			approved, err := m.ApproveFirstPlacements(actx)
			acancel()
			if err != nil && ctx.Err() == nil {
				fmt.Fprintf(out, "approving first placements: %v\n", err)
			}
			for module, on := range approved {
				fmt.Fprintf(out, "approved the first placement of %s (its policy holds new placements) on %s\n", module, strings.Join(on, ", "))
			}

			wctx, cancel := context.WithTimeout(ctx, timeout)
			fetch := func(ctx context.Context) ([]*composerv1.NodeStatus, error) { return m.Status(ctx) }
			werr := WaitConverged(wctx, out, fetch, nil, nodes, true)
			cancel()
			if errors.Is(werr, context.Canceled) && ctx.Err() != nil {
				return nil
			}
			if werr != nil {
				fmt.Fprintf(out, "\nthe fleet did not converge within %s (see the reasons above and %s); the mesh keeps running\n", timeout, logPath)
			} else {
				fmt.Fprintln(out, "\nthe fleet converged")
			}
			printDevHelp(out, m)
			<-ctx.Done()
			fmt.Fprintln(out, "stopping")
			return m.Err()
		},
	}
	f := cmd.Flags()
	f.IntVar(&nodes, "nodes", 3, "how many node engines to run")
	f.StringVar(&dataDir, "data-dir", ".dev", "where certificates, keys, JetStream and node roots live (reused)")
	f.IntVar(&basePort, "base-port", 7400, "catalog listens on base+1, signer +2, composer +3, engine i +10+i, NATS +22")
	f.StringVar(&otlp, "otlp-endpoint", "", "export traces to this OTLP/gRPC endpoint (host:port), e.g. a local Jaeger")
	f.StringVar(&modulesDir, "modules", "examples/modules", "publish the modules in this directory (empty: none)")
	f.DurationVar(&timeout, "timeout", 2*time.Minute, "how long to wait for the fleet to converge")
	return cmd
}

func otlpURL(endpoint string) string {
	if strings.Contains(endpoint, "://") {
		return endpoint
	}
	return "http://" + endpoint
}

func printDevHelp(w io.Writer, m *onebox.Mesh) {
	cert, key, ca := m.CertFiles(identity.RoleOperator, "admin")
	flags := fmt.Sprintf("-cacert %s -cert %s -key %s", ca, cert, key)
	fmt.Fprintf(w, "\nask any service with grpcurl (./bin/grpcurl; `make tools` builds it):\n")
	fmt.Fprintf(w, "  ./bin/grpcurl %s %s list\n", flags, m.Composer)
	fmt.Fprintf(w, "  ./bin/grpcurl %s %s mesh.composer.v1.ComposerService/ListStatus\n", flags, m.Composer)
	fmt.Fprintf(w, "  ./bin/grpcurl %s %s mesh.catalog.v1.CatalogService/ListModules\n", flags, m.Catalog)
	fmt.Fprintf(w, "  ./bin/grpcurl %s %s mesh.signer.v1.SignerService/GetKeyset\n", flags, m.Signer)
	for _, e := range m.Engines {
		fmt.Fprintf(w, "  ./bin/grpcurl %s %s mesh.nodeengine.v1.NodeEngineService/GetStatus   # %s, root %s\n", flags, e.Admin, e.Node, e.Root)
	}
	fmt.Fprintf(w, "\nmeshctl talks to the same mesh with:\n  export MESH_CERTS_DIR=%s MESH_COMPOSER=%s MESH_CATALOG=%s MESH_SIGNER=%s\n  go run ./cmd/meshctl status --why\n  go run ./cmd/meshctl keys served\n",
		m.CertsDir, m.Composer, m.Catalog, m.Signer)
	if len(m.Engines) > 0 {
		fmt.Fprintf(w, "  go run ./cmd/meshctl engine status --nodeengine %s   # %s's engine; engine views, engine again FP\n", m.Engines[0].Admin, m.Engines[0].Node)
	}
	if ep := os.Getenv("OTEL_EXPORTER_OTLP_ENDPOINT"); ep != "" {
		fmt.Fprintf(w, "\ntraces go to %s (OTLP/gRPC): one trace per module registration, through catalog, composer, signer, JetStream and every engine's apply\n", ep)
	} else {
		fmt.Fprintf(w, "\ntraces: run with --otlp-endpoint localhost:4317 (or OTEL_EXPORTER_OTLP_ENDPOINT) to export them\n")
	}
	fmt.Fprintln(w, "\nrunning; Ctrl-C stops")
}
