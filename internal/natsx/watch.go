package natsx

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
)

// WatchOption configures Watch.
type WatchOption func(*watchOptions)

type watchOptions struct {
	includeHistory bool
	updatesOnly    bool
	ignoreDeletes  bool
	metaOnly       bool
	fromRevision   uint64
}

// IncludeHistory delivers every kept revision of the matching keys, not only
// the latest.
func IncludeHistory() WatchOption { return func(o *watchOptions) { o.includeHistory = true } }

// UpdatesOnly delivers only writes made after the watch starts; no initial
// values and no initial-values-done marker.
func UpdatesOnly() WatchOption { return func(o *watchOptions) { o.updatesOnly = true } }

// IgnoreDeletes leaves delete and purge markers out.
func IgnoreDeletes() WatchOption { return func(o *watchOptions) { o.ignoreDeletes = true } }

// MetaOnly delivers entries without their values.
func MetaOnly() WatchOption { return func(o *watchOptions) { o.metaOnly = true } }

// ResumeFromRevision delivers every message of the matching keys from
// revision rev on (a watcher that saw up to revision r resumes from r+1); the
// initial-values-done marker follows the last message stored when the watch
// started.
func ResumeFromRevision(rev uint64) WatchOption {
	return func(o *watchOptions) { o.fromRevision = rev }
}

// watchInactiveThreshold lets the server drop the consumer of a watcher
// whose process died without stopping it.
const watchInactiveThreshold = time.Minute

// Watcher delivers the entries of a watch in revision order.
type Watcher struct {
	updates chan *Entry
	stopped chan struct{}
	done    chan struct{}
	stop    sync.Once
	it      jetstream.MessagesContext
	cleanup func()

	mu  sync.Mutex
	err error
}

// Updates returns the channel of entries. A nil entry marks that every value
// stored when the watch started has been delivered (as nats.go's watcher
// does). The channel is closed after Stop, when the watch's context ends, or
// when the watch fails (see Err).
func (w *Watcher) Updates() <-chan *Entry { return w.updates }

// Err returns why the watch ended on its own, once Updates is closed; nil
// after Stop or the end of the watch's context.
func (w *Watcher) Err() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.err
}

// Stop ends the watch, deletes its consumer and waits until Updates is
// closed. It may be called more than once.
func (w *Watcher) Stop() {
	w.stop.Do(func() {
		close(w.stopped)
		w.it.Stop()
	})
	<-w.done
}

// Watch watches the keys matching the subject filter keys ("" or ">" for all)
// and delivers their latest values, a nil marker, then every later write,
// markers included unless IgnoreDeletes. Each entry carries the headers it
// was written with, so its TraceContext continues the writer's trace. The
// watch survives reconnects and server restarts (the ordered consumer is
// recreated after the last delivered revision) and ends with ctx.
func (k *KV) Watch(ctx context.Context, keys string, opts ...WatchOption) (*Watcher, error) {
	var filters []string
	if keys != "" {
		filters = []string{keys}
	}
	return k.WatchFiltered(ctx, filters, opts...)
}

// WatchFiltered is Watch with several subject filters.
func (k *KV) WatchFiltered(ctx context.Context, keys []string, opts ...WatchOption) (*Watcher, error) {
	var o watchOptions
	for _, opt := range opts {
		opt(&o)
	}
	ctx, span := k.start(ctx, "kv.watch", strings.Join(keys, ","))
	defer span.End()
	w, err := k.watch(ctx, keys, o)
	if err != nil {
		return nil, k.fail(span, "watch", strings.Join(keys, ","), err)
	}
	return w, nil
}

