package app_test

import (
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"mesh.dev/internal/names"
	"mesh.dev/internal/testutil"
	composerv1 "mesh.dev/proto/mesh/composer/v1"
	typev1 "mesh.dev/proto/mesh/type/v1"
)

// TestKeyStates signs a manifest and its composition with a key the
// keyset lists as RETIRED or REVOKED (DESIGN.md §5.4): a RETIRED key still
// verifies until its not_after, and nothing after; a REVOKED key verifies
// nothing.
func TestKeyStates(t *testing.T) {
	t.Parallel()
	now := time.Now()
	tests := []struct {
		name     string
		state    typev1.KeyState
		notAfter time.Time
		// applied, or else refused with this state, code and words.
		applied bool
		st      composerv1.AttemptState
		code    composerv1.ReasonCode
		words   string
	}{
		{name: "RETIRED before its not_after: accepted", state: typev1.KeyState_KEY_STATE_RETIRED, notAfter: now.Add(time.Hour), applied: true},
		{name: "RETIRED past its not_after: refused", state: typev1.KeyState_KEY_STATE_RETIRED, notAfter: now.Add(-time.Minute),
			st: stateFailed, code: composerv1.ReasonCode_REASON_CODE_SIGNATURE_INVALID, words: "was valid until"},
		{name: "REVOKED: refused", state: typev1.KeyState_KEY_STATE_REVOKED, notAfter: now.Add(time.Hour),
			st: stateStale, code: composerv1.ReasonCode_REASON_CODE_EXPIRED, words: "revoked"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			w := newWorld(t)
			w.keysetWithSigningKey(t, now, tt.state, tt.notAfter)
			r := w.start(t)
			eventually(t, "keyset 2 taken", func() (bool, string) {
				s := r.status(t)
				return s.GetKeysetVersion() == 2, s.String()
			})
			before := snapshot(t, w.root)
			m := w.publish(manifestOpts{}, nodeComp(file("node", "a", "/etc/app/a", "signed by the old key")))
			if tt.applied {
				r.waitApplied(t, m)
				if got := readFile(t, w.path("/etc/app/a")); got != "signed by the old key" {
					t.Errorf("a = %q", got)
				}
				return
			}
			a := r.waitAttempt(t, names.NodeModule, tt.st, tt.code)
			if !strings.Contains(a.GetReason(), tt.words) {
				t.Errorf("reason %q, want it to say %q", a.GetReason(), tt.words)
			}
			r.eng.Engine.Pass(t.Context())
			sameTree(t, before, snapshot(t, w.root))
		})
	}
}

// keysetWithSigningKey makes the composer offer keyset 2, in which the key
// that signs is in the given state until notAfter and a new key is ACTIVE.
func (w *world) keysetWithSigningKey(t *testing.T, now time.Time, state typev1.KeyState, notAfter time.Time) {
	ks := proto.Clone(w.trust.Keyset).(*typev1.Keyset)
	ks.Version = 2
	ks.IssuedAt = timestamppb.New(now)
	ks.Keys = []*typev1.KeysetKey{
		testutil.KeysetKeyOf(w.trust.SigningKey, state, now.Add(-48*time.Hour), notAfter),
		testutil.KeysetKeyOf(testutil.NewKey(t), typev1.KeyState_KEY_STATE_ACTIVE, now.Add(-time.Hour), now.Add(48*time.Hour)),
	}
	w.composer.keyset = w.trust.SignKeyset(t, ks, w.trust.RootKeys...)
}

// TestLiveManifestGoesStale: the manifest an engine applied is judged again
// at every pass: once it expired (beyond the skew), or once the key that
// signed it is past its not_after, the engine says STALE and why, and
// keeps what is applied.
func TestLiveManifestGoesStale(t *testing.T) {
	t.Parallel()
	now := time.Now()
	tests := []struct {
		name string
		// retiredUntil, when set, makes the signing key RETIRED until then.
		retiredUntil time.Time
		expires      time.Time
		later        time.Duration
		words        string
	}{
		{name: "expired", expires: now.Add(2 * time.Hour), later: 3*time.Hour + time.Minute, words: "manifest expired: revision 1 expired at "},
		{name: "key past its not_after", retiredUntil: now.Add(30 * time.Minute), expires: now.Add(24 * time.Hour), later: time.Hour, words: "was valid until"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			w := newWorld(t)
			version := uint64(1)
			if !tt.retiredUntil.IsZero() {
				w.keysetWithSigningKey(t, now, typev1.KeyState_KEY_STATE_RETIRED, tt.retiredUntil)
				version = 2
			}
			var skew atomic.Int64
			r := w.start(t, options{now: func() time.Time { return time.Now().Add(time.Duration(skew.Load())) }})
			eventually(t, "keyset taken", func() (bool, string) {
				s := r.status(t)
				return s.GetKeysetVersion() == version, s.String()
			})
			m := w.publish(manifestOpts{expires: tt.expires}, nodeComp(file("node", "a", "/etc/app/a", "applied")))
			r.waitApplied(t, m)
			if s := r.status(t); s.GetStale() != "" {
				t.Fatalf("stale %q before the clock moved", s.GetStale())
			}
			skew.Store(int64(tt.later))
			r.eng.Engine.Pass(t.Context())
			s := r.status(t)
			if !strings.HasPrefix(s.GetStale(), "STALE since ") || !strings.Contains(s.GetStale(), tt.words) {
				t.Errorf("stale %q, want STALE since … %s", s.GetStale(), tt.words)
			}
			if got := readFile(t, w.path("/etc/app/a")); got != "applied" {
				t.Errorf("a = %q, want what was applied kept", got)
			}
		})
	}
}
