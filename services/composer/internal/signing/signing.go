// Package signing is the composer's client of the signer: every request
// carries the fencing epoch of the lease tenure its callers started under,
// and the requests of node passes running at once are gathered into batches
// of at most lint.MaxBatch items of one epoch, since the signer fsyncs two
// audit records per request whatever its size.
package signing

import (
	"context"
	"fmt"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
	"google.golang.org/grpc"

	"mesh.dev/internal/lint"
	signerv1 "mesh.dev/proto/mesh/signer/v1"
	typev1 "mesh.dev/proto/mesh/type/v1"
)

// Client is the part of the signer the composer calls.
type Client interface {
	SignCompositions(ctx context.Context, in *signerv1.SignCompositionsRequest, opts ...grpc.CallOption) (*signerv1.SignCompositionsResponse, error)
	SignManifests(ctx context.Context, in *signerv1.SignManifestsRequest, opts ...grpc.CallOption) (*signerv1.SignManifestsResponse, error)
	Fence(ctx context.Context, in *signerv1.FenceRequest, opts ...grpc.CallOption) (*signerv1.FenceResponse, error)
	GetKeyset(ctx context.Context, in *signerv1.GetKeysetRequest, opts ...grpc.CallOption) (*signerv1.GetKeysetResponse, error)
}

// callTimeout bounds one request to the signer.
const callTimeout = 30 * time.Second

// Signer signs for the lease holder.
type Signer struct {
	client       Client
	tracer       trace.Tracer
	compositions *batcher[*typev1.Composition, *signerv1.SignedItem]
	manifests    *batcher[*signerv1.ManifestItem, *signerv1.SignedManifest]
}

// New returns a Signer. Each sign call is a span of tracer (a no-op one
// when nil).
func New(client Client, tracer trace.Tracer) *Signer {
	if tracer == nil {
		tracer = noop.NewTracerProvider().Tracer("")
	}
	s := &Signer{client: client, tracer: tracer}
	s.compositions = &batcher[*typev1.Composition, *signerv1.SignedItem]{tracer: tracer, name: "compositions", send: s.sendCompositions,
		inFlight: make(chan struct{}, maxInFlight)}
	s.manifests = &batcher[*signerv1.ManifestItem, *signerv1.SignedManifest]{tracer: tracer, name: "manifests", send: s.sendManifests,
		inFlight: make(chan struct{}, maxInFlight)}
	return s
}

// Fence asks the signer for a new epoch.
func (s *Signer) Fence(ctx context.Context, holder string) (uint64, error) {
	resp, err := s.client.Fence(ctx, &signerv1.FenceRequest{Holder: holder})
	if err != nil {
		return 0, err
	}
	return resp.GetEpoch(), nil
}

// SignCompositions signs compositions under a fencing epoch — the one of
// the lease tenure the caller's pass started under, never the lease's
// current one: a pass that outlived its tenure is refused by the signer.
// The compositions go in batches shared with the other passes of the same
// epoch signing at the same time.
func (s *Signer) SignCompositions(ctx context.Context, epoch uint64, comps []*typev1.Composition) ([]*signerv1.SignedItem, error) {
	return s.compositions.do(ctx, "composer.sign.compositions", epoch, comps)
}

// SignManifests signs manifests under a fencing epoch (as SignCompositions),
// in batches shared with the other passes of that epoch signing at the same
// time.
func (s *Signer) SignManifests(ctx context.Context, epoch uint64, items []*signerv1.ManifestItem) ([]*signerv1.SignedManifest, error) {
	return s.manifests.do(ctx, "composer.sign.manifests", epoch, items)
}

func (s *Signer) sendCompositions(ctx context.Context, epoch uint64, comps []*typev1.Composition) ([]*signerv1.SignedItem, error) {
	resp, err := s.client.SignCompositions(ctx, &signerv1.SignCompositionsRequest{FencingEpoch: epoch, Compositions: comps})
	if err != nil {
		return nil, err
	}
	if len(resp.GetItems()) != len(comps) {
		return nil, fmt.Errorf("signer returned %d items for %d", len(resp.GetItems()), len(comps))
	}
	return resp.GetItems(), nil
}

func (s *Signer) sendManifests(ctx context.Context, epoch uint64, items []*signerv1.ManifestItem) ([]*signerv1.SignedManifest, error) {
	resp, err := s.client.SignManifests(ctx, &signerv1.SignManifestsRequest{FencingEpoch: epoch, Manifests: items})
	if err != nil {
		return nil, err
	}
	if len(resp.GetManifests()) != len(items) {
		return nil, fmt.Errorf("signer returned %d manifests for %d", len(resp.GetManifests()), len(items))
	}
	return resp.GetManifests(), nil
}

