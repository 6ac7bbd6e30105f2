package lint

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"mesh.dev/internal/canonical"
	"mesh.dev/internal/names"
	catalogv1 "mesh.dev/proto/mesh/catalog/v1"
	typev1 "mesh.dev/proto/mesh/type/v1"
)

// entryOf builds a consistent entry of m: canonical manifest bytes, their
// digest, the manifest's needs, its artifacts and the fingerprint.
func entryOf(t testing.TB, m *typev1.ModuleManifest) *catalogv1.Entry {
	t.Helper()
	b, err := canonical.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	e := &catalogv1.Entry{
		Module: m.GetModule(), Repository: "https://git.example/infra.git", Path: "modules/sshd",
		SourceDigest: names.Digest([]byte("source")), Commit: strings.Repeat("ab", 20),
		Manifest: b, ManifestDigest: names.Digest(b), Needs: m.GetNeeds(),
		Packages: []string{"openssh-server"}, Verdict: catalogv1.Verdict_VERDICT_PASS,
	}
	for _, ref := range ArtifactRefs(m) {
		kind, _, _ := strings.Cut(ref, ":")
		e.Artifacts = append(e.Artifacts, &catalogv1.ArtifactDecl{Ref: ref, Kind: kind})
	}
	refingerprint(e)
	return e
}

func refingerprint(e *catalogv1.Entry) {
	e.Fingerprint = names.ComputeFingerprint(e.GetModule(), e.GetRepository(), e.GetPath(), e.GetSourceDigest(), e.GetManifestDigest())
}

// remanifest replaces the entry's manifest and keeps digest and fingerprint
// consistent, so that only the manifest's own problem shows.
func remanifest(t testing.TB, e *catalogv1.Entry, mutate func(m *typev1.ModuleManifest)) {
	t.Helper()
	m := goodManifest()
	mutate(m)
	b, err := canonical.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	e.Manifest, e.ManifestDigest, e.Needs = b, names.Digest(b), m.GetNeeds()
	refingerprint(e)
}

func mustDecode(t testing.TB, b []byte) *typev1.ModuleManifest {
	t.Helper()
	m := &typev1.ModuleManifest{}
	if err := canonical.Decode(b, m); err != nil {
		t.Fatal(err)
	}
	return m
}

