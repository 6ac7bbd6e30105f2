// Package signing is the composer's client of the signer: it carries the
// lease's fencing epoch on every request, and gathers the requests of node
// passes running at once into batches of at most lint.MaxBatch items, since
// the signer fsyncs two audit records per request whatever its size.
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

// Signer signs with the current fencing epoch.
type Signer struct {
	client       Client
	epoch        func() uint64
	tracer       trace.Tracer
	compositions *batcher[*typev1.Composition, *signerv1.SignedItem]
	manifests    *batcher[*signerv1.ManifestItem, *signerv1.SignedManifest]
}

// New returns a Signer; epoch reads the lease's current epoch. Each sign
// call is a span of tracer (a no-op one when nil).
func New(client Client, epoch func() uint64, tracer trace.Tracer) *Signer {
	if tracer == nil {
		tracer = noop.NewTracerProvider().Tracer("")
	}
	s := &Signer{client: client, epoch: epoch, tracer: tracer}
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

// SignCompositions signs compositions, in batches shared with the other
// passes signing at the same time.
func (s *Signer) SignCompositions(ctx context.Context, comps []*typev1.Composition) ([]*signerv1.SignedItem, error) {
	return s.compositions.do(ctx, "composer.sign.compositions", comps)
}

// SignManifests signs manifests, in batches shared with the other passes
// signing at the same time.
func (s *Signer) SignManifests(ctx context.Context, items []*signerv1.ManifestItem) ([]*signerv1.SignedManifest, error) {
	return s.manifests.do(ctx, "composer.sign.manifests", items)
}

func (s *Signer) sendCompositions(ctx context.Context, comps []*typev1.Composition) ([]*signerv1.SignedItem, error) {
	resp, err := s.client.SignCompositions(ctx, &signerv1.SignCompositionsRequest{FencingEpoch: s.epoch(), Compositions: comps})
	if err != nil {
		return nil, err
	}
	if len(resp.GetItems()) != len(comps) {
		return nil, fmt.Errorf("signer returned %d items for %d", len(resp.GetItems()), len(comps))
	}
	return resp.GetItems(), nil
}

func (s *Signer) sendManifests(ctx context.Context, items []*signerv1.ManifestItem) ([]*signerv1.SignedManifest, error) {
	resp, err := s.client.SignManifests(ctx, &signerv1.SignManifestsRequest{FencingEpoch: s.epoch(), Manifests: items})
	if err != nil {
		return nil, err
	}
	if len(resp.GetManifests()) != len(items) {
		return nil, fmt.Errorf("signer returned %d manifests for %d", len(resp.GetManifests()), len(items))
	}
	return resp.GetManifests(), nil
}

// batcher gathers calls into requests of at most lint.MaxBatch items. One
// request is in flight at a time; the calls arriving meanwhile make the next
// one, so an idle composer signs at once and a busy one in few requests.
// When a request with several calls fails, each call is sent again alone,
// so a node whose composition the signer refuses fails only itself.
type batcher[I, O any] struct {
	tracer trace.Tracer
	name   string
	send   func(ctx context.Context, items []I) ([]O, error)

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
	items []I
	out   []O
	err   error
	done  chan struct{}
}

func (b *batcher[I, O]) do(ctx context.Context, spanName string, items []I) ([]O, error) {
	ctx, span := b.tracer.Start(ctx, spanName, trace.WithSpanKind(trace.SpanKindClient), trace.WithAttributes(attribute.Int("mesh.items", len(items))))
	defer span.End()
	c := &call[I, O]{ctx: ctx, span: span, items: items, done: make(chan struct{})}
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
// arriving meanwhile join the next batch.
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
		n := len(b.queue[0].items)
		take := 1
		for take < len(b.queue) && n+len(b.queue[take].items) <= lint.MaxBatch {
			n += len(b.queue[take].items)
			take++
		}
		batch := b.queue[:take:take]
		b.queue = b.queue[take:]
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
	out, err := b.send(ctx, items)
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
		out, err := b.send(ctx, c.items[start:stop])
		cancel()
		if err != nil {
			c.out, c.err = nil, err
			return
		}
		c.out = append(c.out, out...)
	}
}
