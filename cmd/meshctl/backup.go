package main

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"

	"mesh.dev/cmd/meshctl/backup"
	"mesh.dev/internal/natsx"
)

func init() {
	register(newBackupCmd)
	register(newRestoreCmd)
}

// natsFlags say how backup and restore reach NATS: directly, as an
// operator does from a machine that reaches the cluster, with the NATS
// user's credentials (not a mesh service certificate).
type natsFlags struct {
	url, ca, cert, key, creds string
}

func (f *natsFlags) add(cmd *cobra.Command) {
	fl := cmd.Flags()
	fl.StringVar(&f.url, "nats-url", os.Getenv("MESH_NATS_URL"), "NATS server URL(s), comma-separated (env MESH_NATS_URL)")
	fl.StringVar(&f.ca, "nats-ca", os.Getenv("MESH_NATS_CA"), "CA certificate that verifies the NATS servers (env MESH_NATS_CA)")
	fl.StringVar(&f.cert, "nats-cert", os.Getenv("MESH_NATS_CERT"), "client certificate for NATS mutual TLS (env MESH_NATS_CERT)")
	fl.StringVar(&f.key, "nats-key", os.Getenv("MESH_NATS_KEY"), "client key for NATS mutual TLS (env MESH_NATS_KEY)")
	fl.StringVar(&f.creds, "nats-creds", os.Getenv("MESH_NATS_CREDS"), "NATS credentials file (env MESH_NATS_CREDS)")
}

func (f *natsFlags) connect(ctx context.Context, cmd *cobra.Command, name string) (*nats.Conn, jetstream.JetStream, error) {
	if f.url == "" {
		return nil, nil, errors.New("--nats-url is required (or MESH_NATS_URL)")
	}
	// Connection events below warnings (a disconnect on close) are noise
	// on an operator's terminal.
	log := slog.New(slog.NewTextHandler(cmd.ErrOrStderr(), &slog.HandlerOptions{Level: slog.LevelWarn}))
	return natsx.Connect(ctx, natsx.ConnConfig{URL: f.url, Name: name, CAFile: f.ca, CertFile: f.cert, KeyFile: f.key, CredsFile: f.creds, Logger: log})
}

