package bus

import (
	"context"
	"errors"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/google/uuid"

	"github.com/xmsg/xmsg/internal/envelope"
	"github.com/xmsg/xmsg/internal/harness"
	"github.com/xmsg/xmsg/internal/ledger"
	"github.com/xmsg/xmsg/internal/store"
)

// ReplyResult is the answer to an accepted reply (docs/protocol.md §4.1 `reply`).
type ReplyResult struct {
	MessageID        string  `json:"messageId"` // the ORIGINAL message
	Seq              uint64  `json:"seq"`
	SessionRef       string  `json:"sessionRef"`
	ReplierSessionID string  `json:"replierSessionId"`
	CreatedAt        int64   `json:"createdAt"`
	Text             string  `json:"text"`
	PushOutcome      *string `json:"pushOutcome"`
	PushedMessageID  *string `json:"pushedMessageId"`
}

// Result is what the reply's event says of it: the reply to inReplyTo, and its push.
func (r ReplyResult) Result(inReplyTo string) ledger.Result {
	res := ledger.Result{InReplyTo: inReplyTo, ReplySeq: r.Seq, Bytes: len(r.Text), Text: r.Text}
	if r.PushOutcome != nil {
		res.Outcome = parseOutcome(*r.PushOutcome)
	}
	if r.PushedMessageID != nil {
		res.MessageID = *r.PushedMessageID
	}
	return res
}

// ReplyView is a Reply object of docs/protocol.md §3.7.
type ReplyView struct {
	Seq              uint64  `json:"seq"`
	MessageID        string  `json:"messageId"`
	CreatedAt        int64   `json:"createdAt"`
	ReplierSessionID string  `json:"replierSessionId"`
	Text             string  `json:"text"`
	PushOutcome      *string `json:"pushOutcome"`
	PushedMessageID  *string `json:"pushedMessageId"`
}

// qualified names a session as <harness>:<id>, once: ids that already carry their harness
// ("svc:bot", "pi:<uuid>") are not prefixed again.
func qualified(harness, id string) string {
	if strings.HasPrefix(id, harness+":") {
		return id
	}
	return harness + ":" + id
}

