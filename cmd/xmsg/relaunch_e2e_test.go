package main

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/xmsg/xmsg/internal/daemontest"
	"github.com/xmsg/xmsg/internal/ostest"
	"github.com/xmsg/xmsg/internal/sandbox"
)

// goRunRole stands for `go run`: it starts the daemon (this binary as xmsg) as its child and
// waits for it; like the go command it catches SIGINT and SIGQUIT without passing them on,
// and dies of SIGTERM. Run through a link named "go", it is what the daemon sees as its parent.
const goRunRole = "gorun"

var relaunchRoles = ostest.Roles{
	goRunRole: func() int {
		signal.Notify(make(chan os.Signal, 1), os.Interrupt, syscall.SIGQUIT)
		cmd := ostest.Command("", "xmsg", os.Args[1:]...)
		cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
		if err := cmd.Run(); err != nil {
			var ee *exec.ExitError
			if errors.As(err, &ee) {
				return max(ee.ExitCode(), 1)
			}
			return 1
		}
		return 0
	},
}

// TestSessionDirAppears: Claude Code installed after the bus. The daemon starts with a session
// directory whose parent does not exist yet (so it cannot create it, and Landlock leaves it out);
// when the directory appears, the daemon starts again by itself with its sockets handed over,
// and a Claude session started there is served. Meanwhile no connection is refused (a client
// dials http.sock in a loop throughout), a long-poll that was waiting is answered, a message
// queued before is still there, the log and doctor say what happened, and a SIGTERM to the
// process the test started stops the new daemon (the old one waits in its place).
func TestSessionDirAppears(t *testing.T) {
	if sandbox.Probe() < 1 {
		t.Skip("Landlock is not available: a missing dir is no sandbox problem here")
	}
	base := shortTemp(t)
	claudeDir := filepath.Join(base, "later", ".claude", "sessions") // "later" exists, .claude not
	os.MkdirAll(filepath.Join(base, "later"), 0o700)
	d := newDaemon(t, "--sessions-dir", claudeDir)
	if !strings.Contains(d.stderr.String(), "session dir missing and not created") {
		t.Fatalf("want the missing-dir warning:\n%s", d.stderr)
	}
	// A pi session's queued message and a waiting long-poll, before the change.
	pi := daemontest.Start(t, "")
	pc := pi.Dial(d.sock("register"))
	if r := pi.Call(pc, map[string]any{"harness": "pi", "sessionName": "waiter"}); r["status"] != "ok" {
		t.Fatalf("pi register: %v", r)
	}
	status, v := d.do("POST", "/v1/sessions/waiter/messages", `{"from":"cli","text":"queued before"}`)
	if status != 202 {
		t.Fatalf("send to pi: %d %v", status, v)
	}
	before := field(v, "messageId").(string)
	pi.Send(pc, map[string]any{"action": "poll", "waitSecs": 0})
	if line, _ := pi.Recv(pc); daemontest.DeliveredID(t, line) != before {
		t.Fatalf("pi got %q", line)
	}
	pi.Send(pc, map[string]any{"action": "poll", "waitSecs": 60}) // waits across the change

	// A client dialing http.sock for the whole change: every dial must connect (the backlog
	// holds what arrives while no daemon accepts).
	var (
		mu      sync.Mutex
		dials   int
		refused []error
	)
	stopDial := make(chan struct{})
	dialDone := make(chan struct{})
	go func() {
		defer close(dialDone)
		for i := 0; i < 100000; i++ { // bounded; ends at stopDial well before
			select {
			case <-stopDial:
				return
			default:
			}
			c, err := net.Dial("unix", d.sock("http"))
			mu.Lock()
			dials++
			if err != nil {
				refused = append(refused, err)
			}
			mu.Unlock()
			if err == nil {
				c.Close()
			}
			time.Sleep(2 * time.Millisecond)
		}
	}()

	if err := os.MkdirAll(claudeDir, 0o700); err != nil {
		t.Fatal(err)
	}
	daemontest.WaitFor(t, "the new daemon to serve", func() bool {
		return strings.Contains(d.stderr.String(), "sockets handed over") && strings.Count(d.stderr.String(), "msg=serving") >= 2
	})
	// The waiting long-poll was answered when the old daemon stopped.
	if line, eof := pi.Recv(pc); line == "" && !eof {
		t.Fatalf("the waiting poll got nothing")
	}
	// A Claude session in the new directory is served.
	id := "aaaaaaaa-bbbb-4ccc-8ddd-eeeeeeeeeeee"
	cl := startClaude(t, claudeDir, id, "late", "/w")
	status, v = d.do("POST", "/v1/sessions/"+id+"/messages", `{"from":"cli","text":"hello late claude"}`)
	if status != 202 || field(v, "outcome") != "delivered" {
		t.Fatalf("send to the late Claude session: %d %v", status, v)
	}
	if got := cl.waitLines(t, 1); !strings.Contains(strings.Join(got, "\n"), "hello late claude") {
		t.Fatalf("claude inbox got %q", got)
	}
	// The message queued before the change is still known.
	if status, _ := d.do("GET", "/v1/messages/"+before, ""); status != 200 {
		t.Fatalf("GET the message from before: %d", status)
	}
	status, v = d.do("GET", "/v1/doctor", "")
	if status != 200 || !strings.Contains(fmt.Sprint(v), "relaunched: the session dir "+claudeDir) {
		t.Fatalf("doctor: %d %v", status, v)
	}
	close(stopDial)
	<-dialDone
	mu.Lock()
	t.Logf("%d dials across the relaunch, %d refused", dials, len(refused))
	for _, err := range refused {
		if errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ENOENT) {
			t.Errorf("a dial was refused during the relaunch: %v", err)
		}
	}
	mu.Unlock()

	// The process the test started is still the one a SIGTERM goes to; it stops the new daemon
	// and ends with its status.
	d.cmd.Process.Signal(syscall.SIGTERM)
	err := d.cmd.Wait()
	d.stopped = true
	if err != nil {
		t.Fatalf("exit after the relaunch: %v\n%s", err, d.stderr)
	}
	if n := strings.Count(d.stderr.String(), "msg=stopped"); n != 2 {
		t.Fatalf("want both daemons stopped cleanly, got %d stopped lines:\n%s", n, d.stderr)
	}
	if _, err := os.Stat(d.sock("http")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("http.sock after the stop: %v; want it removed by the daemon that owned it", err)
	}
}