func newBackupCmd() *cobra.Command {
	var (
		nf     natsFlags
		out    string
		verify bool
		idle   time.Duration
	)
	cmd := &cobra.Command{
		Use:   "backup --nats-url URL --out FILE|DIR",
		Short: "Write the truth buckets and stores of JetStream into one verifiable archive",
		Long: `backup connects to NATS and writes the truth of DESIGN.md §9 into one tar archive:
the KV buckets catalog-entries, catalog-builds, catalog-modules, nodes, approvals,
assignments (with their kept history) and keysets, each message with its headers,
and every object of the artifacts store, each with its sha256, and a manifest of
counts and sums. Of the derived data it keeps only the compositions the archived
assignments' wants name and the objects those name (a want held at a fingerprint
that is no longer registered names a composition no pass rebuilds); composed,
haves, status and the rest of compositions and objects the composer rebuilds.

--out names the file, or a directory to write mesh-backup-<UTC time>.tar into; an
existing file is never overwritten. The archive is written to <file>.partial and
renamed when complete, then read back and verified.

The signer's state dir (manifest revisions, fencing epoch, audit log) is not in
NATS: copy it while the signer is stopped (docs/backup.md).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if out == "" {
				return errors.New("--out is required")
			}
			path, err := backupPath(out, time.Now())
			if err != nil {
				return err
			}
			ctx := cmd.Context()
			nc, js, err := nf.connect(ctx, cmd, "meshctl-backup")
			if err != nil {
				return err
			}
			defer nc.Close()
			w := cmd.OutOrStdout()
			fmt.Fprintf(w, "backing up %s into %s\n", nc.ConnectedUrlRedacted(), path)
			src := backup.Source{URL: nc.ConnectedUrlRedacted(), Server: nc.ConnectedServerName(), Version: nc.ConnectedServerVersion(), Cluster: nc.ConnectedClusterName()}
			opts := backup.Options{Source: src, Idle: idle, Progress: func(b backup.BucketSummary) { printBucket(w, b) }}
			sum, size, err := writeAtomically(path, func(f io.Writer) error {
				_, err := backup.Backup(ctx, js, f, opts)
				return err
			})
			if err != nil {
				return err
			}
			fmt.Fprintf(w, "wrote %s: %s, sha256 %s\n", path, backup.Bytes(size), sum)
			if verify {
				f, err := os.Open(path)
				if err != nil {
					return err
				}
				defer f.Close()
				if _, err := backup.Verify(bufio.NewReaderSize(f, 1<<20)); err != nil {
					return fmt.Errorf("the archive just written does not verify: %w", err)
				}
				fmt.Fprintln(w, "verified")
			}
			fmt.Fprintln(w, "the signer's state dir is not in the archive: copy it while the signer is stopped")
			return nil
		},
	}
	nf.add(cmd)
	f := cmd.Flags()
	f.StringVar(&out, "out", "", "archive file, or a directory to write mesh-backup-<UTC time>.tar into")
	f.BoolVar(&verify, "verify", true, "read the archive back and verify it once written")
	f.DurationVar(&idle, "idle", backup.DefaultIdle, "how long one read waits for messages a stream still holds")
	cmd.AddCommand(newBackupVerifyCmd())
	return cmd
}

func newBackupVerifyCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "verify FILE",
		Short: "Check a backup archive offline: every file against the manifest's sizes and sha256 sums",
		Long: `verify reads a whole archive without connecting to anything and checks that every
record decodes and is followed by its value or content with the size and sha256 it
states, that the manifest lists exactly the files read with their sums and counts
every bucket, and that the manifest's own sha256 matches. It exits non-zero naming
the first file that is wrong.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			f, err := os.Open(args[0])
			if err != nil {
				return err
			}
			defer f.Close()
			m, err := backup.Verify(bufio.NewReaderSize(f, 1<<20))
			if err != nil {
				return fmt.Errorf("%s: %w", args[0], err)
			}
			w := cmd.OutOrStdout()
			if wantJSON() {
				m.Files = nil
				enc := json.NewEncoder(w)
				enc.SetIndent("", "  ")
				return enc.Encode(m)
			}
			backup.Describe(w, m)
			fmt.Fprintf(w, "%s: OK (%d files)\n", args[0], len(m.Files)+2)
			return nil
		},
	}
}

