package store

import (
	"context"
	"log/slog"
	"slices"
	"strings"
	"testing"

	"mesh.dev/internal/natsx"
	"mesh.dev/internal/testutil"
	catalogv1 "mesh.dev/proto/mesh/catalog/v1"
)

// TestEntryIndexFollowsAStoreThatWentBack: the catalog-entries stream is
// replaced by one holding less (a restore from an older backup: its
// sequences start lower and are handed out again). The index and the cache
// start over: an entry written after it is listed, entries the store lost
// are neither listed nor served from the cache.
func TestEntryIndexFollowsAStoreThatWentBack(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	_, js := testutil.ConnectJetStream(t, testutil.StartJetStream(t))
	s, err := Open(ctx, js, Config{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	fp := func(c string) string { return "fp1:" + strings.Repeat(c, 64) }
	put := func(c, module string) {
		t.Helper()
		if _, created, err := s.CreateEntry(ctx, &catalogv1.Entry{Fingerprint: fp(c), Module: module}); err != nil || !created {
			t.Fatalf("create entry %s: created %v, %v", c, created, err)
		}
	}
	list := func(module string) []string {
		t.Helper()
		fps, more, err := s.EntryPage(ctx, module, "", 100)
		if err != nil || more {
			t.Fatalf("entry page: more %v, %v", more, err)
		}
		return fps
	}
	put("a", "sshd")
	put("b", "sshd")
	put("c", "motd")
	if got := list(""); !slices.Equal(got, []string{fp("a"), fp("b"), fp("c")}) {
		t.Fatalf("entries before: %v", got)
	}

	// The stream as a restore of an older backup leaves it: made again,
	// holding one entry the old one did not.
	if err := js.DeleteStream(ctx, "KV_"+natsx.BucketCatalogEntries); err != nil {
		t.Fatal(err)
	}
	s2, err := Open(ctx, js, Config{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := s2.CreateEntry(ctx, &catalogv1.Entry{Fingerprint: fp("d"), Module: "motd"}); err != nil {
		t.Fatal(err)
	}

	if got := list(""); !slices.Equal(got, []string{fp("d")}) {
		t.Errorf("entries after the store went back: %v, want only %s", got, fp("d"))
	}
	if got := list("sshd"); len(got) != 0 {
		t.Errorf("sshd entries after the store went back: %v, want none", got)
	}
	if _, err := s.Entry(ctx, fp("a")); err == nil {
		t.Errorf("an entry the store lost is still served from the cache")
	}
}
