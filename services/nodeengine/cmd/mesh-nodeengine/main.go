// Command mesh-nodeengine runs a node's engine (DESIGN.md §7): it streams
// its haves to the composer and receives its signed manifest, verifies
// everything against the pinned root keys and applies it under the allowed
// prefixes. It runs as root on every machine of a fleet.
//
//	mesh-nodeengine [--config FILE] --state-dir DIR --roots FILE --allow-prefix /etc/app [--allow-prefix ...]
//	    --composer ADDR --catalog ADDR --cert FILE --key FILE --ca FILE [--root /] [--admin-listen 127.0.0.1:7404]
package main

import (
	"context"
	"flag"
	"fmt"
	"os"

	"mesh.dev/internal/config"
	"mesh.dev/internal/svcmain"
	"mesh.dev/internal/telemetry"
	"mesh.dev/services/nodeengine/app"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "mesh-nodeengine:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	fs := flag.NewFlagSet("mesh-nodeengine", flag.ContinueOnError)
	configFile := fs.String("config", "", "YAML config file (unknown keys are refused)")
	var over app.Config
	var prefixes config.Strings
	fs.StringVar(&over.Root, "root", "", "directory prepended to every path written (default /)")
	fs.StringVar(&over.StateDir, "state-dir", "", "state dir (kept state, staged content, adopted content)")
	fs.StringVar(&over.RootsFile, "roots", "", "pinned root keys (TrustRoots protojson)")
	fs.Var(&prefixes, "allow-prefix", "a path the engine may write under (repeat)")
	fs.StringVar(&over.ComposerAddr, "composer", "", "composer address")
	fs.StringVar(&over.CatalogAddr, "catalog", "", "catalog address")
	fs.StringVar(&over.AdminListen, "admin-listen", "", "admin API address (default "+app.DefaultAdminListen+")")
	fs.StringVar(&over.MetricsListen, "metrics-listen", "", "Prometheus /metrics address")
	fs.StringVar(&over.CertFile, "cert", "", "the node's certificate (spiffe://<td>/node/<name>)")
	fs.StringVar(&over.KeyFile, "key", "", "the certificate's key")
	fs.StringVar(&over.CAFile, "ca", "", "the CA certificate")
	fs.Var(&over.DriftInterval, "drift-interval", "how often to look for drift (default 1m)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	var cfg app.Config
	if err := config.Load(*configFile, &cfg); err != nil {
		return err
	}
	for _, f := range []struct{ dst, src *string }{
		{&cfg.Root, &over.Root}, {&cfg.StateDir, &over.StateDir}, {&cfg.RootsFile, &over.RootsFile},
		{&cfg.ComposerAddr, &over.ComposerAddr}, {&cfg.CatalogAddr, &over.CatalogAddr},
		{&cfg.AdminListen, &over.AdminListen}, {&cfg.MetricsListen, &over.MetricsListen},
		{&cfg.CertFile, &over.CertFile}, {&cfg.KeyFile, &over.KeyFile}, {&cfg.CAFile, &over.CAFile},
	} {
		if *f.src != "" {
			*f.dst = *f.src
		}
	}
	if len(prefixes) > 0 {
		cfg.AllowPrefixes = prefixes
	}
	if over.DriftInterval != 0 {
		cfg.DriftInterval = over.DriftInterval
	}
	cfg.Defaults()
	if err := cfg.Validate(); err != nil {
		return err
	}

	return svcmain.Serve("mesh-nodeengine", app.Version, cfg.MetricsListen, func(ctx context.Context, tel *telemetry.Telemetry) error {
		return app.Run(ctx, cfg, app.Options{Logger: tel.Logger, TracerProvider: tel.TracerProvider, MeterProvider: tel.MeterProvider})
	})
}
