package agentsock

import (
	"time"

	"github.com/xmsg/xmsg/internal/answer"
	"github.com/xmsg/xmsg/internal/bus"
	"github.com/xmsg/xmsg/internal/harness"
	"github.com/xmsg/xmsg/internal/ledger"
)

// queue answers poll and ack for a Codex session: it has no register.sock connection, so its
// queue is read here, by the attested thread only. Other callers have their own channels.
func (s *Server) queue(caller bus.Caller, req request) []byte {
	// Only a leased session has no connection of its own to poll on (Codex).
	if !s.cfg.Bus.Harnesses().Is(caller.Harness, harness.Lease) {
		s.refuse(caller.Actor(), req.Action, ledger.BadRequest, "queue frames are for codex sessions")
		return errorLine(ledger.BadRequest, "unknown action: '"+req.Action+"'")
	}
	reg := &bus.Registration{Harness: caller.Harness, SessionID: caller.SessionID, Name: caller.Name}
	if req.Action == "peek" {
		return s.peek(reg, req)
	}
	if req.Action == "ack" {
		if err := s.cfg.Bus.Ack(s.ctx, reg, req.MessageID); err != nil {
			s.cfg.Log.Error("ack failed", "socket", "agent", "actor", caller.Actor(), "err", err)
		}
		return encode(map[string]string{"status": "ok"})
	}
	wait := 0.0
	if req.WaitSecs != nil {
		wait = min(max(*req.WaitSecs, 0), float64(bus.MaxWait/time.Second))
	}
	p, err := s.cfg.Bus.Poll(s.ctx, reg, time.Duration(wait*float64(time.Second)))
	if err != nil {
		return errorLine(ledger.Internal, "poll failed")
	}
	if p == nil {
		return encode(map[string]string{"action": "timeout"})
	}
	return encode(answer.DeliverOf(*p, false))
}

// Bounds of one peek (docs/protocol.md §4.1): what one MCP tool result can carry without
// crowding the model's context, well inside the bridge's 4 MiB answer line.
const (
	peekDefaultMax   = 20
	peekMaxMax       = 50
	peekDefaultBytes = 256 << 10
	peekMaxBytes     = 1 << 20
)

type peekResp struct {
	Status   string           `json:"status"`
	Messages []answer.Deliver `json:"messages"`
	Waiting  int              `json:"waiting"`
}

// peek answers a batch of the thread's oldest queued messages without taking them (each stays
// queued until its ack), and how many wait behind them; max 0 asks for the count alone. The
// MCP bridge's receive tool uses it, and acks once its result is written.
func (s *Server) peek(reg *bus.Registration, req request) []byte {
	limit, bytes := peekDefaultMax, peekDefaultBytes
	if req.Max != nil {
		limit = int(min(max(*req.Max, 0), peekMaxMax))
	}
	if req.MaxBytes != nil {
		bytes = int(min(max(*req.MaxBytes, 1), peekMaxBytes))
	}
	msgs, more, err := s.cfg.Bus.Peek(reg, limit, bytes)
	if err != nil {
		return errorLine(ledger.Internal, "peek failed")
	}
	resp := peekResp{Status: "ok", Messages: make([]answer.Deliver, 0, len(msgs)), Waiting: more}
	for _, m := range msgs {
		resp.Messages = append(resp.Messages, answer.DeliverOf(m, false))
	}
	return encode(resp)
}
