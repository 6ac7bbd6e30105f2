// Package syncsvc implements mesh.composer.v1.SyncService (DESIGN.md §6): one
// long-lived stream per node engine, on any composer replica. One watch per
// composer process over assignments and haves is fanned out to every stream;
// a stream holds at most a "something changed" mark, never a queue, and sends
// the latest state when it can, so a slow engine costs one pending mark.
package syncsvc

import (
	"context"
	"errors"
	"log/slog"
	"sort"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"

	"mesh.dev/internal/natsx"
	composerv1 "mesh.dev/proto/mesh/composer/v1"
	typev1 "mesh.dev/proto/mesh/type/v1"
	"mesh.dev/services/composer/internal/store"
)

// MaxLag is how far the assignments watch may fall behind the stream before
// this replica reports NOT_SERVING and ends its streams.
const MaxLag = 10 * time.Second

// held is what the hub keeps of one node's assignment.
type held struct {
	revision uint64
	manifest *typev1.Envelope
	// manifestRevision is the manifest's own revision (the signer's).
	manifestRevision uint64
	traceparent      string
	wants            []*typev1.Want
}

// sub is one stream's mailbox: marks, never queues.
type sub struct {
	node     string
	manifest chan struct{}
	keyset   chan struct{}
	heard    chan struct{}
	// needs are the modules the node's wanted modules need (guarded by the
	// hub's mutex): only a change to a node running one of them, or to
	// the node itself, can change its Heard.
	needs map[string]bool
	gone  chan struct{}
}

func mark(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

// Hub watches assignments and haves once per process and tells streams.
type Hub struct {
	store *store.Store
	log   *slog.Logger

	mu          sync.Mutex
	assignments map[string]*held
	haves       map[string]*composerv1.HaveRecord
	// running maps a module to the nodes whose assignment wants it.
	running  map[string]map[string]string
	seenRev  uint64
	caughtUp bool
	healthy  bool
	// behindSince is when the watch was first seen behind the stream.
	behindSince time.Time
	subs        map[string]map[*sub]struct{}
	lastSeen    map[string]time.Time
	unhealthy   chan struct{}
	onHealth    func(bool)
}

// OnHealth registers f, called with the replica's health each time it
// changes (the gRPC health service reports it: DESIGN.md §6 step 4).
func (h *Hub) OnHealth(f func(serving bool)) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.onHealth = f
}

// NewHub returns a hub over the store.
func NewHub(st *store.Store, log *slog.Logger) *Hub {
	if log == nil {
		log = slog.Default()
	}
	return &Hub{store: st, log: log, assignments: map[string]*held{}, haves: map[string]*composerv1.HaveRecord{},
		running: map[string]map[string]string{}, subs: map[string]map[*sub]struct{}{}, lastSeen: map[string]time.Time{},
		unhealthy: make(chan struct{})}
}

// Run watches until ctx is done; the watch breaking ends Run with an error
// (the supervisor then restarts the process's loops).
func (h *Hub) Run(ctx context.Context) error {
	errc := make(chan error, 3)
	go func() { errc <- h.watchAssignments(ctx) }()
	go func() { errc <- h.watchHaves(ctx) }()
	go func() { errc <- h.checkLag(ctx) }()
	err := <-errc
	h.setHealthy(false)
	return err
}

// Healthy reports whether this replica may serve Sync streams: its watch is
// up, has caught up, and is less than MaxLag behind.
func (h *Hub) Healthy() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.healthy
}

// Unhealthy returns a channel closed when the replica stops being healthy.
func (h *Hub) Unhealthy() <-chan struct{} {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.unhealthy
}

func (h *Hub) setHealthy(ok bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if ok == h.healthy {
		return
	}
	h.healthy = ok
	if !ok {
		close(h.unhealthy)
		h.log.Warn("sync: replica not serving: the assignments watch is down or behind")
	} else {
		h.unhealthy = make(chan struct{})
		h.log.Info("sync: replica serving")
	}
	if h.onHealth != nil {
		h.onHealth(ok)
	}
}

