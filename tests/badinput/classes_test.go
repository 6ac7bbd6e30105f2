package badinput

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"mesh.dev/internal/identity"
	"mesh.dev/internal/lint"
	"mesh.dev/internal/names"
	catalogv1 "mesh.dev/proto/mesh/catalog/v1"
	composerv1 "mesh.dev/proto/mesh/composer/v1"
	signerv1 "mesh.dev/proto/mesh/signer/v1"
	typev1 "mesh.dev/proto/mesh/type/v1"
)

const unmarshal = "failed to unmarshal the received message"

func malformedCases(t *testing.T, s *suite) []badCase {
	r := newRand()
	catConn := s.m.Dial(t, s.m.CatalogAddr, identity.RoleBuilder, "ci")
	compConn := s.m.Dial(t, s.m.ComposerAddr, identity.RoleOperator, "admin")
	sigConn := s.m.Dial(t, s.sigAddr, identity.RoleComposer, "")
	var out []badCase
	add := func(service, method string, conn *grpc.ClientConn, state func(*testing.T) string, m proto.Message, n int) {
		for i, b := range malformed(r, m, n) {
			out = append(out, badCase{name: fmt.Sprintf("%s %s #%d %x", service, method, i, b[:min(len(b), 12)]),
				call: invokeRaw(conn, method, b), code: codes.Internal, words: []string{unmarshal}, state: state})
		}
	}
	add("catalog", catalogv1.CatalogService_PutEntry_FullMethodName, catConn, s.catalogState, &catalogv1.PutEntryRequest{Entry: s.webEntry}, 12)
	add("catalog", catalogv1.CatalogService_PutBuild_FullMethodName, catConn, s.catalogState,
		&catalogv1.PutBuildRequest{Build: &catalogv1.Build{Fingerprint: s.webFP, State: catalogv1.BuildState_BUILD_STATE_DONE}}, 8)
	add("catalog", catalogv1.CatalogService_RegisterModule_FullMethodName, catConn, s.catalogState,
		&catalogv1.RegisterModuleRequest{Module: "web", Fingerprint: s.webFP}, 8)
	add("composer", composerv1.ComposerService_PutNode_FullMethodName, compConn, s.composerState,
		&composerv1.PutNodeRequest{Spec: &composerv1.NodeSpec{Node: "ace", Modules: []*composerv1.PlacedModule{{Module: "web"}}}}, 12)
	add("composer", composerv1.ComposerService_Approve_FullMethodName, compConn, s.composerState,
		&composerv1.ApproveRequest{Module: "web", Digests: []string{names.Digest([]byte("x"))}}, 8)
	add("signer", signerv1.SignerService_SignCompositions_FullMethodName, sigConn, s.signerState,
		&signerv1.SignCompositionsRequest{FencingEpoch: s.epoch, Compositions: []*typev1.Composition{ownComposition("ace", ownFile("a:b", "/etc/a"))}}, 8)
	add("signer", signerv1.SignerService_SignManifests_FullMethodName, sigConn, s.signerState,
		&signerv1.SignManifestsRequest{FencingEpoch: s.epoch, Manifests: []*signerv1.ManifestItem{{Node: "ace"}}}, 6)
	// An upload stream whose messages do not decode.
	for i, b := range malformed(r, header(names.Digest([]byte("x")), 1), 6) {
		out = append(out, badCase{name: fmt.Sprintf("catalog UploadArtifact #%d %x", i, b[:min(len(b), 12)]),
			call: streamRaw(catConn, catalogv1.CatalogService_UploadArtifact_FullMethodName, b), code: codes.Internal, words: []string{unmarshal}, state: s.catalogState})
	}
	return out
}

// badEnums are enum numbers no version of mesh defines.
var badEnums = []int32{4, 5, 42, 127, 1000, 1 << 20, -1, 2147483647}

func unknownEnumCases(t *testing.T, s *suite) []badCase {
	var out []badCase
	for _, v := range badEnums {
		e := entryOf(moduleManifest("evil"), "https://git.example/evil")
		e.Verdict = catalogv1.Verdict(v)
		out = append(out, s.putEntry(fmt.Sprintf("verdict %d", v), e, codes.InvalidArgument, "entry.verdict", "is not PASS, WARN or FAIL"))
		out = append(out, s.putEntry(fmt.Sprintf("resource type %d", v), entryWith(func(m *typev1.ModuleManifest) { m.Resources[0].Type = typev1.ResourceType(v) }),
			codes.InvalidArgument, "entry.manifest.resources[0].type", "is not FILE, DIRECTORY or SYMLINK"))
		out = append(out, s.putEntry(fmt.Sprintf("upgrade policy %d", v), entryWith(func(m *typev1.ModuleManifest) { m.Upgrade.Policy = typev1.UpgradePolicy(v) }),
			codes.InvalidArgument, "entry.manifest.upgrade.policy", "is not AUTO, MANUAL or PINNED"))
		out = append(out, s.putBuild(fmt.Sprintf("state %d", v), &catalogv1.Build{Fingerprint: s.webFP, State: catalogv1.BuildState(v)},
			codes.InvalidArgument, "build.state", "is not PENDING, DONE or FAILED"))
		bad := ownFile("net:conf", "/etc/net.conf")
		bad.Type = typev1.ResourceType(v)
		out = append(out, s.putNodeLint(fmt.Sprintf("resource type %d", v), specWith("ace", bad), codes.InvalidArgument, "spec.resources[0].type", "is not FILE, DIRECTORY or SYMLINK"))
		out = append(out, s.signComps(fmt.Sprintf("resource type %d", v), []*typev1.Composition{ownComposition("ace", bad)},
			codes.InvalidArgument, "compositions[0]", "resources[0].type", "is not FILE, DIRECTORY or SYMLINK"))
	}
	return out
}

// withUnknown appends an unknown field to a message's encoding.
func withUnknown(t *testing.T, m proto.Message, num protowire.Number) []byte {
	b, err := proto.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	b = protowire.AppendTag(b, num, protowire.BytesType)
	return protowire.AppendBytes(b, []byte("meaning this build cannot see"))
}

