package keysource

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/ed25519"
	"encoding/hex"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"mesh.dev/internal/keyfile"
)

// TestGoVectors runs every vector of Go's crypto/ed25519 sign.input through
// both backends: a key written to and loaded from a file must sign exactly
// as the reference does.
func TestGoVectors(t *testing.T) {
	t.Parallel()
	f, err := os.Open("testdata/sign.input.gz")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	gz, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	scanner := bufio.NewScanner(gz)
	scanner.Buffer(make([]byte, 1<<20), 1<<20)
	n := 0
	for scanner.Scan() {
		parts := strings.Split(scanner.Text(), ":")
		if len(parts) != 5 {
			t.Fatalf("line %d: %d parts", n+1, len(parts))
		}
		privBytes, _ := hex.DecodeString(parts[0])
		pubKey, _ := hex.DecodeString(parts[1])
		msg, _ := hex.DecodeString(parts[2])
		sig, _ := hex.DecodeString(parts[3])
		// The vectors hold sig ‖ msg in the fourth field.
		sig = sig[:ed25519.SignatureSize]
		priv := ed25519.NewKeyFromSeed(privBytes[:ed25519.SeedSize])

		var src Source
		if n%16 == 0 {
			// Every 16th vector also round-trips through a key file.
			path := filepath.Join(dir, hex.EncodeToString(pubKey[:8])+".pem")
			if err := keyfile.Write(path, priv); err != nil {
				t.Fatal(err)
			}
			if src, err = File(path); err != nil {
				t.Fatal(err)
			}
		} else {
			src = Memory(priv)
		}
		if !bytes.Equal(src.Public(), pubKey) {
			t.Fatalf("vector %d: public key differs", n)
		}
		got, err := src.Sign(context.Background(), msg)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, sig) {
			t.Fatalf("vector %d: signature differs", n)
		}
		if !ed25519.Verify(pubKey, msg, got) {
			t.Fatalf("vector %d: does not verify", n)
		}
		n++
	}
	if err := scanner.Err(); err != nil {
		t.Fatal(err)
	}
	if n != 128 {
		t.Fatalf("ran %d vectors, want all 128 of the file", n)
	}
}

func TestFileRefusesLooseKey(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "k.pem")
	if _, err := Init(path); err != nil {
		t.Fatal(err)
	}
	if _, err := Init(path); err == nil {
		t.Fatal("Init overwrote a key")
	}
	os.Chmod(path, 0o644)
	if _, err := File(path); err == nil || !strings.Contains(err.Error(), "readable by group or others") {
		t.Fatalf("File of a 0644 key = %v", err)
	}
}
