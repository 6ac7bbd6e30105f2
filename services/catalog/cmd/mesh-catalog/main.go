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
	"mesh.dev/internal/svcmain"
	"mesh.dev/internal/telemetry"
	"mesh.dev/services/catalog/app"
)

const usage = `usage:
  mesh-catalog serve --config FILE [--listen ADDR] [--metrics-listen ADDR|off]
                     [--nats-embedded-dir DIR [--nats-embedded-listen ADDR]]
                     [--nats-url URL [--nats-ca FILE] [--nats-cert FILE --nats-key FILE] [--nats-creds FILE]]
                     [--nats-replicas N]`

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
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	configFile := fs.String("config", "", "YAML config file (unknown keys are refused)")
	var over app.Config
	fs.StringVar(&over.Listen, "listen", "", "gRPC listen address (default "+app.DefaultListen+")")
	fs.StringVar(&over.MetricsListen, "metrics-listen", "", "Prometheus /metrics listen address (default "+app.DefaultMetricsListen+"; off for none)")
	fs.StringVar(&over.NATS.EmbeddedDir, "nats-embedded-dir", "", "run an embedded NATS server storing JetStream here")
	fs.StringVar(&over.NATS.EmbeddedListen, "nats-embedded-listen", "", "client address of the embedded server (default "+app.DefaultEmbeddedListen+")")
	fs.StringVar(&over.NATS.URL, "nats-url", "", "URL(s) of an external NATS server or cluster")
	fs.StringVar(&over.NATS.CAFile, "nats-ca", "", "CA file verifying the NATS server")
	fs.StringVar(&over.NATS.CertFile, "nats-cert", "", "client certificate file for NATS")
	fs.StringVar(&over.NATS.KeyFile, "nats-key", "", "client key file for NATS")
	fs.StringVar(&over.NATS.CredsFile, "nats-creds", "", "NATS credentials file")
	fs.IntVar(&over.NATS.Replicas, "nats-replicas", 0, "replicas of the catalog's buckets (1, or 3 on a cluster)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	var cfg app.Config
	if err := config.Load(*configFile, &cfg); err != nil {
		return err
	}
	svcmain.Override(&cfg.Listen, over.Listen)
	svcmain.Override(&cfg.MetricsListen, over.MetricsListen)
	if over.NATS.URL != "" {
		// A URL on the command line replaces an embedded server of the file.
		cfg.NATS.EmbeddedDir, cfg.NATS.EmbeddedListen = "", ""
	}
	if over.NATS.EmbeddedDir != "" {
		cfg.NATS.URL = ""
	}
	svcmain.Override(&cfg.NATS.EmbeddedDir, over.NATS.EmbeddedDir)
	svcmain.Override(&cfg.NATS.EmbeddedListen, over.NATS.EmbeddedListen)
	svcmain.Override(&cfg.NATS.URL, over.NATS.URL)
	svcmain.Override(&cfg.NATS.CAFile, over.NATS.CAFile)
	svcmain.Override(&cfg.NATS.CertFile, over.NATS.CertFile)
	svcmain.Override(&cfg.NATS.KeyFile, over.NATS.KeyFile)
	svcmain.Override(&cfg.NATS.CredsFile, over.NATS.CredsFile)
	if over.NATS.Replicas != 0 {
		cfg.NATS.Replicas = over.NATS.Replicas
	}
	cfg.Defaults()
	if err := cfg.Validate(); err != nil {
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
