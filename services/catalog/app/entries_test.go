package app_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"mesh.dev/internal/canonical"
	"mesh.dev/internal/lint"
	"mesh.dev/internal/names"
	"mesh.dev/internal/natsx"
	catalogv1 "mesh.dev/proto/mesh/catalog/v1"
	typev1 "mesh.dev/proto/mesh/type/v1"
)

// TestPutEntryRefusesInvalid checks, over gRPC, that each kind of invalid
// entry is refused with INVALID_ARGUMENT naming the field, and that a
// refused entry is not stored. internal/lint's tests hold every rule; this
// table checks that they reach the caller as such.
func TestPutEntryRefusesInvalid(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	r := w.start(t)
	c := w.builder(t, r)
	remanifest := func(t testing.TB, e *catalogv1.Entry, mutate func(m *typev1.ModuleManifest)) {
		m := manifest("sshd", "1.0")
		mutate(m)
		b, err := canonical.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		e.Manifest, e.ManifestDigest, e.Needs = b, names.Digest(b), m.GetNeeds()
		refingerprint(e)
	}
	cases := []struct {
		name   string
		mutate func(t testing.TB, e *catalogv1.Entry)
		msg    string
	}{
		{"no entry", nil, "entry is required"},
		{"bad fingerprint", func(_ testing.TB, e *catalogv1.Entry) { e.Fingerprint = "fp1:ABC" }, `entry.fingerprint "fp1:ABC" is not a fingerprint`},
		{"fingerprint mismatch names both", func(_ testing.TB, e *catalogv1.Entry) {
			e.Fingerprint = names.FingerprintPrefix + strings.Repeat("1", 64)
		}, "entry.fingerprint: fp1:" + strings.Repeat("1", 64) + " does not match fp1:"},
		{"commit is not part of the fingerprint, the path is", func(_ testing.TB, e *catalogv1.Entry) { e.Path = "modules/other" }, "entry.fingerprint:"},
		{"bad module", func(_ testing.TB, e *catalogv1.Entry) { e.Module = "Sshd" }, `entry.module: module "Sshd" is not a DNS label`},
		{"no repository", func(_ testing.TB, e *catalogv1.Entry) { e.Repository = "" }, "entry.repository: must be 1 to 1024 bytes"},
		{"absolute path", func(_ testing.TB, e *catalogv1.Entry) { e.Path = "/srv/modules/sshd" }, `entry.path: "/srv/modules/sshd" is absolute`},
		{"bad source digest", func(_ testing.TB, e *catalogv1.Entry) { e.SourceDigest = "sha256:00" }, `entry.source_digest "sha256:00" is not a digest`},
		{"short commit", func(_ testing.TB, e *catalogv1.Entry) { e.Commit = "deadbeef" }, `entry.commit: "deadbeef" is not a full commit id`},
		{"no manifest", func(_ testing.TB, e *catalogv1.Entry) { e.Manifest = nil }, "entry.manifest: is required"},
		{"manifest with unknown fields", func(_ testing.TB, e *catalogv1.Entry) {
			e.Manifest = protowire.AppendVarint(protowire.AppendTag(e.Manifest, 77, protowire.VarintType), 5)
		}, "entry.manifest: decode mesh.type.v1.ModuleManifest: the bytes hold fields this build does not know"},
		{"manifest not canonical", func(_ testing.TB, e *catalogv1.Entry) {
			m := manifest("sshd", "1.0")
			head, _ := proto.Marshal(&typev1.ModuleManifest{Version: m.Version})
			m.Version = ""
			tail, _ := canonical.Marshal(m)
			e.Manifest = append(head, tail...)
			e.ManifestDigest = names.Digest(e.Manifest)
			refingerprint(e)
		}, "entry.manifest: is not canonical"},
		{"manifest digest wrong", func(_ testing.TB, e *catalogv1.Entry) {
			e.ManifestDigest = names.Digest([]byte("other"))
			refingerprint(e)
		}, "entry.manifest_digest"},
		{"manifest of another module", func(t testing.TB, e *catalogv1.Entry) {
			remanifest(t, e, func(m *typev1.ModuleManifest) {
				m.Module = "motd"
				m.Resources[2].Content = &typev1.ResourceTemplate_Artifact{Artifact: "binary:sshd"}
			})
		}, `entry.manifest.module: "motd" is not the entry's module "sshd"`},
		{"relative resource path", func(t testing.TB, e *catalogv1.Entry) {
			remanifest(t, e, func(m *typev1.ModuleManifest) { m.Resources[1].Path = "etc/sshd/config" })
		}, `entry.manifest.resources[1].path "etc/sshd/config" is not absolute`},
		{"traversal in a templated path", func(t testing.TB, e *catalogv1.Entry) {
			remanifest(t, e, func(m *typev1.ModuleManifest) { m.Resources[1].Path = "/etc/{{ .Params.d }}/../shadow" })
		}, "entry.manifest.resources[1].path: \"/etc/{{ .Params.d }}/../shadow\" is not clean"},
		{"template with an unknown function", func(t testing.TB, e *catalogv1.Entry) {
			remanifest(t, e, func(m *typev1.ModuleManifest) {
				m.Resources[1].Content = &typev1.ResourceTemplate_Text{Text: `{{ env "HOME" }}`}
			})
		}, `entry.manifest.resources[1].text: template does not parse: line 1: function "env" not defined`},
		{"template reading another key", func(t testing.TB, e *catalogv1.Entry) {
			remanifest(t, e, func(m *typev1.ModuleManifest) {
				m.Resources[1].Content = &typev1.ResourceTemplate_Text{Text: `{{ .Env.HOME }}`}
			})
		}, "entry.manifest.resources[1].text: {{ .Env.HOME }} reads .Env"},
		{"mode over 7777", func(t testing.TB, e *catalogv1.Entry) {
			remanifest(t, e, func(m *typev1.ModuleManifest) { m.Resources[0].Mode = 0o17777 })
		}, "entry.manifest.resources[0].mode: 17777 is over 7777"},
		{"unspecified type", func(t testing.TB, e *catalogv1.Entry) {
			remanifest(t, e, func(m *typev1.ModuleManifest) { m.Resources[0].Type = 0 })
		}, "entry.manifest.resources[0].type"},
		{"duplicate resource name", func(t testing.TB, e *catalogv1.Entry) {
			remanifest(t, e, func(m *typev1.ModuleManifest) { m.Resources[3].Name = "dir" })
		}, `entry.manifest.resources[3].name: "dir" is also the name of resources[0]`},
		{"relative data path", func(t testing.TB, e *catalogv1.Entry) {
			remanifest(t, e, func(m *typev1.ModuleManifest) { m.DataPaths = []string{"var/lib/sshd"} })
		}, `entry.manifest.data_paths[0] "var/lib/sshd" is not absolute`},
		{"manual without a why", func(t testing.TB, e *catalogv1.Entry) {
			remanifest(t, e, func(m *typev1.ModuleManifest) { m.Upgrade.Policy = typev1.UpgradePolicy_UPGRADE_POLICY_MANUAL })
		}, "entry.manifest.upgrade.why: UPGRADE_POLICY_MANUAL needs a why"},
		{"no upgrade policy", func(t testing.TB, e *catalogv1.Entry) {
			remanifest(t, e, func(m *typev1.ModuleManifest) { m.Upgrade = nil })
		}, "entry.manifest.upgrade: is required"},
		{"need over the cap limit", func(t testing.TB, e *catalogv1.Entry) {
			remanifest(t, e, func(m *typev1.ModuleManifest) { m.Needs = []*typev1.Need{{Module: "users", Cap: 10000}} })
		}, "entry.manifest.needs[0].cap: 10000 is over the limit of 256"},
		{"needs not the manifest's", func(t testing.TB, e *catalogv1.Entry) {
			remanifest(t, e, func(m *typev1.ModuleManifest) { m.Needs = []*typev1.Need{{Module: "users"}} })
			e.Needs = nil
		}, "entry.needs: 0 needs, the manifest declares 1"},
		{"artifact not declared", func(_ testing.TB, e *catalogv1.Entry) { e.Artifacts = nil }, `entry.artifacts: the manifest names artifact "binary:sshd"`},
		{"verdict PASS with problems", func(_ testing.TB, e *catalogv1.Entry) { e.Problems = []string{"sshd -t failed"} }, "entry.verdict: PASS with 1 problems"},
		{"manifest over the size limit", func(t testing.TB, e *catalogv1.Entry) {
			remanifest(t, e, func(m *typev1.ModuleManifest) {
				m.Resources[1].Content = &typev1.ResourceTemplate_Raw{Raw: make([]byte, 600<<10)}
			})
		}, "entry.manifest: 614"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var e *catalogv1.Entry
			if tc.mutate != nil {
				e = entryOf(t, manifest("sshd", "1.0"))
				tc.mutate(t, e)
			}
			_, err := c.PutEntry(context.Background(), &catalogv1.PutEntryRequest{Entry: e})
			mustCode(t, err, codes.InvalidArgument, tc.msg)
			if names.HasFingerprint(e.GetFingerprint()) {
				_, err := c.GetEntry(context.Background(), &catalogv1.GetEntryRequest{Fingerprint: e.GetFingerprint()})
				mustCode(t, err, codes.NotFound)
			}
		})
	}
}

