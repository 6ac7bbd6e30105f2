package composertest

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"mesh.dev/internal/config"
	"mesh.dev/internal/identity"
	"mesh.dev/internal/natsx"
	"mesh.dev/services/composer/app"
	"mesh.dev/services/composer/internal/pass"
)

// childEnv carries a child composer's configuration (JSON) to the re-executed
// test binary.
const childEnv = "MESH_COMPOSERTEST_CHILD"

// childConfig is what a child composer is started with.
type childConfig struct {
	Config app.Config `json:"config"`
}

// RunChildIfAsked runs a composer and exits when the test binary was
// started as a child composer; otherwise it returns. Call it first in
// TestMain.
func RunChildIfAsked() {
	raw := os.Getenv(childEnv)
	if raw == "" {
		return
	}
	var cc childConfig
	if err := json.Unmarshal([]byte(raw), &cc); err != nil {
		fmt.Fprintln(os.Stderr, "child composer: config:", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	var mu sync.Mutex
	out := bufio.NewWriter(os.Stdout)
	say := func(format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		fmt.Fprintf(out, format+"\n", args...)
		out.Flush()
	}
	err := app.Run(ctx, cc.Config, app.Options{
		Logger: log,
		OnPass: func(node string, res *pass.Result, err error) {
			if err == nil && res != nil {
				err = res.Err
			}
			committed := res != nil && res.Committed
			say("pass %s committed=%v err=%q", node, committed, errString(err))
		},
		Ready: func(a net.Addr) { say("ready %s", a.String()) },
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "child composer:", err)
		os.Exit(1)
	}
	os.Exit(0)
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// Child is a composer running as a child process of the test binary.
type Child struct {
	Holder string
	Addr   string
	cmd    *exec.Cmd
	t      testing.TB

	mu     sync.Mutex
	lines  []string
	cond   *sync.Cond
	exited bool
}

// StartChild starts a composer process connecting to the world's JetStream
// by URL and to its catalog and signer by address, with files for its
// certificate and the pinned roots.
func (w *World) StartChild(t testing.TB, holder string, leaseTTL time.Duration, workers int) *Child {
	t.Helper()
	lis := Listen(t)
	addr := lis.Addr().String()
	lis.Close()
	cert, key, ca := w.PKI.Files(t, w.PKI.Identity(identity.RoleComposer, ""))
	cc := childConfig{Config: app.Config{
		Listen: addr, MetricsListen: "", CertFile: cert, KeyFile: key, CAFile: ca, RootsFile: w.RootsFile,
		SignerAddr: w.SignerAddr, CatalogAddr: w.CatalogAddr, NATS: natsx.ServiceConfig{URL: w.Embedded.ClientURL()},
		LeaseTTL: config.Duration(leaseTTL), Workers: workers, Holder: holder,
	}}
	raw, err := json.Marshal(cc)
	Must(t, err)
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"="+string(raw))
	stdout, err := cmd.StdoutPipe()
	Must(t, err)
	stderr, err := cmd.StderrPipe()
	Must(t, err)
	c := &Child{Holder: holder, Addr: addr, cmd: cmd, t: t}
	c.cond = sync.NewCond(&c.mu)
	Must(t, cmd.Start())
	logs := &logWriter{t: t}
	t.Cleanup(logs.close)
	go func() {
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			line := sc.Text()
			// Only what goes wrong reaches the test's log.
			if strings.Contains(line, "level=WARN") || strings.Contains(line, "level=ERROR") || !strings.Contains(line, "level=") {
				fmt.Fprintf(logs, "[%s] %s\n", holder, line)
			}
		}
	}()
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			c.mu.Lock()
			c.lines = append(c.lines, sc.Text())
			c.cond.Broadcast()
			c.mu.Unlock()
		}
		_ = cmd.Wait()
		c.mu.Lock()
		c.exited = true
		c.cond.Broadcast()
		c.mu.Unlock()
	}()
	t.Cleanup(func() { c.Kill() })
	return c
}

// Lines returns what the child has said on stdout so far ("ready <addr>",
// "pass <node> committed=<bool> err=<quoted>").
func (c *Child) Lines() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]string(nil), c.lines...)
}

// Pid is the child's process id.
func (c *Child) Pid() int { return c.cmd.Process.Pid }

// Signal sends sig to the child.
func (c *Child) Signal(sig syscall.Signal) {
	_ = c.cmd.Process.Signal(sig)
}

// Kill SIGKILLs the child and waits until it is gone.
func (c *Child) Kill() {
	_ = c.cmd.Process.Signal(syscall.SIGKILL)
	c.mu.Lock()
	for !c.exited {
		c.cond.Wait()
	}
	c.mu.Unlock()
}

// Exited reports whether the child process ended.
func (c *Child) Exited() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.exited
}
