package store

import (
	"context"
	"errors"
	"log/slog"
	"testing"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"mesh.dev/internal/natsx"
	"mesh.dev/internal/testutil"
	catalogv1 "mesh.dev/proto/mesh/catalog/v1"
)

func openStore(t *testing.T) *Store {
	t.Helper()
	_, js := testutil.ConnectJetStream(t, testutil.StartJetStream(t))
	s, err := Open(context.Background(), js, Config{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestPutHistoryNeverRewrites writes a history key, writes it again with
// the same registration (a repair after a stop: no error) and then with
// another one at the same key, which is refused naming the key and both
// fingerprints, as no concurrent-write conflict, and leaves the key as it
// was.
func TestPutHistoryNeverRewrites(t *testing.T) {
	t.Parallel()
	s := openStore(t)
	ctx := context.Background()
	const fpA = "fp1:aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
	const fpB = "fp1:bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb"
	first := &catalogv1.Registration{Module: "sshd", Fingerprint: fpA, Seq: 1, RegisteredAt: timestamppb.Now(), RegisteredBy: "builder/ci"}
	if err := s.PutHistory(ctx, first); err != nil {
		t.Fatal(err)
	}
	if err := s.PutHistory(ctx, proto.Clone(first).(*catalogv1.Registration)); err != nil {
		t.Fatalf("the same registration again: %v", err)
	}

	other := &catalogv1.Registration{Module: "sshd", Fingerprint: fpB, Seq: 1, RegisteredAt: timestamppb.Now(), RegisteredBy: "operator/admin"}
	err := s.PutHistory(ctx, other)
	if !errors.Is(err, ErrHistoryConflict) || errors.Is(err, natsx.ErrConflict) {
		t.Fatalf("another registration at sshd.1: %v, want ErrHistoryConflict and no natsx.ErrConflict", err)
	}
	want := "history key sshd.1: the history key holds another registration: " + fpA + " registered by builder/ci, not " + fpB + " registered by operator/admin"
	if err.Error() != want {
		t.Fatalf("error %q, want %q", err, want)
	}
	// Only the time differs: still another registration.
	later := proto.Clone(first).(*catalogv1.Registration)
	later.RegisteredAt = timestamppb.New(first.GetRegisteredAt().AsTime().Add(1))
	if err := s.PutHistory(ctx, later); !errors.Is(err, ErrHistoryConflict) {
		t.Fatalf("the same fingerprint at another time: %v", err)
	}

	hist, err := s.History(ctx, "sshd", 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(hist) != 1 || !proto.Equal(hist[0], first) {
		t.Fatalf("history after the refusals: %v", hist)
	}
}
