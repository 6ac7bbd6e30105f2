// Package procmesh runs mesh as deploy/ runs it: a real nats-server process
// and each service as its own process, built from this tree, over loopback
// with real certificates and keys made by meshctl and mesh-signer, each
// reading a YAML configuration file. End-to-end tests drive it with the
// meshctl binary, as an operator and a builder would.
package procmesh

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Binaries are the five mesh binaries built from this tree.
type Binaries struct {
	Dir        string
	Catalog    string
	Signer     string
	Composer   string
	NodeEngine string
	Meshctl    string
}

// packages are what `make build` builds, by binary name.
var packages = []struct{ name, pkg string }{
	{"mesh-catalog", "mesh.dev/services/catalog/cmd/mesh-catalog"},
	{"mesh-signer", "mesh.dev/services/signer/cmd/mesh-signer"},
	{"mesh-composer", "mesh.dev/services/composer/cmd/mesh-composer"},
	{"mesh-nodeengine", "mesh.dev/services/nodeengine/cmd/mesh-nodeengine"},
	{"meshctl", "mesh.dev/cmd/meshctl"},
}

var (
	buildOnce sync.Once
	buildDir  string
	built     *Binaries
	buildErr  error
)

// Main runs a test binary's tests and removes the binaries Build made; call
// it from TestMain.
func Main(m *testing.M) int {
	code := m.Run()
	if buildDir != "" {
		os.RemoveAll(buildDir)
	}
	return code
}

// Build builds the five binaries once per test binary, into a temporary
// directory Main removes, exactly as `make build` does (CGO_ENABLED=0,
// -trimpath), and returns them.
func Build(t testing.TB) *Binaries {
	t.Helper()
	buildOnce.Do(func() {
		start := time.Now()
		root, err := RepoRoot()
		if err != nil {
			buildErr = err
			return
		}
		if buildDir, err = os.MkdirTemp("", "mesh-bin-"); err != nil {
			buildErr = err
			return
		}
		args := []string{"build", "-trimpath", "-o", buildDir + string(filepath.Separator)}
		for _, p := range packages {
			args = append(args, p.pkg)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, goTool(), args...)
		cmd.Dir = root
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("go %v: %w\n%s", args, err, out)
			return
		}
		built = &Binaries{
			Dir: buildDir, Catalog: filepath.Join(buildDir, "mesh-catalog"), Signer: filepath.Join(buildDir, "mesh-signer"),
			Composer: filepath.Join(buildDir, "mesh-composer"), NodeEngine: filepath.Join(buildDir, "mesh-nodeengine"),
			Meshctl: filepath.Join(buildDir, "meshctl"),
		}
		t.Logf("built the mesh binaries in %s (%.1fs)", buildDir, time.Since(start).Seconds())
	})
	if buildErr != nil {
		t.Fatalf("procmesh: build: %v", buildErr)
	}
	return built
}

// goTool is the go command that runs this test, so the binaries are built by
// the same toolchain.
func goTool() string {
	if root := os.Getenv("GOROOT"); root != "" {
		if p := filepath.Join(root, "bin", "go"); isExecutable(p) {
			return p
		}
	}
	return "go"
}

// RepoRoot is the directory holding go.work, found upward from the working
// directory (a test runs in its package's directory).
func RepoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.work")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("procmesh: no go.work above the working directory")
		}
		dir = parent
	}
}

func isExecutable(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && !fi.IsDir() && fi.Mode()&0o111 != 0
}

// Tool returns the path of a pinned tool in the repository's bin/
// (nats-server, grpcurl), running `make tools` first when it is missing, as
// the repository's own scripts install it. Test binaries of several packages
// may ask at once; a lock file makes them take turns.
func Tool(t testing.TB, name string) string {
	t.Helper()
	root, err := RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(root, "bin")
	path := filepath.Join(bin, name)
	if isExecutable(path) {
		return path
	}
	if err := os.MkdirAll(bin, 0o755); err != nil {
		t.Fatal(err)
	}
	lock, err := os.OpenFile(filepath.Join(bin, ".tools-test.lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		t.Fatalf("procmesh: lock %s: %v", lock.Name(), err)
	}
	defer syscall.Flock(int(lock.Fd()), syscall.LOCK_UN)
	if isExecutable(path) {
		return path
	}
	t.Logf("procmesh: %s is missing; running make tools", path)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "make", "tools")
	cmd.Dir = root
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		t.Fatalf("procmesh: make tools: %v\n%s", err, out.String())
	}
	if !isExecutable(path) {
		t.Fatalf("procmesh: make tools did not build %s", path)
	}
	return path
}