func TestPutEntryRefusesUnknownFields(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	r := w.start(t)
	e := entryOf(t, manifest("sshd", "1.0"))
	e.ProtoReflect().SetUnknown(protowire.AppendVarint(protowire.AppendTag(nil, 99, protowire.VarintType), 1))
	_, err := w.builder(t, r).PutEntry(context.Background(), &catalogv1.PutEntryRequest{Entry: e})
	mustCode(t, err, codes.InvalidArgument, "entry holds fields this catalog does not know")
}

func TestEntryRoundTripAndImmutability(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	r := w.start(t)
	c := w.builder(t, r)
	ctx := context.Background()
	m := manifest("sshd", "1.0")
	m.Needs = []*typev1.Need{{Module: "users", Cap: 4, Selector: &typev1.LabelSelector{MatchLabels: map[string]string{"role": "bastion"}}}}
	m.DataPaths = []string{"/var/lib/sshd"}
	e := entryOf(t, m)
	e.Packages = []string{"openssh-server"}
	e.CreatedAt = timestamppb.New(time.Unix(1, 0)) // the catalog's to set: ignored

	before := time.Now()
	resp, err := c.PutEntry(ctx, &catalogv1.PutEntryRequest{Entry: e})
	if err != nil {
		t.Fatal(err)
	}
	if !resp.GetCreated() || resp.GetFingerprint() != e.GetFingerprint() {
		t.Fatalf("PutEntry = %v", resp)
	}
	got, err := w.client(t, r, "node", "ace").GetEntry(ctx, &catalogv1.GetEntryRequest{Fingerprint: e.GetFingerprint()})
	if err != nil {
		t.Fatal(err)
	}
	held := got.GetEntry()
	if ct := held.GetCreatedAt().AsTime(); ct.Before(before.Add(-time.Second)) || ct.After(time.Now().Add(time.Second)) {
		t.Errorf("created_at %v is not the time of the put", ct)
	}
	want := proto.Clone(e).(*catalogv1.Entry)
	want.CreatedAt = held.GetCreatedAt()
	if !proto.Equal(held, want) {
		t.Errorf("round trip:\n got %v\nwant %v", held, want)
	}
	// The manifest bytes come back exactly as digested.
	if names.Digest(held.GetManifest()) != e.GetManifestDigest() {
		t.Error("manifest bytes changed on the way")
	}

	// The same entry again (another created_at) is a no-op.
	again := proto.Clone(e).(*catalogv1.Entry)
	again.CreatedAt = nil
	resp, err = w.operator(t, r).PutEntry(ctx, &catalogv1.PutEntryRequest{Entry: again})
	if err != nil || resp.GetCreated() {
		t.Fatalf("identical put: %v, %v", resp, err)
	}
	// Different bytes under the same fingerprint: the commit is outside it.
	other := proto.Clone(e).(*catalogv1.Entry)
	other.Commit = strings.Repeat("cd", 20)
	other.Packages = []string{"openssh-server", "openssh-sftp-server"}
	_, err = c.PutEntry(ctx, &catalogv1.PutEntryRequest{Entry: other})
	mustCode(t, err, codes.AlreadyExists, "entry "+e.GetFingerprint()+" is held with different commit, packages; entries are immutable")
	got2, err := c.GetEntry(ctx, &catalogv1.GetEntryRequest{Fingerprint: e.GetFingerprint()})
	if err != nil || !proto.Equal(got2.GetEntry(), held) {
		t.Fatalf("the held entry changed: %v, %v", got2, err)
	}
}

