package pass

import (
	"slices"
	"strings"
	"sync"

	"google.golang.org/protobuf/proto"

	composerv1 "mesh.dev/proto/mesh/composer/v1"
	typev1 "mesh.dev/proto/mesh/type/v1"
	"mesh.dev/services/composer/internal/compose"
)

// maxSplitBytes bounds the split cache: about 20 KiB a node for 20 small
// modules, so a fleet of several thousand nodes fits.
const maxSplitBytes = 128 << 20

// splitCache keeps each node's split declaration with the inputs it was
// derived from: the spec (its revision, and its content: after nats-server's
// store went back to an older snapshot a revision is handed out again, to
// another spec) and the fingerprints composed. They determine it (entries
// are immutable per fingerprint), so a pass whose
// inputs did not move skips rendering every template of every module,
// the bulk of a pass that finds nothing changed. The compositions held are
// never modified (the spill clones before moving content out of line).
type splitCache struct {
	mu    sync.Mutex
	m     map[string]splitEntry
	bytes int
}

type splitEntry struct {
	rev   uint64
	spec  *composerv1.NodeSpec
	fps   string
	split compose.Split
	size  int
}

func fpsKey(fps map[string]string) string {
	keys := make([]string, 0, len(fps))
	for m := range fps {
		keys = append(keys, m)
	}
	slices.Sort(keys)
	var b strings.Builder
	for _, m := range keys {
		b.WriteString(m)
		b.WriteByte('=')
		b.WriteString(fps[m])
		b.WriteByte(';')
	}
	return b.String()
}

func (c *splitCache) get(node string, rev uint64, spec *composerv1.NodeSpec, fps string) (compose.Split, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.m[node]
	if !ok || e.rev != rev || e.fps != fps || !proto.Equal(e.spec, spec) {
		return compose.Split{}, false
	}
	return e.split, true
}

func (c *splitCache) put(node string, rev uint64, spec *composerv1.NodeSpec, fps string, split compose.Split) {
	size := len(node) + len(fps) + proto.Size(spec)
	for k, comp := range split.Compositions {
		size += len(k) + proto.Size(comp)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil {
		c.m = map[string]splitEntry{}
	}
	if old, ok := c.m[node]; ok {
		c.bytes -= old.size
		delete(c.m, node)
	}
	// Over budget, drop entries (in map order: arbitrary nodes) until the
	// new one fits; a node not cached is only rendered again.
	for n, e := range c.m {
		if c.bytes+size <= maxSplitBytes {
			break
		}
		c.bytes -= e.size
		delete(c.m, n)
	}
	if size > maxSplitBytes {
		return
	}
	c.m[node] = splitEntry{rev: rev, spec: spec, fps: fps, split: split, size: size}
	c.bytes += size
}

func (c *splitCache) drop(node string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if e, ok := c.m[node]; ok {
		c.bytes -= e.size
		delete(c.m, node)
	}
}

// split renders a node's declaration and splits it (DESIGN.md §4, §5.1),
// or returns the split of the same inputs made before.
func (p *Passer) split(st *nodeState, fps map[string]string, modules map[string]compose.Module, manifests map[string]*typev1.ModuleManifest) (compose.Split, error) {
	node := st.spec.GetNode()
	key := fpsKey(fps)
	if s, ok := p.splits.get(node, st.specRev, st.spec, key); ok {
		return s, nil
	}
	decl, err := compose.Declare(st.spec, modules)
	if err != nil {
		return compose.Split{}, err
	}
	s := compose.SplitDeclaration(compose.SplitInput{Declaration: decl, Fingerprints: fps, Manifests: manifests, Runs: decl.GetRuns()})
	if st.specRev != 0 {
		p.splits.put(node, st.specRev, st.spec, key, s)
	}
	return s, nil
}
