//go:build linux

package relaunch

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// Handover is this daemon's way to start again with its sockets: in the daemon that started
// the helper (Prepare), the helper itself; in a daemon the helper started (Inherited), the
// pipe on which it asks the helper to start the next one.
type Handover struct {
	// The first daemon's, nil in a relaunched one.
	cmd  *exec.Cmd
	ctl  *os.File      // write end of the helper's control pipe
	stop *os.File      // write end of the helper's stop pipe
	done chan struct{} // closed once the helper has exited
	code int           // its exit status, once done
	// A relaunched daemon's, nil in the first: the write end of the helper's ask pipe.
	ask  *os.File
	went bool
}

// Environment between the first daemon, the helper and the daemons it starts; none of it
// reaches a daemon's own children (cleanEnv).
const (
	// envNames carries the socket names to the helper.
	envNames = "XMSG_RELAUNCH_NAMES"
	// envExec makes `xmsg __relaunch` the helper's one-step trampoline: set LISTEN_PID to its
	// own pid and execute `serve` (a pid is known only after the fork).
	envExec = "XMSG_RELAUNCH_EXEC"
)

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
	h := &Handover{cmd: cmd, ctl: ctlW, stop: stopW, done: make(chan struct{})}
	go func() {
		h.code = exitCode(cmd.Wait())
		close(h.done)
	}()
	return h, nil
}

// Inherited is the handover of a daemon that the helper started (nil in any other): its way
// to ask the helper for the next start. Call it once, first thing, before any child is
// started: the pipe must reach no other process.
func Inherited() *Handover {
	v := os.Getenv(envAsk)
	os.Unsetenv(envAsk)
	fd, err := strconv.Atoi(v)
	if v == "" || err != nil || fd < 3 {
		return nil
	}
	// Only a pipe: a stray variable naming some other descriptor (under systemd, say) must
	// not turn a restart (exit 75) into a write to it and an exit 0.
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFIFO {
		return nil
	}
	unix.CloseOnExec(fd)
	return &Handover{ask: os.NewFile(uintptr(fd), "relaunch-ask")}
}

// envAsk names the write end of the pipe on which a relaunched daemon asks the helper to
// start it again.
const envAsk = "XMSG_RELAUNCH_ASK_FD"

// Done is closed when the helper has exited (nil, never closed, in a relaunched daemon: it
// dies with its helper, by its parent-death signal). A helper that exits before Go was stopped
// (a SIGTERM sent to it): the daemon stops too.
func (h *Handover) Done() <-chan struct{} {
	if h == nil {
		return nil
	}
	return h.done
}

// Go tells the helper to start the daemon again, once this process has closed its store and
// stopped accepting (call it after the daemon's Close, with reason the directory that
// appeared): the helper starts the next daemon as soon as this one is out of the way.
func (h *Handover) Go(reason string) error {
	h.went = true
	w := h.ctl
	if h.ask != nil {
		w = h.ask
	}
	_, err := w.Write([]byte("g" + reason))
	if cerr := w.Close(); err == nil {
		err = cerr
	}
	return err
}

// Wait, after Go, is what this process does next, and returns its exit status. A relaunched
// daemon returns 0 at once: it ends, and the helper starts the next in its place. The first
// daemon waits for the helper in its place, so that a terminal or supervisor that started it
// still sees one process: a SIGTERM or SIGINT it receives is passed on as a stop, a SIGHUP as a
// reload, through the stop pipe (Landlock's signal scoping forbids it to signal the helper,
// outside its domain), and it returns the helper's status, which is the last daemon's.
func (h *Handover) Wait() int {
	if h.ask != nil {
		return 0
	}
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)
	defer signal.Stop(sigs)
	for {
		select {
		case s := <-sigs:
			b := byte('t')
			if s == syscall.SIGHUP {
				b = 'h'
			}
			h.stop.Write([]byte{b})
		case <-h.done:
			h.stop.Close()
			return h.code
		}
	}
}

// Close ends the helper unless Go was called: its control pipe closes and it exits.
func (h *Handover) Close() error {
	if h == nil || h.went {
		return nil
	}
	h.went = true
	if h.ask != nil {
		return h.ask.Close()
	}
	h.ctl.Close()
	h.stop.Close()
	<-h.done
	return nil
}

