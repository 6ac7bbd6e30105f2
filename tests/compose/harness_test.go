package compose

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"

	"mesh.dev/internal/grpcclient"
	"mesh.dev/internal/pki"
	"mesh.dev/internal/testutil"
)

// repoRoot is the checkout this test runs in (tests/compose is two below).
func repoRoot(t testing.TB) string {
	t.Helper()
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		t.Fatal("no caller")
	}
	return filepath.Clean(filepath.Join(filepath.Dir(file), "..", ".."))
}

// requireDockerEnv set to 1 (as .ci/run sets it) turns a missing docker
// into a failure: CI must never pass by skipping the deployment test.
const requireDockerEnv = "MESH_REQUIRE_DOCKER"

// composeCLI returns the compose command this machine has: the docker CLI
// plugin ("docker compose") or the standalone docker-compose. It skips the
// test, saying why, when docker itself is unavailable, and fails it instead
// when MESH_REQUIRE_DOCKER=1.
func composeCLI(t *testing.T) []string {
	t.Helper()
	skip := func(why string) {
		t.Helper()
		if os.Getenv(requireDockerEnv) == "1" {
			t.Fatalf("%s, and %s=1 requires it", why, requireDockerEnv)
		}
		t.Skip(why)
	}
	if _, err := exec.LookPath("docker"); err != nil {
		skip("docker is not installed: the compose deployment test needs docker and docker compose")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if out, err := exec.CommandContext(ctx, "docker", "info", "--format", "{{.ServerVersion}}").CombinedOutput(); err != nil {
		skip(fmt.Sprintf("docker is not usable (docker info: %v: %s): the compose deployment test needs a docker engine", err, bytes.TrimSpace(out)))
	}
	if exec.CommandContext(ctx, "docker", "compose", "version").Run() == nil {
		return []string{"docker", "compose"}
	}
	if _, err := exec.LookPath("docker-compose"); err == nil {
		return []string{"docker-compose"}
	}
	skip("neither `docker compose` nor `docker-compose` is installed")
	return nil
}

// deployment is one compose project of deploy/compose under a unique name.
type deployment struct {
	t       *testing.T
	cli     []string
	root    string
	dir     string // what gen.sh wrote
	project string
	env     []string
}

func newDeployment(t *testing.T, cli []string, root, dir string) *deployment {
	b := make([]byte, 4)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	d := &deployment{t: t, cli: cli, root: root, dir: dir, project: "meshtest" + hex.EncodeToString(b)}
	// Published ports are free ones picked here rather than by docker,
	// which picks anew whenever a container restarts (and the test restarts
	// some); they never collide with a deployment an operator has up.
	d.env = append(os.Environ(), "MESH_DIR="+dir)
	// The images build.sh tagged (MESH_IMAGE_TAG) are the ones to run.
	if tag := os.Getenv("MESH_IMAGE_TAG"); tag != "" && os.Getenv("MESH_TAG") == "" {
		d.env = append(d.env, "MESH_TAG="+tag)
	}
	for _, v := range []string{"CATALOG", "SIGNER", "COMPOSER1", "COMPOSER2", "NODE_ACE", "NODE_BAY", "NODE_COD", "NATS0", "NATS1", "NATS2"} {
		d.env = append(d.env, fmt.Sprintf("MESH_%s_PORT=%d", v, testutil.FreePort(t)))
	}
	return d
}

// run runs a command with a deadline and returns its combined output.
func run(ctx context.Context, env []string, name string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Env = env
	cmd.WaitDelay = 5 * time.Second
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("%s %s: %w\n%s", name, strings.Join(args, " "), err, out)
	}
	return string(out), nil
}

// compose runs a compose subcommand on the project.
func (d *deployment) compose(timeout time.Duration, args ...string) string {
	d.t.Helper()
	out, err := d.tryCompose(timeout, args...)
	if err != nil {
		d.t.Fatal(err)
	}
	return out
}

