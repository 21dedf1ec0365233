package main

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/xmsg/xmsg/internal/daemontest"
	"github.com/xmsg/xmsg/internal/ostest"
)

// The test binary doubles as its helper processes (ostest roles): the daemon and the CLI
// themselves ("xmsg"), a service ("worker"), ostest's raw client (run as another uid for the
// peer gate), and daemontest's puppets, which stand in for Claude sessions and for clients
// speaking a real client's frames.
func TestMain(m *testing.M) {
	// Run by the daemon as `agy agentapi send-message ...` (the agy tests trust a copy of this
	// binary as the agy executable), whatever role the inherited environment names.
	if len(os.Args) > 1 && os.Args[1] == "agentapi" {
		os.Exit(fakeAgentapi())
	}
	ostest.Main(m, daemontest.Roles(), fedRoles, leafRoles, custodyRoles, relaunchRoles, realHarnessRoles, ostest.Roles{
		"worker":         func() int { worker(); return 0 },
		"relay-impostor": relayImpostor,
		"xmsg": func() int {
			// Run as the real CLI: e2e tests start the daemon from this same binary, which
			// keeps the suite to one build.
			os.Args = append([]string{"xmsg"}, os.Args[1:]...)
			main()
			return 0
		},
	})
}

// session is a fake Claude Code session (daemontest.Claude): a real process, a real session
// file naming its pid and start time, and a real inbox socket.
type session struct {
	*daemontest.Claude
	id  string
	pid int
}

// waitLines waits until the inbox holds at least n lines (the inbox records a line after the
// daemon has already answered) and returns them all.
func (s *session) waitLines(t *testing.T, n int) []string {
	t.Helper()
	return s.Inbox.WaitLines(n)
}

// startClaude starts a fake session writing its file into dir. The file name carries the
// name's length so that one id can have several files in one directory (a stale and a live
// one).
func startClaude(t *testing.T, dir, id, name, cwd string) *session {
	t.Helper()
	c := daemontest.StartClaude(t, dir, id+"-"+strconv.Itoa(len(name))+".json", id, name, cwd)
	return &session{Claude: c, id: id, pid: c.PID}
}

// daemon is a running `xmsg serve` from this test binary.
type daemon struct {
	t       *testing.T
	cmd     *exec.Cmd
	rt      string // XDG_RUNTIME_DIR
	db      string
	sess    string // sessions dir
	stderr  *daemontest.LogBuffer
	args    []string
	env     []string
	stopped bool
	// launcher, when set, is an executable run in the "gorun" role that starts the daemon
	// as its child, as `go run` does (relaunch_chain_e2e_linux_test.go).
	launcher string
}

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
	cmd := ostest.Command("", "xmsg", args...)
	cmd.Env = append(cmd.Env, env...)
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
	d.stderr = &daemontest.LogBuffer{}
	d.cmd = xmsgCmd(d.env, d.args...)
	if d.launcher != "" {
		d.cmd = ostest.Command(d.launcher, goRunRole, d.args...)
		d.cmd.Env = append(d.cmd.Env, d.env...)
	}
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
