package app_test

import (
	"strings"
	"testing"
	"time"

	"mesh.dev/internal/lint"
	"mesh.dev/internal/names"
	"mesh.dev/internal/testutil"
	"mesh.dev/internal/verify"
	typev1 "mesh.dev/proto/mesh/type/v1"
)

// BenchmarkVerifyComposition measures the engine's verify cost per 12 KB
// composition: digest, signature, decode, node/module/fingerprint against
// the want, and lint (target ≤ 250 µs).
func BenchmarkVerifyComposition(b *testing.B) {
	tr := testutil.NewTrust(b, 1, 1)
	ring, err := verify.Keyset(tr.Roots, tr.KeysetEnvelope)
	if err != nil {
		b.Fatal(err)
	}
	fp := names.FingerprintFromHex(strings.Repeat("a1", 32))
	var rs []*typev1.Resource
	for i := 0; i < 24; i++ {
		rs = append(rs, &typev1.Resource{Id: "web:f" + string(rune('a'+i)), Module: "web", Type: typev1.ResourceType_RESOURCE_TYPE_FILE,
			Path: "/etc/web/f" + string(rune('a'+i)), Mode: 0o644, Owner: "root", Group: "root",
			Content: &typev1.Resource_Inline{Inline: []byte(strings.Repeat("x", 480))}})
	}
	c := &typev1.Composition{Node: node, Module: "web", Fingerprint: fp, Resources: rs}
	env, digest := tr.Sign(b, typev1.PayloadType_PAYLOAD_TYPE_COMPOSITION, c)
	key, _ := names.CompositionKey(node, "web", fp)
	want := &typev1.Want{Module: "web", Fingerprint: fp, CompositionKey: key, CompositionDigest: digest}
	now := time.Now()
	b.SetBytes(int64(len(env.GetPayload())))
	b.ResetTimer()
	for b.Loop() {
		got, err := ring.Composition(env, node, want, now)
		if err != nil {
			b.Fatal(err)
		}
		if err := lint.CheckComposition(got); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	per := b.Elapsed() / time.Duration(b.N)
	b.ReportMetric(float64(per.Microseconds()), "µs/composition")
	b.Logf("verify cost per %d-byte composition: %s (target ≤ 250µs)", len(env.GetPayload()), per)
}
