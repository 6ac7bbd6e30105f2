package apply

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/user"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	"mesh.dev/internal/names"
	typev1 "mesh.dev/proto/mesh/type/v1"
	"mesh.dev/services/nodeengine/internal/state"
)

// changeDisk is a root with prefix /etc and an applier over it, on
// /dev/shm when it exists.
func changeDisk(tb testing.TB) (*Applier, string) {
	dir := tb.TempDir()
	if fi, err := os.Stat("/dev/shm"); err == nil && fi.IsDir() {
		d, err := os.MkdirTemp("/dev/shm", "mesh-apply-bench-")
		if err != nil {
			tb.Fatal(err)
		}
		tb.Cleanup(func() { os.RemoveAll(d) })
		dir = d
	}
	root := filepath.Join(dir, "root")
	if err := os.MkdirAll(filepath.Join(root, "etc"), 0o755); err != nil {
		tb.Fatal(err)
	}
	a, err := New(Config{Root: root, Prefixes: []string{"/etc"}, StateDir: filepath.Join(dir, "state"), Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(a.Close)
	return a, root
}

// changeComp is generation gen of module bench: a directory and the given
// number of files of 480 bytes inline, all owned by the running user.
func changeComp(tb testing.TB, gen, files int) *Composition {
	u, err := user.Current()
	if err != nil {
		tb.Fatal(err)
	}
	g, err := user.LookupGroupId(u.Gid)
	if err != nil {
		tb.Fatal(err)
	}
	c := &typev1.Composition{Node: "ace", Module: "bench", Fingerprint: names.FingerprintFromHex(strings.Repeat("a", 64))}
	c.Resources = append(c.Resources, &typev1.Resource{Id: "bench:dir", Path: "/etc/bench", Type: typev1.ResourceType_RESOURCE_TYPE_DIRECTORY, Mode: 0o755, Owner: u.Username, Group: g.Name})
	for i := 0; i < files; i++ {
		body := []byte(strings.Repeat(fmt.Sprintf("bench-%d-%d ", gen, i), 60)[:480])
		c.Resources = append(c.Resources, &typev1.Resource{
			Id: fmt.Sprintf("bench:f%02d", i), Path: fmt.Sprintf("/etc/bench/f%02d.conf", i), Type: typev1.ResourceType_RESOURCE_TYPE_FILE,
			Mode: 0o644, Owner: u.Username, Group: g.Name,
			Content: &typev1.Resource_Inline{Inline: body},
		})
	}
	payload, err := proto.Marshal(c)
	if err != nil {
		tb.Fatal(err)
	}
	return &Composition{Module: "bench", Key: "ace.bench", Comp: c, Env: &typev1.Envelope{PayloadType: typev1.PayloadType_PAYLOAD_TYPE_COMPOSITION, Payload: payload}}
}

// BenchmarkApplyChange applies a change of every file of a module of 24
// files of 480 bytes (the composition bench converge changes, ~12 KB):
// Prepare, Stage and Execute, on /dev/shm when it exists (where bench
// converge puts the engines' roots), so the figure is the applier's own
// CPU and syscalls, not the disk's. With store=memory the journal and the
// commit are not written; with store=bbolt they go to an engine's state
// file beside the root, as in an engine.
func BenchmarkApplyChange(b *testing.B) {
	b.Run("store=memory", func(b *testing.B) { benchApplyChange(b, func(string) Store { return memStore{} }) })
	b.Run("store=bbolt", func(b *testing.B) {
		benchApplyChange(b, func(root string) Store {
			db, err := state.Open(filepath.Join(filepath.Dir(root), "engine.db"))
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { db.Close() })
			return db
		})
	})
}

// BenchmarkApplyChange applies a change of every file of a module of 24
// files of 480 bytes (the composition bench converge changes, ~12 KB):
// Prepare, Stage and Execute, on /dev/shm when it exists (where bench
// converge puts the engines' roots), so the figure is the applier's own
// CPU and syscalls, not the disk's.
func benchApplyChange(b *testing.B, storeAt func(root string) Store) {
	a, root := changeDisk(b)
	store := storeAt(root)
	ledger := map[string]*state.LedgerRecord{}
	apply := func(gen int) {
		prep := a.Prepare(Plan{Compositions: []*Composition{changeComp(b, gen, 24)}, Ledger: ledger, Removals: true})
		if len(prep.Failures) > 0 {
			b.Fatalf("prepare: %v", prep.Failures)
		}
		if f := a.Stage(context.Background(), prep, noSource{}); len(f) > 0 {
			b.Fatalf("stage: %v", f)
		}
		res, err := a.Execute(context.Background(), prep, ledger, store, Meta{})
		if err != nil {
			b.Fatal(err)
		}
		if len(res.Failed) > 0 {
			b.Fatalf("execute: %v", res.Failed)
		}
		ledger = res.Ledger
		a.ClearStage()
	}
	apply(0)
	b.ResetTimer()
	for i := 1; i <= b.N; i++ {
		apply(i)
	}
}