func TestGetEntryNotFound(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	r := w.start(t)
	c := w.client(t, r, "node", "ace")
	fp := names.FingerprintPrefix + strings.Repeat("be", 32)
	_, err := c.GetEntry(context.Background(), &catalogv1.GetEntryRequest{Fingerprint: fp})
	mustCode(t, err, codes.NotFound)
	// Node engines compare this message exactly (DESIGN.md §7).
	if got := statusMessage(err); got != "no entry of fingerprint "+fp {
		t.Fatalf("message %q", got)
	}
	_, err = c.GetEntry(context.Background(), &catalogv1.GetEntryRequest{Fingerprint: "fp1:nope"})
	mustCode(t, err, codes.InvalidArgument, `fingerprint "fp1:nope" is not a fingerprint`)
	_, err = w.operator(t, r).GetBuild(context.Background(), &catalogv1.GetBuildRequest{Fingerprint: fp})
	mustCode(t, err, codes.NotFound, "no build of fingerprint "+fp)
	_, err = w.operator(t, r).GetBuild(context.Background(), &catalogv1.GetBuildRequest{Fingerprint: "fp1:nope"})
	mustCode(t, err, codes.InvalidArgument, `fingerprint "fp1:nope" is not a fingerprint`)
}

func TestListEntriesPaginates(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	r := w.start(t)
	c := w.builder(t, r)
	ctx := context.Background()
	var all, sshd []string
	for i := range 7 {
		module := "sshd"
		if i%3 == 1 {
			module = "motd"
		}
		e := putEntry(t, c, module, fmt.Sprintf("1.%d", i))
		all = append(all, e.GetFingerprint())
		if module == "sshd" {
			sshd = append(sshd, e.GetFingerprint())
		}
	}
	slices.Sort(all)
	slices.Sort(sshd)

	page := func(module string, size int32) []string {
		var got []string
		token := ""
		for pages := 0; ; pages++ {
			if pages > 10 {
				t.Fatal("no last page")
			}
			resp, err := c.ListEntries(ctx, &catalogv1.ListEntriesRequest{Module: module, PageSize: size, PageToken: token})
			if err != nil {
				t.Fatal(err)
			}
			if size > 0 && len(resp.GetEntries()) > int(size) {
				t.Fatalf("page of %d entries, size %d", len(resp.GetEntries()), size)
			}
			for _, e := range resp.GetEntries() {
				if module != "" && e.GetModule() != module {
					t.Fatalf("entry of %s listed for %s", e.GetModule(), module)
				}
				got = append(got, e.GetFingerprint())
			}
			if token = resp.GetNextPageToken(); token == "" {
				return got
			}
		}
	}
	if got := page("", 3); !slices.Equal(got, all) {
		t.Errorf("all by 3:\n got %v\nwant %v", got, all)
	}
	if got := page("", 0); !slices.Equal(got, all) {
		t.Errorf("all by the default size: %v", got)
	}
	if got := page("sshd", 2); !slices.Equal(got, sshd) {
		t.Errorf("sshd by 2:\n got %v\nwant %v", got, sshd)
	}
	if got := page("postgres", 2); len(got) != 0 {
		t.Errorf("postgres: %v", got)
	}

	first, err := c.ListEntries(ctx, &catalogv1.ListEntriesRequest{Module: "sshd", PageSize: 1})
	if err != nil || first.GetNextPageToken() == "" {
		t.Fatalf("first page: %v, %v", first, err)
	}
	_, err = c.ListEntries(ctx, &catalogv1.ListEntriesRequest{Module: "motd", PageToken: first.GetNextPageToken()})
	mustCode(t, err, codes.InvalidArgument, `page_token was issued for module "sshd", not "motd"`)
	_, err = c.ListEntries(ctx, &catalogv1.ListEntriesRequest{PageToken: "garbage"})
	mustCode(t, err, codes.InvalidArgument, "page_token is not a token this catalog issued")
	_, err = c.ListEntries(ctx, &catalogv1.ListEntriesRequest{PageSize: -1})
	mustCode(t, err, codes.InvalidArgument, "page_size -1 is negative")
	_, err = c.ListEntries(ctx, &catalogv1.ListEntriesRequest{Module: "Bad"})
	mustCode(t, err, codes.InvalidArgument, "module: ")
}

