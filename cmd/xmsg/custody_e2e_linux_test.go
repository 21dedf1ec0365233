//go:build linux

package main

import (
	"bufio"
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"go/build"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/xmsg/xmsg/internal/custody"
	"github.com/xmsg/xmsg/internal/daemontest"
	"github.com/xmsg/xmsg/internal/ostest"
)

type custodyEnv struct {
	*daemon
	value, file string
}

// newCustodyDaemon starts a daemon holding secret "tok" (allowed to svc:a only; svc:a and
// svc:b are both this binary) from a 0600 file, logging at debug level.
func newCustodyDaemon(t *testing.T, extra ...string) *custodyEnv {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dir := shortTemp(t)
	e := &custodyEnv{value: randomValue(t), file: filepath.Join(dir, "tok")}
	if err := os.WriteFile(e.file, []byte(e.value), 0o600); err != nil {
		t.Fatal(err)
	}
	args := []string{"--svc-exe", "a=" + self, "--svc-exe", "b=" + self, "--custody", "tok=svc:a",
		"--custody-file", "tok=" + e.file, "--custody-reload-interval-secs", "0", "--log-level", "debug"}
	args = append(args, extra...)
	if os.Geteuid() != 0 {
		e.daemon = newDaemon(t, args...)
		return e
	}
	// As root, the daemon runs with gid 65534 so that /proc shows whether it is dumpable
	// (TestCustodyExec). newDaemon's start, with credentials.
	base := shortTemp(t)
	d := &daemon{t: t, rt: filepath.Join(base, "rt"), db: filepath.Join(base, "state", "xmsg.db"), sess: filepath.Join(base, "sessions")}
	os.Mkdir(d.rt, 0o700)
	os.Mkdir(d.sess, 0o700)
	d.env = []string{"XDG_RUNTIME_DIR=" + d.rt, "HOME=" + base}
	d.args = append([]string{"serve", "--db-path", d.db, "--sessions-dir", d.sess, "--host-label", "testhost"}, args...)
	d.stderr = &daemontest.LogBuffer{}
	d.cmd = xmsgCmd(d.env, d.args...)
	d.cmd.Stderr = d.stderr
	d.cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 0, Gid: 65534}}
	if err := d.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.stop)
	daemontest.WaitFor(t, "daemon serving", func() bool { return strings.Contains(d.stderr.String(), "msg=serving") })
	e.daemon = d
	return e
}

func randomValue(t *testing.T) string {
	b := make([]byte, 16)
	rand.Read(b)
	return "custody-secret-" + hex.EncodeToString(b)
}

// ask runs custody-ask with env and returns its report; stdin, when not nil, is its stdin.
func ask(t *testing.T, env []string, started func(pid int)) map[string]any {
	t.Helper()
	cmd := ostest.Command("", "custody-ask")
	cmd.Env = append(cmd.Env, env...)
	var stdin io.WriteCloser
	if started != nil {
		stdin, _ = cmd.StdinPipe()
	}
	var out bytes.Buffer
	cmd.Stdout = &out
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	if started != nil {
		started(cmd.Process.Pid)
		stdin.Write([]byte("go\n"))
		stdin.Close()
	}
	cmd.Wait()
	var got map[string]any
	if err := json.Unmarshal(out.Bytes(), &got); err != nil {
		t.Fatalf("custody-ask: %q", out.String())
	}
	return got
}

func answerCode(got map[string]any) string {
	var a struct{ Status, Error string }
	json.Unmarshal([]byte(fmt.Sprint(got["answer"])), &a)
	if a.Status == "ok" {
		return "ok"
	}
	return a.Error
}

