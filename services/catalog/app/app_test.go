package app_test

import (
	"bytes"
	"context"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"mesh.dev/internal/authz/authztest"
	"mesh.dev/internal/config"
	"mesh.dev/internal/identity"
	"mesh.dev/internal/names"
	"mesh.dev/internal/natsx"
	"mesh.dev/internal/testutil"
	catalogv1 "mesh.dev/proto/mesh/catalog/v1"
	"mesh.dev/services/catalog/app"
)

// held is what a catalog acknowledged, to compare after a restart.
type held struct {
	entry    *catalogv1.Entry
	build    *catalogv1.Build
	artifact []byte
	module   *catalogv1.GetModuleResponse
}

func acknowledge(t testing.TB, w *world, r *running) held {
	t.Helper()
	c := w.builder(t, r)
	ctx := context.Background()
	e := release(t, c, "sshd", "1.0")
	register(t, c, "sshd", e.GetFingerprint())
	got, err := c.GetEntry(ctx, &catalogv1.GetEntryRequest{Fingerprint: e.GetFingerprint()})
	if err != nil {
		t.Fatal(err)
	}
	b, err := c.GetBuild(ctx, &catalogv1.GetBuildRequest{Fingerprint: e.GetFingerprint()})
	if err != nil {
		t.Fatal(err)
	}
	art, _, err := download(t, c, b.GetBuild().GetArtifacts()[0].GetDigest(), 0)
	if err != nil {
		t.Fatal(err)
	}
	m, err := c.GetModule(ctx, &catalogv1.GetModuleRequest{Module: "sshd", History: true})
	if err != nil {
		t.Fatal(err)
	}
	return held{entry: got.GetEntry(), build: b.GetBuild(), artifact: art, module: m}
}

func (h held) check(t testing.TB, w *world, r *running) {
	t.Helper()
	c := w.operator(t, r)
	ctx := context.Background()
	e, err := c.GetEntry(ctx, &catalogv1.GetEntryRequest{Fingerprint: h.entry.GetFingerprint()})
	if err != nil || !proto.Equal(e.GetEntry(), h.entry) {
		t.Fatalf("entry after restart: %v, %v", e, err)
	}
	b, err := c.GetBuild(ctx, &catalogv1.GetBuildRequest{Fingerprint: h.entry.GetFingerprint()})
	if err != nil || !proto.Equal(b.GetBuild(), h.build) {
		t.Fatalf("build after restart: %v, %v", b, err)
	}
	art, _, err := download(t, c, h.build.GetArtifacts()[0].GetDigest(), 0)
	if err != nil || !bytes.Equal(art, h.artifact) {
		t.Fatalf("artifact after restart: %v", err)
	}
	m, err := c.GetModule(ctx, &catalogv1.GetModuleRequest{Module: "sshd", History: true})
	if err != nil || !proto.Equal(m, h.module) {
		t.Fatalf("module after restart: %v, %v", m, err)
	}
}

// TestRestartServesWhatWasAcknowledged restarts the catalog and its NATS
// server and reads back every kind of record.
func TestRestartServesWhatWasAcknowledged(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	r := w.start(t)
	h := acknowledge(t, w, r)
	r.stop()
	w.restartJetStream(t)
	h.check(t, w, w.start(t))
}

// TestEmbeddedNATS runs the one-machine default: the catalog starts its own
// NATS server (sync always) on a data dir, which the other services of the
// machine reach at its client URL, and finds its data there after a restart.
func TestEmbeddedNATS(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	w.cfg.NATS = app.NATSConfig{EmbeddedDir: filepath.Join(t.TempDir(), "jetstream"), EmbeddedListen: "127.0.0.1:0"}
	r := w.start(t)
	h := acknowledge(t, w, r)
	e := r.catalog.Embedded()
	if e == nil || !e.Server().JetStreamConfig().SyncAlways {
		t.Fatal("no embedded server with sync always")
	}
	// Another service of the machine connects over the client URL.
	_, js := testutil.ConnectJetStream(t, e)
	kv, err := natsx.OpenKV(context.Background(), js, natsx.BucketCatalogEntries)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Get(context.Background(), names.FingerprintHex(h.entry.GetFingerprint())); err != nil {
		t.Fatalf("entry read over the client URL: %v", err)
	}
	r.stop()
	h.check(t, w, w.start(t))
}

