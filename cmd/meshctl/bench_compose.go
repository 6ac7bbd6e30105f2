package main

import (
	"errors"
	"fmt"
	"log/slog"
	"os"

	"github.com/spf13/cobra"

	"mesh.dev/services/composer/bench"
)

func init() { registerBench(newBenchComposeCmd) }

func newBenchComposeCmd() *cobra.Command {
	var cfg bench.Config
	var verbose, check bool
	cmd := &cobra.Command{
		Use:   "compose",
		Short: "Compose, sign and commit N nodes × M modules; compare with raw JetStream writes of the same messages",
		Long: `Runs a catalog, a signer and a composer in this process over real mTLS on an
embedded JetStream with sync_interval always (the one-machine default), puts N
node specs placing M modules each, and times the composer's first pass (every
node composed, signed through the gRPC signer and committed), a second pass
with nothing changed, and the raw JetStream writes of the same message set
(the compositions, judgement records and assignments the first pass wrote,
pre-built, written with the same concurrency). Targets: a first pass at least
0.5× the raw rate; a second pass that writes nothing in at most 1/5 of the
first pass's time.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if verbose {
				cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
				cfg.Progress = cmd.ErrOrStderr()
			}
			res, err := bench.Run(cmd.Context(), cfg)
			if err != nil {
				return err
			}
			res.Report(cmd.OutOrStdout())
			if check && !res.Meets() {
				return errors.New("bench compose: the targets are not met")
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.IntVar(&cfg.Nodes, "nodes", 1000, fmt.Sprintf("nodes (1..%d)", bench.MaxNodes))
	f.IntVar(&cfg.Modules, "modules", 20, fmt.Sprintf("modules placed on every node (1..%d)", bench.MaxModules))
	f.IntVar(&cfg.Workers, "workers", 64, "nodes composed at once, and raw writers")
	f.StringVar(&cfg.Dir, "dir", "", "directory for the JetStream store and signer state (default: a temporary one, removed)")
	f.BoolVarP(&verbose, "verbose", "v", false, "print progress and the services' warnings on stderr")
	f.BoolVar(&check, "check", false, "exit non-zero when the targets are not met")
	f.StringVar(&cfg.FirstProfile, "cpuprofile-first", "", "write a CPU profile of the first pass to this file")
	f.StringVar(&cfg.SecondProfile, "cpuprofile-second", "", "write a CPU profile of the second pass to this file")
	return cmd
}
