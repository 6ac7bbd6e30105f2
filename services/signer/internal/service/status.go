package service

import (
	"context"
	"errors"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// toStatus turns an error of this service into a gRPC status: lint failures
// are INVALID_ARGUMENT naming the item and field, fencing and cross-check
// refusals FAILED_PRECONDITION, an unreachable catalog UNAVAILABLE, and
// anything else INTERNAL with the detail logged, not returned.
func (s *Server) toStatus(ctx context.Context, method string, err error) error {
	switch {
	case errors.Is(err, errInvalid):
		return status.Error(codes.InvalidArgument, err.Error())
	case errors.Is(err, errPrecondition):
		return status.Error(codes.FailedPrecondition, err.Error())
	case errors.Is(err, ErrUnavailable):
		return status.Error(codes.Unavailable, err.Error())
	case errors.Is(err, context.Canceled):
		return status.Error(codes.Canceled, err.Error())
	case errors.Is(err, context.DeadlineExceeded):
		return status.Error(codes.DeadlineExceeded, err.Error())
	}
	s.log.ErrorContext(ctx, "sign request failed", "method", method, "caller", caller(ctx), "error", err)
	return status.Error(codes.Internal, "internal error; see the signer's log")
}
