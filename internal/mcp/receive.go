package mcp

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"strings"
	"time"

	"github.com/xmsg/xmsg/internal/jsonline"
)

// Bounds of one receive call: what a model's context takes in at once. The daemon caps a peek
// at the same count and 1 MiB; the bytes bound here keeps one result well inside maxResponse.
const (
	receiveMax   = 20
	receiveBytes = 256 << 10
	// ackTimeout bounds the acks sent after a receive result is written.
	ackTimeout = 10 * time.Second
)

// receive hands a Codex thread the oldest messages queued for it (agent.sock's peek frame,
// docs/protocol.md §2.8) and acknowledges them only once the result is written: a bridge
// killed before that loses nothing, the messages come again on the next receive. The thread is
// the one Codex names in params._meta, never anything in the arguments.
func (b *bridge) receive(ctx context.Context, meta map[string]json.RawMessage) toolResult {
	if meta == nil {
		return text("receive reads the queue of a Codex thread, and this call names none (no _meta from Codex): "+
			"other sessions receive their messages directly", true)
	}
	ans, err := b.agentFrames(ctx, []map[string]any{withMeta(map[string]any{"action": "peek", "max": receiveMax, "maxBytes": receiveBytes}, meta)})
	if err != nil {
		return text(err.Error(), true)
	}
	var peek struct {
		Messages []struct {
			MessageID string `json:"messageId"`
			Envelope  string `json:"envelope"`
		} `json:"messages"`
		Waiting int `json:"waiting"`
	}
	if err := json.Unmarshal(ans[0].raw, &peek); err != nil {
		return text("xmsg sent an unreadable answer", true)
	}
	if len(peek.Messages) == 0 {
		return text("No messages wait for this thread.", false)
	}
	var out strings.Builder
	ids := make([]string, 0, len(peek.Messages))
	for i, m := range peek.Messages {
		if i > 0 {
			out.WriteString("\n\n")
		}
		// The envelope starts with the fixed untrusted-peer-data preamble, outside the escaped
		// body; the id line is the bridge's own, so it stands before it, not inside it.
		fmt.Fprintf(&out, "message_id=%s\n%s", m.MessageID, m.Envelope)
		ids = append(ids, m.MessageID)
	}
	res := text(out.String(), false)
	if peek.Waiting > 0 {
		res.Content = append(res.Content, content{Type: "text", Text: waitingNotice(peek.Waiting)})
	}
	res.afterWrite = func(ctx context.Context) { b.ack(ctx, ids, meta) }
	return res
}

// ack acknowledges ids on one agent.sock connection. A failure only means the messages are
// delivered again (at-least-once), so it is logged, not reported to the model.
func (b *bridge) ack(ctx context.Context, ids []string, meta map[string]json.RawMessage) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), ackTimeout)
	defer cancel()
	frames := make([]map[string]any, 0, len(ids))
	for _, id := range ids {
		frames = append(frames, withMeta(map[string]any{"action": "ack", "messageId": id}, meta))
	}
	if _, err := b.agentFrames(ctx, frames); err != nil {
		b.cfg.Log.Warn("mcp: ack failed; the messages will be delivered again", "err", err, "count", len(ids))
	}
}

// waiting is how many messages wait for the thread that meta names (a peek of none).
func (b *bridge) waiting(ctx context.Context, meta map[string]json.RawMessage) (int, error) {
	ans, err := b.agentFrames(ctx, []map[string]any{withMeta(map[string]any{"action": "peek", "max": 0}, meta)})
	if err != nil {
		return 0, err
	}
	var peek struct{ Waiting int }
	if err := json.Unmarshal(ans[0].raw, &peek); err != nil {
		return 0, err
	}
	return peek.Waiting, nil
}

// waitingNotice is the one line a Codex thread's other tool results carry while mail waits.
func waitingNotice(n int) string {
	if n == 1 {
		return "[xmsg] 1 message waits for this thread: call the receive tool."
	}
	return fmt.Sprintf("[xmsg] %d messages wait for this thread: call the receive tool.", n)
}

type answer struct{ raw []byte }

// agentFrames sends frames on one agent.sock connection and returns their answers, in order;
// an error answer (status not ok) is an error naming its code and detail.
func (b *bridge) agentFrames(ctx context.Context, frames []map[string]any) ([]answer, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, "unix", b.cfg.AgentSock)
	if err != nil {
		b.cfg.Log.Debug("mcp: agent.sock dial failed", "err", err)
		return nil, errors.New("xmsg is not reachable: " + errText(err))
	}
	defer c.Close()
	if dl, ok := ctx.Deadline(); ok {
		c.SetDeadline(dl)
	}
	defer context.AfterFunc(ctx, func() { c.Close() })()
	r := bufio.NewReader(c)
	out := make([]answer, 0, len(frames))
	for _, f := range frames {
		line, err := jsonline.Encode(f)
		if err != nil {
			return nil, errors.New("xmsg request failed: " + err.Error())
		}
		if _, err := c.Write(line); err != nil {
			return nil, errors.New("xmsg request failed: " + errText(err))
		}
		resp, err := jsonline.ReadLine(r, maxResponse)
		if err != nil && len(resp) == 0 {
			return nil, errors.New("xmsg closed the connection without an answer")
		}
		ans, err := jsonline.Decode(resp)
		if err != nil {
			return nil, errors.New("xmsg sent an unreadable answer")
		}
		if status, _ := ans.String("status"); status != "ok" {
			code, _ := ans.String("error")
			detail, _ := ans.String("detail")
			return nil, fmt.Errorf("error %s: %s", code, detail)
		}
		out = append(out, answer{raw: resp})
	}
	return out, nil
}
