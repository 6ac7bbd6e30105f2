package natsx

import (
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// TestBucketTable checks Buckets, LeaseSpec and ObjectStores against the
// table of DESIGN.md §9.
func TestBucketTable(t *testing.T) {
	t.Parallel()
	want := map[string]struct {
		history     uint8
		leaderReads bool
	}{
		"catalog-entries": {1, true},
		"catalog-builds":  {1, true},
		"catalog-modules": {1, true},
		"nodes":           {1, false},
		"approvals":       {1, false},
		"assignments":     {5, false},
		"compositions":    {1, true},
		"composed":        {1, true},
		"haves":           {1, false},
		"status":          {1, false},
		"keysets":         {5, false},
	}
	for _, replicas := range []int{1, 3} {
		specs := Buckets(replicas)
		if len(specs) != len(want) {
			t.Errorf("R%d: %d buckets, want %d", replicas, len(specs), len(want))
		}
		seen := map[string]bool{}
		for _, s := range specs {
			w, ok := want[s.Bucket]
			if !ok {
				t.Errorf("unexpected bucket %s", s.Bucket)
				continue
			}
			seen[s.Bucket] = true
			if s.History != w.history || s.LeaderReads != w.leaderReads {
				t.Errorf("%s: history %d leader reads %v, want %d %v", s.Bucket, s.History, s.LeaderReads, w.history, w.leaderReads)
			}
			if s.Replicas != replicas || s.Storage != jetstream.FileStorage || s.MaxValueSize != MaxValueSize || s.TTL != 0 {
				t.Errorf("%s: %+v", s.Bucket, s)
			}
		}
		for b := range want {
			if !seen[b] {
				t.Errorf("R%d: bucket %s missing", replicas, b)
			}
		}
		lease := LeaseSpec(replicas, 15*time.Second)
		if lease.Bucket != "composer-lease" || lease.History != 1 || lease.TTL != 15*time.Second || lease.Replicas != replicas || !lease.LeaderReads || lease.Storage != jetstream.FileStorage {
			t.Errorf("lease spec: %+v", lease)
		}
		stores := ObjectStores(replicas)
		if len(stores) != 2 || stores[0].Bucket != "artifacts" || stores[1].Bucket != "objects" {
			t.Errorf("object stores: %+v", stores)
		}
		for _, s := range stores {
			if s.Replicas != replicas || s.Storage != jetstream.FileStorage || !s.LeaderReads {
				t.Errorf("%s: %+v", s.Bucket, s)
			}
		}
	}
}

func TestEnsureKV(t *testing.T) {
	t.Parallel()
	_, js := serverAndJS(t)
	specs := append(Buckets(1), LeaseSpec(1, 30*time.Second),
		KVSpec{Bucket: "small-values", MaxValueSize: 1024},
	)
	for _, spec := range specs {
		t.Run(spec.Bucket, func(t *testing.T) {
			t.Parallel()
			for range 2 { // the second call finds the bucket as it should be
				kv := ensureKV(t, js, spec)
				if kv.Bucket() != spec.Bucket || kv.LeaderReads() != spec.LeaderReads {
					t.Fatalf("kv %s leader reads %v", kv.Bucket(), kv.LeaderReads())
				}
				st, err := js.Stream(t.Context(), "KV_"+spec.Bucket)
				if err != nil {
					t.Fatal(err)
				}
				cfg := st.CachedInfo().Config
				if cfg.AllowDirect == spec.LeaderReads {
					t.Errorf("allow direct = %v with leader reads %v", cfg.AllowDirect, spec.LeaderReads)
				}
				if cfg.MaxMsgsPerSubject != int64(max(spec.History, 1)) {
					t.Errorf("history = %d", cfg.MaxMsgsPerSubject)
				}
				if cfg.MaxMsgSize != spec.valueLimit()+MaxHeaderBytes || kv.MaxValueSize() != int(spec.valueLimit()) {
					t.Errorf("max msg size %d, value limit %d", cfg.MaxMsgSize, kv.MaxValueSize())
				}
				if cfg.MaxAge != spec.TTL || cfg.Storage != jetstream.FileStorage || cfg.Replicas != 1 {
					t.Errorf("stream config %+v", cfg)
				}
				if cfg.Description != spec.Description {
					t.Errorf("description %q", cfg.Description)
				}
				// nats.go recognises it as a KV bucket.
				st2, err := kv.KeyValue().Status(t.Context())
				if err != nil || st2.Bucket() != spec.Bucket {
					t.Errorf("nats.go status: %v %v", st2, err)
				}
			}
		})
	}
}

func TestEnsureKVTurnsDirectGetOff(t *testing.T) {
	t.Parallel()
	_, js := serverAndJS(t)
	spec := testSpec(1)
	// A bucket created by nats.go has direct get on.
	if _, err := js.CreateKeyValue(t.Context(), jetstream.KeyValueConfig{Bucket: spec.Bucket}); err != nil {
		t.Fatal(err)
	}
	spec.LeaderReads = true
	kv := ensureKV(t, js, spec)
	if !kv.LeaderReads() {
		t.Error("leader reads not on")
	}
	st, err := js.Stream(t.Context(), "KV_"+spec.Bucket)
	if err != nil {
		t.Fatal(err)
	}
	if st.CachedInfo().Config.AllowDirect {
		t.Error("direct get still allowed")
	}
	// And a Get is answered without the direct-get headers.
	if _, err := kv.Put(t.Context(), "k", []byte("v")); err != nil {
		t.Fatal(err)
	}
	e, err := kv.Get(t.Context(), "k")
	if err != nil {
		t.Fatal(err)
	}
	if e.Header.Get(jetstream.StreamHeader) != "" {
		t.Errorf("leader read carries direct-get headers: %v", e.Header)
	}
}

func TestEnsureKVRefuses(t *testing.T) {
	t.Parallel()
	_, js := serverAndJS(t)
	tests := []struct {
		name    string
		spec    KVSpec
		wantErr string
	}{
		{name: "empty name", spec: KVSpec{}, wantErr: "invalid"},
		{name: "bad name", spec: KVSpec{Bucket: "a.b"}, wantErr: "invalid"},
		{name: "history over 64", spec: KVSpec{Bucket: "h", History: 65}, wantErr: "history 65"},
		{name: "value over 1 MiB", spec: KVSpec{Bucket: "v", MaxValueSize: MaxValueSize + 1}, wantErr: "max value size"},
		{name: "negative value size", spec: KVSpec{Bucket: "v", MaxValueSize: -1}, wantErr: "max value size"},
		{name: "negative ttl", spec: KVSpec{Bucket: "t", TTL: -time.Second}, wantErr: "negative ttl"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := EnsureKV(t.Context(), js, tt.spec)
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("err = %v, want %q", err, tt.wantErr)
			}
		})
	}
}