func TestCheckEntry(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name   string
		mutate func(t testing.TB, e *catalogv1.Entry)
		field  string
		msg    string
	}{
		{"good", func(testing.TB, *catalogv1.Entry) {}, "", ""},
		{"no commit", func(_ testing.TB, e *catalogv1.Entry) { e.Commit = "" }, "", ""},
		{"sha256 commit", func(_ testing.TB, e *catalogv1.Entry) { e.Commit = strings.Repeat("c", 64) }, "", ""},
		{"warn with warnings", func(_ testing.TB, e *catalogv1.Entry) {
			e.Verdict, e.Warnings = catalogv1.Verdict_VERDICT_WARN, []string{"mode 0666 is world-writable"}
		}, "", ""},
		{"fail with problems", func(_ testing.TB, e *catalogv1.Entry) {
			e.Verdict, e.Problems = catalogv1.Verdict_VERDICT_FAIL, []string{"sshd -t failed"}
		}, "", ""},
		{"repository root path", func(_ testing.TB, e *catalogv1.Entry) { e.Path = "."; refingerprint(e) }, "", ""},

		{"bad fingerprint", func(_ testing.TB, e *catalogv1.Entry) { e.Fingerprint = "fp1:xyz" }, "entry.fingerprint", `entry.fingerprint "fp1:xyz" is not a fingerprint`},
		{"fingerprint mismatch", func(_ testing.TB, e *catalogv1.Entry) {
			e.Fingerprint = names.FingerprintPrefix + strings.Repeat("0", 64)
		}, "entry.fingerprint",
			"entry.fingerprint: fp1:0000000000000000000000000000000000000000000000000000000000000000 does not match fp1:"},
		{"fingerprint of another repository", func(_ testing.TB, e *catalogv1.Entry) { e.Repository = "https://git.example/other.git" }, "entry.fingerprint", "the fingerprint of module, repository, path, source_digest and manifest_digest"},
		{"bad module", func(_ testing.TB, e *catalogv1.Entry) { e.Module = "ssh_d" }, "entry.module", `entry.module: module "ssh_d" is not a DNS label`},
		{"no repository", func(_ testing.TB, e *catalogv1.Entry) { e.Repository = "" }, "entry.repository", "must be 1 to 1024 bytes"},
		{"repository with space", func(_ testing.TB, e *catalogv1.Entry) { e.Repository = "git example" }, "entry.repository", "holds a space"},
		{"repository too long", func(_ testing.TB, e *catalogv1.Entry) {
			e.Repository = "https://git.example/" + strings.Repeat("r", MaxRepositoryLen)
		}, "entry.repository", "must be 1 to 1024 bytes"},
		{"repository not UTF-8", func(_ testing.TB, e *catalogv1.Entry) { e.Repository = "https://git.example/\xff" }, "entry.repository", "entry.repository: is not valid UTF-8"},
		{"repository with control character", func(_ testing.TB, e *catalogv1.Entry) { e.Repository = "git.example/\x7finfra" }, "entry.repository", `"git.example/\x7finfra" holds a space or control character`},
		{"path too long", func(_ testing.TB, e *catalogv1.Entry) { e.Path = strings.Repeat("p", MaxSourcePathLen+1) }, "entry.path", "entry.path: is 1025 bytes, over the limit of 1024"},
		{"path not UTF-8", func(_ testing.TB, e *catalogv1.Entry) { e.Path = "modules/\xff" }, "entry.path", "entry.path: is not valid UTF-8"},
		{"path with control character", func(_ testing.TB, e *catalogv1.Entry) { e.Path = "modules/ss\x01hd" }, "entry.path", `"modules/ss\x01hd" holds a control character or backslash`},
		{"path with backslash", func(_ testing.TB, e *catalogv1.Entry) { e.Path = `modules\sshd` }, "entry.path", `"modules\\sshd" holds a control character or backslash`},
		{"no path", func(_ testing.TB, e *catalogv1.Entry) { e.Path = "" }, "entry.path", "is required"},
		{"absolute path", func(_ testing.TB, e *catalogv1.Entry) { e.Path = "/modules/sshd" }, "entry.path", "is absolute"},
		{"unclean path", func(_ testing.TB, e *catalogv1.Entry) { e.Path = "modules//sshd" }, "entry.path", `is not clean (want "modules/sshd")`},
		{"path leaving the repository", func(_ testing.TB, e *catalogv1.Entry) { e.Path = "../sshd" }, "entry.path", "leaves the repository"},
		{"bad source digest", func(_ testing.TB, e *catalogv1.Entry) { e.SourceDigest = "md5:00" }, "entry.source_digest", `entry.source_digest "md5:00" is not a digest`},
		{"short commit", func(_ testing.TB, e *catalogv1.Entry) { e.Commit = "abc1234" }, "entry.commit", "is not a full commit id"},
		{"no manifest", func(_ testing.TB, e *catalogv1.Entry) { e.Manifest = nil }, "entry.manifest", "is required"},
		{"manifest not a manifest", func(_ testing.TB, e *catalogv1.Entry) { e.Manifest = []byte{0xff, 0xff} }, "entry.manifest", "decode mesh.type.v1.ModuleManifest"},
		{"manifest with unknown field", func(_ testing.TB, e *catalogv1.Entry) {
			e.Manifest = protowire.AppendVarint(protowire.AppendTag(e.Manifest, 99, protowire.VarintType), 1)
		}, "entry.manifest", "fields this build does not know"},
		{"manifest not canonical", func(t testing.TB, e *catalogv1.Entry) {
			// The same fields in another order decode to the same manifest.
			m := goodManifest()
			head, _ := proto.Marshal(&typev1.ModuleManifest{Version: m.Version})
			rest := proto.Clone(m).(*typev1.ModuleManifest)
			rest.Version = ""
			tail, _ := canonical.Marshal(rest)
			e.Manifest = append(head, tail...)
		}, "entry.manifest", "is not canonical"},
		{"manifest too large", func(_ testing.TB, e *catalogv1.Entry) { e.Manifest = make([]byte, MaxManifestSize+1) }, "entry.manifest", "over the limit of 524288"},
		{"manifest invalid", func(t testing.TB, e *catalogv1.Entry) {
			remanifest(t, e, func(m *typev1.ModuleManifest) { m.Resources[1].Path = "etc/ssh" })
		}, "entry.manifest.resources[1].path", `entry.manifest.resources[1].path "etc/ssh" is not absolute`},
		{"manifest of another module", func(t testing.TB, e *catalogv1.Entry) {
			remanifest(t, e, func(m *typev1.ModuleManifest) { m.Module = "motd"; m.Needs = nil })
		}, "entry.manifest.module", `"motd" is not the entry's module "sshd"`},
		{"manifest digest wrong", func(_ testing.TB, e *catalogv1.Entry) { e.ManifestDigest = names.Digest([]byte("x")); refingerprint(e) }, "entry.manifest_digest", "is not the digest of entry.manifest"},
		{"needs missing", func(_ testing.TB, e *catalogv1.Entry) { e.Needs = nil }, "entry.needs", "0 needs, the manifest declares 1"},
		{"needs differ", func(_ testing.TB, e *catalogv1.Entry) { e.Needs = []*typev1.Need{{Module: "users"}} }, "entry.needs[0]", "differs from the manifest's needs[0]"},
		{"empty package", func(_ testing.TB, e *catalogv1.Entry) { e.Packages = []string{""} }, "entry.packages[0]", "must be 1 to 128 bytes"},
		{"package repeated", func(_ testing.TB, e *catalogv1.Entry) { e.Packages = []string{"a", "a"} }, "entry.packages[1]", `"a" repeats entry.packages[0]`},
		{"too many packages", func(_ testing.TB, e *catalogv1.Entry) {
			e.Packages = nil
			for i := range MaxPackages + 1 {
				e.Packages = append(e.Packages, fmt.Sprintf("pkg-%d", i))
			}
		}, "entry.packages", "entry.packages: 257 packages, over the limit of 256"},
		{"package too long", func(_ testing.TB, e *catalogv1.Entry) {
			e.Packages = []string{"openssh-server", strings.Repeat("p", MaxPackageLen+1)}
		}, "entry.packages[1]", "entry.packages[1]: must be 1 to 128 bytes of UTF-8"},
		{"package not UTF-8", func(_ testing.TB, e *catalogv1.Entry) { e.Packages = []string{"openssh-\xff"} }, "entry.packages[0]", "must be 1 to 128 bytes of UTF-8"},
		{"package with a space", func(_ testing.TB, e *catalogv1.Entry) { e.Packages = []string{"openssh server"} }, "entry.packages[0]", `entry.packages[0]: "openssh server" holds a space or control character`},
		{"package with a control character", func(_ testing.TB, e *catalogv1.Entry) { e.Packages = []string{"openssh\tserver"} }, "entry.packages[0]", "holds a space or control character"},
		{"no verdict", func(_ testing.TB, e *catalogv1.Entry) { e.Verdict = 0 }, "entry.verdict", "is not PASS, WARN or FAIL"},
		{"pass with problems", func(_ testing.TB, e *catalogv1.Entry) { e.Problems = []string{"broken"} }, "entry.verdict", "PASS with 1 problems"},
		{"warn without warnings", func(_ testing.TB, e *catalogv1.Entry) { e.Verdict = catalogv1.Verdict_VERDICT_WARN }, "entry.verdict", "WARN with no warnings"},
		{"warn with problems", func(_ testing.TB, e *catalogv1.Entry) {
			e.Verdict, e.Problems = catalogv1.Verdict_VERDICT_WARN, []string{"broken"}
		}, "entry.verdict", "WARN with 1 problems (want FAIL)"},
		{"fail without problems", func(_ testing.TB, e *catalogv1.Entry) { e.Verdict = catalogv1.Verdict_VERDICT_FAIL }, "entry.verdict", "FAIL names no problems"},
		{"blank warning", func(_ testing.TB, e *catalogv1.Entry) {
			e.Verdict, e.Warnings = catalogv1.Verdict_VERDICT_WARN, []string{" "}
		}, "entry.warnings[0]", "is empty"},
		{"problem with control character", func(_ testing.TB, e *catalogv1.Entry) {
			e.Verdict, e.Problems = catalogv1.Verdict_VERDICT_FAIL, []string{"a\x1bb"}
		}, "entry.problems[0]", "holds the control character U+001B"},
		{"too many warnings", func(_ testing.TB, e *catalogv1.Entry) {
			e.Verdict = catalogv1.Verdict_VERDICT_WARN
			for i := range MaxVerdictInputs + 1 {
				e.Warnings = append(e.Warnings, fmt.Sprintf("warning %d", i))
			}
		}, "entry.warnings", "entry.warnings: 257 items, over the limit of 256"},
		{"too many problems", func(_ testing.TB, e *catalogv1.Entry) {
			e.Verdict = catalogv1.Verdict_VERDICT_FAIL
			for i := range MaxVerdictInputs + 1 {
				e.Problems = append(e.Problems, fmt.Sprintf("problem %d", i))
			}
		}, "entry.problems", "entry.problems: 257 items, over the limit of 256"},
		{"too many unknown", func(_ testing.TB, e *catalogv1.Entry) {
			e.Verdict = catalogv1.Verdict_VERDICT_WARN
			for i := range MaxVerdictInputs + 1 {
				e.Unknown = append(e.Unknown, fmt.Sprintf("unknown %d", i))
			}
		}, "entry.unknown", "entry.unknown: 257 items, over the limit of 256"},
		{"warning too long", func(_ testing.TB, e *catalogv1.Entry) {
			e.Verdict, e.Warnings = catalogv1.Verdict_VERDICT_WARN, []string{"ok", strings.Repeat("w", MaxVerdictInputLen+1)}
		}, "entry.warnings[1]", "entry.warnings[1]: is 1025 bytes, over the limit of 1024"},
		{"unknown not UTF-8", func(_ testing.TB, e *catalogv1.Entry) {
			e.Verdict, e.Unknown = catalogv1.Verdict_VERDICT_WARN, []string{"\xffsshd -t"}
		}, "entry.unknown[0]", "entry.unknown[0]: is not valid UTF-8"},
		{"too many artifacts", func(t testing.TB, e *catalogv1.Entry) {
			e.Artifacts = nil
			remanifest(t, e, func(m *typev1.ModuleManifest) {
				for i := range MaxParts + 1 {
					ref := fmt.Sprintf("binary:tool-%03d", i)
					m.Resources = append(m.Resources, &typev1.ResourceTemplate{Name: fmt.Sprintf("tool-%03d", i), Type: typev1.ResourceType_RESOURCE_TYPE_FILE,
						Path: fmt.Sprintf("/usr/local/bin/tool-%03d", i), Mode: 0o755, Content: &typev1.ResourceTemplate_Artifact{Artifact: ref}})
				}
			})
			for _, ref := range ArtifactRefs(mustDecode(t, e.GetManifest())) {
				e.Artifacts = append(e.Artifacts, &catalogv1.ArtifactDecl{Ref: ref, Kind: "binary"})
			}
		}, "entry.artifacts", "entry.artifacts: 66 artifacts, over the limit of 64"},
		{"artifact not declared", func(_ testing.TB, e *catalogv1.Entry) { e.Artifacts = nil }, "entry.artifacts", `the manifest names artifact "binary:sshd-helper", which the entry does not declare`},
		{"artifact named by no resource", func(_ testing.TB, e *catalogv1.Entry) {
			e.Artifacts = append(e.Artifacts, &catalogv1.ArtifactDecl{Ref: "tarball:docs", Kind: "tarball"})
		}, "entry.artifacts[1].ref", `"tarball:docs" is named by no resource of the manifest`},
		{"artifacts unsorted", func(_ testing.TB, e *catalogv1.Entry) {
			e.Artifacts = append(e.Artifacts, &catalogv1.ArtifactDecl{Ref: "binary:a", Kind: "binary"})
		}, "entry.artifacts[1].ref", "is not sorted and unique"},
		{"artifact kind wrong", func(_ testing.TB, e *catalogv1.Entry) { e.Artifacts[0].Kind = "tarball" }, "entry.artifacts[0].kind", `"tarball" is not the kind of ref "binary:sshd-helper"`},
		{"artifact bad ref", func(_ testing.TB, e *catalogv1.Entry) { e.Artifacts[0].Ref = "binary" }, "entry.artifacts[0].ref", "is not kind:name"},
		{"entry too large", func(_ testing.TB, e *catalogv1.Entry) {
			e.Verdict, e.Packages = catalogv1.Verdict_VERDICT_WARN, nil
			for i := 0; i < MaxVerdictInputs; i++ {
				e.Warnings = append(e.Warnings, strings.Repeat("w", MaxVerdictInputLen))
			}
			for i := 0; i < MaxVerdictInputs; i++ {
				e.Unknown = append(e.Unknown, strings.Repeat("u", MaxVerdictInputLen))
			}
			for i := 0; i < MaxVerdictInputs; i++ {
				e.Packages = append(e.Packages, strings.Repeat("p", MaxPackageLen-4)+string(rune('a'+i%26))+string(rune('a'+i/26)))
			}
			remanifest(t, e, func(m *typev1.ModuleManifest) {
				m.Resources[2].Content = &typev1.ResourceTemplate_Raw{Raw: make([]byte, MaxManifestSize-4096)}
			})
		}, "entry", "bytes encoded, over the limit of 1048576"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			e := entryOf(t, goodManifest())
			c.mutate(t, e)
			m, err := CheckEntry(e)
			if c.field == "" {
				if err != nil {
					t.Fatalf("CheckEntry: %v", err)
				}
				if m.GetModule() != e.GetModule() {
					t.Fatalf("CheckEntry returned manifest of %q", m.GetModule())
				}
				return
			}
			var le *Error
			if !errors.As(err, &le) || le.Field != c.field {
				t.Fatalf("CheckEntry = %v, want an error on field %q", err, c.field)
			}
			if !strings.HasPrefix(err.Error(), c.field) || !strings.Contains(err.Error(), c.msg) {
				t.Fatalf("error %q does not start with %q and say %q", err, c.field, c.msg)
			}
		})
	}
}

