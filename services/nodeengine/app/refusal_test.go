package app_test

import (
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"mesh.dev/internal/names"
	"mesh.dev/internal/testutil"
	composerv1 "mesh.dev/proto/mesh/composer/v1"
	typev1 "mesh.dev/proto/mesh/type/v1"
)

// TestRefusals sends each thing an engine must refuse as the first thing it
// gets, and checks the reason reported and that nothing was written to the
// root.
func TestRefusals(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		// setup prepares the root and returns the manifest to send.
		setup  func(t *testing.T, w *world) *typev1.Envelope
		module string
		state  composerv1.AttemptState
		code   composerv1.ReasonCode
		// words must all be in the reason (key ids, digests and times
		// vary from run to run).
		words []string
	}{
		{
			name: "bad signature", module: names.NodeModule, state: stateFailed, code: composerv1.ReasonCode_REASON_CODE_SIGNATURE_INVALID,
			words: []string{"manifest refused: signature does not verify: by k1:"},
			setup: func(t *testing.T, w *world) *typev1.Envelope {
				return w.manifest(manifestOpts{corrupt: true}, nodeComp(file("node", "a", "/etc/app/a", "a")))
			},
		},
		{
			name: "key not in the keyset", module: names.NodeModule, state: stateFailed, code: composerv1.ReasonCode_REASON_CODE_SIGNATURE_INVALID,
			words: []string{"manifest refused: signing key not in the keyset: k1:", " (keyset version 1)"},
			setup: func(t *testing.T, w *world) *typev1.Envelope {
				return w.manifest(manifestOpts{signer: testutil.NewKey(t)}, nodeComp(file("node", "a", "/etc/app/a", "a")))
			},
		},
		{
			name: "keyset not signed by the roots", module: names.NodeModule, state: stateFailed, code: composerv1.ReasonCode_REASON_CODE_KEYSET_INVALID,
			words: []string{"no keyset verified against the pinned roots yet: the manifest waits (keyset refused: keyset not trusted: 0 of the 1 root signatures needed verify)"},
			setup: func(t *testing.T, w *world) *typev1.Envelope {
				w.composer.keyset = w.trust.SignKeyset(t, w.trust.Keyset, testutil.NewKey(t))
				return w.manifest(manifestOpts{}, nodeComp(file("node", "a", "/etc/app/a", "a")))
			},
		},
		{
			name: "other node's manifest", module: names.NodeModule, state: stateFailed, code: composerv1.ReasonCode_REASON_CODE_NODE_MISMATCH,
			words: []string{`manifest refused: revision 1 is of node "bob", not "ace"`},
			setup: func(t *testing.T, w *world) *typev1.Envelope {
				return w.manifest(manifestOpts{node: "bob"})
			},
		},
		{
			name: "expired manifest", module: names.NodeModule, state: stateStale, code: composerv1.ReasonCode_REASON_CODE_EXPIRED,
			words: []string{"manifest refused: manifest expired: revision 1 expired at "},
			setup: func(t *testing.T, w *world) *typev1.Envelope {
				now := time.Now()
				return w.manifest(manifestOpts{issued: now.Add(-48 * time.Hour), expires: now.Add(-2 * time.Hour)}, nodeComp(file("node", "a", "/etc/app/a", "a")))
			},
		},
		{
			name: "issued more than 24 h ahead", module: names.NodeModule, state: stateFailed, code: composerv1.ReasonCode_REASON_CODE_FAST_FORWARD,
			words: []string{"manifest refused: manifest issued in the future: revision 1 issued at ", ", more than 24h0m0s ahead"},
			setup: func(t *testing.T, w *world) *typev1.Envelope {
				now := time.Now()
				return w.manifest(manifestOpts{issued: now.Add(30 * time.Hour), expires: now.Add(50 * time.Hour)}, nodeComp(file("node", "a", "/etc/app/a", "a")))
			},
		},
		{
			name: "composition digest mismatch", module: names.NodeModule, state: stateFailed, code: composerv1.ReasonCode_REASON_CODE_DIGEST_MISMATCH,
			words: []string{"composition ace.node refused: digest mismatch: composition ace.node has digest sha256:", ", the manifest says " + names.Digest([]byte("something else"))},
			setup: func(t *testing.T, w *world) *typev1.Envelope {
				c := nodeComp(file("node", "a", "/etc/app/a", "a"))
				c.digest = names.Digest([]byte("something else"))
				return w.manifest(manifestOpts{}, c)
			},
		},
		{
			name: "composition signed by a key not in the keyset", module: names.NodeModule, state: stateFailed, code: composerv1.ReasonCode_REASON_CODE_SIGNATURE_INVALID,
			words: []string{"composition ace.node refused: signing key not in the keyset: k1:"},
			setup: func(t *testing.T, w *world) *typev1.Envelope {
				c := nodeComp(file("node", "a", "/etc/app/a", "a"))
				c.signer = testutil.NewKey(t)
				return w.manifest(manifestOpts{}, c)
			},
		},
		{
			name: "object over its declared size", module: names.NodeModule, state: stateFailed, code: composerv1.ReasonCode_REASON_CODE_SIZE_EXCEEDED,
			words: []string{"node:big: object " + names.Digest([]byte("decla")) + " of ace.node is longer than its declared size 5"},
			setup: func(t *testing.T, w *world) *typev1.Envelope {
				content := []byte("declared short, served long")
				digest := names.Digest(content[:5])
				w.composer.objects[digest] = content
				r := &typev1.Resource{Id: "node:big", Type: typev1.ResourceType_RESOURCE_TYPE_FILE, Path: "/etc/app/big", Mode: 0o644,
					Content: &typev1.Resource_Object{Object: &typev1.ObjectRef{Digest: digest, Size: 5}}}
				return w.manifest(manifestOpts{}, nodeComp(r))
			},
		},
		{
			name: ".. escape", module: names.NodeModule, state: stateFailed, code: composerv1.ReasonCode_REASON_CODE_PATH_ESCAPE,
			words: []string{"composition ace.node: node:a: /etc/app/../../etc/shadow escapes with .."},
			setup: func(t *testing.T, w *world) *typev1.Envelope {
				return w.manifest(manifestOpts{}, nodeComp(file("node", "a", "/etc/app/../../etc/shadow", "x")))
			},
		},
		{
			name: "relative symlink target escaping", module: names.NodeModule, state: stateFailed, code: composerv1.ReasonCode_REASON_CODE_PATH_ESCAPE,
			words: []string{"symlink /etc/app/l: target ../../etc/shadow escapes its prefix /etc/app"},
			setup: func(t *testing.T, w *world) *typev1.Envelope {
				l := &typev1.Resource{Id: "node:l", Type: typev1.ResourceType_RESOURCE_TYPE_SYMLINK, Path: "/etc/app/l", Target: "../../etc/shadow"}
				return w.manifest(manifestOpts{}, nodeComp(l))
			},
		},
		{
			name: "absolute symlink escape", module: names.NodeModule, state: stateFailed, code: composerv1.ReasonCode_REASON_CODE_PATH_THROUGH_SYMLINK,
			words: []string{"node:a: /etc/app/sys/passwd passes through the absolute symlink /etc/app/sys -> /"},
			setup: func(t *testing.T, w *world) *typev1.Envelope {
				mustSymlink(t, "/", w.path("/etc/app/sys"))
				return w.manifest(manifestOpts{}, nodeComp(file("node", "a", "/etc/app/sys/passwd", "x")))
			},
		},
		{
			name: "path outside the prefixes", module: names.NodeModule, state: stateFailed, code: composerv1.ReasonCode_REASON_CODE_PATH_OUTSIDE_PREFIXES,
			words: []string{"composition ace.node: node:a: /usr/bin/sudo is outside the allowed prefixes"},
			setup: func(t *testing.T, w *world) *typev1.Envelope {
				return w.manifest(manifestOpts{}, nodeComp(file("node", "a", "/usr/bin/sudo", "x")))
			},
		},
		{
			name: "symlink target outside the prefixes", module: names.NodeModule, state: stateFailed, code: composerv1.ReasonCode_REASON_CODE_PATH_OUTSIDE_PREFIXES,
			words: []string{"symlink /etc/app/l: target /etc/shadow is outside the allowed prefixes"},
			setup: func(t *testing.T, w *world) *typev1.Envelope {
				l := &typev1.Resource{Id: "node:l", Type: typev1.ResourceType_RESOURCE_TYPE_SYMLINK, Path: "/etc/app/l", Target: "/etc/shadow"}
				return w.manifest(manifestOpts{}, nodeComp(l))
			},
		},
		{
			name: "special file", module: names.NodeModule, state: stateFailed, code: composerv1.ReasonCode_REASON_CODE_SPECIAL_FILE,
			words: []string{"node:a: /etc/app/fifo is a FIFO"},
			setup: func(t *testing.T, w *world) *typev1.Envelope {
				mkdirAll(t, w.path("/etc/app"))
				if err := syscall.Mkfifo(w.path("/etc/app/fifo"), 0o600); err != nil {
					t.Fatal(err)
				}
				return w.manifest(manifestOpts{}, nodeComp(file("node", "a", "/etc/app/fifo", "x")))
			},
		},
		{
			name: "unmanaged existing file", module: names.NodeModule, state: stateFailed, code: composerv1.ReasonCode_REASON_CODE_UNMANAGED_PATH,
			words: []string{"node:a: /etc/app/mine exists and is not managed by this engine (not in its ledger, not adopted)"},
			setup: func(t *testing.T, w *world) *typev1.Envelope {
				mkdirAll(t, w.path("/etc/app"))
				if err := os.WriteFile(w.path("/etc/app/mine"), []byte("the operator's"), 0o600); err != nil {
					t.Fatal(err)
				}
				return w.manifest(manifestOpts{}, nodeComp(file("node", "a", "/etc/app/mine", "x")))
			},
		},
		{
			name: "two compositions declare one path", module: "web", state: stateHeld, code: composerv1.ReasonCode_REASON_CODE_PATH_CONFLICT,
			words: []string{"2 resources declare /etc/app/conf: node:conf, web:conf"},
			setup: func(t *testing.T, w *world) *typev1.Envelope {
				fp := w.release("web", "1.0.0", nil)
				return w.manifest(manifestOpts{}, moduleComp("web", fp, file("web", "conf", "/etc/app/conf", "w")), nodeComp(file("node", "conf", "/etc/app/conf", "n")))
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			w := newWorld(t)
			env := tt.setup(t, w)
			r := w.start(t)
			// The whole tree once the engine stands (it makes its
			// prefixes at start): paths, types, modes, owners, contents.
			before := snapshot(t, w.root)
			w.composer.push(&composerv1.SyncResponse{Msg: &composerv1.SyncResponse_Manifest{Manifest: env}})
			// With its words: an attempt of the same code can come first
			// (a keyset refused before the manifest arrived says only
			// that; once the manifest waits, it says both).
			a := r.waitAttempt(t, tt.module, tt.state, tt.code, tt.words...)
			for _, w := range tt.words {
				if !strings.Contains(a.GetReason(), w) {
					t.Errorf("reason %q does not say %q", a.GetReason(), w)
				}
			}
			if len(tt.words) == 0 {
				t.Fatal("the case names no words")
			}
			// One more pass, so a late write would show.
			r.eng.Engine.Pass(t.Context())
			sameTree(t, before, snapshot(t, w.root))
			if s := r.status(t); s.GetApplied() != nil {
				t.Errorf("a manifest was recorded applied: %v", s.GetApplied())
			}
		})
	}
}

const (
	stateApplied = composerv1.AttemptState_ATTEMPT_STATE_APPLIED
	stateFailed  = composerv1.AttemptState_ATTEMPT_STATE_FAILED
	stateHeld    = composerv1.AttemptState_ATTEMPT_STATE_HELD
	stateStale   = composerv1.AttemptState_ATTEMPT_STATE_STALE
)

func mkdirAll(t testing.TB, p string) {
	t.Helper()
	if err := os.MkdirAll(p, 0o755); err != nil {
		t.Fatal(err)
	}
}

func mustSymlink(t testing.TB, target, p string) {
	t.Helper()
	mkdirAll(t, p[:len(p)-len("/"+last(p))])
	if err := os.Symlink(target, p); err != nil {
		t.Fatal(err)
	}
}

func last(p string) string {
	for i := len(p) - 1; i >= 0; i-- {
		if p[i] == '/' {
			return p[i+1:]
		}
	}
	return p
}
