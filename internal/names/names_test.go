package names

import (
	"errors"
	"strings"
	"testing"
)

var (
	hex64 = strings.Repeat("ab", 32)
	fp    = FingerprintPrefix + hex64
)

func TestCheckNodeAndModule(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name, in      string
		nodeOK, modOK bool
	}{
		{"simple", "ace", true, true},
		{"digits and dash", "web-01", true, true},
		{"single char", "a", true, true},
		{"max length", strings.Repeat("a", 63), true, true},
		{"too long", strings.Repeat("a", 64), false, false},
		{"empty", "", false, false},
		{"upper case", "Ace", false, false},
		{"leading dash", "-ace", false, false},
		{"trailing dash", "ace-", false, false},
		{"dot", "a.b", false, false},
		{"underscore", "a_b", false, false},
		{"reserved node", "node", true, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			if err := CheckNode(c.in); (err == nil) != c.nodeOK {
				t.Errorf("CheckNode(%q) = %v, want ok=%v", c.in, err, c.nodeOK)
			}
			err := CheckModule(c.in)
			if (err == nil) != c.modOK {
				t.Errorf("CheckModule(%q) = %v, want ok=%v", c.in, err, c.modOK)
			}
			if err != nil && !errors.Is(err, ErrInvalid) {
				t.Errorf("CheckModule(%q) error %v does not wrap ErrInvalid", c.in, err)
			}
		})
	}
	if err := CheckModule("node"); err == nil || !strings.Contains(err.Error(), "reserved") {
		t.Errorf("CheckModule(node) = %v, want reserved", err)
	}
}

func TestHasFingerprint(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name string
		in   string
		want bool
	}{
		{"valid", fp, true},
		{"no prefix", hex64, false},
		{"upper hex", FingerprintPrefix + strings.ToUpper(hex64), false},
		{"short", FingerprintPrefix + hex64[:63], false},
		{"long", fp + "a", false},
		{"other prefix", "fp2:" + hex64, false},
		{"digest", DigestPrefix + hex64, false},
		{"empty", "", false},
		{"non hex", FingerprintPrefix + strings.Repeat("g", 64), false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			if got := HasFingerprint(c.in); got != c.want {
				t.Errorf("HasFingerprint(%q) = %v, want %v", c.in, got, c.want)
			}
			if got := FingerprintHex(c.in); (got != "") != c.want {
				t.Errorf("FingerprintHex(%q) = %q", c.in, got)
			}
		})
	}
	if FingerprintFromHex(hex64) != fp || FingerprintFromHex("zz") != "" {
		t.Error("FingerprintFromHex does not invert FingerprintHex")
	}
}

func TestDigest(t *testing.T) {
	t.Parallel()
	d := Digest([]byte("abc"))
	if d != "sha256:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad" {
		t.Fatalf("Digest(abc) = %s", d)
	}
	if !ValidDigest(d) || ValidDigest(strings.ToUpper(d)) || ValidDigest(d[7:]) || ValidDigest(fp) {
		t.Error("ValidDigest accepts or refuses the wrong strings")
	}
	b, err := DigestBytes(d)
	if err != nil || len(b) != 32 {
		t.Fatalf("DigestBytes = %x, %v", b, err)
	}
	if err := CheckDigest("object", "sha256:xyz"); err == nil || !strings.Contains(err.Error(), "object") {
		t.Errorf("CheckDigest does not name the field: %v", err)
	}
}

func TestComputeFingerprint(t *testing.T) {
	t.Parallel()
	base := ComputeFingerprint("sshd", "git.example/infra", "modules/sshd", Digest([]byte("src")), Digest([]byte("man")))
	if !HasFingerprint(base) {
		t.Fatalf("ComputeFingerprint = %q is not a fingerprint", base)
	}
	// Moving bytes between fields must change the fingerprint (len-prefixing).
	shifted := ComputeFingerprint("ssh", "dgit.example/infra", "modules/sshd", Digest([]byte("src")), Digest([]byte("man")))
	if shifted == base {
		t.Error("fields are not length-prefixed: shifting a byte kept the fingerprint")
	}
	for i, other := range []string{
		ComputeFingerprint("sshd", "git.example/infra", "modules/sshd", Digest([]byte("src2")), Digest([]byte("man"))),
		ComputeFingerprint("sshd", "git.example/infra", "modules/sshd", Digest([]byte("src")), Digest([]byte("man2"))),
		ComputeFingerprint("sshd", "git.example/other", "modules/sshd", Digest([]byte("src")), Digest([]byte("man"))),
	} {
		if other == base {
			t.Errorf("case %d: a changed input kept the fingerprint", i)
		}
	}
	if again := ComputeFingerprint("sshd", "git.example/infra", "modules/sshd", Digest([]byte("src")), Digest([]byte("man"))); again != base {
		t.Error("ComputeFingerprint is not deterministic")
	}
}

