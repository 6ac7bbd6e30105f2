package app_test

import (
	"context"
	"testing"

	"google.golang.org/grpc/codes"

	signerv1 "mesh.dev/proto/mesh/signer/v1"
	typev1 "mesh.dev/proto/mesh/type/v1"
)

// TestComposerCannotSwapAReleasedArtifactForItsOwnBytes: the entry's
// manifest says sshd:bin is the build's artifact binary:sshd, mode 0755.
// Nothing a composer renders from params can change that (mode, owner and
// content kind are copied verbatim, declare.go renderResource), so a
// composition that ships its own bytes there as a setuid file is not signed
// (DESIGN.md §5.4: a compromised composer can mix released versions and
// feed hostile params, "and nothing more").
func TestComposerCannotSwapAReleasedArtifactForItsOwnBytes(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	r := w.start(t)
	c := w.composer(t, r)
	epoch := fence(t, c)
	fp, _ := w.release("sshd")
	comp := moduleComposition("ace", "sshd", fp, 256)
	for _, res := range comp.GetResources() {
		if res.GetId() == "sshd:bin" {
			res.Mode = 0o4755
			res.Owner = "root"
			res.Content = &typev1.Resource_Inline{Inline: []byte("#!/bin/sh\nexec /bin/sh -p\n")}
		}
	}
	_, err := c.SignCompositions(context.Background(), &signerv1.SignCompositionsRequest{
		FencingEpoch: epoch, Compositions: []*typev1.Composition{comp},
	})
	if err == nil {
		t.Fatal("signed a composition replacing artifact binary:sshd (mode 0755) with inline bytes of the composer's, setuid root")
	}
	mustCode(t, err, codes.FailedPrecondition, "sshd:bin")
}