// TestCustodyHandOver: a real service process registered as svc:a receives the secret as a
// descriptor on register.sock and reads it; the answer carries the name and pin only; the
// memfd refuses writes and truncation in the receiving process; doctor counts the hand-over.
func TestCustodyHandOver(t *testing.T) {
	e := newCustodyDaemon(t)
	got := ask(t, []string{"CUSTODY_SOCK=" + e.sock("register"), `CUSTODY_REGISTER={"harness":"svc","name":"a","cwd":"/"}`, "CUSTODY_SECRET=tok"}, nil)
	if got["value"] != e.value || got["fd"] != true {
		t.Fatalf("svc:a got %v", got)
	}
	pin := custody.Pin([]byte(e.value))
	if a := fmt.Sprint(got["answer"]); a != `{"status":"ok","credential":{"name":"tok","pin":"`+pin+`"}}` {
		t.Errorf("answer %s", a)
	}
	if got["sealed"] != "yes" || !strings.Contains(fmt.Sprint(got["write"]), "operation not permitted") || !strings.Contains(fmt.Sprint(got["truncate"]), "operation not permitted") {
		t.Errorf("memfd not sealed: %v", got)
	}
	doc := e.doctor(t)
	if !strings.Contains(doc, "custody: tok pin "+pin) || !strings.Contains(doc, "for svc:a; handed over 1 times") || !strings.Contains(doc, "ptrace: ") {
		t.Errorf("doctor:\n%s", doc)
	}
	// The metrics count the hand-over under the secret's name, and hold nothing of its value.
	if v, raw := metric(t, e.daemon, `xmsg_custody_total{secret="tok",code=""}`); v != 1 || strings.Contains(raw, e.value) {
		t.Errorf("custody hand-overs counted %v (want 1), or the value is in the scrape:\n%s", v, raw)
	}
	e.checkNoTrace(t)
}

// TestCustodyDoctorNotOnTCP: the TCP listener (no peer check) answers doctor without the
// custody lines; http.sock's has them.
func TestCustodyDoctorNotOnTCP(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	e := newCustodyDaemon(t, "--listen", addr)
	out, err := xmsgCmd(e.env, "doctor", "--url", "http://"+addr).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "tcp listener: "+addr) {
		t.Fatalf("doctor over TCP: %v\n%s", err, out)
	}
	if strings.Contains(string(out), "custody: tok") {
		t.Errorf("doctor over TCP shows custody:\n%s", out)
	}
	if !strings.Contains(e.doctor(t), "custody: tok") {
		t.Error("doctor on http.sock lacks custody (the control)")
	}
}

