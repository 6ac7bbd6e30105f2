package main

import "github.com/spf13/cobra"

// benchCommands holds the constructors of `meshctl bench` subcommands; each
// benchmark's file adds its own from an init function.
var benchCommands []func() *cobra.Command

func registerBench(newCmd func() *cobra.Command) { benchCommands = append(benchCommands, newCmd) }

func init() { register(newBenchCmd) }

func newBenchCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Benchmarks that print their figure and a same-run baseline",
	}
	for _, newSub := range benchCommands {
		cmd.AddCommand(newSub())
	}
	return cmd
}
