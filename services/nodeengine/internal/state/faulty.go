package state

import (
	"errors"
	"sync"

	typev1 "mesh.dev/proto/mesh/type/v1"
)

// ErrInjected is the error Faulty returns for a section set to fail.
var ErrInjected = errors.New("injected state failure")

// Faulty wraps a Store and fails the writes of chosen sections, so tests can
// check the failure policy of each section.
type Faulty struct {
	Store

	mu   sync.Mutex
	fail map[Section]bool
	// Attempts counts writes per section, failed or not.
	attempts map[Section]int
}

// NewFaulty wraps s; nothing fails until Fail is called.
func NewFaulty(s Store) *Faulty {
	return &Faulty{Store: s, fail: map[Section]bool{}, attempts: map[Section]int{}}
}

// Fail makes the writes of a section fail (on) or succeed (off).
func (f *Faulty) Fail(s Section, on bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.fail[s] = on
}

// Attempts returns how many writes of a section were tried.
func (f *Faulty) Attempts(s Section) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.attempts[s]
}

func (f *Faulty) check(s Section) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.attempts[s]++
	if f.fail[s] {
		return ErrInjected
	}
	return nil
}

// PutEntry fails when SectionEntries fails.
func (f *Faulty) PutEntry(fp string, e KeptEntry) error {
	if err := f.check(SectionEntries); err != nil {
		return err
	}
	return f.Store.PutEntry(fp, e)
}

// DeleteEntries fails when SectionEntries fails.
func (f *Faulty) DeleteEntries(fps []string) error {
	if err := f.check(SectionEntries); err != nil {
		return err
	}
	return f.Store.DeleteEntries(fps)
}

// PutWant fails when SectionWants fails.
func (f *Faulty) PutWant(module string, w KeptWant) error {
	if err := f.check(SectionWants); err != nil {
		return err
	}
	return f.Store.PutWant(module, w)
}

// DeleteWants fails when SectionWants fails.
func (f *Faulty) DeleteWants(modules []string) error {
	if err := f.check(SectionWants); err != nil {
		return err
	}
	return f.Store.DeleteWants(modules)
}

// PutHighWater fails when SectionHighWater fails.
func (f *Faulty) PutHighWater(hw HighWater) error {
	if err := f.check(SectionHighWater); err != nil {
		return err
	}
	return f.Store.PutHighWater(hw)
}

// PutReportSeq fails when SectionReport fails.
func (f *Faulty) PutReportSeq(seq uint64) error {
	if err := f.check(SectionReport); err != nil {
		return err
	}
	return f.Store.PutReportSeq(seq)
}

// Reset fails when its section fails.
func (f *Faulty) Reset(s Section) error {
	if err := f.check(s); err != nil {
		return err
	}
	return f.Store.Reset(s)
}

// PutKeyset fails when SectionKeyset fails.
func (f *Faulty) PutKeyset(env *typev1.Envelope) error {
	if err := f.check(SectionKeyset); err != nil {
		return err
	}
	return f.Store.PutKeyset(env)
}

// PutKeysetAndMarks fails when SectionKeyset or SectionHighWater fails.
func (f *Faulty) PutKeysetAndMarks(env *typev1.Envelope, hw HighWater) error {
	if err := f.check(SectionKeyset); err != nil {
		return err
	}
	if err := f.check(SectionHighWater); err != nil {
		return err
	}
	return f.Store.PutKeysetAndMarks(env, hw)
}

// PutJournal fails when SectionJournal fails.
func (f *Faulty) PutJournal(j *Journal) error {
	if err := f.check(SectionJournal); err != nil {
		return err
	}
	return f.Store.PutJournal(j)
}

// Commit fails when SectionLedger fails.
func (f *Faulty) Commit(c *Commit) error {
	if err := f.check(SectionLedger); err != nil {
		return err
	}
	return f.Store.Commit(c)
}
