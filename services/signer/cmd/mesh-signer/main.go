// Command mesh-signer holds mesh's online ed25519 key and signs compositions
// and manifests for the composer (DESIGN.md §5.4).
//
//	mesh-signer init --signing-key-file FILE      make the online key (0600) and print its public half
//	mesh-signer serve --config FILE [flags]       serve
//	mesh-signer import-key --from SRC --to DST    copy a key delivered by an orchestrator to an owner-only file
//	mesh-signer audit verify --state-dir DIR      check the audit log's hash chain
package main

import (
	"context"
	"crypto/ed25519"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"

	"mesh.dev/internal/config"
	"mesh.dev/internal/envelope"
	"mesh.dev/internal/keyfile"
	"mesh.dev/internal/svcmain"
	"mesh.dev/internal/telemetry"
	typev1 "mesh.dev/proto/mesh/type/v1"
	"mesh.dev/services/signer/app"
	"mesh.dev/services/signer/internal/audit"
	"mesh.dev/services/signer/internal/keysource"
)

const usage = `usage:
  mesh-signer init --signing-key-file FILE
  mesh-signer serve --config FILE [--listen ADDR] [--state-dir DIR] ...
  mesh-signer import-key --from SRC --to DST
  mesh-signer audit verify --state-dir DIR`

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "mesh-signer:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	if len(args) == 0 {
		return errors.New(usage)
	}
	switch args[0] {
	case "init":
		return initKey(args[1:])
	case "serve":
		return serve(args[1:])
	case "import-key":
		return importKey(args[1:])
	case "audit":
		if len(args) < 2 || args[1] != "verify" {
			return errors.New(usage)
		}
		return verifyAudit(args[2:])
	case "-h", "--help", "help":
		fmt.Println(usage)
		return nil
	}
	return fmt.Errorf("unknown command %q\n%s", args[0], usage)
}

func initKey(args []string) error {
	fs := flag.NewFlagSet("init", flag.ContinueOnError)
	path := fs.String("signing-key-file", "", "where to write the new online key (PKCS#8 PEM, mode 0600)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *path == "" {
		return errors.New("init: --signing-key-file is required")
	}
	src, err := keysource.Init(*path)
	if err != nil {
		return err
	}
	pubPath := *path + ".pub.json"
	pub := &typev1.KeysetKey{Id: src.KeyID(), PublicKey: ed25519.PublicKey(src.Public())}
	if err := keyfile.WriteJSON(pubPath, pub, 0o644); err != nil {
		return err
	}
	fmt.Printf("key %s written to %s\npublic key for `meshctl keys sign-keyset --key %s` written to %s\n", src.KeyID(), *path, pubPath, pubPath)
	return nil
}

// importKey copies a signing key delivered by an orchestrator (a Kubernetes
// Secret, whose files are group-readable at best) into a file only this
// user can read, which is what serve demands. The source is checked to be
// an ed25519 PKCS#8 key; the copy is written atomically with mode 0600.
func importKey(args []string) error {
	fs := flag.NewFlagSet("import-key", flag.ContinueOnError)
	from := fs.String("from", "", "the delivered key file (PKCS#8 PEM)")
	to := fs.String("to", "", "where serve reads it (written 0600, replaced)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *from == "" || *to == "" {
		return errors.New("import-key: --from and --to are required")
	}
	priv, err := keyfile.Parse(*from)
	if err != nil {
		return err
	}
	if err := keyfile.Replace(*to, priv); err != nil {
		return err
	}
	fmt.Printf("key %s imported to %s (mode 0600)\n", envelope.KeyID(priv.Public().(ed25519.PublicKey)), *to)
	return nil
}

func serve(args []string) error {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	configFile := fs.String("config", "", "YAML config file (unknown keys are refused)")
	var over app.Config
	fs.StringVar(&over.Listen, "listen", "", "gRPC listen address (default "+app.DefaultListen+")")
	fs.StringVar(&over.MetricsListen, "metrics-listen", "", "Prometheus /metrics listen address")
	fs.StringVar(&over.StateDir, "state-dir", "", "state dir (revisions, epoch, audit log)")
	fs.StringVar(&over.CatalogAddr, "catalog-addr", "", "catalog address for the cross-check")
	if err := fs.Parse(args); err != nil {
		return err
	}
	var cfg app.Config
	if err := config.Load(*configFile, &cfg); err != nil {
		return err
	}
	if over.Listen != "" {
		cfg.Listen = over.Listen
	}
	if over.MetricsListen != "" {
		cfg.MetricsListen = over.MetricsListen
	}
	if over.StateDir != "" {
		cfg.StateDir = over.StateDir
	}
	if over.CatalogAddr != "" {
		cfg.CatalogAddr = over.CatalogAddr
	}
	cfg.Defaults()
	if err := cfg.Validate(); err != nil {
		return err
	}

	return svcmain.Serve("mesh-signer", "", cfg.MetricsListen, func(ctx context.Context, tel *telemetry.Telemetry) error {
		return app.Run(ctx, cfg, app.Options{Logger: tel.Logger, TracerProvider: tel.TracerProvider, MeterProvider: tel.MeterProvider})
	})
}

func verifyAudit(args []string) error {
	fs := flag.NewFlagSet("audit verify", flag.ContinueOnError)
	stateDir := fs.String("state-dir", "", "the signer's state dir")
	file := fs.String("file", "", "the audit log (default <state-dir>/audit.log)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	path := *file
	if path == "" {
		if *stateDir == "" {
			return errors.New("audit verify: --state-dir or --file is required")
		}
		path = filepath.Join(*stateDir, "audit.log")
	}
	rep, err := audit.Verify(path)
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	fmt.Printf("%s: %d records, chain intact, last seq %d at %s\n", path, rep.Records, rep.Last.Seq, rep.Last.Time.Format("2006-01-02T15:04:05Z07:00"))
	if rep.Torn {
		fmt.Println("the last line is a torn write that was never acknowledged; the signer cuts it off at its next start")
	}
	return nil
}