// batcher gathers calls of one fencing epoch into requests of at most
// lint.MaxBatch items. While requests are in flight the calls arriving
// meanwhile make the next one, so an idle composer signs at once and a busy
// one in few requests. A request never mixes epochs: each call is signed
// under the epoch it asked for or refused.
// When a request with several calls fails, each call is sent again alone,
// so a node whose composition the signer refuses fails only itself.
type batcher[I, O any] struct {
	tracer trace.Tracer
	name   string
	send   func(ctx context.Context, epoch uint64, items []I) ([]O, error)

	mu      sync.Mutex
	queue   []*call[I, O]
	running bool
	// inFlight bounds the requests sent at once: the signer signs
	// concurrent requests in parallel (only its audit appends are
	// serialised), so a few in flight keep it busy while the next batch
	// gathers, instead of every pass waiting a whole round trip in line.
	inFlight chan struct{}
}

// maxInFlight is how many sign requests of one kind may be outstanding.
const maxInFlight = 4

type call[I, O any] struct {
	ctx   context.Context
	span  trace.Span
	epoch uint64
	items []I
	out   []O
	err   error
	done  chan struct{}
}

func (b *batcher[I, O]) do(ctx context.Context, spanName string, epoch uint64, items []I) ([]O, error) {
	ctx, span := b.tracer.Start(ctx, spanName, trace.WithSpanKind(trace.SpanKindClient), trace.WithAttributes(
		attribute.Int("mesh.items", len(items)), attribute.Int64("mesh.fencing_epoch", int64(epoch))))
	defer span.End()
	c := &call[I, O]{ctx: ctx, span: span, epoch: epoch, items: items, done: make(chan struct{})}
	b.mu.Lock()
	b.queue = append(b.queue, c)
	if !b.running {
		b.running = true
		go b.loop()
	}
	b.mu.Unlock()
	select {
	case <-c.done:
	case <-ctx.Done():
		// The request may still be signed; its result is dropped.
		err := ctx.Err()
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
		return nil, err
	}
	if c.err != nil {
		span.RecordError(c.err)
		span.SetStatus(codes.Error, c.err.Error())
		return nil, c.err
	}
	return c.out, nil
}

// loop sends the queued calls until none is left, with at most maxInFlight
// requests outstanding: it takes a batch only once a slot is free, so calls
// arriving meanwhile join the next batch. A batch is the first queued call
// and the calls after it of the same epoch that fit; the others keep their
// place in the queue.
func (b *batcher[I, O]) loop() {
	for {
		b.inFlight <- struct{}{}
		b.mu.Lock()
		if len(b.queue) == 0 {
			b.running = false
			b.mu.Unlock()
			<-b.inFlight
			return
		}
		first := b.queue[0]
		batch := []*call[I, O]{first}
		rest := b.queue[:0:0]
		n := len(first.items)
		for _, c := range b.queue[1:] {
			if c.epoch == first.epoch && n+len(c.items) <= lint.MaxBatch {
				batch = append(batch, c)
				n += len(c.items)
				continue
			}
			rest = append(rest, c)
		}
		b.queue = rest
		b.mu.Unlock()
		go func() {
			defer func() { <-b.inFlight }()
			b.dispatch(batch)
		}()
	}
}

func (b *batcher[I, O]) dispatch(batch []*call[I, O]) {
	if len(batch) == 1 {
		b.sendAlone(batch[0])
		return
	}
	var items []I
	var links []trace.Link
	for _, c := range batch {
		items = append(items, c.items...)
		links = append(links, trace.Link{SpanContext: c.span.SpanContext()})
	}
	// The request continues the first call's trace and links the others.
	ctx, span := b.tracer.Start(context.WithoutCancel(batch[0].ctx), "composer.sign.batch", trace.WithLinks(links...),
		trace.WithAttributes(attribute.String("mesh.kind", b.name), attribute.Int("mesh.calls", len(batch)), attribute.Int("mesh.items", len(items))))
	ctx, cancel := context.WithTimeout(ctx, callTimeout)
	out, err := b.send(ctx, batch[0].epoch, items)
	cancel()
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
		span.End()
		for _, c := range batch {
			b.sendAlone(c)
		}
		return
	}
	span.End()
	for _, c := range batch {
		c.out, out = out[:len(c.items):len(c.items)], out[len(c.items):]
		close(c.done)
	}
}

// sendAlone sends one call, split into requests of at most lint.MaxBatch.
func (b *batcher[I, O]) sendAlone(c *call[I, O]) {
	defer close(c.done)
	for start := 0; start < len(c.items); start += lint.MaxBatch {
		stop := min(start+lint.MaxBatch, len(c.items))
		ctx, cancel := context.WithTimeout(context.WithoutCancel(c.ctx), callTimeout)
		out, err := b.send(ctx, c.epoch, c.items[start:stop])
		cancel()
		if err != nil {
			c.out, c.err = nil, err
			return
		}
		c.out = append(c.out, out...)
	}
}
