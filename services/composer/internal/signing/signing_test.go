package signing

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"

	signerv1 "mesh.dev/proto/mesh/signer/v1"
	typev1 "mesh.dev/proto/mesh/type/v1"
)

// recordingSigner is a fake signer client: it "signs" each composition by
// naming, in the item's digest, the epoch of the request that carried it,
// and keeps the epoch and size of each request. Requests wait for gate, so
// the calls made meanwhile queue up and batch.
type recordingSigner struct {
	gate chan struct{}

	mu sync.Mutex
	// entered counts the requests and items that reached the fake.
	entered, enteredItems int
	requests              []request
}

type request struct {
	epoch uint64
	items int
}

func (r *recordingSigner) SignCompositions(_ context.Context, in *signerv1.SignCompositionsRequest, _ ...grpc.CallOption) (*signerv1.SignCompositionsResponse, error) {
	r.mu.Lock()
	r.entered++
	r.enteredItems += len(in.GetCompositions())
	r.mu.Unlock()
	<-r.gate
	r.mu.Lock()
	r.requests = append(r.requests, request{epoch: in.GetFencingEpoch(), items: len(in.GetCompositions())})
	r.mu.Unlock()
	out := &signerv1.SignCompositionsResponse{}
	for _, c := range in.GetCompositions() {
		out.Items = append(out.Items, &signerv1.SignedItem{Digest: fmt.Sprintf("%s@%d", c.GetNode(), in.GetFencingEpoch())})
	}
	return out, nil
}

func (r *recordingSigner) SignManifests(context.Context, *signerv1.SignManifestsRequest, ...grpc.CallOption) (*signerv1.SignManifestsResponse, error) {
	return nil, fmt.Errorf("not used")
}

func (r *recordingSigner) Fence(context.Context, *signerv1.FenceRequest, ...grpc.CallOption) (*signerv1.FenceResponse, error) {
	return nil, fmt.Errorf("not used")
}

func (r *recordingSigner) GetKeyset(context.Context, *signerv1.GetKeysetRequest, ...grpc.CallOption) (*signerv1.GetKeysetResponse, error) {
	return nil, fmt.Errorf("not used")
}

// TestEpochPerCall covers the fencing of DESIGN.md §5.2 step 9 in the
// composer's client: every call is signed under the epoch it asked for —
// the epoch of the tenure its pass started under — and a batch of calls
// made at once never mixes epochs, so a pass that outlived its tenure is
// refused even while a pass of the next tenure signs beside it.
func TestEpochPerCall(t *testing.T) {
	t.Parallel()
	fake := &recordingSigner{gate: make(chan struct{})}
	s := New(fake, nil)
	const calls = 40
	var wg sync.WaitGroup
	errs := make(chan error, calls)
	for i := range calls {
		epoch := uint64(1 + i%2)
		node := fmt.Sprintf("n%02d", i)
		wg.Add(1)
		go func() {
			defer wg.Done()
			out, err := s.SignCompositions(context.Background(), epoch, []*typev1.Composition{{Node: node}})
			if err == nil && out[0].GetDigest() != fmt.Sprintf("%s@%d", node, epoch) {
				err = fmt.Errorf("%s asked for epoch %d, signed as %s", node, epoch, out[0].GetDigest())
			}
			errs <- err
		}()
	}
	// Every slot is taken and the other calls wait in the queue, their
	// epochs interleaved.
	deadline := time.Now().Add(10 * time.Second)
	for {
		s.compositions.mu.Lock()
		queued := 0
		for _, c := range s.compositions.queue {
			queued += len(c.items)
		}
		s.compositions.mu.Unlock()
		fake.mu.Lock()
		entered, items := fake.entered, fake.enteredItems
		fake.mu.Unlock()
		// Every call reached the fake or waits in the queue. A slow start
		// can put them all in fewer requests than there are slots (the
		// later calls batched into the last requests sent): then none is
		// queued.
		if items+queued == calls && (entered == maxInFlight || queued == 0) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d requests (%d items) in flight, %d queued", entered, items, queued)
		}
		time.Sleep(time.Millisecond)
	}
	close(fake.gate)
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
	fake.mu.Lock()
	defer fake.mu.Unlock()
	total, batched := 0, false
	for _, r := range fake.requests {
		total += r.items
		batched = batched || r.items > 1
	}
	if total != calls || !batched {
		t.Errorf("requests %v: want %d items in all, some batched", fake.requests, calls)
	}
}