func unknownFieldCases(t *testing.T, s *suite) []badCase {
	catConn := s.m.Dial(t, s.m.CatalogAddr, identity.RoleBuilder, "ci")
	var out []badCase
	for _, num := range []protowire.Number{20, 90, 1000, 4096, 99999, 536870911} {
		// An unknown field inside the entry and inside the build (the
		// request wraps them).
		e := entryOf(moduleManifest(fmt.Sprintf("unk%d", num)), "https://git.example/evil")
		req := protowire.AppendTag(nil, 1, protowire.BytesType)
		req = protowire.AppendBytes(req, withUnknown(t, e, num))
		out = append(out, badCase{name: fmt.Sprintf("catalog PutEntry entry field %d", num), call: invokeRaw(catConn, catalogv1.CatalogService_PutEntry_FullMethodName, req),
			code: codes.InvalidArgument, words: []string{"entry holds fields this catalog does not know"}, state: s.catalogState})
		b := &catalogv1.Build{Fingerprint: s.webFP, State: catalogv1.BuildState_BUILD_STATE_PENDING}
		breq := protowire.AppendTag(nil, 1, protowire.BytesType)
		breq = protowire.AppendBytes(breq, withUnknown(t, b, num))
		out = append(out, badCase{name: fmt.Sprintf("catalog PutBuild build field %d", num), call: invokeRaw(catConn, catalogv1.CatalogService_PutBuild_FullMethodName, breq),
			code: codes.InvalidArgument, words: []string{"build holds fields this catalog does not know"}, state: s.catalogState})
		// An unknown field inside the canonical manifest bytes.
		m := moduleManifest(fmt.Sprintf("unm%d", num))
		e2 := entryOf(m, "https://git.example/evil")
		e2.Manifest = withUnknown(t, m, num)
		e2.ManifestDigest = names.Digest(e2.Manifest)
		refingerprint(e2)
		out = append(out, s.putEntry(fmt.Sprintf("manifest field %d", num), e2, codes.InvalidArgument, "entry.manifest", "does not know"))
	}
	return out
}

func oversizedCases(t *testing.T, s *suite) []badCase {
	compConn := s.m.Dial(t, s.m.ComposerAddr, identity.RoleOperator, "admin")
	var out []badCase
	// Over the 4 MiB gRPC limit: the server refuses before decoding.
	for _, size := range []int{4<<20 + 1, 5 << 20, 8 << 20} {
		spec := &composerv1.NodeSpec{Node: "ace", Resources: []*typev1.Resource{ownFile("big:f", "/etc/big")}}
		spec.Resources[0].Content = &typev1.Resource_Inline{Inline: make([]byte, size)}
		b, _ := proto.Marshal(&composerv1.PutNodeRequest{Spec: spec})
		out = append(out, badCase{name: fmt.Sprintf("composer PutNode message of %d bytes", len(b)), state: s.composerState,
			code: codes.ResourceExhausted, words: []string{"received message larger than max"},
			call: func(ctx context.Context) error {
				return compConn.Invoke(ctx, composerv1.ComposerService_PutNode_FullMethodName, &rawMsg{b}, &rawMsg{},
					grpc.ForceCodec(rawCodec{}), grpc.MaxCallSendMsgSize(64<<20))
			}})
	}
	// Node specs over their limits.
	for _, n := range []int{600 << 10, 1 << 20, 3 << 20} {
		spec := &composerv1.NodeSpec{Node: "ace"}
		for i := 0; i*(60<<10) < n; i++ {
			r := ownFile(fmt.Sprintf("big:f%d", i), fmt.Sprintf("/etc/big/f%05d", i))
			r.Content = &typev1.Resource_Inline{Inline: make([]byte, 60<<10)}
			spec.Resources = append(spec.Resources, r)
		}
		out = append(out, s.putNode(fmt.Sprintf("spec of %d KiB", proto.Size(spec)>>10), spec, codes.InvalidArgument, "spec:", "bytes encoded, over the limit of 524288"))
	}
	for _, n := range []int{65 << 10, 200 << 10} {
		big := params(map[string]any{"blob": strings.Repeat("x", n)})
		out = append(out, s.putNode(fmt.Sprintf("facts of %d KiB", n>>10), &composerv1.NodeSpec{Node: "ace", Facts: big}, codes.InvalidArgument, "spec.facts", "over the limit of 65536"))
		out = append(out, s.putNode(fmt.Sprintf("params of %d KiB", n>>10), &composerv1.NodeSpec{Node: "ace", Modules: []*composerv1.PlacedModule{{Module: "web", Params: big}}},
			codes.InvalidArgument, "spec.modules[0].params", "over the limit of 65536"))
	}
	labels := map[string]string{}
	for i := 0; i < 65; i++ {
		labels[fmt.Sprintf("k%d", i)] = "v"
	}
	out = append(out, s.putNode("65 labels", &composerv1.NodeSpec{Node: "ace", Labels: labels}, codes.InvalidArgument, "spec.labels", "65 labels, over the limit of 64"))
	var placed []*composerv1.PlacedModule
	for i := 0; i < 257; i++ {
		placed = append(placed, &composerv1.PlacedModule{Module: fmt.Sprintf("m%d", i)})
	}
	out = append(out, s.putNode("257 modules", &composerv1.NodeSpec{Node: "ace", Modules: placed}, codes.InvalidArgument, "spec.modules", "257 modules, over the limit of 256"))
	out = append(out, s.approve("note of 1025 bytes", &composerv1.ApproveRequest{Module: "web", Digests: []string{names.Digest([]byte("x"))}, Note: strings.Repeat("n", 1025)},
		codes.InvalidArgument, "note", "longer than 1024 bytes"))
	// Catalog entries over their limits.
	for _, n := range []int{1025, 4096} {
		e := entryOf(moduleManifest("evil"), strings.Repeat("r", n))
		out = append(out, s.putEntry(fmt.Sprintf("repository of %d bytes", n), e, codes.InvalidArgument, "entry.repository", "must be 1 to 1024 bytes"))
	}
	out = append(out, s.putEntry("manifest of 600 KiB", entryWith(func(m *typev1.ModuleManifest) {
		m.Resources[1].Content = &typev1.ResourceTemplate_Raw{Raw: make([]byte, 600<<10)}
	}), codes.InvalidArgument, "entry.manifest", "over the limit of 524288"))
	out = append(out, s.putEntry("4097 resources", entryWith(func(m *typev1.ModuleManifest) {
		for i := len(m.Resources); i < 4097; i++ {
			m.Resources = append(m.Resources, &typev1.ResourceTemplate{Name: fmt.Sprintf("d%d", i), Type: typev1.ResourceType_RESOURCE_TYPE_DIRECTORY, Path: fmt.Sprintf("/srv/evil/d%d", i)})
		}
	}), codes.InvalidArgument, "entry.manifest.resources", "4097 resources, over the limit of 4096"))
	for _, n := range []int{257, 1000} {
		e := entryOf(moduleManifest("evil"), "https://git.example/evil")
		for i := 0; i < n; i++ {
			e.Packages = append(e.Packages, fmt.Sprintf("pkg%d", i))
		}
		out = append(out, s.putEntry(fmt.Sprintf("%d packages", n), e, codes.InvalidArgument, "entry.packages", "over the limit of 256"))
	}
	e := entryOf(moduleManifest("evil"), "https://git.example/evil")
	e.Verdict, e.Problems = catalogv1.Verdict_VERDICT_FAIL, []string{strings.Repeat("p", 1025)}
	out = append(out, s.putEntry("problem of 1025 bytes", e, codes.InvalidArgument, "entry.problems[0]", "over the limit of 1024"))
	// Uploads: a size over the artifact limit, and more bytes than declared.
	for _, size := range []int64{1<<30 + 1, 1 << 40, -1} {
		out = append(out, s.upload(fmt.Sprintf("declared size %d", size), []*catalogv1.UploadArtifactRequest{header(names.Digest([]byte("x")), size)},
			codes.InvalidArgument, "header.size", "is outside 0..1073741824"))
	}
	for _, extra := range []int{1, 1000} {
		content := []byte("declared ten")
		out = append(out, s.upload(fmt.Sprintf("%d bytes past the declared size", extra),
			[]*catalogv1.UploadArtifactRequest{header(names.Digest(content), int64(len(content))), chunk(append(content, make([]byte, extra)...))},
			codes.InvalidArgument, "chunk: more bytes than the 12 declared", "nothing was stored"))
	}
	// Signing batches over their limits.
	var batch []*typev1.Composition
	for i := 0; i <= lint.MaxBatch; i++ {
		batch = append(batch, ownComposition(fmt.Sprintf("n%d", i), ownFile("a:b", "/etc/a")))
	}
	out = append(out, s.signComps("1001 compositions", batch, codes.InvalidArgument, "compositions: 1001 items, want 1 to 1000"))
	var items []*signerv1.ManifestItem
	for i := 0; i <= lint.MaxBatch; i++ {
		items = append(items, &signerv1.ManifestItem{Node: fmt.Sprintf("n%d", i)})
	}
	out = append(out, s.signManifests("1001 manifests", items, codes.InvalidArgument, "manifests: 1001 items, want 1 to 1000"))
	out = append(out, s.signComps("empty batch", nil, codes.InvalidArgument, "compositions: 0 items"))
	return out
}