// TestCustodyRefusals: each principal custody must refuse gets an error with the protocol's
// code and no descriptor: another service, a uid-only session, a process attested to no
// session, a Claude session, an unknown secret; another uid gets 0 bytes.
func TestCustodyRefusals(t *testing.T) {
	e := newCustodyDaemon(t)
	reg, agent := "CUSTODY_SOCK="+e.sock("register"), "CUSTODY_SOCK="+e.sock("agent")
	cases := []struct {
		name  string
		env   []string
		claim bool // make the asking process a Claude session before it asks
		want  string
	}{
		{"another service (svc:b)", []string{reg, `CUSTODY_REGISTER={"harness":"svc","name":"b","cwd":"/"}`}, false, "op_denied"},
		{"uid-only session (pi)", []string{reg, `CUSTODY_REGISTER={"harness":"pi","sessionName":"a","cwd":"/"}`}, false, "op_denied"},
		{"unknown secret", []string{reg, `CUSTODY_REGISTER={"harness":"svc","name":"a","cwd":"/"}`, "CUSTODY_SECRET=nope"}, false, "not_found"},
		{"unattested process on agent.sock", []string{agent}, false, "unattested"},
		{"claude session on agent.sock", []string{agent, "CUSTODY_WAIT=1"}, true, "op_denied"},
	}
	for _, c := range cases {
		env := append([]string{"CUSTODY_SECRET=tok"}, c.env...)
		var started func(int)
		if c.claim {
			started = func(pid int) {
				daemontest.WriteClaudeSession(t, filepath.Join(e.sess, "claude-asker.json"), daemontest.ClaudeSession{PID: pid, ID: "7d9f3c1e-0000-4000-8000-000000000001", Name: "a", Cwd: "/"})
				time.Sleep(200 * time.Millisecond) // the scanner picks the file up (inotify)
			}
		}
		got := ask(t, env, started)
		if code := answerCode(got); code != c.want || got["fd"] != false || got["value"] != nil {
			t.Errorf("%s: %v, want %s and no descriptor", c.name, got, c.want)
		}
	}
	// Another uid: the peer gate closes the connection before a byte is read.
	other := ostest.AddUser(t)
	for dir := e.sock("register"); dir != "/"; dir = filepath.Dir(dir) {
		if strings.HasPrefix(dir, os.TempDir()+"/") {
			os.Chmod(dir, 0o755)
		}
	}
	_, bin := ostest.WorldExe(t, "client")
	for _, name := range []string{"register", "agent"} {
		os.Chmod(e.sock(name), 0o777)
		cmd := ostest.DialCommand(bin, e.sock(name), `{"harness":"svc","name":"a","cwd":"/"}`+"\n"+`{"action":"credential","name":"tok"}`+"\n")
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: other.UID, Gid: other.GID}}
		out, err := cmd.Output()
		if err != nil || strings.TrimSpace(string(out)) != "bytes=0" {
			t.Errorf("%s.sock as %s: %q %v, want bytes=0", name, other.Name, out, err)
		}
	}
	if doc := e.doctor(t); !strings.Contains(doc, "handed over 0 times") {
		t.Errorf("doctor after refusals:\n%s", doc)
	}
	log := e.stderr.String()
	// One line a second per (secret, code): the first op_denied (svc:b) is written, the
	// others within the second are counted on the next.
	for _, want := range []string{"code=op_denied", "code=not_found", "code=unattested", "actor=svc:b"} {
		if !strings.Contains(log, want) {
			t.Errorf("no audit line with %q", want)
		}
	}
	e.checkNoTrace(t)
}

// TestCustodyFederationHasNoPath: no federation code reaches custody: internal/fed (the
// listener, its routes and its client) does not depend on internal/custody, so a peer has no
// request that could name a secret.
func TestCustodyFederationHasNoPath(t *testing.T) {
	seen := map[string]bool{}
	var walk func(string)
	walk = func(path string) {
		if seen[path] || !strings.HasPrefix(path, "github.com/xmsg/xmsg/") {
			return
		}
		seen[path] = true
		p, err := build.Import(path, "", 0)
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		for _, imp := range p.Imports {
			walk(imp)
		}
	}
	walk("github.com/xmsg/xmsg/internal/fed")
	if len(seen) < 3 {
		t.Fatalf("walked %d packages: is the walk broken?", len(seen))
	}
	if seen["github.com/xmsg/xmsg/internal/custody"] {
		t.Error("internal/fed depends on internal/custody: a federation route could hand out a secret")
	}
}

