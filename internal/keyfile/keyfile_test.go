package keyfile

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"google.golang.org/protobuf/proto"

	typev1 "mesh.dev/proto/mesh/type/v1"
)

func TestGenerateLoad(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	path := filepath.Join(dir, "signer-key.pem")
	priv, err := Generate(path)
	if err != nil {
		t.Fatal(err)
	}
	fi, _ := os.Stat(path)
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("mode %o", fi.Mode().Perm())
	}
	got, err := Load(path)
	if err != nil || !got.Equal(priv) {
		t.Fatalf("Load = %v", err)
	}
	if _, err := Generate(path); err == nil {
		t.Error("Generate overwrote an existing key")
	}
	if err := os.Chmod(path, 0o640); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(path); !errors.Is(err, ErrLoosePermissions) {
		t.Errorf("Load of a 0640 key = %v, want ErrLoosePermissions", err)
	}
	bad := filepath.Join(dir, "bad.pem")
	os.WriteFile(bad, []byte("not pem"), 0o600)
	if _, err := Load(bad); err == nil {
		t.Error("Load accepted a non-PEM file")
	}
}

func TestJSONRoundTrip(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "roots.json")
	in := &typev1.TrustRoots{Threshold: 1, Keys: []*typev1.RootKey{{Id: "k1:00", PublicKey: []byte{1, 2}}}}
	if err := WriteJSON(path, in, 0o644); err != nil {
		t.Fatal(err)
	}
	out := &typev1.TrustRoots{}
	if err := ReadJSON(path, out); err != nil || !proto.Equal(in, out) {
		t.Fatalf("ReadJSON = %v, %v", out, err)
	}
	os.WriteFile(path, []byte(`{"threshold":1,"nope":2}`), 0o644)
	if err := ReadJSON(path, out); err == nil {
		t.Error("unknown field accepted")
	}
}
