package apply

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/user"
	"path/filepath"
	"strings"

	"google.golang.org/protobuf/proto"

	"mesh.dev/internal/names"
	typev1 "mesh.dev/proto/mesh/type/v1"
	"mesh.dev/services/nodeengine/internal/state"
)

// ChangeFixture applies, again and again, a change of every file of one
// module (a directory and files of 480 bytes inline, all owned by the
// running user; 24 files is the ~12 KB composition bench converge
// changes) under a root of its own: what an engine's apply of a change
// costs, measured by BenchmarkApplyChange and `meshctl bench converge`.
type ChangeFixture struct {
	a      *Applier
	root   string
	store  Store
	files  int
	gen    int
	ledger map[string]*state.LedgerRecord
	owner  string
	group  string
}

// NewChangeFixture makes a root with prefix /etc and an applier under dir
// that journals and commits into store. Its first Apply creates the
// module's files, each later one changes them all.
func NewChangeFixture(dir string, files int, store Store) (*ChangeFixture, error) {
	u, err := user.Current()
	if err != nil {
		return nil, err
	}
	g, err := user.LookupGroupId(u.Gid)
	if err != nil {
		return nil, err
	}
	root := filepath.Join(dir, "root")
	if err := os.MkdirAll(filepath.Join(root, "etc"), 0o755); err != nil {
		return nil, err
	}
	a, err := New(Config{Root: root, Prefixes: []string{"/etc"}, StateDir: filepath.Join(dir, "state"), Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		return nil, err
	}
	return &ChangeFixture{a: a, root: root, store: store, files: files, ledger: map[string]*state.LedgerRecord{}, owner: u.Username, group: g.Name}, nil
}

// Close releases the applier's roots.
func (f *ChangeFixture) Close() { f.a.Close() }

// Composition is generation gen of the module.
func (f *ChangeFixture) Composition(gen int) (*Composition, error) {
	c := &typev1.Composition{Node: "ace", Module: "bench", Fingerprint: names.FingerprintFromHex(strings.Repeat("a", 64))}
	c.Resources = append(c.Resources, &typev1.Resource{Id: "bench:dir", Path: "/etc/bench", Type: typev1.ResourceType_RESOURCE_TYPE_DIRECTORY, Mode: 0o755, Owner: f.owner, Group: f.group})
	for i := 0; i < f.files; i++ {
		body := []byte(strings.Repeat(fmt.Sprintf("bench-%d-%d ", gen, i), 60)[:480])
		c.Resources = append(c.Resources, &typev1.Resource{
			Id: fmt.Sprintf("bench:f%02d", i), Path: fmt.Sprintf("/etc/bench/f%02d.conf", i), Type: typev1.ResourceType_RESOURCE_TYPE_FILE,
			Mode: 0o644, Owner: f.owner, Group: f.group,
			Content: &typev1.Resource_Inline{Inline: body},
		})
	}
	payload, err := proto.Marshal(c)
	if err != nil {
		return nil, err
	}
	return &Composition{Module: "bench", Key: "ace.bench", Comp: c, Env: &typev1.Envelope{PayloadType: typev1.PayloadType_PAYLOAD_TYPE_COMPOSITION, Payload: payload}}, nil
}

// Apply applies the next generation: Prepare, Stage and Execute, as an
// engine's pass does once it holds the verified composition.
func (f *ChangeFixture) Apply() error {
	c, err := f.Composition(f.gen)
	if err != nil {
		return err
	}
	prep := f.a.Prepare(Plan{Compositions: []*Composition{c}, Ledger: f.ledger, Removals: true})
	if len(prep.Failures) > 0 {
		return fmt.Errorf("prepare: %v", prep.Failures)
	}
	if fails := f.a.Stage(context.Background(), prep, noFetch{}); len(fails) > 0 {
		return fmt.Errorf("stage: %v", fails)
	}
	res, err := f.a.Execute(context.Background(), prep, f.ledger, f.store, Meta{})
	if err != nil {
		return err
	}
	if len(res.Failed) > 0 {
		return fmt.Errorf("execute: %v", res.Failed)
	}
	if res.CommitErr != nil {
		return res.CommitErr
	}
	f.ledger = res.Ledger
	f.a.ClearStage()
	f.gen++
	return nil
}

// noFetch is the source of a composition whose content is all inline.
type noFetch struct{}

func (noFetch) Fetch(context.Context, *Composition, *typev1.Resource, string, int64, io.Writer) error {
	return errors.New("nothing is fetched: the content is inline")
}
