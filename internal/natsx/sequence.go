package natsx

import (
	"context"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"
)

// LastSequence returns the bucket stream's last sequence: the revision of
// the newest write to any key. A watcher that has seen less is behind.
func (k *KV) LastSequence(ctx context.Context) (uint64, error) {
	ctx, span := k.tracer.Start(ctx, "kv.last_sequence "+k.bucket, spanKind, bucketAttr(k.bucket))
	defer span.End()
	info, err := Request(ctx, func(ctx context.Context) (*jetstream.StreamInfo, error) { return k.stream.Info(ctx) })
	if err != nil {
		return 0, endSpan(span, fmt.Errorf("kv %s: stream info: %w", k.bucket, MapError(err)))
	}
	return info.State.LastSeq, nil
}
