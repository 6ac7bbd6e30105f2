package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"mesh.dev/internal/keyfile"
	"mesh.dev/internal/names"
	"mesh.dev/internal/testutil"
	typev1 "mesh.dev/proto/mesh/type/v1"
)

func TestVerify(t *testing.T) {
	dir := t.TempDir()
	tr := testutil.NewTrust(t, 1, 1)
	write := func(name string, m proto.Message) string {
		p := filepath.Join(dir, name)
		if err := keyfile.WriteJSON(p, m, 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	fp := names.FingerprintPrefix + strings.Repeat("ab", 32)
	comp := &typev1.Composition{Node: "ace", Module: "motd", Fingerprint: fp, Resources: []*typev1.Resource{
		{Id: "motd:motd", Module: "motd", Type: typev1.ResourceType_RESOURCE_TYPE_FILE, Path: "/etc/motd", Content: &typev1.Resource_Inline{Inline: []byte("hi\n")}}}}
	cenv, cdigest := tr.Sign(t, typev1.PayloadType_PAYLOAD_TYPE_COMPOSITION, comp)
	now := time.Now()
	m := &typev1.Manifest{Node: "ace", Revision: 7, IssuedAt: timestamppb.New(now), ExpiresAt: timestamppb.New(now.Add(time.Hour)), KeysetVersion: 1,
		Wants: []*typev1.Want{{Module: "motd", Fingerprint: fp, CompositionKey: "ace.motd." + names.FingerprintHex(fp), CompositionDigest: cdigest}}}
	menv, _ := tr.Sign(t, typev1.PayloadType_PAYLOAD_TYPE_MANIFEST, m)
	roots, keyset := write("roots.json", tr.Roots), write("keyset.json", tr.KeysetEnvelope)
	manifest, composition := write("manifest.json", menv), write("composition.json", cenv)
	// A composition as grpcurl prints GetComposition: wrapped.
	wrapped := filepath.Join(dir, "wrapped.json")
	inner, _ := protojson.Marshal(cenv)
	os.WriteFile(wrapped, []byte(`{"composition": `+string(inner)+`, "digest": "`+cdigest+`"}`), 0o644)
	tampered := proto.Clone(cenv).(*typev1.Envelope)
	tampered.Payload[len(tampered.Payload)-2] ^= 1
	bad := write("tampered.json", tampered)

	run := func(args ...string) (string, error) {
		root := newRootCmd()
		var out bytes.Buffer
		root.SetOut(&out)
		root.SetArgs(append([]string{"verify", "--roots", roots}, args...))
		err := root.Execute()
		return out.String(), err
	}
	out, err := run("--keyset", keyset, "--manifest", manifest, keyset, manifest, composition, wrapped)
	if err != nil {
		t.Fatalf("verify: %v\n%s", err, out)
	}
	for _, want := range []string{"keyset version 1", "manifest of ace, revision 7", "composition ace.motd."} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	out, err = run("--keyset", keyset, "--manifest", manifest, bad)
	if err == nil || !strings.Contains(out, "FAIL") {
		t.Fatalf("a tampered composition verified:\n%s", out)
	}
	if _, err := run(composition); err == nil {
		t.Fatal("a composition verified without keyset and manifest")
	}
}