func strOrNil(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

func replyView(r store.Reply) ReplyView {
	return ReplyView{Seq: r.Seq, MessageID: r.MessageID, CreatedAt: r.CreatedAt, ReplierSessionID: r.ReplierSessionID,
		Text: r.Text, PushOutcome: strOrNil(r.PushOutcome), PushedMessageID: strOrNil(r.PushedMessageID)}
}

// Reply records caller's reply to messageID and pushes it to the original sender when the
// message has a return address and asked for pushes. Only the recipient may reply. The audit
// line is the transport's (Audit).
func (b *Bus) Reply(ctx context.Context, caller Caller, messageID, text string) (res ReplyResult, err error) {
	if messageID == "" || text == "" {
		return res, badRequest("messageId and text are required")
	}
	if len(text) > b.cfg.MaxBody {
		return res, errorf(ledger.BodyTooLarge, "text %d exceeds limit %d", len(text), b.cfg.MaxBody)
	}
	msg, found, err := b.message(messageID)
	if err != nil {
		return res, err
	}
	if !found {
		return res, messageNotFound(messageID)
	}
	if caller.Harness != msg.RecipientHarness || caller.SessionID != msg.SessionID {
		return res, errorf(ledger.NotRecipient, "caller session '%s' is not recipient of message '%s' (expected '%s')",
			qualified(caller.Harness, caller.SessionID), messageID, qualified(msg.RecipientHarness, msg.SessionID))
	}
	now := b.nowUnix()
	reply := store.Reply{MessageID: messageID, CreatedAt: now, ReplierSessionID: caller.SessionID, Text: text}
	var plan pushPlan
	if msg.ReturnHarness != "" && msg.ReturnSessionID != "" {
		switch {
		case !msg.PushReplies:
			plan.outcome = ledger.PushDisabled
		case msg.ReturnHost != "" && msg.ReturnHost != b.cfg.Host:
			plan = b.pushRemote(ctx, caller, msg, text, now)
		default:
			id, err := uuid.NewV7()
			if err != nil {
				plan.outcome = ledger.PushFailed
				break
			}
			badge := envelope.AttestedBadge(b.cfg.Host, caller.Harness, caller.Name)
			body := envelope.ReplyBody(msg.ID, id.String(), text)
			plan = b.push(caller, "", msg, id.String(), badge, body, body, text, now)
		}
	}
	reply, err = b.commitReply(reply, plan)
	if err != nil {
		return ReplyResult{}, err
	}
	return ReplyResult{MessageID: messageID, Seq: reply.Seq, SessionRef: caller.SessionID, ReplierSessionID: caller.SessionID,
		CreatedAt: now, Text: text, PushOutcome: strOrNil(reply.PushOutcome), PushedMessageID: strOrNil(reply.PushedMessageID)}, nil
}

// pushPlan is how a reply reaches the original sender. What it stores (the pushed message,
// an outbound row, a queue entry) commits with the reply; deliver, if set, runs after that
// commit and returns the final outcome.
type pushPlan struct {
	outcome ledger.Outcome
	msg     *store.Message  // the pushed message, so its recipient can reply to it
	out     *store.Outbound // a push to a peer: only that peer may reply to the pushed message
	pending *store.Pending
	deliver func() ledger.Outcome
}

// commitReply stores reply with plan's records, runs plan's delivery, records a failed
// delivery, and wakes long-pollers.
func (b *Bus) commitReply(reply store.Reply, plan pushPlan) (store.Reply, error) {
	reply.PushOutcome = plan.outcome.String()
	var slot *queueSlot
	if plan.pending != nil {
		// The queue bound is checked before the commit (see queueState); a full queue fails
		// only the push, the reply is kept.
		var err error
		if slot, err = b.reserve(plan.pending.SessionID); err != nil {
			if !errors.Is(err, store.ErrQueueFull) {
				return store.Reply{}, err
			}
			plan.pending, plan.msg, plan.out, plan.deliver, reply.PushOutcome = nil, nil, nil, nil, ledger.PushFailed.String()
		}
	}
	err := b.cfg.Store.Update(func(tx *store.Tx) error {
		r := reply
		if plan.pending != nil {
			switch err := slot.enqueue(tx, *plan.pending); {
			case errors.Is(err, store.ErrQueueFull):
				// The reply itself is kept; only the push failed.
				r.PushOutcome = ledger.PushFailed.String()
			case err != nil:
				return err
			}
		}
		if r.PushOutcome == ledger.Pushed.String() && plan.msg != nil {
			r.PushedMessageID = plan.msg.ID
			if err := tx.PutMessage(*plan.msg); err != nil {
				return err
			}
			if plan.out != nil {
				if err := tx.PutOutbound(*plan.out); err != nil {
					return err
				}
			}
		}
		seq, err := tx.AddReply(r)
		r.Seq = seq
		reply = r
		return err
	})
	if err == nil && reply.PushOutcome == ledger.Pushed.String() {
		slot.committed()
	}
	slot.release() // the place, unless the write was committed
	if err != nil {
		return store.Reply{}, err
	}
	if plan.deliver != nil && reply.PushOutcome == ledger.Pushed.String() {
		if outcome := plan.deliver(); outcome != ledger.Pushed {
			// The push did not arrive: record that, and drop the pushed message's rows.
			pushedID := reply.PushedMessageID
			reply.PushOutcome, reply.PushedMessageID = outcome.String(), ""
			err := b.cfg.Store.Update(func(tx *store.Tx) error {
				if err := tx.DeleteMessage(pushedID); err != nil {
					return err
				}
				if err := tx.DeleteOutbound(pushedID); err != nil {
					return err
				}
				return tx.PutReply(reply)
			})
			if err != nil {
				b.cfg.Log.Error("recording failed push", "message_id", reply.MessageID, "err", err)
			}
		}
	}
	b.replies.Fire(reply.MessageID)
	if plan.pending != nil && reply.PushOutcome == ledger.Pushed.String() {
		b.queues.Fire(plan.pending.SessionID)
	}
	return reply, nil
}

// push delivers a reply to the local original sender of msg. Claude inboxes are written after
// the commit (deliver); queued harnesses get a pending entry committed with the reply.
// replierHost is "" for a local replier, else the peer the reply came from (the pushed
// message then carries it as its return host, so a reply to the reply goes back there).
func (b *Bus) push(replier Caller, replierHost string, msg store.Message, newID, badge, claudeBody, plainBody, text string, now int64) pushPlan {
	pushed := &store.Message{ID: newID, CreatedAt: now, SessionID: msg.ReturnSessionID, FromName: badge, Bytes: len(text),
		Outcome: ledger.Delivered.String(), RecipientHarness: msg.ReturnHarness, ReturnHarness: replier.Harness,
		ReturnSessionID: replier.SessionID, ReturnHost: replierHost, PushReplies: true, ThreadID: msg.ThreadID}
	h := b.h.Lookup(msg.ReturnHarness)
	if h == nil {
		return pushPlan{outcome: ledger.SenderGone} // a harness this bus does not route to
	}
	switch {
	case h.Delivery() == harness.Inbox:
		target, ok := b.cfg.Claude.ByID(msg.ReturnSessionID)
		if !ok {
			return pushPlan{outcome: ledger.SenderGone}
		}
		line, err := envelope.ClaudeLine(badge, claudeBody)
		if err != nil {
			return pushPlan{outcome: ledger.PushFailed}
		}
		// Delivered only after the reply and the pushed message are committed (the caller
		// runs deliver), so the sender can reply to the push the instant it arrives.
		return pushPlan{outcome: ledger.Pushed, msg: pushed, deliver: func() ledger.Outcome {
			if err := b.deliverClaude(target.MessagingSocketPath, line); err != nil {
				if errors.Is(err, syscall.ENOENT) || errors.Is(err, syscall.ECONNREFUSED) {
					return ledger.SenderGone
				}
				return ledger.PushFailed
			}
			return ledger.Pushed
		}}
	case h.Delivery() == harness.Agentapi:
		outcome, pending, deliver := b.pushAgy(msg.ReturnSessionID, pushed, badge, claudeBody, now, text)
		if outcome != ledger.Pushed {
			return pushPlan{outcome: outcome}
		}
		return pushPlan{outcome: outcome, msg: pushed, pending: pending, deliver: deliver}
	case h.Admission() == harness.Exe:
		// A service's queue is durable and its id stable: queue even while it reconnects.
	default:
		if _, alive := b.liveProcessSession(msg.ReturnSessionID, msg.ReturnHarness); !b.registered(msg.ReturnSessionID) && !alive {
			return pushPlan{outcome: ledger.SenderGone}
		}
	}
	pending := &store.Pending{ID: newID, SessionID: msg.ReturnSessionID, CreatedAt: now, FromName: badge, Bytes: len(text), Text: text,
		Envelope: h.Envelope(badge, claudeBody, plainBody)}
	if h.Origin() {
		if replierHost != "" {
			pending.Origin = FedOrigin(replierHost, replier.Harness+":"+replier.Name)
		} else {
			pending.Origin = fmtOrigin("local", &replier)
		}
	}
	return pushPlan{outcome: ledger.Pushed, msg: pushed, pending: pending}
}

func (b *Bus) registered(sessionID string) bool {
	for _, r := range b.liveRegistrations() {
		if r.SessionID == sessionID {
			return true
		}
	}
	return false
}

func (b *Bus) message(id string) (store.Message, bool, error) {
	b.awaitRecord(id)
	var m store.Message
	var found bool
	err := b.cfg.Store.View(func(tx *store.Tx) (err error) {
		m, found, err = tx.Message(id)
		return err
	})
	return m, found && !b.expired(m.CreatedAt), err
}

// expired reports whether a row created at createdAt (unix seconds) is past --reply-ttl.
// Reads ignore such rows (docs/protocol.md §5.6): the purge runs on a timer, and until it has
// run an expired message, reply or queue entry must look exactly as if it had.
func (b *Bus) expired(createdAt int64) bool {
	return b.cfg.ReplyTTL > 0 && createdAt < b.nowUnix()-int64(b.cfg.ReplyTTL/time.Second)
}

// fresh drops expired replies.
func (b *Bus) fresh(rs []store.Reply) []store.Reply {
	out := rs[:0]
	for _, r := range rs {
		if !b.expired(r.CreatedAt) {
			out = append(out, r)
		}
	}
	return out
}

// MessageView is the answer of GET /v1/messages/{id}.
type MessageView struct {
	ID               string  `json:"id"`
	CreatedAt        int64   `json:"createdAt"`
	SessionID        string  `json:"sessionId"`
	FromName         string  `json:"fromName"`
	Bytes            int     `json:"bytes"`
	Outcome          string  `json:"outcome"`
	RecipientHarness string  `json:"recipientHarness"`
	ReturnHarness    *string `json:"returnHarness"`
	ReturnSessionID  *string `json:"returnSessionId"`
	PushReplies      bool    `json:"pushReplies"`
	ThreadID         string  `json:"threadId"`
	// Report is what a Claude Code recipient said of the message (its peer status), or
	// "written": its line reached the session's inbox and nothing more is known.
	Report  string      `json:"report,omitempty"`
	Replies []ReplyView `json:"replies"`
}

// messageNotFound names the message that was not found, once (the original reused the session
// helper: "no live session matches 'message '<id>”", docs/protocol.md §1).
func messageNotFound(id string) *Error { return errorf(ledger.NotFound, "no message '%s'", id) }

// Message returns a stored message with its replies.
func (b *Bus) Message(id string) (MessageView, error) {
	b.awaitRecord(id)
	var m store.Message
	var found bool
	var replies []store.Reply
	err := b.cfg.Store.View(func(tx *store.Tx) (err error) {
		if m, found, err = tx.Message(id); err != nil || !found {
			return err
		}
		replies, err = tx.Replies(id, 0)
		return err
	})
	if err != nil {
		return MessageView{}, err
	}
	found = found && !b.expired(m.CreatedAt)
	replies = b.fresh(replies)
	if !found {
		return MessageView{}, messageNotFound(id)
	}
	if m.Outcome == ledger.Queued.String() && b.taken(m) {
		m.Outcome = ledger.Delivered.String()
	}
	v := MessageView{ID: m.ID, CreatedAt: m.CreatedAt, SessionID: m.SessionID, FromName: m.FromName, Bytes: m.Bytes, Outcome: m.Outcome,
		RecipientHarness: m.RecipientHarness, ReturnHarness: strOrNil(m.ReturnHarness), ReturnSessionID: strOrNil(m.ReturnSessionID),
		PushReplies: m.PushReplies, ThreadID: m.ThreadID, Report: m.Report, Replies: []ReplyView{}}
	for _, r := range replies {
		v.Replies = append(v.Replies, replyView(r))
	}
	return v, nil
}

// taken reports whether m, recorded queued for a recipient that was not connected, has left
// its queue since: the recipient took it and acknowledged it. Asked on a read, so that the
// hand-out and the ack, the queue's hot path, write nothing more for it.
func (b *Bus) taken(m store.Message) bool {
	if h := b.h.Lookup(m.RecipientHarness); h == nil || h.Delivery() != harness.Queue {
		return false // queued elsewhere (agy's conversation queue, a leaf's mailbox): marked when done
	}
	q := &b.q
	q.mu.Lock()
	defer q.mu.Unlock()
	sq, err := b.load(m.SessionID)
	if err != nil {
		return false
	}
	return !slices.ContainsFunc(sq.rows, func(r queueRow) bool { return r.id == m.ID })
}

// MaxWait caps a long-poll.
const MaxWait = 60 * time.Second

// Replies returns replies to id with seq > after; when there are none and wait > 0 it waits
// (at most MaxWait) for one. At most MaxWaiters callers wait at once; the next gets 503.
func (b *Bus) Replies(ctx context.Context, id string, after uint64, wait time.Duration) ([]ReplyView, error) {
	if wait > MaxWait {
		wait = MaxWait
	}
	b.awaitRecord(id)
	remote := false
	list := func() ([]ReplyView, bool, error) {
		var rs []store.Reply
		var found bool
		err := b.cfg.Store.View(func(tx *store.Tx) (err error) {
			var m store.Message
			if m, found, err = tx.Message(id); err != nil || !found {
				return err
			}
			if found = !b.expired(m.CreatedAt); !found {
				return nil
			}
			remote = m.RecipientHarness == RemoteHarness
			rs, err = tx.Replies(id, after)
			return err
		})
		rs = b.fresh(rs)
		out := make([]ReplyView, 0, len(rs))
		for _, r := range rs {
			out = append(out, replyView(r))
		}
		return out, found, err
	}
	out, found, err := list()
	if err != nil {
		return nil, err
	}
	if !found {
		return nil, messageNotFound(id)
	}
	if remote && b.toLeaf(id) {
		// A leaf is never connected to: its replies arrive here (pushed by the leaf), so
		// the wait is a local one.
		remote = false
	}
	if len(out) > 0 || (wait <= 0 && !remote) {
		return out, nil
	}
	select {
	case b.waiters <- struct{}{}:
		defer func() { <-b.waiters }()
	default:
		return nil, errorf(ledger.ServiceUnavailable, "too many waiting reply polls")
	}
	if remote {
		// A message we sent to a peer, with nothing cached here: ask the peer (docs/protocol.md §3.7).
		if err := b.remoteReplies(ctx, id, after, wait); err != nil {
			return nil, err
		}
		out, _, err = list()
		return out, err
	}
	_, err = b.replies.Until(ctx, id, wait, func() (bool, error) {
		var lerr error
		out, _, lerr = list()
		return len(out) > 0, lerr
	})
	return out, err
}

// toLeaf reports whether message id was sent to a leaf peer (its outbound row names one).
func (b *Bus) toLeaf(id string) bool {
	if b.cfg.Fed == nil {
		return false
	}
	var out store.Outbound
	var found bool
	if err := b.cfg.Store.View(func(tx *store.Tx) (err error) {
		out, found, err = tx.Outbound(id)
		return err
	}); err != nil || !found {
		return false
	}
	return b.cfg.Fed.Leaf(out.Peer)
}