// exitCode is a finished process's exit status, 128+signal for one a signal ended.
func exitCode(err error) int {
	var ee *exec.ExitError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &ee):
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return 128 + int(ws.Signal())
		}
		if ee.ExitCode() >= 0 {
			return ee.ExitCode()
		}
	}
	return 1
}

// cleanEnv drops what must not reach a new daemon from this one's environment.
func cleanEnv(env []string) []string {
	out := env[:0:0]
	for _, kv := range env {
		k, _, _ := strings.Cut(kv, "=")
		switch k {
		case "LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES", envNames, envExec, envAsk, EnvHandover, EnvRelaunches:
			continue
		}
		out = append(out, kv)
	}
	return out
}

// RunHelper is the helper (the hidden subcommand Arg, with the daemon's serve arguments). It
// waits for the first daemon's word on the control pipe: none (the pipe closed) and it exits;
// "go" and it starts `serve` with the sockets, as its child, and stays as the one process that
// holds them between two daemons. A daemon it started that asks to start again (its ask pipe)
// and exits is followed by the next; one that exits otherwise ends the helper with its status.
// So a chain of any number of relaunches is three processes: the first daemon waiting, this
// helper, the current daemon. A stop reaches the current daemon from any of them: the first
// daemon's stop pipe (a stop, a reload, or the pipe closing when it is gone) and this
// process's own SIGTERM, SIGINT and SIGHUP are passed on to it as signals, and it dies with
// this process (its parent-death signal). The returned code is the last daemon's status.
func RunHelper(args []string) (int, error) {
	if os.Getenv(envExec) != "" {
		return 1, execServe(args)
	}
	// The daemons' parent-death signal is tied to the thread that starts them: keep it for
	// the helper's whole life.
	runtime.LockOSThread()
	names := strings.Split(os.Getenv(envNames), ":")
	n := len(names)
	if os.Getenv(envNames) == "" || n > 8 {
		return 1, errors.New("relaunch: helper: no socket names")
	}
	// Caught from the start: a terminal's Ctrl-C reaches the whole process group, and the
	// helper must pass it on, not die of it and leave a daemon without its helper.
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)
	sockets := make([]*os.File, n)
	for i := range sockets {
		unix.CloseOnExec(3 + i) // a daemon gets them as ExtraFiles, nothing else does
		sockets[i] = os.NewFile(uintptr(3+i), "relaunch-socket-"+names[i])
	}
	ctlFD, stopFD := 3+n, 4+n
	unix.CloseOnExec(ctlFD)
	unix.CloseOnExec(stopFD)
	stops := readStops(os.NewFile(uintptr(stopFD), "relaunch-stop"))
	word := make(chan []byte, 1)
	go func() {
		ctl := os.NewFile(uintptr(ctlFD), "relaunch-control")
		msg, _ := io.ReadAll(ctl)
		ctl.Close()
		word <- msg
	}()
	var msg []byte
	for msg == nil {
		select {
		case msg = <-word:
		case s := <-sigs:
			if s != syscall.SIGHUP {
				return 0, nil // the first daemon sees its helper gone and stops
			}
		case b := <-stops:
			if b != 'h' {
				return 0, nil
			}
		}
	}
	if len(msg) == 0 || msg[0] != 'g' {
		return 0, nil // the daemon ended otherwise: nothing to do
	}
	s := &supervisor{sockets: sockets, names: names, args: args, sigs: sigs, stops: stops}
	return s.run(string(msg[1:]))
}

// supervisor is the helper once it has started a daemon.
type supervisor struct {
	sockets  []*os.File
	names    []string
	args     []string
	sigs     chan os.Signal
	stops    <-chan byte
	stopping bool // a stop came: no daemon is started after the current one
	started  int  // daemons started so far (the next one's EnvRelaunches)
}

func (s *supervisor) run(reason string) (int, error) {
	for {
		if s.stopping {
			return 0, nil
		}
		code, again, err := s.one(reason)
		if err != nil || again == "" || s.stopping {
			return code, err
		}
		reason = again
	}
}

