package badinput

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"mesh.dev/internal/envelope"
	"mesh.dev/internal/identity"
	"mesh.dev/internal/names"
	catalogv1 "mesh.dev/proto/mesh/catalog/v1"
	composerv1 "mesh.dev/proto/mesh/composer/v1"
	nodeenginev1 "mesh.dev/proto/mesh/nodeengine/v1"
	signerv1 "mesh.dev/proto/mesh/signer/v1"
	typev1 "mesh.dev/proto/mesh/type/v1"
	"mesh.dev/tests/internal/rig"
)

// suite is the running mesh and the clients the classes use.
type suite struct {
	m        *rig.Mesh
	catalog  catalogv1.CatalogServiceClient
	composer composerv1.ComposerServiceClient
	signer   signerv1.SignerServiceClient
	sigAddr  string
	epoch    uint64
	// webFP is a released module (entry, DONE build, registration);
	// tmplFP one whose path and target are templates of its params.
	webFP, tmplFP string
	webEntry      *catalogv1.Entry

	catalogState, composerState, assignState, signerState func(t *testing.T) string
	engine                                                *engineRig
	nodes                                                 int
}

func newSuite(t *testing.T) *suite {
	m := rig.Start(t, rig.Options{})
	s := &suite{m: m}
	s.catalog = catalogv1.NewCatalogServiceClient(m.Dial(t, m.CatalogAddr, identity.RoleBuilder, "ci"))
	s.composer = composerv1.NewComposerServiceClient(m.Dial(t, m.ComposerAddr, identity.RoleOperator, "admin"))
	// A signer of its own: fencing and signing as the composer here does
	// not take the epoch from the mesh's composer.
	sigAddr, sigDir := m.StartSigner(t, nil)
	s.sigAddr = sigAddr
	s.signer = signerv1.NewSignerServiceClient(m.Dial(t, sigAddr, identity.RoleComposer, ""))
	fence, err := s.signer.Fence(context.Background(), &signerv1.FenceRequest{})
	rig.Must(t, err)
	s.epoch = fence.GetEpoch()

	s.webEntry = s.release(t, moduleManifest("web"))
	s.webFP = s.webEntry.GetFingerprint()
	tmpl := moduleManifest("tmpl")
	tmpl.Resources[1].Path = "/srv/tmpl/{{ .Params.name }}.conf"
	tmpl.Resources = append(tmpl.Resources, &typev1.ResourceTemplate{Name: "alias", Type: typev1.ResourceType_RESOURCE_TYPE_FILE,
		Path: "/srv/tmpl/{{ .Params.alias }}.conf", Content: &typev1.ResourceTemplate_Text{Text: "x\n"}})
	s.tmplFP = s.release(t, tmpl).GetFingerprint()

	s.catalogState = catalogState(m.JS)
	s.composerState = composerState(m.JS)
	s.assignState = func(t *testing.T) string {
		return streamSeqs(t, m.JS, kv("assignments"), kv("compositions"), obj("objects"))
	}
	s.signerState = signerState(sigDir)
	s.engine = newEngineRig(t, m, s.webFP)
	return s
}

// release puts a module in the catalog as a builder does and registers it.
func (s *suite) release(t *testing.T, man *typev1.ModuleManifest) *catalogv1.Entry {
	ctx := context.Background()
	e := entryOf(man, "https://git.example/infra")
	content := []byte(man.GetModule() + " binary")
	up, err := s.catalog.UploadArtifact(ctx)
	rig.Must(t, err)
	rig.Must(t, up.Send(&catalogv1.UploadArtifactRequest{Msg: &catalogv1.UploadArtifactRequest_Header{Header: &catalogv1.ArtifactHeader{Digest: names.Digest(content), Size: int64(len(content))}}}))
	rig.Must(t, up.Send(&catalogv1.UploadArtifactRequest{Msg: &catalogv1.UploadArtifactRequest_Chunk{Chunk: content}}))
	_, err = up.CloseAndRecv()
	rig.Must(t, err)
	_, err = s.catalog.PutEntry(ctx, &catalogv1.PutEntryRequest{Entry: e})
	rig.Must(t, err)
	_, err = s.catalog.PutBuild(ctx, &catalogv1.PutBuildRequest{Build: &catalogv1.Build{Fingerprint: e.GetFingerprint(), State: catalogv1.BuildState_BUILD_STATE_DONE,
		Artifacts: []*typev1.Artifact{{Ref: "binary:" + man.GetModule(), Digest: names.Digest(content), Size: int64(len(content))}}}})
	rig.Must(t, err)
	_, err = s.catalog.RegisterModule(ctx, &catalogv1.RegisterModuleRequest{Module: man.GetModule(), Fingerprint: e.GetFingerprint()})
	rig.Must(t, err)
	return e
}