// TestExternalNATSOverTLS runs the catalog on an external nats-server it
// reaches only over TLS, configured as --nats-url, --nats-ca, --nats-cert,
// --nats-key and --nats-creds configure it: logged in by its certificate as
// deploy/nats maps it, or with a .creds file.
func TestExternalNATSOverTLS(t *testing.T) {
	t.Parallel()
	for _, name := range []string{"certificate", "creds"} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			w := newWorld(t)
			catalog := w.pki.Identity(identity.RoleCatalog, "")
			if name == "certificate" {
				s := testutil.StartTLSJetStream(t, w.pki, testutil.NATSAuth{CertUsers: []identity.Identity{catalog}})
				cert, key, _ := w.pki.Files(t, catalog)
				w.cfg.NATS = app.NATSConfig{URL: s.URL, CAFile: s.CAFile, CertFile: cert, KeyFile: key}
			} else {
				s := testutil.StartTLSJetStream(t, w.pki, testutil.NATSAuth{Creds: true})
				w.cfg.NATS = app.NATSConfig{URL: s.URL, CAFile: s.CAFile, CredsFile: s.CredsFile(t, "mesh-catalog")}
			}
			r := w.start(t)
			if r.catalog.Embedded() != nil || !r.catalog.JetStream().Conn().TLSRequired() {
				t.Fatal("the catalog is not on the external server over TLS")
			}
			h := acknowledge(t, w, r)
			r.stop()
			h.check(t, w, w.start(t))
		})
	}
}

func TestConfigValidate(t *testing.T) {
	t.Parallel()
	good := func() app.Config {
		c := app.Config{CertFile: "c.pem", KeyFile: "k.pem", CAFile: "ca.pem", NATS: app.NATSConfig{EmbeddedDir: "/var/lib/mesh/nats"}}
		return c
	}
	cases := []struct {
		name   string
		mutate func(c *app.Config)
		msg    string
	}{
		{"embedded", func(*app.Config) {}, ""},
		{"external cluster", func(c *app.Config) {
			c.NATS = app.NATSConfig{URL: "tls://nats-1:4222,tls://nats-2:4222", CAFile: "ca.pem", CredsFile: "catalog.creds", Replicas: 3}
		}, ""},
		{"no cert", func(c *app.Config) { c.CertFile = "" }, "config: cert_file is required"},
		{"no nats is the embedded default", func(c *app.Config) { c.NATS = app.NATSConfig{} }, ""},
		{"nats tls without a url", func(c *app.Config) { c.NATS = app.NATSConfig{CAFile: "ca.pem"} }, "config: nats.url is required with nats.ca_file"},
		{"both", func(c *app.Config) { c.NATS.URL = "nats://x:4222" }, "give nats.embedded_dir or nats.url, not both"},
		{"embedded with replicas", func(c *app.Config) { c.NATS.Replicas = 3 }, "an embedded server holds 1 replica"},
		{"replicas over 5", func(c *app.Config) { c.NATS = app.NATSConfig{URL: "nats://x:4222", Replicas: 7} }, "nats.replicas 7 is outside 1..5"},
		{"embedded with creds", func(c *app.Config) { c.NATS.CredsFile = "x.creds" }, "are for nats.url"},
		{"bad embedded listen", func(c *app.Config) { c.NATS.EmbeddedListen = "4222" }, "nats.embedded_listen"},
		{"idle timeout too short", func(c *app.Config) { c.UploadIdleTimeout = config.Duration(1) }, "upload_idle_timeout 1ns is outside 1s..1h"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c := good()
			tc.mutate(&c)
			c.Defaults()
			err := c.Validate()
			if tc.msg == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.msg) {
				t.Fatalf("Validate = %v, want %q", err, tc.msg)
			}
		})
	}
	d := good()
	d.Defaults()
	if d.Listen != app.DefaultListen || d.MetricsListen != app.DefaultMetricsListen || d.NATS.EmbeddedListen != app.DefaultEmbeddedListen || d.NATS.Replicas != 1 {
		t.Errorf("defaults: %+v", d)
	}
	// Nothing about NATS: the one-machine default, an embedded server an
	// operator finds under /var/lib.
	var none app.Config
	none.Defaults()
	if want := (app.NATSConfig{EmbeddedDir: "/var/lib/mesh-catalog", EmbeddedListen: "127.0.0.1:4222", Replicas: 1}); none.NATS != want {
		t.Errorf("nats defaults: %+v, want %+v", none.NATS, want)
	}
}

