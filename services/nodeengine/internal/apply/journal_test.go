package apply

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"mesh.dev/services/nodeengine/internal/state"
)

// keptJournal keeps the journal Execute writes and fails the write, so no
// op runs: what a crash right after the journal's commit leaves.
type keptJournal struct{ j *state.Journal }

func (k *keptJournal) PutJournal(j *state.Journal) error {
	k.j = j
	return errors.New("the machine stops here")
}
func (*keptJournal) Commit(*state.Commit) error { return errors.New("no commit expected") }

// TestInlineContentReplaysFromTheJournal: a write of inline content stages
// nothing and keeps its bytes in the journal, so a replay after a crash
// writes them with the stage dir emptied (as a restart finds it when the
// journal is replayed by a new applier).
func TestInlineContentReplaysFromTheJournal(t *testing.T) {
	f, err := NewChangeFixture(t.TempDir(), 3, memStore{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(f.Close)
	a, root := f.a, f.root
	comp, err := f.Composition(1)
	if err != nil {
		t.Fatal(err)
	}
	prep := a.Prepare(Plan{Compositions: []*Composition{comp}, Ledger: map[string]*state.LedgerRecord{}})
	if len(prep.Failures) > 0 {
		t.Fatalf("prepare: %v", prep.Failures)
	}
	if len(prep.stage) != 0 {
		t.Fatalf("inline content staged: %d items", len(prep.stage))
	}
	if f := a.Stage(context.Background(), prep, noFetch{}); len(f) > 0 {
		t.Fatalf("stage: %v", f)
	}
	var k keptJournal
	if _, err := a.Execute(context.Background(), prep, nil, &k, Meta{}); err == nil || k.j == nil {
		t.Fatalf("execute: %v, journal %v", err, k.j)
	}
	if left, _ := os.ReadDir(a.stageDir); len(left) > 0 {
		t.Fatalf("the stage dir holds %d files", len(left))
	}
	if _, err := os.Stat(filepath.Join(root, "etc", "bench")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("an op ran before the journal was kept: %v", err)
	}
	res := a.Replay(context.Background(), k.j, nil, memStore{})
	if len(res.Failed) > 0 || res.CommitErr != nil {
		t.Fatalf("replay: %v %v", res.Failed, res.CommitErr)
	}
	for _, r := range comp.Comp.GetResources()[1:] {
		got, err := os.ReadFile(filepath.Join(root, filepath.FromSlash(r.GetPath())))
		if err != nil || string(got) != string(r.GetInline()) {
			t.Errorf("%s after the replay: %q (%v), want %q", r.GetPath(), got, err, r.GetInline())
		}
	}
}
