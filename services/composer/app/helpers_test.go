package app_test

import (
	"bufio"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"google.golang.org/protobuf/proto"

	ct "mesh.dev/services/composer/internal/composertest"
)

func protoUnmarshal(b []byte, m proto.Message) error { return proto.Unmarshal(b, m) }

func mustMarshal(t testing.TB, m proto.Message) []byte {
	t.Helper()
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(m)
	ct.Must(t, err)
	return b
}

// auditRecord is what the tests read of the signer's audit log.
type auditRecord struct {
	Kind   string `json:"kind"`
	Method string `json:"method"`
	Epoch  uint64 `json:"epoch"`
	Reason string `json:"reason"`
	Items  []struct {
		Key    string `json:"key"`
		Digest string `json:"digest"`
	} `json:"items"`
}

// auditLines returns the "signed" records of the signer's audit log.
func auditLines(t testing.TB, w *ct.World) []auditRecord {
	t.Helper()
	var out []auditRecord
	for _, r := range auditLog(t, w) {
		if r.Kind == "signed" {
			out = append(out, r)
		}
	}
	return out
}

// auditLog returns every record of the signer's audit log.
func auditLog(t testing.TB, w *ct.World) []auditRecord {
	t.Helper()
	f, err := os.Open(filepath.Join(w.SignerDir, "audit.log"))
	ct.Must(t, err)
	defer f.Close()
	var out []auditRecord
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		var r auditRecord
		if json.Unmarshal(sc.Bytes(), &r) == nil {
			out = append(out, r)
		}
	}
	return out
}
