//go:build linux

package main

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/google/uuid"

	"github.com/xmsg/xmsg/internal/daemontest"
)

// TestClaudePeerStatus: a line written to a Claude inbox names the daemon's reply socket
// ("from") and the message id ("msg_id"), and the session's peer_message_status reports
// there set what GET /v1/messages/{id} says: written until a report comes, held, then the
// final status. Only the recipient session's own process is heard, and a settled message
// stays settled. The send's own answer keeps its shape (outcome delivered).
func TestClaudePeerStatus(t *testing.T) {
	d := newDaemon(t)
	id := uuid.NewString()
	s := startClaude(t, d.sess, id, "held", "/w")
	other := daemontest.Start(t, "") // a process of the same uid that is not the session

	send := func() (mid string, line map[string]any) {
		t.Helper()
		status, v := d.do("POST", "/v1/sessions/"+id+"/messages", `{"from":"x","text":"hello"}`)
		if status != 202 || field(v, "outcome") != "delivered" {
			t.Fatalf("send: %d %v, want 202 delivered", status, v)
		}
		mid = field(v, "messageId").(string)
		json.Unmarshal([]byte(s.Inbox.Next(t)), &line)
		return mid, line
	}
	state := func(mid string) (string, string) {
		t.Helper()
		_, v := d.do("GET", "/v1/messages/"+mid, "")
		o, _ := field(v, "outcome").(string)
		r, _ := field(v, "report").(string)
		return o, r
	}
	// report writes a status line from p to the reply socket and waits until the daemon has
	// handled it (it closes the connection after the one line).
	report := func(p *daemontest.Puppet, path, mid, status string) {
		t.Helper()
		c := p.Dial(path)
		p.Write(c, []byte(`{"type":"control","action":"peer_message_status","status":"`+status+`","reason":"r","from":"uds:/x/1.sock","orig_msg_id":"`+mid+`","msgV":1,"msg_id":"`+uuid.NewString()+"\"}\n"))
		for {
			if _, eof := p.Recv(c); eof {
				return
			}
		}
	}

	mid, line := send()
	from, _ := line["from"].(string)
	path := strings.TrimPrefix(from, "uds:")
	if !strings.HasPrefix(from, "uds:"+d.rt+"/cc-socks/786d7367") || line["msg_id"] != mid || line["msgV"] != 1.0 {
		t.Fatalf("inbox line %v: want from uds:%s/cc-socks/786d7367…, msg_id %s, msgV 1", line, d.rt, mid)
	}
	if o, r := state(mid); o != "delivered" || r != "written" {
		t.Fatalf("before any report: outcome %q report %q, want delivered, written", o, r)
	}
	report(s.Puppet, path, mid, "held")
	if o, r := state(mid); o != "held" || r != "held" {
		t.Fatalf("after held: outcome %q report %q", o, r)
	}
	report(other, path, mid, "denied") // not the recipient: ignored
	if o, _ := state(mid); o != "held" {
		t.Fatalf("a report from another process was heard: outcome %q", o)
	}
	report(s.Puppet, path, mid, "delivered")
	report(s.Puppet, path, mid, "denied") // settled already
	if o, r := state(mid); o != "delivered" || r != "delivered" {
		t.Fatalf("after delivered: outcome %q report %q", o, r)
	}

	mid2, _ := send()
	report(s.Puppet, path, mid2, "held")
	report(s.Puppet, path, mid2, "denied")
	if o, r := state(mid2); o != "denied" || r != "denied" {
		t.Fatalf("after denied: outcome %q report %q", o, r)
	}
	if strings.Contains(d.stderr.String(), "hello") {
		t.Fatal("a message body reached the log")
	}
}
