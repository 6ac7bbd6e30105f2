package natsx

import (
	"errors"
	"fmt"
	"io"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

func TestMapError(t *testing.T) {
	t.Parallel()
	apiErr := func(code jetstream.ErrorCode, desc string) error {
		return fmt.Errorf("nats: %w", &jetstream.APIError{Code: 400, ErrorCode: code, Description: desc})
	}
	alreadyMapped := MapError(jetstream.ErrKeyNotFound)
	tests := []struct {
		name string
		err  error
		want error // nil: unchanged
	}{
		{name: "key not found", err: jetstream.ErrKeyNotFound, want: ErrNotFound},
		{name: "key deleted", err: jetstream.ErrKeyDeleted, want: ErrNotFound},
		{name: "message not found", err: jetstream.ErrMsgNotFound, want: ErrNotFound},
		{name: "object not found", err: jetstream.ErrObjectNotFound, want: ErrNotFound},
		{name: "no keys", err: jetstream.ErrNoKeysFound, want: ErrNotFound},
		{name: "wrapped not found", err: fmt.Errorf("get x: %w", jetstream.ErrKeyNotFound), want: ErrNotFound},
		{name: "api message not found", err: apiErr(jetstream.JSErrCodeMessageNotFound, "no message found"), want: ErrNotFound},
		{name: "key exists", err: jetstream.ErrKeyExists, want: ErrConflict},
		{name: "revision mismatch", err: jetstream.ErrKeyRevisionMismatch, want: ErrConflict},
		{name: "wrong last sequence", err: apiErr(jetstream.JSErrCodeStreamWrongLastSequence, "wrong last sequence: 4"), want: ErrConflict},
		{name: "wrong last sequence (replicated)", err: apiErr(jetstream.JSErrCodeStreamWrongLastSequenceConstant, "wrong last sequence"), want: ErrConflict},
		{name: "client max payload", err: nats.ErrMaxPayload, want: ErrTooLarge},
		{name: "stream max message size", err: apiErr(jetstream.JSErrCodeStreamMessageExceedsMaximum, "message size exceeds maximum allowed"), want: ErrTooLarge},
		{name: "bucket not found is not a missing key", err: jetstream.ErrBucketNotFound},
		{name: "stream not found is not a missing key", err: jetstream.ErrStreamNotFound},
		{name: "timeout", err: nats.ErrTimeout},
		{name: "other", err: io.ErrUnexpectedEOF},
		{name: "already mapped", err: alreadyMapped, want: ErrNotFound},
	}
	sentinels := []error{ErrNotFound, ErrConflict, ErrTooLarge}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got := MapError(tt.err)
			if got.Error() != tt.err.Error() {
				t.Errorf("text changed: %q, was %q", got.Error(), tt.err.Error())
			}
			if !errors.Is(got, tt.err) {
				t.Errorf("mapped error does not wrap the original")
			}
			for _, s := range sentinels {
				if errors.Is(got, s) != (s == tt.want) {
					t.Errorf("errors.Is(%v) = %v, want %v", s, errors.Is(got, s), s == tt.want)
				}
			}
			if tt.want == nil && got != tt.err {
				t.Errorf("unmapped error was changed")
			}
		})
	}
	if MapError(nil) != nil {
		t.Error("MapError(nil) != nil")
	}
	if got := MapError(alreadyMapped); got != alreadyMapped {
		t.Error("mapping twice wrapped again")
	}
}
