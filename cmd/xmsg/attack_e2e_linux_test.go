package main

// Attacks by a process of the tier's own uid (issue 10), against the real daemon in its own
// process. Each test runs the attack from a separate attacker process (this test binary in
// the "attack" role), measures that a well-behaved client (this test process, another pid) is
// still served while it runs, and runs a positive control: the same attack with the defence
// turned off by its flags, which must show the harm. The figures are logged (go test -v) and
// quoted in docs/security.md §9. XMSG_LONG=1 makes every run longer.

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/xmsg/xmsg/internal/daemontest"
	"github.com/xmsg/xmsg/internal/ostest"
	"github.com/xmsg/xmsg/internal/peercred"
	"github.com/xmsg/xmsg/internal/sandbox"
)

// long reports whether the long mode was asked for.
func long() bool { return os.Getenv("XMSG_LONG") != "" }

// The attacker role runs before TestMain: init functions come first.
func init() {
	if os.Getenv("XMSG_TEST_ROLE") == "attack" {
		os.Exit(attackMain())
	}
}

// attackMain holds $N connections to $SOCK in the way $ATTACK says, redialing each one the
// daemon closes, until stdin closes. It prints "started" once every connection was tried.
// With $PROCS > 1 it is $PROCS processes instead, one connection each (a uid-only
// registration is one per process: the same process registering again takes its older one
// over).
func attackMain() int {
	kind, sock, extra := os.Getenv("ATTACK"), os.Getenv("SOCK"), os.Getenv("EXTRA")
	n, _ := strconv.Atoi(os.Getenv("N"))
	if procs, _ := strconv.Atoi(os.Getenv("PROCS")); procs > 1 {
		return attackProcs(procs)
	}
	stop := make(chan struct{})
	go func() { io.Copy(io.Discard, os.Stdin); close(stop) }()
	stopped := func() bool {
		select {
		case <-stop:
			return true
		default:
			return false
		}
	}
	// $SOCK may name several sockets (comma-separated): $N connections on each.
	socks := strings.Split(sock, ",")
	var first sync.WaitGroup
	first.Add(n * len(socks))
	for _, sock := range socks {
		for i := range n {
			go func() {
				once := sync.OnceFunc(first.Done)
				for !stopped() {
					holdOne(kind, sock, extra, i, once, stop)
					once()
					time.Sleep(50 * time.Millisecond)
				}
			}()
		}
	}
	first.Wait()
	fmt.Println("started")
	<-stop
	return 0
}

