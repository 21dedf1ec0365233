package registersock_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/xmsg/xmsg/internal/bus"
	"github.com/xmsg/xmsg/internal/daemontest"
	"github.com/xmsg/xmsg/internal/envelope"
	"github.com/xmsg/xmsg/internal/ledger"
	"github.com/xmsg/xmsg/internal/registersock"
)

// readable is how many bytes c has to read: come in (SIOCINQ) or buffered by its reader.
func readable(t *testing.T, c *daemontest.Client) int {
	t.Helper()
	return sockQueue(t, c, unix.SIOCINQ) + c.R.Buffered()
}

// session registers a pi session named name on a fresh connection.
func session(t *testing.T, e *daemontest.Env, name string) (*daemontest.Client, string) {
	t.Helper()
	c := daemontest.Dial(t, e.RegPath)
	got := c.Call(map[string]any{"harness": "pi", "sessionName": name})
	id, _ := got["sessionId"].(string)
	if got["status"] != "ok" || id == "" {
		t.Fatal(got)
	}
	return c, id
}

// waitingSession registers a pi session on a fresh connection and leaves a 60-second poll
// waiting on it, read by the daemon.
func waitingSession(t *testing.T, e *daemontest.Env, name string) (*daemontest.Client, string) {
	t.Helper()
	c, id := session(t, e, name)
	c.Write([]byte(`{"action":"poll","waitSecs":60}` + "\n"))
	waiting(t, c)
	return c, id
}

// waiting returns once c's poll waits: a blank line sent after the poll was read is read only
// by the waiting poll's read (ReadAhead), which starts after the poll subscribed to its queue.
func waiting(t *testing.T, c *daemontest.Client) {
	t.Helper()
	daemontest.WaitFor(t, "the poll to be read", func() bool { return unread(t, c) == 0 })
	c.Write([]byte(" \n"))
	daemontest.WaitFor(t, "the poll to wait", func() bool { return unread(t, c) == 0 })
}

// TestWaitingPollAnsweredBySender: a message sent to a session whose poll waits is in that
// session's socket when the send returns: the goroutine that queued it wrote the deliver
// frame itself (handOver), no goroutine woken for it. The loop then takes up the next frame
// (the poll carrying the ack) as usual, and answers a second wait the same way. Mutant
// tried: the handover left out (the loop answering, woken): the frame is not there yet
// when the send returns (red).
func TestWaitingPollAnsweredBySender(t *testing.T) {
	e := newEnv(t, daemontest.Options{})
	c, id := waitingSession(t, e, "handed")
	for i, text := range []string{"first", "second"} {
		msg := anonSend(t, e, id, text)
		if n := readable(t, c); n == 0 {
			t.Fatalf("message %d: nothing in the session's socket when the send returned", i)
		}
		line, _ := c.Recv()
		var d map[string]any
		if err := json.Unmarshal([]byte(line), &d); err != nil || d["action"] != "deliver" || d["messageId"] != msg || d["text"] != text {
			t.Fatalf("message %d: got %q, want the deliver of %s", i, line, msg)
		}
		c.Write([]byte(`{"action":"poll","waitSecs":60,"ack":"` + msg + `"}` + "\n"))
		waiting(t, c)
		if !strings.Contains(e.Logs.String(), "request=ack message_id="+msg) {
			t.Fatalf("message %d: no audit line for the ack its poll carried", i)
		}
	}
	if n := readable(t, c); n != 0 {
		t.Fatalf("%d bytes answered to a poll with nothing queued", n)
	}
}

// TestHandoverSocketFull: a session that does not read its socket cannot hold up the sender:
// the handover writes what the socket takes, the send returns, and the loop writes the rest
// of the frame once the session reads, whole and in order. A deliver frame larger than the
// socket's buffer (a 64 KiB text of quotes, escaped twice over in text and envelope) makes
// the write partial. Mutant tried: the handover writing with Write's deadline instead: the
// send waits the write timeout out and the frame is cut (red).
func TestHandoverSocketFull(t *testing.T) {
	e := newEnv(t, daemontest.Options{})
	c, id := waitingSession(t, e, "full")
	text := strings.Repeat(`"`, 65536)
	msg := anonSend(t, e, id, text)
	if n := readable(t, c); n == 0 {
		t.Fatal("nothing in the session's socket when the send returned")
	}
	line, _ := c.Recv()
	var d map[string]any
	if err := json.Unmarshal([]byte(line), &d); err != nil || d["messageId"] != msg || d["text"] != text {
		t.Fatalf("the frame read once the session reads (%d bytes): %v, want the deliver of %s", len(line), err, msg)
	}
	c.Write([]byte(`{"action":"poll","waitSecs":0,"ack":"` + msg + `"}` + "\n"))
	if line, _ := c.Recv(); line != `{"action":"timeout"}` {
		t.Fatalf("after the ack: got %q, want timeout", line)
	}
}

