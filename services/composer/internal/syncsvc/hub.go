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
	"mesh.dev/services/composer/internal/pass"
	"mesh.dev/services/composer/internal/store"
)

// MaxLag is how far the assignments watch may fall behind the stream before
// this replica reports NOT_SERVING and ends its streams.
const MaxLag = 10 * time.Second

// TouchEvery is how often the replica serving a node's stream rewrites the
// node's haves record unchanged (DESIGN.md §6 step 4: last-seen is kept in
// memory and persisted at most every 5 min). Every replica watches the
// haves, so a write is how an engine streaming to one replica is heard alive
// by the others, and by the lease holder that writes its status.
const TouchEvery = pass.LastSeenEvery

// Liveness is how long a node's engine may go unheard on every replica
// before the modules it runs count as stopped in Heard: two touch periods
// and a minute, so one touch late or lost does not stop a node.
const Liveness = 2*TouchEvery + time.Minute

// touchRetry bounds how often a failed touch is tried again.
const touchRetry = 30 * time.Second

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

	// now is the hub's clock (tests replace it).
	now func() time.Time

	mu          sync.Mutex
	assignments map[string]*held
	haves       map[string]*composerv1.HaveRecord
	// running maps a module to the nodes whose assignment wants it, with
	// the fingerprint wanted.
	running map[string]map[string]string
	// applied maps a module to the nodes whose haves report it applied,
	// with the fingerprint applied: what they run.
	applied  map[string]map[string]string
	seenRev  uint64
	caughtUp bool
	healthy  bool
	// behindSince is when the watch was first seen behind the stream.
	behindSince time.Time
	subs        map[string]map[*sub]struct{}
	// needers indexes the streams by the modules their nodes need (the
	// union of each sub's needs), so a write wakes only the streams it
	// can affect without looking at every stream.
	needers map[string]map[*sub]struct{}
	// lastSeen is when a stream of the node on this replica was last
	// heard; haveAt when its haves record was last written, by any
	// replica (the time this hub saw the write, or the server's time of
	// the write for a record that was there when the watch started).
	lastSeen map[string]time.Time
	haveAt   map[string]time.Time
	// haveRev is the revision of each node's record in haves, when it
	// decoded (see writeHaves).
	haveRev map[string]uint64
	// live is the liveness each node was last judged with, so a node
	// whose engine goes unheard wakes the streams that hear it.
	live       map[string]bool
	touchTried map[string]time.Time
	unhealthy  chan struct{}
	onHealth   func(bool)
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
	return &Hub{store: st, log: log, now: time.Now, assignments: map[string]*held{}, haves: map[string]*composerv1.HaveRecord{},
		running: map[string]map[string]string{}, applied: map[string]map[string]string{}, subs: map[string]map[*sub]struct{}{},
		needers:  map[string]map[*sub]struct{}{},
		lastSeen: map[string]time.Time{}, haveAt: map[string]time.Time{}, haveRev: map[string]uint64{}, live: map[string]bool{}, touchTried: map[string]time.Time{},
		unhealthy: make(chan struct{})}
}