// manyResources returns n own resources with paths of about pathLen bytes.
func manyResources(n, pathLen int) []*typev1.Resource {
	var out []*typev1.Resource
	pad := strings.Repeat("p", max(0, pathLen-20))
	for i := 0; i < n; i++ {
		out = append(out, &typev1.Resource{Id: fmt.Sprintf("many:d%05d", i), Type: typev1.ResourceType_RESOURCE_TYPE_DIRECTORY,
			Path: fmt.Sprintf("/srv/many/%s%05d", pad, i)})
	}
	return out
}

func oversizedCompositionCases(t *testing.T, s *suite) []badCase {
	var out []badCase
	for _, c := range []struct{ n, pathLen int }{{1500, 200}, {2000, 200}, {3000, 150}, {1200, 400}, {700, 500}, {4000, 100}} {
		comp := ownComposition("ace", manyResources(c.n, c.pathLen)...)
		out = append(out, s.signComps(fmt.Sprintf("%d resources of %d-byte paths", c.n, c.pathLen), []*typev1.Composition{comp},
			codes.InvalidArgument, "compositions[0]", "bytes encoded, over the limit of 262144"))
		res := manyResources(c.n, c.pathLen)
		out = append(out, s.compose(fmt.Sprintf("own composition of %d resources of %d-byte paths", c.n, c.pathLen),
			func(node string) *composerv1.NodeSpec { return specWith(node, res...) }, "over the limit of 262144"))
		out = append(out, s.engine.hostileOwn(fmt.Sprintf("signed composition of %d resources of %d-byte paths", c.n, c.pathLen),
			manyResources(c.n, c.pathLen), "REASON_CODE_WANT_MISMATCH", "does not lint", "over the limit of 262144"))
	}
	for _, n := range []int{4097, 5000} {
		comp := ownComposition("ace", manyResources(n, 20)...)
		out = append(out, s.signComps(fmt.Sprintf("%d resources", n), []*typev1.Composition{comp}, codes.InvalidArgument, fmt.Sprintf("%d resources, over the limit of 4096", n)))
		res := manyResources(n, 20)
		out = append(out, s.compose(fmt.Sprintf("own composition of %d resources", n),
			func(node string) *composerv1.NodeSpec { return specWith(node, res...) }, fmt.Sprintf("%d resources, over the limit of 4096", n)))
	}
	return out
}

