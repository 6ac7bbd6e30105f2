package main

import (
	"github.com/spf13/cobra"

	"mesh.dev/cmd/meshctl/benchconverge"
)

func init() { registerBench(newBenchConvergeCmd) }

func newBenchConvergeCmd() *cobra.Command {
	var o benchconverge.Options
	cmd := &cobra.Command{
		Use:   "converge",
		Short: "N engines in one process, a fleet-wide change to one module: change-to-applied p50/p99 and time to 100 %",
		Long: `converge runs the whole mesh in this process with --engines node engines, each with its
own mTLS Sync stream and its own root (on /dev/shm when it exists), places a module
on every node, then changes it once and measures, per engine, the time from the
RegisterModule call returning to its apply of the new composition. It prints p50,
p99 and the time to 100 % applied, beside the same-run baseline: the change's KV
writes (compositions, judgement records, assignments) done raw with the same
concurrency. Also the engine's verify cost per 12 KB composition. JetStream runs
with sync_interval always (the embedded default) unless --lazy. With --changes N
the change is made N times, one after the other: each change's figures, then the
change whose p99 is the median in full, which is steadier run to run.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return benchconverge.Run(cmd.Context(), o, cmd.OutOrStdout())
		},
	}
	f := cmd.Flags()
	f.IntVar(&o.Engines, "engines", 200, "how many node engines (up to 1,000 and beyond)")
	f.BoolVar(&o.LazySync, "lazy", false, "JetStream with periodic fsync instead of sync_interval always")
	f.IntVar(&o.Workers, "workers", 0, "nodes composed at once (default the benchmark's)")
	f.StringVar(&o.Dir, "dir", "", "where JetStream, keys and certificates live (default a temp dir)")
	f.StringVar(&o.NodesDir, "nodes-dir", "", "where the engines' roots live (default /dev/shm)")
	f.DurationVar(&o.Timeout, "timeout", benchconverge.DefaultTimeout, "bound of each phase")
	f.BoolVar(&o.Breakdown, "breakdown", false, "print where the change's time went, span by span")
	f.StringVar(&o.CPUProfile, "cpuprofile", "", "write the change's CPU profile here")
	f.StringVar(&o.MemProfile, "memprofile", "", "write the allocation profiles at the change's start (FILE.base) and end (FILE) here")
	f.IntVar(&o.Changes, "changes", 1, "fleet-wide changes one after the other: each one's figures, and the median change's in full (the breakdown and profiles cover the first)")
	return cmd
}
