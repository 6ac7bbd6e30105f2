package state

import (
	"errors"
	"math"
	"path/filepath"
	"strings"
	"testing"
)

func TestRevisionsMonotonicAcrossRestart(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "state.db")
	s, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name  string
		floor uint64
		now   uint64
		want  uint64
	}{
		{"clock wins", 0, 1000, 1000},
		{"last+1 beats a clock that went back", 0, 500, 1001},
		{"floor wins", 5000, 1002, 5000},
		{"last+1 beats a lower floor", 10, 1003, 5001},
	}
	for _, c := range cases {
		got, err := s.AssignRevisions([]RevisionRequest{{Node: "ace", Floor: c.floor}}, c.now)
		if err != nil || got[0] != c.want {
			t.Fatalf("%s: AssignRevisions = %v, %v; want %d", c.name, got, err, c.want)
		}
	}
	s.Close()
	s, err = Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	got, err := s.AssignRevisions([]RevisionRequest{{Node: "ace"}, {Node: "bob"}}, 1)
	if err != nil || got[0] != 5002 || got[1] != 1 {
		t.Fatalf("after restart: %v, %v", got, err)
	}
	if _, err := s.AssignRevisions([]RevisionRequest{{Node: "ace"}, {Node: "ace"}}, 1); !errors.Is(err, ErrDuplicateNode) {
		t.Fatalf("duplicate node: %v", err)
	}
	if last, _ := s.LastRevision("ace"); last != 5002 {
		t.Fatalf("a refused batch moved the revision to %d", last)
	}
}

func TestEpoch(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "state.db")
	s, _ := Open(path)
	for want := uint64(1); want <= 3; want++ {
		if e, err := s.NextEpoch(); err != nil || e != want {
			t.Fatalf("NextEpoch = %d, %v", e, err)
		}
	}
	s.Close()
	s, _ = Open(path)
	defer s.Close()
	if e, _ := s.Epoch(); e != 3 {
		t.Fatalf("epoch after restart %d", e)
	}
}

// TestRevisionAtTheLargestIsNotWrapped: a node whose last revision is the
// largest there is has no next one; wrapping to 0 (then the clock) would be
// a revision going back. The request fails and nothing is assigned.
func TestRevisionAtTheLargestIsNotWrapped(t *testing.T) {
	s, err := Open(filepath.Join(t.TempDir(), "signer.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, err := s.AssignRevisions([]RevisionRequest{{Node: "ace", Floor: math.MaxUint64}}, 1000); err != nil {
		t.Fatal(err)
	}
	if got, err := s.AssignRevisions([]RevisionRequest{{Node: "ace"}, {Node: "bob"}}, 1000); err == nil || !strings.Contains(err.Error(), "node ace: its last revision is 18446744073709551615, the largest there is") {
		t.Fatalf("AssignRevisions after the largest: %v, %v; want it refused", got, err)
	}
	if last, _ := s.LastRevision("bob"); last != 0 {
		t.Errorf("bob was assigned %d in the refused batch", last)
	}
}