// entryOfSize returns an entry of sshd whose encoded size without
// created_at is exactly size: a raw file fills the manifest, warnings and
// unknowns the rest.
func entryOfSize(t testing.TB, size int) *catalogv1.Entry {
	t.Helper()
	m := manifest("sshd", "1.0")
	// The largest manifest: the blob's own tags and lengths take under 64
	// bytes.
	raw := lint.MaxManifestSize - canonical.Size(m) - 64
	m.Resources = append(m.Resources, &typev1.ResourceTemplate{Name: "blob", Type: typev1.ResourceType_RESOURCE_TYPE_FILE,
		Path: "/srv/blob", Mode: 0o644, Content: &typev1.ResourceTemplate_Raw{Raw: make([]byte, raw)}})
	e := entryOf(t, m)
	e.Verdict = catalogv1.Verdict_VERDICT_WARN
	// Each input costs its length, a tag and a 2-byte length. Whole inputs
	// go in until two would make up the rest, then two that do.
	const cost = lint.MaxVerdictInputLen + 3
	add := func(n int) {
		s := strings.Repeat("w", n)
		if len(e.Warnings) < lint.MaxVerdictInputs {
			e.Warnings = append(e.Warnings, s)
		} else {
			e.Unknown = append(e.Unknown, s)
		}
	}
	for size-canonical.Size(e) > 2*cost {
		add(lint.MaxVerdictInputLen)
	}
	rest := size - canonical.Size(e)
	add(rest/2 - 3)
	add(size - canonical.Size(e) - 3)
	if n := canonical.Size(e); n != size {
		t.Fatalf("entryOfSize: made %d bytes, want %d", n, size)
	}
	return e
}

