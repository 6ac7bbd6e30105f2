package app_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"mesh.dev/internal/natsx"
	composerv1 "mesh.dev/proto/mesh/composer/v1"
	ct "mesh.dev/services/composer/internal/composertest"
)

// settled waits until the composer has no pass queued or running and
// returns the pass counts.
func settled(t testing.TB, w *ct.World, c *ct.Composer) map[string]int {
	t.Helper()
	ct.WaitFor(t, "passes settled", 20*time.Second, func() (bool, string) {
		n := c.Reconciler.Pending()
		return n == 0, fmt.Sprintf("%d pending", n)
	})
	return w.Passes()
}

func delta(before, after map[string]int) map[string]int {
	out := map[string]int{}
	for n, v := range after {
		if d := v - before[n]; d > 0 {
			out[n] = d
		}
	}
	return out
}

// TestReacting covers DESIGN.md §5.2/§6: the composer recomposes exactly
// the nodes a change affects — a registration the nodes placing the module,
// a spec change its node, an approval the nodes placing its module, an
// applied digest its node — and an engine's other attempt changes only
// change its status.
func TestReacting(t *testing.T) {
	t.Parallel()
	w := ct.New(t)
	c := w.StartComposer(t, "one")
	motd1 := w.Release(t, ct.Motd("1.0"), nil)
	sshd1 := w.Release(t, ct.SSHD("1.0", ""), nil)
	for _, n := range []string{"a", "b"} {
		c.PutNode(t, ct.Spec(n, "motd"))
	}
	c.PutNode(t, ct.Spec("c", "sshd"))
	w.Converged(t, "a", map[string]string{"motd": motd1})
	w.Converged(t, "b", map[string]string{"motd": motd1})
	w.Converged(t, "c", map[string]string{"sshd": sshd1})

	steps := []struct {
		name   string
		change func()
		// wait until the change took effect
		done func() bool
		want map[string]bool
	}{
		{"registration", func() { w.Release(t, ct.Motd("2.0"), nil) }, func() bool {
			a, _, _ := w.Assignment(t, "a")
			b, _, _ := w.Assignment(t, "b")
			return ct.Want(a, "motd").GetFingerprint() != motd1 && ct.Want(b, "motd").GetFingerprint() != motd1
		}, map[string]bool{"a": true, "b": true}},
		{"spec", func() {
			s := ct.Spec("c", "sshd")
			s.Labels["rack"] = "r2"
			c.PutNode(t, s)
		}, nil, map[string]bool{"c": true}},
		{"approval", func() {
			_, err := c.Operator(t).Approve(context.Background(), &composerv1.ApproveRequest{Module: "sshd", Digests: []string{"sha256:" + fmt.Sprintf("%064d", 1)}})
			ct.Must(t, err)
		}, nil, map[string]bool{"c": true}},
		{"applied digest", func() {
			a, _, _ := w.Assignment(t, "a")
			applyAll(t, w, a)
		}, nil, map[string]bool{"a": true}},
	}
	for _, step := range steps {
		before := settled(t, w, c)
		step.change()
		ct.WaitFor(t, step.name+" recomposed", 20*time.Second, func() (bool, string) {
			if step.done != nil && !step.done() {
				return false, "not done"
			}
			d := delta(before, w.Passes())
			for n := range step.want {
				if d[n] == 0 {
					return false, fmt.Sprintf("passes %v", d)
				}
			}
			return true, ""
		})
		after := settled(t, w, c)
		for n := range delta(before, after) {
			if !step.want[n] {
				t.Errorf("%s: node %s was recomposed (passes %v)", step.name, n, delta(before, after))
			}
		}
	}

	t.Run("another attempt change: status only", func(t *testing.T) {
		before := settled(t, w, c)
		a, _, _ := w.Assignment(t, "a")
		rec := &composerv1.HaveRecord{}
		_, err := w.Get(t, natsx.BucketHaves, "a", rec)
		ct.Must(t, err)
		rec.ReportSeq++
		for _, h := range rec.GetHaves() {
			if h.GetModule() == "motd" {
				h.Attempt.State = composerv1.AttemptState_ATTEMPT_STATE_HELD
				h.Attempt.ReasonCode = composerv1.ReasonCode_REASON_CODE_ENTRY_ASKED
				h.Attempt.Reason = "entry asked"
			}
		}
		w.Put(t, natsx.BucketHaves, "a", rec)
		ct.WaitFor(t, "status refreshed", 10*time.Second, func() (bool, string) {
			st := &composerv1.NodeStatus{}
			if _, err := w.Get(t, natsx.BucketStatus, "a", st); err != nil {
				return false, err.Error()
			}
			for _, m := range st.GetModules() {
				if m.GetModule() == "motd" && m.GetState() == composerv1.AttemptState_ATTEMPT_STATE_HELD && m.GetReason() == "entry asked" {
					return true, ""
				}
			}
			return false, fmt.Sprintf("status %v", st.GetModules())
		})
		if d := delta(before, settled(t, w, c)); len(d) != 0 {
			t.Errorf("an attempt change recomposed %v", d)
		}
		_ = a
	})
}
