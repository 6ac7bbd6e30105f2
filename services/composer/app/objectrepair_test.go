package app_test

import (
	"bytes"
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"

	"mesh.dev/internal/lint"
	"mesh.dev/internal/names"
	"mesh.dev/internal/natsx"
	composerv1 "mesh.dev/proto/mesh/composer/v1"
	typev1 "mesh.dev/proto/mesh/type/v1"
	ct "mesh.dev/services/composer/internal/composertest"
)

// TestCorruptObjectPutAgain: other bytes are stored under an object's name
// (its digest). The composer puts the object again when an engine reports
// the composition naming it refused for its content — longer than declared
// (SIZE_EXCEEDED) or another digest (DIGEST_MISMATCH), signing the
// manifest again so the engine tries again at once — and when it writes a
// composition naming it; it does not hash every object at every pass. An
// object whose chunks were lost under its description (its bytes never
// come: FETCH_FAILED) is put again the same way.
func TestCorruptObjectPutAgain(t *testing.T) {
	t.Parallel()
	big := fill(lint.MaxInlineContent+1, 'b')
	cases := []struct {
		name  string
		code  composerv1.ReasonCode
		bytes []byte // nil: the object's chunks are lost instead
	}{
		{"longer than declared", composerv1.ReasonCode_REASON_CODE_SIZE_EXCEEDED, bytes.Repeat([]byte("not the bytes of the digest "), 3000)},
		{"other bytes of the same size", composerv1.ReasonCode_REASON_CODE_DIGEST_MISMATCH, fill(len(big), 'x')},
		{"chunks lost", composerv1.ReasonCode_REASON_CODE_FETCH_FAILED, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			w := ct.New(t)
			c := w.StartComposer(t, "one")
			spec := ct.Spec("a")
			spec.Resources = []*typev1.Resource{inline("local:big", "/etc/big", big)}
			c.PutNode(t, spec)
			a := w.Converged(t, "a", map[string]string{})
			own := ct.Want(a, names.NodeModule)
			digest := names.Digest(big)
			corrupt(t, w, digest, tc.bytes)

			// The engine refuses the content and says so.
			rec := &composerv1.HaveRecord{Node: "a", ReportSeq: uint64(time.Now().UnixNano()),
				Applied: &composerv1.ManifestRef{Revision: a.GetManifestRevision(), Digest: a.GetManifestDigest()}, HighWater: a.GetManifestRevision(),
				Haves: []*composerv1.Have{{Module: names.NodeModule, Attempt: &composerv1.Attempt{Key: own.GetCompositionKey(), Digest: own.GetCompositionDigest(),
					State: composerv1.AttemptState_ATTEMPT_STATE_FAILED, ReasonCode: tc.code, Reason: "local:big: object " + digest + " refused"}}}}
			w.Put(t, natsx.BucketHaves, "a", rec)
			objectRepaired(t, w, digest, big)
			// Signed again, so the engine tries again at once.
			repaired(t, w, "a", map[string]string{}, a.GetManifestRevision())

			if tc.bytes == nil {
				// Chunks lost under a version of the object the composer
				// verified are found through the engines' reports, as
				// above; a composition written naming it trusts the
				// verified version.
				return
			}
			// A composition written naming it checks it too.
			corrupt(t, w, digest, tc.bytes)
			other := proto.Clone(spec).(*composerv1.NodeSpec)
			other.Node = "b"
			c.PutNode(t, other)
			w.Converged(t, "b", map[string]string{})
			objectRepaired(t, w, digest, big)
		})
	}
}

// corrupt stores other bytes under an object's name, past the composer;
// with b nil it purges the object's chunks and leaves its description (what
// a put a crash cut short leaves).
func corrupt(t testing.TB, w *ct.World, digest string, b []byte) {
	t.Helper()
	ctx := context.Background()
	st, err := w.JS.ObjectStore(ctx, natsx.ObjectStoreObjects)
	ct.Must(t, err)
	if b != nil {
		_, err = st.PutBytes(ctx, digest, b)
		ct.Must(t, err)
		return
	}
	info, err := st.GetInfo(ctx, digest)
	ct.Must(t, err)
	stream, err := w.JS.Stream(ctx, "OBJ_"+natsx.ObjectStoreObjects)
	ct.Must(t, err)
	ct.Must(t, stream.Purge(ctx, jetstream.WithPurgeSubject(fmt.Sprintf("$O.%s.C.%s", natsx.ObjectStoreObjects, info.NUID))))
}

func objectRepaired(t testing.TB, w *ct.World, digest string, want []byte) {
	t.Helper()
	st, err := w.JS.ObjectStore(context.Background(), natsx.ObjectStoreObjects)
	ct.Must(t, err)
	ct.WaitFor(t, "object "+digest+" put again", 30*time.Second, func() (bool, string) {
		b, err := st.GetBytes(context.Background(), digest)
		if err != nil {
			return false, err.Error()
		}
		return bytes.Equal(b, want), fmt.Sprintf("%d other bytes", len(b))
	})
}