// Cases of each service, with its state.

func (s *suite) putEntry(name string, e *catalogv1.Entry, code codes.Code, words ...string) badCase {
	return badCase{name: "catalog PutEntry " + name, code: code, words: words, state: s.catalogState,
		call: func(ctx context.Context) error {
			_, err := s.catalog.PutEntry(ctx, &catalogv1.PutEntryRequest{Entry: e})
			return err
		}}
}

func (s *suite) putBuild(name string, b *catalogv1.Build, code codes.Code, words ...string) badCase {
	return badCase{name: "catalog PutBuild " + name, code: code, words: words, state: s.catalogState,
		call: func(ctx context.Context) error {
			_, err := s.catalog.PutBuild(ctx, &catalogv1.PutBuildRequest{Build: b})
			return err
		}}
}

func (s *suite) register(name, module, fp string, code codes.Code, words ...string) badCase {
	return badCase{name: "catalog RegisterModule " + name, code: code, words: words, state: s.catalogState,
		call: func(ctx context.Context) error {
			_, err := s.catalog.RegisterModule(ctx, &catalogv1.RegisterModuleRequest{Module: module, Fingerprint: fp})
			return err
		}}
}

// upload sends an upload of msgs (header first, as given).
func (s *suite) upload(name string, msgs []*catalogv1.UploadArtifactRequest, code codes.Code, words ...string) badCase {
	return badCase{name: "catalog UploadArtifact " + name, code: code, words: words, state: s.catalogState,
		call: func(ctx context.Context) error {
			up, err := s.catalog.UploadArtifact(ctx)
			if err != nil {
				return err
			}
			for _, m := range msgs {
				if err := up.Send(m); err != nil {
					break
				}
			}
			_, err = up.CloseAndRecv()
			return err
		}}
}

func header(digest string, size int64) *catalogv1.UploadArtifactRequest {
	return &catalogv1.UploadArtifactRequest{Msg: &catalogv1.UploadArtifactRequest_Header{Header: &catalogv1.ArtifactHeader{Digest: digest, Size: size}}}
}

func chunk(b []byte) *catalogv1.UploadArtifactRequest {
	return &catalogv1.UploadArtifactRequest{Msg: &catalogv1.UploadArtifactRequest_Chunk{Chunk: b}}
}

func (s *suite) putNode(name string, spec *composerv1.NodeSpec, code codes.Code, words ...string) badCase {
	return badCase{name: "composer PutNode " + name, code: code, words: words, state: s.composerState,
		call: func(ctx context.Context) error {
			_, err := s.composer.PutNode(ctx, &composerv1.PutNodeRequest{Spec: spec})
			return err
		}}
}

// putNodeLint is putNode for a spec whose resource or account lint refuses
// (api.toStatus maps *lint.Error to INVALID_ARGUMENT naming the field).
func (s *suite) putNodeLint(name string, spec *composerv1.NodeSpec, code codes.Code, words ...string) badCase {
	return s.putNode(name, spec, code, words...)
}

func (s *suite) approve(name string, req *composerv1.ApproveRequest, code codes.Code, words ...string) badCase {
	return badCase{name: "composer Approve " + name, code: code, words: words, state: s.composerState,
		call: func(ctx context.Context) error {
			_, err := s.composer.Approve(ctx, req)
			return err
		}}
}