// attackProcs runs procs attacker processes of one connection each until stdin closes.
func attackProcs(procs int) int {
	var ins []io.WriteCloser
	var cmds []*exec.Cmd
	for i := range procs {
		cmd := exec.Command(os.Args[0])
		childN := os.Getenv("CHILD_N") // connections of each process; default one
		if childN == "" {
			childN = "1"
		}
		cmd.Env = append(os.Environ(), "PROCS=1", "N="+childN, "EXTRA="+strconv.Itoa(i))
		in, _ := cmd.StdinPipe()
		out, _ := cmd.StdoutPipe()
		cmd.Stderr = os.Stderr
		if err := cmd.Start(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		if line, _ := bufio.NewReader(out).ReadString('\n'); line != "started\n" {
			return 1
		}
		ins, cmds = append(ins, in), append(cmds, cmd)
	}
	fmt.Println("started")
	io.Copy(io.Discard, os.Stdin)
	for i := range cmds {
		ins[i].Close()
		cmds[i].Wait()
	}
	return 0
}

// holdOne opens one connection and holds it as kind says until the daemon closes it. started
// is called once the connection has done its first step.
func holdOne(kind, sock, extra string, i int, started func(), stop <-chan struct{}) {
	network, addr := "unix", sock
	if a, ok := strings.CutPrefix(sock, "tcp:"); ok {
		network, addr = "tcp", a
	}
	c, err := net.Dial(network, addr)
	if err != nil {
		return
	}
	defer c.Close()
	go func() { <-stop; c.Close() }()
	tick := func(every time.Duration, b []byte) {
		for {
			if _, err := c.Write(b); err != nil {
				return
			}
			select {
			case <-stop:
				return
			case <-time.After(every):
			}
		}
	}
	switch kind {
	case "http-slow-body":
		// Headers promising a body, then the body a byte at a time.
		if _, err := c.Write([]byte("POST /v1/sessions/x/messages HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: 60000\r\n\r\n{")); err != nil {
			return
		}
		started()
		tick(300*time.Millisecond, []byte(" "))
	case "http-idle", "silent":
		// Connected, sending nothing.
		started()
		io.Copy(io.Discard, c)
	case "http-keepalive":
		// One request answered, then an idle keep-alive.
		fmt.Fprint(c, "GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n")
		r := bufio.NewReader(c)
		if resp, err := http.ReadResponse(r, nil); err == nil {
			io.Copy(io.Discard, resp.Body)
		}
		started()
		io.Copy(io.Discard, r)
	case "ghostpoll":
		// A reply long-poll with one byte pipelined behind it; the process then exits (its
		// stdin closes) without reading the answer.
		fmt.Fprintf(c, "GET /v1/messages/%s/replies?wait=60 HTTP/1.1\r\nHost: localhost\r\n\r\nG", os.Getenv("ID"))
		started()
		<-stop
	case "agent-blank":
		// A blank line every 100 ms: never a frame.
		c.Write([]byte("\n"))
		started()
		tick(100*time.Millisecond, []byte("\n"))
	case "register-uid":
		// A uid-only registration, then blank lines.
		fmt.Fprintf(c, `{"harness":"pi","sessionName":"holder-%s-%d","cwd":"/"}`+"\n", extra, i)
		bufio.NewReader(c).ReadString('\n')
		started()
		tick(100*time.Millisecond, []byte("\n"))
	case "longpoll":
		// Reply long-polls, one after another.
		r := bufio.NewReader(c)
		for {
			fmt.Fprintf(c, "GET /v1/messages/%s/replies?wait=60 HTTP/1.1\r\nHost: localhost\r\n\r\n", extra)
			started()
			resp, err := http.ReadResponse(r, nil)
			if err != nil {
				return
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
	}
}

// startAttack runs an attacker process until the test ends.
func startAttack(t *testing.T, kind, sock string, n int, extra string) {
	t.Helper()
	startAttackEnv(t, kind, sock, n, extra)
}

// startAttackEnv is startAttack with more environment for the attacker. stop ends the
// attacker (every process of it exits) and waits for it; the test's end does it too.
func startAttackEnv(t *testing.T, kind, sock string, n int, extra string, env ...string) (stop func()) {
	t.Helper()
	return startAttackAs(t, os.Args[0], nil, kind, sock, n, extra, env...)
}

// startAttackAs is startAttackEnv running bin (a copy of this test binary) with cred (nil:
// this process's).
func startAttackAs(t *testing.T, bin string, cred *syscall.Credential, kind, sock string, n int, extra string, env ...string) (stop func()) {
	t.Helper()
	cmd := exec.Command(bin)
	cmd.Env = append(append(os.Environ(), "XMSG_TEST_ROLE=attack", "ATTACK="+kind, "SOCK="+sock, "N="+strconv.Itoa(n), "EXTRA="+extra), env...)
	if cred != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	}
	in, _ := cmd.StdinPipe()
	out, _ := cmd.StdoutPipe()
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	stop = sync.OnceFunc(func() { in.Close(); cmd.Wait() })
	t.Cleanup(stop)
	if line, _ := bufio.NewReader(out).ReadString('\n'); line != "started\n" {
		t.Fatalf("attacker %s did not start: %q", kind, line)
	}
	return stop
}

// limitFiles sets the daemon's RLIMIT_NOFILE (soft and hard).
func limitFiles(t *testing.T, d *daemon, n uint64) {
	t.Helper()
	if err := unix.Prlimit(d.cmd.Process.Pid, unix.RLIMIT_NOFILE, &unix.Rlimit{Cur: n, Max: n}, nil); err != nil {
		t.Fatalf("prlimit: %v", err)
	}
}

// freshClient is an HTTP client on http.sock that dials for every request (each one needs an
// accept) and gives up after timeout.
func (d *daemon) freshClient(timeout time.Duration) *http.Client {
	return &http.Client{Timeout: timeout, Transport: &http.Transport{DisableKeepAlives: true,
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", d.sock("http"))
		}}}
}

// tally counts a well-behaved client's outcomes.
type tally struct {
	served, failed int
	codes          map[string]int // error codes and transport failures seen
}

func (t *tally) fail(code string) {
	t.failed++
	if t.codes == nil {
		t.codes = map[string]int{}
	}
	t.codes[code]++
}

func (t tally) String() string {
	return fmt.Sprintf("served %d, failed %d %v", t.served, t.failed, t.codes)
}

// sendAll makes n anonymous sends to ref, one connection each, and counts them.
func sendAll(d *daemon, c *http.Client, ref string, n int) tally {
	var tl tally
	for i := range n {
		resp, err := c.Post("http://localhost/v1/sessions/"+ref+"/messages", "application/json",
			strings.NewReader(fmt.Sprintf(`{"from":"good","text":"m%d"}`, i)))
		if err != nil {
			tl.fail("transport")
			continue
		}
		var v map[string]any
		json.NewDecoder(resp.Body).Decode(&v)
		resp.Body.Close()
		if resp.StatusCode == 202 {
			tl.served++
		} else {
			tl.fail(fmt.Sprint(resp.StatusCode, " ", v["error"]))
		}
		time.Sleep(20 * time.Millisecond)
	}
	return tl
}

// waitFDs waits (bounded) until the daemon holds at least n descriptors.
func (d *daemon) waitFDs(n int) bool {
	for range 500 {
		if fds, _ := os.ReadDir(fmt.Sprintf("/proc/%d/fd", d.cmd.Process.Pid)); len(fds) >= n {
			return true
		}
		time.Sleep(10 * time.Millisecond)
	}
	return false
}

// TestAttackHTTPSlowBodiesAndIdleConns: two attacker processes hold slow bodies and idle
// connections on http.sock of a daemon limited to 64 descriptors. With the caps (which fit
// the limit) every send of a well-behaved client is served; without them (positive control)
// the attackers take every descriptor, sends fail, and a request that does get in is answered
// 503 service_unavailable, never 404 not_found.
func TestAttackHTTPSlowBodiesAndIdleConns(t *testing.T) {
	n, sends := 100, 20
	if long() {
		n, sends = 400, 200
	}
	run := func(t *testing.T, defended bool) (tally, *daemon) {
		args := []string{"--http-max-conns", "24", "--http-max-per-pid", "8", "--http-body-timeout", "2s"}
		if !defended {
			args = []string{"--http-max-conns", "100000", "--http-max-per-pid", "100000",
				"--http-header-timeout", "1h", "--http-body-timeout", "1h", "--http-idle-timeout", "1h"}
		}
		d := newDaemon(t, args...)
		limitFiles(t, d, 64)
		s := startClaude(t, d.sess, "aaaaaaaa-0000-0000-0000-00000000a001", "target", "/")
		// A keep-alive connection made before the attack.
		keep := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
			DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
				return (&net.Dialer{}).DialContext(ctx, "unix", d.sock("http"))
			}}}
		if resp, err := keep.Get("http://localhost/healthz"); err != nil {
			t.Fatal(err)
		} else {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
		startAttack(t, "http-slow-body", d.sock("http"), n, "")
		startAttack(t, "http-idle", d.sock("http"), n, "")
		if !defended && !d.waitFDs(60) {
			t.Fatalf("control: the daemon never ran out of descriptors:\n%s", d.stderr)
		}
		count, timeout := sends, 10*time.Second
		if !defended {
			// Each failure costs the whole timeout: a few show the harm.
			count, timeout = 3, 2*time.Second
		}
		tl := sendAll(d, d.freshClient(timeout), s.id, count)
		// The connection made before the attack: at the fd limit the session directory
		// cannot be opened, which must not read as "no such session".
		resp, err := keep.Post("http://localhost/v1/sessions/"+s.id+"/messages", "application/json", strings.NewReader(`{"from":"k","text":"k"}`))
		if err == nil {
			var v map[string]any
			json.NewDecoder(resp.Body).Decode(&v)
			resp.Body.Close()
			if resp.StatusCode == 404 {
				t.Errorf("a send to a live session was answered 404 %v", v)
			}
			if !defended && resp.StatusCode != 503 {
				t.Errorf("control: at the fd limit a send got %d %v, want 503 service_unavailable", resp.StatusCode, v)
			}
			if !defended && v["error"] != "service_unavailable" {
				t.Errorf("control: error %v, want service_unavailable", v["error"])
			}
		} else if !defended {
			t.Errorf("control: the pre-attack connection failed: %v", err)
		}
		return tl, d
	}
	t.Run("defended", func(t *testing.T) {
		tl, d := run(t, true)
		t.Logf("well-behaved sends during the attack: %s", tl)
		if tl.failed != 0 {
			t.Errorf("well-behaved client: %s, want every send served", tl)
		}
		// The refusals are logged, rate-limited with a count of the others.
		lines := strings.Count(d.stderr.String(), `reason="too many requests in progress from one process"`)
		if lines == 0 || !strings.Contains(d.stderr.String(), "suppressed=") {
			t.Errorf("refusals not logged with a suppressed count (%d lines)", lines)
		}
		t.Logf("refusal log lines: %d", lines)
	})
	t.Run("control", func(t *testing.T) {
		tl, _ := run(t, false)
		t.Logf("well-behaved sends without the caps: %s", tl)
		if tl.failed == 0 {
			t.Errorf("control: %s; the attack did no harm, so the test proves nothing", tl)
		}
	})
}

