package service

import (
	"context"
	"errors"
	"fmt"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"mesh.dev/internal/lint"
	"mesh.dev/internal/natsx"
)

// codedError is an answer for the caller: its message goes out as is under
// its code.
type codedError struct {
	code codes.Code
	msg  string
}

func (e *codedError) Error() string { return e.msg }

func coded(code codes.Code, format string, args ...any) error {
	return &codedError{code: code, msg: fmt.Sprintf(format, args...)}
}

func invalidf(format string, args ...any) error { return coded(codes.InvalidArgument, format, args...) }

func notFoundf(format string, args ...any) error { return coded(codes.NotFound, format, args...) }

func preconditionf(format string, args ...any) error {
	return coded(codes.FailedPrecondition, format, args...)
}

// noEntry is the one NOT_FOUND message of an absent entry; node engines
// compare it exactly (DESIGN.md §3, §7).
func noEntry(fp string) error { return notFoundf("no entry of fingerprint %s", fp) }

// toStatus turns an error of this service into a gRPC status: answers made
// by the handlers keep their code and message, lint failures are
// INVALID_ARGUMENT naming the field, a lost compare-and-set ABORTED, a value
// over a limit INVALID_ARGUMENT, and anything else INTERNAL with the detail
// logged, not returned.
func (s *Server) toStatus(ctx context.Context, method string, err error) error {
	var ce *codedError
	var le *lint.Error
	switch {
	case errors.As(err, &ce):
		return status.Error(ce.code, ce.msg)
	case errors.As(err, &le):
		return status.Error(codes.InvalidArgument, le.Error())
	case errors.Is(err, natsx.ErrConflict):
		return status.Error(codes.Aborted, "a concurrent write came first; retry")
	case errors.Is(err, natsx.ErrTooLarge):
		return status.Error(codes.InvalidArgument, err.Error())
	case errors.Is(err, context.Canceled):
		return status.Error(codes.Canceled, err.Error())
	case errors.Is(err, context.DeadlineExceeded):
		return status.Error(codes.DeadlineExceeded, err.Error())
	}
	if st, ok := status.FromError(err); ok && st.Code() != codes.Unknown {
		// A stream's own error (the client went away), passed on.
		return st.Err()
	}
	s.log.ErrorContext(ctx, "catalog request failed", "method", method, "caller", caller(ctx), "error", err)
	return status.Error(codes.Internal, "internal error; see the catalog's log")
}
