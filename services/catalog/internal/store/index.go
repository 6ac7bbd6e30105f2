package store

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"sync"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"mesh.dev/internal/names"
	"mesh.dev/internal/natsx"
)

// ModuleHeader is written with every entry and names its module, so that
// the index learns an entry's module from a listing of headers, without
// reading the entry.
const ModuleHeader = "Mesh-Module"

// entryIndex holds the fingerprint of every entry in order, overall and by
// module, for ListEntries: a page is a binary search and as many reads as it
// has entries, however many entries the catalog holds. It follows the
// catalog-entries stream: before each use it reads, without values, the
// messages written since the last stream sequence it saw (by any catalog
// replica), so it holds every entry acknowledged before the call. Entries
// are immutable, so an indexed fingerprint stays right; one deleted by hand
// is skipped when read.
type entryIndex struct {
	// follow is held by the one caller catching up at a time.
	follow sync.Mutex

	mu       sync.Mutex
	seq      uint64
	moduleOf map[string]string
	all      []string
	byModule map[string][]string
}

func newEntryIndex() *entryIndex {
	return &entryIndex{moduleOf: map[string]string{}, byModule: map[string][]string{}}
}

// EntryPage returns up to limit fingerprints after the fingerprint after
// ("" for the first), ordered, of one module or of all when module is "",
// and whether more follow. It first catches the index up with every entry
// acknowledged so far.
func (s *Store) EntryPage(ctx context.Context, module, after string, limit int) ([]string, bool, error) {
	if err := s.catchUp(ctx); err != nil {
		return nil, false, err
	}
	x := s.index
	x.mu.Lock()
	defer x.mu.Unlock()
	list := x.all
	if module != "" {
		list = x.byModule[module]
	}
	start := sort.SearchStrings(list, after)
	if start < len(list) && list[start] == after {
		start++
	}
	end := min(start+limit, len(list))
	return slices.Clone(list[start:end]), end < len(list), nil
}

// catchUp reads the entries' stream from the sequence after the last one
// the index saw up to its end, headers only.
func (s *Store) catchUp(ctx context.Context) error {
	x := s.index
	x.follow.Lock()
	defer x.follow.Unlock()
	last, err := lastSeq(ctx, s.entries)
	if err != nil {
		return err
	}
	x.mu.Lock()
	if last < x.seq {
		// The stream's last sequence is below one the index read: the
		// store went back (restored from a backup, a server's older
		// snapshot). The sequences after last will be handed out again to
		// other entries, and entries the index and the cache hold may be
		// gone: both start over from what the store holds now.
		s.log.Warn("catalog-entries went back to an older state; the entry index and cache start over",
			"last_sequence", last, "index_sequence", x.seq)
		x.seq, x.moduleOf, x.all, x.byModule = 0, map[string]string{}, nil, map[string][]string{}
		s.cache.Reset()
	}
	from := x.seq + 1
	x.mu.Unlock()
	if last < from {
		return nil
	}
	w, err := s.entries.Watch(ctx, "", natsx.ResumeFromRevision(from), natsx.MetaOnly(), natsx.IgnoreDeletes())
	if err != nil {
		return fmt.Errorf("entry index: %w", err)
	}
	defer w.Stop()
	seen := from - 1
	var added []indexed
	defer func() {
		// What was read stands even when the rest failed: revisions come
		// in order, so everything up to seen was read.
		x.add(added, seen)
	}()
	for {
		select {
		case e, ok := <-w.Updates():
			if !ok {
				err := w.Err()
				if err == nil {
					err = errors.New("watch ended before catching up")
				}
				return fmt.Errorf("entry index: %w", err)
			}
			if e == nil {
				// Every message stored when the watch started is read.
				seen = max(seen, last)
				return nil
			}
			fp := names.FingerprintFromHex(e.Key)
			if fp == "" {
				s.log.Warn("catalog-entries holds a key that is no fingerprint", "key", e.Key)
				seen = e.Revision
				continue
			}
			module, err := s.moduleOfEntry(ctx, fp, e.Header)
			if errors.Is(err, natsx.ErrNotFound) {
				seen = e.Revision // written, then deleted by hand
				continue
			}
			if err != nil {
				return fmt.Errorf("entry index: %w", err)
			}
			added = append(added, indexed{fp, module})
			seen = e.Revision
		case <-ctx.Done():
			return fmt.Errorf("entry index: %w", ctx.Err())
		}
	}
}

type indexed struct{ fp, module string }

// moduleOfEntry reads the module from the header written with the entry,
// or from the entry itself when the header is missing (an entry written by
// another tool or restored from a backup).
func (s *Store) moduleOfEntry(ctx context.Context, fp string, h nats.Header) (string, error) {
	if m := h.Get(ModuleHeader); m != "" {
		return m, nil
	}
	e, err := s.Entry(ctx, fp)
	if err != nil {
		return "", err
	}
	return e.GetModule(), nil
}

// add merges new fingerprints into the sorted lists and records that the
// index has read the stream up to seq.
func (x *entryIndex) add(added []indexed, seq uint64) {
	x.mu.Lock()
	defer x.mu.Unlock()
	x.seq = max(x.seq, seq)
	var all []string
	mods := map[string][]string{}
	for _, a := range added {
		if _, ok := x.moduleOf[a.fp]; ok {
			continue
		}
		x.moduleOf[a.fp] = a.module
		all = append(all, a.fp)
		mods[a.module] = append(mods[a.module], a.fp)
	}
	if len(all) == 0 {
		return
	}
	x.all = mergeSorted(x.all, all)
	for m, fps := range mods {
		x.byModule[m] = mergeSorted(x.byModule[m], fps)
	}
}

// mergeSorted returns the sorted union of sorted a and unsorted, disjoint b.
func mergeSorted(a, b []string) []string {
	slices.Sort(b)
	out := make([]string, 0, len(a)+len(b))
	i, j := 0, 0
	for i < len(a) && j < len(b) {
		if a[i] < b[j] {
			out = append(out, a[i])
			i++
		} else {
			out = append(out, b[j])
			j++
		}
	}
	out = append(out, a[i:]...)
	return append(out, b[j:]...)
}

// lastSeq returns the last sequence of a bucket's stream, read from the
// server.
func lastSeq(ctx context.Context, kv *natsx.KV) (uint64, error) {
	st, err := kv.Status(ctx)
	if err != nil {
		return 0, err
	}
	bs, ok := st.(*jetstream.KeyValueBucketStatus)
	if !ok || bs.StreamInfo() == nil {
		return 0, fmt.Errorf("%s: status has no stream info (%T)", kv.Bucket(), st)
	}
	return bs.StreamInfo().State.LastSeq, nil
}
