// Command mesh-composer turns node specs into signed compositions and
// manifests and serves node engines' Sync streams (DESIGN.md §5, §6). Run
// several replicas: any serves reads and streams; only the holder of the
// composer lease writes.
//
//	mesh-composer serve --config FILE [flags]
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
	"mesh.dev/services/composer/app"
)

const usage = `usage:
  mesh-composer serve --config FILE [--listen ADDR] [--metrics-listen ADDR]
                      [--signer-addr ADDR] [--catalog-addr ADDR] [--holder NAME]
                      [--nats-url URL [--nats-ca FILE] [--nats-cert FILE --nats-key FILE] [--nats-creds FILE]
                       | --nats-embedded-dir DIR] [--nats-replicas N]

With no NATS in the file or the flags, the composer connects to
` + natsx.DefaultEmbeddedURL + `: the embedded server mesh-catalog runs on the same machine.`

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "mesh-composer:", err)
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
	return svcmain.Serve("mesh-composer", "", cfg.MetricsListen, func(ctx context.Context, tel *telemetry.Telemetry) error {
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
	fs.StringVar(&over.MetricsListen, "metrics-listen", "", "Prometheus /metrics listen address")
	fs.StringVar(&over.SignerAddr, "signer-addr", "", "signer address")
	fs.StringVar(&over.CatalogAddr, "catalog-addr", "", "catalog address")
	fs.StringVar(&over.Holder, "holder", "", "this replica's name in the lease (default host-pid)")
	natsFlags := natsx.RegisterFlags(fs, natsx.FlagDefault{URL: natsx.DefaultEmbeddedURL})
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
	svcmain.Override(&cfg.SignerAddr, over.SignerAddr)
	svcmain.Override(&cfg.CatalogAddr, over.CatalogAddr)
	svcmain.Override(&cfg.Holder, over.Holder)
	natsFlags.Apply(&cfg.NATS)
	cfg.Defaults()
	if err := cfg.Validate(); err != nil {
		return app.Config{}, err
	}
	return cfg, nil
}
