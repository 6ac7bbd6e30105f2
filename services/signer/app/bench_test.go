package app_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	"mesh.dev/internal/identity"
	"mesh.dev/internal/testutil"
	signerv1 "mesh.dev/proto/mesh/signer/v1"
	typev1 "mesh.dev/proto/mesh/type/v1"
)

// BenchmarkSignCompositions measures signatures/s of SignCompositions through
// gRPC over mTLS (batches of 100 typical compositions, 3 KiB on average) and, in the same run,
// of the same typed operation in process: decode the request, lint, the
// catalog cross-check (cached), canonical bytes, hashes, signatures and the
// batch's two fsynced audit records. The ratio is the gRPC cost.
func BenchmarkSignCompositions(b *testing.B) {
	w := newWorld(b)
	r := w.start(b)
	conn := testutil.Dial(b, w.pki, r.addr, w.pki.Identity(identity.RoleComposer, ""))
	c := signerv1.NewSignerServiceClient(conn)
	epoch := fence(b, c)
	var comps []*typev1.Composition
	modules := []string{"sshd", "motd", "ntp", "users", "exporter"}
	fps := map[string]string{}
	for _, m := range modules {
		fps[m], _ = w.release(m)
	}
	// Typical module compositions: a few small config files, 512 B to 8 KiB
	// of content, 3 KiB on average (content over 64 KiB moves to objects).
	sizes := []int{512, 1024, 2048, 4096, 8192}
	for i := 0; i < 100; i++ {
		m := modules[i%len(modules)]
		comps = append(comps, moduleComposition(fmt.Sprintf("node-%03d", i), m, fps[m], sizes[(i/len(modules))%len(sizes)]))
	}
	req := &signerv1.SignCompositionsRequest{FencingEpoch: epoch, Compositions: comps}
	raw, err := proto.Marshal(req)
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	// Warm the cross-check cache and the connection, and check a response.
	resp, err := c.SignCompositions(ctx, req)
	if err != nil {
		b.Fatal(err)
	}
	if len(resp.GetItems()) != len(comps) || len(resp.GetItems()[0].GetEnvelope().GetSignatures()) != 1 {
		b.Fatalf("response %d items", len(resp.GetItems()))
	}

	// The two run in alternating rounds so both see the same disk: the audit
	// records' fsyncs are a large part of a batch and their latency drifts
	// during a run. Each round runs `concurrency` batches at once, as a
	// composer does when it signs for many nodes.
	const concurrency = 4
	round := func(sign func() error) time.Duration {
		start := time.Now()
		var g errgroup.Group
		for j := 0; j < concurrency; j++ {
			g.Go(sign)
		}
		if err := g.Wait(); err != nil {
			b.Fatal(err)
		}
		return time.Since(start)
	}
	inProcessOp := func() error {
		decoded := &signerv1.SignCompositionsRequest{}
		if err := proto.Unmarshal(raw, decoded); err != nil {
			return err
		}
		_, err := r.signer.Service.SignCompositions(ctx, decoded)
		return err
	}
	// The load generator shares this machine's two cores with the signer,
	// so it sends the request pre-encoded and does not decode the response:
	// the figure is then the signer's cost through gRPC and mTLS, not the
	// client's. One response is decoded and checked above.
	grpcOp := func() error {
		var resp []byte
		return conn.Invoke(ctx, signerv1.SignerService_SignCompositions_FullMethodName, &raw, &resp, grpc.ForceCodec(rawCodec{}))
	}
	var inProcessTime, grpcTime time.Duration
	// Each round's ratio is kept too: the median of paired rounds is not
	// moved by a burst of other load landing on one side only.
	ratios := make([]float64, 0, b.N)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		ip, gr := round(inProcessOp), round(grpcOp)
		inProcessTime += ip
		grpcTime += gr
		ratios = append(ratios, ip.Seconds()/gr.Seconds())
	}
	inProcess := float64(b.N*concurrency*len(comps)) / inProcessTime.Seconds()
	viaGRPC := float64(b.N*concurrency*len(comps)) / grpcTime.Seconds()
	b.StopTimer()
	b.ReportMetric(viaGRPC, "grpc-sigs/s")
	b.ReportMetric(inProcess, "inprocess-sigs/s")
	b.ReportMetric(viaGRPC/inProcess, "grpc/inprocess")
	slices.Sort(ratios)
	b.ReportMetric(ratios[len(ratios)/2], "median-round-ratio")
	b.ReportMetric(0, "ns/op")
}

// rawCodec passes pre-encoded protobuf bytes through gRPC unchanged; its name
// is "proto" so the server decodes the request with its own proto codec.
type rawCodec struct{}

func (rawCodec) Marshal(v any) ([]byte, error) { return *(v.(*[]byte)), nil }

func (rawCodec) Unmarshal(data []byte, v any) error {
	*(v.(*[]byte)) = data[:len(data):len(data)]
	return nil
}

func (rawCodec) Name() string { return "proto" }
