package registersock_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/xmsg/xmsg/internal/daemontest"
)

// batchIDs is the message ids of a batch frame, in order; it fails the test on any other
// answer.
func batchIDs(t *testing.T, d map[string]any) []string {
	t.Helper()
	msgs, ok := d["messages"].([]any)
	if d["action"] != "batch" || !ok {
		t.Fatalf("got %v, want a batch", d)
	}
	var ids []string
	for _, m := range msgs {
		mm, _ := m.(map[string]any)
		if mm["action"] != "deliver" || mm["text"] == nil || mm["origin"] == nil {
			t.Fatalf("a batch's message %v is not a service's deliver frame", mm)
		}
		id, _ := mm["messageId"].(string)
		ids = append(ids, id)
	}
	return ids
}

// TestPollBatch: a poll with max hands out up to max of the oldest messages in one batch
// frame, in queue order, and acks carried by the next poll delete them: what was not acked
// comes again (at-least-once), what was acked never does, also after a reconnect; each ack
// has its audit line; a plain poll is answered as before. Mutants tried: the batch answered
// as one deliver; the acks after the first ignored; a batch of max+1.
func TestPollBatch(t *testing.T) {
	e := newEnv(t, daemontest.Options{})
	bot, reg := e.Service("", "bot")
	var m []string
	for i := range 5 {
		m = append(m, anonSend(t, e, "svc:bot", fmt.Sprint("message ", i)))
	}
	if got := batchIDs(t, bot.Call(reg, map[string]any{"action": "poll", "waitSecs": 0, "max": 3})); !slices.Equal(got, m[:3]) {
		t.Fatalf("first batch: %v, want %v", got, m[:3])
	}
	// ack and acks together: each acts.
	if got := batchIDs(t, bot.Call(reg, map[string]any{"action": "poll", "waitSecs": 0, "max": 3, "ack": m[0], "acks": m[1:3]})); !slices.Equal(got, m[3:]) {
		t.Fatalf("batch after acking the first three: %v, want %v", got, m[3:])
	}
	// m[4] not acked: it comes again, alone.
	if got := batchIDs(t, bot.Call(reg, map[string]any{"action": "poll", "waitSecs": 0, "max": 3, "ack": m[3]})); !slices.Equal(got, m[4:]) {
		t.Fatalf("batch after acking all but the last: %v, want %v", got, m[4:])
	}
	for _, id := range m[:4] {
		daemontest.WaitFor(t, "the audit line of the ack of "+id, func() bool {
			return strings.Contains(e.Logs.String(), "request=ack message_id="+id)
		})
	}
	bot.Kill()
	bot2, reg2 := e.Service("", "bot")
	if d := bot2.Call(reg2, map[string]any{"action": "poll", "waitSecs": 0}); d["action"] != "deliver" || d["messageId"] != m[4] {
		t.Fatalf("plain poll after reconnect: got %v, want %s delivered as before", d, m[4])
	}
	if d := bot2.Call(reg2, map[string]any{"action": "poll", "waitSecs": 0, "max": 64, "acks": []string{m[4]}}); d["action"] != "timeout" {
		t.Fatalf("batch poll with nothing left: got %v, want timeout", d)
	}
}

// TestPollBatchWaits: a batch poll that waits is answered in a batch frame by the goroutine
// that queues the message (the handover), as the loop would answer it. Mutant tried: the
// handover answering with a deliver frame (red).
func TestPollBatchWaits(t *testing.T) {
	e := newEnv(t, daemontest.Options{})
	bot, reg := e.Service("", "bot")
	bot.Send(reg, map[string]any{"action": "poll", "waitSecs": 60, "max": 8})
	id := anonSend(t, e, "svc:bot", "while waiting")
	if got := batchIDs(t, bot.RecvJSON(reg)); !slices.Equal(got, []string{id}) {
		t.Fatalf("waiting batch poll: %v, want [%s]", got, id)
	}
}

