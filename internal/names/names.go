// Package names holds the names and byte formats of DESIGN.md §2: node and
// module names, fingerprints, digests, composition keys and resource ids.
// Every part of mesh parses and formats them here, so there is one answer to
// "is this a fingerprint" and one way to build a key.
package names

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
)

// NodeModule is the reserved module name of a node's own composition.
const NodeModule = "node"

const (
	// FingerprintPrefix starts every fingerprint.
	FingerprintPrefix = "fp1:"
	// DigestPrefix starts every digest.
	DigestPrefix = "sha256:"
	hexLen       = 64
	maxLabelLen  = 63
)

// ErrInvalid matches (errors.Is) every validation error of this package.
var ErrInvalid = errors.New("invalid")

// invalidError is a validation error whose message names the field and what
// is wrong, without a prefix, so callers can pass it on as it is.
type invalidError struct{ msg string }

func (e *invalidError) Error() string        { return e.msg }
func (e *invalidError) Is(target error) bool { return target == ErrInvalid }

func invalidf(format string, args ...any) error {
	return &invalidError{msg: fmt.Sprintf(format, args...)}
}

// ValidLabel reports whether s is a DNS label:
// [a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?.
func ValidLabel(s string) bool {
	if len(s) == 0 || len(s) > maxLabelLen {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= 'a' && c <= 'z', c >= '0' && c <= '9':
		case c == '-' && i != 0 && i != len(s)-1:
		default:
			return false
		}
	}
	return true
}

// CheckNode returns an error naming what is wrong with a node name.
func CheckNode(s string) error {
	if !ValidLabel(s) {
		return invalidf("node %q is not a DNS label ([a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)", s)
	}
	return nil
}

// CheckModule returns an error naming what is wrong with a module name; the
// name "node" is reserved for a node's own composition.
func CheckModule(s string) error {
	if !ValidLabel(s) {
		return invalidf("module %q is not a DNS label ([a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)", s)
	}
	if s == NodeModule {
		return invalidf("module name %q is reserved", s)
	}
	return nil
}

