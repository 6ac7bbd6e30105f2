// Package deploy checks the deployment files in deploy/ without running
// them: the NATS cluster configuration loads and grants each service only
// its own streams, every Kubernetes manifest decodes strictly into the
// Kubernetes API types and keeps the invariants below, and every service
// configuration shipped decodes strictly into its service's Config. The
// compose deployment runs for real in tests/compose.
package deploy

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	"sigs.k8s.io/yaml"

	"mesh.dev/cmd/meshctl/backup"
	"mesh.dev/internal/config"
	"mesh.dev/internal/identity"
	"mesh.dev/internal/natsx"
	"mesh.dev/internal/pki"
	catalogapp "mesh.dev/services/catalog/app"
	composerapp "mesh.dev/services/composer/app"
	nodeengineapp "mesh.dev/services/nodeengine/app"
	signerapp "mesh.dev/services/signer/app"
	"mesh.dev/tests/internal/natsconf"
)

func repoRoot(t testing.TB) string {
	t.Helper()
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		t.Fatal("no caller")
	}
	return filepath.Clean(filepath.Join(filepath.Dir(file), "..", ".."))
}

const natsConf = "deploy/nats/nats-server.conf"

// catalogOwns lists what the catalog's NATS user owns; the composer's owns
// every other bucket and object store of DESIGN.md §9.
var catalogOwns = []string{natsx.BucketCatalogEntries, natsx.BucketCatalogBuilds, natsx.BucketCatalogModules, natsx.ObjectStoreArtifacts}

