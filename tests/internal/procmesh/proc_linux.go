package procmesh

import (
	"os"
	"os/exec"
	"runtime"
	"sync"
	"syscall"
)

// sysProcAttr has the kernel kill a process when the test binary dies, even
// without cleaning up (a -timeout panic, a kill): no process outlives the
// test.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}

// The kernel sends Pdeathsig when the thread that forked the child ends, not
// the process, so every child is started from one goroutine locked to its
// thread for the life of the test binary.
var (
	starterOnce sync.Once
	starts      chan startRequest
)

type startRequest struct {
	cmd  *exec.Cmd
	done chan error
}

func startCmd(cmd *exec.Cmd) error {
	starterOnce.Do(func() {
		starts = make(chan startRequest)
		go func() {
			runtime.LockOSThread() // never unlocked: the thread lives as long as the binary
			for r := range starts {
				r.done <- r.cmd.Start()
			}
		}()
	})
	done := make(chan error, 1)
	starts <- startRequest{cmd: cmd, done: done}
	return <-done
}

// groupProcAttr puts a command in a process group of its own (so that it
// and its children can be killed together), killed with the test binary.
func groupProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}

// killGroup kills the process group a command leads.
func killGroup(p *os.Process) error {
	return syscall.Kill(-p.Pid, syscall.SIGKILL)
}