// TestHandoverAfterIdle: a poll that waits longer than the write timeout since the
// connection's last answer is still answered by the handover: the write deadline that answer
// left has passed and must not refuse a write that never waits. Mutant tried: the deadline
// left as it was: the connection ends unanswered (red; the bench's consumers, idle between
// two of its paths, were all cut off so).
func TestHandoverAfterIdle(t *testing.T) {
	const wt = 50 * time.Millisecond
	e := newEnv(t, daemontest.Options{Register: registersock.Config{WriteTimeout: wt}})
	c, id := waitingSession(t, e, "idle")
	time.Sleep(4 * wt) // past the registration answer's write deadline
	msg := anonSend(t, e, id, "late")
	if line, eof := c.Recv(); eof || !strings.Contains(line, msg) {
		t.Fatalf("after an idle wait: got %q (eof %v), want the deliver of %s", line, eof, msg)
	}
}

// TestHandoverUnderConcurrentSenders: eight senders queue 400 messages for one session whose
// consumer acks each on its next waiting poll; every message arrives exactly once, and each
// poll gets exactly one answer (a poll answered twice, by a handover and by the loop, would
// show as an answer to a poll not yet sent: a message twice, or a timeout among them). Run
// under the race detector, it also holds the handover's hand-off of the connection to the
// loop free of races.
func TestHandoverUnderConcurrentSenders(t *testing.T) {
	const senders, each = 8, 50
	e := newEnv(t, daemontest.Options{})
	c, id := session(t, e, "busy")
	errs := make(chan error, senders)
	for s := range senders {
		go func() {
			for i := range each {
				text := fmt.Sprintf("s%d-%d", s, i)
				for {
					_, err := e.Bus.Send(context.Background(), bus.Send{To: envelope.ParseRef(id), Text: text, Bytes: len(text),
						FromName: "xmsg@testhost · tester", Principal: "http:tester"})
					if err == nil {
						break
					}
					if bus.AsError(err).Code != ledger.ServiceUnavailable { // a full queue: again
						errs <- err
						return
					}
					time.Sleep(time.Millisecond)
				}
			}
			errs <- nil
		}()
	}
	seen := map[string]bool{}
	ack := ""
	for len(seen) < senders*each {
		poll := map[string]any{"action": "poll", "waitSecs": 60}
		if ack != "" {
			poll["ack"] = ack
		}
		d := c.Call(poll)
		if d["action"] != "deliver" {
			t.Fatalf("after %d messages: got %v, want a deliver", len(seen), d)
		}
		text, _ := d["text"].(string)
		if seen[text] {
			t.Fatalf("%s delivered twice", text)
		}
		seen[text] = true
		ack, _ = d["messageId"].(string)
	}
	for range senders {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	c.Write([]byte(`{"action":"poll","waitSecs":0,"ack":"` + ack + `"}` + "\n"))
	if line, _ := c.Recv(); line != `{"action":"timeout"}` {
		t.Fatalf("after the last ack: got %q, want timeout", line)
	}
}

// TestPollFoundAndClaimed: a message queued between a wait's subscription and its poll is
// both found by the poll and claimed by its handover; the poll gets one answer, the
// handover's. Mutant tried: the loop answering what its poll found regardless (the message
// twice, red).
func TestPollFoundAndClaimed(t *testing.T) {
	e := newEnv(t, daemontest.Options{})
	c, id := session(t, e, "both")
	sent := make(chan bus.Delivery, 1)
	registersock.SetTestSubscribed(e.Register, func() {
		registersock.SetTestSubscribed(e.Register, nil)
		// On the loop's goroutine: the handover answers before the loop's poll runs.
		d, serr := e.Bus.Send(context.Background(), bus.Send{To: envelope.ParseRef(id), Text: "both", Bytes: 4,
			FromName: "xmsg@testhost · tester", Principal: "http:tester"})
		if serr != nil {
			d.MessageID = "send failed: " + serr.Error()
		}
		sent <- d
	})
	c.Write([]byte(`{"action":"poll","waitSecs":60}` + "\n"))
	line, _ := c.Recv()
	msg := (<-sent).MessageID
	if !strings.Contains(line, `"action":"deliver"`) || !strings.Contains(line, msg) {
		t.Fatalf("got %q, want the deliver of %s", line, msg)
	}
	c.Write([]byte(`{"action":"poll","waitSecs":0}` + "\n"))
	if line, _ := c.Recv(); !strings.Contains(line, msg) {
		t.Fatalf("the next poll (no ack): got %q, want %s again, answered once", line, msg)
	}
	c.Write([]byte(`{"action":"poll","waitSecs":0,"ack":"` + msg + `"}` + "\n"))
	if line, _ := c.Recv(); line != `{"action":"timeout"}` {
		t.Fatalf("after the ack: got %q, want timeout", line)
	}
}
