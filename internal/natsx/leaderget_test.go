package natsx

import (
	"errors"
	"testing"

	"github.com/nats-io/nats.go/jetstream"
)

// TestLeaderGet: a message read from the leader by sequence or as a
// subject's last, on a direct-get bucket and on one read from its leader,
// with its subject, data and headers (a delete marker's operation); a
// message not there is ErrMsgNotFound.
func TestLeaderGet(t *testing.T) {
	_, js := serverAndJS(t)
	for _, leader := range []bool{false, true} {
		spec := testSpec(5)
		spec.LeaderReads = leader
		kv := ensureKV(t, js, spec)
		if kv.LeaderReads() != leader {
			t.Fatalf("bucket leader reads %v, want %v", kv.LeaderReads(), leader)
		}
		putValue(t, kv, "a", "1")
		putValue(t, kv, "a", "2")
		if err := kv.Delete(t.Context(), "b"); err != nil {
			t.Fatal(err)
		}
		m, err := kv.leaderGet(t.Context(), 1, "")
		if err != nil || m.Subject != kv.prefix+"a" || string(m.Data) != "1" || m.Sequence != 1 || m.Time.IsZero() {
			t.Errorf("leader %v: seq 1: %+v, %v", leader, m, err)
		}
		m, err = kv.leaderGet(t.Context(), 0, kv.prefix+"a")
		if err != nil || m.Sequence != 2 || string(m.Data) != "2" {
			t.Errorf("leader %v: last of a: %+v, %v", leader, m, err)
		}
		m, err = kv.leaderGet(t.Context(), 0, kv.prefix+"b")
		if err != nil || m.Sequence != 3 || m.Header.Get("KV-Operation") != "DEL" {
			t.Errorf("leader %v: last of b (a delete marker): %+v, %v", leader, m, err)
		}
		if _, err := kv.leaderGet(t.Context(), 99, ""); !errors.Is(err, jetstream.ErrMsgNotFound) {
			t.Errorf("leader %v: seq 99: %v, want not found", leader, err)
		}
		if _, err := kv.leaderGet(t.Context(), 0, kv.prefix+"none"); !errors.Is(err, jetstream.ErrMsgNotFound) {
			t.Errorf("leader %v: last of none: %v, want not found", leader, err)
		}
	}
}
