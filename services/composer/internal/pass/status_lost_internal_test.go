package pass

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"mesh.dev/internal/testutil"
	composerv1 "mesh.dev/proto/mesh/composer/v1"
	"mesh.dev/services/composer/internal/store"
)

// lossyJS stores a status write but loses its reply while drop is set.
type lossyJS struct {
	jetstream.JetStream
	drop *atomic.Bool
}

func (j lossyJS) PublishMsg(ctx context.Context, m *nats.Msg, opts ...jetstream.PublishOpt) (*jetstream.PubAck, error) {
	ack, err := j.JetStream.PublishMsg(ctx, m, opts...)
	if err == nil && j.drop.Load() && strings.Contains(m.Subject, ".status.") {
		return nil, context.DeadlineExceeded
	}
	return ack, err
}

// TestWrittenStatusForgottenOnALostReply: a status write stored whose
// reply was lost leaves nothing kept of the node's status, so the next
// status is compared with what the key holds: a status saying the node's
// pass failed is replaced once it passes again, though the status kept
// from before the failure said the same.
func TestWrittenStatusForgottenOnALostReply(t *testing.T) {
	t.Parallel()
	_, js := testutil.ConnectJetStream(t, testutil.StartJetStream(t))
	ctx := context.Background()
	drop := &atomic.Bool{}
	s, err := store.Open(ctx, lossyJS{js, drop}, 1, time.Minute, nil)
	if err != nil {
		t.Fatal(err)
	}
	p := New(Config{Store: s, Now: time.Now})
	asg := &composerv1.Assignment{ManifestRevision: 1}
	ok := func(*composerv1.NodeStatus) error { return nil }
	failed := func(*composerv1.NodeStatus) error { return errors.New("compose failed") }
	const epoch = 5
	if err := p.putStatus(ctx, "n", asg, nil, 0, epoch, ok); err != nil {
		t.Fatal(err)
	}
	drop.Store(true)
	if err := p.putStatus(ctx, "n", asg, nil, 0, epoch, failed); err == nil {
		t.Fatal("a status write whose reply was lost returned no error")
	}
	drop.Store(false)
	if err := p.putStatus(ctx, "n", asg, nil, 0, epoch, ok); err != nil {
		t.Fatal(err)
	}
	st, _, err := s.NodeStatus(ctx, "n")
	if err != nil {
		t.Fatal(err)
	}
	if st.GetLastError() != "" {
		t.Errorf("status once the pass passed again: last error %q stays", st.GetLastError())
	}
}
