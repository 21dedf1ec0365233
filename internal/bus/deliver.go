package bus

import (
	"context"
	"encoding/json"
	"errors"

	"github.com/google/uuid"

	"github.com/xmsg/xmsg/internal/claude"
	"github.com/xmsg/xmsg/internal/envelope"
	"github.com/xmsg/xmsg/internal/harness"
	"github.com/xmsg/xmsg/internal/ledger"
	"github.com/xmsg/xmsg/internal/store"
)

// arrival is a message for a local session, however it came: Send builds one for a local
// sender, Accept for another node's. What differs between the ways in is only what is
// written here; how the message reaches its session is deliver's alone, so a harness
// behaves the same whichever way a message came.
type arrival struct {
	id         string // "" = a new id, made once the recipient's place is reserved
	fromName   string // sender badge
	text       string
	bytes      int     // the protocol's `bytes` as the way in counts them
	ret        *Caller // return address; nil: replies go nowhere
	push       bool
	returnHost string // the node the sender is on; "" = this one
	threadID   string // "" = the message id
	// origin is the queue entry's origin (docs/protocol.md §7.3), for harnesses whose entries
	// carry one; share is the origin whose share of a queue the entry takes ("" = read from
	// origin, see shareOf).
	origin func() json.RawMessage
	share  string
	// idem, when set, is recorded in the same commit as the message, with its delivery.
	idem *store.Idem
}

// deliver records a and delivers it to t, by t's harness: written to a Claude inbox once
// the record is committed, committed with a queue entry, or handed to agentapi. It returns
// only after the record is committed and fsynced; a refused delivery changes nothing.
func (b *Bus) deliver(ctx context.Context, t Target, a arrival) (Delivery, error) {
	h := b.h.Lookup(t.Harness)
	if h == nil {
		// A session of a harness this bus's registry lacks (a Codex lease on a bus built
		// without codex): nothing says how to deliver to it.
		return Delivery{}, errorf(ledger.Internal, "internal error")
	}
	// A queued recipient's place is reserved first: a full queue is refused here, before the
	// message id, envelope and origin are built (a storm of refused sends skips that work), and
	// before the write can enter (and fail inside) a shared commit.
	var slot *queueSlot
	if h.Delivery() == harness.Queue {
		var err error
		slot, err = b.reserve(t.SessionID)
		if errors.Is(err, store.ErrQueueFull) {
			return Delivery{}, queueFull(t.Harness)
		}
		if err != nil {
			return Delivery{}, err
		}
		defer slot.release() // the place, unless the write was committed
	}
	msg, err := b.record(t, a)
	if err != nil {
		return Delivery{}, err
	}
	d := Delivery{SessionID: t.SessionID, FromName: a.fromName, Bytes: a.bytes, MessageID: msg.ID, Outcome: ledger.Delivered, Harness: t.Harness}
	if t.Offline && h.Delivery() == harness.Queue {
		// In the queue of a recipient that is not connected (docs/protocol.md §5.2): nobody
		// has it yet. It reads delivered once the recipient has taken it (Message).
		d.Outcome, msg.Outcome = ledger.Queued, ledger.Queued.String()
	}
	if a.idem != nil {
		a.idem.MessageID, a.idem.SessionID, a.idem.FromName, a.idem.Bytes, a.idem.Outcome, a.idem.CreatedAt =
			d.MessageID, d.SessionID, d.FromName, d.Bytes, d.Outcome.String(), msg.CreatedAt
	}
	if h.Delivery() == harness.Agentapi {
		return b.sendAgy(a, t, msg)
	}
	var pending *store.Pending
	if slot != nil {
		pending = b.entry(h, t.SessionID, msg, a)
	}
	// The record is committed BEFORE a Claude inbox sees the message: a session may reply the
	// instant the line arrives, and its reply must find the message. If the delivery then
	// fails, a second commit marks the message failed and forgets the key, so a retry with
	// the same key delivers again. The inbox is connected now, though, and written after the
	// commit: the session accepts while the daemon waits for the disk, not after. A failed
	// commit leaves it a connection that carries nothing.
	var inbox *claude.Inbox
	if h.Delivery() == harness.Inbox {
		inbox = b.dialClaude(t.Claude.MessagingSocketPath)
		defer later(ctx, inbox.Close)
	}
	var enqueue func(*store.Tx) error
	if pending != nil {
		enqueue = func(tx *store.Tx) error { return slot.enqueue(tx, *pending) }
	}
	err = b.commit(enqueue, msg, a.idem)
	if errors.Is(err, store.ErrShareFull) {
		return Delivery{}, shareFull(t.Harness, b.cfg.Bounds.queueShare())
	}
	if errors.Is(err, store.ErrQueueFull) {
		return Delivery{}, queueFull(t.Harness)
	}
	if err != nil {
		return Delivery{}, err
	}
	slot.committed()
	if inbox != nil {
		line, err := envelope.ClaudeLineReported(a.fromName, envelope.ClaudeBody(a.text, msg.ID), b.cfg.ReplyTo, msg.ID)
		if err == nil {
			err = inbox.Write(line)
		}
		if err != nil {
			b.failed(msg, a.idem)
			return Delivery{}, inboxError(err)
		}
	}
	if pending != nil {
		b.queues.Fire(t.SessionID)
	}
	return d, nil
}