// agentSend sends one attested frame from this process on a new agent.sock connection.
func agentSend(d *daemon, ref string, i int) (string, error) {
	c, err := net.Dial("unix", d.sock("agent"))
	if err != nil {
		return "", err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	fmt.Fprintf(c, `{"action":"send","ref":%q,"text":"a%d"}`+"\n", ref, i)
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return "", err
	}
	var v map[string]any
	json.Unmarshal([]byte(line), &v)
	if v["status"] != "ok" {
		return fmt.Sprint(v["error"]), nil
	}
	return "ok", nil
}

// selfSession makes this test process a Claude session in d's session dir, so that its
// agent.sock connections are attested.
func selfSession(t *testing.T, d *daemon, id string) {
	t.Helper()
	start, err := peercred.Proc{}.StartTime(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	dir := shortTemp(t)
	l, err := net.Listen("unix", filepath.Join(dir, "inbox.sock"))
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
			io.Copy(io.Discard, c)
			c.Close()
		}
	}()
	raw, _ := json.Marshal(map[string]any{"pid": os.Getpid(), "sessionId": id, "cwd": "/", "status": "idle", "kind": "interactive",
		"procStart": start, "messagingSocketPath": filepath.Join(dir, "inbox.sock"), "name": "tester"})
	if err := os.WriteFile(filepath.Join(d.sess, id+".json"), raw, 0o600); err != nil {
		t.Fatal(err)
	}
}

// TestAttackAgentBlankLineHolders: 40 connections sending a blank line every 100 ms. Counted
// before attestation and with blank lines resetting the idle timer, they once held every slot.
// Now an MCP-like client (an attested session) is served throughout: its connection evicts
// the oldest idle holder (blank lines do not make a holder younger). The control turns
// eviction off (--evict-idle=false) with the pending deadline long.
func TestAttackAgentBlankLineHolders(t *testing.T) {
	sends := 20
	if long() {
		sends = 200
	}
	run := func(t *testing.T, args ...string) tally {
		d := newDaemon(t, args...)
		target := startClaude(t, d.sess, "aaaaaaaa-0000-0000-0000-00000000b001", "target", "/")
		selfSession(t, d, "aaaaaaaa-0000-0000-0000-00000000b002")
		startAttack(t, "agent-blank", d.sock("agent"), 40, "")
		var tl tally
		for i := range sends {
			switch got, err := agentSend(d, target.id, i); {
			case err != nil:
				tl.fail("closed")
			case got == "ok":
				tl.served++
			default:
				tl.fail(got)
			}
			time.Sleep(20 * time.Millisecond)
		}
		return tl
	}
	t.Run("defended", func(t *testing.T) {
		tl := run(t)
		t.Logf("attested sends during the attack: %s", tl)
		if tl.failed != 0 {
			t.Errorf("attested client: %s, want every send served", tl)
		}
	})
	t.Run("control", func(t *testing.T) {
		tl := run(t, "--evict-idle=false", "--agent-pending-timeout", "1h")
		t.Logf("attested sends without eviction: %s", tl)
		if tl.failed == 0 {
			t.Errorf("control: %s; the attack did no harm", tl)
		}
	})
}