// compose stores a valid but hostile node spec (an operator's intent the
// composer accepts) and checks that the composer refuses to compose it:
// its pass records the error, Plan shows it, and no assignment,
// composition or object is written. The refusal is reported by Plan per
// node, not as a gRPC error: the case turns it into FAILED_PRECONDITION.
func (s *suite) compose(name string, spec func(node string) *composerv1.NodeSpec, words ...string) badCase {
	s.nodes++
	node := fmt.Sprintf("hostile-%03d", s.nodes)
	return badCase{name: "composer Plan " + name + " (" + node + ")", code: codes.FailedPrecondition, words: words, state: s.assignState,
		call: func(ctx context.Context) error {
			if _, err := s.composer.PutNode(ctx, &composerv1.PutNodeRequest{Spec: spec(node)}); err != nil {
				return fmt.Errorf("PutNode refused the spec itself: %w", err)
			}
			var last string
			for {
				st, err := s.composer.GetStatus(ctx, &composerv1.GetStatusRequest{Node: node})
				if err == nil && st.GetStatus().GetLastError() != "" {
					last = st.GetStatus().GetLastError()
					break
				}
				if err == nil && st.GetStatus().GetManifestRevision() > 0 {
					return status.Errorf(codes.Unknown, "%s was composed and assigned: %v", node, st.GetStatus())
				}
				if ctx.Err() != nil {
					return status.Errorf(codes.Unknown, "%s: no compose error within the deadline (status %v, %v)", node, st.GetStatus(), err)
				}
				time.Sleep(10 * time.Millisecond)
			}
			// Plan shows errors of rendering; signing is not planned, so a
			// refusal of the signer shows in the pass's error only.
			plan, err := s.composer.Plan(ctx, &composerv1.PlanRequest{Nodes: []string{node}})
			if err != nil {
				return err
			}
			if pe := plan.GetNodes()[0].GetError(); pe != "" && pe != last && !strings.Contains(last, pe) && !strings.Contains(pe, last) {
				last += "; plan: " + pe
			}
			return status.Error(codes.FailedPrecondition, "compose: "+last)
		}}
}

func (s *suite) signComps(name string, comps []*typev1.Composition, code codes.Code, words ...string) badCase {
	return badCase{name: "signer SignCompositions " + name, code: code, words: words, state: s.signerState,
		call: func(ctx context.Context) error {
			_, err := s.signer.SignCompositions(ctx, &signerv1.SignCompositionsRequest{FencingEpoch: s.epoch, Compositions: comps})
			return err
		}}
}

func (s *suite) signManifests(name string, items []*signerv1.ManifestItem, code codes.Code, words ...string) badCase {
	return badCase{name: "signer SignManifests " + name, code: code, words: words, state: s.signerState,
		call: func(ctx context.Context) error {
			_, err := s.signer.SignManifests(ctx, &signerv1.SignManifestsRequest{FencingEpoch: s.epoch, Manifests: items})
			return err
		}}
}

// Builders of valid things to spoil.

func ownFile(id, p string) *typev1.Resource {
	return &typev1.Resource{Id: id, Type: typev1.ResourceType_RESOURCE_TYPE_FILE, Path: p, Mode: 0o644,
		Content: &typev1.Resource_Inline{Inline: []byte("hostile\n")}}
}

func ownLink(id, p, target string) *typev1.Resource {
	return &typev1.Resource{Id: id, Type: typev1.ResourceType_RESOURCE_TYPE_SYMLINK, Path: p, Target: target}
}

func ownComposition(node string, res ...*typev1.Resource) *typev1.Composition {
	sort.Slice(res, func(i, j int) bool { return res[i].GetPath() < res[j].GetPath() })
	return &typev1.Composition{Node: node, Module: names.NodeModule, Resources: res}
}

