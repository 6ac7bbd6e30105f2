package natsx

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
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
	resyncMarker   bool
	// oneShot watches end once the initial values are delivered (listings):
	// they need no regression check.
	oneShot bool
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

// ResyncMarker makes a watch that starts over (see Watch) deliver an entry
// with Resync set, and no key, before it delivers the bucket's values
// again: a watcher that keeps positions (revisions seen) resets them there.
func ResyncMarker() WatchOption { return func(o *watchOptions) { o.resyncMarker = true } }

// ErrRegressed ends a watch that cannot start over (IncludeHistory,
// UpdatesOnly, ResumeFromRevision) when the bucket's stream went back behind
// what the watch delivered: acknowledged writes were lost (a store restored
// from an older snapshot, a disk that lied about its fsyncs). Its caller
// starts again from what the bucket holds now.
var ErrRegressed = errors.New("the bucket's stream went back behind what the watch delivered (acknowledged writes were lost)")

// watchInactiveThreshold lets the server drop the consumer of a watcher
// whose process died without stopping it.
const watchInactiveThreshold = time.Minute

// Regression checks (see Watch): at once after the connection reconnected
// (a server restart is when a store can go back), and every
// regressionCheckEvery otherwise; regressionTick is how often the
// reconnect count is looked at.
var (
	regressionTick       = 250 * time.Millisecond
	regressionCheckEvery = 5 * time.Second
	regressionRetry      = time.Second
	// A watch waiting for its next message while its keys hold one it has
	// not delivered, on every check for stallAfter, has stalled: its
	// consumer is gone or silent and the client library did not notice.
	// The watch then resumes on a new consumer after what it delivered.
	stallAfter = 15 * time.Second
	// resumeRetry bounds the wait between attempts to make that consumer.
	resumeRetry = 10 * time.Second
)

// Watcher delivers the entries of a watch in revision order.
type Watcher struct {
	updates chan *Entry
	stopped chan struct{}
	// halted ends with stopped: the delivery loop's reads wait under it,
	// so a stop ends a read even when the iterator it stopped was being
	// replaced (nats.go's ordered consumer recreating itself).
	halted    context.Context
	haltReads context.CancelFunc
	done      chan struct{}
	stop      sync.Once
	k         *KV
	cfg       jetstream.OrderedConsumerConfig
	o         watchOptions

	mu  sync.Mutex
	err error
	it  jetstream.MessagesContext
	// reads is the context the delivery loop reads it under (a child of
	// halted); a start over or resume ends the read by interrupt, and the
	// delivery loop then stops it itself. Stopped from another goroutine,
	// nats.go's ordered consumer can lose the Stop: one that takes its lock
	// while it replaces its inner iterator (after a server restart) stops
	// the iterator replaced, Next goes on reading the new one for ever, and
	// that one is never stopped (seen as a watch never starting over).
	reads     context.Context
	interrupt context.CancelFunc
	// cons is the consumer of it.
	cons jetstream.Consumer
	// lastSeq, lastSubject and lastTime are the stream sequence, subject
	// and server timestamp of the last message delivered.
	lastSeq     uint64
	lastSubject string
	lastTime    time.Time
	// restart is set when the check found the stream went back: the
	// delivery loop starts over.
	restart bool
	// live are the keys whose last delivered message is a value, kept by
	// watches that can start over (nil for the others).
	live map[string]struct{}
	// regressions counts how often the watch started over.
	regressions int
	// waiting is set while the delivery loop waits for the next message
	// (not while it waits for its reader).
	waiting bool
	// floor is the stream sequence the watch's consumer started after
	// (what its info called delivered at creation).
	floor uint64
	// resume is set when the check found the watch stalled: the delivery
	// loop resumes on a new consumer after the last delivered message.
	resume bool
	// resumes counts how often the watch resumed after a stall.
	resumes int
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

// Regressions returns how many times the watch started over because its
// bucket's stream went back.
func (w *Watcher) Regressions() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.regressions
}

// Resumes returns how many times the watch resumed on a new consumer
// because the one it read was gone or silent while its keys held messages
// it had not delivered.
func (w *Watcher) Resumes() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.resumes
}

// Stop ends the watch, deletes its consumer and waits until Updates is
// closed. It may be called more than once.
func (w *Watcher) Stop() {
	w.halt()
	<-w.done
}

// halt stops the delivery loop without waiting for it.
func (w *Watcher) halt() {
	w.stop.Do(func() {
		w.mu.Lock()
		close(w.stopped)
		it := w.it
		w.mu.Unlock()
		w.haltReads()
		it.Stop()
	})
}