// TestPutEntryJudgesTheStoredSize checks that the size limit counts what is
// stored, created_at included: an entry just under 1 MiB without it is
// refused naming the entry, not by the KV with a message naming nothing,
// and nothing is stored; one that leaves room for it is stored.
func TestPutEntryJudgesTheStoredSize(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	r := w.start(t)
	c := w.builder(t, r)
	ctx := context.Background()

	over := entryOfSize(t, lint.MaxEntrySize-3)
	_, err := c.PutEntry(ctx, &catalogv1.PutEntryRequest{Entry: over})
	mustCode(t, err, codes.InvalidArgument, "bytes encoded, over the limit of 1048576")
	if msg := statusMessage(err); !strings.HasPrefix(msg, "entry: ") {
		t.Fatalf("message %q does not name the entry", msg)
	}
	_, err = c.GetEntry(ctx, &catalogv1.GetEntryRequest{Fingerprint: over.GetFingerprint()})
	mustCode(t, err, codes.NotFound, "no entry of fingerprint "+over.GetFingerprint())

	// The most bytes created_at can take now.
	stamp := canonical.Size(&catalogv1.Entry{CreatedAt: &timestamppb.Timestamp{Seconds: time.Now().Add(time.Hour).Unix(), Nanos: 999_999_999}})
	fits := entryOfSize(t, lint.MaxEntrySize-stamp)
	if _, err := c.PutEntry(ctx, &catalogv1.PutEntryRequest{Entry: fits}); err != nil {
		t.Fatalf("an entry with room for created_at: %v", err)
	}
	got, err := c.GetEntry(ctx, &catalogv1.GetEntryRequest{Fingerprint: fits.GetFingerprint()})
	if err != nil {
		t.Fatal(err)
	}
	if n := canonical.Size(got.GetEntry()); n > lint.MaxEntrySize || got.GetEntry().GetCreatedAt() == nil {
		t.Fatalf("stored %d bytes (created_at %v)", n, got.GetEntry().GetCreatedAt())
	}
}

// kvCalls counts the KV calls on catalog-entries among the spans ended so
// far, by operation ("kv.get", "kv.list_keys", "kv.watch", ...).
func kvCalls(spans *tracetest.SpanRecorder) map[string]int {
	n := map[string]int{}
	for _, s := range spans.Ended() {
		if op, ok := strings.CutSuffix(s.Name(), " "+natsx.BucketCatalogEntries); ok {
			n[op]++
		}
	}
	return n
}

