// Package daemontest is test support for the whole daemon: a real bus on a real bbolt file,
// agent.sock/register.sock/http.sock on real Unix sockets behind the real peer gate (Env), and
// clients that are real child processes (re-executions of the test binary), so that the daemon
// attests them from the kernel and /proc exactly as in production. It sits above every
// transport package (it imports internal/daemon, the whole assembly, and mcp) and is imported only
// by tests, like tailscale's tstest/integration.
//
// A test binary that uses it passes Roles to ostest.Main in its TestMain (Main does exactly
// that). A child in the "puppet" role obeys JSON commands on stdin (dial a socket, write bytes,
// read a line, hand its socket to a child of its own and exit) and answers on stdout. A fake
// Claude session is a puppet plus a real session file naming its pid and real start time
// (WriteClaudeSession) and a real listening inbox socket (ListenInbox); Env.Claude and
// StartClaude put them together.
package daemontest

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/xmsg/xmsg/internal/agentsock"
	"github.com/xmsg/xmsg/internal/bus"
	"github.com/xmsg/xmsg/internal/config"
	"github.com/xmsg/xmsg/internal/daemon"
	"github.com/xmsg/xmsg/internal/mcp"
	"github.com/xmsg/xmsg/internal/ostest"
	"github.com/xmsg/xmsg/internal/peercred"
	"github.com/xmsg/xmsg/internal/registersock"
	"github.com/xmsg/xmsg/internal/store"
)

const (
	inheritEnv = "XMSG_DAEMONTEST_INHERIT" // conn number of an inherited socket (fd 3)
	childEnv   = "XMSG_DAEMONTEST_CHILD"   // role of the child a "parent" helper starts
	// Wait bounds every wait of a test for something that must happen. It is a safety net
	// against hangs, not a measurement: nothing asserts on how long things take.
	Wait = 20 * time.Second
)

// Host is the host label of every test bus.
const Host = "testhost"

// Roles are the child processes this package starts: "puppet", "mcp" (the MCP bridge) and
// "parent" (a process whose child runs another role, one level down).
func Roles() ostest.Roles {
	return ostest.Roles{"puppet": puppetMain, "mcp": mcpMain, "parent": parentMain}
}

// Main is a TestMain for a test binary whose only children are this package's.
func Main(m *testing.M) { ostest.Main(m, Roles()) }

// Options of an Env. The daemon is production's (internal/daemon, started in this process):
// every bound is the flag's default unless a field here sets it.
type Options struct {
	SvcExe map[string]string // trusted service executables
	// Agent and Register: the non-zero fields replace the daemon's (its flags' defaults).
	// Bus, Proc, Log and Host are the daemon's and ignored here.
	Agent    agentsock.Config
	Register registersock.Config
	MaxBody  int // --max-body; its default when 0
}

// Env is one daemon: bus, store and the three sockets, in a fresh temporary directory.
type Env struct {
	T           testing.TB
	Dir         string
	SessionsDir string
	Bus         *bus.Bus
	Store       *store.Store
	Agent       *agentsock.Server
	Register    *registersock.Server
	AgentPath   string
	RegPath     string
	HTTPPath    string
	Logs        *LogBuffer
	Log         *slog.Logger
}

// LogBuffer collects the daemon's log lines for assertions.
type LogBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *LogBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