func TestComputeSourceDigest(t *testing.T) {
	t.Parallel()
	a := SourceFile{Path: "a.conf", Mode: 0o644, Digest: Digest([]byte("a"))}
	b := SourceFile{Path: "b.conf", Mode: 0o644, Digest: Digest([]byte("b"))}
	d1, err := ComputeSourceDigest([]SourceFile{a, b})
	if err != nil {
		t.Fatal(err)
	}
	b2 := b
	b2.Mode = 0o755
	d2, _ := ComputeSourceDigest([]SourceFile{a, b2})
	if d1 == d2 {
		t.Error("a mode change kept the source digest")
	}
	if _, err := ComputeSourceDigest([]SourceFile{b, a}); err == nil {
		t.Error("unsorted files accepted")
	}
	if _, err := ComputeSourceDigest([]SourceFile{a, a}); err == nil {
		t.Error("duplicate files accepted")
	}
	empty, err := ComputeSourceDigest(nil)
	if err != nil || empty != Digest(nil) {
		t.Errorf("empty source digest = %q, %v", empty, err)
	}
}

// TestKnownAnswers pins the fingerprint and the source digest of fixed
// inputs to values computed apart from this code (python3 hashlib, following
// DESIGN.md §3): every length prefix is 8 bytes big-endian, a file's mode is
// its 4 bytes big-endian (itself length-prefixed), a content digest enters as
// its "sha256:<hex>" text, and files are sorted by the bytes of their path.
// Engines and catalogs built from other trees must agree on these bytes.
//
//	import hashlib, struct
//	lp = lambda *fs: b"".join(struct.pack(">Q", len(f)) + f for f in fs)
//	dig = lambda b: "sha256:" + hashlib.sha256(b).hexdigest()
//	files = sorted([("sshd_config", 0o644, b"Port 22\nPermitRootLogin no\n"),
//	                ("bin/helper", 0o755, b"#!/bin/sh\nexec sshd -t\n"),
//	                ("module.yaml", 0o644, b"module: sshd\n")], key=lambda f: f[0].encode())
//	src = "sha256:" + hashlib.sha256(b"".join(lp(p.encode(), struct.pack(">I", m), dig(c).encode()) for p, m, c in files)).hexdigest()
//	man = dig(b"manifest bytes")
//	fp = "fp1:" + hashlib.sha256(lp(b"sshd", b"https://git.example/infra.git", b"modules/sshd", src.encode(), man.encode())).hexdigest()
func TestKnownAnswers(t *testing.T) {
	t.Parallel()
	const (
		wantSource   = "sha256:aa293cb28c32ffba1f81424373595f446bbcfd2970c3e1d27cecd892d131dec2"
		wantManifest = "sha256:66444334cfc47d81840f88c1e690564d3c130e9237482a58d7631124e9b9a815"
		wantFP       = "fp1:b63d767ab6ef04b63fccf5cc76adb9ac8773518fab5de74126eac1d9a028ce43"
	)
	files := []SourceFile{
		{Path: "bin/helper", Mode: 0o755, Digest: Digest([]byte("#!/bin/sh\nexec sshd -t\n"))},
		{Path: "module.yaml", Mode: 0o644, Digest: Digest([]byte("module: sshd\n"))},
		{Path: "sshd_config", Mode: 0o644, Digest: Digest([]byte("Port 22\nPermitRootLogin no\n"))},
	}
	for _, c := range []struct{ name, got, want string }{
		{"bin/helper", files[0].Digest, "sha256:728f0ada6dea64557c85b78bca3d38230c2b7fcf90b0d10cf699e473e26bcf07"},
		{"module.yaml", files[1].Digest, "sha256:f45fcdc79c8262980830ee65bb16c39709f1af03dd983dd729d9c25e0e4a1ac2"},
		{"sshd_config", files[2].Digest, "sha256:21f261d76ad5b2ec1f58b5650caf2ed93775f928c7fe428b31ccc3b7b41d463c"},
	} {
		if c.got != c.want {
			t.Errorf("content digest of %s = %s, want %s", c.name, c.got, c.want)
		}
	}
	src, err := ComputeSourceDigest(files)
	if err != nil {
		t.Fatal(err)
	}
	if src != wantSource {
		t.Errorf("ComputeSourceDigest = %s, want %s", src, wantSource)
	}
	if empty, _ := ComputeSourceDigest(nil); empty != "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855" {
		t.Errorf("source digest of no files = %s, want the digest of no bytes", empty)
	}
	man := Digest([]byte("manifest bytes"))
	if man != wantManifest {
		t.Fatalf("Digest(manifest bytes) = %s, want %s", man, wantManifest)
	}
	// The fixed source digest, not src: a wrong source digest must not also
	// move the fingerprint's answer.
	if fp := ComputeFingerprint("sshd", "https://git.example/infra.git", "modules/sshd", wantSource, wantManifest); fp != wantFP {
		t.Errorf("ComputeFingerprint = %s, want %s", fp, wantFP)
	}
}

