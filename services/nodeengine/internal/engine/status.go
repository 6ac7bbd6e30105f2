package engine

import (
	"sort"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"mesh.dev/internal/envelope"
	nodeenginev1 "mesh.dev/proto/mesh/nodeengine/v1"
	typev1 "mesh.dev/proto/mesh/type/v1"
	"mesh.dev/services/nodeengine/internal/entries"
)

// manifestView summarises a signed manifest.
func manifestView(env *typev1.Envelope) *nodeenginev1.ManifestView {
	if env == nil {
		return nil
	}
	m := &typev1.Manifest{}
	if envelope.Open(env, typev1.PayloadType_PAYLOAD_TYPE_MANIFEST, m) != nil {
		return nil
	}
	v := &nodeenginev1.ManifestView{Revision: m.GetRevision(), Digest: envelope.Digest(env), IssuedAt: m.GetIssuedAt(), ExpiresAt: m.GetExpiresAt()}
	if s := env.GetSignatures(); len(s) > 0 {
		v.KeyId = s[0].GetKeyId()
	}
	return v
}

// Status returns the engine's status for the admin API.
func (e *Engine) Status() *nodeenginev1.GetStatusResponse {
	e.mu.Lock()
	defer e.mu.Unlock()
	s := &nodeenginev1.GetStatusResponse{
		Node: e.cfg.Node, Applied: manifestView(e.applied.Manifest), AppliedManifest: e.applied.Manifest, HighWater: e.hw.Revision,
		Haves: cloneHaves(e.haves), Connected: e.connected, ConnectionError: e.connErr,
		Stale: e.stale, Drift: append([]string{}, e.drift...), Blocked: e.blockedWordsLocked(),
		Wants: []*typev1.Want{}, Holds: []*nodeenginev1.EngineHold{}, Picture: []*nodeenginev1.PictureModule{},
	}
	if e.keyring != nil {
		s.KeysetVersion = e.keyring.Version()
	}
	if e.live != nil && (e.applied.Manifest == nil || envelope.Digest(e.applied.Manifest) != e.live.digest) {
		s.Pending = manifestView(e.live.env)
	}
	for _, w := range e.wants {
		s.Wants = append(s.Wants, proto.Clone(w).(*typev1.Want))
	}
	for _, h := range e.holds {
		s.Holds = append(s.Holds, proto.Clone(h).(*nodeenginev1.EngineHold))
	}
	for _, p := range e.picture {
		s.Picture = append(s.Picture, proto.Clone(p).(*nodeenginev1.PictureModule))
	}
	if !e.lastSync.IsZero() {
		s.LastSync = timestamppb.New(e.lastSync)
	}
	if !e.staleSince.IsZero() {
		s.StaleSince = timestamppb.New(e.staleSince)
	}
	if s.ConnectionError == "" && !s.Connected {
		s.ConnectionError = "not connected to a composer yet"
	}
	return s
}

// FirstViews returns every entries-cache row in any state plus the kept
// entries not in the rows (as ANSWERED), by fingerprint, and the wants
// without "node", by module, since unset when not (yet) kept.
func (e *Engine) FirstViews() *nodeenginev1.FirstViewsResponse {
	rows := e.cache.Rows()
	e.mu.Lock()
	defer e.mu.Unlock()
	out := &nodeenginev1.FirstViewsResponse{Entries: []*nodeenginev1.EntryView{}, Wants: []*nodeenginev1.WantView{}}
	seen := map[string]bool{}
	for _, r := range rows {
		seen[r.Fingerprint] = true
		out.Entries = append(out.Entries, entryView(r))
	}
	for fp, r := range e.dirtyEntries {
		if !seen[fp] {
			seen[fp] = true
			out.Entries = append(out.Entries, entryView(r))
		}
	}
	for fp := range e.keptEntries {
		if !seen[fp] {
			out.Entries = append(out.Entries, &nodeenginev1.EntryView{Fingerprint: fp, State: entries.Answered})
		}
	}
	sort.Slice(out.Entries, func(i, j int) bool { return out.Entries[i].GetFingerprint() < out.Entries[j].GetFingerprint() })
	for m, k := range e.keptWants {
		v := &nodeenginev1.WantView{Module: m, Want: proto.Clone(k.Want).(*typev1.Want)}
		if !e.dirtyWants[m] && !k.Since.IsZero() {
			v.Since = timestamppb.New(k.Since)
		}
		out.Wants = append(out.Wants, v)
	}
	sort.Slice(out.Wants, func(i, j int) bool { return out.Wants[i].GetModule() < out.Wants[j].GetModule() })
	return out
}

func entryView(r entries.Row) *nodeenginev1.EntryView {
	v := &nodeenginev1.EntryView{Fingerprint: r.Fingerprint, Module: r.Module(), State: r.State, Error: r.Error}
	if !r.Since.IsZero() {
		v.Since = timestamppb.New(r.Since)
	}
	return v
}

// blockedWordsLocked says why the engine applies nothing, "" when it
// applies; e.mu is held.
func (e *Engine) blockedWordsLocked() string {
	if e.block != nil {
		return e.block.reason
	}
	return e.blocked
}