// record is the message row of a for t, outcome delivered; a new id is made here when a
// has none.
func (b *Bus) record(t Target, a arrival) (store.Message, error) {
	id := a.id
	if id == "" {
		u, err := uuid.NewV7()
		if err != nil {
			return store.Message{}, err
		}
		id = u.String()
	}
	msg := store.Message{ID: id, CreatedAt: b.nowUnix(), SessionID: t.SessionID, FromName: a.fromName, Bytes: a.bytes,
		Outcome: ledger.Delivered.String(), RecipientHarness: t.Harness, ReturnHost: a.returnHost, ThreadID: a.threadID}
	if msg.ThreadID == "" {
		msg.ThreadID = id
	}
	if h := b.h.Lookup(t.Harness); h != nil && h.Delivery() == harness.Inbox {
		// Written to the inbox is all that is known until the session reports (report.go).
		msg.Report = claude.ReportWritten
	}
	if a.ret != nil {
		msg.ReturnHarness, msg.ReturnSessionID, msg.PushReplies = a.ret.Harness, a.ret.SessionID, a.push
	}
	return msg, nil
}

// entry is the queue entry of msg for a session of harness h.
func (b *Bus) entry(h harness.Harness, session string, msg store.Message, a arrival) *store.Pending {
	p := &store.Pending{ID: msg.ID, Share: a.share, SessionID: session, CreatedAt: msg.CreatedAt, FromName: a.fromName, Bytes: a.bytes,
		Text: a.text, Envelope: h.Envelope(a.fromName, envelope.ClaudeBody(a.text, msg.ID), envelope.Plain(a.fromName, msg.ID, a.text))}
	if h.Origin() && a.origin != nil {
		p.Origin = a.origin()
	}
	return p
}

// commit writes msg and idem (nil: none) in one transaction, after enqueue (nil: none).
func (b *Bus) commit(enqueue func(*store.Tx) error, msg store.Message, idem *store.Idem) error {
	return b.cfg.Store.Update(func(tx *store.Tx) error {
		if enqueue != nil {
			if err := enqueue(tx); err != nil {
				return err
			}
		}
		if err := tx.PutMessage(msg); err != nil {
			return err
		}
		if idem == nil {
			return nil
		}
		return tx.PutIdem(*idem)
	})
}

// failed records that msg, committed as delivered, did not reach its session, and forgets
// its idempotency key, so a retry with the same key delivers again.
func (b *Bus) failed(msg store.Message, idem *store.Idem) {
	msg.Outcome = ledger.Undelivered.String()
	b.cfg.Events.Emit(ledger.Event{Kind: ledger.Failed, Transport: ledger.Daemon, MessageID: msg.ID, From: msg.FromName,
		To: msg.SessionID, Harness: msg.RecipientHarness, Outcome: ledger.Undelivered, Bytes: msg.Bytes})
	if err := b.cfg.Store.Update(func(tx *store.Tx) error {
		if idem != nil {
			if err := tx.DeleteIdem(idem.Principal, idem.Key); err != nil {
				return err
			}
		}
		return tx.PutMessage(msg)
	}); err != nil {
		b.cfg.Log.Error("recording failed delivery", "message_id", msg.ID, "err", err)
	}
}
