package testutil

import (
	"errors"
	"testing"

	"mesh.dev/internal/natsx"
)

func TestStartJetStream(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name           string
		opts           []JetStreamOption
		wantSyncAlways bool
		wantMaxStore   int64
	}{
		{name: "defaults are fast"},
		{name: "sync always", opts: []JetStreamOption{WithSyncAlways()}, wantSyncAlways: true},
		{name: "store cap", opts: []JetStreamOption{WithJetStreamMaxStore(64 << 20)}, wantMaxStore: 64 << 20},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			e := StartJetStream(t, tt.opts...)
			cfg := e.Server().JetStreamConfig()
			if cfg == nil {
				t.Fatal("jetstream not enabled")
			}
			if cfg.SyncAlways != tt.wantSyncAlways {
				t.Errorf("sync always = %v", cfg.SyncAlways)
			}
			if tt.wantMaxStore != 0 && cfg.MaxStore != tt.wantMaxStore {
				t.Errorf("max store = %d", cfg.MaxStore)
			}
			if e.Config().Port == 0 {
				t.Error("no port")
			}
			_, js := ConnectJetStream(t, e)
			if _, err := js.AccountInfo(t.Context()); err != nil {
				t.Fatal(err)
			}
		})
	}
}

func TestRestartJetStream(t *testing.T) {
	t.Parallel()
	e := StartJetStream(t, WithSyncAlways())
	_, js := ConnectJetStream(t, e)
	kv, err := natsx.EnsureKV(t.Context(), js, natsx.KVSpec{Bucket: "restart"})
	if err != nil {
		t.Fatal(err)
	}
	rev, err := kv.Create(t.Context(), "k", []byte("v"))
	if err != nil {
		t.Fatal(err)
	}

	e2 := RestartJetStream(t, e)
	if e2.ClientURL() != e.ClientURL() {
		t.Errorf("restarted on %s, was %s", e2.ClientURL(), e.ClientURL())
	}
	_, js2 := ConnectJetStream(t, e2)
	kv2, err := natsx.OpenKV(t.Context(), js2, "restart")
	if err != nil {
		t.Fatal(err)
	}
	got, err := kv2.Get(t.Context(), "k")
	if err != nil || string(got.Value) != "v" || got.Revision != rev {
		t.Fatalf("after restart: %+v %v", got, err)
	}
	if _, err := kv2.Create(t.Context(), "k", nil); !errors.Is(err, natsx.ErrConflict) {
		t.Errorf("create over the kept key: %v", err)
	}
}