// natsTestFiles writes the configuration with its certificate and store
// paths moved into dir, and a CA and server certificate there.
func natsTestFiles(t *testing.T, root string) string {
	t.Helper()
	dir := t.TempDir()
	ca, err := pki.NewCA("mesh.local", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	// A NATS server is no mesh identity: no URI SAN, DNS names only.
	certPEM, keyPEM, err := ca.Issue(identity.Identity{}, pki.IssueOptions{URIs: []*url.URL{}, NoDefaultSANs: true, DNSNames: []string{"nats-0.nats"}})
	if err != nil {
		t.Fatal(err)
	}
	for name, b := range map[string][]byte{"ca.pem": ca.CertPEM(), "server.pem": certPEM, "server-key.pem": keyPEM} {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	conf, err := os.ReadFile(filepath.Join(root, natsConf))
	if err != nil {
		t.Fatal(err)
	}
	conf = bytes.ReplaceAll(conf, []byte("/etc/nats/certs/"), []byte(dir+"/"))
	conf = bytes.ReplaceAll(conf, []byte(`"/data/jetstream"`), []byte(`"`+filepath.Join(dir, "js")+`"`))
	path := filepath.Join(dir, "nats-server.conf")
	if err := os.WriteFile(path, conf, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestNATSConfig loads deploy/nats/nats-server.conf with the pinned
// nats-server (test mode, certificates included) and checks what it grants.
func TestNATSConfig(t *testing.T) {
	root := repoRoot(t)
	path := natsTestFiles(t, root)
	t.Setenv("SERVER_NAME", "nats-0")
	t.Setenv("CLUSTER_ADVERTISE", "nats-0.nats:6222")

	bin := filepath.Join(root, "bin", "nats-server")
	if _, err := os.Stat(bin); err != nil {
		t.Fatalf("%s: %v (make tools builds the pinned nats-server)", bin, err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	if out, err := exec.CommandContext(ctx, bin, "-c", path, "-t").CombinedOutput(); err != nil {
		t.Fatalf("nats-server -t: %v\n%s", err, out)
	}

	opts, err := server.ProcessConfigFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if min := int32(natsx.MaxValueSize + natsx.MaxHeaderBytes); opts.MaxPayload < min {
		t.Errorf("max_payload %d is below a maximum KV value with its headers (%d)", opts.MaxPayload, min)
	}
	if !opts.JetStream || !opts.SyncAlways {
		t.Errorf("jetstream %v, sync_interval always %v: want both", opts.JetStream, opts.SyncAlways)
	}
	if opts.TLSConfig == nil || !opts.TLSMap || opts.TLSConfig.MinVersion != tls.VersionTLS13 || opts.TLSConfig.ClientAuth != tls.RequireAndVerifyClientCert {
		t.Error("client TLS must be 1.3, verify client certificates and map them to users")
	}
	if opts.Cluster.TLSConfig == nil || !opts.Cluster.TLSCheckKnownURLs || len(opts.Routes) != 3 || opts.Cluster.Name != "mesh" {
		t.Errorf("cluster: TLS %v, known-URL check %v, %d routes: want TLS, the check and 3 routes", opts.Cluster.TLSConfig != nil, opts.Cluster.TLSCheckKnownURLs, len(opts.Routes))
	}

	checkNATSUsers(t, opts.Users, "mesh.local")
}

// TestTestNATSIsDeploys checks that the nats-server the multi-process
// tests run (natsconf.SingleServer, used by tests/internal/procmesh) is
// deploy/nats/nats-server.conf's but for its cluster, addresses, paths and
// trust domain: the same TLS, JetStream, limits, users and permissions. A
// change to either that the other does not follow fails here.
func TestTestNATSIsDeploys(t *testing.T) {
	root := repoRoot(t)
	t.Setenv("SERVER_NAME", "nats-0")
	t.Setenv("CLUSTER_ADVERTISE", "nats-0.nats:6222")
	prod, err := server.ProcessConfigFile(natsTestFiles(t, root))
	if err != nil {
		t.Fatal(err)
	}

	dir := t.TempDir()
	ca, err := pki.NewCA("mesh.test", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if err := natsconf.WriteServerCerts(ca, filepath.Join(dir, "certs")); err != nil {
		t.Fatal(err)
	}
	deploy, err := natsconf.Deploy()
	if err != nil {
		t.Fatal(err)
	}
	conf, err := natsconf.SingleServer(deploy, natsconf.Options{ServerName: "mesh-test", Listen: "127.0.0.1:14222", Monitor: "127.0.0.1:18222",
		CertsDir: filepath.Join(dir, "certs"), StoreDir: filepath.Join(dir, "js"), TrustDomain: "mesh.test"})
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "nats-server.conf")
	if err := os.WriteFile(path, conf, 0o600); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.CommandContext(t.Context(), filepath.Join(root, "bin", "nats-server"), "-c", path, "-t").CombinedOutput(); err != nil {
		t.Fatalf("nats-server -t of the test configuration: %v\n%s", err, out)
	}
	test, err := server.ProcessConfigFile(path)
	if err != nil {
		t.Fatal(err)
	}

	if test.ServerName != "mesh-test" || test.Host != "127.0.0.1" || test.Port != 14222 || test.HTTPHost != "127.0.0.1" || test.HTTPPort != 18222 || test.StoreDir != filepath.Join(dir, "js") {
		t.Errorf("test server %s at %s:%d, monitor %s:%d, store %s: not what was asked", test.ServerName, test.Host, test.Port, test.HTTPHost, test.HTTPPort, test.StoreDir)
	}
	if test.Cluster.Port != 0 || len(test.Routes) > 0 {
		t.Errorf("the test server is clustered: port %d, routes %v", test.Cluster.Port, test.Routes)
	}
	type pair struct {
		what       string
		prod, test any
	}
	same := []pair{
		{"jetstream", prod.JetStream, test.JetStream},
		{"sync_interval always", prod.SyncAlways, test.SyncAlways},
		{"max_memory_store", prod.JetStreamMaxMemory, test.JetStreamMaxMemory},
		{"max_file_store", prod.JetStreamMaxStore, test.JetStreamMaxStore},
		{"max_payload", prod.MaxPayload, test.MaxPayload},
		{"write_deadline", prod.WriteDeadline, test.WriteDeadline},
		{"ping_interval", prod.PingInterval, test.PingInterval},
		{"tls", prod.TLSConfig != nil, test.TLSConfig != nil},
		{"verify_and_map", prod.TLSMap, test.TLSMap},
		{"tls timeout", prod.TLSTimeout, test.TLSTimeout},
		{"authorization timeout", prod.AuthTimeout, test.AuthTimeout},
		{"users", len(prod.Users), len(test.Users)},
	}
	if prod.TLSConfig != nil && test.TLSConfig != nil {
		same = append(same, pair{"tls min_version", prod.TLSConfig.MinVersion, test.TLSConfig.MinVersion},
			pair{"tls client auth", prod.TLSConfig.ClientAuth, test.TLSConfig.ClientAuth})
	}
	for _, c := range same {
		if !reflect.DeepEqual(c.prod, c.test) {
			t.Errorf("%s: deploy/nats has %v, the test server %v", c.what, c.prod, c.test)
		}
	}
	prodUsers := map[string]*server.Permissions{}
	for _, u := range prod.Users {
		prodUsers[strings.Replace(u.Username, "spiffe://mesh.local/", "spiffe://mesh.test/", 1)] = u.Permissions
	}
	for _, u := range test.Users {
		if !reflect.DeepEqual(prodUsers[u.Username], u.Permissions) {
			t.Errorf("NATS user %s: the test server's permissions differ from deploy/nats's", u.Username)
		}
	}
	checkNATSUsers(t, test.Users, "mesh.test")
}

// NATS users of deploy/nats/nats-server.conf, in trust domain mesh.local.
const (
	natsCatalog  = "service/catalog"
	natsComposer = "service/composer"
	natsBackup   = "operator/backup"
	natsRestore  = "operator/restore"
)

// streamOf names the stream a subject a user may publish to acts on, and
// what it does there: "data" (a bucket's own subjects), "ack"/"fc" (a
// consumer's acknowledgements and flow control), or the JetStream API verb
// (STREAM.INFO, CONSUMER.CREATE, DIRECT.GET, ...). ok is false for a subject
// naming no single stream.
func streamOf(subject string) (stream, verb string, ok bool) {
	for _, p := range []struct {
		re   *regexp.Regexp
		verb string
	}{
		{regexp.MustCompile(`^\$KV\.([-\w]+)\.>$`), "data"},
		{regexp.MustCompile(`^\$O\.([-\w]+)\.>$`), "data"},
		{regexp.MustCompile(`^\$JS\.ACK\.(?:\*\.\*\.)?([-\w]+)\.>$`), "ack"},
		{regexp.MustCompile(`^\$JS\.FC\.(?:\*\.\*\.)?([-\w]+)\.>$`), "fc"},
		{regexp.MustCompile(`^\$JS\.API\.(STREAM\.(?:INFO|CREATE|UPDATE|PURGE|DELETE|MSG\.GET|MSG\.DELETE))\.([-\w]+)$`), ""},
		{regexp.MustCompile(`^\$JS\.API\.(DIRECT\.GET)\.([-\w]+)(?:\.>)?$`), ""},
		{regexp.MustCompile(`^\$JS\.API\.(CONSUMER\.(?:CREATE|DURABLE\.CREATE|INFO|DELETE|MSG\.NEXT))\.([-\w]+)(?:\.>|\.\*)?$`), ""},
	} {
		m := p.re.FindStringSubmatch(subject)
		switch {
		case m == nil:
			continue
		case p.verb == "":
			return m[2], m[1], true
		case strings.HasPrefix(subject, "$KV."):
			return "KV_" + m[1], p.verb, true
		case strings.HasPrefix(subject, "$O."):
			return "OBJ_" + m[1], p.verb, true
		default:
			return m[1], p.verb, true
		}
	}
	return "", "", false
}

// natsGrants is what a user may do: verbs (streamOf) by stream.
type natsGrants map[string]map[string]bool

func (g natsGrants) add(stream string, verbs ...string) {
	if g[stream] == nil {
		g[stream] = map[string]bool{}
	}
	for _, v := range verbs {
		g[stream][v] = true
	}
}

// Verbs of a stream's reader (ordered consumers, message gets), its writer
// and its owner (a service that creates and watches its buckets).
var (
	readVerbs  = []string{"STREAM.INFO", "STREAM.MSG.GET", "DIRECT.GET", "CONSUMER.CREATE", "CONSUMER.INFO", "CONSUMER.DELETE", "CONSUMER.MSG.NEXT", "fc"}
	writeVerbs = []string{"data", "STREAM.CREATE", "STREAM.UPDATE"}
	ownVerbs   = append(append([]string{"STREAM.PURGE", "ack"}, readVerbs...), writeVerbs...)
)

func streamName(bucket string) string {
	for _, o := range natsx.ObjectStores(1) {
		if o.Bucket == bucket {
			return "OBJ_" + bucket
		}
	}
	return "KV_" + bucket
}

// wantNATSGrants is what each NATS user must be able to do and no more:
// each service owns its buckets; backup reads the streams an archive holds
// (backup.Buckets); restore writes those (an object put replaces chunks by
// purging them) and reads whether a composer holds the lease.
func wantNATSGrants() map[string]natsGrants {
	want := map[string]natsGrants{natsCatalog: {}, natsComposer: {}, natsBackup: {}, natsRestore: {}}
	var all []string
	for _, b := range append(natsx.Buckets(3), natsx.LeaseSpec(3, time.Minute)) {
		all = append(all, b.Bucket)
	}
	for _, o := range natsx.ObjectStores(3) {
		all = append(all, o.Bucket)
	}
	for _, b := range all {
		owner := natsComposer
		if slices.Contains(catalogOwns, b) {
			owner = natsCatalog
		}
		want[owner].add(streamName(b), ownVerbs...)
	}
	for _, b := range backup.Buckets {
		want[natsBackup].add(streamName(b), readVerbs...)
		want[natsRestore].add(streamName(b), append(readVerbs, writeVerbs...)...)
		if streamName(b) == "OBJ_"+b {
			want[natsRestore].add(streamName(b), "STREAM.PURGE")
		}
	}
	want[natsRestore].add("KV_"+natsx.BucketComposerLease, "STREAM.INFO", "STREAM.MSG.GET")
	return want
}

// checkNATSUsers checks that the users are exactly the catalog's, the
// composer's, backup's and restore's, each able to do exactly what
// wantNATSGrants says on the streams it names and nothing on any other:
// every subject a user may publish to acts on one stream, none deletes a
// stream or lists streams, and replies come only to _INBOX.
func checkNATSUsers(t *testing.T, users []*server.User, trustDomain string) {
	t.Helper()
	byName := map[string]*server.User{}
	for _, u := range users {
		byName[u.Username] = u
	}
	want := wantNATSGrants()
	var names []string
	for who := range want {
		names = append(names, "spiffe://"+trustDomain+"/"+who)
	}
	if got := slices.Sorted(mapsKeys(byName)); !slices.Equal(got, slices.Sorted(slices.Values(names))) {
		t.Fatalf("NATS users %v, want exactly %v", got, slices.Sorted(slices.Values(names)))
	}
	haves := map[string]natsGrants{}
	for who, grants := range want {
		u := byName["spiffe://"+trustDomain+"/"+who]
		if u.Permissions == nil || u.Permissions.Publish == nil || u.Permissions.Subscribe == nil {
			t.Errorf("%s has no publish and subscribe permissions: it may do anything", who)
			continue
		}
		if len(u.Permissions.Publish.Deny) > 0 || len(u.Permissions.Subscribe.Deny) > 0 || u.Permissions.Response != nil {
			t.Errorf("%s: deny lists or allow_responses are not how these users are written", who)
		}
		if !slices.Equal(u.Permissions.Subscribe.Allow, []string{"_INBOX.>"}) {
			t.Errorf("%s may subscribe to %v, want only _INBOX.>", who, u.Permissions.Subscribe.Allow)
		}
		have := natsGrants{}
		haves[who] = have
		for _, s := range u.Permissions.Publish.Allow {
			stream, verb, ok := streamOf(s)
			if !ok {
				t.Errorf("%s may publish to %s, which acts on no one stream", who, s)
				continue
			}
			if verb == "STREAM.DELETE" || verb == "STREAM.MSG.DELETE" || verb == "CONSUMER.DURABLE.CREATE" {
				t.Errorf("%s may publish to %s", who, s)
			}
			have.add(stream, verb)
		}
		for stream, verbs := range have {
			for verb := range verbs {
				if !grants[stream][verb] {
					t.Errorf("%s may %s %s; it needs not", who, verbWords(verb), stream)
				}
			}
		}
		for stream, verbs := range grants {
			for verb := range verbs {
				if !have[stream][verb] {
					t.Errorf("%s may not %s %s, which it needs", who, verbWords(verb), stream)
				}
			}
		}
	}
	// What the operators' users must never do, said once more plainly.
	for _, b := range backup.Buckets {
		for _, verb := range []string{"data", "STREAM.CREATE", "STREAM.UPDATE", "STREAM.PURGE", "ack"} {
			if haves[natsBackup][streamName(b)][verb] {
				t.Errorf("backup may %s %s", verbWords(verb), streamName(b))
			}
		}
	}
	for _, b := range []string{natsx.BucketComposed, natsx.BucketHaves, natsx.BucketStatus} {
		if len(haves[natsBackup]["KV_"+b]) > 0 || len(haves[natsRestore]["KV_"+b]) > 0 {
			t.Errorf("backup or restore may touch %s, which no archive holds", b)
		}
	}
}

// verbWords says a verb of streamOf in words.
func verbWords(verb string) string {
	switch verb {
	case "data":
		return "publish to the subjects of"
	case "ack":
		return "acknowledge consumer messages of"
	case "fc":
		return "answer flow control of"
	}
	return "call " + verb + " on"
}

func mapsKeys[V any](m map[string]V) func(func(string) bool) {
	return func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

// object is one decoded manifest document.
type object struct {
	file, kind, name string
	obj              any
}

// decodeStrict decodes a multi-document YAML file into the Kubernetes API
// types by kind, refusing unknown fields and duplicate keys.
func decodeStrict(t *testing.T, file string, data []byte) []object {
	t.Helper()
	var out []object
	for i, doc := range regexp.MustCompile(`(?m)^---\s*$`).Split(string(data), -1) {
		if strings.TrimSpace(stripComments(doc)) == "" {
			continue
		}
		js, err := yaml.YAMLToJSONStrict([]byte(doc))
		if err != nil {
			t.Errorf("%s document %d: %v", file, i, err)
			continue
		}
		var meta struct {
			APIVersion string `json:"apiVersion"`
			Kind       string `json:"kind"`
		}
		if err := json.Unmarshal(js, &meta); err != nil {
			t.Errorf("%s document %d: %v", file, i, err)
			continue
		}
		var obj interface{ GetName() string }
		switch meta.APIVersion + "/" + meta.Kind {
		case "v1/Namespace":
			obj = &corev1.Namespace{}
		case "v1/ConfigMap":
			obj = &corev1.ConfigMap{}
		case "v1/Secret":
			obj = &corev1.Secret{}
		case "v1/Service":
			obj = &corev1.Service{}
		case "v1/PersistentVolumeClaim":
			obj = &corev1.PersistentVolumeClaim{}
		case "apps/v1/Deployment":
			obj = &appsv1.Deployment{}
		case "apps/v1/StatefulSet":
			obj = &appsv1.StatefulSet{}
		case "apps/v1/DaemonSet":
			obj = &appsv1.DaemonSet{}
		case "batch/v1/CronJob":
			obj = &batchv1.CronJob{}
		case "policy/v1/PodDisruptionBudget":
			obj = &policyv1.PodDisruptionBudget{}
		case "networking.k8s.io/v1/NetworkPolicy":
			obj = &networkingv1.NetworkPolicy{}
		default:
			t.Errorf("%s document %d: kind %s/%s is not one this test knows", file, i, meta.APIVersion, meta.Kind)
			continue
		}
		dec := json.NewDecoder(bytes.NewReader(js))
		dec.DisallowUnknownFields()
		if err := dec.Decode(obj); err != nil {
			t.Errorf("%s document %d (%s): %v", file, i, meta.Kind, err)
			continue
		}
		out = append(out, object{file: file, kind: meta.Kind, name: obj.GetName(), obj: obj})
	}
	return out
}

func stripComments(doc string) string {
	var b strings.Builder
	for _, l := range strings.Split(doc, "\n") {
		if !strings.HasPrefix(strings.TrimSpace(l), "#") {
			b.WriteString(l + "\n")
		}
	}
	return b.String()
}

// generated runs deploy/compose/gen.sh and deploy/k8s/secrets.sh, as an
// operator would, with meshctl and mesh-signer built from this checkout.
func generated(t *testing.T, root string) (dir string, secrets []byte) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Minute)
	defer cancel()
	bin := t.TempDir()
	build := exec.CommandContext(ctx, "go", "build", "-o", bin+"/", "mesh.dev/cmd/meshctl", "mesh.dev/services/signer/cmd/mesh-signer")
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	dir = filepath.Join(t.TempDir(), "deploy")
	if out, err := exec.CommandContext(ctx, "bash", filepath.Join(root, "deploy/compose/gen.sh"), "--bin", bin, dir).CombinedOutput(); err != nil {
		t.Fatalf("gen.sh: %v\n%s", err, out)
	}
	secrets, err := exec.CommandContext(ctx, "bash", filepath.Join(root, "deploy/k8s/secrets.sh"), dir).Output()
	if err != nil {
		t.Fatalf("secrets.sh: %v", err)
	}
	return dir, secrets
}

// strictConfig decodes YAML text into a service's Config the way the
// service does (unknown keys refused), then fills defaults and validates.
func strictConfig(t *testing.T, where, text string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), filepath.Base(where))
	if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	type validated interface {
		Defaults()
		Validate() error
	}
	var cfg validated
	switch base := filepath.Base(where); {
	case strings.HasPrefix(base, "catalog"):
		cfg = &catalogapp.Config{}
	case strings.HasPrefix(base, "signer"):
		cfg = &signerapp.Config{}
	case strings.HasPrefix(base, "composer"):
		cfg = &composerapp.Config{}
	case strings.HasPrefix(base, "nodeengine"):
		cfg = &nodeengineapp.Config{}
	default:
		t.Fatalf("%s: no service config of that name", where)
	}
	if err := config.Load(path, cfg); err != nil {
		t.Errorf("%s: %v", where, err)
		return
	}
	cfg.Defaults()
	if err := cfg.Validate(); err != nil {
		t.Errorf("%s: %v", where, err)
	}
}

// TestServiceConfigs decodes every configuration file deploy/ ships or
// generates strictly into its service's Config.
func TestServiceConfigs(t *testing.T) {
	root := repoRoot(t)
	files, err := filepath.Glob(filepath.Join(root, "deploy/systemd/etc-mesh/*.yaml"))
	if err != nil || len(files) != 4 {
		t.Fatalf("systemd configs %v: %v", files, err)
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		strictConfig(t, f, string(b))
	}
	dir, _ := generated(t, root)
	gen, err := filepath.Glob(filepath.Join(dir, "*", "*.yaml"))
	if err != nil || len(gen) != 7 {
		t.Fatalf("generated configs %v: %v", gen, err)
	}
	for _, f := range gen {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		strictConfig(t, f, string(b))
	}
}

// TestSystemdUnits checks the hardening every unit keeps.
func TestSystemdUnits(t *testing.T) {
	root := repoRoot(t)
	units, err := filepath.Glob(filepath.Join(root, "deploy/systemd/*.service"))
	if err != nil || len(units) != 6 {
		t.Fatalf("units %v: %v", units, err)
	}
	for _, u := range units {
		b, err := os.ReadFile(u)
		if err != nil {
			t.Fatal(err)
		}
		lines := strings.Split(string(b), "\n")
		has := func(l string) bool { return slices.Contains(lines, l) }
		for _, want := range []string{"NoNewPrivileges=yes", "ProtectSystem=strict", "ProtectHome=yes", "PrivateTmp=yes", "EnvironmentFile=-/etc/mesh/otel.env"} {
			if !has(want) {
				t.Errorf("%s lacks %s", filepath.Base(u), want)
			}
		}
		engine := filepath.Base(u) == "mesh-nodeengine.service"
		switch {
		case engine && (!has("User=root") || !has("CapabilityBoundingSet=CAP_CHOWN CAP_DAC_OVERRIDE CAP_FOWNER CAP_FSETID")):
			t.Errorf("%s: the engine runs as root with only the file capabilities", filepath.Base(u))
		case !engine && (has("User=root") || !has("CapabilityBoundingSet=") || !slices.ContainsFunc(lines, func(l string) bool { return strings.HasPrefix(l, "User=") })):
			t.Errorf("%s: a service runs as its own user with no capabilities", filepath.Base(u))
		}
	}
}

// TestKubernetesManifests decodes every manifest strictly and checks the
// invariants of mesh's deployment.
func TestKubernetesManifests(t *testing.T) {
	root := repoRoot(t)
	files, err := filepath.Glob(filepath.Join(root, "deploy/k8s/*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("manifests %v: %v", files, err)
	}
	var objs []object
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		objs = append(objs, decodeStrict(t, filepath.Base(f), b)...)
	}
	dir, secrets := generated(t, root)
	objs = append(objs, decodeStrict(t, "secrets.sh output", secrets)...)

	images := buildImages(t, root)
	byKind := map[string]map[string]object{}
	for _, o := range objs {
		if byKind[o.kind] == nil {
			byKind[o.kind] = map[string]object{}
		}
		if _, dup := byKind[o.kind][o.name]; dup {
			t.Errorf("%s %s is defined twice", o.kind, o.name)
		}
		byKind[o.kind][o.name] = o
	}

	type workload struct {
		name     string
		replicas int32
		pod      corev1.PodTemplateSpec
	}
	var workloads []workload
	for _, o := range objs {
		switch w := o.obj.(type) {
		case *appsv1.Deployment:
			workloads = append(workloads, workload{w.Name, *w.Spec.Replicas, w.Spec.Template})
		case *appsv1.StatefulSet:
			workloads = append(workloads, workload{w.Name, *w.Spec.Replicas, w.Spec.Template})
			if len(w.Spec.VolumeClaimTemplates) == 0 {
				t.Errorf("statefulset %s keeps JetStream on no volume claim", w.Name)
			}
		case *appsv1.DaemonSet:
			workloads = append(workloads, workload{w.Name, -1, w.Spec.Template})
		case *batchv1.CronJob:
			// A job: no replicas, no probes; one run at a time.
			workloads = append(workloads, workload{w.Name, 0, w.Spec.JobTemplate.Spec.Template})
			if w.Spec.ConcurrencyPolicy != batchv1.ForbidConcurrent {
				t.Errorf("cronjob %s may run twice at once: concurrencyPolicy Forbid", w.Name)
			}
		}
	}
	wantReplicas := map[string]int32{"nats": 3, "catalog": 1, "signer": 1, "composer": 2, "nodeengine": -1, "backup": 0}
	if len(workloads) != len(wantReplicas) {
		t.Errorf("%d workloads, want %d", len(workloads), len(wantReplicas))
	}
	if d, ok := byKind["Deployment"]["signer"]; ok && d.obj.(*appsv1.Deployment).Spec.Strategy.Type != appsv1.RecreateDeploymentStrategyType {
		t.Error("the signer must never run twice: strategy Recreate")
	}
	policies := map[string]bool{}
	for _, o := range byKind["NetworkPolicy"] {
		np := o.obj.(*networkingv1.NetworkPolicy)
		policies[np.Spec.PodSelector.MatchLabels["app.kubernetes.io/name"]] = true
	}
	for _, w := range workloads {
		if want, ok := wantReplicas[w.name]; !ok || want != w.replicas {
			t.Errorf("workload %s has %d replicas, want %d", w.name, w.replicas, want)
		}
		if !policies[w.name] {
			t.Errorf("workload %s has no NetworkPolicy", w.name)
		}
		spec := w.pod.Spec
		for _, c := range spec.InitContainers {
			checkSecurity(t, w.name, w.name+"/init/"+c.Name, c.SecurityContext)
			if !slices.Contains(images, c.Image) {
				t.Errorf("%s/init/%s: image %s is not built by deploy/images/build.sh", w.name, c.Name, c.Image)
			}
		}
		for _, c := range spec.Containers {
			where := w.name + "/" + c.Name
			if c.Resources.Requests.Cpu().IsZero() || c.Resources.Requests.Memory().IsZero() {
				t.Errorf("%s requests no cpu or memory", where)
			}
			if !slices.Contains(images, c.Image) {
				t.Errorf("%s: image %s is not built by deploy/images/build.sh (%v)", where, c.Image, images)
			}
			checkSecurity(t, w.name, where, c.SecurityContext)
			if w.replicas != 0 {
				checkProbes(t, w.name, where, c)
			}
			for _, e := range c.EnvFrom {
				if e.ConfigMapRef != nil && byKind["ConfigMap"][e.ConfigMapRef.Name].obj == nil {
					t.Errorf("%s: envFrom ConfigMap %s does not exist", where, e.ConfigMapRef.Name)
				}
			}
		}
		for _, v := range spec.Volumes {
			switch {
			case v.ConfigMap != nil && byKind["ConfigMap"][v.ConfigMap.Name].obj == nil:
				t.Errorf("%s: ConfigMap %s does not exist", w.name, v.ConfigMap.Name)
			case v.Secret != nil && byKind["Secret"][v.Secret.SecretName].obj == nil:
				t.Errorf("%s: Secret %s does not exist", w.name, v.Secret.SecretName)
			case v.PersistentVolumeClaim != nil && byKind["PersistentVolumeClaim"][v.PersistentVolumeClaim.ClaimName].obj == nil:
				t.Errorf("%s: PersistentVolumeClaim %s does not exist", w.name, v.PersistentVolumeClaim.ClaimName)
			case v.HostPath != nil && w.name != "nodeengine":
				t.Errorf("%s mounts host path %s: only node engines may", w.name, v.HostPath.Path)
			}
		}
	}

	// The NATS ConfigMap is deploy/nats/nats-server.conf, and every
	// service config a ConfigMap holds decodes strictly.
	conf, err := os.ReadFile(filepath.Join(root, natsConf))
	if err != nil {
		t.Fatal(err)
	}
	if got := byKind["ConfigMap"]["nats-config"].obj.(*corev1.ConfigMap).Data["nats-server.conf"]; got != string(conf) {
		t.Errorf("ConfigMap nats-config differs from %s", natsConf)
	}
	for _, o := range byKind["ConfigMap"] {
		for key, text := range o.obj.(*corev1.ConfigMap).Data {
			if strings.HasSuffix(key, ".yaml") {
				strictConfig(t, o.file+": "+key, text)
			}
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "nats-all", "certs", "server.pem")); err != nil {
		t.Error(err)
	}
}

// buildImages lists the images deploy/images/build.sh builds.
func buildImages(t *testing.T, root string) []string {
	t.Helper()
	out, err := exec.CommandContext(t.Context(), "bash", filepath.Join(root, "deploy/images/build.sh"), "--list").Output()
	if err != nil {
		t.Fatalf("build.sh --list: %v", err)
	}
	return strings.Fields(string(out))
}

// Workloads that run as root: the node engine (files of any owner under its
// prefixes). The signer runs as uid 65532: an init container imports its
// key from the Secret into an owner-only file (see signer.yaml).
var runsAsRoot = map[string]bool{"nodeengine": true}

func checkSecurity(t *testing.T, workload, where string, sc *corev1.SecurityContext) {
	t.Helper()
	if sc == nil {
		t.Errorf("%s has no securityContext", where)
		return
	}
	if sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
		t.Errorf("%s: want allowPrivilegeEscalation false and readOnlyRootFilesystem true", where)
	}
	if sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) {
		t.Errorf("%s drops not ALL capabilities", where)
	}
	nonRoot := sc.RunAsNonRoot != nil && *sc.RunAsNonRoot && sc.RunAsUser != nil && *sc.RunAsUser != 0
	switch {
	case !runsAsRoot[workload] && !nonRoot:
		t.Errorf("%s must run as a non-root user", where)
	case !runsAsRoot[workload] && len(sc.Capabilities.Add) > 0:
		t.Errorf("%s adds capabilities %v", where, sc.Capabilities.Add)
	}
}

func checkProbes(t *testing.T, workload, where string, c corev1.Container) {
	t.Helper()
	for name, p := range map[string]*corev1.Probe{"readiness": c.ReadinessProbe, "liveness": c.LivenessProbe} {
		switch {
		case p == nil:
			t.Errorf("%s has no %s probe", where, name)
		case workload == "nats":
			if p.HTTPGet == nil || !strings.HasPrefix(p.HTTPGet.Path, "/healthz") {
				t.Errorf("%s: %s probe is not nats-server's /healthz", where, name)
			}
		case p.Exec == nil || len(p.Exec.Command) == 0 || p.Exec.Command[0] != "/grpc-health-probe" || !slices.Contains(p.Exec.Command, "-tls"):
			// kubelet's own gRPC probe speaks no TLS, and mesh serves
			// health only over mTLS.
			t.Errorf("%s: %s probe is not gRPC health over mTLS (grpc-health-probe -tls)", where, name)
		default:
			port := fmt.Sprint(map[string]int{"catalog": 7401, "signer": 7402, "composer": 7403, "nodeengine": 7404}[workload])
			if !slices.Contains(p.Exec.Command, "-addr=localhost:"+port) {
				t.Errorf("%s: %s probe does not ask port %s", where, name, port)
			}
		}
	}
}
