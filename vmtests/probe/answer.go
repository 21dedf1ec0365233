package main

import (
	"context"
	"fmt"
	"net"
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

// listen accepts TCP connections on every address and closes each at once, until ctx ends.
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
