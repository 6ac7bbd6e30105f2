// Package keyfile reads and writes ed25519 private keys as PKCS#8 PEM files
// that only their owner can read, and protojson files of trust material
// (roots, keysets, public keys).
package keyfile

import (
	"crypto/ed25519"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
)

// ErrLoosePermissions is returned for a key file group or others can read.
var ErrLoosePermissions = errors.New("key file is readable by group or others")

// Generate makes a new ed25519 key and writes it to path as PKCS#8 PEM with
// mode 0600. It refuses to overwrite an existing file.
func Generate(path string) (ed25519.PrivateKey, error) {
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generate key: %w", err)
	}
	if err := Write(path, priv); err != nil {
		return nil, err
	}
	return priv, nil
}

// Write writes a private key to path as PKCS#8 PEM with mode 0600, fsynced;
// it refuses to overwrite an existing file.
func Write(path string, priv ed25519.PrivateKey) error {
	der, err := x509.MarshalPKCS8PrivateKey(priv)
	if err != nil {
		return fmt.Errorf("encode key: %w", err)
	}
	b := pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der})
	return writeNew(path, b, 0o600)
}

// Load reads a PKCS#8 PEM ed25519 private key, refusing a file that group or
// others can read.
func Load(path string) (ed25519.PrivateKey, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("key file: %w", err)
	}
	if fi.Mode().Perm()&0o077 != 0 {
		return nil, fmt.Errorf("%w: %s has mode %04o, want 0600", ErrLoosePermissions, path, fi.Mode().Perm())
	}
	return Parse(path)
}

// Replace writes a private key to path as PKCS#8 PEM with mode 0600,
// atomically replacing what is there (an import; Write never replaces).
func Replace(path string, priv ed25519.PrivateKey) error {
	der, err := x509.MarshalPKCS8PrivateKey(priv)
	if err != nil {
		return fmt.Errorf("encode key: %w", err)
	}
	return WriteAtomic(path, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), 0o600)
}

// Parse reads a PKCS#8 PEM ed25519 private key without judging the file's
// permissions (for importing a key an orchestrator delivered).
func Parse(path string) (ed25519.PrivateKey, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("key file: %w", err)
	}
	block, _ := pem.Decode(b)
	if block == nil || block.Type != "PRIVATE KEY" {
		return nil, fmt.Errorf("key file %s: no PKCS#8 PEM block (PRIVATE KEY)", path)
	}
	k, err := x509.ParsePKCS8PrivateKey(block.Bytes)
	if err != nil {
		return nil, fmt.Errorf("key file %s: %w", path, err)
	}
	priv, ok := k.(ed25519.PrivateKey)
	if !ok {
		return nil, fmt.Errorf("key file %s: a %T, want an ed25519 key", path, k)
	}
	return priv, nil
}

// WriteJSON writes a message as indented protojson, fsynced, replacing the
// file atomically.
func WriteJSON(path string, m proto.Message, perm fs.FileMode) error {
	b, err := protojson.MarshalOptions{Multiline: true, Indent: "  "}.Marshal(m)
	if err != nil {
		return fmt.Errorf("encode %s: %w", path, err)
	}
	return WriteAtomic(path, append(b, '\n'), perm)
}

// ReadJSON reads a protojson file into m, refusing unknown fields.
func ReadJSON(path string, m proto.Message) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	if err := (protojson.UnmarshalOptions{}).Unmarshal(b, m); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return nil
}

// WriteAtomic writes b to a temporary file beside path, fsyncs it, renames
// it over path and fsyncs the directory, so a crash leaves the old or the new
// content and never half of one.
func WriteAtomic(path string, b []byte, perm fs.FileMode) error {
	dir := filepath.Dir(path)
	f, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	defer os.Remove(tmp)
	if err := f.Chmod(perm); err != nil {
		f.Close()
		return err
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		return err
	}
	return SyncDir(dir)
}

// SyncDir fsyncs a directory so a rename or create in it is durable.
func SyncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

func writeNew(path string, b []byte, perm fs.FileMode) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, perm)
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return SyncDir(filepath.Dir(path))
}
