package app_test

import (
	"os"
	"syscall"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

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
	}{
		{
			name: "bad signature", module: names.NodeModule, state: stateFailed, code: composerv1.ReasonCode_REASON_CODE_SIGNATURE_INVALID,
			setup: func(t *testing.T, w *world) *typev1.Envelope {
				return w.manifest(manifestOpts{corrupt: true}, nodeComp(file("node", "a", "/etc/app/a", "a")))
			},
		},
		{
			name: "key not in the keyset", module: names.NodeModule, state: stateFailed, code: composerv1.ReasonCode_REASON_CODE_SIGNATURE_INVALID,
			setup: func(t *testing.T, w *world) *typev1.Envelope {
				return w.manifest(manifestOpts{signer: testutil.NewKey(t)}, nodeComp(file("node", "a", "/etc/app/a", "a")))
			},
		},
		{
			name: "keyset not signed by the roots", module: names.NodeModule, state: stateFailed, code: composerv1.ReasonCode_REASON_CODE_KEYSET_INVALID,
			setup: func(t *testing.T, w *world) *typev1.Envelope {
				w.composer.keyset = w.trust.SignKeyset(t, w.trust.Keyset, testutil.NewKey(t))
				return w.manifest(manifestOpts{}, nodeComp(file("node", "a", "/etc/app/a", "a")))
			},
		},
		{
			name: "other node's manifest", module: names.NodeModule, state: stateFailed, code: composerv1.ReasonCode_REASON_CODE_NODE_MISMATCH,
			setup: func(t *testing.T, w *world) *typev1.Envelope {
				return w.manifest(manifestOpts{node: "bob"})
			},
		},
		{
			name: "expired manifest", module: names.NodeModule, state: stateStale, code: composerv1.ReasonCode_REASON_CODE_EXPIRED,
			setup: func(t *testing.T, w *world) *typev1.Envelope {
				now := time.Now()
				return w.manifest(manifestOpts{issued: now.Add(-48 * time.Hour), expires: now.Add(-2 * time.Hour)}, nodeComp(file("node", "a", "/etc/app/a", "a")))
			},
		},
		{
			name: "issued more than 24 h ahead", module: names.NodeModule, state: stateFailed, code: composerv1.ReasonCode_REASON_CODE_FAST_FORWARD,
			setup: func(t *testing.T, w *world) *typev1.Envelope {
				now := time.Now()
				return w.manifest(manifestOpts{issued: now.Add(30 * time.Hour), expires: now.Add(50 * time.Hour)}, nodeComp(file("node", "a", "/etc/app/a", "a")))
			},
		},
		{
			name: "composition digest mismatch", module: names.NodeModule, state: stateFailed, code: composerv1.ReasonCode_REASON_CODE_DIGEST_MISMATCH,
			setup: func(t *testing.T, w *world) *typev1.Envelope {
				c := nodeComp(file("node", "a", "/etc/app/a", "a"))
				c.digest = names.Digest([]byte("something else"))
				return w.manifest(manifestOpts{}, c)
			},
		},
		{
			name: "composition signed by a key not in the keyset", module: names.NodeModule, state: stateFailed, code: composerv1.ReasonCode_REASON_CODE_SIGNATURE_INVALID,
			setup: func(t *testing.T, w *world) *typev1.Envelope {
				c := nodeComp(file("node", "a", "/etc/app/a", "a"))
				c.signer = testutil.NewKey(t)
				return w.manifest(manifestOpts{}, c)
			},
		},
		{
			name: "object over its declared size", module: names.NodeModule, state: stateFailed, code: composerv1.ReasonCode_REASON_CODE_SIZE_EXCEEDED,
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
			setup: func(t *testing.T, w *world) *typev1.Envelope {
				return w.manifest(manifestOpts{}, nodeComp(file("node", "a", "/etc/app/../../etc/shadow", "x")))
			},
		},
		{
			name: "relative symlink target escaping", module: names.NodeModule, state: stateFailed, code: composerv1.ReasonCode_REASON_CODE_PATH_ESCAPE,
			setup: func(t *testing.T, w *world) *typev1.Envelope {
				l := &typev1.Resource{Id: "node:l", Type: typev1.ResourceType_RESOURCE_TYPE_SYMLINK, Path: "/etc/app/l", Target: "../../etc/shadow"}
				return w.manifest(manifestOpts{}, nodeComp(l))
			},
		},
		{
			name: "absolute symlink escape", module: names.NodeModule, state: stateFailed, code: composerv1.ReasonCode_REASON_CODE_PATH_THROUGH_SYMLINK,
			setup: func(t *testing.T, w *world) *typev1.Envelope {
				mustSymlink(t, "/", w.path("/etc/app/sys"))
				return w.manifest(manifestOpts{}, nodeComp(file("node", "a", "/etc/app/sys/passwd", "x")))
			},
		},
		{
			name: "path outside the prefixes", module: names.NodeModule, state: stateFailed, code: composerv1.ReasonCode_REASON_CODE_PATH_OUTSIDE_PREFIXES,
			setup: func(t *testing.T, w *world) *typev1.Envelope {
				return w.manifest(manifestOpts{}, nodeComp(file("node", "a", "/usr/bin/sudo", "x")))
			},
		},
		{
			name: "symlink target outside the prefixes", module: names.NodeModule, state: stateFailed, code: composerv1.ReasonCode_REASON_CODE_PATH_OUTSIDE_PREFIXES,
			setup: func(t *testing.T, w *world) *typev1.Envelope {
				l := &typev1.Resource{Id: "node:l", Type: typev1.ResourceType_RESOURCE_TYPE_SYMLINK, Path: "/etc/app/l", Target: "/etc/shadow"}
				return w.manifest(manifestOpts{}, nodeComp(l))
			},
		},
		{
			name: "special file", module: names.NodeModule, state: stateFailed, code: composerv1.ReasonCode_REASON_CODE_SPECIAL_FILE,
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
			before := tree(t, w.root)
			r := w.start(t)
			w.composer.push(&composerv1.SyncResponse{Msg: &composerv1.SyncResponse_Manifest{Manifest: env}})
			a := r.waitAttempt(t, tt.module, tt.state, tt.code)
			if a.GetReason() == "" {
				t.Error("no reason given")
			}
			t.Logf("reason: %s", a.GetReason())
			// One more pass, so a late write would show.
			r.eng.Engine.Pass(t.Context())
			after := tree(t, w.root)
			for p, v := range after {
				if before[p] != v && !(v == "dir 755" && isPrefixDir(p)) {
					t.Errorf("written to the root: %s: %s (was %q)", p, v, before[p])
				}
			}
			if s := r.status(t); s.GetApplied() != nil && tt.code != composerv1.ReasonCode_REASON_CODE_PATH_CONFLICT {
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

// isPrefixDir reports whether a root-relative path is an allowed prefix or
// one of its parents, which the engine creates at start.
func isPrefixDir(rel string) bool {
	for _, p := range prefixes {
		if p == "/"+rel || len(p) > len(rel)+1 && p[:len(rel)+2] == "/"+rel+"/" || rel == "." {
			return true
		}
	}
	return false
}

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

var _ = timestamppb.Now