// TestListEntriesPagesReadOnlyTheirEntries pages through one module's
// entries among many, on a catalog replica that did not write them, and
// checks that each page reads only its own entries: no listing of every key,
// no read of another module's entry, whatever the catalog holds. Entries
// written by another replica, written without the module header (as a
// restore does) and stored before a restart are all listed.
func TestListEntriesPagesReadOnlyTheirEntries(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	w.cfg.EntryCacheBytes = -1 // every read reaches the KV and is counted
	spans := tracetest.NewSpanRecorder()
	w.opts.TracerProvider = sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	writer := w.start(t)
	c := w.builder(t, writer)
	ctx := context.Background()
	var sshd []string
	for i := range 15 {
		module := []string{"motd", "users", "sshd"}[i%3]
		e := putEntry(t, c, module, fmt.Sprintf("1.%d", i))
		if module == "sshd" {
			sshd = append(sshd, e.GetFingerprint())
		}
	}
	// One entry without the header, written as `meshctl restore` writes.
	kv, err := natsx.OpenKV(ctx, w.js, natsx.BucketCatalogEntries)
	if err != nil {
		t.Fatal(err)
	}
	bare := entryOf(t, manifest("sshd", "2.0"))
	bare.CreatedAt = timestamppb.Now()
	b, err := canonical.Marshal(bare)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Create(ctx, names.FingerprintHex(bare.GetFingerprint()), b); err != nil {
		t.Fatal(err)
	}
	sshd = append(sshd, bare.GetFingerprint())
	slices.Sort(sshd)

	// pageAll pages through sshd by 2; the first page may read extra
	// entries besides its own (to learn the modules of entries written
	// without the header).
	pageAll := func(r *running, extra int) []string {
		t.Helper()
		reader := w.operator(t, r)
		var got []string
		token := ""
		for pages := 0; ; pages++ {
			if pages > 10 {
				t.Fatal("no last page")
			}
			before := kvCalls(spans)
			resp, err := reader.ListEntries(ctx, &catalogv1.ListEntriesRequest{Module: "sshd", PageSize: 2, PageToken: token})
			if err != nil {
				t.Fatal(err)
			}
			after := kvCalls(spans)
			for _, e := range resp.GetEntries() {
				if e.GetModule() != "sshd" {
					t.Fatalf("entry of %s listed for sshd", e.GetModule())
				}
				got = append(got, e.GetFingerprint())
			}
			if n := after["kv.list_keys"] - before["kv.list_keys"]; n != 0 {
				t.Errorf("page %d listed every key %d times", pages, n)
			}
			want := len(resp.GetEntries())
			if pages == 0 {
				want += extra
			}
			if n := after["kv.get"] - before["kv.get"]; n != want {
				t.Errorf("page %d of %d entries read %d entries, want %d", pages, len(resp.GetEntries()), n, want)
			}
			if n := after["kv.watch"] - before["kv.watch"]; pages > 0 && n != 0 {
				t.Errorf("page %d watched the stream again with nothing new (%d)", pages, n)
			}
			if token = resp.GetNextPageToken(); token == "" {
				return got
			}
		}
	}

	reader := w.start(t)
	// The first page learns the bare entry's module by reading it, once.
	if got := pageAll(reader, 1); !slices.Equal(got, sshd) {
		t.Fatalf("sshd by 2 on another replica:\n got %v\nwant %v", got, sshd)
	}
	if got := pageAll(reader, 0); !slices.Equal(got, sshd) {
		t.Fatalf("sshd by 2 again:\n got %v\nwant %v", got, sshd)
	}
	// A write on the writer shows on the reader's next call.
	late := putEntry(t, c, "sshd", "3.0")
	sshd = append(sshd, late.GetFingerprint())
	slices.Sort(sshd)
	if got := pageAll(reader, 0); !slices.Equal(got, sshd) {
		t.Fatalf("sshd after a write on the other replica:\n got %v\nwant %v", got, sshd)
	}
	writer.stop()
	reader.stop()
	if got := pageAll(w.start(t), 1); !slices.Equal(got, sshd) {
		t.Fatalf("sshd after a restart:\n got %v\nwant %v", got, sshd)
	}
}