func newRestoreCmd() *cobra.Command {
	var (
		nf       natsFlags
		replicas int
		force    bool
		idle     time.Duration
	)
	cmd := &cobra.Command{
		Use:   "restore --nats-url URL FILE",
		Short: "Bring a backup archive's buckets and stores back into an empty JetStream",
		Long: `restore verifies the archive, then creates the buckets and stores it holds with the
settings of DESIGN.md §9 and writes every archived KV message (with its headers
and kept history) and object back, byte for byte, and reads them back to check.
It refuses, writing nothing, when a target bucket it would write holds any
message or a composer holds the lease; --force writes over what is there (keys
and objects the archive holds end with its values; others keep theirs).

Run it before the catalog and the composers start (they create the buckets empty,
which restore accepts); start the signer with its state dir as copied while it
was stopped. The composer then rebuilds compositions, judgements, objects, status
and haves by recomposing, and re-signs above every engine's high-water mark.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			f, err := os.Open(args[0])
			if err != nil {
				return err
			}
			defer f.Close()
			ctx := cmd.Context()
			nc, js, err := nf.connect(ctx, cmd, "meshctl-restore")
			if err != nil {
				return err
			}
			defer nc.Close()
			w := cmd.OutOrStdout()
			fmt.Fprintf(w, "restoring %s into %s\n", args[0], nc.ConnectedUrlRedacted())
			m, _, err := backup.Restore(ctx, js, f, backup.RestoreOptions{
				Replicas: replicas, Force: force, Idle: idle,
				Progress: func(b backup.RestoredBucket) {
					line := fmt.Sprintf("  %-16s %6d written %10s  R%d", b.Name, b.Records, backup.Bytes(b.Bytes), b.Replicas)
					if b.Kept > 0 {
						line += fmt.Sprintf("  (%d already held)", b.Kept)
					}
					fmt.Fprintln(w, line)
				},
			})
			if err != nil {
				return err
			}
			fmt.Fprintf(w, "restored the backup taken %s; start the signer (its state dir as copied), the catalog and the composers: the composer rebuilds the derived buckets\n",
				m.StartedAt.UTC().Format(time.RFC3339))
			return nil
		},
	}
	nf.add(cmd)
	f := cmd.Flags()
	f.IntVar(&replicas, "replicas", 0, "replicas of every bucket created (0: each bucket's count in the archive; 1 on one server, 3 on a cluster)")
	f.BoolVar(&force, "force", false, "restore into buckets that hold messages, and while a composer holds the lease")
	f.DurationVar(&idle, "idle", backup.DefaultIdle, "how long one read-back waits for messages a stream still holds")
	return cmd
}

func printBucket(w io.Writer, b backup.BucketSummary) {
	unit := "records"
	if b.Kind == backup.KindObject {
		unit = "objects"
	}
	line := fmt.Sprintf("  %-16s %6d %s %6d keys %10s", b.Name, b.Records, unit, b.Keys, backup.Bytes(b.Bytes))
	if b.Absent {
		line += "  (no such bucket in the source)"
	}
	fmt.Fprintln(w, line)
	for _, s := range b.Skipped {
		fmt.Fprintf(w, "    skipped %s\n", s)
	}
}

// backupPath returns the archive file --out names: the value itself, or a
// timestamped file in it when it is a directory. An existing file is refused.
func backupPath(out string, now time.Time) (string, error) {
	path := out
	if st, err := os.Stat(out); err == nil && st.IsDir() || strings.HasSuffix(out, string(os.PathSeparator)) {
		if err := os.MkdirAll(out, 0o700); err != nil {
			return "", err
		}
		path = filepath.Join(out, "mesh-backup-"+now.UTC().Format("20060102T150405Z")+".tar")
	}
	if _, err := os.Stat(path); err == nil {
		return "", fmt.Errorf("%s exists: a backup never overwrites one", path)
	}
	return path, nil
}

// writeAtomically writes path through write: into path.partial, fsynced,
// then linked to path (which fails if path appeared meanwhile) and the
// partial file removed. A failed write leaves nothing behind. It returns the
// file's sha256 and size.
func writeAtomically(path string, write func(io.Writer) error) (string, int64, error) {
	tmp := path + ".partial"
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return "", 0, err
	}
	ok := false
	defer func() {
		if !ok {
			f.Close()
			os.Remove(tmp)
		}
	}()
	h := sha256.New()
	cw := &countingWriter{w: io.MultiWriter(f, h)}
	bw := bufio.NewWriterSize(cw, 1<<20)
	if err := write(bw); err != nil {
		return "", 0, err
	}
	if err := bw.Flush(); err != nil {
		return "", 0, err
	}
	if err := f.Sync(); err != nil {
		return "", 0, err
	}
	if err := f.Close(); err != nil {
		return "", 0, err
	}
	if err := os.Link(tmp, path); err != nil {
		// A file system without hard links: rename, having checked.
		if errors.Is(err, os.ErrExist) {
			return "", 0, fmt.Errorf("finish %s: %w", path, err)
		}
		if _, serr := os.Stat(path); serr == nil {
			return "", 0, fmt.Errorf("finish %s: it appeared while the backup ran", path)
		}
		if err := os.Rename(tmp, path); err != nil {
			return "", 0, fmt.Errorf("finish %s: %w", path, err)
		}
	}
	ok = true
	os.Remove(tmp)
	if d, err := os.Open(filepath.Dir(path)); err == nil {
		d.Sync()
		d.Close()
	}
	return hexSum(h), cw.n, nil
}

func hexSum(h hash.Hash) string { return hex.EncodeToString(h.Sum(nil)) }

type countingWriter struct {
	w io.Writer
	n int64
}

func (c *countingWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}