// registerSvc registers this process as svc:name, polls once and hangs up.
func registerSvc(d *daemon, name string) error {
	c, err := net.Dial("unix", d.sock("register"))
	if err != nil {
		return err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	r := bufio.NewReader(c)
	fmt.Fprintf(c, `{"harness":"svc","name":%q,"cwd":"/"}`+"\n", name)
	line, err := r.ReadString('\n')
	if err != nil {
		return err
	}
	if !strings.Contains(line, `"status":"ok"`) {
		return fmt.Errorf("register: %s", strings.TrimSpace(line))
	}
	fmt.Fprint(c, `{"action":"poll","waitSecs":0}`+"\n")
	if line, err = r.ReadString('\n'); err != nil || !strings.Contains(line, "timeout") {
		return fmt.Errorf("poll: %q %v", line, err)
	}
	return nil
}

// TestAttackRegisterUIDOnlyFlood: 70 processes each holding a uid-only registration with blank
// lines. They once took all 64 slots and a service could not re-register. Now they get at most
// --register-max-uid-only (16) of them and the service re-registers every time; the control
// lifts that share.
func TestAttackRegisterUIDOnlyFlood(t *testing.T) {
	self, err := filepath.EvalSymlinks(os.Args[0])
	if err != nil {
		t.Fatal(err)
	}
	tries := 10
	if long() {
		tries = 100
	}
	// held counts the attackers' live registrations.
	held := func(d *daemon) int {
		_, v := d.do("GET", "/v1/sessions", "")
		return strings.Count(fmt.Sprint(v), "holder-")
	}
	run := func(t *testing.T, args ...string) (tally, int) {
		d := newDaemon(t, append([]string{"--svc-exe", "worker=" + self}, args...)...)
		// 70 processes: one process holds one uid-only registration at most.
		startAttackEnv(t, "register-uid", d.sock("register"), 1, "", "PROCS=70")
		h := held(d)
		var tl tally
		for range tries {
			if err := registerSvc(d, "worker"); err != nil {
				tl.fail(err.Error())
			} else {
				tl.served++
			}
			time.Sleep(20 * time.Millisecond)
		}
		return tl, h
	}
	t.Run("defended", func(t *testing.T) {
		tl, h := run(t)
		t.Logf("attackers' registrations held: %d; service re-registrations during the attack: %s", h, tl)
		if h != 16 {
			t.Errorf("the attackers hold %d uid-only registrations, want the share, 16", h)
		}
		if tl.failed != 0 {
			t.Errorf("service: %s, want every registration served", tl)
		}
	})
	t.Run("control", func(t *testing.T) {
		tl, h := run(t, "--register-max-per-pid", "1000", "--register-max-uid-only", "1000", "--register-max-pending", "1000")
		t.Logf("attackers' registrations held: %d; service re-registrations without the share: %s", h, tl)
		if tl.failed == 0 {
			t.Errorf("control: %s; the attack did no harm", tl)
		}
	})
}

// TestPipelinedPollHangupFreesRegistration: a uid-only registration sends a poll and, in the
// same write, another frame, then hangs up. The daemon notices at once: the registration is
// gone from /v1/sessions well before the poll's 60 s. (The unit test in registersock carries
// the mutant: the old reader, which blocked handing over the pipelined frame, goes red.)
func TestPipelinedPollHangupFreesRegistration(t *testing.T) {
	d := newDaemon(t)
	c, err := net.Dial("unix", d.sock("register"))
	if err != nil {
		t.Fatal(err)
	}
	r := bufio.NewReader(c)
	fmt.Fprint(c, `{"harness":"pi","sessionName":"piped","cwd":"/"}`+"\n")
	if line, _ := r.ReadString('\n'); !strings.Contains(line, `"status":"ok"`) {
		t.Fatalf("register: %q", line)
	}
	fmt.Fprint(c, `{"action":"poll","waitSecs":60}`+"\n"+`{"action":"ack","messageId":"x"}`+"\n")
	listed := func() bool {
		_, v := d.do("GET", "/v1/sessions", "")
		return strings.Contains(fmt.Sprint(v), "piped")
	}
	if !listed() {
		t.Fatal("the registration is not listed")
	}
	c.Close()
	for i := 0; i < 1000 && listed(); i++ {
		time.Sleep(10 * time.Millisecond)
	}
	if listed() {
		t.Fatal("the registration outlived its connection")
	}
}

// TestAttackLongPollFlood: one process opens 200 reply long-polls. It gets at most its share
// of the waiter places (503 for the rest), so a long-poll of another process is still
// answered; the control lifts the per-process shares and the other process gets 503.
func TestAttackLongPollFlood(t *testing.T) {
	t.Parallel() // mostly waiting in long-polls
	polls := 3
	if long() {
		polls = 30
	}
	run := func(t *testing.T, args ...string) tally {
		d := newDaemon(t, args...)
		s := startClaude(t, d.sess, "aaaaaaaa-0000-0000-0000-00000000c001", "target", "/")
		status, v := d.do("POST", "/v1/sessions/"+s.id+"/messages", `{"from":"a","text":"q"}`)
		if status != 202 {
			t.Fatalf("send: %d %v", status, v)
		}
		id := field(v, "messageId").(string)
		startAttack(t, "longpoll", d.sock("http"), 200, id)
		var tl tally
		c := d.freshClient(10 * time.Second)
		for range polls {
			resp, err := c.Get("http://localhost/v1/messages/" + id + "/replies?wait=1")
			if err != nil {
				tl.fail("transport")
				continue
			}
			var v any
			json.NewDecoder(resp.Body).Decode(&v)
			resp.Body.Close()
			if resp.StatusCode == 200 {
				tl.served++
			} else {
				tl.fail(fmt.Sprint(resp.StatusCode, " ", field(v, "error")))
			}
		}
		return tl
	}
	t.Run("defended", func(t *testing.T) {
		tl := run(t)
		t.Logf("long-polls of another process during the flood: %s", tl)
		if tl.failed != 0 {
			t.Errorf("long-polls: %s, want every one answered", tl)
		}
	})
	t.Run("control", func(t *testing.T) {
		tl := run(t, "--http-max-per-pid", "1000", "--http-max-waiters-per-pid", "1000")
		t.Logf("long-polls of another process without the shares: %s", tl)
		if tl.failed == 0 {
			t.Errorf("control: %s; the flood did no harm", tl)
		}
	})
}

// sink is a service worker in this process: it registers svc:name, takes every message,
// records its text and acks it, reconnecting whenever the daemon goes away.
type sink struct {
	mu  sync.Mutex
	got map[string]int
	// okAcked are the ids whose ack was answered ok; one delivered again means an ack that
	// said ok was not stored (lies counts them).
	okAcked map[string]bool
	lies    int
	acks    atomic.Int64 // acks answered ok
	stop    chan struct{}
	done    sync.WaitGroup
}

func startSink(d *daemon, name string) *sink {
	s := &sink{got: map[string]int{}, okAcked: map[string]bool{}, stop: make(chan struct{})}
	s.done.Add(1)
	go func() {
		defer s.done.Done()
		for {
			select {
			case <-s.stop:
				return
			default:
			}
			s.session(d, name)
			time.Sleep(20 * time.Millisecond)
		}
	}()
	return s
}

func (s *sink) session(d *daemon, name string) {
	c, err := net.Dial("unix", d.sock("register"))
	if err != nil {
		return
	}
	defer c.Close()
	go func() {
		select {
		case <-s.stop:
		case <-time.After(time.Hour):
		}
		c.Close()
	}()
	r := bufio.NewReader(c)
	call := func(v any) map[string]any {
		raw, _ := json.Marshal(v)
		c.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := c.Write(append(raw, '\n')); err != nil {
			return nil
		}
		line, err := r.ReadString('\n')
		if err != nil {
			return nil
		}
		var out map[string]any
		json.Unmarshal([]byte(line), &out)
		return out
	}
	if got := call(map[string]any{"harness": "svc", "name": name, "cwd": "/"}); got == nil || got["status"] != "ok" {
		return
	}
	for {
		got := call(map[string]any{"action": "poll", "waitSecs": 1})
		if got == nil {
			return
		}
		if got["action"] != "deliver" {
			continue
		}
		text, _ := got["text"].(string)
		id, _ := got["messageId"].(string)
		s.mu.Lock()
		s.got[text]++
		if s.okAcked[id] {
			s.lies++
		}
		s.mu.Unlock()
		ack := call(map[string]any{"action": "ack", "messageId": id})
		if ack == nil {
			return
		}
		if ack["status"] == "ok" {
			s.acks.Add(1)
			s.mu.Lock()
			s.okAcked[id] = true
			s.mu.Unlock()
		}
	}
}

func (s *sink) close() { close(s.stop); s.done.Wait() }

// falseAcks is how many messages came again after an ack answered ok.
func (s *sink) falseAcks() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.lies
}

