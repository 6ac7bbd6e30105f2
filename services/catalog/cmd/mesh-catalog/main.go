// Command mesh-catalog holds what module builds are: entries by
// fingerprint, builds, registrations and artifacts (DESIGN.md §3), in
// JetStream, either an embedded server (the one-machine default) or an
// external cluster.
//
//	mesh-catalog serve --config FILE [flags]
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"

	"mesh.dev/internal/config"
	"mesh.dev/internal/natsx"
	"mesh.dev/internal/svcmain"
	"mesh.dev/internal/telemetry"
	"mesh.dev/services/catalog/app"
)

const usage = `usage:
  mesh-catalog serve --config FILE [--listen ADDR] [--metrics-listen ADDR|off]
                     [--nats-embedded-dir DIR [--nats-embedded-listen ADDR]]
                     [--nats-url URL [--nats-ca FILE] [--nats-cert FILE --nats-key FILE] [--nats-creds FILE]]
                     [--nats-replicas N]

With no NATS in the file or the flags, the catalog runs an embedded NATS
server with JetStream in ` + app.DefaultEmbeddedDir + ` (fsynced on every write),
listening on ` + app.DefaultEmbeddedListen + ` for the other services of the machine.`

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "mesh-catalog:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	if len(args) == 0 {
		return errors.New(usage)
	}
	switch args[0] {
	case "serve":
		return serve(args[1:])
	case "-h", "--help", "help":
		fmt.Println(usage)
		return nil
	}
	return fmt.Errorf("unknown command %q\n%s", args[0], usage)
}

func serve(args []string) error {
	cfg, err := loadConfig(args)
	if err != nil {
		return err
	}
	metricsAddr := cfg.MetricsListen
	if metricsAddr == app.MetricsOff {
		metricsAddr = ""
	}
	return svcmain.Serve("mesh-catalog", "", metricsAddr, func(ctx context.Context, tel *telemetry.Telemetry) error {
		return app.Run(ctx, cfg, app.Options{Logger: tel.Logger, TracerProvider: tel.TracerProvider, MeterProvider: tel.MeterProvider})
	})
}

// loadConfig reads the file, lays the flags over it, fills in the defaults
// and validates the result.
func loadConfig(args []string) (app.Config, error) {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	configFile := fs.String("config", "", "YAML config file (unknown keys are refused)")
	var over app.Config
	fs.StringVar(&over.Listen, "listen", "", "gRPC listen address (default "+app.DefaultListen+")")
	fs.StringVar(&over.MetricsListen, "metrics-listen", "", "Prometheus /metrics listen address (default "+app.DefaultMetricsListen+"; off for none)")
	natsFlags := natsx.RegisterFlags(fs, natsx.FlagDefault{EmbeddedDir: app.DefaultEmbeddedDir})
	if err := fs.Parse(args); err != nil {
		return app.Config{}, err
	}
	if fs.NArg() > 0 {
		return app.Config{}, fmt.Errorf("serve takes no arguments, got %q", fs.Args())
	}
	var cfg app.Config
	if err := config.Load(*configFile, &cfg); err != nil {
		return app.Config{}, err
	}
	svcmain.Override(&cfg.Listen, over.Listen)
	svcmain.Override(&cfg.MetricsListen, over.MetricsListen)
	natsFlags.Apply(&cfg.NATS)
	cfg.Defaults()
	if err := cfg.Validate(); err != nil {
		return app.Config{}, err
	}
	return cfg, nil
}
