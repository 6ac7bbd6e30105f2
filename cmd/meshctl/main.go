// Command meshctl is the operator's tool for mesh: the dev mesh, certificates,
// keys, the catalog, node specs, plans, approvals, status, verification and
// backups.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"
)

// commands holds the constructors of meshctl's top-level commands; each
// command's file adds its own from an init function, so command groups live
// in separate files without a shared list to edit.
var commands []func() *cobra.Command

func register(newCmd func() *cobra.Command) { commands = append(commands, newCmd) }

// rootHooks change the root command before its subcommands are added (the
// shared connection flags, for instance).
var rootHooks []func(*cobra.Command)

func newRootCmd() *cobra.Command {
	root := &cobra.Command{
		Use:           "meshctl",
		Short:         "Operate mesh: signed, content-addressed configuration delivery",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	for _, hook := range rootHooks {
		hook(root)
	}
	for _, newCmd := range commands {
		root.AddCommand(newCmd())
	}
	return root
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := newRootCmd().ExecuteContext(ctx)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "meshctl:", err)
		os.Exit(1)
	}
}