func (k *KV) watch(ctx context.Context, keys []string, o watchOptions) (*Watcher, error) {
	subjects := make([]string, 0, max(len(keys), 1))
	for _, key := range keys {
		if !searchKeyValid(key) {
			return nil, fmt.Errorf("%w: filter %q", jetstream.ErrInvalidKey, key)
		}
		subjects = append(subjects, k.prefix+key)
	}
	if len(subjects) == 0 {
		subjects = append(subjects, k.prefix+">")
	}
	cfg := jetstream.OrderedConsumerConfig{
		FilterSubjects:    subjects,
		DeliverPolicy:     jetstream.DeliverLastPerSubjectPolicy,
		HeadersOnly:       o.metaOnly,
		InactiveThreshold: watchInactiveThreshold,
	}
	switch {
	case o.fromRevision > 0:
		cfg.DeliverPolicy = jetstream.DeliverByStartSequencePolicy
		cfg.OptStartSeq = o.fromRevision
	case o.updatesOnly:
		cfg.DeliverPolicy = jetstream.DeliverNewPolicy
	case o.includeHistory:
		cfg.DeliverPolicy = jetstream.DeliverAllPolicy
	}
	cons, err := k.js.OrderedConsumer(ctx, kvStreamName(k.bucket), cfg)
	if err != nil {
		return nil, err
	}
	// What was pending when the consumer was created is what the initial
	// values are; counting deliveries against it (or seeing nothing left
	// pending) tells when they are done, as nats.go does.
	var initPending uint64
	if info := cons.CachedInfo(); info != nil {
		initPending = info.NumPending
	}
	it, err := cons.Messages()
	if err != nil {
		deleteConsumer(k.js, kvStreamName(k.bucket), cons)
		return nil, err
	}
	w := &Watcher{
		updates: make(chan *Entry, 256),
		stopped: make(chan struct{}),
		done:    make(chan struct{}),
		it:      it,
		cleanup: func() { deleteConsumer(k.js, kvStreamName(k.bucket), cons) },
	}
	trace.SpanFromContext(ctx).SetAttributes(attribute.Int64("kv.initial_pending", int64(initPending)))

	go func() {
		select {
		case <-ctx.Done():
			w.stop.Do(func() {
				close(w.stopped)
				it.Stop()
			})
		case <-w.done:
		}
	}()
	go w.run(ctx, k, o, initPending)
	return w, nil
}

func (w *Watcher) run(ctx context.Context, k *KV, o watchOptions, initPending uint64) {
	defer close(w.done)
	defer close(w.updates)
	defer w.cleanup()
	send := func(e *Entry) bool {
		select {
		case w.updates <- e:
			return true
		case <-w.stopped:
			return false
		case <-ctx.Done():
			return false
		}
	}
	initDone := o.updatesOnly
	if !initDone && initPending == 0 {
		initDone = true
		if !send(nil) {
			return
		}
	}
	var received uint64
	for {
		msg, err := w.it.Next()
		if err != nil {
			if !errors.Is(err, jetstream.ErrMsgIteratorClosed) {
				select {
				case <-w.stopped:
				default:
					w.mu.Lock()
					w.err = MapError(err)
					w.mu.Unlock()
				}
			}
			return
		}
		meta, err := msg.Metadata()
		if err != nil {
			w.mu.Lock()
			w.err = err
			w.mu.Unlock()
			return
		}
		e := &Entry{
			Key:      strings.TrimPrefix(msg.Subject(), k.prefix),
			Value:    msg.Data(),
			Revision: meta.Sequence.Stream,
			Created:  meta.Timestamp,
			Header:   msg.Headers(),
		}
		e.Op = opOf(e.Header)
		if !o.ignoreDeletes || e.Op == jetstream.KeyValuePut {
			if !send(e) {
				return
			}
		}
		if !initDone {
			received++
			if received >= initPending || meta.NumPending == 0 {
				initDone = true
				if !send(nil) {
					return
				}
			}
		}
	}
}

// deleteConsumer removes a stopped watcher's consumer now rather than after
// its inactivity threshold: listing keys creates one per call.
func deleteConsumer(js jetstream.JetStream, stream string, cons jetstream.Consumer) {
	info := cons.CachedInfo()
	if info == nil {
		return
	}
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = js.DeleteConsumer(ctx, stream, info.Name)
	}()
}
