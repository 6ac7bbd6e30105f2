package pass_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"mesh.dev/internal/names"
	"mesh.dev/internal/natsx"
	ct "mesh.dev/services/composer/internal/composertest"
	"mesh.dev/services/composer/internal/pass"
)

// A composition the pass wrote and that is found deleted at the re-read
// (step 5) is not named by an assignment the pass commits (step 7: only
// when every composition the wants name is held): it fails.
func TestDeletedAfterWriteIsNotWanted(t *testing.T) {
	t.Parallel()
	s := newSetup(t)
	v2 := s.w.Release(t, ct.Motd("2.0"), nil)
	ct.WaitFor(t, "v2 seen", 10*time.Second, func() (bool, string) {
		r, _ := s.c.View.Registration("motd")
		return r.GetFingerprint() == v2, "not yet"
	})
	key2 := "ace.motd." + names.FingerprintHex(v2)
	pass.SetHooks(s.c.Passer, pass.Hooks{BeforeReread: func(key string, follow int) {
		if key == key2 && follow == 0 {
			ct.Must(t, s.w.KV(t, natsx.BucketCompositions).Delete(context.Background(), key2))
		}
	}})
	res := s.c.Pass(t, "ace")
	asg, _, err := s.w.Assignment(t, "ace")
	ct.Must(t, err)
	if want := key2 + " was deleted under this writer"; res.Err == nil || !strings.Contains(res.Err.Error(), want) || res.Committed {
		t.Errorf("pass committed %v, error %v; want it failed with %q", res.Committed, res.Err, want)
	}
	if w := ct.Want(asg, "motd"); w.GetCompositionKey() == key2 {
		if _, gerr := s.w.KV(t, natsx.BucketCompositions).Get(context.Background(), key2); gerr != nil {
			t.Errorf("the assignment wants %s, which is not held (%v)", key2, gerr)
		}
	}
}
