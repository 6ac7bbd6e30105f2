package natsx

import (
	"errors"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// The sentinels every natsx call maps its errors to; test with errors.Is.
var (
	// ErrNotFound: the key, message or object does not exist, or the key's
	// last revision is a delete or purge marker.
	ErrNotFound = errors.New("not found")
	// ErrConflict: a compare-and-set failed, because the key's last revision
	// is not the one expected or, on Create, because the key exists.
	ErrConflict = errors.New("conflict")
	// ErrTooLarge: a value or message is over the bucket's or the server's
	// size limit.
	ErrTooLarge = errors.New("too large")
	// ErrBehind: GetAtLeast found only revisions below the one its caller
	// knows was written (every replica it asked was behind that write).
	ErrBehind = errors.New("behind a known write")
)

// mappedError carries a sentinel beside the original error. Its text is the
// original's alone, so mapping never changes what is logged, and errors.Is
// matches both the sentinel and everything the original wraps.
type mappedError struct {
	sentinel error
	err      error
}

func (e *mappedError) Error() string   { return e.err.Error() }
func (e *mappedError) Unwrap() []error { return []error{e.sentinel, e.err} }

// MapError returns err wrapped so that errors.Is reports ErrNotFound,
// ErrConflict or ErrTooLarge for the nats and jetstream errors that mean
// those; other errors, nil and errors already mapped are returned unchanged.
// A missing bucket or stream is not ErrNotFound: it is a deployment fault, not
// an absent key.
func MapError(err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, ErrNotFound) || errors.Is(err, ErrConflict) || errors.Is(err, ErrTooLarge) {
		return err
	}
	if s := sentinelOf(err); s != nil {
		return &mappedError{sentinel: s, err: err}
	}
	return err
}

func sentinelOf(err error) error {
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound),
		errors.Is(err, jetstream.ErrKeyDeleted),
		errors.Is(err, jetstream.ErrMsgNotFound),
		errors.Is(err, jetstream.ErrObjectNotFound),
		errors.Is(err, jetstream.ErrNoKeysFound):
		return ErrNotFound
	case errors.Is(err, jetstream.ErrKeyExists),
		errors.Is(err, jetstream.ErrKeyRevisionMismatch):
		return ErrConflict
	case errors.Is(err, nats.ErrMaxPayload),
		errors.Is(err, jetstream.ErrStreamMessageExceedsMaximum):
		return ErrTooLarge
	}
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) {
		switch apiErr.ErrorCode {
		case jetstream.JSErrCodeStreamWrongLastSequence, jetstream.JSErrCodeStreamWrongLastSequenceConstant:
			return ErrConflict
		case jetstream.JSErrCodeStreamMessageExceedsMaximum:
			return ErrTooLarge
		case jetstream.JSErrCodeMessageNotFound:
			return ErrNotFound
		}
	}
	return nil
}

// isWrongLastSequence reports whether err is the server refusing a publish
// whose expected last subject sequence did not match; replicated streams
// report it with another code.
func isWrongLastSequence(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) &&
		(apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence ||
			apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant)
}
