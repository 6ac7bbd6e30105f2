//go:build !linux

package procmesh

import (
	"os"
	"os/exec"
	"syscall"
)

// sysProcAttr: only Linux kills children with their parent; elsewhere the
// test's cleanup stops them.
func sysProcAttr() *syscall.SysProcAttr { return &syscall.SysProcAttr{} }

func startCmd(cmd *exec.Cmd) error { return cmd.Start() }

func groupProcAttr() *syscall.SysProcAttr { return &syscall.SysProcAttr{Setpgid: true} }

func killGroup(p *os.Process) error { return syscall.Kill(-p.Pid, syscall.SIGKILL) }