func TestCheckBuildArtifacts(t *testing.T) {
	t.Parallel()
	d := names.Digest([]byte("x"))
	good := func() []*typev1.Artifact {
		return []*typev1.Artifact{{Ref: "binary:a", Digest: d, Size: 1}, {Ref: "binary:b", Digest: d, Size: 1}}
	}
	if err := CheckBuildArtifacts("build.artifacts", good()); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name   string
		mutate func(a []*typev1.Artifact)
		field  string
		msg    string
	}{
		{"unsorted", func(a []*typev1.Artifact) { a[0], a[1] = a[1], a[0] }, "build.artifacts[1].ref", "is not sorted and unique"},
		{"bad ref", func(a []*typev1.Artifact) { a[0].Ref = ":a" }, "build.artifacts[0].ref", "is not kind:name"},
		{"bad digest", func(a []*typev1.Artifact) { a[1].Digest = "sha256:" }, "build.artifacts[1].digest", "is not a digest"},
		{"negative size", func(a []*typev1.Artifact) { a[1].Size = -1 }, "build.artifacts[1].size", "-1 is outside 0..1073741824"},
		{"over the size limit", func(a []*typev1.Artifact) { a[1].Size = MaxArtifactSize + 1 }, "build.artifacts[1].size", "is outside"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			a := good()
			c.mutate(a)
			err := CheckBuildArtifacts("build.artifacts", a)
			var le *Error
			if !errors.As(err, &le) || le.Field != c.field || !strings.Contains(err.Error(), c.msg) {
				t.Fatalf("CheckBuildArtifacts = %v, want field %q saying %q", err, c.field, c.msg)
			}
		})
	}
}