// Watch watches the keys matching the subject filter keys ("" or ">" for all)
// and delivers their latest values, a nil marker, then every later write,
// markers included unless IgnoreDeletes. Each entry carries the headers it
// was written with, so its TraceContext continues the writer's trace. The
// watch survives reconnects and server restarts (the ordered consumer is
// recreated after the last delivered revision) and ends with ctx.
//
// It also survives a stream that went back (a store restored from an older
// snapshot: acknowledged writes lost, and sequences handed out again), which
// an ordered consumer resuming after the last delivered revision would not
// see: it would deliver nothing until the stream grew past that revision,
// and never the writes in between. The watch checks after every reconnect
// and every few seconds that the stream's last sequence is not below the
// last message it delivered and that that message is still the one it
// delivered; when either fails it starts over: (with ResyncMarker, an entry
// with Resync set,) the latest value of every matching key again, a delete
// marker of revision 0 for each key it had delivered a value of that holds
// none now, then a nil marker. After that marker what the watch delivered
// is what the bucket holds. A watch that cannot start over (IncludeHistory,
// UpdatesOnly, ResumeFromRevision) ends with ErrRegressed instead.
//
// And it survives a consumer that falls silent: gone with the server that
// held it, or delivering nothing, while the client library sees no error.
// A watch waiting for its next message while its keys hold one after the
// last it delivered, on every check for stallAfter, resumes on a new
// consumer after that message (Resumes counts it, and a warning is logged).
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

// canStartOver reports whether a watch of these options can start over
// from the bucket's current values and still mean what its caller asked.
func (o watchOptions) canStartOver() bool {
	return o.fromRevision == 0 && !o.updatesOnly && !o.includeHistory
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
	halted, haltReads := context.WithCancel(context.Background())
	w := &Watcher{
		updates: make(chan *Entry, 256),
		stopped: make(chan struct{}),
		halted:  halted, haltReads: haltReads,
		done: make(chan struct{}),
		k:    k,
		cfg:  cfg,
		o:    o,
	}
	if o.canStartOver() && !o.oneShot {
		w.live = map[string]struct{}{}
	}
	initPending, err := w.open(ctx, cfg)
	if err != nil {
		return nil, err
	}
	trace.SpanFromContext(ctx).SetAttributes(attribute.Int64("kv.initial_pending", int64(initPending)))

	go func() {
		select {
		case <-ctx.Done():
			w.halt()
		case <-w.done:
		}
	}()
	go w.run(ctx, initPending)
	if !o.oneShot {
		w.enlist()
		go func() {
			<-w.done
			w.leave()
		}()
		go w.check(ctx)
	}
	return w, nil
}

