// Package canonical produces the canonical bytes of DESIGN.md §2: the exact
// bytes compositions, manifests, keysets and catalog manifests travel and are
// stored as, and over which digests and signatures are taken. It is the only
// producer of such bytes; readers decode them and never re-encode to verify.
package canonical

import (
	"fmt"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

var options = proto.MarshalOptions{Deterministic: true}

// Marshal returns the canonical bytes of m: deterministic protobuf (map keys
// sorted, fields in number order). A message holding fields this build does
// not know is refused: no check here saw them, and a reader refuses them
// (Decode), so bytes signed over them could only fail or carry meaning
// nothing checked.
func Marshal(m proto.Message) ([]byte, error) {
	if hasUnknown(m.ProtoReflect()) {
		return nil, fmt.Errorf("canonical bytes of %s: it holds fields this build does not know", m.ProtoReflect().Descriptor().FullName())
	}
	b, err := options.Marshal(m)
	if err != nil {
		return nil, fmt.Errorf("canonical bytes of %s: %w", m.ProtoReflect().Descriptor().FullName(), err)
	}
	return b, nil
}

// Size returns the length Marshal would return.
func Size(m proto.Message) int { return options.Size(m) }

// Decode parses canonical bytes into m, refusing unknown fields: a payload
// holding fields this build does not know could carry meaning the verifier
// cannot see, so it is not accepted as signed content.
func Decode(b []byte, m proto.Message) error {
	if err := (proto.UnmarshalOptions{DiscardUnknown: false}).Unmarshal(b, m); err != nil {
		return fmt.Errorf("decode %s: %w", m.ProtoReflect().Descriptor().FullName(), err)
	}
	if hasUnknown(m.ProtoReflect()) {
		return fmt.Errorf("decode %s: the bytes hold fields this build does not know", m.ProtoReflect().Descriptor().FullName())
	}
	return nil
}

// hasUnknown reports whether m or any message inside it holds unknown fields.
func hasUnknown(m protoreflect.Message) bool {
	if len(m.GetUnknown()) > 0 {
		return true
	}
	found := false
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		switch {
		case fd.IsList() && fd.Message() != nil:
			l := v.List()
			for i := 0; i < l.Len() && !found; i++ {
				found = hasUnknown(l.Get(i).Message())
			}
		case fd.IsMap() && fd.MapValue().Message() != nil:
			v.Map().Range(func(_ protoreflect.MapKey, mv protoreflect.Value) bool {
				found = hasUnknown(mv.Message())
				return !found
			})
		case !fd.IsList() && !fd.IsMap() && fd.Message() != nil:
			found = hasUnknown(v.Message())
		}
		return !found
	})
	return found
}
