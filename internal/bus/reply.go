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
	"github.com/xmsg/xmsg/internal/records"
	"github.com/xmsg/xmsg/internal/store"
)

// ReplyResult is what an accepted reply did (docs/protocol.md §4.1 `reply`).
type ReplyResult struct {
	MessageID        string // the ORIGINAL message
	Seq              uint64
	SessionRef       string
	ReplierSessionID string
	CreatedAt        int64
	Text             string
	PushOutcome      ledger.Outcome // NoOutcome: no push was tried (no return address)
	PushedMessageID  string         // the pushed message's id; "" when none was recorded
}

// Result is what the reply's event says of it: the reply to inReplyTo, and its push.
func (r ReplyResult) Result(inReplyTo string) ledger.Result {
	return ledger.Result{InReplyTo: inReplyTo, ReplySeq: r.Seq, Bytes: len(r.Text), Text: r.Text, Outcome: r.PushOutcome, MessageID: r.PushedMessageID}
}

// Reply is a recorded reply to a message (docs/protocol.md §3.7).
type Reply struct {
	Seq              uint64
	MessageID        string
	CreatedAt        int64
	ReplierSessionID string
	Text             string
	PushOutcome      ledger.Outcome // NoOutcome: none was recorded
	PushedMessageID  string         // "" when none was recorded
}

// qualified names a session as <harness>:<id>, once: ids that already carry their harness
// ("svc:bot", "pi:<uuid>") are not prefixed again.
func qualified(harness, id string) string {
	if strings.HasPrefix(id, harness+":") {
		return id
	}
	return harness + ":" + id
}

func replyOf(r store.Reply) Reply {
	return Reply{Seq: r.Seq, MessageID: r.MessageID, CreatedAt: r.CreatedAt, ReplierSessionID: r.ReplierSessionID,
		Text: r.Text, PushOutcome: r.PushOutcome, PushedMessageID: r.PushedMessageID}
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
		CreatedAt: now, Text: text, PushOutcome: reply.PushOutcome, PushedMessageID: reply.PushedMessageID}, nil
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
	reply.PushOutcome = plan.outcome
	var slot *queueSlot
	if plan.pending != nil {
		// The queue bound is checked before the commit (see queueState); a full queue fails
		// only the push, the reply is kept.
		var err error
		if slot, err = b.reserve(plan.pending.SessionID); err != nil {
			if !errors.Is(err, store.ErrQueueFull) {
				return store.Reply{}, err
			}
			plan.pending, plan.msg, plan.out, plan.deliver, reply.PushOutcome = nil, nil, nil, nil, ledger.PushFailed
		}
	}
	err := b.cfg.Store.Update(func(tx *store.Tx) error {
		r := reply
		if plan.pending != nil {
			switch err := slot.enqueue(tx, *plan.pending); {
			case errors.Is(err, store.ErrQueueFull):
				// The reply itself is kept; only the push failed.
				r.PushOutcome = ledger.PushFailed
			case err != nil:
				return err
			}
		}
		if r.PushOutcome == ledger.Pushed && plan.msg != nil {
			r.PushedMessageID = plan.msg.ID
			var err error
			if plan.out != nil {
				err = records.SentTo(tx, *plan.msg, *plan.out, nil)
			} else {
				err = records.Sent(tx, *plan.msg, nil)
			}
			if err != nil {
				return err
			}
		}
		seq, err := records.Replied(tx, r)
		r.Seq = seq
		reply = r
		return err
	})
	if err == nil && reply.PushOutcome == ledger.Pushed {
		slot.committed()
	}
	slot.release() // the place, unless the write was committed
	if err != nil {
		return store.Reply{}, err
	}
	if plan.deliver != nil && reply.PushOutcome == ledger.Pushed {
		if outcome := plan.deliver(); outcome != ledger.Pushed {
			// The push did not arrive: record that, and drop the pushed message's rows.
			pushedID := reply.PushedMessageID
			reply.PushOutcome, reply.PushedMessageID = outcome, ""
			err := b.cfg.Store.Update(func(tx *store.Tx) error { return records.PushUndone(tx, reply, pushedID) })
			if err != nil {
				b.cfg.Log.Error("recording failed push", "message_id", reply.MessageID, "err", err)
			}
		}
	}
	b.replies.Fire(reply.MessageID)
	if plan.pending != nil && reply.PushOutcome == ledger.Pushed {
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
		Outcome: ledger.Delivered, RecipientHarness: msg.ReturnHarness, ReturnHarness: replier.Harness,
		ReturnSessionID: replier.SessionID, ReturnHost: replierHost, PushReplies: true, ThreadID: msg.ThreadID}
	h := b.h.Named(msg.ReturnHarness)
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

// Message is a recorded message with its replies (docs/protocol.md §3.6).
type Message struct {
	ID               string
	CreatedAt        int64
	SessionID        string
	FromName         string
	Bytes            int
	Outcome          ledger.Outcome // as recorded (queued reads delivered once taken)
	RecipientHarness string
	ReturnHarness    string // "" when the message has no return address
	ReturnSessionID  string // "" when the message has no return address
	PushReplies      bool
	ThreadID         string
	// Report is what a Claude Code recipient said of the message (its peer status), or
	// "written": its line reached the session's inbox and nothing more is known; "" for any
	// other recipient.
	Report  string
	Replies []Reply
}

// messageNotFound names the message that was not found, once (the original reused the session
// helper: "no live session matches 'message '<id>”", docs/protocol.md §1).
func messageNotFound(id string) *Error { return errorf(ledger.NotFound, "no message '%s'", id) }

// Message returns a stored message with its replies.
func (b *Bus) Message(id string) (Message, error) {
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
		return Message{}, err
	}
	found = found && !b.expired(m.CreatedAt)
	replies = b.fresh(replies)
	if !found {
		return Message{}, messageNotFound(id)
	}
	if m.Outcome == ledger.Queued && b.taken(m) {
		m.Outcome = ledger.Delivered
	}
	v := Message{ID: m.ID, CreatedAt: m.CreatedAt, SessionID: m.SessionID, FromName: m.FromName, Bytes: m.Bytes, Outcome: m.Outcome,
		RecipientHarness: m.RecipientHarness, ReturnHarness: m.ReturnHarness, ReturnSessionID: m.ReturnSessionID,
		PushReplies: m.PushReplies, ThreadID: m.ThreadID, Report: m.Report, Replies: []Reply{}}
	for _, r := range replies {
		v.Replies = append(v.Replies, replyOf(r))
	}
	return v, nil
}

// taken reports whether m, recorded queued for a recipient that was not connected, has left
// its queue since: the recipient took it and acknowledged it. Asked on a read, so that the
// hand-out and the ack, the queue's hot path, write nothing more for it.
func (b *Bus) taken(m store.Message) bool {
	if h := b.h.Named(m.RecipientHarness); h == nil || h.Delivery() != harness.Queue {
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
func (b *Bus) Replies(ctx context.Context, id string, after uint64, wait time.Duration) ([]Reply, error) {
	if wait > MaxWait {
		wait = MaxWait
	}
	b.awaitRecord(id)
	remote := false
	list := func() ([]Reply, bool, error) {
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
		out := make([]Reply, 0, len(rs))
		for _, r := range rs {
			out = append(out, replyOf(r))
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
