package service

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"mesh.dev/internal/lint"
	"mesh.dev/internal/names"
	"mesh.dev/internal/natsx"
)

func TestToStatus(t *testing.T) {
	t.Parallel()
	s := &Server{log: slog.New(slog.DiscardHandler)}
	fp := names.FingerprintPrefix + strings.Repeat("a", 64)
	cases := []struct {
		name string
		err  error
		code codes.Code
		msg  string
	}{
		{"answer", noEntry(fp), codes.NotFound, "no entry of fingerprint " + fp},
		{"wrapped answer", fmt.Errorf("x: %w", preconditionf("held")), codes.FailedPrecondition, "held"},
		{"lint", &lint.Error{Field: "entry.module", Msg: "bad"}, codes.InvalidArgument, "entry.module: bad"},
		{"conflict", fmt.Errorf("kv: %w", natsx.ErrConflict), codes.Aborted, "a concurrent write came first; retry"},
		{"too large", fmt.Errorf("kv: %w", natsx.ErrTooLarge), codes.InvalidArgument, "kv: too large"},
		{"cancelled", context.Canceled, codes.Canceled, "context canceled"},
		{"client status", status.Error(codes.Unavailable, "gone"), codes.Unavailable, "gone"},
		{"anything else", errors.New("disk on fire at /var/lib/x"), codes.Internal, "internal error; see the catalog's log"},
	}
	for _, tc := range cases {
		st := status.Convert(s.toStatus(context.Background(), "Test", tc.err))
		if st.Code() != tc.code || st.Message() != tc.msg {
			t.Errorf("%s: %v %q, want %v %q", tc.name, st.Code(), st.Message(), tc.code, tc.msg)
		}
	}
}

func TestPageToken(t *testing.T) {
	t.Parallel()
	fp := names.FingerprintPrefix + strings.Repeat("b", 64)
	for _, module := range []string{"", "sshd"} {
		got, err := parsePageToken(pageToken(module, fp), module)
		if err != nil || got != fp {
			t.Errorf("round trip for %q: %q, %v", module, got, err)
		}
	}
	if _, err := parsePageToken(pageToken("sshd", fp), ""); err == nil {
		t.Error("a token of module sshd was taken for all modules")
	}
	if _, err := parsePageToken(pageToken("", "fp1:x"), ""); err == nil {
		t.Error("a token without a fingerprint was taken")
	}
}

func TestKeyedLock(t *testing.T) {
	t.Parallel()
	k := keyedLock{held: map[string]chan struct{}{}}
	unlock, err := k.lock(context.Background(), "a")
	if err != nil {
		t.Fatal(err)
	}
	// Another key is free.
	unlockB, err := k.lock(context.Background(), "b")
	if err != nil {
		t.Fatal(err)
	}
	unlockB()
	// The same key waits until its context ends…
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := k.lock(ctx, "a"); !errors.Is(err, context.Canceled) {
		t.Fatalf("lock of a held key with a cancelled context: %v", err)
	}
	// …or the holder unlocks.
	got := make(chan error, 1)
	go func() {
		u, err := k.lock(context.Background(), "a")
		if err == nil {
			u()
		}
		got <- err
	}()
	unlock()
	if err := <-got; err != nil {
		t.Fatal(err)
	}
	if len(k.held) != 0 {
		t.Errorf("locks left: %v", k.held)
	}
}
