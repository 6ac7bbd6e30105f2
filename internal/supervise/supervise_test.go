package supervise

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"
)

func loop(ctx context.Context) error { <-ctx.Done(); return nil }

func TestRun(t *testing.T) {
	t.Parallel()
	boom := errors.New("boom")
	cases := []struct {
		name string
		task Task
		want string
	}{
		{"failure cancels the rest", Task{Name: "watch", Run: func(context.Context) error { return boom }}, "watch: boom"},
		{"panic becomes an error", Task{Name: "sender", Run: func(context.Context) error { panic("nil map") }}, "sender panicked: nil map"},
		{"silent end is a failure", Task{Name: "lease", Run: func(context.Context) error { return nil }}, "lease: ended on its own"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			err := Run(context.Background(), Task{Name: "server", Run: loop}, c.task)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("Run = %v, want %q", err, c.want)
			}
		})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if err := Run(ctx, Task{Name: "a", Run: loop}, Task{Name: "b", Run: loop}); err != nil {
		t.Fatalf("Run after ctx ended = %v", err)
	}
}