// traversals are paths that climb with "..", in every position.
func traversals() []string {
	var out []string
	for _, base := range []string{"/etc", "/srv", "/opt/app"} {
		out = append(out, base+"/../root/.ssh/authorized_keys", base+"/a/../../etc/shadow", base+"/..", base+"/x/../..", base+"/../../../../../etc/passwd")
	}
	return append(out, "/..", "/../etc/shadow")
}

func traversalCases(t *testing.T, s *suite) []badCase {
	var out []badCase
	for i, p := range traversals() {
		out = append(out, s.putNodeLint("resource path "+p, specWith("ace", ownFile("net:conf", p)), codes.InvalidArgument, "spec.resources[0].path", "not clean"))
		list := &composerv1.NodeSpec{Node: "ace"}
		if i%2 == 0 {
			list.Adoption = []string{p}
			out = append(out, s.putNode("adoption "+p, list, codes.InvalidArgument, "spec.adoption[0]", "not clean"))
		} else {
			list.Filled = []string{p}
			out = append(out, s.putNode("filled "+p, list, codes.InvalidArgument, "spec.filled[0]", "not clean"))
		}
		out = append(out, s.putEntry("manifest path "+p, entryWith(func(m *typev1.ModuleManifest) { m.Resources[1].Path = p }),
			codes.InvalidArgument, "entry.manifest.resources[1].path", "not clean"))
		out = append(out, s.signComps("own path "+p, []*typev1.Composition{ownComposition("ace", ownFile("net:conf", p))},
			codes.InvalidArgument, "compositions[0]", "resources[0].path", "not clean"))
		out = append(out, s.engine.hostileOwn("signed path "+p, []*typev1.Resource{ownFile("net:conf", p)}, "REASON_CODE_PATH_ESCAPE", p, "escapes with .."))
	}
	for _, tmpl := range []string{"/srv/{{ .Params.d }}/../shadow", "/srv/{{ .Node }}/../../etc", "/srv/../{{ .Node }}"} {
		out = append(out, s.putEntry("path template "+tmpl, entryWith(func(m *typev1.ModuleManifest) { m.Resources[1].Path = tmpl }),
			codes.InvalidArgument, "entry.manifest.resources[1].path", "is not clean once each action stands for one path segment"))
	}
	for _, p := range []string{"../outside", "modules/../../x", ".."} {
		e := entryOf(moduleManifest("evil"), "https://git.example/evil")
		e.Path = p
		refingerprint(e)
		out = append(out, s.putEntry("source path "+p, e, codes.InvalidArgument, "entry.path"))
	}
	// Params that render a traversal into a templated path.
	for _, name := range []string{"../../../etc/shadow", "../x", "a/../../b", "../.."} {
		out = append(out, s.compose("params name "+name, func(node string) *composerv1.NodeSpec {
			return &composerv1.NodeSpec{Node: node, Modules: []*composerv1.PlacedModule{{Module: "tmpl", Params: params(map[string]any{"name": name, "alias": "alias", "port": 1})}}}
		}, "module tmpl", "resource tmpl:conf", "not clean"))
	}
	return out
}

func absolutePathCases(t *testing.T, s *suite) []badCase {
	var out []badCase
	type bad struct{ p, words string }
	unclean := []bad{{"etc/passwd", "is not absolute"}, {"", "is empty"}, {"//etc/passwd", "not clean"}, {"/etc//passwd", "not clean"},
		{"/etc/passwd/", "not clean"}, {"/etc/./passwd", "not clean"}, {"/etc/passwd/.", "not clean"}, {"/etc/\x00shadow", "NUL"},
		{"/" + strings.Repeat("a/", 2100), "over the limit"}, {`\etc\passwd`, "is not absolute"}, {"~/.ssh/authorized_keys", "is not absolute"}}
	for _, b := range unclean {
		short := fmt.Sprintf("%q", b.p[:min(len(b.p), 24)])
		out = append(out, s.putNodeLint("resource path "+short, specWith("ace", ownFile("net:conf", b.p)), codes.InvalidArgument, "spec.resources[0].path", b.words))
		out = append(out, s.putEntry("manifest path "+short, entryWith(func(m *typev1.ModuleManifest) { m.Resources[1].Path = b.p }),
			codes.InvalidArgument, "entry.manifest.resources[1].path"))
		out = append(out, s.signComps("own path "+short, []*typev1.Composition{ownComposition("ace", ownFile("net:conf", b.p))},
			codes.InvalidArgument, "resources[0].path"))
	}
	out = append(out, s.putNodeLint("the root directory", specWith("ace", &typev1.Resource{Id: "r:r", Type: typev1.ResourceType_RESOURCE_TYPE_DIRECTORY, Path: "/"}),
		codes.InvalidArgument, "spec.resources[0].path", "the root directory cannot be a resource"))
	// Clean absolute paths outside the own prefixes (/etc, /opt, /srv):
	// the signer refuses them, directly and through the composer.
	for _, p := range []string{"/root/.ssh/authorized_keys", "/usr/bin/sudo", "/var/spool/cron/root", "/etcetera/x", "/srvx/y", "/boot/vmlinuz"} {
		out = append(out, s.signComps("own path outside the own prefixes "+p, []*typev1.Composition{ownComposition("ace", ownFile("net:conf", p))},
			codes.FailedPrecondition, "compositions[0]", p, "outside the own prefixes"))
		out = append(out, s.compose("own path outside the own prefixes "+p, func(node string) *composerv1.NodeSpec {
			return specWith(node, ownFile("net:conf", p))
		}, p, "outside the own prefixes"))
		out = append(out, s.signComps("own filled path outside the own prefixes "+p, []*typev1.Composition{{Node: "ace", Module: names.NodeModule, Filled: []string{p}}},
			codes.FailedPrecondition, "filled[0]", "outside the own prefixes"))
		out = append(out, s.engine.hostileOwn("signed path outside the prefixes "+p, []*typev1.Resource{ownFile("net:conf", p)},
			"REASON_CODE_PATH_OUTSIDE_PREFIXES", p, "outside the allowed prefixes"))
	}
	for _, p := range []string{"/srv//x", "/srv/./x", "/etc/app/"} {
		out = append(out, s.engine.hostileOwn("signed unclean path "+p, []*typev1.Resource{ownFile("net:conf", p)}, "REASON_CODE_PATH_ESCAPE", p+" is not an absolute clean path"))
	}
	return out
}