func isLowerHex(s string) bool {
	if len(s) != hexLen {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}

// HasFingerprint reports whether s is a fingerprint: "fp1:" + 64 lowercase
// hex. It is the one function that decides whether a module "has a
// fingerprint" (DESIGN.md §2); anything else counts as none.
func HasFingerprint(s string) bool {
	return strings.HasPrefix(s, FingerprintPrefix) && isLowerHex(s[len(FingerprintPrefix):])
}

// CheckFingerprint returns an error naming the field when s is not a
// fingerprint.
func CheckFingerprint(field, s string) error {
	if !HasFingerprint(s) {
		return invalidf("%s %q is not a fingerprint (fp1: + 64 lowercase hex)", field, s)
	}
	return nil
}

// FingerprintHex returns the 64 hex digits of a fingerprint, or "" when s is
// not one.
func FingerprintHex(s string) string {
	if !HasFingerprint(s) {
		return ""
	}
	return s[len(FingerprintPrefix):]
}

// FingerprintFromHex returns the fingerprint of 64 lowercase hex digits, or
// "" when h is not that.
func FingerprintFromHex(h string) string {
	if !isLowerHex(h) {
		return ""
	}
	return FingerprintPrefix + h
}

// ValidDigest reports whether s is "sha256:" + 64 lowercase hex.
func ValidDigest(s string) bool {
	return strings.HasPrefix(s, DigestPrefix) && isLowerHex(s[len(DigestPrefix):])
}

// CheckDigest returns an error naming the field when s is not a digest.
func CheckDigest(field, s string) error {
	if !ValidDigest(s) {
		return invalidf("%s %q is not a digest (sha256: + 64 lowercase hex)", field, s)
	}
	return nil
}

// Digest returns the digest of exact bytes.
func Digest(b []byte) string {
	sum := sha256.Sum256(b)
	return DigestOfSum(sum[:])
}

// DigestOfSum formats a sha256 sum as a digest.
func DigestOfSum(sum []byte) string {
	return DigestPrefix + hex.EncodeToString(sum)
}

// DigestBytes returns the 32 bytes of a digest.
func DigestBytes(s string) ([]byte, error) {
	if !ValidDigest(s) {
		return nil, invalidf("%q is not a digest", s)
	}
	return hex.DecodeString(s[len(DigestPrefix):])
}

// lengthPrefixed appends each field as an 8-byte big-endian length followed
// by its bytes, so no two different field lists hash alike.
func lengthPrefixed(fields ...[]byte) []byte {
	n := 0
	for _, f := range fields {
		n += 8 + len(f)
	}
	out := make([]byte, 0, n)
	for _, f := range fields {
		out = binary.BigEndian.AppendUint64(out, uint64(len(f)))
		out = append(out, f...)
	}
	return out
}

// ComputeFingerprint returns the fingerprint of a module source snapshot:
// "fp1:" + hex(sha256(len-prefixed module ‖ repository ‖ path ‖ source digest
// ‖ manifest digest)) (DESIGN.md §3). The commit is not part of it, so a commit
// that leaves the module unchanged leaves its fingerprint unchanged.
func ComputeFingerprint(module, repository, path, sourceDigest, manifestDigest string) string {
	sum := sha256.Sum256(lengthPrefixed([]byte(module), []byte(repository), []byte(path), []byte(sourceDigest), []byte(manifestDigest)))
	return FingerprintPrefix + hex.EncodeToString(sum[:])
}

// SourceFile is one file of a module's source: its path relative to the
// module directory (slash-separated), its mode bits and its content digest.
type SourceFile struct {
	Path   string
	Mode   uint32
	Digest string
}

// ComputeSourceDigest returns the digest over a module's files: sorted by
// path, each len-prefixed path ‖ mode ‖ content digest (DESIGN.md §3). The
// files must be sorted by path and unique; an unsorted list is an error so
// two callers never disagree about order.
func ComputeSourceDigest(files []SourceFile) (string, error) {
	h := sha256.New()
	var mode [4]byte
	for i, f := range files {
		if i > 0 && files[i-1].Path >= f.Path {
			return "", invalidf("source files are not sorted and unique at %q", f.Path)
		}
		if !ValidDigest(f.Digest) {
			return "", invalidf("source file %q has digest %q", f.Path, f.Digest)
		}
		binary.BigEndian.PutUint32(mode[:], f.Mode)
		h.Write(lengthPrefixed([]byte(f.Path), mode[:], []byte(f.Digest)))
	}
	return DigestOfSum(h.Sum(nil)), nil
}

// Key is a parsed composition key.
type Key struct {
	Node string
	// Module is "node" for the node's own composition.
	Module string
	// Fingerprint is empty for the node's own composition.
	Fingerprint string
}

// String returns the key: "<node>.<module>.<fp hex>" or "<node>.node".
func (k Key) String() string {
	if k.Module == NodeModule {
		return k.Node + "." + NodeModule
	}
	return k.Node + "." + k.Module + "." + FingerprintHex(k.Fingerprint)
}

// IsNodeOwn reports whether the key names a node's own composition.
func (k Key) IsNodeOwn() bool { return k.Module == NodeModule }

// CompositionKey builds the key of a module's composition at a fingerprint,
// or of the node's own composition when module is "node" (fingerprint then
// ignored). It is the one builder of composition keys.
func CompositionKey(node, module, fingerprint string) (string, error) {
	if err := CheckNode(node); err != nil {
		return "", err
	}
	if module == NodeModule {
		return Key{Node: node, Module: NodeModule}.String(), nil
	}
	if err := CheckModule(module); err != nil {
		return "", err
	}
	if err := CheckFingerprint("fingerprint", fingerprint); err != nil {
		return "", err
	}
	return Key{Node: node, Module: module, Fingerprint: fingerprint}.String(), nil
}

// NodeKey returns "<node>.node".
func NodeKey(node string) string { return node + "." + NodeModule }

// ParseCompositionKey parses a composition key; it is the one parser.
func ParseCompositionKey(key string) (Key, error) {
	parts := strings.Split(key, ".")
	switch len(parts) {
	case 2:
		if parts[1] != NodeModule {
			return Key{}, invalidf("composition key %q: a two-part key must end in .node", key)
		}
		if err := CheckNode(parts[0]); err != nil {
			return Key{}, fmt.Errorf("composition key %q: %w", key, err)
		}
		return Key{Node: parts[0], Module: NodeModule}, nil
	case 3:
		if err := CheckNode(parts[0]); err != nil {
			return Key{}, fmt.Errorf("composition key %q: %w", key, err)
		}
		if err := CheckModule(parts[1]); err != nil {
			return Key{}, fmt.Errorf("composition key %q: %w", key, err)
		}
		fp := FingerprintFromHex(parts[2])
		if fp == "" {
			return Key{}, invalidf("composition key %q: %q is not 64 lowercase hex", key, parts[2])
		}
		return Key{Node: parts[0], Module: parts[1], Fingerprint: fp}, nil
	default:
		return Key{}, invalidf("composition key %q is neither <node>.<module>.<fp hex> nor <node>.node", key)
	}
}

// ResourceID returns "<module>:<name>".
func ResourceID(module, name string) string { return module + ":" + name }

// ModuleOfID returns the module part of a resource id "<module>:<name>"; it
// keeps naming the owner after the resource's module field is cleared
// (DESIGN.md §5.1). An id without ":" has no module and returns "".
func ModuleOfID(id string) string {
	m, _, ok := strings.Cut(id, ":")
	if !ok {
		return ""
	}
	return m
}

// CheckResourceID returns an error naming what is wrong with a resource id:
// "<module>:<name>" with a module label and a non-empty name of printable
// characters without spaces or colons.
func CheckResourceID(id string) error {
	m, name, ok := strings.Cut(id, ":")
	if !ok {
		return invalidf("resource id %q is not <module>:<name>", id)
	}
	if !ValidLabel(m) {
		return invalidf("resource id %q: module part %q is not a DNS label", id, m)
	}
	return CheckResourceName(name)
}

// CheckResourceName returns an error when a resource name (the part after
// "<module>:") is empty, too long or holds spaces, colons or control
// characters.
func CheckResourceName(name string) error {
	if name == "" || len(name) > 253 {
		return invalidf("resource name %q must be 1 to 253 characters", name)
	}
	for _, r := range name {
		if r <= ' ' || r == ':' || r == 0x7f {
			return invalidf("resource name %q holds a space, colon or control character", name)
		}
	}
	return nil
}