func (h *Hub) watchAssignments(ctx context.Context) error {
	w, err := h.store.Assignments.Watch(ctx, ">")
	if err != nil {
		return err
	}
	defer w.Stop()
	for e := range w.Updates() {
		if e == nil {
			h.mu.Lock()
			h.caughtUp = true
			h.mu.Unlock()
			h.setHealthy(true)
			continue
		}
		h.mu.Lock()
		h.seenRev = max(h.seenRev, e.Revision)
		old := h.assignments[e.Key]
		changed := map[string]bool{}
		if old != nil {
			for _, want := range old.wants {
				delete(h.running[want.GetModule()], e.Key)
				changed[want.GetModule()] = true
			}
		}
		if e.Op != jetstream.KeyValuePut {
			delete(h.assignments, e.Key)
			h.notifyHeardLocked(e.Key, changed)
			h.mu.Unlock()
			continue
		}
		a := &composerv1.Assignment{}
		if err := proto.Unmarshal(e.Value, a); err != nil {
			h.mu.Unlock()
			h.log.Warn("sync: an assignment does not decode", "node", e.Key, "error", err)
			continue
		}
		hd := &held{revision: e.Revision, manifest: a.GetManifest(), manifestRevision: a.GetManifestRevision(), wants: a.GetWants()}
		h.assignments[e.Key] = hd
		for _, want := range a.GetWants() {
			if h.running[want.GetModule()] == nil {
				h.running[want.GetModule()] = map[string]string{}
			}
			h.running[want.GetModule()][e.Key] = want.GetFingerprint()
			changed[want.GetModule()] = true
		}
		for s := range h.subs[e.Key] {
			mark(s.manifest)
		}
		h.notifyHeardLocked(e.Key, changed)
		h.mu.Unlock()
	}
	if ctx.Err() != nil {
		return nil
	}
	return errors.Join(errors.New("assignments watch ended"), w.Err())
}

func (h *Hub) watchHaves(ctx context.Context) error {
	w, err := h.store.Haves.Watch(ctx, ">")
	if err != nil {
		return err
	}
	defer w.Stop()
	for e := range w.Updates() {
		if e == nil {
			continue
		}
		h.mu.Lock()
		changed := map[string]bool{}
		for _, hv := range h.haves[e.Key].GetHaves() {
			changed[hv.GetModule()] = true
		}
		if e.Op != jetstream.KeyValuePut {
			delete(h.haves, e.Key)
		} else {
			rec := &composerv1.HaveRecord{}
			if proto.Unmarshal(e.Value, rec) == nil {
				h.haves[e.Key] = rec
				for _, hv := range rec.GetHaves() {
					changed[hv.GetModule()] = true
				}
			}
		}
		h.notifyHeardLocked(e.Key, changed)
		h.mu.Unlock()
	}
	if ctx.Err() != nil {
		return nil
	}
	return errors.Join(errors.New("haves watch ended"), w.Err())
}

// checkLag compares the watch's position with the stream's: a watch more
// than MaxLag behind makes the replica unhealthy until it catches up.
func (h *Hub) checkLag(ctx context.Context) error {
	t := time.NewTicker(2 * time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		last, err := h.store.Assignments.LastSequence(ctx)
		now := time.Now()
		h.mu.Lock()
		behind := err != nil || !h.caughtUp || last > h.seenRev
		if !behind {
			h.behindSince = time.Time{}
		} else if h.behindSince.IsZero() {
			h.behindSince = now
		}
		lagging := behind && now.Sub(h.behindSince) > MaxLag
		caughtUp := h.caughtUp
		h.mu.Unlock()
		switch {
		case lagging:
			h.setHealthy(false)
		case caughtUp && !behind:
			h.setHealthy(true)
		}
	}
}

// notifyHeardLocked marks the Heard of the streams a change of node's
// modules can affect: the node's own (its needs may have changed) and
// those whose needs name one of the modules. Waking every stream on every
// write cost a fleet-wide change most of the composer's CPU.
func (h *Hub) notifyHeardLocked(node string, modules map[string]bool) {
	for s := range h.subs[node] {
		mark(s.heard)
	}
	if len(modules) == 0 {
		return
	}
	for n, subs := range h.subs {
		if n == node {
			continue
		}
		for s := range subs {
			for m := range s.needs {
				if modules[m] {
					mark(s.heard)
					break
				}
			}
		}
	}
}

// setNeeds records the modules a stream's node needs.
func (h *Hub) setNeeds(s *sub, needs []*typev1.Need) {
	m := make(map[string]bool, len(needs))
	for _, n := range needs {
		m[n.GetModule()] = true
	}
	h.mu.Lock()
	s.needs = m
	h.mu.Unlock()
}

// NotifyKeyset tells every stream a newer keyset is available.
func (h *Hub) NotifyKeyset() {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, subs := range h.subs {
		for s := range subs {
			mark(s.keyset)
		}
	}
}

// NodeGone ends the streams of a node whose spec was deleted.
func (h *Hub) NodeGone(node string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for s := range h.subs[node] {
		select {
		case <-s.gone:
		default:
			close(s.gone)
		}
	}
}

func (h *Hub) subscribe(node string) *sub {
	s := &sub{node: node, manifest: make(chan struct{}, 1), keyset: make(chan struct{}, 1), heard: make(chan struct{}, 1), gone: make(chan struct{})}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.subs[node] == nil {
		h.subs[node] = map[*sub]struct{}{}
	}
	h.subs[node][s] = struct{}{}
	h.lastSeen[node] = time.Now()
	return s
}

