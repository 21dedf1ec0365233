package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/xmsg/xmsg/internal/peercred"
)

// The test binary doubles as helper processes (fake Claude sessions), selected by env.
func TestMain(m *testing.M) {
	switch os.Getenv("XMSG_TEST_ROLE") {
	case "claude":
		fakeClaude()
		return
	case "rawclient":
		rawClient()
		return
	case "worker":
		worker()
		return
	case "xmsg":
		// Run as the real CLI: e2e tests start the daemon from this same binary, which keeps
		// the suite to one build.
		os.Args = append([]string{"xmsg"}, os.Args[1:]...)
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// fakeClaude is a stand-in Claude Code session: a real process with a real inbox socket and
// a real session file naming its pid and start time. Every line it receives is appended to
// $INBOX_LOG. It exits when stdin closes.
func fakeClaude() {
	dir, id, name := os.Getenv("SESSION_DIR"), os.Getenv("SESSION_ID"), os.Getenv("SESSION_NAME")
	sock := os.Getenv("INBOX_SOCK")
	l, err := net.Listen("unix", sock)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	start, err := peercred.Proc{}.StartTime(os.Getpid())
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	f := map[string]any{"pid": os.Getpid(), "sessionId": id, "cwd": os.Getenv("SESSION_CWD"), "status": "idle", "kind": "interactive",
		"startedAt": 1700000000000, "updatedAt": 1700000000000, "procStart": start, "messagingSocketPath": sock}
	if name != "" {
		f["name"] = name
	}
	raw, _ := json.Marshal(f)
	tmp := filepath.Join(dir, "."+id+".tmp")
	os.WriteFile(tmp, raw, 0o600)
	os.Rename(tmp, filepath.Join(dir, os.Getenv("SESSION_FILE")))
	fmt.Println("ready")
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			data, _ := io.ReadAll(c)
			c.Close()
			lf, _ := os.OpenFile(os.Getenv("INBOX_LOG"), os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o600)
			lf.Write(data)
			lf.Close()
		}
	}()
	io.Copy(io.Discard, os.Stdin)
}

type session struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	log   string
	id    string
}

// lines returns what the inbox received so far.
func (s *session) lines(t *testing.T) []string {
	t.Helper()
	raw, _ := os.ReadFile(s.log)
	var out []string
	for _, l := range strings.SplitAfter(string(raw), "\n") {
		if l != "" {
			out = append(out, l)
		}
	}
	return out
}

// waitLines waits until the inbox holds at least n lines (the fake session records a line
// after the daemon has already answered) and returns them all.
func (s *session) waitLines(t *testing.T, n int) []string {
	t.Helper()
	for i := 0; i < 1000; i++ {
		if l := s.lines(t); len(l) >= n {
			return l
		}
		time.Sleep(5 * time.Millisecond)
	}
	return s.lines(t)
}

// startClaude starts a fake session writing its file into dir.
func startClaude(t *testing.T, dir, id, name, cwd string) *session {
	t.Helper()
	sockDir, err := os.MkdirTemp("", "inbox")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(sockDir) })
	s := &session{log: filepath.Join(sockDir, "inbox.log"), id: id}
	s.cmd = exec.Command(os.Args[0])
	s.cmd.Env = append(os.Environ(), "XMSG_TEST_ROLE=claude", "SESSION_DIR="+dir, "SESSION_ID="+id, "SESSION_NAME="+name,
		"SESSION_CWD="+cwd, "SESSION_FILE="+id+"-"+strconv.Itoa(len(name))+".json", "INBOX_SOCK="+filepath.Join(sockDir, "inbox.sock"), "INBOX_LOG="+s.log)
	s.stdin, _ = s.cmd.StdinPipe()
	out, _ := s.cmd.StdoutPipe()
	s.cmd.Stderr = os.Stderr
	if err := s.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.stdin.Close(); s.cmd.Wait() })
	if line, _ := bufio.NewReader(out).ReadString('\n'); line != "ready\n" {
		t.Fatalf("fake claude did not start: %q", line)
	}
	return s
}

// daemon is a running `xmsg serve` from this test binary.
type daemon struct {
	t       *testing.T
	cmd     *exec.Cmd
	rt      string // XDG_RUNTIME_DIR
	db      string
	sess    string // sessions dir
	stderr  *syncBuffer
	args    []string
	env     []string
	stopped bool
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}
func (s *syncBuffer) String() string { s.mu.Lock(); defer s.mu.Unlock(); return s.b.String() }

func shortTemp(t *testing.T) string {
	// Unix socket paths are limited to 108 bytes; t.TempDir() paths can be longer.
	d, err := os.MkdirTemp("", "xm")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(d) })
	return d
}

func xmsgCmd(env []string, args ...string) *exec.Cmd {
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(append(os.Environ(), "XMSG_TEST_ROLE=xmsg"), env...)
	return cmd
}

func newDaemon(t *testing.T, extra ...string) *daemon {
	t.Helper()
	base := shortTemp(t)
	d := &daemon{t: t, rt: filepath.Join(base, "rt"), db: filepath.Join(base, "state", "xmsg.db"), sess: filepath.Join(base, "sessions")}
	os.Mkdir(d.rt, 0o700)
	os.Mkdir(d.sess, 0o700)
	d.env = []string{"XDG_RUNTIME_DIR=" + d.rt, "HOME=" + base}
	d.args = append([]string{"serve", "--db-path", d.db, "--sessions-dir", d.sess, "--host-label", "testhost"}, extra...)
	d.start()
	t.Cleanup(d.stop)
	return d
}

func (d *daemon) start() {
	d.t.Helper()
	d.stderr = &syncBuffer{}
	d.cmd = xmsgCmd(d.env, d.args...)
	d.cmd.Stderr = d.stderr
	if err := d.cmd.Start(); err != nil {
		d.t.Fatal(err)
	}
	d.stopped = false
	// Sockets accept (into the backlog) as soon as they are bound, before the sandbox is
	// applied; "serving" is logged when the daemon is fully up (where READY=1 is sent).
	for i := 0; i < 500; i++ {
		if strings.Contains(d.stderr.String(), "msg=serving") {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	d.t.Fatalf("daemon did not start: %s", d.stderr)
}

func (d *daemon) stop() {
	if d.stopped {
		return
	}
	d.stopped = true
	d.cmd.Process.Signal(syscall.SIGTERM)
	d.cmd.Wait()
}

func (d *daemon) sock(name string) string { return filepath.Join(d.rt, "xmsg", name+".sock") }

func (d *daemon) client() *http.Client {
	return &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", d.sock("http"))
	}}}
}

// do performs a request and returns status and decoded JSON body.
func (d *daemon) do(method, path, body string) (int, any) {
	d.t.Helper()
	req, _ := http.NewRequest(method, "http://localhost"+path, strings.NewReader(body))
	resp, err := d.client().Do(req)
	if err != nil {
		d.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	var v any
	if len(raw) > 0 {
		if err := json.Unmarshal(raw, &v); err != nil {
			d.t.Fatalf("%s %s: not JSON: %q", method, path, raw)
		}
	}
	return resp.StatusCode, v
}

func field(v any, k string) any {
	m, _ := v.(map[string]any)
	return m[k]
}

func wantError(t *testing.T, status int, v any, wantStatus int, wantCode string) {
	t.Helper()
	if status != wantStatus || field(v, "error") != wantCode {
		t.Errorf("got %d %v, want %d %s", status, v, wantStatus, wantCode)
	}
}

func mkdirs(dirs ...string) error {
	for _, d := range dirs {
		if err := os.Mkdir(d, 0o700); err != nil {
			return err
		}
	}
	return nil
}