func symlinkCases(t *testing.T, s *suite) []badCase {
	var out []badCase
	escaping := []struct{ target, resolved string }{
		{"/root/.ssh/authorized_keys", "/root/.ssh/authorized_keys"}, {"/usr/bin", "/usr/bin"}, {"/etc/../root", "/root"},
		{"../../root/.ssh", "/root/.ssh"}, {"../../../../../../usr", "/usr"}, {"sub/../../../boot", "/boot"},
	}
	for _, e := range escaping {
		out = append(out, s.signComps("own symlink to "+e.target, []*typev1.Composition{ownComposition("ace", ownLink("net:link", "/etc/net/link", e.target))},
			codes.FailedPrecondition, "resources[0].target", "resolves to "+e.resolved, "outside the own prefixes"))
		out = append(out, s.compose("own symlink to "+e.target, func(node string) *composerv1.NodeSpec {
			return specWith(node, ownLink("net:link", "/etc/net/link", e.target))
		}, "resources[0].target", "outside the own prefixes"))
	}
	engineTargets := []struct{ target, code, words string }{
		{"/root/.ssh", "REASON_CODE_PATH_OUTSIDE_PREFIXES", "is outside the allowed prefixes"},
		{"/usr/bin/sudo", "REASON_CODE_PATH_OUTSIDE_PREFIXES", "is outside the allowed prefixes"},
		{"/etc/../root", "REASON_CODE_PATH_ESCAPE", "holds .."},
		{"../../root", "REASON_CODE_PATH_ESCAPE", "escapes its prefix /srv"},
		{"../../../../../..", "REASON_CODE_PATH_ESCAPE", "escapes its prefix /srv"},
		{"x/../../../usr", "REASON_CODE_PATH_ESCAPE", "escapes its prefix /srv"},
		{"net/../../../usr", "REASON_CODE_PATH_ESCAPE", "escapes its prefix /srv"},
	}
	for _, e := range engineTargets {
		out = append(out, s.engine.hostileOwn("signed symlink to "+e.target, []*typev1.Resource{ownLink("net:link", "/srv/net/link", e.target)}, e.code, e.words))
	}
	// Paths through the symlinks planted in the engine's root.
	for _, p := range []string{"/srv/abs/secret", "/srv/abs/new", "/srv/abs/d/e/f"} {
		out = append(out, s.engine.hostileOwn("signed path "+p+" through an absolute symlink", []*typev1.Resource{ownFile("net:conf", p)},
			"REASON_CODE_PATH_THROUGH_SYMLINK", "passes through the absolute symlink /srv/abs"))
	}
	for _, p := range []string{"/srv/rel/secret", "/srv/rel/new", "/srv/rel/d/e"} {
		out = append(out, s.engine.hostileOwn("signed path "+p+" through a symlink climbing out", []*typev1.Resource{ownFile("net:conf", p)},
			"REASON_CODE_PATH_ESCAPE", "passes through the symlink /srv/rel", "which leaves /srv"))
	}
	for _, p := range []string{"/srv/abs", "/srv/rel", "/srv/unmanaged"} {
		out = append(out, s.engine.hostileOwn("signed file over the unmanaged "+p, []*typev1.Resource{ownFile("net:conf", p)},
			"REASON_CODE_UNMANAGED_PATH", p+" exists and is not managed by this engine"))
	}
	// A symlink the manifest makes, then a path through it, in one
	// composition.
	out = append(out, s.engine.hostileOwn("signed path through a symlink it declares", []*typev1.Resource{
		ownLink("net:link", "/srv/l", "/etc"), ownFile("net:f", "/srv/l/passwd")}, "/srv/l is declared as a symlink", "yet /srv/l/passwd lies under it"))
	return out
}

