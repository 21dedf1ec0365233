package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"path/filepath"
	"time"
)

// answer registers as svc name and answers count messages, whatever their origin: each is
// acked, then replied to with text over agent.sock. It is the far end of a federation test:
// the sender on another node reads the reply back through its own bus.
func answer(ctx context.Context, r *report, dir, name string, count int, text string) {
	reg, err := registerSvc(ctx, dir, name)
	if !r.check("register", err) {
		return
	}
	defer reg.Close()
	r.info("registered as svc:%s, answering %d message(s)", name, count)
	for n := 0; n < count; n++ {
		d, err := reg.pollAny(ctx)
		if !r.check(fmt.Sprintf("answer-poll:%d", n), err) {
			return
		}
		r.info("delivered %s from origin %s (text %q)", d.MessageID, d.Origin.Kind, d.Text)
		if !r.check("answer-ack:"+d.MessageID, reg.ack(ctx, d.MessageID)) {
			return
		}
		var replied struct {
			Status string `json:"status"`
			Error  string `json:"error"`
			Detail string `json:"detail"`
		}
		err = agentCall(ctx, dir, map[string]any{"action": "reply", "messageId": d.MessageID, "text": text}, &replied)
		if err == nil && replied.Status != "ok" {
			err = fmt.Errorf("got status %q error %q detail %q, want ok", replied.Status, replied.Error, replied.Detail)
		}
		if !r.check("answer-reply:"+d.MessageID, err) {
			return
		}
	}
}

// pollAny polls until a message is delivered.
func (g *registration) pollAny(ctx context.Context) (deliver, error) {
	for ctx.Err() == nil {
		var d deliver
		if err := g.call(map[string]any{"action": "poll", "waitSecs": 10}, &d); err != nil {
			return d, err
		}
		switch d.Action {
		case "timeout":
			continue
		case "deliver":
			return d, nil
		default:
			return d, fmt.Errorf("poll: got action %q status %q detail %q, want deliver", d.Action, d.Status, d.Detail)
		}
	}
	return deliver{}, fmt.Errorf("poll: %w", ctx.Err())
}

// listen accepts TCP connections on every address and closes each at once, until ctx ends,
// logging each one.
// It is the target that netcheck dials: a refused dial to a live listener can only be the
// unit's doing, not an absent server.
func listen(ctx context.Context, r *report, addrs []string) {
	var lns []net.Listener
	for _, a := range addrs {
		ln, err := net.Listen("tcp", a)
		if !r.check("listen:"+a, err) {
			for _, l := range lns {
				l.Close()
			}
			return
		}
		lns = append(lns, ln)
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				// One line per connection: a test can tell that a dial got through.
				r.info("accepted %s -> %s", c.RemoteAddr(), c.LocalAddr())
				c.Close()
			}
		}()
	}
	r.info("listening on %v until %s", addrs, deadlineOf(ctx))
	<-ctx.Done()
	for _, l := range lns {
		l.Close()
	}
}

func deadlineOf(ctx context.Context) string {
	if d, ok := ctx.Deadline(); ok {
		return d.UTC().Format(time.RFC3339)
	}
	return "cancelled"
}

// send posts one anonymous message to ref (a remote one, `svc:x@peer`, in the federation
// tests) on the bus in dir and expects HTTP status wantStatus; with wantError, also that
// error code. With wantReply it then long-polls the message's replies on the same bus until
// one with that text arrives: the reply crossed back.
func send(ctx context.Context, r *report, dir, ref, text string, wantStatus int, wantError, wantReply string) {
	if text == "" {
		text = "hello-" + nonce()
	}
	c := newHTTPClient(filepath.Join(dir, "http.sock"))
	payload, _ := json.Marshal(map[string]string{"from": "probe", "text": text})
	status, body, err := c.do(ctx, "POST", "/v1/sessions/"+ref+"/messages", payload)
	err = expectStatus(status, body, err, wantStatus)
	var ans struct {
		MessageID string `json:"messageId"`
		Outcome   string `json:"outcome"`
		Error     string `json:"error"`
		Detail    string `json:"detail"`
	}
	if err == nil {
		if jerr := json.Unmarshal(body, &ans); jerr != nil {
			err = fmt.Errorf("decode %q: %v", body, jerr)
		}
	}
	if err == nil && wantError != "" && ans.Error != wantError {
		err = fmt.Errorf("error code: got %q (detail %q), want %q", ans.Error, ans.Detail, wantError)
	}
	if !r.check(fmt.Sprintf("send:%s:%d", ref, wantStatus), err) {
		return
	}
	r.info("send %s: status %d messageId %q outcome %q error %q detail %q", ref, status, ans.MessageID, ans.Outcome, ans.Error, ans.Detail)
	if wantReply == "" {
		return
	}
	for ctx.Err() == nil {
		status, body, err := c.do(ctx, "GET", "/v1/messages/"+ans.MessageID+"/replies?wait=10", nil)
		if err := expectStatus(status, body, err, http.StatusOK); err != nil {
			r.fail("reply:"+ans.MessageID, "%v", err)
			return
		}
		var replies []struct {
			Text string `json:"text"`
		}
		if err := json.Unmarshal(body, &replies); err != nil {
			r.fail("reply:"+ans.MessageID, "decode %q: %v", body, err)
			return
		}
		for _, rep := range replies {
			if rep.Text == wantReply {
				r.pass("reply:" + ans.MessageID)
				return
			}
		}
	}
	r.fail("reply:"+ans.MessageID, "no reply %q before the deadline: %v", wantReply, ctx.Err())
}