func TestOpenKV(t *testing.T) {
	t.Parallel()
	_, js := serverAndJS(t)
	if _, err := OpenKV(t.Context(), js, "absent"); err == nil || !strings.Contains(err.Error(), "bucket not found") {
		t.Errorf("open absent bucket: %v", err)
	}
	spec := testSpec(1)
	spec.MaxValueSize = 4096
	spec.LeaderReads = true
	ensureKV(t, js, spec)
	kv, err := OpenKV(t.Context(), js, spec.Bucket)
	if err != nil {
		t.Fatal(err)
	}
	if kv.MaxValueSize() != 4096 || !kv.LeaderReads() {
		t.Errorf("opened with limit %d, leader reads %v", kv.MaxValueSize(), kv.LeaderReads())
	}
}

func TestEnsureAll(t *testing.T) {
	t.Parallel()
	_, js := serverAndJS(t)
	if _, _, err := EnsureAll(t.Context(), js, 1, 0); err == nil {
		t.Error("zero lease ttl accepted")
	}
	kvs, stores, err := EnsureAll(t.Context(), js, 1, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if len(kvs) != len(Buckets(1))+1 || kvs[BucketComposerLease] == nil || len(stores) != 2 {
		t.Fatalf("got %d buckets, %d stores", len(kvs), len(stores))
	}
	for name, store := range stores {
		st, err := store.Status(t.Context())
		if err != nil || st.Bucket() != name || st.Storage() != jetstream.FileStorage {
			t.Errorf("store %s: %v %v", name, st, err)
		}
		if storeName(store) != name {
			t.Errorf("store %s names itself %s", name, storeName(store))
		}
		// Read from the leader: nats.go turns direct get on for every
		// object store, EnsureObjectStore turns it off again, and the
		// store keeps working for puts and gets.
		si, err := js.Stream(t.Context(), objStreamName(name))
		if err != nil || si.CachedInfo().Config.AllowDirect {
			t.Errorf("store %s: direct get on (%v)", name, err)
		}
		if _, err := store.PutBytes(t.Context(), "x", []byte("y")); err != nil {
			t.Errorf("store %s put: %v", name, err)
		}
		if b, err := store.GetBytes(t.Context(), "x"); err != nil || string(b) != "y" {
			t.Errorf("store %s get: %q %v", name, b, err)
		}
	}
	// Ensured again, nothing changes.
	if _, _, err := EnsureAll(t.Context(), js, 1, 10*time.Second); err != nil {
		t.Fatal(err)
	}
}