func invalidNameCases(t *testing.T, s *suite) []badCase {
	var out []badCase
	for _, n := range badLabels() {
		q := fmt.Sprintf("%q", n)
		out = append(out, s.putNode("node "+q, &composerv1.NodeSpec{Node: n}, codes.InvalidArgument, "spec.node", "is not a DNS label"))
		out = append(out, s.putNode("module "+q, &composerv1.NodeSpec{Node: "ace", Modules: []*composerv1.PlacedModule{{Module: n}}},
			codes.InvalidArgument, "spec.modules[0].module", "is not a DNS label"))
		out = append(out, s.approve("module "+q, &composerv1.ApproveRequest{Module: n, Digests: []string{names.Digest([]byte("x"))}},
			codes.InvalidArgument, "module", "is not a DNS label"))
		out = append(out, s.register("module "+q, n, s.webFP, codes.InvalidArgument, "module", "is not a DNS label"))
		e := entryOf(moduleManifest("evil"), "https://git.example/evil")
		e.Module = n
		out = append(out, s.putEntry("module "+q, e, codes.InvalidArgument, "entry.module"))
		out = append(out, s.signManifests("node "+q, []*signerv1.ManifestItem{{Node: n}}, codes.InvalidArgument, "manifests[0].node", "is not a DNS label"))
	}
	for _, reserved := range []string{"node"} {
		out = append(out, s.putNode("reserved module node", &composerv1.NodeSpec{Node: "ace", Modules: []*composerv1.PlacedModule{{Module: reserved}}},
			codes.InvalidArgument, "spec.modules[0].module", "is reserved"))
		out = append(out, s.register("reserved module node", reserved, s.webFP, codes.InvalidArgument, "is reserved"))
	}
	for _, owner := range []string{"root;rm -rf /", "Root", strings.Repeat("u", 33), "-x", "a b", "$(id)"} {
		r := ownFile("net:conf", "/etc/net.conf")
		r.Owner = owner
		out = append(out, s.putNodeLint(fmt.Sprintf("owner %q", owner), specWith("ace", r), codes.InvalidArgument, "spec.resources[0].owner"))
		g := ownFile("net:conf", "/etc/net.conf")
		g.Group = owner
		out = append(out, s.putNodeLint(fmt.Sprintf("group %q", owner), specWith("ace", g), codes.InvalidArgument, "spec.resources[0].group"))
		out = append(out, s.putNodeLint(fmt.Sprintf("provisioner account %q", owner), &composerv1.NodeSpec{Node: "ace", ProvisionerAccount: owner},
			codes.InvalidArgument, "spec.provisioner_account"))
	}
	for _, id := range []string{"noid", "BAD:x", ":x", "a:", "a:b c", "a:b:c"} {
		out = append(out, s.putNodeLint(fmt.Sprintf("resource id %q", id), specWith("ace", ownFile(id, "/etc/net.conf")), codes.InvalidArgument, "spec.resources[0].id"))
	}
	for _, k := range []string{"", "-k", "k k", strings.Repeat("k", 64), "ké"} {
		out = append(out, s.putNode(fmt.Sprintf("label key %q", k), &composerv1.NodeSpec{Node: "ace", Labels: map[string]string{k: "v"}},
			codes.InvalidArgument, "spec.labels", "is not a label key"))
	}
	for _, ref := range []string{"noref", "BIN:x", "binary:", "binary:.hidden", "binary:a b", "binary:" + strings.Repeat("x", 129)} {
		out = append(out, s.putEntry(fmt.Sprintf("artifact ref %q", ref), entryWith(func(m *typev1.ModuleManifest) {
			m.Resources[2].Content = &typev1.ResourceTemplate_Artifact{Artifact: ref}
		}), codes.InvalidArgument, "entry.manifest.resources[2].artifact"))
	}
	return out
}

// fingerprints returns malformed and unknown fingerprints around fp.
func badFingerprints(fp string) []string {
	flip := []byte(fp)
	if flip[len(flip)-1] == '0' {
		flip[len(flip)-1] = '1'
	} else {
		flip[len(flip)-1] = '0'
	}
	return []string{"", "fp1:", "fp1:" + strings.Repeat("A", 64), "fp1:" + strings.Repeat("a", 63), "fp2:" + strings.Repeat("a", 64),
		"sha256:" + strings.Repeat("a", 64), strings.ToUpper(fp), fp + "0", string(flip)}
}

func wrongFingerprintCases(t *testing.T, s *suite) []badCase {
	var out []badCase
	unknown := names.FingerprintPrefix + strings.Repeat("7", 64)
	for _, fp := range badFingerprints(s.webFP) {
		e := entryOf(moduleManifest("evil"), "https://git.example/evil")
		e.Fingerprint = fp
		out = append(out, s.putEntry(fmt.Sprintf("fingerprint %q", fp), e, codes.InvalidArgument, "entry.fingerprint"))
		code, words := codes.InvalidArgument, []string{"fingerprint"}
		if names.HasFingerprint(fp) {
			code, words = codes.NotFound, []string{"no entry of fingerprint " + fp}
		}
		out = append(out, s.register(fmt.Sprintf("web at %q", fp), "web", fp, code, words...))
		out = append(out, s.putBuild(fmt.Sprintf("of %q", fp), &catalogv1.Build{Fingerprint: fp, State: catalogv1.BuildState_BUILD_STATE_PENDING}, code, words...))
		comp := &typev1.Composition{Node: "ace", Module: "web", Fingerprint: fp}
		scode, swords := codes.InvalidArgument, []string{"compositions[0]", "fingerprint"}
		if names.HasFingerprint(fp) {
			scode, swords = codes.FailedPrecondition, []string{"no entry of " + fp}
		}
		out = append(out, s.signComps(fmt.Sprintf("web at %q", fp), []*typev1.Composition{comp}, scode, swords...))
	}
	out = append(out, s.register("module other at web's fingerprint", "other", s.webFP, codes.FailedPrecondition, "is an entry of module \"web\", not \"other\""))
	out = append(out, s.signComps("tmpl at web's fingerprint", []*typev1.Composition{{Node: "ace", Module: "tmpl", Fingerprint: s.webFP}},
		codes.FailedPrecondition, "is an entry of module \"web\""))
	e := entryOf(moduleManifest("evil"), "https://git.example/evil")
	e.Fingerprint = s.webFP
	out = append(out, s.putEntry("another entry's fingerprint", e, codes.InvalidArgument, "entry.fingerprint", "does not match"))
	// The engine: a signed composition whose fingerprint is not its want's.
	for _, fp := range []string{unknown, s.tmplFP} {
		comp := &typev1.Composition{Node: "victim", Module: "web", Fingerprint: fp}
		out = append(out, s.engine.hostile("signed composition at "+fp+" for a want of web at its own", offer{comps: []*typev1.Composition{comp},
			wants: func(w []*typev1.Want) {
				for _, x := range w {
					if x.GetModule() == "web" {
						x.Fingerprint = s.webFP
						x.CompositionKey, _ = names.CompositionKey("victim", "web", s.webFP)
					}
				}
			}}, "REASON_CODE_WANT_MISMATCH", "the want says \"web\" at \""+s.webFP+"\""))
	}
	return out
}