func specWith(node string, res ...*typev1.Resource) *composerv1.NodeSpec {
	return &composerv1.NodeSpec{Node: node, Resources: res}
}

func params(kv map[string]any) *structpb.Struct {
	p, err := structpb.NewStruct(kv)
	if err != nil {
		panic(err)
	}
	return p
}

// engineRig is a node engine ("victim") whose composer is hostile: it
// holds the genuine signing key and signs whatever a case wants. The
// engine applies into a root holding an absolute symlink out of it
// (srv/abs), a relative one climbing out (srv/rel) and a file it does not
// manage (srv/unmanaged); outside is where those symlinks lead.
type engineRig struct {
	m       *rig.Mesh
	h       *rig.Hostile
	e       *rig.Engine
	admin   nodeenginev1.NodeEngineServiceClient
	outside string
	rev     uint64
	webFP   string
	state   func(t *testing.T) string
}

func newEngineRig(t *testing.T, m *rig.Mesh, webFP string) *engineRig {
	r := &engineRig{m: m, webFP: webFP}
	r.h = m.StartHostile(t, m.Trust.KeysetEnvelope)
	r.e = m.StartEngine(t, "victim", r.h.Addr)
	r.admin = nodeenginev1.NewNodeEngineServiceClient(m.Dial(t, r.e.Admin, identity.RoleOperator, "admin"))
	r.outside = filepath.Join(filepath.Dir(r.e.Root), "outside")
	rig.Must(t, os.MkdirAll(r.outside, 0o755))
	rig.Must(t, os.WriteFile(filepath.Join(r.outside, "secret"), []byte("outside the root\n"), 0o600))
	srv := filepath.Join(r.e.Root, "srv")
	rig.Must(t, os.MkdirAll(srv, 0o755))
	rig.Must(t, os.Symlink(r.outside, filepath.Join(srv, "abs")))
	rig.Must(t, os.Symlink("../../outside", filepath.Join(srv, "rel")))
	rig.Must(t, os.WriteFile(filepath.Join(srv, "unmanaged"), []byte("the operator's\n"), 0o644))
	root, outside := treeState(r.e.Root), treeState(r.outside)
	r.state = func(t *testing.T) string {
		st, err := r.admin.GetStatus(context.Background(), &nodeenginev1.GetStatusRequest{})
		if err != nil {
			t.Fatal(err)
		}
		return fmt.Sprintf("applied %d %s | root %s | outside %s", st.GetApplied().GetRevision(), st.GetApplied().GetDigest(), root(t), outside(t))
	}
	// A baseline the hostile cases must leave in place.
	err := r.offer(offer{comps: []*typev1.Composition{ownComposition("victim",
		&typev1.Resource{Id: "base:dir", Type: typev1.ResourceType_RESOURCE_TYPE_DIRECTORY, Path: "/srv/base", Mode: 0o755},
		ownFile("base:conf", "/srv/base/conf"))}})(context.Background())
	if err != nil {
		t.Fatalf("baseline: %v", err)
	}
	return r
}

// offer is one hostile manifest: its compositions (signed genuinely), the
// objects the hostile composer serves, changes to the wants before the
// manifest is signed, and the module whose outcome the case reads (the
// last composition's when empty).
type offer struct {
	comps   []*typev1.Composition
	objects map[string][]byte
	wants   func(w []*typev1.Want)
	watch   string
}

