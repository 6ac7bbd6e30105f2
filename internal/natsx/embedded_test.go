package natsx

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"
)

func TestStartEmbedded(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name           string
		cfg            EmbeddedConfig
		wantSyncAlways bool
		wantPayload    int32
		wantName       string
	}{
		{name: "defaults", wantPayload: DefaultMaxPayload},
		{name: "sync always", cfg: EmbeddedConfig{SyncAlways: true}, wantSyncAlways: true, wantPayload: DefaultMaxPayload},
		{name: "named with payload and store cap", cfg: EmbeddedConfig{ServerName: "mesh-dev", MaxPayload: 4 << 20, JetStreamMaxStore: 1 << 30}, wantPayload: 4 << 20, wantName: "mesh-dev"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			e := startServer(t, tt.cfg)
			if e.Config().Port == 0 {
				t.Error("random port not resolved in Config")
			}
			if !strings.HasPrefix(e.ClientURL(), "nats://127.0.0.1:") {
				t.Errorf("client url = %s", e.ClientURL())
			}
			jsCfg := e.Server().JetStreamConfig()
			if jsCfg == nil {
				t.Fatal("jetstream not enabled")
			}
			if jsCfg.SyncAlways != tt.wantSyncAlways {
				t.Errorf("sync always = %v, want %v", jsCfg.SyncAlways, tt.wantSyncAlways)
			}
			if jsCfg.StoreDir == "" || !strings.HasPrefix(jsCfg.StoreDir, e.Config().DataDir) {
				t.Errorf("store dir %q is not under %q", jsCfg.StoreDir, e.Config().DataDir)
			}
			if tt.wantName != "" && e.Server().Name() != tt.wantName {
				t.Errorf("server name = %q", e.Server().Name())
			}
			nc, js := connect(t, e)
			if got := nc.MaxPayload(); got != int64(tt.wantPayload) {
				t.Errorf("max payload = %d, want %d", got, tt.wantPayload)
			}
			if _, err := js.AccountInfo(t.Context()); err != nil {
				t.Errorf("account info: %v", err)
			}
		})
	}
}

func TestStartEmbeddedRefuses(t *testing.T) {
	t.Parallel()
	file := filepath.Join(t.TempDir(), "a-file")
	if err := os.WriteFile(file, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		cfg     EmbeddedConfig
		wantErr string
	}{
		{name: "no data dir", cfg: EmbeddedConfig{}, wantErr: "data dir is required"},
		{name: "payload too small", cfg: EmbeddedConfig{DataDir: t.TempDir(), MaxPayload: 1 << 20}, wantErr: "max payload"},
		{name: "negative port", cfg: EmbeddedConfig{DataDir: t.TempDir(), Port: -5}, wantErr: "invalid port"},
		{name: "data dir is a file", cfg: EmbeddedConfig{DataDir: file}, wantErr: "embedded nats: Can't start JetStream"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			e, err := StartEmbedded(tt.cfg)
			if err == nil {
				e.Shutdown()
				t.Fatal("started")
			}
			if !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("err = %v, want %q", err, tt.wantErr)
			}
		})
	}
}

func TestEmbeddedRestartKeepsData(t *testing.T) {
	t.Parallel()
	e := startServer(t, EmbeddedConfig{SyncAlways: true})
	nc, js := connect(t, e)
	kv := ensureKV(t, js, testSpec(1))
	rev, err := kv.Create(t.Context(), "k", []byte("kept"))
	if err != nil {
		t.Fatal(err)
	}
	nc.Close()
	e.Shutdown()
	e.Shutdown() // idempotent

	cfg := e.Config()
	e2 := startServer(t, cfg)
	if e2.Config().Port != cfg.Port || e2.ClientURL() != e.ClientURL() {
		t.Errorf("restarted on %s, want %s", e2.ClientURL(), e.ClientURL())
	}
	_, js2 := connect(t, e2)
	kv2, err := OpenKV(t.Context(), js2, kv.Bucket())
	if err != nil {
		t.Fatal(err)
	}
	got, err := kv2.Get(t.Context(), "k")
	if err != nil {
		t.Fatal(err)
	}
	if string(got.Value) != "kept" || got.Revision != rev {
		t.Errorf("after restart: %q at %d, want kept at %d", got.Value, got.Revision, rev)
	}
}

func TestEmbeddedInProcessConnection(t *testing.T) {
	t.Parallel()
	e := startServer(t, EmbeddedConfig{})
	nc, js, err := Connect(t.Context(), ConnConfig{InProcess: e.Server(), Name: "in-process", Logger: discardLogger})
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	if _, err := js.AccountInfo(context.Background()); err != nil {
		t.Fatal(err)
	}
	if nc.Status() != nats.CONNECTED {
		t.Errorf("status = %v", nc.Status())
	}
}