func (h *Hub) unsubscribe(s *sub) {
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.subs[s.node], s)
	if len(h.subs[s.node]) == 0 {
		delete(h.subs, s.node)
	}
	h.lastSeen[s.node] = time.Now()
}

// Streams returns how many streams are open.
func (h *Hub) Streams() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := 0
	for _, subs := range h.subs {
		n += len(subs)
	}
	return n
}

func (h *Hub) seen(node string) {
	h.mu.Lock()
	h.lastSeen[node] = time.Now()
	h.mu.Unlock()
}

// LastSeen tells when a node's engine was last heard on this replica.
func (h *Hub) LastSeen(node string) time.Time {
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.subs[node]) > 0 {
		return time.Now()
	}
	return h.lastSeen[node]
}

// assignment returns a node's latest assignment as the watch holds it.
func (h *Hub) assignment(node string) *held {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.assignments[node]
}

// liveness is how long an engine may go unheard before the nodes it runs
// count as stopped in Heard.
const liveness = 5 * time.Minute

// heard lists, for each module the node's wanted modules need, the nodes
// running it: bounded by the need's selector and cap, sorted by node.
func (h *Hub) heard(node string, needs []*typev1.Need, labelsOf func(string) map[string]string) *composerv1.Heard {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := &composerv1.Heard{}
	seen := map[string]bool{}
	for _, need := range needs {
		if seen[need.GetModule()] {
			continue
		}
		seen[need.GetModule()] = true
		capN := int(need.GetCap())
		if capN == 0 {
			capN = 16
		}
		hm := &composerv1.HeardModule{Module: need.GetModule()}
		var nodes []string
		for n := range h.running[need.GetModule()] {
			if n == node {
				continue
			}
			ok := true
			labels := labelsOf(n)
			for k, v := range need.GetSelector().GetMatchLabels() {
				if labels[k] != v {
					ok = false
					break
				}
			}
			if ok {
				nodes = append(nodes, n)
			}
		}
		sort.Strings(nodes)
		if len(nodes) > capN {
			nodes = nodes[:capN]
		}
		for _, n := range nodes {
			fp := h.running[need.GetModule()][n]
			stopped := true
			for _, hv := range h.haves[n].GetHaves() {
				if hv.GetModule() == need.GetModule() && hv.GetApplied().GetFingerprint() != "" &&
					hv.GetAttempt().GetState() == composerv1.AttemptState_ATTEMPT_STATE_APPLIED {
					stopped = false
					fp = hv.GetApplied().GetFingerprint()
				}
			}
			last := h.lastSeen[n]
			if len(h.subs[n]) == 0 && (last.IsZero() || time.Since(last) > liveness) {
				stopped = true
			}
			hm.Nodes = append(hm.Nodes, &composerv1.HeardNode{Node: n, Fingerprint: fp, Stopped: stopped})
		}
		out.Modules = append(out.Modules, hm)
	}
	sort.Slice(out.Modules, func(i, j int) bool { return out.Modules[i].GetModule() < out.Modules[j].GetModule() })
	return out
}

// writeHaves keeps one record per node in bucket haves: a report whose
// report_seq is not above the held one is dropped, and a record with the
// same content is not written again. CAS, retried on conflict.
func (h *Hub) writeHaves(ctx context.Context, rec *composerv1.HaveRecord) error {
	for attempt := 0; attempt < 5; attempt++ {
		cur, rev, err := h.store.Have(ctx, rec.GetNode())
		switch {
		case errors.Is(err, natsx.ErrNotFound):
			rev = 0
		case err != nil && rev == 0:
			return err
		case err == nil:
			if cur.GetReportSeq() > rec.GetReportSeq() {
				return nil
			}
			if sameHaves(cur, rec) {
				return nil
			}
		}
		_, err = writeRecord(ctx, h.store.Haves, rec.GetNode(), rec, rev)
		if errors.Is(err, natsx.ErrConflict) {
			continue
		}
		return err
	}
	return errors.New("haves of " + rec.GetNode() + ": too many concurrent writers")
}

func sameHaves(a, b *composerv1.HaveRecord) bool {
	x, y := proto.Clone(a).(*composerv1.HaveRecord), proto.Clone(b).(*composerv1.HaveRecord)
	x.ReportSeq, y.ReportSeq = 0, 0
	return proto.Equal(x, y)
}

func writeRecord(ctx context.Context, kv *natsx.KV, key string, m proto.Message, rev uint64) (uint64, error) {
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(m)
	if err != nil {
		return 0, err
	}
	if rev == 0 {
		return kv.Create(ctx, key, b)
	}
	return kv.Update(ctx, key, b, rev)
}