// Run watches until ctx is done; the watch breaking ends Run with an error
// (the supervisor then restarts the process's loops).
func (h *Hub) Run(ctx context.Context) error {
	errc := make(chan error, 4)
	go func() { errc <- h.watchAssignments(ctx) }()
	go func() { errc <- h.watchHaves(ctx) }()
	go func() { errc <- h.checkLag(ctx) }()
	go func() { errc <- h.sweepLiveness(ctx) }()
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
	w, err := h.store.Assignments.Watch(ctx, ">", natsx.ResyncMarker())
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
		if e.Resync {
			// The stream went back to an older state: the revisions seen
			// were handed out again, so the watch's lag is judged from
			// what it delivers from now on, up to its next nil marker.
			h.mu.Lock()
			h.seenRev, h.caughtUp = 0, false
			h.mu.Unlock()
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
		h.judgeLiveLocked(e.Key, h.now())
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
	initial := true
	for e := range w.Updates() {
		if e == nil {
			initial = false
			continue
		}
		h.mu.Lock()
		old := appliedOf(h.haves[e.Key])
		next := map[string]string{}
		if e.Op != jetstream.KeyValuePut {
			delete(h.haves, e.Key)
			delete(h.haveAt, e.Key)
			delete(h.haveRev, e.Key)
		} else {
			rec := &composerv1.HaveRecord{}
			if proto.Unmarshal(e.Value, rec) == nil {
				h.haves[e.Key] = rec
				h.haveRev[e.Key] = e.Revision
				next = appliedOf(rec)
			} else {
				// Runs nothing until a record decodes again (next is
				// empty): the record it compares with goes too, or a
				// good record equal to the last good one would change
				// nothing and leave the node heard stopped.
				delete(h.haves, e.Key)
				delete(h.haveRev, e.Key)
			}
			// A write seen live counts from when it was seen, so a
			// clock skew between this host and the server does not
			// shorten or stretch liveness; a record that was there
			// before the watch started has only the server's time.
			at := h.now()
			if initial {
				at = e.Created
			}
			h.haveAt[e.Key] = at
		}
		// Only what a node runs is heard: attempts change no Heard.
		changed := map[string]bool{}
		for m, fp := range old {
			if next[m] != fp {
				changed[m] = true
				delete(h.applied[m], e.Key)
			}
		}
		for m, fp := range next {
			if old[m] != fp {
				changed[m] = true
				if h.applied[m] == nil {
					h.applied[m] = map[string]string{}
				}
				h.applied[m][e.Key] = fp
			}
		}
		h.notifyHeardLocked(e.Key, changed)
		h.judgeLiveLocked(e.Key, h.now())
		h.mu.Unlock()
	}
	if ctx.Err() != nil {
		return nil
	}
	return errors.Join(errors.New("haves watch ended"), w.Err())
}

// appliedOf returns the fingerprint each module of a record is applied at.
func appliedOf(rec *composerv1.HaveRecord) map[string]string {
	out := map[string]string{}
	for _, hv := range rec.GetHaves() {
		if fp := hv.GetApplied().GetFingerprint(); fp != "" {
			out[hv.GetModule()] = fp
		}
	}
	return out
}

// lastHeardLocked is when node's engine was last heard by any replica: now
// while it streams here, else the later of its last stream here and the
// last write of its haves record.
func (h *Hub) lastHeardLocked(node string, now time.Time) time.Time {
	if len(h.subs[node]) > 0 {
		return now
	}
	last := h.lastSeen[node]
	if at := h.haveAt[node]; at.After(last) {
		last = at
	}
	return last
}

func (h *Hub) liveLocked(node string, now time.Time) bool {
	last := h.lastHeardLocked(node, now)
	return !last.IsZero() && now.Sub(last) <= Liveness
}

// modulesOfLocked lists the modules a node runs or is assigned.
func (h *Hub) modulesOfLocked(node string) map[string]bool {
	out := map[string]bool{}
	if a := h.assignments[node]; a != nil {
		for _, w := range a.wants {
			out[w.GetModule()] = true
		}
	}
	for m := range appliedOf(h.haves[node]) {
		out[m] = true
	}
	return out
}

// judgeLiveLocked judges a node's liveness and, when it changed, wakes the
// streams that hear its modules.
func (h *Hub) judgeLiveLocked(node string, now time.Time) {
	live := h.liveLocked(node, now)
	if was, ok := h.live[node]; ok && was == live {
		return
	}
	h.live[node] = live
	h.notifyHeardLocked(node, h.modulesOfLocked(node))
}

// sweepLiveness judges every node's liveness every few seconds: an engine
// going unheard is a change of time, not of any record.
func (h *Hub) sweepLiveness(ctx context.Context) error {
	t := time.NewTicker(5 * time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		h.sweep(h.now())
	}
}

// sweep judges the liveness of every node known at now.
func (h *Hub) sweep(now time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	nodes := map[string]bool{}
	for n := range h.assignments {
		nodes[n] = true
	}
	for n := range h.haves {
		nodes[n] = true
	}
	// What is kept of a node that has no assignment, no haves and no
	// stream here any more goes, so the maps follow the fleet.
	for _, m := range []map[string]time.Time{h.lastSeen, h.touchTried} {
		for n := range m {
			if !nodes[n] && len(h.subs[n]) == 0 {
				delete(m, n)
			}
		}
	}
	for n := range h.live {
		if !nodes[n] {
			delete(h.live, n)
		}
	}
	for n := range nodes {
		h.judgeLiveLocked(n, now)
	}
}

// touch rewrites a node's haves record unchanged when it was last written
// TouchEvery ago or more, so every replica hears the engine streaming here
// (see TouchEvery). A conflict means another write came first: the node is
// heard anyway.
func (h *Hub) touch(ctx context.Context, node string) error {
	now := h.now()
	h.mu.Lock()
	at, ok := h.haveAt[node]
	due := ok && now.Sub(at) >= TouchEvery && now.Sub(h.touchTried[node]) >= touchRetry
	if due {
		h.touchTried[node] = now
	}
	h.mu.Unlock()
	if !due {
		return nil
	}
	e, err := h.store.Haves.Get(ctx, node)
	if errors.Is(err, natsx.ErrNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	if _, err := h.store.Haves.Update(ctx, node, e.Value, e.Revision); err != nil && !errors.Is(err, natsx.ErrConflict) {
		return err
	}
	return nil
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
		h.judgeLag(ctx, h.now())
	}
}

// judgeLag judges the watch at now: behind the assignments stream (or not
// caught up, or the stream unreadable) for more than MaxLag, the replica is
// unhealthy and its streams end; caught up again, it serves.
func (h *Hub) judgeLag(ctx context.Context, now time.Time) {
	last, err := h.store.Assignments.LastSequence(ctx)
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

// notifyHeardLocked marks the Heard of the streams a change of node's
// modules can affect: the node's own (its needs may have changed) and
// those whose needs name one of the modules. Waking every stream on every
// write cost a fleet-wide change most of the composer's CPU.
func (h *Hub) notifyHeardLocked(node string, modules map[string]bool) {
	for s := range h.subs[node] {
		mark(s.heard)
	}
	for m := range modules {
		for s := range h.needers[m] {
			if s.node != node {
				mark(s.heard)
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
	defer h.mu.Unlock()
	h.dropNeedsLocked(s)
	s.needs = m
	if _, ok := h.subs[s.node][s]; !ok {
		// Unsubscribed already: nothing may keep it indexed.
		return
	}
	for mod := range m {
		if h.needers[mod] == nil {
			h.needers[mod] = map[*sub]struct{}{}
		}
		h.needers[mod][s] = struct{}{}
	}
}

// dropNeedsLocked removes a stream from the needers index.
func (h *Hub) dropNeedsLocked(s *sub) {
	for mod := range s.needs {
		delete(h.needers[mod], s)
		if len(h.needers[mod]) == 0 {
			delete(h.needers, mod)
		}
	}
	s.needs = nil
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

// NodeChanged wakes the streams that hear node's modules, and node's own,
// to judge their Heard again: its labels changed, which a need's selector
// reads, and no assignment or haves write says so.
func (h *Hub) NodeChanged(node string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.notifyHeardLocked(node, h.modulesOfLocked(node))
}

func (h *Hub) subscribe(node string) *sub {
	s := &sub{node: node, manifest: make(chan struct{}, 1), keyset: make(chan struct{}, 1), heard: make(chan struct{}, 1), gone: make(chan struct{})}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.subs[node] == nil {
		h.subs[node] = map[*sub]struct{}{}
	}
	h.subs[node][s] = struct{}{}
	h.lastSeen[node] = h.now()
	h.judgeLiveLocked(node, h.now())
	return s
}

func (h *Hub) unsubscribe(s *sub) {
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.subs[s.node], s)
	h.dropNeedsLocked(s)
	if len(h.subs[s.node]) == 0 {
		delete(h.subs, s.node)
	}
	h.lastSeen[s.node] = h.now()
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
	h.lastSeen[node] = h.now()
	h.mu.Unlock()
}

// LastSeen tells when a node's engine was last heard by any replica: now
// while it streams here, else the later of its last stream here and the
// last write of its haves record (which the replica serving it touches
// every TouchEvery). The lease holder persists it in the node's status.
func (h *Hub) LastSeen(node string) time.Time {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.lastHeardLocked(node, h.now())
}

// assignment returns a node's latest assignment as the watch holds it.
func (h *Hub) assignment(node string) *held {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.assignments[node]
}

// defaultCap is a need's cap when it sets none.
const defaultCap = 16

// heard lists, for each module the node's wanted modules need, the other
// nodes that run it or are assigned it: each at the fingerprint it runs
// (its applied one, whatever its last attempt at a newer one), or at the
// one it is assigned when it runs none; stopped when it runs none or its
// engine has not been heard by any replica within Liveness. Each need of
// the module selects by its selector, running nodes first, then by name,
// up to its cap; a module two needs name lists the nodes either selects.
// Sorted by module, then node.
func (h *Hub) heard(node string, needs []*typev1.Need, labelsOf func(string) map[string]string) *composerv1.Heard {
	h.mu.Lock()
	defer h.mu.Unlock()
	now := h.now()
	byModule := map[string][]*typev1.Need{}
	for _, need := range needs {
		byModule[need.GetModule()] = append(byModule[need.GetModule()], need)
	}
	modules := make([]string, 0, len(byModule))
	for m := range byModule {
		modules = append(modules, m)
	}
	sort.Strings(modules)
	out := &composerv1.Heard{}
	for _, m := range modules {
		cands := h.candidatesLocked(m, node, now)
		labels := make([]map[string]string, len(cands))
		for i, c := range cands {
			labels[i] = labelsOf(c.GetNode())
		}
		chosen := map[string]*composerv1.HeardNode{}
		for _, need := range byModule[m] {
			var sel []*composerv1.HeardNode
			for i, c := range cands {
				if selects(need.GetSelector(), labels[i]) {
					sel = append(sel, c)
				}
			}
			// Running nodes take the cap's places first: a stopped node
			// that sorts first must not crowd out one that runs.
			sort.SliceStable(sel, func(i, j int) bool { return !sel[i].GetStopped() && sel[j].GetStopped() })
			capN := int(need.GetCap())
			if capN == 0 {
				capN = defaultCap
			}
			for _, c := range sel[:min(capN, len(sel))] {
				chosen[c.GetNode()] = c
			}
		}
		hm := &composerv1.HeardModule{Module: m}
		for _, c := range cands {
			if n, ok := chosen[c.GetNode()]; ok {
				hm.Nodes = append(hm.Nodes, n)
			}
		}
		out.Modules = append(out.Modules, hm)
	}
	return out
}

// candidatesLocked returns every node other than self that runs module m
// or is assigned it, by name, with what Heard says of it.
func (h *Hub) candidatesLocked(m, self string, now time.Time) []*composerv1.HeardNode {
	nodes := map[string]bool{}
	for n := range h.running[m] {
		nodes[n] = true
	}
	for n := range h.applied[m] {
		nodes[n] = true
	}
	delete(nodes, self)
	out := make([]*composerv1.HeardNode, 0, len(nodes))
	for n := range nodes {
		fp, runs := h.applied[m][n]
		if !runs {
			fp = h.running[m][n]
		}
		out = append(out, &composerv1.HeardNode{Node: n, Fingerprint: fp, Stopped: !runs || !h.liveLocked(n, now)})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].GetNode() < out[j].GetNode() })
	return out
}

// selects reports whether a label selector selects a node's labels (an
// empty selector selects every node).
func selects(s *typev1.LabelSelector, labels map[string]string) bool {
	for k, v := range s.GetMatchLabels() {
		if got, ok := labels[k]; !ok || got != v {
			return false
		}
	}
	return true
}

// writeHaves keeps one record per node in bucket haves (DESIGN.md §6 step
// 3): a report whose report_seq is below the held one is dropped; one at or
// above it is written when its content differs (an equal report_seq comes
// only from an engine whose sequence was reset, and its report is the
// newest that engine has). A record with the same content is not written
// again. CAS, retried on conflict.
//
// The record the watch delivered last stands in for the first read: a
// report to be written over it is written by CAS at its revision, which
// holds only while it is still the bucket's record, so the report is
// judged against what it replaces all the same; a conflict, or a report
// the watched record would drop, reads the bucket.
func (h *Hub) writeHaves(ctx context.Context, rec *composerv1.HaveRecord) error {
	h.mu.Lock()
	cur, rev := h.haves[rec.GetNode()], h.haveRev[rec.GetNode()]
	h.mu.Unlock()
	if rev != 0 && cur.GetReportSeq() <= rec.GetReportSeq() && !sameHaves(cur, rec) {
		_, err := writeRecord(ctx, h.store.Haves, rec.GetNode(), rec, rev)
		if !errors.Is(err, natsx.ErrConflict) {
			return err
		}
	}
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