// TestCustodyExec: a dispatcher-shaped service runs `xmsg exec --credential tok=TOK -- sh`;
// the shell reads the secret through $TOK (a /proc/self/fd path), while the dispatcher's
// memory (every readable mapping, through /proc/<pid>/mem) and descriptor table hold no
// trace of it, and no process's environment or command line holds the value. A rotation
// (the file replaced, SIGHUP) is handed out next.
func TestCustodyExec(t *testing.T) {
	ostest.RequireRoot(t) // /proc/<pid>/mem of another process
	ostest.RequireTool(t, "sh")
	e := newCustodyDaemon(t)
	out := filepath.Join(shortTemp(t), "out")
	disp := ostest.Command("", "custody-dispatcher")
	disp.Env = append(disp.Env, "REGISTER_SOCK="+e.sock("register"), "XMSG_AGENT_SOCK="+e.sock("agent"), "NAME=a", "SECRET=tok", "OUT="+out)
	stdin, _ := disp.StdinPipe()
	stdout, _ := disp.StdoutPipe()
	disp.Stderr = os.Stderr
	if err := disp.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { stdin.Close(); disp.Process.Kill(); disp.Wait() }()
	r := bufio.NewReader(stdout)
	line, _ := r.ReadString('\n')
	var cmdPID int
	if _, err := fmt.Sscanf(line, "cmd %d", &cmdPID); err != nil {
		t.Fatalf("dispatcher: %q", line)
	}
	daemontest.WaitFor(t, "CMD wrote the secret", func() bool { _, err := os.Stat(out); return err == nil })
	if b, _ := os.ReadFile(out); string(b) != e.value {
		t.Fatalf("CMD read %q", b)
	}
	// CMD (now sleep, exec'd by sh) holds the descriptor at 3 and the path in its environment.
	if l, _ := os.Readlink(fmt.Sprintf("/proc/%d/fd/3", cmdPID)); !strings.HasPrefix(l, "/memfd:xmsg-custody-tok") {
		t.Errorf("CMD fd 3 is %q", l)
	}
	// Read until it holds: the file is written by sh just before it execs sleep, and an
	// environ read while the exec is under way finds nothing (a new mm, its environment not
	// set yet). The bound is a hang guard.
	daemontest.WaitFor(t, "CMD's environment to name TOK=/proc/self/fd/3", func() bool {
		env, _ := os.ReadFile(fmt.Sprintf("/proc/%d/environ", cmdPID))
		return bytes.Contains(append([]byte{0}, env...), []byte("\x00TOK=/proc/self/fd/3\x00"))
	})
	e.checkProcs(t)
	syscall.Kill(cmdPID, syscall.SIGKILL)
	line, _ = r.ReadString('\n')
	if !strings.HasPrefix(line, "done") {
		t.Fatalf("dispatcher: %q", line)
	}
	// The dispatcher never held it: no descriptor of a memfd, no byte of the value mapped.
	fds, _ := os.ReadDir(fmt.Sprintf("/proc/%d/fd", disp.Process.Pid))
	for _, fd := range fds {
		if l, _ := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", disp.Process.Pid, fd.Name())); strings.Contains(l, "memfd:") {
			t.Errorf("dispatcher holds fd %s -> %s", fd.Name(), l)
		}
	}
	if n := scanMemory(t, disp.Process.Pid, e.value); n < 0 {
		t.Fatal("no mapping of the dispatcher could be read")
	} else if n > 0 {
		t.Errorf("the dispatcher's memory holds the value (%d mappings)", n)
	}
	// The daemon is non-dumpable: /proc/<daemon>/fd (and mem, environ) belong to root, not
	// to the daemon's credentials, so another process of its uid cannot open the memfd there.
	// The daemon runs with gid 65534 here: /proc/<pid> itself keeps that gid (the control),
	// its fd directory shows 0 only because the process is not dumpable.
	if gid := statGID(t, fmt.Sprintf("/proc/%d", e.cmd.Process.Pid)); gid != 65534 {
		t.Errorf("/proc/<daemon> gid %d, want 65534 (the control)", gid)
	}
	if gid := statGID(t, fmt.Sprintf("/proc/%d/fd", e.cmd.Process.Pid)); gid != 0 {
		t.Errorf("/proc/<daemon>/fd gid %d, want 0: the daemon is dumpable", gid)
	}
	// Control: the scan finds what is there (this process holds the value).
	if scanMemory(t, os.Getpid(), e.value) <= 0 {
		t.Error("the scan does not find the value in this process's memory: the scan is broken")
	}

	stdin.Close() // the dispatcher ends, and with it its registration as svc:a
	disp.Wait()

	// Rotation: a new file renamed into place, SIGHUP, and the next hand-over is the new one.
	next := randomValue(t)
	os.WriteFile(e.file+".new", []byte(next), 0o600)
	os.Rename(e.file+".new", e.file)
	e.cmd.Process.Signal(syscall.SIGHUP)
	daemontest.WaitFor(t, "rotation", func() bool { return strings.Contains(e.stderr.String(), "custody secret rotated") })
	got := ask(t, []string{"CUSTODY_SOCK=" + e.sock("register"), `CUSTODY_REGISTER={"harness":"svc","name":"a","cwd":"/"}`, "CUSTODY_SECRET=tok"}, nil)
	if got["value"] != next {
		t.Errorf("after rotation svc:a got %v", got)
	}
	doc := e.doctor(t)
	if !strings.Contains(doc, "custody: tok pin "+custody.Pin([]byte(next))) || !strings.Contains(doc, "handed over 2 times") {
		t.Errorf("doctor after rotation:\n%s", doc)
	}
	if strings.Contains(doc, next) {
		t.Error("doctor holds the rotated value")
	}
	e.checkNoTrace(t)
}