// one starts one daemon and waits for it, passing stops on to it. again is the reason it gave
// for a relaunch ("" when it ended otherwise).
func (s *supervisor) one(reason string) (code int, again string, err error) {
	askR, askW, err := os.Pipe()
	if err != nil {
		return 1, "", fmt.Errorf("relaunch: helper: pipe: %w", err)
	}
	defer askR.Close()
	self, err := os.Executable()
	if err != nil {
		askW.Close()
		return 1, "", fmt.Errorf("relaunch: helper: %w", err)
	}
	n := len(s.sockets)
	cmd := exec.Command(self, append([]string{Arg}, s.args...)...)
	// The sockets at 3.., then the ask pipe.
	cmd.ExtraFiles = append(append([]*os.File{}, s.sockets...), askW)
	cmd.Env = append(cleanEnv(os.Environ()), envExec+"=1",
		"LISTEN_FDS="+strconv.Itoa(n), "LISTEN_FDNAMES="+strings.Join(s.names, ":"),
		EnvHandover+"="+reason, envAsk+"="+strconv.Itoa(3+n), EnvRelaunches+"="+strconv.Itoa(s.started+1))
	s.started++
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	// A daemon never outlives its helper, however the helper ends (even SIGKILL).
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}
	err = cmd.Start()
	askW.Close()
	if err != nil {
		return 1, "", fmt.Errorf("relaunch: helper: start: %w", err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	for {
		select {
		case sig := <-s.sigs:
			if sig != syscall.SIGHUP {
				s.stopping = true
			}
			cmd.Process.Signal(sig)
		case b := <-s.stops:
			if b == 'h' {
				cmd.Process.Signal(syscall.SIGHUP)
				continue
			}
			s.stopping = true
			cmd.Process.Signal(syscall.SIGTERM)
		case err := <-exited:
			code = exitCode(err)
			if s.stopping && code == 128+int(syscall.SIGTERM) {
				code = 0 // stopped before it caught signals: stopped as asked
			}
			msg := readNow(askR)
			if len(msg) > 0 && msg[0] == 'g' {
				return code, string(msg[1:]), nil
			}
			return code, "", nil
		}
	}
}

// readNow returns what is in the pipe now: what the daemon wrote before it exited. It does
// not wait for the end of the pipe, which some stray process might still hold open.
func readNow(f *os.File) []byte {
	rc, err := f.SyscallConn()
	if err != nil {
		return nil
	}
	var out []byte
	rc.Read(func(fd uintptr) bool {
		buf := make([]byte, 4096)
		for len(out) < 1<<16 {
			n, err := unix.Read(int(fd), buf)
			if n <= 0 || err != nil {
				break
			}
			out = append(out, buf[:n]...)
		}
		return true // done, whatever came: never wait
	})
	return out
}

// readStops passes on the first daemon's stop pipe: "t" (a stop) or "h" (a reload), and a stop
// when the pipe closes (the first daemon is gone).
func readStops(f *os.File) <-chan byte {
	c := make(chan byte, 4)
	go func() {
		defer f.Close()
		b := make([]byte, 1)
		for {
			if _, err := f.Read(b); err != nil {
				c <- 't'
				return
			}
			c <- b[0]
		}
	}()
	return c
}

// execServe is the trampoline: the helper starts it with everything of socket activation but
// LISTEN_PID, which only the started process knows; it adds it and becomes `serve`.
func execServe(args []string) error {
	self, err := os.Executable()
	if err != nil {
		return fmt.Errorf("relaunch: helper: %w", err)
	}
	env := append(cleanEnvExec(os.Environ()), "LISTEN_PID="+strconv.Itoa(os.Getpid()))
	argv := append([]string{os.Args[0], "serve"}, args...)
	return fmt.Errorf("relaunch: helper: exec: %w", unix.Exec(self, argv, env))
}

// cleanEnvExec drops only the trampoline's own marker and any stale LISTEN_PID.
func cleanEnvExec(env []string) []string {
	out := env[:0:0]
	for _, kv := range env {
		k, _, _ := strings.Cut(kv, "=")
		if k == envExec || k == "LISTEN_PID" {
			continue
		}
		out = append(out, kv)
	}
	return out
}
