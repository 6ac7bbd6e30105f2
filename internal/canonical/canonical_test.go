package canonical

import (
	"bytes"
	"strings"
	"testing"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/types/known/structpb"

	composerv1 "mesh.dev/proto/mesh/composer/v1"
	typev1 "mesh.dev/proto/mesh/type/v1"
)

func TestMarshalIsDeterministic(t *testing.T) {
	t.Parallel()
	labels := map[string]string{}
	for _, k := range []string{"zone", "role", "rack", "env", "tier", "os", "arch", "team"} {
		labels[k] = k + "-v"
	}
	spec := &composerv1.NodeSpec{Node: "ace", Labels: labels}
	first, err := Marshal(spec)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 50; i++ {
		copyLabels := map[string]string{}
		for k, v := range labels {
			copyLabels[k] = v
		}
		again, err := Marshal(&composerv1.NodeSpec{Node: "ace", Labels: copyLabels})
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(first, again) {
			t.Fatalf("run %d: map order changed the canonical bytes", i)
		}
	}
	if Size(spec) != len(first) {
		t.Errorf("Size = %d, len(Marshal) = %d", Size(spec), len(first))
	}
}

func TestDecodeRefusesUnknownFields(t *testing.T) {
	t.Parallel()
	c := &typev1.Composition{Node: "ace", Module: "sshd", Resources: []*typev1.Resource{{Id: "sshd:a", Path: "/a"}}}
	good, err := Marshal(c)
	if err != nil {
		t.Fatal(err)
	}
	var out typev1.Composition
	if err := Decode(good, &out); err != nil || out.GetNode() != "ace" {
		t.Fatalf("Decode(good) = %v, %v", &out, err)
	}

	topLevel := protowire.AppendTag(append([]byte(nil), good...), 99, protowire.VarintType)
	topLevel = protowire.AppendVarint(topLevel, 1)

	// An unknown field inside a nested resource.
	res, _ := Marshal(&typev1.Resource{Id: "sshd:a", Path: "/a"})
	res = protowire.AppendTag(res, 77, protowire.BytesType)
	res = protowire.AppendBytes(res, []byte("x"))
	nested := protowire.AppendTag(nil, 1, protowire.BytesType)
	nested = protowire.AppendString(nested, "ace")
	nested = protowire.AppendTag(nested, 4, protowire.BytesType)
	nested = protowire.AppendBytes(nested, res)

	for name, b := range map[string][]byte{"top level": topLevel, "nested": nested} {
		var m typev1.Composition
		err := Decode(b, &m)
		if err == nil || !strings.Contains(err.Error(), "does not know") {
			t.Errorf("%s: Decode = %v, want refusal of unknown fields", name, err)
		}
	}
	var m typev1.Composition
	if err := Decode([]byte{0xff, 0xff}, &m); err == nil {
		t.Error("Decode accepted garbage")
	}
}

func TestDecodeUnknownInsideStruct(t *testing.T) {
	t.Parallel()
	params, _ := structpb.NewStruct(map[string]any{"port": 22.0})
	b, err := Marshal(&composerv1.PlacedModule{Module: "sshd", Params: params})
	if err != nil {
		t.Fatal(err)
	}
	var out composerv1.PlacedModule
	if err := Decode(b, &out); err != nil {
		t.Fatalf("Decode of a message with a map of messages: %v", err)
	}
}