func (e *custodyEnv) doctor(t *testing.T) string {
	t.Helper()
	out, err := xmsgCmd(e.env, "doctor", "--http-sock", e.sock("http")).CombinedOutput()
	if err != nil {
		t.Fatalf("doctor: %v: %s", err, out)
	}
	return string(out)
}

// checkProcs: no process's environment or command line holds the value.
func (e *custodyEnv) checkProcs(t *testing.T) {
	t.Helper()
	dirs, _ := filepath.Glob("/proc/[0-9]*")
	read := 0
	for _, d := range dirs {
		for _, f := range []string{"environ", "cmdline"} {
			b, err := os.ReadFile(filepath.Join(d, f))
			if err != nil {
				continue
			}
			read++
			if bytes.Contains(b, []byte(e.value)) {
				t.Errorf("%s/%s holds the value", d, f)
			}
		}
	}
	if read < 4 {
		t.Errorf("read only %d environ/cmdline files: is the scan broken?", read)
	}
}

// checkNoTrace: the value is in no process's environment or command line, not in the
// daemon's log (at debug level), its doctor output, or, once stopped, its bbolt file.
func (e *custodyEnv) checkNoTrace(t *testing.T) {
	t.Helper()
	e.checkProcs(t)
	if doc := e.doctor(t); strings.Contains(doc, e.value) {
		t.Error("doctor output holds the value")
	}
	e.stop()
	if log := e.stderr.String(); strings.Contains(log, e.value) || !strings.Contains(log, "level=DEBUG") && !strings.Contains(log, "custody secret loaded") {
		t.Errorf("daemon log holds the value, or was not written:\n%s", log)
	}
	db, err := os.ReadFile(e.db)
	if err != nil || len(db) == 0 {
		t.Fatalf("bbolt file: %v", err)
	}
	if bytes.Contains(db, []byte(e.value)) {
		t.Error("the bbolt file holds the value")
	}
}

// scanMemory counts the readable mappings of pid whose bytes (read through /proc/<pid>/mem)
// contain value; -1 when none could be read.
func scanMemory(t *testing.T, pid int, value string) int {
	t.Helper()
	maps, err := os.ReadFile(fmt.Sprintf("/proc/%d/maps", pid))
	if err != nil {
		t.Fatal(err)
	}
	mem, err := os.Open(fmt.Sprintf("/proc/%d/mem", pid))
	if err != nil {
		t.Fatal(err)
	}
	defer mem.Close()
	found, readable := 0, 0
	for _, line := range strings.Split(string(maps), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 || f[1][0] != 'r' {
			continue
		}
		lo, hi, _ := strings.Cut(f[0], "-")
		start, _ := strconv.ParseUint(lo, 16, 64)
		end, _ := strconv.ParseUint(hi, 16, 64)
		if end-start > 1<<30 {
			continue
		}
		buf := make([]byte, end-start)
		n, _ := mem.ReadAt(buf, int64(start))
		if n == 0 {
			continue
		}
		readable++
		if bytes.Contains(buf[:n], []byte(value)) {
			found++
		}
	}
	if readable == 0 {
		return -1
	}
	return found
}

func statGID(t *testing.T, path string) uint32 {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Sys().(*syscall.Stat_t).Gid
}