// received returns a copy of what the sink got.
func (s *sink) received() map[string]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[string]int, len(s.got))
	for k, v := range s.got {
		out[k] = v
	}
	return out
}

// sendAcked sends text to svc:name with an idempotency key until the daemon answers 202 (a
// kill -9 or a full queue in between is retried with the same key) or stop closes; it
// reports whether the send was acknowledged, and the non-retryable answers it saw.
func sendAcked(d *daemon, c *http.Client, name, text string, stop <-chan struct{}, seen func(int, string)) bool {
	body := fmt.Sprintf(`{"from":"load","text":%q,"idempotency_key":%q}`, text, text)
	for {
		select {
		case <-stop:
			return false
		default:
		}
		resp, err := c.Post("http://localhost/v1/sessions/svc:"+name+"/messages", "application/json", strings.NewReader(body))
		if err != nil {
			time.Sleep(10 * time.Millisecond)
			continue
		}
		var v map[string]any
		json.NewDecoder(resp.Body).Decode(&v)
		resp.Body.Close()
		if resp.StatusCode == 202 {
			return true
		}
		code, _ := v["error"].(string)
		seen(resp.StatusCode, code)
		time.Sleep(20 * time.Millisecond)
	}
}

// TestCrashLoopLosesNothing: 64 concurrent senders to a service queue while the daemon is
// killed with SIGKILL at least 20 times and restarted; a service drains the queue throughout.
// Every message answered 202 must arrive (lost = 0); redeliveries (a kill between deliver and
// ack) are counted and reported.
func TestCrashLoopLosesNothing(t *testing.T) {
	self, err := filepath.EvalSymlinks(os.Args[0])
	if err != nil {
		t.Fatal(err)
	}
	senders, perSender, kills := 64, 10, 20
	if long() {
		perSender, kills = 50, 100
	}
	// The 64 senders are goroutines of this one process: lift the per-process share.
	d := newDaemon(t, "--svc-exe", "sink="+self, "--http-max-per-pid", "256", "--http-max-conns", "512")
	sk := startSink(d, "sink")
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: senders,
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", d.sock("http"))
		}}}
	stop := make(chan struct{})
	var acked sync.Map
	var ackedN atomic.Int64
	var badMu sync.Mutex
	bad := map[string]int{}
	var wg sync.WaitGroup
	for g := range senders {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range perSender {
				text := fmt.Sprintf("g%d-m%d", g, i)
				if sendAcked(d, client, "sink", text, stop, func(status int, code string) {
					if status != 503 { // a full queue is the only expected refusal
						badMu.Lock()
						bad[fmt.Sprint(status, " ", code)]++
						badMu.Unlock()
					}
				}) {
					acked.Store(text, true)
					ackedN.Add(1)
				}
			}
		}()
	}
	for k := range kills {
		// Let some sends land, then kill mid-flight.
		for j := 0; j < 200 && ackedN.Load() < int64((k+1)*senders*perSender/(kills+1)); j++ {
			time.Sleep(5 * time.Millisecond)
		}
		d.cmd.Process.Signal(syscall.SIGKILL)
		d.cmd.Wait()
		d.start()
	}
	sendersDone := make(chan struct{})
	go func() { wg.Wait(); close(sendersDone) }()
	select {
	case <-sendersDone:
	case <-time.After(120 * time.Second):
		close(stop)
		wg.Wait()
		t.Errorf("senders did not finish")
	}
	// Drain: every acknowledged message must arrive (bounded wait).
	want := int(ackedN.Load())
	var got map[string]int
	for range 1000 {
		got = sk.received()
		missing := 0
		acked.Range(func(k, _ any) bool {
			if got[k.(string)] == 0 {
				missing++
			}
			return true
		})
		if missing == 0 {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	sk.close()
	lost, dups := 0, 0
	acked.Range(func(k, _ any) bool {
		if got[k.(string)] == 0 {
			lost++
		}
		return true
	})
	for _, n := range got {
		dups += n - 1
	}
	t.Logf("kill -9: %d, senders: %d, acknowledged (202): %d, received: %d distinct, lost: %d, redelivered: %d, after an ok ack: %d, other refusals: %v",
		kills, senders, want, len(got), lost, dups, sk.falseAcks(), bad)
	// An ack is answered before its delete is committed (it rides the next shared commit,
	// issue 11): a kill -9 in between loses the ack, and the message comes again. That is the
	// at-least-once contract; what must never happen is a loss (checked below).
	if n := sk.falseAcks(); n != 0 {
		t.Logf("%d messages came again after an ok ack that a kill -9 lost (at-least-once)", n)
	}
	if lost != 0 {
		t.Errorf("%d acknowledged messages lost", lost)
	}
	if want != senders*perSender {
		t.Errorf("acknowledged %d of %d", want, senders*perSender)
	}
	if len(bad) != 0 {
		t.Errorf("unexpected refusals: %v", bad)
	}
}

// TestDiskFull: the store on a 4 MiB tmpfs. Sends until the disk is full are answered 507
// insufficient_storage (not 500), nothing answered 202 is missing, every message drained, and
// once drained the daemon takes sends again without a restart. After a restart nothing acked
// comes back.
func TestDiskFull(t *testing.T) {
	ostest.RequireRoot(t)
	self, err := filepath.EvalSymlinks(os.Args[0])
	if err != nil {
		t.Fatal(err)
	}
	mnt := shortTemp(t)
	if err := unix.Mount("tmpfs", mnt, "tmpfs", 0, "size=4m,mode=0700"); err != nil {
		t.Fatalf("mount tmpfs: %v", err)
	}
	t.Cleanup(func() { unix.Unmount(mnt, unix.MNT_DETACH) })
	d := newDaemon(t, "--svc-exe", "sink="+self, "--db-path", filepath.Join(mnt, "xmsg.db"))
	big := strings.Repeat("x", 60000)
	statuses := map[string]int{}
	var acked []string
	full := false
	for i := 0; i < 400 && !full; i++ {
		text := fmt.Sprintf("%04d%s", i, big)
		status, v := d.do("POST", "/v1/sessions/svc:sink/messages", fmt.Sprintf(`{"from":"f","text":%q}`, text))
		statuses[fmt.Sprint(status, " ", field(v, "error"))]++
		switch status {
		case 202:
			acked = append(acked, text[:4])
		case 507:
			full = true
		case 503: // the queue's 100-message bound: drain and go on
			sk := startSink(d, "sink")
			for j := 0; j < 500 && len(sk.received()) < len(acked); j++ {
				time.Sleep(10 * time.Millisecond)
			}
			sk.close()
		default:
			t.Fatalf("send %d: %d %v", i, status, v)
		}
	}
	t.Logf("answers until full: %v", statuses)
	if !full {
		t.Fatalf("the disk never filled: %v", statuses)
	}
	// Drain everything: each 202 must be there.
	sk := startSink(d, "sink")
	for j := 0; j < 1000 && len(sk.received()) < len(acked); j++ {
		time.Sleep(10 * time.Millisecond)
	}
	sk.close()
	got := sk.received()
	lost := 0
	for _, a := range acked {
		found := false
		for k := range got {
			if strings.HasPrefix(k, a) {
				found = true
			}
		}
		if !found {
			lost++
		}
	}
	t.Logf("acknowledged %d, drained %d, lost %d, acks answered ok %d, delivered again after an ok ack %d", len(acked), len(got), lost, sk.acks.Load(), sk.falseAcks())
	if lost != 0 {
		t.Errorf("%d acknowledged messages lost on a full disk", lost)
	}
	// An ack is answered before its delete is committed (it rides the next shared commit,
	// issue 11): a kill -9 in between loses the ack, and the message comes again. That is the
	// at-least-once contract; what must never happen is a loss (checked below).
	if n := sk.falseAcks(); n != 0 {
		t.Logf("%d messages came again after an ok ack that a kill -9 lost (at-least-once)", n)
	}
	// Recovered without a restart: small sends are taken again.
	if status, v := d.do("POST", "/v1/sessions/svc:sink/messages", `{"from":"f","text":"after"}`); status != 202 {
		t.Errorf("after draining, a send got %d %v, want 202", status, v)
	}
	// Acks answered ok were stored: after a restart only "after" (never acked) is queued.
	d.stop()
	d.start()
	sk = startSink(d, "sink")
	for j := 0; j < 300 && len(sk.received()) == 0; j++ {
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(200 * time.Millisecond)
	sk.close()
	for k := range sk.received() {
		if k != "after" {
			t.Errorf("after a restart a message acked ok came again: %.8s", k)
		}
	}
}

// TestOwnSocketIsNoInbox: a session file whose messagingSocketPath is one of the daemon's own
// sockets (here agent.sock, which would read the line and answer it) is not "delivered".
// Mutant tried: deliverClaude without the ownSocket check: 202 delivered.
func TestOwnSocketIsNoInbox(t *testing.T) {
	d := newDaemon(t)
	start, err := peercred.Proc{}.StartTime(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	id := "aaaaaaaa-0000-0000-0000-00000000e001"
	raw, _ := json.Marshal(map[string]any{"pid": os.Getpid(), "sessionId": id, "cwd": "/", "status": "idle", "kind": "interactive",
		"procStart": start, "messagingSocketPath": d.sock("agent")})
	if err := os.WriteFile(filepath.Join(d.sess, id+".json"), raw, 0o600); err != nil {
		t.Fatal(err)
	}
	status, v := d.do("POST", "/v1/sessions/"+id+"/messages", `{"from":"a","text":"loop"}`)
	wantError(t, status, v, 502, "inbox_unavailable")
}

// TestHealthzUnreadableSessionDir: under Landlock, a session directory replaced after start
// exists but cannot be read; healthz must not call that ok. Mutant tried: healthz checking
// only that the directory exists: "ok".
func TestHealthzUnreadableSessionDir(t *testing.T) {
	ostest.Need(t, sandbox.Probe() >= 6, "Landlock ABI >= 6")
	d := newDaemon(t, "--require-landlock")
	if status, v := d.do("GET", "/healthz", ""); status != 200 || field(v, "sessions_dir") != "ok" {
		t.Fatalf("healthz before: %d %v", status, v)
	}
	// The only session directory, replaced: a new inode outside every Landlock rule.
	if err := os.Remove(d.sess); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(d.sess, 0o700); err != nil {
		t.Fatal(err)
	}
	if status, v := d.do("GET", "/healthz", ""); status != 200 || field(v, "sessions_dir") != "sessions_dir_unreadable" {
		t.Errorf("healthz with the directory denied: %d %v, want sessions_dir_unreadable", status, v)
	}
}

// TestMCPHelp: xmsg mcp --help prints its usage and exits 0.
func TestMCPHelp(t *testing.T) {
	out, err := xmsgCmd(nil, "mcp", "--help").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "usage: xmsg mcp") || !strings.Contains(string(out), "-agent-sock") {
		t.Errorf("xmsg mcp --help: %v\n%s", err, out)
	}
}

// TestAttackSilentHolders (issue 18): many processes of the uid, each holding one silent
// connection on each of http.sock, agent.sock and register.sock (36 in the short mode,
// against http.sock's pool lowered to 32; 300 in the long one, against the defaults). Per-pid
// caps cannot stop that: each process is under them. A full pool now evicts its oldest idle
// connection for a new one, so a client that speaks at once is served on every socket; the
// control turns eviction off (--evict-idle=false) and every socket refuses it.
func TestAttackSilentHolders(t *testing.T) {
	procs, sends, args := 36, 10, []string{"--http-max-conns", "32"}
	if long() {
		procs, sends, args = 300, 50, nil
	}
	// The silent connections' own deadlines are made long, so that only eviction frees a
	// place (the header deadline would free http.sock's every 5 s, agent.sock's pending one
	// every 10 s).
	args = append(args, "--http-header-timeout", "10m", "--agent-pending-timeout", "10m", "--register-first-frame-timeout", "10m")
	self, err := filepath.EvalSymlinks(os.Args[0])
	if err != nil {
		t.Fatal(err)
	}
	type result struct{ http, agent, register tally }
	run := func(t *testing.T, extra ...string) result {
		d := newDaemon(t, append(append([]string{"--svc-exe", "worker=" + self}, args...), extra...)...)
		target := startClaude(t, d.sess, "aaaaaaaa-0000-0000-0000-00000000d001", "target", "/")
		selfSession(t, d, "aaaaaaaa-0000-0000-0000-00000000d002")
		socks := d.sock("http") + "," + d.sock("agent") + "," + d.sock("register")
		startAttackEnv(t, "silent", socks, 1, "", "PROCS="+strconv.Itoa(procs))
		var r result
		r.http = sendAll(d, d.freshClient(10*time.Second), target.id, sends)
		for i := range sends {
			switch got, err := agentSend(d, target.id, i); {
			case err != nil:
				r.agent.fail("closed")
			case got == "ok":
				r.agent.served++
			default:
				r.agent.fail(got)
			}
		}
		for range sends {
			if err := registerSvc(d, "worker"); err != nil {
				r.register.fail(err.Error())
			} else {
				r.register.served++
			}
		}
		return r
	}
	t.Run("defended", func(t *testing.T) {
		r := run(t)
		t.Logf("%d processes, one silent connection each per socket: http.sock sends %s; agent.sock sends %s; register.sock registrations %s", procs, r.http, r.agent, r.register)
		for name, tl := range map[string]tally{"http": r.http, "agent": r.agent, "register": r.register} {
			if tl.failed != 0 {
				t.Errorf("%s.sock: %s, want every request served", name, tl)
			}
		}
	})
	t.Run("control", func(t *testing.T) {
		r := run(t, "--evict-idle=false")
		t.Logf("without eviction: http.sock sends %s; agent.sock sends %s; register.sock registrations %s", r.http, r.agent, r.register)
		for name, tl := range map[string]tally{"http": r.http, "agent": r.agent, "register": r.register} {
			if tl.failed == 0 {
				t.Errorf("control, %s.sock: %s; the attack did no harm", name, tl)
			}
		}
		// The refusals are answers naming the bound, not silent closes (on http.sock under the
		// long mode's 300 processes a few clients see their connection end before the answer).
		if r.http.codes["503 service_unavailable"] == 0 {
			t.Errorf("control, http.sock: failures %v, want 503 service_unavailable answers", r.http.codes)
		}
		if r.agent.codes["service_unavailable"] != r.agent.failed {
			t.Errorf("control, agent.sock: failures %v, want each a service_unavailable frame", r.agent.codes)
		}
	})
}

// tcpAddr is the address d's --listen listener was bound to (from its log line).
func tcpAddr(t *testing.T, d *daemon) string {
	t.Helper()
	m := regexp.MustCompile(`tcp listener without peer check.*addr=(\S+)`).FindStringSubmatch(d.stderr.String())
	if m == nil {
		t.Fatalf("no tcp listener logged:\n%s", d.stderr)
	}
	return m[1]
}

// TestAttackTCPOtherUID (issue 18): another uid holds idle keep-alives (40, or 300 with
// XMSG_LONG=1, against a pool of 64, or the default 256) and 32 reply long-polls on the
// --listen port. Every TCP peer once counted as "pid 0", so those took the owner's share: its
// requests failed, its long-poll got 503. Now each connection is its own holder: idle ones
// are evicted for a new connection, and the long-polls count per connection. The control
// turns eviction off.
func TestAttackTCPOtherUID(t *testing.T) {
	other := ostest.AddUser(t)
	_, bin := ostest.WorldExe(t, "attacker")
	// 32 long-polls are busy connections, which cannot be evicted: the pool must be larger.
	idle, args := 40, []string{"--http-max-conns", "64"}
	if long() {
		idle, args = 300, nil
	}
	args = append(args, "--listen", "127.0.0.1:0", "--http-header-timeout", "10m", "--http-idle-timeout", "10m")
	requests := 10
	run := func(t *testing.T, extra ...string) (reqs, polls tally) {
		d := newDaemon(t, append(args, extra...)...)
		addr := tcpAddr(t, d)
		s := startClaude(t, d.sess, "aaaaaaaa-0000-0000-0000-00000000e001", "target", "/")
		status, v := d.do("POST", "/v1/sessions/"+s.id+"/messages", `{"from":"a","text":"q"}`)
		if status != 202 {
			t.Fatalf("send: %d %v", status, v)
		}
		id := field(v, "messageId").(string)
		cred := &syscall.Credential{Uid: other.UID, Gid: other.GID}
		startAttackAs(t, bin, cred, "longpoll", "tcp:"+addr, 32, id)
		startAttackAs(t, bin, cred, "http-keepalive", "tcp:"+addr, idle, "")
		c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
		get := func(path string, tl *tally) {
			resp, err := c.Get("http://" + addr + path)
			if err != nil {
				tl.fail("transport")
				return
			}
			var v any
			json.NewDecoder(resp.Body).Decode(&v)
			resp.Body.Close()
			if resp.StatusCode == 200 {
				tl.served++
			} else {
				tl.fail(fmt.Sprint(resp.StatusCode, " ", field(v, "error")))
			}
		}
		for range requests {
			get("/healthz", &reqs)
		}
		for range 3 {
			get("/v1/messages/"+id+"/replies?wait=1", &polls)
		}
		return reqs, polls
	}
	t.Run("defended", func(t *testing.T) {
		reqs, polls := run(t)
		t.Logf("another uid holding %d idle keep-alives and 32 long-polls on --listen: the owner's requests %s, its long-polls %s", idle, reqs, polls)
		if reqs.failed != 0 || polls.failed != 0 {
			t.Errorf("owner: requests %s, long-polls %s; want every one served", reqs, polls)
		}
	})
	t.Run("control", func(t *testing.T) {
		reqs, polls := run(t, "--evict-idle=false")
		t.Logf("without eviction: the owner's requests %s, its long-polls %s", reqs, polls)
		if reqs.failed == 0 {
			t.Errorf("control: requests %s; the attack did no harm", reqs)
		}
	})
}

// TestAttackGhostWaiters (issue 18): 5 processes open 32 reply long-polls each (more than the
// whole waiter pool, even if one of them is late to start: each process holds at most its
// share of 32), each with a byte pipelined behind it, and exit. The hang-up watch
// once stopped at the pipelined byte, and the places stayed taken for the polls' 60 s. Now a
// poll right after the exit is served. The positive control is the flood itself: while the
// attackers live, a poll gets 503.
func TestAttackGhostWaiters(t *testing.T) {
	// The waiter pool is lowered below the attackers' 160, so that it is surely full.
	d := newDaemon(t, "--http-max-waiters", "100")
	s := startClaude(t, d.sess, "aaaaaaaa-0000-0000-0000-00000000f001", "target", "/")
	status, v := d.do("POST", "/v1/sessions/"+s.id+"/messages", `{"from":"a","text":"q"}`)
	if status != 202 {
		t.Fatalf("send: %d %v", status, v)
	}
	id := field(v, "messageId").(string)
	// The message id goes in $ID: attackProcs gives each child its index as $EXTRA.
	stop := startAttackEnv(t, "ghostpoll", d.sock("http"), 1, "", "PROCS=5", "CHILD_N=32", "ID="+id)
	c := d.freshClient(10 * time.Second)
	pollWait := func(wait int) (int, any) {
		resp, err := c.Get(fmt.Sprintf("http://localhost/v1/messages/%s/replies?wait=%d", id, wait))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var v any
		json.NewDecoder(resp.Body).Decode(&v)
		return resp.StatusCode, v
	}
	poll := func() (int, any) { return pollWait(1) }
	// Every waiter place taken: the attack is real. (Bounded by daemontest.Wait, not a few
	// tries: on a loaded machine the 128 polls take a while to reach the daemon.)
	daemontest.WaitFor(t, "160 long-polls to fill the waiter pool (the control)", func() bool {
		code, _ := pollWait(1)
		return code == 503
	})
	t0 := time.Now()
	stop()
	var code int
	var body any
	for range 50 {
		if code, body = poll(); code == 200 {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("160 long-polls with a pipelined byte, their processes gone: a poll served %v after the exit (was: 503 for 60 s)", time.Since(t0).Round(time.Millisecond))
	if code != 200 {
		t.Errorf("after the attackers exited: %d %v, want the poll served", code, body)
	}
}

// TestHTTPPoolOf64 (issue 18): one process with a pool of 64 keep-alive connections on
// http.sock, all in use at once, is served on every one (connections over 32 were once
// closed unread: resets). The control lowers the share of requests in progress to 32: the
// requests over it are answered 503, still not reset.
func TestHTTPPoolOf64(t *testing.T) {
	run := func(t *testing.T, args ...string) tally {
		d := newDaemon(t, args...)
		var mu sync.Mutex
		var tl tally
		var wg sync.WaitGroup
		start := make(chan struct{})
		for range 64 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				c, err := net.Dial("unix", d.sock("http"))
				if err != nil {
					mu.Lock()
					tl.fail("dial")
					mu.Unlock()
					return
				}
				defer c.Close()
				c.SetDeadline(time.Now().Add(20 * time.Second))
				// Each connection starts its request and holds it open until all 64 are in
				// one: 64 requests in progress at once.
				fmt.Fprint(c, "GET /v1/messages/nope/replies?wait=1 HTTP/1.1\r\n")
				<-start
				fmt.Fprint(c, "Host: localhost\r\n\r\n")
				resp, err := http.ReadResponse(bufio.NewReader(c), nil)
				mu.Lock()
				defer mu.Unlock()
				switch {
				case err != nil:
					tl.fail("reset: " + err.Error())
				case resp.StatusCode == 404:
					tl.served++
				default:
					tl.fail(fmt.Sprint(resp.StatusCode))
				}
			}()
		}
		time.Sleep(300 * time.Millisecond) // the 64 first lines are read
		close(start)
		wg.Wait()
		return tl
	}
	t.Run("defended", func(t *testing.T) {
		tl := run(t)
		t.Logf("one process, 64 requests in progress on 64 connections: %s", tl)
		if tl.failed != 0 {
			t.Errorf("pool of 64: %s, want every request served", tl)
		}
	})
	t.Run("control", func(t *testing.T) {
		tl := run(t, "--http-max-per-pid", "32")
		t.Logf("with --http-max-per-pid 32: %s", tl)
		if tl.failed == 0 {
			t.Errorf("control: %s; the lower share refused nothing", tl)
		}
		for code := range tl.codes {
			if code != "503" {
				t.Errorf("control: a failure %q, want only 503 answers", code)
			}
		}
	})
}