// TestAuthorizationMatrix calls every catalog RPC as every role over real
// mTLS and checks each outcome against the policy (DESIGN.md §8).
func TestAuthorizationMatrix(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	r := w.start(t)
	fp := names.FingerprintPrefix + strings.Repeat("ab", 32)
	digest := names.Digest([]byte("artifact"))
	const (
		signer   = identity.RoleSigner
		composer = identity.RoleComposer
		node     = identity.RoleNode
		operator = identity.RoleOperator
		builder  = identity.RoleBuilder
	)
	authztest.RunMatrix(t, authztest.Matrix{
		Target:   r.addr,
		PKI:      w.pki,
		Services: []protoreflect.ServiceDescriptor{catalogv1.File_mesh_catalog_v1_catalog_proto.Services().ByName("CatalogService")},
		Policy:   app.Policy(),
		// DESIGN.md §8: builders write entries, builds, artifacts and
		// registrations (operators may put entries and register by hand);
		// the readers are named per RPC; nodes and the signer never write.
		Expect: map[string]authztest.Expectation{
			catalogv1.CatalogService_PutEntry_FullMethodName:         authztest.Allow(builder, operator),
			catalogv1.CatalogService_GetEntry_FullMethodName:         authztest.Allow(composer, signer, node, operator, builder),
			catalogv1.CatalogService_ListEntries_FullMethodName:      authztest.Allow(operator, builder),
			catalogv1.CatalogService_PutBuild_FullMethodName:         authztest.Allow(builder),
			catalogv1.CatalogService_GetBuild_FullMethodName:         authztest.Allow(composer, signer, operator, builder),
			catalogv1.CatalogService_UploadArtifact_FullMethodName:   authztest.Allow(builder),
			catalogv1.CatalogService_DownloadArtifact_FullMethodName: authztest.Anyone(),
			catalogv1.CatalogService_RegisterModule_FullMethodName:   authztest.Allow(builder, operator),
			catalogv1.CatalogService_GetModule_FullMethodName:        authztest.Allow(composer, operator, builder),
			catalogv1.CatalogService_ListModules_FullMethodName:      authztest.Allow(composer, operator, builder),
			catalogv1.CatalogService_WatchModules_FullMethodName:     authztest.Allow(composer, operator),
		},
		Requests: map[string]proto.Message{
			catalogv1.CatalogService_PutEntry_FullMethodName:         &catalogv1.PutEntryRequest{Entry: entryOf(t, manifest("sshd", "1.0"))},
			catalogv1.CatalogService_GetEntry_FullMethodName:         &catalogv1.GetEntryRequest{Fingerprint: fp},
			catalogv1.CatalogService_ListEntries_FullMethodName:      &catalogv1.ListEntriesRequest{Module: "sshd"},
			catalogv1.CatalogService_PutBuild_FullMethodName:         &catalogv1.PutBuildRequest{Build: &catalogv1.Build{Fingerprint: fp, State: catalogv1.BuildState_BUILD_STATE_PENDING}},
			catalogv1.CatalogService_GetBuild_FullMethodName:         &catalogv1.GetBuildRequest{Fingerprint: fp},
			catalogv1.CatalogService_UploadArtifact_FullMethodName:   header(digest, 8),
			catalogv1.CatalogService_DownloadArtifact_FullMethodName: &catalogv1.DownloadArtifactRequest{Digest: digest},
			catalogv1.CatalogService_RegisterModule_FullMethodName:   &catalogv1.RegisterModuleRequest{Module: "sshd", Fingerprint: fp},
			catalogv1.CatalogService_GetModule_FullMethodName:        &catalogv1.GetModuleRequest{Module: "sshd"},
			catalogv1.CatalogService_ListModules_FullMethodName:      &catalogv1.ListModulesRequest{},
			catalogv1.CatalogService_WatchModules_FullMethodName:     &catalogv1.WatchModulesRequest{},
		},
	})
}

// TestPolicyRoles pins the roles of DESIGN.md §8: builders write
// everything, operators put entries and register, nodes never write.
func TestPolicyRoles(t *testing.T) {
	t.Parallel()
	p := app.Policy()
	writes := []string{
		catalogv1.CatalogService_PutEntry_FullMethodName, catalogv1.CatalogService_PutBuild_FullMethodName,
		catalogv1.CatalogService_UploadArtifact_FullMethodName, catalogv1.CatalogService_RegisterModule_FullMethodName,
	}
	for _, m := range writes {
		if !p[m].Allows(identity.RoleBuilder) {
			t.Errorf("builders may not call %s", m)
		}
		for _, role := range []identity.Role{identity.RoleNode, identity.RoleComposer, identity.RoleSigner, identity.RoleCatalog} {
			if p[m].Allows(role) {
				t.Errorf("%s may call %s", role, m)
			}
		}
	}
	for _, m := range []string{catalogv1.CatalogService_PutEntry_FullMethodName, catalogv1.CatalogService_RegisterModule_FullMethodName} {
		if !p[m].Allows(identity.RoleOperator) {
			t.Errorf("operators may not call %s", m)
		}
	}
	for _, role := range identity.Roles() {
		if !p[catalogv1.CatalogService_DownloadArtifact_FullMethodName].Allows(role) {
			t.Errorf("%s may not download artifacts", role)
		}
	}
}

// TestExampleConfig loads the example configuration strictly.
func TestExampleConfig(t *testing.T) {
	t.Parallel()
	var c app.Config
	if err := config.Load(filepath.Join("..", "mesh-catalog.example.yaml"), &c); err != nil {
		t.Fatal(err)
	}
	c.Defaults()
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	if c.NATS.EmbeddedDir == "" || c.Listen != app.DefaultListen || c.MetricsListen != app.DefaultMetricsListen {
		t.Errorf("example config: %+v", c)
	}
}
