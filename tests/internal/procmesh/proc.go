package procmesh

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"
)

// stopGrace is how long a process has to exit after SIGTERM before it is
// killed.
const stopGrace = 10 * time.Second

// logTail is how much of a process's output the test log gets on failure.
const logTail = 64 << 10

// Proc is one running process of the mesh; its stdout and stderr go to a
// log file.
type Proc struct {
	Name    string
	LogPath string

	cmd     *exec.Cmd
	log     *os.File
	done    chan struct{}
	mu      sync.Mutex
	waitErr error
	stopped bool
}

// startProc starts bin with args in dir (the test's when "") and env (added
// to the test's environment), its output in logPath.
func startProc(name, logPath, dir string, env []string, bin string, args ...string) (*Proc, error) {
	f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Dir = dir
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = sysProcAttr()
	if err := startCmd(cmd); err != nil {
		f.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &Proc{Name: name, LogPath: logPath, cmd: cmd, log: f, done: make(chan struct{})}
	go func() {
		err := cmd.Wait()
		p.mu.Lock()
		p.waitErr = err
		p.mu.Unlock()
		close(p.done)
	}()
	return p, nil
}

// Pid is the process id.
func (p *Proc) Pid() int { return p.cmd.Process.Pid }

// Exited returns the exit error and true once the process ended.
func (p *Proc) Exited() (error, bool) {
	select {
	case <-p.done:
		p.mu.Lock()
		defer p.mu.Unlock()
		if p.waitErr == nil {
			return errors.New("exited with status 0"), true
		}
		return p.waitErr, true
	default:
		return nil, false
	}
}

// Stop sends SIGTERM, waits up to stopGrace and then kills the process. It
// returns the exit error unless the process ended because of the signal it
// was sent or exited cleanly.
func (p *Proc) Stop() error {
	p.mu.Lock()
	if p.stopped {
		p.mu.Unlock()
		p.waitKilled()
		return nil
	}
	p.stopped = true
	p.mu.Unlock()
	defer p.log.Close()
	select {
	case <-p.done:
		err, _ := p.Exited()
		return fmt.Errorf("%s had already ended: %w", p.Name, err)
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
		return nil
	case <-time.After(stopGrace):
		_ = p.cmd.Process.Kill()
		p.waitKilled()
		return fmt.Errorf("%s did not stop within %s of SIGTERM and was killed", p.Name, stopGrace)
	}
}

// waitKilled waits a bounded time for a killed process to be reaped (one
// stuck in the kernel is left behind rather than hanging the test).
func (p *Proc) waitKilled() {
	select {
	case <-p.done:
	case <-time.After(30 * time.Second):
	}
}

// Output returns the last n bytes the process wrote.
func (p *Proc) Output(n int64) string {
	f, err := os.Open(p.LogPath)
	if err != nil {
		return fmt.Sprintf("(no output: %v)", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return err.Error()
	}
	prefix := ""
	if fi.Size() > n {
		if _, err := f.Seek(fi.Size()-n, io.SeekStart); err != nil {
			return err.Error()
		}
		prefix = fmt.Sprintf("(the first %d bytes are left out)\n", fi.Size()-n)
	}
	b, err := io.ReadAll(f)
	if err != nil {
		return err.Error()
	}
	return prefix + string(b)
}

// Spawn starts a process of the test's (meshctl dev, say) in dir with env
// added to the test's environment, its output in a file of the test's temp
// dir. It is stopped when the test ends, and its output goes to the test log
// if the test failed.
func Spawn(t testing.TB, name, dir string, env []string, bin string, args ...string) *Proc {
	t.Helper()
	p, err := startProc(name, filepath.Join(t.TempDir(), name+".log"), dir, env, bin, args...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = p.Stop()
		if t.Failed() {
			t.Logf("=== output of %s (pid %d) ===\n%s", p.Name, p.Pid(), p.Output(logTail))
		}
	})
	return p
}

// Interrupt sends SIGINT and waits up to timeout for the process to end; it
// returns the exit error, or an error when the process did not end (it is
// then killed).
func (p *Proc) Interrupt(timeout time.Duration) error {
	p.mu.Lock()
	p.stopped = true
	p.mu.Unlock()
	_ = p.cmd.Process.Signal(os.Interrupt)
	select {
	case <-p.done:
		p.log.Close()
		p.mu.Lock()
		defer p.mu.Unlock()
		return p.waitErr
	case <-time.After(timeout):
		_ = p.cmd.Process.Kill()
		p.waitKilled()
		p.log.Close()
		return fmt.Errorf("%s did not end within %s of SIGINT and was killed", p.Name, timeout)
	}
}

// StartProc starts bin with args in dir (the test's when "") and env (added
// to the test's environment), its output appended to logPath; the process is
// killed with the test binary. The caller stops it.
func StartProc(name, logPath, dir string, env []string, bin string, args ...string) (*Proc, error) {
	return startProc(name, logPath, dir, env, bin, args...)
}

// Signal sends sig to the process (SIGKILL, SIGSTOP, SIGCONT, ...).
func (p *Proc) Signal(sig os.Signal) error { return p.cmd.Process.Signal(sig) }

// Done is closed when the process has ended.
func (p *Proc) Done() <-chan struct{} { return p.done }

// Kill kills the process with SIGKILL and waits until it is reaped.
func (p *Proc) Kill() {
	p.mu.Lock()
	p.stopped = true
	p.mu.Unlock()
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	p.waitKilled()
	p.log.Close()
}