// String returns everything logged so far.
func (l *LogBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

// New starts a daemon for t: the assembly `xmsg serve` runs (internal/daemon), from flags, in
// this process, without what would change the whole test process (Landlock, sd_notify, the
// helper processes). Everything stops when t ends.
func New(t testing.TB, opt Options) *Env {
	t.Helper()
	dir := t.TempDir()
	// The sockets get a directory of their own, 0700, as the daemon verifies before it binds.
	run := filepath.Join(dir, "run")
	e := &Env{T: t, Dir: dir, SessionsDir: filepath.Join(dir, "sessions"), Logs: &LogBuffer{},
		AgentPath: filepath.Join(run, "agent.sock"), RegPath: filepath.Join(run, "register.sock"), HTTPPath: filepath.Join(run, "http.sock")}
	for _, d := range []string{e.SessionsDir, run} {
		if err := os.Mkdir(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	e.Log = slog.New(slog.NewTextHandler(e.Logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	args := []string{"--host-label", Host, "--db-path", filepath.Join(dir, "x.db"), "--sessions-dir", e.SessionsDir,
		"--http-sock", e.HTTPPath, "--agent-sock", e.AgentPath, "--register-sock", e.RegPath}
	if opt.MaxBody != 0 {
		args = append(args, "--max-body", strconv.Itoa(opt.MaxBody))
	}
	for name, exe := range opt.SvcExe {
		args = append(args, "--svc-exe", name+"="+exe)
	}
	// No environment: the flags above and the defaults are the whole configuration, whatever
	// XMSG_* variables the test process has.
	cfg, err := config.Parse(args, func(string) string { return "" })
	if err != nil {
		t.Fatal(err)
	}
	d := daemon.New(daemon.Config{Config: cfg, Log: e.Log, InProcess: true,
		Agent: func(c *agentsock.Config) { overlayAgent(c, opt.Agent) }, Register: func(c *registersock.Config) { overlayRegister(c, opt.Register) }})
	ctx, stop := context.WithCancel(context.Background())
	started, err := d.Start(ctx)
	if !started {
		d.Close()
		stop()
		t.Fatalf("daemon start: %v", err)
	}
	e.Bus, e.Store, e.Agent, e.Register = d.Bus(), d.Store(), d.AgentServer(), d.RegisterServer()
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	t.Cleanup(func() {
		stop()
		select {
		case err := <-done:
			if err != nil && !shutDownByTest(err) {
				t.Errorf("daemon: %v", err)
			}
		case <-time.After(Wait):
			t.Errorf("daemon did not stop within %v", Wait)
		}
		d.Close()
	})
	return e
}

// shutDownByTest reports whether the group's error only says that a server stopped with
// net.ErrClosed: a test shut it down itself (Agent.Shutdown), which stops the group early. The
// group reports a server's error as text (%v), one line each, so each line is read as text;
// a drain that timed out, or any other error, is a failure of the test.
func shutDownByTest(err error) bool {
	for _, line := range strings.Split(err.Error(), "\n") {
		if !strings.HasPrefix(line, "servergroup: server ") || !strings.HasSuffix(line, net.ErrClosed.Error()) {
			return false
		}
	}
	return true
}

// overlayAgent sets the non-zero fields of o in c.
func overlayAgent(c *agentsock.Config, o agentsock.Config) {
	set(&c.MaxLine, o.MaxLine)
	set(&c.MaxFrame, o.MaxFrame)
	set(&c.MaxConns, o.MaxConns)
	set(&c.MaxPending, o.MaxPending)
	set(&c.MaxPerPID, o.MaxPerPID)
	set(&c.PendingTimeout, o.PendingTimeout)
	set(&c.IdleTimeout, o.IdleTimeout)
	set(&c.WriteTimeout, o.WriteTimeout)
	set(&c.WriteTimeout, o.WriteTimeout)
}

// overlayRegister sets the non-zero fields of o in c.
func overlayRegister(c *registersock.Config, o registersock.Config) {
	set(&c.FirstFrameTimeout, o.FirstFrameTimeout)
	set(&c.MaxFirstFrame, o.MaxFirstFrame)
	set(&c.MaxFrame, o.MaxFrame)
	set(&c.MaxConns, o.MaxConns)
	set(&c.MaxPending, o.MaxPending)
	set(&c.MaxPerPID, o.MaxPerPID)
	set(&c.MaxUIDOnly, o.MaxUIDOnly)
	set(&c.IdleTimeout, o.IdleTimeout)
	set(&c.WriteTimeout, o.WriteTimeout)
}

func set[T comparable](dst *T, v T) {
	var zero T
	if v != zero {
		*dst = v
	}
}

// WaitFor polls cond until it holds, failing the test after Wait.
func WaitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(Wait)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("gave up waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// Cmd is a command of the puppet protocol; Reply its answer.
type Cmd struct {
	Op   string `json:"op"`
	Conn int    `json:"conn,omitempty"`
	Path string `json:"path,omitempty"`
	Data []byte `json:"data,omitempty"`
}

// Reply is the puppet's answer to a Cmd.
type Reply struct {
	OK   bool   `json:"ok"`
	Conn int    `json:"conn,omitempty"`
	Line string `json:"line,omitempty"`
	EOF  bool   `json:"eof,omitempty"`
	Err  string `json:"err,omitempty"`
	PID  int    `json:"pid,omitempty"`
}

// Puppet is a child process that connects to sockets and exchanges bytes on command.
type Puppet struct {
	t   testing.TB
	Cmd *exec.Cmd // nil for a puppet inherited by Handoff (not our child)
	PID int
	in  *os.File
	out *bufio.Reader
	raw *os.File
}

// Start starts a puppet running exe (the test binary when ""), with extra environment.
func Start(t testing.TB, exe string, env ...string) *Puppet {
	return start(t, exe, "puppet", env)
}

func start(t testing.TB, exe, role string, env []string) *Puppet {
	t.Helper()
	// Own pipes instead of StdinPipe/StdoutPipe: Wait must not close them, because a child the
	// puppet hands its socket to keeps talking on the same pipes after the puppet is reaped.
	inR, inW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	outR, outW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	newCmd := func() *exec.Cmd {
		cmd := ostest.Command(exe, role)
		cmd.Env = append(cmd.Env, env...)
		cmd.Stdin, cmd.Stdout, cmd.Stderr = inR, outW, os.Stderr
		return cmd
	}
	cmd := newCmd()
	// A copied executable can be briefly "text file busy" while another goroutine's fork still
	// holds the writer's descriptor between fork and exec; that passes.
	for i := 0; ; i++ {
		err = cmd.Start()
		if !errors.Is(err, syscall.ETXTBSY) || i == 50 {
			break
		}
		time.Sleep(10 * time.Millisecond)
		cmd = newCmd()
	}
	if err != nil {
		t.Fatal(err)
	}
	inR.Close()
	outW.Close()
	p := &Puppet{t: t, Cmd: cmd, PID: cmd.Process.Pid, in: inW, out: bufio.NewReader(outR), raw: outR}
	t.Cleanup(func() {
		p.Kill()
		inW.Close()
		outR.Close()
	})
	return p
}

// Kill ends the puppet (SIGKILL) and reaps it, so that its pid is gone from /proc.
func (p *Puppet) Kill() {
	if p.Cmd != nil {
		p.Cmd.Process.Kill()
		p.Cmd.Wait()
		return
	}
	// Not our child: it was re-parented when its parent exited; whoever adopted it reaps it.
	syscall.Kill(p.PID, syscall.SIGKILL)
}

// StartTime is the puppet's start time from /proc.
func (p *Puppet) StartTime() string {
	p.t.Helper()
	st, err := peercred.Proc{}.StartTime(p.PID)
	if err != nil {
		p.t.Fatal(err)
	}
	return st
}

func (p *Puppet) do(c Cmd) Reply {
	p.t.Helper()
	line, _ := json.Marshal(c)
	if _, err := p.in.Write(append(line, '\n')); err != nil {
		p.t.Fatalf("puppet %d: write command: %v", p.PID, err)
	}
	return p.read()
}

func (p *Puppet) read() Reply {
	p.t.Helper()
	p.raw.SetReadDeadline(time.Now().Add(Wait + 5*time.Second))
	ans, err := p.out.ReadBytes('\n')
	if err != nil {
		p.t.Fatalf("puppet %d: read answer: %v", p.PID, err)
	}
	var r Reply
	if err := json.Unmarshal(ans, &r); err != nil {
		p.t.Fatalf("puppet %d: bad answer %q", p.PID, ans)
	}
	return r
}

// Dial connects to the socket at path and returns the connection's number.
func (p *Puppet) Dial(path string) int {
	p.t.Helper()
	r := p.do(Cmd{Op: "dial", Path: path})
	if !r.OK {
		p.t.Fatalf("puppet %d: dial %s: %s", p.PID, path, r.Err)
	}
	return r.Conn
}

// Write writes raw bytes on conn.
func (p *Puppet) Write(conn int, data []byte) {
	p.t.Helper()
	if r := p.do(Cmd{Op: "write", Conn: conn, Data: data}); !r.OK {
		p.t.Fatalf("puppet %d: write: %s", p.PID, r.Err)
	}
}

// Send writes v as one JSON line on conn.
func (p *Puppet) Send(conn int, v any) {
	p.t.Helper()
	line, err := json.Marshal(v)
	if err != nil {
		p.t.Fatal(err)
	}
	p.Write(conn, append(line, '\n'))
}

// Recv reads one line from conn. eof is true when the server closed the connection instead.
func (p *Puppet) Recv(conn int) (line string, eof bool) {
	p.t.Helper()
	r := p.do(Cmd{Op: "recv", Conn: conn})
	if !r.OK {
		p.t.Fatalf("puppet %d: recv: %s", p.PID, r.Err)
	}
	return r.Line, r.EOF
}

// RecvJSON reads one line and decodes it; the test fails on EOF.
func (p *Puppet) RecvJSON(conn int) map[string]any {
	p.t.Helper()
	line, eof := p.Recv(conn)
	if eof {
		p.t.Fatalf("puppet %d: connection closed, want a line", p.PID)
	}
	var m map[string]any
	if err := json.Unmarshal([]byte(line), &m); err != nil {
		p.t.Fatalf("puppet %d: answer %q is not a JSON object", p.PID, line)
	}
	return m
}

// Call sends v on conn and returns the decoded answer.
func (p *Puppet) Call(conn int, v any) map[string]any {
	p.t.Helper()
	p.Send(conn, v)
	return p.RecvJSON(conn)
}

// Close closes conn.
func (p *Puppet) Close(conn int) {
	p.t.Helper()
	p.do(Cmd{Op: "close", Conn: conn})
}

// Handoff makes the puppet pass conn to a new child of its own and exit; the puppet is reaped
// before Handoff returns, so its pid no longer exists. The returned puppet (the child) has the
// connection under the same number and answers on the same pipes.
func (p *Puppet) Handoff(conn int) *Puppet {
	p.t.Helper()
	line, _ := json.Marshal(Cmd{Op: "handoff", Conn: conn})
	if _, err := p.in.Write(append(line, '\n')); err != nil {
		p.t.Fatal(err)
	}
	r := p.read()
	if !r.OK || r.PID == 0 {
		p.t.Fatalf("handoff: %+v", r)
	}
	p.Cmd.Wait()
	child := &Puppet{t: p.t, PID: r.PID, in: p.in, out: p.out, raw: p.raw}
	p.t.Cleanup(child.Kill)
	return child
}

func puppetMain() int {
	conns := map[int]net.Conn{}
	readers := map[int]*bufio.Reader{}
	next := 1
	out := json.NewEncoder(os.Stdout)
	if n, err := strconv.Atoi(os.Getenv(inheritEnv)); err == nil {
		c, err := net.FileConn(os.NewFile(3, "inherited"))
		if err != nil {
			out.Encode(Reply{Err: err.Error()})
			return 1
		}
		conns[n], readers[n], next = c, bufio.NewReader(c), n+1
		out.Encode(Reply{OK: true, PID: os.Getpid()})
	}
	in := bufio.NewReader(os.Stdin)
	for {
		line, err := in.ReadBytes('\n')
		if err != nil {
			return 0
		}
		var c Cmd
		if err := json.Unmarshal(line, &c); err != nil {
			out.Encode(Reply{Err: "bad command"})
			continue
		}
		conn := conns[c.Conn]
		switch c.Op {
		case "dial":
			nc, err := net.Dial("unix", c.Path)
			if err != nil {
				out.Encode(Reply{Err: err.Error()})
				continue
			}
			conns[next], readers[next] = nc, bufio.NewReaderSize(nc, 1<<20)
			out.Encode(Reply{OK: true, Conn: next})
			next++
		case "write":
			if conn == nil {
				out.Encode(Reply{Err: "no such conn"})
				continue
			}
			conn.SetWriteDeadline(time.Now().Add(Wait))
			if _, err := conn.Write(c.Data); err != nil {
				out.Encode(Reply{Err: err.Error()})
				continue
			}
			out.Encode(Reply{OK: true})
		case "recv":
			if conn == nil {
				out.Encode(Reply{Err: "no such conn"})
				continue
			}
			conn.SetReadDeadline(time.Now().Add(Wait))
			l, err := readers[c.Conn].ReadString('\n')
			switch {
			case err == nil:
				out.Encode(Reply{OK: true, Line: strings.TrimSuffix(l, "\n")})
			case err == io.EOF && l == "", isReset(err):
				out.Encode(Reply{OK: true, EOF: true})
			default:
				out.Encode(Reply{Err: fmt.Sprintf("%v (partial %q)", err, l)})
			}
		case "close":
			if conn != nil {
				conn.Close()
				delete(conns, c.Conn)
			}
			out.Encode(Reply{OK: true})
		case "handoff":
			f, err := conn.(*net.UnixConn).File()
			if err != nil {
				out.Encode(Reply{Err: err.Error()})
				continue
			}
			cmd := ostest.Command("", "puppet")
			cmd.Env = append(cmd.Env, inheritEnv+"="+strconv.Itoa(c.Conn))
			cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
			cmd.ExtraFiles = []*os.File{f}
			if err := cmd.Start(); err != nil {
				out.Encode(Reply{Err: err.Error()})
				continue
			}
			// The child answers with its pid; this process must not read stdin any more.
			return 0
		default:
			out.Encode(Reply{Err: "unknown op"})
		}
	}
}

func isReset(err error) bool {
	return err != nil && (strings.Contains(err.Error(), "connection reset") || strings.Contains(err.Error(), "broken pipe"))
}

// mcpMain runs the MCP bridge on stdin/stdout with sockets from the environment.
func mcpMain() int {
	reply, _ := strconv.ParseBool(os.Getenv("XMSG_REPLY_ONLY"))
	err := mcp.Run(context.Background(), mcp.Config{AgentSock: os.Getenv("XMSG_AGENT_SOCK"), HTTPSock: os.Getenv("XMSG_HTTP_SOCK"),
		ReplyOnly: reply, In: os.Stdin, Out: os.Stdout, Version: "test", AgyStart: os.Getenv("ANTIGRAVITY_CONVERSATION_ID") != ""})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

// parentMain starts the role in XMSG_DAEMONTEST_CHILD as its own child on the same stdio and
// waits for it: the child is then a grandchild of the test, one level below the process a
// session file names.
func parentMain() int {
	held, err := holdFiles()
	if err != nil {
		fmt.Fprintln(os.Stderr, "daemontest parent:", err)
		return 1
	}
	defer func() {
		for _, f := range held {
			f.Close()
		}
	}()
	// The child runs the test binary itself when the parent is a copy (childExeEnv).
	cmd := ostest.Command(os.Getenv(childExeEnv), os.Getenv(childEnv))
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	if err := cmd.Run(); err != nil {
		return 1
	}
	return 0
}

// Files a "parent" helper holds open for its whole life (harness attestation tests: a Codex
// writer lock, a rollout, an Antigravity presence lock):
//   - LockEnv: ','-separated paths created if missing and locked with an exclusive flock;
//   - OpenEnv: ','-separated existing paths opened for appending, as a writer holds them.
const (
	LockEnv     = "XMSG_DAEMONTEST_LOCK"
	OpenEnv     = "XMSG_DAEMONTEST_OPEN"
	childExeEnv = "XMSG_DAEMONTEST_CHILD_EXE"
)

func holdFiles() ([]*os.File, error) {
	var held []*os.File
	for _, p := range strings.Split(os.Getenv(LockEnv), ",") {
		if p == "" {
			continue
		}
		f, err := os.OpenFile(p, os.O_RDWR|os.O_CREATE, 0o600)
		if err != nil {
			return held, err
		}
		held = append(held, f)
		if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
			return held, fmt.Errorf("flock %s: %w", p, err)
		}
	}
	for _, p := range strings.Split(os.Getenv(OpenEnv), ",") {
		if p == "" {
			continue
		}
		f, err := os.OpenFile(p, os.O_WRONLY|os.O_APPEND, 0)
		if err != nil {
			return held, err
		}
		held = append(held, f)
	}
	return held, nil
}

// StartNestedExe is StartNested with the parent running exe (a copy of the test binary that
// a daemon trusts, e.g. as a Codex executable) while its child, the puppet, runs the test
// binary itself. env may hold LockEnv and OpenEnv: the files the parent holds.
func StartNestedExe(t testing.TB, exe string, env ...string) *Puppet {
	return start(t, exe, "parent", append([]string{childEnv + "=puppet", childExeEnv + "=" + os.Args[0]}, env...))
}

// StartMCPAt starts the MCP bridge (the test binary) for the sockets agent and http as the
// child of a "parent" helper running exe, and returns the parent and the bridge's pipes.
func StartMCPAt(t testing.TB, exe, agent, http string, env ...string) (parent *exec.Cmd, in io.WriteCloser, out *bufio.Reader) {
	t.Helper()
	cmd := ostest.Command(exe, "parent")
	cmd.Env = append(append(cmd.Env, childEnv+"=mcp", childExeEnv+"="+os.Args[0],
		"XMSG_AGENT_SOCK="+agent, "XMSG_HTTP_SOCK="+http), env...)
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		in.Close()
		cmd.Process.Kill()
		cmd.Wait()
	})
	return cmd, in, bufio.NewReader(stdout)
}

// StartMCP starts the MCP bridge as a child of a session process: it returns the session
// process (a "parent" helper, whose pid a session file should name) and the pipes of the
// bridge.
func StartMCP(t testing.TB, e *Env, replyOnly bool) (parent *exec.Cmd, in io.WriteCloser, out *bufio.Reader) {
	t.Helper()
	return StartMCPAt(t, "", e.AgentPath, e.HTTPPath, "XMSG_REPLY_ONLY="+strconv.FormatBool(replyOnly))
}

// Inbox is a Claude session's inbox socket, listening in the test process. The daemon
// connects, writes one line and closes; every line of every connection is recorded, so a
// connection that carried two lines shows as two, and a line without its terminating newline
// is recorded with the prefix "unterminated: " (no assertion on content accepts it).
type Inbox struct {
	Path string

	mu    sync.Mutex
	lines []string
	next  int           // first line not yet taken by Next
	more  chan struct{} // closed and replaced when a line arrives
}

// ListenInbox listens on path (a Unix socket path, at most 108 bytes) until the test ends.
func ListenInbox(t testing.TB, path string) *Inbox {
	t.Helper()
	in := &Inbox{Path: path, more: make(chan struct{})}
	l, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				c.SetReadDeadline(time.Now().Add(Wait))
				data, _ := io.ReadAll(c)
				for len(data) > 0 {
					line, rest, ok := bytes.Cut(data, []byte("\n"))
					if !ok {
						in.add("unterminated: " + string(line))
						break
					}
					in.add(string(line))
					data = rest
				}
			}()
		}
	}()
	return in
}

func (in *Inbox) add(line string) {
	in.mu.Lock()
	defer in.mu.Unlock()
	in.lines = append(in.lines, line)
	close(in.more)
	in.more = make(chan struct{})
}

// Next returns the next delivered line not yet taken, failing the test after Wait.
func (in *Inbox) Next(t testing.TB) string {
	t.Helper()
	deadline := time.After(Wait)
	for {
		in.mu.Lock()
		if in.next < len(in.lines) {
			l := in.lines[in.next]
			in.next++
			in.mu.Unlock()
			return l
		}
		more := in.more
		in.mu.Unlock()
		select {
		case <-more:
		case <-deadline:
			t.Fatal("no line reached the inbox")
			return ""
		}
	}
}

// Len is the number of delivered lines not yet taken by Next.
func (in *Inbox) Len() int {
	in.mu.Lock()
	defer in.mu.Unlock()
	return len(in.lines) - in.next
}

// WaitLines waits until at least n lines have been delivered (or Wait has passed) and
// returns every line delivered so far; the caller asserts on how many there are.
func (in *Inbox) WaitLines(n int) []string {
	deadline := time.After(Wait)
	for {
		in.mu.Lock()
		if len(in.lines) >= n {
			l := slices.Clone(in.lines)
			in.mu.Unlock()
			return l
		}
		more := in.more
		in.mu.Unlock()
		select {
		case <-more:
		case <-deadline:
			in.mu.Lock()
			defer in.mu.Unlock()
			return slices.Clone(in.lines)
		}
	}
}

// InboxContent decodes an inbox line to the content string inside it.
func InboxContent(t testing.TB, line string) string {
	t.Helper()
	var l struct {
		Type    string `json:"type"`
		Message struct {
			Role    string `json:"role"`
			Content string `json:"content"`
		} `json:"message"`
	}
	if err := json.Unmarshal([]byte(line), &l); err != nil {
		t.Fatalf("inbox line %q: %v", line, err)
	}
	return l.Message.Content
}

// ClaudeSession is what a Claude Code session file says about its session.
type ClaudeSession struct {
	PID       int
	ID        string // sessionId
	Name      string // "" = no name field
	Cwd       string
	InboxPath string // messagingSocketPath
}

// WriteClaudeSession makes s.PID a live Claude session: it writes the session file at path
// with the process's real start time as procStart. The file appears whole (written beside it,
// then renamed), as Claude writes it, because the daemon may read the directory at any moment.
func WriteClaudeSession(t testing.TB, path string, s ClaudeSession) {
	t.Helper()
	start, err := peercred.Proc{}.StartTime(s.PID)
	if err != nil {
		t.Fatal(err)
	}
	f := map[string]any{
		"pid": s.PID, "sessionId": s.ID, "cwd": s.Cwd, "status": "idle", "kind": "interactive",
		"startedAt": 1700000000000, "updatedAt": 1700000000000, "procStart": start, "messagingSocketPath": s.InboxPath,
	}
	if s.Name != "" {
		f["name"] = s.Name
	}
	raw, _ := json.Marshal(f)
	tmp := filepath.Join(filepath.Dir(path), "."+filepath.Base(path)+".tmp")
	if err := os.WriteFile(tmp, raw, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// Claude makes pid a live Claude session of e: a session file in e.SessionsDir with its real
// start time and a real inbox socket. name may be "".
func (e *Env) Claude(pid int, sessionID, name string) *Inbox {
	t := e.T
	t.Helper()
	in := ListenInbox(t, filepath.Join(e.Dir, "inbox-"+sessionID[:8]+".sock"))
	WriteClaudeSession(t, filepath.Join(e.SessionsDir, sessionID+".json"),
		ClaudeSession{PID: pid, ID: sessionID, Name: name, Cwd: e.Dir, InboxPath: in.Path})
	return in
}

// Claude is a fake Claude Code session of its own: a real child process (a puppet), a session
// file naming it, and its inbox.
type Claude struct {
	*Puppet
	ID    string
	File  string // the session file
	Inbox *Inbox
}

// StartClaude starts a fake Claude session whose file is dir/file (file "" = "<id>.json"),
// for a daemon that reads dir. Its inbox socket is in a fresh short directory (socket paths
// are limited to 108 bytes). The session ends with the test, or earlier with Exit.
func StartClaude(t testing.TB, dir, file, id, name, cwd string) *Claude {
	t.Helper()
	if file == "" {
		file = id + ".json"
	}
	sockDir, err := os.MkdirTemp("", "inbox")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(sockDir) })
	c := &Claude{Puppet: Start(t, ""), ID: id, File: filepath.Join(dir, file)}
	c.Inbox = ListenInbox(t, filepath.Join(sockDir, "inbox.sock"))
	WriteClaudeSession(t, c.File, ClaudeSession{PID: c.PID, ID: id, Name: name, Cwd: cwd, InboxPath: c.Inbox.Path})
	return c
}

// Exit ends the session's process and reaps it; its session file stays behind, stale.
func (c *Claude) Exit() { c.Kill() }

// Dial connects from the test process itself (for tests where the client's identity does not
// matter, such as limits).
func Dial(t testing.TB, path string) *Client {
	t.Helper()
	c, err := net.Dial("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return &Client{t: t, C: c.(*net.UnixConn), R: bufio.NewReaderSize(c, 1<<20)}
}

// Client is an in-process connection.
type Client struct {
	t testing.TB
	C *net.UnixConn
	R *bufio.Reader
}

// Write writes raw bytes.
func (c *Client) Write(data []byte) {
	c.t.Helper()
	c.C.SetWriteDeadline(time.Now().Add(Wait))
	if _, err := c.C.Write(data); err != nil {
		c.t.Fatalf("write: %v", err)
	}
}

// Recv reads a line; eof when the server closed the connection.
func (c *Client) Recv() (line string, eof bool) {
	c.t.Helper()
	c.C.SetReadDeadline(time.Now().Add(Wait))
	l, err := c.R.ReadString('\n')
	switch {
	case err == nil:
		return strings.TrimSuffix(l, "\n"), false
	case err == io.EOF && l == "", isReset(err):
		return "", true
	}
	c.t.Fatalf("recv: %v (partial %q)", err, l)
	return "", false
}

// Call writes v as a JSON line and decodes the answer.
func (c *Client) Call(v any) map[string]any {
	c.t.Helper()
	line, _ := json.Marshal(v)
	c.Write(append(line, '\n'))
	l, eof := c.Recv()
	if eof {
		c.t.Fatal("connection closed, want an answer")
	}
	var m map[string]any
	if err := json.Unmarshal([]byte(l), &m); err != nil {
		c.t.Fatalf("answer %q: %v", l, err)
	}
	return m
}

// StartNested starts a "parent" helper whose child is a puppet on the same pipes. The returned
// Puppet's PID is the parent's: a session file naming it makes the puppet a descendant of the
// session, one level down, as an MCP bridge started by an agent is.
func StartNested(t testing.TB) *Puppet {
	return start(t, "", "parent", []string{childEnv + "=puppet"})
}

// Service starts a puppet running exe and registers it on register.sock as svc:name. It
// returns the puppet and its register connection.
func (e *Env) Service(exe, name string) (*Puppet, int) {
	t := e.T
	t.Helper()
	p := Start(t, exe)
	conn := p.Dial(e.RegPath)
	got := p.Call(conn, map[string]any{"harness": "svc", "name": name, "cwd": "/"})
	if got["status"] != "ok" || got["sessionId"] != "svc:"+name {
		t.Fatalf("register svc:%s: got %v, want status ok", name, got)
	}
	return p, conn
}

// CopyExe copies the test binary to dir/name (a different file with the same content).
func CopyExe(t testing.TB, dir, name string) string {
	t.Helper()
	return ostest.CopyExe(t, "", dir, name)
}

// DeliveredID returns the messageId of a deliver frame, failing on anything else.
func DeliveredID(t testing.TB, line string) string {
	t.Helper()
	var d struct {
		Action    string `json:"action"`
		MessageID string `json:"messageId"`
	}
	if err := json.Unmarshal([]byte(line), &d); err != nil || d.Action != "deliver" || d.MessageID == "" {
		t.Fatalf("got %q, want a deliver frame", line)
	}
	return d.MessageID
}