// TestPollBatchBytes: a batch holds at most RegisterMaxBatchBytes of text, and its first
// message whatever its size.
func TestPollBatchBytes(t *testing.T) {
	e := newEnv(t, daemontest.Options{})
	bot, reg := e.Service("", "bot")
	big := strings.Repeat("x", 30<<10) // counted twice: the text, and the envelope that holds it
	var m []string
	for range 6 {
		m = append(m, anonSend(t, e, "svc:bot", big))
	}
	// Four such messages fit 256 KiB, five do not.
	if got := batchIDs(t, bot.Call(reg, map[string]any{"action": "poll", "waitSecs": 0, "max": 64})); !slices.Equal(got, m[:4]) {
		t.Fatalf("batch of large messages: %d of them, want 4", len(got))
	}
}

// TestPollBatchRefusals: acks of the wrong shape, too many, or on a frame other than a poll,
// and a max that is not a number, are bad_requests that act on nothing; the loop goes on.
func TestPollBatchRefusals(t *testing.T) {
	e := newEnv(t, daemontest.Options{})
	bot, reg, id := handedOne(t, e, "one")
	many := `"` + strings.Repeat(id+`","`, 64) + id + `"`
	for _, tc := range []struct{ frame, want string }{
		{`{"action":"poll","waitSecs":0,"acks":"` + id + `"}`, `{"status":"error","error":"bad_request","detail":"invalid json: field 'acks' must be an array of strings"}`},
		{`{"action":"poll","waitSecs":0,"acks":[5]}`, `{"status":"error","error":"bad_request","detail":"invalid json: field 'acks' must be an array of strings"}`},
		{`{"action":"poll","waitSecs":0,"acks":["` + id + `",""]}`, `{"status":"error","error":"bad_request","detail":"invalid json: field 'acks' must not hold an empty id"}`},
		{`{"action":"poll","waitSecs":0,"acks":[` + many + `]}`, `{"status":"error","error":"bad_request","detail":"invalid json: field 'acks' holds more than 64 ids"}`},
		{`{"action":"ack","messageId":"x","acks":["` + id + `"]}`, `{"status":"error","error":"bad_request","detail":"ack is only for poll"}`},
		{`{"action":"poll","waitSecs":0,"max":"3","acks":["` + id + `"]}`, `{"status":"error","error":"bad_request","detail":"invalid json: field 'max' must be a number"}`},
	} {
		bot.Write(reg, []byte(tc.frame+"\n"))
		if line, _ := bot.Recv(reg); line != tc.want {
			t.Fatalf("%s: got %q, want %q", tc.frame, line, tc.want)
		}
	}
	if d := bot.Call(reg, map[string]any{"action": "poll", "waitSecs": 0}); d["messageId"] != id {
		t.Fatalf("poll after the refusals: got %v, want %s still queued", d, id)
	}
}

// TestPollBatchAcksFromHeir: acks carried by a poll from the heir of a dead registration are
// refused before any acts, as an ack frame's is: the connection is closed, the message comes
// again to the next registration, no ack is audited. Mutant tried: acks left out of the check
// before the frame acts (red).
func TestPollBatchAcksFromHeir(t *testing.T) {
	e := newEnv(t, daemontest.Options{})
	bot, reg, id := handedOne(t, e, "secret")
	heir := bot.Handoff(reg)
	heir.Send(reg, map[string]any{"action": "poll", "waitSecs": 0, "max": 4, "acks": []string{id}})
	if line, eof := heir.Recv(reg); !eof {
		t.Fatalf("poll with acks by the heir of a dead registration: got %q, want closed", line)
	}
	bot2, reg2 := e.Service("", "bot")
	if d := bot2.Call(reg2, map[string]any{"action": "poll", "waitSecs": 0}); d["messageId"] != id {
		t.Fatalf("next registration's poll: got %v, want %s (the heir's acks must not act)", d, id)
	}
	if strings.Contains(e.Logs.String(), "request=ack message_id="+id) {
		t.Fatalf("the heir's ack was audited")
	}
}

// TestPollBatchAcksNotStored: a poll whose acks cannot be stored is answered with the error,
// and nothing is polled.
func TestPollBatchAcksNotStored(t *testing.T) {
	e := newEnv(t, daemontest.Options{})
	bot, reg, id := handedOne(t, e, "one")
	anonSend(t, e, "svc:bot", "two")
	e.Store.Close()
	if got := bot.Call(reg, map[string]any{"action": "poll", "waitSecs": 0, "max": 4, "acks": []string{id}}); got["status"] != "error" || got["action"] != nil {
		t.Fatalf("poll with acks and the store gone: got %v, want the ack's error and no poll", got)
	}
}