func digestMismatchCases(t *testing.T, s *suite) []badCase {
	var out []badCase
	r := newRand()
	for i := 0; i < 6; i++ {
		content := make([]byte, 1+r.IntN(300<<10))
		for j := range content {
			content[j] = byte(r.UintN(256))
		}
		other := append([]byte(nil), content...)
		other[r.IntN(len(other))] ^= 0x01
		var msgs []*catalogv1.UploadArtifactRequest
		msgs = append(msgs, header(names.Digest(content), int64(len(content))))
		for off := 0; off < len(other); off += 64 << 10 {
			msgs = append(msgs, chunk(other[off:min(off+64<<10, len(other))]))
		}
		out = append(out, s.upload(fmt.Sprintf("%d bytes, one flipped", len(content)), msgs, codes.InvalidArgument, "artifact does not match its header", "nothing was stored"))
		short := []*catalogv1.UploadArtifactRequest{header(names.Digest(content), int64(len(content))), chunk(content[:len(content)/2])}
		out = append(out, s.upload(fmt.Sprintf("%d of %d bytes", len(content)/2, len(content)), short, codes.InvalidArgument, "artifact does not match its header", "nothing was stored"))
	}
	for _, d := range []string{"", "sha256:", "sha256:" + strings.Repeat("Z", 64), "md5:" + strings.Repeat("a", 32), names.Digest([]byte("x")) + "0"} {
		out = append(out, s.upload(fmt.Sprintf("header digest %q", d), []*catalogv1.UploadArtifactRequest{header(d, 1), chunk([]byte("x"))},
			codes.InvalidArgument, "digest"))
		out = append(out, s.approve(fmt.Sprintf("digest %q", d), &composerv1.ApproveRequest{Module: "web", Digests: []string{d}}, codes.InvalidArgument, "digests[0]"))
	}
	out = append(out, s.upload("a chunk before the header", []*catalogv1.UploadArtifactRequest{chunk([]byte("x"))}, codes.InvalidArgument, "the first message must carry the header"))
	// A DONE build naming bytes the catalog does not hold.
	notHeld := &catalogv1.Build{Fingerprint: s.webFP, State: catalogv1.BuildState_BUILD_STATE_DONE,
		Artifacts: []*typev1.Artifact{{Ref: "binary:web", Digest: names.Digest([]byte("never uploaded")), Size: 14}}}
	out = append(out, s.putBuild("DONE with an artifact never uploaded", notHeld, codes.FailedPrecondition, "is not held in the object store"))
	e := entryOf(moduleManifest("evil"), "https://git.example/evil")
	e.ManifestDigest = names.Digest([]byte("another manifest"))
	refingerprint(e)
	out = append(out, s.putEntry("manifest_digest of other bytes", e, codes.InvalidArgument, "entry.manifest_digest", "is not the digest of entry.manifest"))
	// The engine: a composition whose bytes are not the ones the manifest
	// names, objects whose bytes are not their digest or size.
	for i := 0; i < 4; i++ {
		comp := ownComposition("victim", ownFile("net:conf", fmt.Sprintf("/srv/net/conf%d", i)))
		replay := ownComposition("victim", ownFile("net:conf", fmt.Sprintf("/srv/net/old%d", i)))
		out = append(out, s.engine.hostile(fmt.Sprintf("signed composition replayed under another digest #%d", i), offer{comps: []*typev1.Composition{replay},
			wants: func(w []*typev1.Want) { w[0].CompositionDigest = names.Digest([]byte(comp.String())) }}, "REASON_CODE_DIGEST_MISMATCH", "digest mismatch"))
	}
	for i, c := range []struct {
		served []byte
		size   int64
		code   string
	}{{[]byte("not the bytes named"), 19, "REASON_CODE_DIGEST_MISMATCH"}, {[]byte("too long by far for its size"), 4, "REASON_CODE_SIZE_EXCEEDED"},
		{[]byte("short"), 100, "REASON_CODE_DIGEST_MISMATCH"}} {
		digest := names.Digest([]byte(fmt.Sprintf("the declared bytes %d", i)))
		res := &typev1.Resource{Id: "net:obj", Type: typev1.ResourceType_RESOURCE_TYPE_FILE, Path: fmt.Sprintf("/srv/net/object%d", i),
			Content: &typev1.Resource_Object{Object: &typev1.ObjectRef{Digest: digest, Size: c.size}}}
		out = append(out, s.engine.hostile(fmt.Sprintf("object of %d bytes declared %d", len(c.served), c.size),
			offer{comps: []*typev1.Composition{ownComposition("victim", res)}, objects: map[string][]byte{digest: c.served}}, c.code, "net:obj"))
	}
	return out
}

// injections are templates that reach outside the data, call or define
// templates, loop or grow without bound, or do not parse.
var injections = []struct{ src, words string }{
	{"{{ .Env.HOME }}", "templates see only .Node, .Facts and .Params"},
	{"{{ .Secrets.db }}", "templates see only .Node, .Facts and .Params"},
	{"{{ .Labels.role }}", "templates see only .Node, .Facts and .Params"},
	{"{{ $.Secrets }}", "templates see only .Node, .Facts and .Params"},
	{"{{ .Node.Name }}", ".Node is the node's name"},
	{"{{ with .Params }}{{ $.Env }}{{ end }}", "templates see only .Node, .Facts and .Params"},
	{"{{ call .Params.f }}", ""},
	{`{{ template "x" }}`, "may not define or call other templates"},
	{`{{ define "x" }}y{{ end }}`, "may not define or call other templates"},
	{`{{ block "b" . }}x{{ end }}`, "may not define or call other templates"},
	{"{{ range 1000000000000 }}{{ end }}", "range only over .Params, .Facts"},
	{`{{ $n := 100000000 }}{{ range $n }}x{{ end }}`, "range only over .Params, .Facts"},
	{`{{ $x := "a" }}{{ range .Params.l }}{{ $x = print $x $x }}{{ end }}`, "cannot be reassigned"},
	{"{{ range .Params.a }}{{ range $.Params.a }}{{ range $.Params.a }}x{{ end }}{{ end }}{{ end }}", "nested 3 deep"},
	{"{{ .Params.x ", "template does not parse"},
	{"{{ exec \"id\" }}", "template does not parse"},
	{"{{ env \"HOME\" }}", "template does not parse"},
	{"{{ readFile \"/etc/shadow\" }}", "template does not parse"},
	{"{{ .Params.x | shell }}", "template does not parse"},
	{"{{ end }}", "template does not parse"},
}