// open creates the watch's consumer of cfg and its message iterator and
// returns how many messages were pending at its creation: the initial
// values.
func (w *Watcher) open(ctx context.Context, cfg jetstream.OrderedConsumerConfig) (uint64, error) {
	stream := kvStreamName(w.k.bucket)
	cons, err := w.k.js.OrderedConsumer(ctx, stream, cfg)
	if err != nil {
		return 0, err
	}
	// What was pending when the consumer was created is what the initial
	// values are; counting deliveries against it (or seeing nothing left
	// pending) tells when they are done, as nats.go does.
	var initPending, floor uint64
	if info := cons.CachedInfo(); info != nil {
		initPending, floor = info.NumPending, info.Delivered.Stream
	}
	it, err := cons.Messages()
	if err != nil {
		deleteConsumer(w.k.js, stream, cons)
		return 0, err
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	select {
	case <-w.stopped:
		// Stopped while this consumer was made: it is never read.
		it.Stop()
		deleteConsumer(w.k.js, stream, cons)
		return 0, errWatchStopped
	default:
	}
	if w.interrupt != nil {
		w.interrupt()
	}
	w.reads, w.interrupt = context.WithCancel(w.halted)
	if w.restart || w.resume || w.err != nil {
		// Asked while this consumer was made: its first read ends at once.
		w.interrupt()
	}
	w.it, w.cons, w.floor = it, cons, floor
	return initPending, nil
}

// watchStreamInfo asks for the stream's info for a watch's regression
// check; tests replace it to make the check fail.
var watchStreamInfo = func(ctx context.Context, s jetstream.Stream) (*jetstream.StreamInfo, error) {
	return s.Info(ctx)
}

// watchNext reads a watch's next message; tests replace it to make a
// consumer fall silent.
var watchNext = func(it jetstream.MessagesContext, ctx context.Context) (jetstream.Msg, error) {
	return it.Next(jetstream.NextContext(ctx))
}

// errWatchStopped is returned by open when the watch was stopped meanwhile.
var errWatchStopped = errors.New("watch stopped")

func (w *Watcher) cleanup() {
	w.mu.Lock()
	cons := w.cons
	w.mu.Unlock()
	if cons != nil {
		deleteConsumer(w.k.js, kvStreamName(w.k.bucket), cons)
	}
}

func (w *Watcher) fail(err error) {
	select {
	case <-w.stopped:
	default:
		w.mu.Lock()
		w.err = err
		w.mu.Unlock()
	}
}

func (w *Watcher) run(ctx context.Context, initPending uint64) {
	defer close(w.done)
	defer close(w.updates)
	defer w.cleanup()
	k, o := w.k, w.o
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
	var (
		initDone = o.updatesOnly
		received uint64
		// again holds, while a watch that started over delivers its
		// initial values, the keys delivered so far.
		again map[string]bool
	)
	// endInit sends the initial-values-done marker, after the delete
	// markers of keys that hold nothing since the watch started over.
	endInit := func() bool {
		initDone = true
		if again != nil {
			w.mu.Lock()
			var gone []string
			for key := range w.live {
				if !again[key] {
					gone = append(gone, key)
					delete(w.live, key)
				}
			}
			w.mu.Unlock()
			again = nil
			if !o.ignoreDeletes {
				for _, key := range gone {
					if !send(&Entry{Key: key, Op: jetstream.KeyValueDelete}) {
						return false
					}
				}
			}
		}
		return send(nil)
	}
	if !initDone && initPending == 0 && !endInit() {
		return
	}
	// consumerSeq is the consumer sequence of the last message read: one
	// not above it comes from a consumer nats.go's ordered consumer made
	// again (after a reconnect or a server restart) from the last message
	// it handed over. That one delivers every message after it, superseded
	// revisions too, so the initial values still to come are counted again
	// from its pending count (the marker may come a little late, never
	// before the latest value of every key).
	var consumerSeq uint64
	for {
		w.mu.Lock()
		it, reads := w.it, w.reads
		w.waiting = true
		w.mu.Unlock()
		msg, err := watchNext(it, reads)
		w.mu.Lock()
		w.waiting = false
		w.mu.Unlock()
		if err != nil {
			select {
			case <-w.stopped:
				return
			default:
			}
			// Interrupted (see Watcher.reads) counts as stopped: the
			// iterator is stopped here, from the goroutine that reads it,
			// so no reset of the ordered consumer runs meanwhile.
			interrupted := reads.Err() != nil
			if interrupted {
				it.Stop()
			}
			w.mu.Lock()
			closed := errors.Is(err, jetstream.ErrMsgIteratorClosed) || interrupted
			restart := w.restart && closed
			resume := w.resume && closed && !restart
			w.restart, w.resume = false, false
			w.mu.Unlock()
			if resume {
				pending, fresh, ok := w.resumeAfterStall(ctx, initDone)
				if !ok {
					return
				}
				consumerSeq = 0
				if fresh {
					received, initPending = 0, pending
					if !initDone && pending == 0 && !endInit() {
						return
					}
				}
				continue
			}
			if !restart {
				if !closed {
					w.fail(MapError(err))
				}
				return
			}
			// The stream went back: start over from what it holds now.
			w.cleanup()
			pending, err := w.open(ctx, w.cfg)
			if err != nil {
				w.fail(fmt.Errorf("start the watch over after the stream went back: %w", err))
				return
			}
			w.mu.Lock()
			w.lastSeq, w.lastSubject, w.lastTime = 0, "", time.Time{}
			w.regressions++
			w.mu.Unlock()
			if o.resyncMarker && !send(&Entry{Resync: true}) {
				return
			}
			initDone, received, again, consumerSeq = false, 0, map[string]bool{}, 0
			if pending == 0 && !endInit() {
				return
			}
			continue
		}
		meta, err := msg.Metadata()
		if err != nil {
			w.fail(err)
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
		w.mu.Lock()
		w.lastSeq, w.lastSubject, w.lastTime = meta.Sequence.Stream, msg.Subject(), meta.Timestamp
		if w.live != nil {
			if e.Op == jetstream.KeyValuePut {
				w.live[e.Key] = struct{}{}
			} else {
				delete(w.live, e.Key)
			}
		}
		w.mu.Unlock()
		if again != nil {
			again[e.Key] = true
		}
		if !o.ignoreDeletes || e.Op == jetstream.KeyValuePut {
			if !send(e) {
				return
			}
		}
		recreated := meta.Sequence.Consumer <= consumerSeq
		consumerSeq = meta.Sequence.Consumer
		if !initDone {
			received++
			if recreated {
				initPending = received + meta.NumPending
			}
			if (received >= initPending || meta.NumPending == 0) && !endInit() {
				return
			}
		}
	}
}

// check looks for a stream that went back behind what the watch delivered,
// after every reconnect and every regressionCheckEvery, until the watch
// ends; when it finds one the watch starts over (or ends, see Watch).
func (w *Watcher) check(ctx context.Context) {
	nc := w.k.js.Conn()
	reconnects := nc.Stats().Reconnects
	tick := time.NewTicker(regressionTick)
	defer tick.Stop()
	due := time.Now().Add(regressionCheckEvery)
	// suspect is since when the watch has waited with a message of its
	// keys it did not deliver, and suspectSeq what it had delivered then.
	var suspect time.Time
	var suspectSeq uint64
	for {
		select {
		case <-w.done:
			return
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		if r := nc.Stats().Reconnects; r != reconnects {
			reconnects, due = r, time.Now()
		}
		if time.Now().Before(due) {
			continue
		}
		regressed, err := w.regressed(ctx)
		if err != nil {
			// The server may not serve JetStream yet after a restart: ask
			// again soon, and still look for a stall below (a check whose
			// stream info keeps failing must not keep a silent consumer).
			due = time.Now().Add(regressionRetry)
		} else {
			due = time.Now().Add(regressionCheckEvery)
		}
		if regressed {
			suspect = time.Time{}
			w.startOver()
			w.tellRegressed()
			continue
		}
		behind, seq, err := w.undelivered(ctx)
		switch {
		case err != nil || !behind:
			suspect = time.Time{}
		case suspect.IsZero() || seq != suspectSeq:
			suspect, suspectSeq = time.Now(), seq
		case time.Since(suspect) >= stallAfter:
			suspect = time.Time{}
			w.resumeNow()
		}
	}
}

// undelivered reports whether the watch waits for its next message while
// its keys hold one after the last it delivered (and after where its
// consumer started), with that last delivered sequence. A direct get may
// be served by a replica that lags: it can miss a message, never invent
// one.
func (w *Watcher) undelivered(ctx context.Context) (bool, uint64, error) {
	w.mu.Lock()
	waiting, last, floor := w.waiting, w.lastSeq, w.floor
	w.mu.Unlock()
	if !waiting {
		return false, last, nil
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	for _, subject := range w.cfg.FilterSubjects {
		_, err := w.k.stream.GetMsg(ctx, max(last, floor)+1, jetstream.WithGetMsgSubject(subject))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue
		}
		if err != nil {
			return false, last, err
		}
		return true, last, nil
	}
	return false, last, nil
}

// resumeNow makes the delivery loop resume on a new consumer (see
// resumeAfterStall).
func (w *Watcher) resumeNow() {
	w.mu.Lock()
	w.resume = true
	it := w.it
	w.interrupt()
	w.mu.Unlock()
	// Also stopped from here: a read can be held inside nats.go's ordered
	// consumer recreating itself, which only a Stop ends, not the context
	// (a consumer that cannot be recreated would hold the watch for good).
	it.Stop()
}

// resumeAfterStall replaces a stalled watch's consumer by one that delivers
// what follows the last delivered message (or, while the initial values
// are not all delivered and none was, the watch's own consumer again),
// trying until it is made or the watch stops (false). It returns the new
// consumer's pending count and whether the initial values are counted from
// it again (fresh).
func (w *Watcher) resumeAfterStall(ctx context.Context, initDone bool) (pending uint64, fresh, ok bool) {
	w.cleanup()
	w.mu.Lock()
	last, floor := w.lastSeq, w.floor
	w.mu.Unlock()
	cfg := w.cfg
	if initDone || last > 0 {
		cfg.DeliverPolicy = jetstream.DeliverByStartSequencePolicy
		cfg.OptStartSeq = max(last, floor) + 1
	}
	delay := regressionRetry
	for {
		pending, err := w.open(ctx, cfg)
		if err == nil {
			w.mu.Lock()
			w.resumes++
			w.mu.Unlock()
			slog.Default().Warn("a watch resumed on a new consumer: its consumer was gone or silent while its keys held messages it had not delivered",
				"bucket", w.k.bucket, "filter", strings.Join(w.cfg.FilterSubjects, ","), "after_revision", max(last, floor), "initial_values_done", initDone)
			return pending, !initDone, true
		}
		if errors.Is(err, errWatchStopped) {
			return 0, false, false
		}
		select {
		case <-w.stopped:
			return 0, false, false
		case <-ctx.Done():
			return 0, false, false
		case <-time.After(delay):
		}
		delay = min(2*delay, resumeRetry)
	}
}

// regressed reports whether the stream went back behind the last message
// the watch delivered: its last sequence is below it, or the message at
// that sequence is another one (the sequence was handed out again). A
// message no longer there proves nothing (a newer write of its key
// replaced it, or it was purged) and counts as not regressed.
func (w *Watcher) regressed(ctx context.Context) (bool, error) {
	w.mu.Lock()
	seq, subject, at := w.lastSeq, w.lastSubject, w.lastTime
	w.mu.Unlock()
	if seq == 0 {
		return false, nil
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	info, err := watchStreamInfo(ctx, w.k.stream)
	if err != nil {
		return false, err
	}
	switch st := info.State; {
	case st.LastSeq < seq:
		return true, nil
	case st.LastSeq == seq && st.LastTime.Equal(at):
		return false, nil
	}
	// From the leader: a replica behind on a direct-get bucket would miss
	// the message and make it look lost.
	m, err := w.k.leaderGet(ctx, seq, "")
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		// The message is gone: a newer write of its key replaced it (or
		// a purge marker did), both at a higher sequence. If the key's
		// newest message is older than the one delivered, or the key
		// holds none, the delivered one was lost with the writes after
		// the stream's new end, and the sequences after it were handed
		// out again: a history-1 bucket drops the message that would
		// have shown it (found writing again after a restore).
		last, err := w.k.leaderGet(ctx, 0, subject)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return true, nil
		}
		if err != nil {
			return false, err
		}
		return last.Sequence < seq, nil
	}
	if err != nil {
		return false, err
	}
	return m.Subject != subject || !m.Time.Equal(at), nil
}

// regressedStreams tells every watch of a stream on one connection that
// one of them found the stream went back: watches of one bucket in a
// process (a composer's passer, reconciler and Sync hub all follow
// assignments) each check on their own timer, and a check that comes late
// may find the stream grown past what it delivered, with nothing left to
// show that the sequences were handed out again.
var regressedStreams = struct {
	sync.Mutex
	watchers map[streamOf]map[*Watcher]struct{}
}{watchers: map[streamOf]map[*Watcher]struct{}{}}

type streamOf struct {
	conn   *nats.Conn
	stream string
}

func (w *Watcher) streamOf() streamOf {
	return streamOf{conn: w.k.js.Conn(), stream: kvStreamName(w.k.bucket)}
}

// enlist adds a watch to those told of a regression of its stream;
// leave removes it.
func (w *Watcher) enlist() {
	regressedStreams.Lock()
	defer regressedStreams.Unlock()
	key := w.streamOf()
	if regressedStreams.watchers[key] == nil {
		regressedStreams.watchers[key] = map[*Watcher]struct{}{}
	}
	regressedStreams.watchers[key][w] = struct{}{}
}

func (w *Watcher) leave() {
	regressedStreams.Lock()
	defer regressedStreams.Unlock()
	key := w.streamOf()
	delete(regressedStreams.watchers[key], w)
	if len(regressedStreams.watchers[key]) == 0 {
		delete(regressedStreams.watchers, key)
	}
}

// tellRegressed makes every other watch of w's stream start over too.
func (w *Watcher) tellRegressed() {
	regressedStreams.Lock()
	var others []*Watcher
	for o := range regressedStreams.watchers[w.streamOf()] {
		if o != w {
			others = append(others, o)
		}
	}
	regressedStreams.Unlock()
	for _, o := range others {
		o.startOver()
	}
}

// startOver makes the delivery loop start over from the stream's current
// values, or ends a watch that cannot with ErrRegressed.
func (w *Watcher) startOver() {
	w.mu.Lock()
	if w.live == nil {
		w.err = ErrRegressed
	} else {
		w.restart = true
	}
	it := w.it
	w.interrupt()
	w.mu.Unlock()
	it.Stop() // see resumeNow
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