func (d *deployment) tryCompose(timeout time.Duration, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	all := append(append([]string{}, d.cli[1:]...), "-p", d.project,
		"-f", filepath.Join(d.root, "deploy", "compose", "docker-compose.yml"),
		"--env-file", filepath.Join(d.dir, "compose.env"))
	return run(ctx, d.env, d.cli[0], append(all, args...)...)
}

// docker runs a docker command.
func (d *deployment) docker(args ...string) string {
	d.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	out, err := run(ctx, d.env, "docker", args...)
	if err != nil {
		d.t.Fatal(err)
	}
	return out
}

// container returns the id of a service's container.
func (d *deployment) container(service string) string {
	d.t.Helper()
	id := strings.TrimSpace(d.compose(time.Minute, "ps", "-q", service))
	if id == "" {
		d.t.Fatalf("service %s has no container", service)
	}
	return id
}

// network is the project's private network.
func (d *deployment) network() string { return d.project + "_mesh" }

// addr returns the loopback address docker published a service's port on.
func (d *deployment) addr(service string, port int) string {
	d.t.Helper()
	out := strings.TrimSpace(d.compose(time.Minute, "port", service, fmt.Sprint(port)))
	// "127.0.0.1:49153"; the v2 plugin may print one line per address.
	line, _, _ := strings.Cut(out, "\n")
	if !strings.HasPrefix(line, "127.0.0.1:") {
		d.t.Fatalf("%s:%d is published as %q, want 127.0.0.1:PORT", service, port, out)
	}
	return line
}

// down removes the project's containers, network and volumes; the logs of
// a failed run are kept in the test log first.
// With MESH_COMPOSE_KEEP=1 a failed run's project is left up to look at
// (docker-compose -p <project> ... down -v removes it).
func (d *deployment) down() {
	if d.t.Failed() {
		if out, err := d.tryCompose(2*time.Minute, "logs", "--no-color", "--tail", "60"); err == nil {
			d.t.Logf("logs of %s:\n%s", d.project, out)
		}
		if os.Getenv("MESH_COMPOSE_KEEP") == "1" {
			d.t.Logf("MESH_COMPOSE_KEEP=1: project %s is left up (deployment %s)", d.project, d.dir)
			return
		}
	}
	if out, err := d.tryCompose(3*time.Minute, "down", "-v", "--remove-orphans", "-t", "5"); err != nil {
		d.t.Errorf("compose down: %v\n%s", err, out)
	}
}

// dial connects to a published service port with a certificate of the
// deployment: the operator's and builder's are in pki/, each container's in
// its own directory.
func (d *deployment) dial(addr, certDir, basename string) *grpc.ClientConn {
	d.t.Helper()
	cert, key := pki.Paths(filepath.Join(d.dir, certDir), basename)
	cfg, err := pki.ClientTLS(cert, key, filepath.Join(d.dir, "pki", pki.CACertFile))
	if err != nil {
		d.t.Fatal(err)
	}
	conn, err := grpcclient.Dial(addr, cfg)
	if err != nil {
		d.t.Fatal(err)
	}
	d.t.Cleanup(func() { conn.Close() })
	return conn
}

// eventually polls cond every interval until it returns nil or the timeout
// passes, and then fails with the last error.
func eventually(t *testing.T, what string, timeout time.Duration, cond func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	start := time.Now()
	var err error
	said := start
	for {
		if err = cond(); err == nil {
			t.Logf("%s after %s", what, time.Since(start).Round(100*time.Millisecond))
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s: %v", what, timeout, err)
		}
		// A long wait leaves a trail: what it still waits for, every 30 s.
		if time.Since(said) >= 30*time.Second {
			t.Logf("%s: still waiting after %s: %v", what, time.Since(start).Round(time.Second), err)
			said = time.Now()
		}
		time.Sleep(time.Second)
	}
}