func templateInjectionCases(t *testing.T, s *suite) []badCase {
	var out []badCase
	for _, inj := range injections {
		words := []string{"entry.manifest.resources[1].text"}
		if inj.words != "" {
			words = append(words, inj.words)
		}
		if strings.HasPrefix(inj.src, "{{ call") {
			// call is a builtin: refused only because .Params.f holds no
			// function; lint lets it parse. Not a refusal of put time.
			continue
		}
		out = append(out, s.putEntry("text "+inj.src, entryWith(func(m *typev1.ModuleManifest) { m.Resources[1].Content = &typev1.ResourceTemplate_Text{Text: inj.src} }),
			codes.InvalidArgument, words...))
		pw := []string{"entry.manifest.resources[1].path"}
		if inj.words != "" {
			pw = append(pw, inj.words)
		}
		out = append(out, s.putEntry("path /srv/"+inj.src, entryWith(func(m *typev1.ModuleManifest) { m.Resources[1].Path = "/srv/" + inj.src }),
			codes.InvalidArgument, pw...))
		tw := []string{"entry.manifest.resources[3].target"}
		if inj.words != "" {
			tw = append(tw, inj.words)
		}
		out = append(out, s.putEntry("target "+inj.src, entryWith(func(m *typev1.ModuleManifest) {
			m.Resources = append(m.Resources, &typev1.ResourceTemplate{Name: "link", Type: typev1.ResourceType_RESOURCE_TYPE_SYMLINK, Path: "/srv/evil/link", Target: inj.src})
		}), codes.InvalidArgument, tw...))
	}
	return out
}

func duplicateCases(t *testing.T, s *suite) []badCase {
	var out []badCase
	r := newRand()
	dupPaths := []string{"/etc/net.conf", "/srv/a/b", "/opt/x"}
	for len(dupPaths) < 10 {
		dupPaths = append(dupPaths, fmt.Sprintf("/%s/g%d/f%d", []string{"etc", "srv", "opt"}[r.IntN(3)], r.IntN(1000), r.IntN(1000)))
	}
	for _, p := range dupPaths {
		out = append(out, s.putNode("two own resources on "+p, specWith("ace", ownFile("net:a", p), ownFile("net:b", p)),
			codes.InvalidArgument, "spec.resources[1].path", "2 resources declare "+p+": net:a, net:b"))
		out = append(out, s.putEntry("two literal paths "+p, entryWith(func(m *typev1.ModuleManifest) {
			m.Resources = append(m.Resources, &typev1.ResourceTemplate{Name: "a", Type: typev1.ResourceType_RESOURCE_TYPE_DIRECTORY, Path: p},
				&typev1.ResourceTemplate{Name: "b", Type: typev1.ResourceType_RESOURCE_TYPE_DIRECTORY, Path: p})
		}), codes.InvalidArgument, "entry.manifest.resources[4].path", "2 resources declare "+p+": evil:a, evil:b"))
		out = append(out, s.signComps("two paths "+p, []*typev1.Composition{ownComposition("ace", ownFile("net:a", p), ownFile("net:b", p))},
			codes.InvalidArgument, "2 resources declare "+p))
	}
	for _, name := range []string{"dir", "conf", "bin"} {
		out = append(out, s.putEntry("two resources named "+name, entryWith(func(m *typev1.ModuleManifest) {
			m.Resources = append(m.Resources, &typev1.ResourceTemplate{Name: name, Type: typev1.ResourceType_RESOURCE_TYPE_DIRECTORY, Path: "/srv/evil/other"})
		}), codes.InvalidArgument, "entry.manifest.resources[3].name", fmt.Sprintf("%q is also the name of resources", name)))
	}
	out = append(out, s.putNode("web placed twice", &composerv1.NodeSpec{Node: "ace", Modules: []*composerv1.PlacedModule{{Module: "web"}, {Module: "web"}}},
		codes.InvalidArgument, "spec.modules[1].module", "web is placed twice"))
	out = append(out, s.signManifests("a node listed twice", []*signerv1.ManifestItem{{Node: "ace"}, {Node: "ace"}}, codes.InvalidArgument, "manifests[1].node ace is listed twice"))
	// Rendered paths that collide: two templated paths of one module, and
	// a node's own resource on a module's path.
	for _, name := range []string{"same", "x"} {
		out = append(out, s.compose("tmpl's conf and alias both "+name, func(node string) *composerv1.NodeSpec {
			return &composerv1.NodeSpec{Node: node, Modules: []*composerv1.PlacedModule{{Module: "tmpl", Params: params(map[string]any{"name": name, "alias": name, "port": 1})}}}
		}, "2 resources declare /srv/tmpl/"+name+".conf", "tmpl:alias", "tmpl:conf"))
	}
	out = append(out, s.compose("own resource on web's /srv/web/conf", func(node string) *composerv1.NodeSpec {
		return &composerv1.NodeSpec{Node: node, Modules: []*composerv1.PlacedModule{{Module: "web", Params: params(map[string]any{"port": 80})}},
			Resources: []*typev1.Resource{ownFile("net:conf", "/srv/web/conf")}}
	}, "2 resources declare /srv/web/conf", "net:conf", "web:conf"))
	// The engine: two compositions of one manifest declaring one path.
	for i, p := range []string{"/srv/web/conf", "/srv/web"} {
		web := &typev1.Composition{Node: "victim", Module: "web", Fingerprint: s.webFP, Resources: []*typev1.Resource{
			{Id: "web:conf", Module: "web", Type: typev1.ResourceType_RESOURCE_TYPE_FILE, Path: p, Content: &typev1.Resource_Inline{Inline: []byte("web\n")}}}}
		own := ownComposition("victim", ownFile(fmt.Sprintf("net:clash%d", i), p))
		out = append(out, s.engine.hostile("own and web compositions both on "+p, offer{comps: []*typev1.Composition{own, web}, watch: names.NodeModule},
			"REASON_CODE_PATH_CONFLICT", "2 resources declare "+p))
	}
	return out
}
