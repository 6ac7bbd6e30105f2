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
	"regexp"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	"sigs.k8s.io/yaml"

	"mesh.dev/internal/config"
	"mesh.dev/internal/identity"
	"mesh.dev/internal/natsx"
	"mesh.dev/internal/pki"
	catalogapp "mesh.dev/services/catalog/app"
	composerapp "mesh.dev/services/composer/app"
	nodeengineapp "mesh.dev/services/nodeengine/app"
	signerapp "mesh.dev/services/signer/app"
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

	users := map[string]*server.User{}
	for _, u := range opts.Users {
		users[u.Username] = u
	}
	catalog, composer := users["spiffe://mesh.local/service/catalog"], users["spiffe://mesh.local/service/composer"]
	if len(users) != 2 || catalog == nil || composer == nil {
		t.Fatalf("users %v: want exactly the catalog's and the composer's", slices.Sorted(mapsKeys(users)))
	}
	owner := func(subject string) []string {
		var who []string
		for name, u := range users {
			if slices.Contains(u.Permissions.Publish.Allow, subject) {
				who = append(who, name)
			}
		}
		return who
	}
	check := func(bucket, data, stream string) {
		want := "spiffe://mesh.local/service/composer"
		if slices.Contains(catalogOwns, bucket) {
			want = "spiffe://mesh.local/service/catalog"
		}
		for _, subj := range []string{data, "$JS.API.STREAM.CREATE." + stream, "$JS.API.STREAM.INFO." + stream, "$JS.API.CONSUMER.CREATE." + stream + ".>"} {
			if got := owner(subj); !slices.Equal(got, []string{want}) {
				t.Errorf("%s: may be published by %v, want only %s", subj, got, want)
			}
		}
	}
	for _, b := range append(natsx.Buckets(3), natsx.LeaseSpec(3, time.Minute)) {
		check(b.Bucket, "$KV."+b.Bucket+".>", "KV_"+b.Bucket)
	}
	for _, o := range natsx.ObjectStores(3) {
		check(o.Bucket, "$O."+o.Bucket+".>", "OBJ_"+o.Bucket)
	}
	for name, u := range users {
		for _, s := range u.Permissions.Publish.Allow {
			if s == ">" || strings.HasPrefix(s, "$JS.API.>") || strings.Contains(s, "STREAM.DELETE") || strings.Contains(s, ".LIST") || strings.Contains(s, "$JS.API.INFO") {
				t.Errorf("%s may publish to %s", name, s)
			}
		}
		if !slices.Equal(u.Permissions.Subscribe.Allow, []string{"_INBOX.>"}) {
			t.Errorf("%s may subscribe to %v, want only _INBOX.>", name, u.Permissions.Subscribe.Allow)
		}
	}
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
	if err != nil || len(units) != 5 {
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
		}
	}
	wantReplicas := map[string]int32{"nats": 3, "catalog": 1, "signer": 1, "composer": 2, "nodeengine": -1}
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
			checkProbes(t, w.name, where, c)
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
