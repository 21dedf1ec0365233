package registersock_test

import (
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/xmsg/xmsg/internal/daemontest"
)

// unread is how many of the bytes c wrote its peer has not read yet (SIOCOUTQ).
func unread(t *testing.T, c *daemontest.Client) int { return sockQueue(t, c, unix.SIOCOUTQ) }

// sockQueue is one of c's socket queues in bytes: SIOCOUTQ (written, not read by the peer) or
// SIOCINQ (come in, not read here).
func sockQueue(t *testing.T, c *daemontest.Client, req uint) int {
	t.Helper()
	rc, err := c.C.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	n := -1
	rc.Control(func(fd uintptr) { n, err = unix.IoctlGetInt(int(fd), req) })
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestFramesAheadOfAWaitingPoll: what a client sends while its poll waits (a whole frame, and
// half of the next) is read by the waiting poll's read (lineserver.Reader.ReadAhead: nothing
// else reads while a poll waits) and answered in order after the poll, the half frame once it
// is completed: the read ahead loses no byte and answers nothing early.
func TestFramesAheadOfAWaitingPoll(t *testing.T) {
	e := newEnv(t, daemontest.Options{})
	c := daemontest.Dial(t, e.RegPath)
	got := c.Call(map[string]any{"harness": "pi", "sessionName": "ahead"})
	id, _ := got["sessionId"].(string)
	if got["status"] != "ok" || id == "" {
		t.Fatal(got)
	}
	c.Write([]byte(`{"action":"poll","waitSecs":60}` + "\n"))
	daemontest.WaitFor(t, "the poll to be read", func() bool { return unread(t, c) == 0 })
	c.Write([]byte(`{"action":"ack","messageId":"none"}` + "\n" + `{"action":"poll",`))
	daemontest.WaitFor(t, "the waiting poll to read what was sent ahead", func() bool { return unread(t, c) == 0 })
	msg := anonSend(t, e, id, "hello")
	if line, _ := c.Recv(); !strings.Contains(line, `"action":"deliver"`) || !strings.Contains(line, msg) {
		t.Fatalf("the waiting poll: got %q, want the deliver of %s", line, msg)
	}
	if line, _ := c.Recv(); line != `{"status":"ok"}` {
		t.Fatalf("the ack sent ahead: got %q, want ok", line)
	}
	c.Write([]byte(`"waitSecs":0}` + "\n"))
	if line, _ := c.Recv(); !strings.Contains(line, msg) {
		t.Fatalf("the poll completed after the wait: got %q, want %s again (not acked)", line, msg)
	}
}

// TestBlankLinesAheadOfAWaitingPoll: blank lines sent while a poll waits are bytes, not frames:
// forty of them do not cut the client off as forty frames would (TestTooManyPipelinedFrames).
func TestBlankLinesAheadOfAWaitingPoll(t *testing.T) {
	e := newEnv(t, daemontest.Options{})
	c := daemontest.Dial(t, e.RegPath)
	got := c.Call(map[string]any{"harness": "pi", "sessionName": "blank"})
	id, _ := got["sessionId"].(string)
	if got["status"] != "ok" || id == "" {
		t.Fatal(got)
	}
	c.Write([]byte(`{"action":"poll","waitSecs":60}` + "\n"))
	daemontest.WaitFor(t, "the poll to be read", func() bool { return unread(t, c) == 0 })
	c.Write([]byte(strings.Repeat(" \t\r\n", 40)))
	daemontest.WaitFor(t, "the waiting poll to read the blank lines", func() bool { return unread(t, c) == 0 })
	msg := anonSend(t, e, id, "hello")
	if line, _ := c.Recv(); !strings.Contains(line, msg) {
		t.Fatalf("the waiting poll: got %q, want the deliver of %s", line, msg)
	}
}
