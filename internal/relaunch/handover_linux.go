//go:build linux

package relaunch

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// Handover is the helper that can start the daemon again with its sockets.
type Handover struct {
	cmd  *exec.Cmd
	ctl  *os.File // write end of the helper's control pipe
	stop *os.File // write end of the new daemon's stop pipe
	went bool
}

// envNames carries the socket names to the helper; it is not passed on to the new daemon.
const envNames = "XMSG_RELAUNCH_NAMES"

// Prepare starts the helper: self is this executable, args the daemon's `serve` arguments,
// files the listening sockets (their fds are duplicated for the helper) and names their
// LISTEN_FDNAMES names. Call it before the sandbox; Close it if the daemon ends any other way.
func Prepare(self string, args []string, files []*os.File, names []string) (*Handover, error) {
	if len(files) != len(names) || len(files) == 0 {
		return nil, errors.New("relaunch: want one name per socket")
	}
	ctlR, ctlW, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("relaunch: pipe: %w", err)
	}
	stopR, stopW, err := os.Pipe()
	if err != nil {
		ctlR.Close()
		ctlW.Close()
		return nil, fmt.Errorf("relaunch: pipe: %w", err)
	}
	cmd := exec.Command(self, append([]string{Arg}, args...)...)
	// The sockets at 3.., then the control pipe, then the stop pipe (ExtraFiles start at 3).
	cmd.ExtraFiles = append(append(append([]*os.File{}, files...), ctlR), stopR)
	cmd.Env = append(cleanEnv(os.Environ()), envNames+"="+strings.Join(names, ":"))
	// The new daemon writes where this one does.
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	if err := cmd.Start(); err != nil {
		for _, f := range []*os.File{ctlR, ctlW, stopR, stopW} {
			f.Close()
		}
		return nil, fmt.Errorf("relaunch: start helper: %w", err)
	}
	ctlR.Close()
	stopR.Close()
	// exec took each file's Fd(), which puts the descriptor in blocking mode; the sockets' open
	// file descriptions are the daemon's listeners' too, and a listener in blocking mode would
	// block its Accept in the kernel, where closing it at shutdown cannot reach it.
	for _, f := range files {
		if rc, err := f.SyscallConn(); err == nil {
			rc.Control(func(fd uintptr) { unix.SetNonblock(int(fd), true) })
		}
	}
	return &Handover{cmd: cmd, ctl: ctlW, stop: stopW}, nil
}

// Go tells the helper to start the daemon again, once this process has closed its store and
// stopped accepting (call it after the daemon's Close, with reason the directory that
// appeared): the helper executes the daemon as soon as its control pipe closes.
func (h *Handover) Go(reason string) error {
	h.went = true
	_, err := h.ctl.Write([]byte("g" + reason))
	if cerr := h.ctl.Close(); err == nil {
		err = cerr
	}
	return err
}

// Wait waits for the relaunched daemon in its place: a SIGTERM or SIGINT this process receives
// is passed on as a stop, a SIGHUP as a reload, and its exit status is returned. in is this
// process's own Stops (nil unless it was relaunched itself): what comes there is passed on too.
func (h *Handover) Wait(in <-chan byte) int {
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)
	defer signal.Stop(sigs)
	done := make(chan struct{})
	go func() {
		for {
			select {
			case s := <-sigs:
				if s == syscall.SIGHUP {
					h.stop.Write([]byte("h"))
				} else {
					h.stop.Write([]byte("t"))
				}
			case b, ok := <-in:
				if !ok {
					in = nil
					h.stop.Write([]byte("t")) // the one above is gone
					continue
				}
				h.stop.Write([]byte{b})
			case <-done:
				return
			}
		}
	}()
	err := h.cmd.Wait()
	close(done)
	h.stop.Close()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &ee) && ee.ExitCode() >= 0:
		return ee.ExitCode()
	}
	return 1
}

// Close ends the helper unless Go was called: its control pipe closes and it exits.
func (h *Handover) Close() error {
	if h == nil || h.went {
		return nil
	}
	h.went = true
	h.ctl.Close()
	h.stop.Close()
	h.cmd.Wait()
	return nil
}

// cleanEnv drops what must not reach a new daemon from this one's environment.
func cleanEnv(env []string) []string {
	out := env[:0:0]
	for _, kv := range env {
		k, _, _ := strings.Cut(kv, "=")
		switch k {
		case "LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES", envNames, EnvHandover, EnvStopFD:
			continue
		}
		out = append(out, kv)
	}
	return out
}

// RunHelper is the helper (the hidden subcommand Arg, with the daemon's serve arguments): it
// waits for the control pipe to close; if the daemon said go, it executes `serve` again with
// the sockets, else it exits.
func RunHelper(args []string) error {
	names := strings.Split(os.Getenv(envNames), ":")
	n := len(names)
	if os.Getenv(envNames) == "" || n > 8 {
		return errors.New("relaunch: helper: no socket names")
	}
	ctlFD, stopFD := 3+n, 4+n
	// Neither pipe's write end is ours; the control pipe ends here, the stop pipe goes on.
	unix.CloseOnExec(ctlFD)
	ctl := os.NewFile(uintptr(ctlFD), "relaunch-control")
	msg, err := io.ReadAll(ctl)
	ctl.Close()
	if err != nil || len(msg) == 0 || msg[0] != 'g' {
		return nil // the daemon ended otherwise: nothing to do
	}
	self, err := os.Executable()
	if err != nil {
		return fmt.Errorf("relaunch: helper: %w", err)
	}
	env := append(cleanEnv(os.Environ()),
		"LISTEN_FDS="+strconv.Itoa(n), "LISTEN_PID="+strconv.Itoa(os.Getpid()), "LISTEN_FDNAMES="+strings.Join(names, ":"),
		EnvHandover+"="+string(msg[1:]), EnvStopFD+"="+strconv.Itoa(stopFD))
	argv := append([]string{os.Args[0], "serve"}, args...)
	return fmt.Errorf("relaunch: helper: exec: %w", unix.Exec(self, argv, env))
}

// Stops returns a channel that receives "t" (a stop) or "h" (a reload) as the old daemon that
// waits for this one passes them on, and is closed when that daemon is gone (its end of the
// pipe closed). Nil when this daemon was not relaunched.
func Stops() <-chan byte {
	v := os.Getenv(EnvStopFD)
	os.Unsetenv(EnvStopFD)
	fd, err := strconv.Atoi(v)
	if v == "" || err != nil || fd < 3 {
		return nil
	}
	unix.CloseOnExec(fd)
	f := os.NewFile(uintptr(fd), "relaunch-stop")
	c := make(chan byte, 1)
	go func() {
		defer close(c)
		defer f.Close()
		b := make([]byte, 1)
		for {
			if _, err := f.Read(b); err != nil {
				return
			}
			c <- b[0]
		}
	}()
	return c
}
