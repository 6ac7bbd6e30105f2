package pki

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"mesh.dev/internal/identity"
)

// The file names of a CA in a certificates directory.
const (
	CACertFile = "ca.pem"
	CAKeyFile  = "ca-key.pem"
)

// File modes: private keys are readable by their owner only.
const (
	certMode fs.FileMode = 0o644
	keyMode  fs.FileMode = 0o600
	dirMode  fs.FileMode = 0o700
)

// Basename returns the file base name of id's certificate: the role for a
// service ("signer"), <role>-<name> otherwise ("node-ace").
func Basename(id identity.Identity) string {
	if id.IsService() {
		return string(id.Role)
	}
	return string(id.Role) + "-" + id.Name
}

// Paths returns the certificate and key file of basename in dir:
// <basename>.pem and <basename>-key.pem.
func Paths(dir, basename string) (certFile, keyFile string) {
	return filepath.Join(dir, basename+".pem"), filepath.Join(dir, basename+"-key.pem")
}

// WriteOption changes how WriteCA and WriteIssued write.
type WriteOption func(*writeOptions)

type writeOptions struct{ force bool }

// Force lets WriteCA and WriteIssued replace existing files; without it they
// refuse and write nothing, so a key is never lost by accident.
func Force() WriteOption { return func(o *writeOptions) { o.force = true } }

// WriteCA writes ca.pem and ca-key.pem (mode 0600) into dir, creating dir
// (mode 0700) when missing. It refuses to replace either file unless Force.
func WriteCA(dir string, ca *CA, opts ...WriteOption) error {
	return writeFiles(dir, opts, []file{
		{filepath.Join(dir, CACertFile), ca.certPEM, certMode},
		{filepath.Join(dir, CAKeyFile), ca.keyPEM, keyMode},
	})
}

// WriteIssued writes <basename>.pem and <basename>-key.pem (mode 0600) into
// dir, creating dir (mode 0700) when missing. It refuses to replace either
// file unless Force.
func WriteIssued(dir, basename string, certPEM, keyPEM []byte, opts ...WriteOption) error {
	if basename == "" || basename != filepath.Base(basename) {
		return fmt.Errorf("basename %q is not a plain file name", basename)
	}
	certFile, keyFile := Paths(dir, basename)
	// The key goes first: a reader that picks up rotated files (see
	// ServerTLS) sees a mismatched pair for a moment and keeps the old one,
	// rather than ever seeing a new certificate without its key.
	return writeFiles(dir, opts, []file{
		{keyFile, keyPEM, keyMode},
		{certFile, certPEM, certMode},
	})
}

type file struct {
	path string
	data []byte
	mode fs.FileMode
}

// writeFiles checks every file before writing any, so a refused write
// changes nothing, and writes each through a temporary file and a rename so
// that readers never see a partial file.
func writeFiles(dir string, opts []WriteOption, files []file) error {
	var o writeOptions
	for _, opt := range opts {
		opt(&o)
	}
	if err := os.MkdirAll(dir, dirMode); err != nil {
		return fmt.Errorf("create %s: %w", dir, err)
	}
	if !o.force {
		for _, f := range files {
			_, err := os.Lstat(f.path)
			if err == nil {
				return fmt.Errorf("refusing to overwrite %s", f.path)
			}
			if !errors.Is(err, fs.ErrNotExist) {
				return fmt.Errorf("check %s: %w", f.path, err)
			}
		}
	}
	for _, f := range files {
		if err := writeAtomic(f.path, f.data, f.mode); err != nil {
			return err
		}
	}
	return syncDir(dir)
}

func writeAtomic(path string, data []byte, mode fs.FileMode) (err error) {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	defer func() {
		if err != nil {
			_ = tmp.Close()
			_ = os.Remove(tmp.Name())
		}
	}()
	// Chmod before writing so a key is never readable by others, even for
	// a moment and whatever the umask.
	if err := tmp.Chmod(mode); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if _, err := tmp.Write(data); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := tmp.Sync(); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("sync %s: %w", dir, err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("sync %s: %w", dir, err)
	}
	return nil
}
