//go:build linux

package exehelper

import (
	"bufio"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"time"

	"github.com/xmsg/xmsg/internal/peercred"
)

// A request is 12 bytes, big-endian: a sequence number, the question (opExe or opFiles) and
// the pid. The answer echoes the sequence number, so an answer that arrives late (after its
// request timed out) is recognised and skipped instead of being taken for the answer to the
// next request.
type answer struct {
	Seq   uint32              `json:"seq"`
	Path  string              `json:"path,omitempty"`
	Files []peercred.OpenFile `json:"files,omitempty"`
	Sum   string              `json:"sum,omitempty"`
	Error string              `json:"error,omitempty"`
}

// The questions the helper answers; nothing else.
const (
	opExe   = 1 // which executable runs pid N (peercred.Proc.Exe)
	opFiles = 2 // which files pid N holds open (peercred.Proc.OpenFiles)
	opSum   = 3 // which executable runs pid N, and its content's SHA-256 (peercred.Proc.ExeDigest)
)

const requestLen = 12

// Client talks to a running helper.
type Client struct {
	mu   sync.Mutex
	conn *net.UnixConn
	r    *bufio.Reader
	cmd  *exec.Cmd
	seq  uint32
}

// Start runs `self Arg` with one end of a socketpair as fd 3. self should be the daemon's
// own executable (/proc/self/exe), so the helper is the same trusted binary.
func Start(self string, env []string) (*Client, error) {
	conn, cmd, err := Spawn(self, env, Arg)
	if err != nil {
		return nil, fmt.Errorf("exehelper: %w", err)
	}
	c := &Client{conn: conn, cmd: cmd}
	c.r = bufio.NewReader(c.conn)
	return c, nil
}

// Spawn starts `self args...`, a helper that must stay outside the sandbox the daemon is
// about to enter, with one end of a socketpair as its fd 3 (its only channel) and returns
// the other end. The helper dies with the daemon (PDEATHSIG) and is reaped whenever it ends.
// The agy delivery helper is started the same way.
func Spawn(self string, env []string, args ...string) (*net.UnixConn, *exec.Cmd, error) {
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("socketpair: %w", err)
	}
	ours, theirs := os.NewFile(uintptr(fds[0]), "helper"), os.NewFile(uintptr(fds[1]), "helper-child")
	defer theirs.Close()
	cmd := exec.Command(self, args...)
	cmd.Env = env
	cmd.ExtraFiles = []*os.File{theirs}
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		ours.Close()
		return nil, nil, fmt.Errorf("start %s: %w", args[0], err)
	}
	fc, err := net.FileConn(ours)
	ours.Close()
	if err != nil {
		cmd.Process.Kill()
		return nil, nil, err
	}
	go cmd.Wait() // reap it whenever it ends
	return fc.(*net.UnixConn), cmd, nil
}

// Exe returns the canonical executable of pid, as peercred.Proc.Exe does.
func (c *Client) Exe(pid int) (string, error) {
	a, err := c.ask(opExe, pid)
	return a.Path, err
}

// OpenFiles returns the descriptors pid holds open, as peercred.Proc.OpenFiles does.
func (c *Client) OpenFiles(pid int) ([]peercred.OpenFile, error) {
	a, err := c.ask(opFiles, pid)
	return a.Files, err
}

// ExeDigest returns the canonical executable of pid and the SHA-256 of the running file, as
// peercred.Proc.ExeDigest does.
func (c *Client) ExeDigest(pid int) (string, string, error) {
	a, err := c.ask(opSum, pid)
	return a.Path, a.Sum, err
}

func (c *Client) ask(op uint32, pid int) (answer, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.seq++
	c.conn.SetDeadline(time.Now().Add(5 * time.Second))
	var req [requestLen]byte
	binary.BigEndian.PutUint32(req[:4], c.seq)
	binary.BigEndian.PutUint32(req[4:8], op)
	binary.BigEndian.PutUint32(req[8:], uint32(pid))
	if _, err := c.conn.Write(req[:]); err != nil {
		return answer{}, fmt.Errorf("exehelper: request: %w", err)
	}
	for {
		// An answer lists at most peercred.MaxOpenFiles files; ReadBytes grows as needed.
		line, err := c.r.ReadBytes('\n')
		if err != nil {
			return answer{}, fmt.Errorf("exehelper: answer: %w", err)
		}
		var a answer
		if err := json.Unmarshal(line, &a); err != nil {
			return answer{}, fmt.Errorf("exehelper: answer: %w", err)
		}
		if a.Seq != c.seq {
			continue // the late answer to an earlier request that timed out
		}
		if a.Error != "" {
			return answer{}, errors.New(a.Error)
		}
		return a, nil
	}
}

// Close stops the helper.
func (c *Client) Close() error {
	if c == nil {
		return nil
	}
	return c.conn.Close()
}

// Serve is the helper's loop on fd 3; it returns when the daemon closes its end.
func Serve() error {
	f := os.NewFile(3, "exehelper")
	if f == nil {
		return errors.New("exehelper: fd 3 missing")
	}
	defer f.Close()
	r := bufio.NewReader(f)
	enc := json.NewEncoder(f)
	proc := peercred.Proc{}
	var digests peercred.Digests
	for {
		var req [requestLen]byte
		if _, err := io.ReadFull(r, req[:]); err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
		a := answer{Seq: binary.BigEndian.Uint32(req[:4])}
		pid := int(binary.BigEndian.Uint32(req[8:]))
		var err error
		switch binary.BigEndian.Uint32(req[4:8]) {
		case opExe:
			a.Path, err = proc.Exe(pid)
		case opFiles:
			a.Files, err = proc.OpenFiles(pid)
		case opSum:
			a.Path, a.Sum, err = proc.ExeDigest(pid, &digests)
		default:
			err = errors.New("exehelper: unknown question")
		}
		if err != nil {
			a.Error, a.Path, a.Files, a.Sum = err.Error(), "", nil, ""
		}
		if err := enc.Encode(a); err != nil {
			return err
		}
	}
}