// offer signs and pushes a manifest and waits for the engine's outcome of
// the watched module at the digest the manifest names. APPLIED reads as no
// error (the case then fails: it was meant to be refused); FAILED or HELD
// reads as FAILED_PRECONDITION "<reason code>: <reason>".
func (r *engineRig) offer(o offer) func(ctx context.Context) error {
	return func(ctx context.Context) error {
		r.rev++
		var wants []*typev1.Want
		envs := map[*typev1.Want]*typev1.Envelope{}
		for _, c := range o.comps {
			env, digest, err := envelope.Seal(typev1.PayloadType_PAYLOAD_TYPE_COMPOSITION, c)
			if err != nil {
				return err
			}
			if err := envelope.SignWith(env, r.m.Trust.SigningKey); err != nil {
				return err
			}
			key, err := names.CompositionKey(c.GetNode(), c.GetModule(), c.GetFingerprint())
			if err != nil {
				return err
			}
			w := &typev1.Want{Module: c.GetModule(), Fingerprint: c.GetFingerprint(), CompositionKey: key, CompositionDigest: digest}
			if c.GetModule() != names.NodeModule {
				w.Parts = []*typev1.Artifact{{Ref: "binary:web", Digest: names.Digest([]byte("web binary")), Size: int64(len("web binary"))}}
			}
			wants = append(wants, w)
			envs[w] = env
		}
		sort.Slice(wants, func(i, j int) bool { return wants[i].GetModule() < wants[j].GetModule() })
		if o.wants != nil {
			o.wants(wants)
		}
		// The hostile composer serves each composition under the key its
		// (possibly altered) want names.
		for _, w := range wants {
			r.h.Serve(w.GetCompositionKey(), envs[w], o.objects)
		}
		watch := o.watch
		if watch == "" {
			watch = o.comps[len(o.comps)-1].GetModule()
		}
		var digest string
		for _, w := range wants {
			if w.GetModule() == watch {
				digest = w.GetCompositionDigest()
			}
		}
		now := time.Now()
		man, _, err := envelope.Seal(typev1.PayloadType_PAYLOAD_TYPE_MANIFEST, &typev1.Manifest{Node: "victim", Revision: r.rev,
			IssuedAt: timestamppb.New(now), ExpiresAt: timestamppb.New(now.Add(time.Hour)), KeysetVersion: 1, Wants: wants})
		if err != nil {
			return err
		}
		if err := envelope.SignWith(man, r.m.Trust.SigningKey); err != nil {
			return err
		}
		r.h.Push(man)
		for {
			st, err := r.admin.GetStatus(ctx, &nodeenginev1.GetStatusRequest{})
			if err == nil {
				for _, h := range st.GetHaves() {
					a := h.GetAttempt()
					if h.GetModule() != watch || a.GetDigest() != digest {
						continue
					}
					switch a.GetState() {
					case composerv1.AttemptState_ATTEMPT_STATE_APPLIED:
						if h.GetApplied().GetDigest() == digest {
							return nil
						}
					case composerv1.AttemptState_ATTEMPT_STATE_FAILED, composerv1.AttemptState_ATTEMPT_STATE_HELD:
						return status.Errorf(codes.FailedPrecondition, "%v: %s", a.GetReasonCode(), a.GetReason())
					}
				}
			}
			if ctx.Err() != nil {
				return status.Errorf(codes.Unknown, "no outcome of revision %d for %s: %v", r.rev, watch, err)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
}

// hostileOwn is an engine case: the node's own composition holds res.
func (r *engineRig) hostileOwn(name string, res []*typev1.Resource, words ...string) badCase {
	return r.hostile(name, offer{comps: []*typev1.Composition{ownComposition("victim", res...)}}, words...)
}

func (r *engineRig) hostile(name string, o offer, words ...string) badCase {
	return badCase{name: "engine " + name, code: codes.FailedPrecondition, words: words, state: r.state, call: r.offer(o)}
}

func TestBadInput(t *testing.T) {
	s := newSuite(t)
	// The checker sees what it must: a request that is accepted, and one
	// that changes state, are each reported (the property deliberately
	// broken once per kind of state).
	t.Run("the checker catches acceptance and change", func(t *testing.T) {
		for _, c := range []badCase{
			s.putNode("a valid spec", &composerv1.NodeSpec{Node: "checker"}, codes.InvalidArgument),
			s.putEntry("a valid entry", entryOf(moduleManifest("checker"), "https://git.example/checker"), codes.InvalidArgument),
			s.signComps("a valid composition", []*typev1.Composition{ownComposition("checker", ownFile("c:c", "/etc/checker"))}, codes.InvalidArgument),
			s.engine.hostileOwn("a valid composition", []*typev1.Resource{ownFile("c:c", "/srv/checker")}),
		} {
			problems := checkCase(t, c)
			if len(problems) < 2 || !strings.Contains(strings.Join(problems, " "), "changed state") {
				t.Errorf("%s: the checker reports %q, want a wrong outcome and a change of state", c.name, problems)
			}
		}
	})
	runClass(t, "malformed protobuf", "raw bytes that do not decode, sent with a raw codec, are refused by the server's decoding before any handler; nothing stored", malformedCases(t, s))
	runClass(t, "unknown enum values", "enum numbers no version defines are refused, naming the field", unknownEnumCases(t, s))
	runClass(t, "unknown fields", "fields this build does not know are refused where they would be stored or signed", unknownFieldCases(t, s))
	runClass(t, "oversized messages", "messages over the gRPC limit and values over each explicit limit are refused, naming the limit", oversizedCases(t, s))
	runClass(t, "oversized composition", "a composition over 256 KiB or 4096 resources is refused by composer, signer and engine", oversizedCompositionCases(t, s))
	runClass(t, "path traversal", "paths with .. are refused everywhere a path enters: specs, manifests, rendered params, signing, the engine", traversalCases(t, s))
	runClass(t, "absolute-path tricks", "relative, unclean, NUL, overlong and out-of-prefix paths are refused; prefix lookalikes do not match", absolutePathCases(t, s))
	runClass(t, "symlink escapes", "symlink targets and paths through symlinks that leave the prefixes are refused; nothing outside the root changes", symlinkCases(t, s))
	runClass(t, "invalid names", "node, module, label, owner, account and artifact names that are not valid are refused, naming the field", invalidNameCases(t, s))
	runClass(t, "wrong fingerprint", "fingerprints that are malformed, unknown, of another module or not the want's are refused", wrongFingerprintCases(t, s))
	runClass(t, "digest mismatch", "bytes whose digest or size is not the declared one are refused and never stored or applied", digestMismatchCases(t, s))
	runClass(t, "template injection", "templates reading outside .Node/.Facts/.Params, calling templates, looping or growing without bound are refused at put time", templateInjectionCases(t, s))
	runClass(t, "duplicate resources", "two resources on one path (or one name) are refused, naming both", duplicateCases(t, s))

	t.Run("known bugs", func(t *testing.T) {
		knownBugsMu.Lock()
		defer knownBugsMu.Unlock()
		for bug, cases := range knownBugs {
			t.Errorf("BUG %s: %d cases refused with the wrong code (refused and nothing changed, but not as DESIGN.md says), e.g.\n%s",
				bug, len(cases), strings.Join(cases[:min(len(cases), 5)], "\n"))
		}
		for bug, n := range bugsFixed {
			t.Logf("%d cases marked with the bug %q are now refused as they should be: remove the marker", n, bug)
		}
	})

	talliesMu.Lock()
	defer talliesMu.Unlock()
	var lines []string
	total, refused, wrong := 0, 0, 0
	for _, tl := range tallies {
		lines = append(lines, fmt.Sprintf("| %s | %d | %d | %d | %d |", tl.class, tl.cases, tl.refused, tl.wrongCode, tl.cases-tl.refused))
		total += tl.cases
		refused += tl.refused
		wrong += tl.wrongCode
	}
	t.Logf("bad input through the real services:\n| class | cases | refused, nothing changed | of them with a known bug's wrong code | violations |\n|---|---|---|---|---|\n%s\n| all %d classes | %d | %d | %d | %d |",
		strings.Join(lines, "\n"), len(tallies), total, refused, wrong, total-refused)
}

// labels returns n generated bad DNS labels.
func badLabels() []string {
	return []string{"", "UPPER", "-lead", "trail-", "under_score", "dot.ted", "sp ace", strings.Repeat("a", 64), "é", "../x", "a\x00b", "a/b", "tab\t"}
}
