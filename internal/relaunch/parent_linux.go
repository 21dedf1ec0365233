//go:build linux

package relaunch

import (
	"os"
	"path/filepath"
	"runtime"
	"syscall"

	"golang.org/x/sys/unix"
)

// FollowGoRun makes this process stop (SIGTERM) when its parent exits, if that parent is the
// go command: `go run` passes no signal on to the program it runs (it ignores SIGINT and dies
// of SIGTERM), so a `go run ./cmd/xmsg serve` stopped with SIGTERM would leave the daemon
// running, its store locked against the next start. Any other parent is left alone: a daemon
// started from a shell with nohup or & must outlive the shell. exe reads a process's
// executable (peercred.Proc.Exe). It reports whether the parent was the go command.
func FollowGoRun(exe func(pid int) (string, error)) bool {
	ppid := os.Getppid()
	if p, err := exe(ppid); err != nil || filepath.Base(p) != "go" {
		return false
	}
	set := make(chan error)
	go func() {
		// The parent-death signal belongs to the thread that asks for it and is checked when
		// the parent exits: that thread must live as long as the process, so it is this
		// goroutine's, locked to it, and the goroutine never returns.
		runtime.LockOSThread()
		set <- unix.Prctl(unix.PR_SET_PDEATHSIG, uintptr(syscall.SIGTERM), 0, 0, 0)
		select {}
	}()
	if err := <-set; err != nil {
		return false
	}
	if os.Getppid() != ppid {
		// The parent exited before the signal was asked for: it will never come.
		syscall.Kill(os.Getpid(), syscall.SIGTERM)
	}
	return true
}
