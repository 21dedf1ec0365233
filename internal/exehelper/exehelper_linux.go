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

// A request is 8 bytes: a sequence number and the pid, big-endian. The answer echoes the
// sequence number, so an answer that arrives late (after its request timed out) is
// recognised and skipped instead of being taken for the answer to the next request.
type answer struct {
	Seq   uint32 `json:"seq"`
	Path  string `json:"path,omitempty"`
	Error string `json:"error,omitempty"`
}

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
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("exehelper: socketpair: %w", err)
	}
	ours, theirs := os.NewFile(uintptr(fds[0]), "exehelper"), os.NewFile(uintptr(fds[1]), "exehelper-child")
	defer theirs.Close()
	cmd := exec.Command(self, Arg)
	cmd.Env = env
	cmd.ExtraFiles = []*os.File{theirs}
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		ours.Close()
		return nil, fmt.Errorf("exehelper: start: %w", err)
	}
	fc, err := net.FileConn(ours)
	ours.Close()
	if err != nil {
		cmd.Process.Kill()
		return nil, fmt.Errorf("exehelper: %w", err)
	}
	c := &Client{conn: fc.(*net.UnixConn), cmd: cmd}
	c.r = bufio.NewReader(c.conn)
	go cmd.Wait() // reap it whenever it ends
	return c, nil
}

// Exe returns the canonical executable of pid, as peercred.Proc.Exe does.
func (c *Client) Exe(pid int) (string, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.seq++
	c.conn.SetDeadline(time.Now().Add(5 * time.Second))
	var req [8]byte
	binary.BigEndian.PutUint32(req[:4], c.seq)
	binary.BigEndian.PutUint32(req[4:], uint32(pid))
	if _, err := c.conn.Write(req[:]); err != nil {
		return "", fmt.Errorf("exehelper: request: %w", err)
	}
	for {
		line, err := c.r.ReadBytes('\n')
		if err != nil {
			return "", fmt.Errorf("exehelper: answer: %w", err)
		}
		var a answer
		if err := json.Unmarshal(line, &a); err != nil {
			return "", fmt.Errorf("exehelper: answer: %w", err)
		}
		if a.Seq != c.seq {
			continue // the late answer to an earlier request that timed out
		}
		if a.Error != "" {
			return "", errors.New(a.Error)
		}
		return a.Path, nil
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
	for {
		var req [8]byte
		if _, err := io.ReadFull(r, req[:]); err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
		a := answer{Seq: binary.BigEndian.Uint32(req[:4])}
		path, err := proc.Exe(int(binary.BigEndian.Uint32(req[4:])))
		if err != nil {
			a.Error = err.Error()
		} else {
			a.Path = path
		}
		if err := enc.Encode(a); err != nil {
			return err
		}
	}
}