func TestCompositionKey(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name             string
		node, module, fp string
		want             string
		wantErr          string
	}{
		{"module", "ace", "sshd", fp, "ace.sshd." + hex64, ""},
		{"node own ignores fp", "ace", "node", fp, "ace.node", ""},
		{"node own", "ace", "node", "", "ace.node", ""},
		{"bad node", "Ace", "sshd", fp, "", "node"},
		{"bad module", "ace", "ss_hd", fp, "", "module"},
		{"no fingerprint", "ace", "sshd", "", "", "fingerprint"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			got, err := CompositionKey(c.node, c.module, c.fp)
			if c.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), c.wantErr) {
					t.Fatalf("CompositionKey error = %v, want one naming %q", err, c.wantErr)
				}
				return
			}
			if err != nil || got != c.want {
				t.Fatalf("CompositionKey = %q, %v; want %q", got, err, c.want)
			}
			k, err := ParseCompositionKey(got)
			if err != nil {
				t.Fatalf("ParseCompositionKey(%q): %v", got, err)
			}
			if k.String() != got || k.Node != c.node {
				t.Errorf("round trip %q → %+v → %q", got, k, k.String())
			}
		})
	}
}

func TestParseCompositionKeyRefuses(t *testing.T) {
	t.Parallel()
	for _, key := range []string{
		"", "ace", "ace.", ".node", "ace.sshd", "ace.sshd." + hex64[:10], "ace.sshd." + strings.ToUpper(hex64),
		"ace.node." + hex64, "ace.sshd." + hex64 + ".x", "a_ce.node", "ace.nodes",
	} {
		if k, err := ParseCompositionKey(key); err == nil {
			t.Errorf("ParseCompositionKey(%q) = %+v, want an error", key, k)
		}
	}
}

func TestModuleOfID(t *testing.T) {
	t.Parallel()
	cases := map[string]string{"sshd:config": "sshd", "net:a:b": "net", "plain": "", ":x": ""}
	for id, want := range cases {
		if got := ModuleOfID(id); got != want {
			t.Errorf("ModuleOfID(%q) = %q, want %q", id, got, want)
		}
	}
	if err := CheckResourceID("sshd:config"); err != nil {
		t.Error(err)
	}
	for _, bad := range []string{"sshd", "SSHD:x", "sshd:", "sshd:a b", "sshd:a:b"} {
		if CheckResourceID(bad) == nil {
			t.Errorf("CheckResourceID(%q) accepted", bad)
		}
	}
}

func TestCheckPath(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name, in, want string
	}{
		{"ok", "/etc/ssh/sshd_config", ""},
		{"root", "/", ""},
		{"empty", "", "is empty"},
		{"relative", "etc/x", "not absolute"},
		{"dotdot", "/etc/../x", "not clean"},
		{"trailing slash", "/etc/", "not clean"},
		{"double slash", "/etc//x", "not clean"},
		{"dot", "/etc/./x", "not clean"},
		{"nul", "/etc/\x00x", "NUL"},
		{"too long", "/" + strings.Repeat("a", MaxPathLen), "over the limit"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			err := CheckPath("resources[0].path", c.in)
			if c.want == "" {
				if err != nil {
					t.Fatalf("CheckPath(%q) = %v", c.in, err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), "resources[0].path") {
				t.Fatalf("CheckPath(%q) = %v, want %q naming the field", c.in, err, c.want)
			}
		})
	}
	if !Within("/etc/ssh", "/etc") || Within("/etcx", "/etc") || !Within("/etc", "/etc") || !Within("/x", "/") {
		t.Error("Within is wrong")
	}
}
