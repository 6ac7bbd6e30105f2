package names

import (
	"path"
	"strings"
)

// MaxPathLen is the longest path a resource, data path or filled path may
// have (PATH_MAX on Linux).
const MaxPathLen = 4096

// CheckPath returns an error naming the field when p is not an absolute,
// clean, slash-separated path of at most MaxPathLen bytes without NUL bytes.
// A clean absolute path cannot hold ".." segments, so this also refuses
// traversal.
func CheckPath(field, p string) error {
	switch {
	case p == "":
		return invalidf("%s is empty", field)
	case len(p) > MaxPathLen:
		return invalidf("%s is %d bytes, over the limit of %d", field, len(p), MaxPathLen)
	case strings.IndexByte(p, 0) >= 0:
		return invalidf("%s %q holds a NUL byte", field, p)
	case !strings.HasPrefix(p, "/"):
		return invalidf("%s %q is not absolute", field, p)
	case path.Clean(p) != p:
		return invalidf("%s %q is not clean (want %q)", field, p, path.Clean(p))
	}
	return nil
}

// Within reports whether p is prefix or lies under it; both must be clean and
// absolute.
func Within(p, prefix string) bool {
	if prefix == "/" {
		return strings.HasPrefix(p, "/")
	}
	return p == prefix || strings.HasPrefix(p, prefix+"/")
}
