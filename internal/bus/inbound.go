package bus

import (
	"context"
	"encoding/json"
	"errors"

	"github.com/xmsg/xmsg/internal/harness"
	"github.com/xmsg/xmsg/internal/ledger"
	"github.com/xmsg/xmsg/internal/principal"
	"github.com/xmsg/xmsg/internal/records"
	"github.com/xmsg/xmsg/internal/store"
)

// Inbound is a message another node sent here, checked by the transport that carried it
// (peer, policy, rate, principal): a federation peer's envelope (docs/protocol.md §8.3), or a
// row a leaf pulled from its hub's mailbox (§7.5). It is delivered as a local send is
// (deliver); what differs is only its record: the sender node's id (so that replies find the
// message there), that node as return host, and that node as the origin whose share of a
// queue it takes, whatever principal it names.
type Inbound struct {
	ID, Peer    string
	Ref         string // the ref the sender named (to.ref)
	FromName    string
	Badge       string  // the principal's badge for svc origins, e.g. "claude:alice"
	Return      *Caller // the principal as return address; nil for anonymous senders
	Body        string
	PushReplies bool
	ThreadID    string
}

// InboundFrom is in sent by sender (principal.Principal.Sender): its badges and return
// address. An anonymous sender has no return address, so nothing is pushed to it.
func InboundFrom(sender principal.Sender, in Inbound) Inbound {
	in.FromName, in.Badge = sender.FromName, sender.Badge
	if r := sender.Return; r != nil {
		in.Return = &Caller{Harness: r.Harness, SessionID: r.SessionID, Name: r.Name}
	} else {
		in.PushReplies = false
	}
	return in
}

func (in Inbound) arrival() arrival {
	return arrival{id: in.ID, fromName: in.FromName, text: in.Body, bytes: len(in.Body), ret: in.Return, push: in.PushReplies,
		returnHost: in.Peer, threadID: in.ThreadID, share: "fed:" + in.Peer,
		origin: func() json.RawMessage { return FedOrigin(in.Peer, in.Badge) }}
}

// Accept records and delivers an inbound envelope to t (steps 8-10 of docs/protocol.md §8.3).
// An id accepted from the same peer before answers what it answered then (step 8); an id
// that belongs to another peer's message, or to a local one, is a conflict. unresolved, when
// not nil, is why the envelope's ref did not resolve (step 5): it is recorded under the id,
// so a retry of the same id gets the same answer, and returned.
func (b *Bus) Accept(ctx context.Context, in Inbound, t Target, unresolved error) (d Delivery, err error) {
	// Two copies of one envelope racing (a retry overtaking the original) must not both
	// deliver: the second one, under the lock, finds the first one's row.
	defer b.keys.lock("\x00fed-message\x00" + in.ID)()
	if stored, found, err := b.accepted(in.ID, in.Peer); found || err != nil {
		return stored, err
	}
	if unresolved != nil {
		// The record names why nobody got it.
		outcome := ledger.NotTaken
		switch AsError(unresolved).Code {
		case ledger.NotFound:
			outcome = ledger.NoRecipient
		case ledger.Ambiguous:
			outcome = ledger.AmbiguousRecipient
		case ledger.Gone:
			outcome = ledger.RecipientGone
		}
		m := store.Message{ID: in.ID, CreatedAt: b.nowUnix(), SessionID: in.Ref, FromName: in.FromName, Bytes: len(in.Body), Outcome: outcome,
			ReturnHost: in.Peer, ThreadID: in.ID}
		if err := b.cfg.Store.Update(func(tx *store.Tx) error { return records.Sent(tx, m, nil) }); err != nil {
			return Delivery{}, err
		}
		return Delivery{}, unresolved
	}
	return b.deliver(ctx, t, in.arrival())
}

// accepted returns the stored result of an envelope id already accepted from peer: found
// is false when the id is new. A peer can never read or replay what it did not send.
func (b *Bus) accepted(id, peer string) (Delivery, bool, error) {
	m, found, err := b.message(id)
	if err != nil || !found {
		return Delivery{}, false, err
	}
	if m.ReturnHost != peer || m.RecipientHarness == RemoteHarness {
		return Delivery{}, true, errorf(ledger.Conflict, "message id '%s' is already in use", id)
	}
	switch m.Outcome {
	case ledger.Delivered, ledger.Queued, ledger.Accepted:
		return Delivery{SessionID: m.SessionID, FromName: m.FromName, Bytes: m.Bytes, MessageID: m.ID, Outcome: m.Outcome, Harness: m.RecipientHarness}, true, nil
	case ledger.NoRecipient:
		return Delivery{}, true, notFound(m.SessionID)
	case ledger.AmbiguousRecipient:
		return Delivery{}, true, errorf(ledger.Ambiguous, "%s", m.SessionID)
	case ledger.RecipientGone:
		return Delivery{}, true, errorf(ledger.Gone, "session %s exited", m.SessionID)
	}
	return Delivery{}, true, errorf(ledger.DeliveryFailed, "delivery of message '%s' failed", id)
}

// AcceptBatch is Accept for rows that came together for one queued session t (a leaf's
// pull, docs/protocol.md §7.5), in one commit: it records and queues them in order until t's
// queue (or the sender node's share of it) is full. It returns how many of ins, from the
// first, are recorded: those now wait in the queue, or were recorded before (a redelivery
// after a crash between the local ack and the hub's; the queue, or an ack, has them). The
// rest are not, and come again with the next pull. When not even the first fits, the
// error is the full queue's. newly, when not nil, is told each row queued now (not before).
func (b *Bus) AcceptBatch(t Target, ins []Inbound, newly func(Inbound)) (n int, err error) {
	h := b.h.Named(t.Harness)
	if h == nil || h.Delivery() != harness.Queue {
		return 0, errorf(ledger.Internal, "internal error")
	}
	// Rows recorded before need no place; the others reserve theirs in order, as a send
	// does (deliver), until the queue has no more.
	known := make([]bool, len(ins))
	if err := b.cfg.Store.View(func(tx *store.Tx) error {
		for i, in := range ins {
			_, found, err := tx.Message(in.ID)
			if err != nil {
				return err
			}
			known[i] = found
		}
		return nil
	}); err != nil {
		return 0, err
	}
	slots := make([]*queueSlot, len(ins))
	defer func() {
		for _, s := range slots {
			s.release() // the places not taken; a committed one is settled already
		}
	}()
	var full error
	for i := range ins {
		if known[i] {
			continue
		}
		s, err := b.reserve(t.SessionID)
		if errors.Is(err, store.ErrQueueFull) {
			full = queueFull(t.Harness)
			break
		}
		if err != nil {
			return 0, err
		}
		slots[i] = s
	}
	var queued []int
	var txFull error
	// The rows join the queue in memory once their writes are final, before the commit's
	// fsync, so the service starts on them while the disk works: a pulled row is still held
	// by the hub's mailbox until the puller acks it there, which it does only once this
	// returned nil, so a crash before the commit loses nothing (the hub hands the row out
	// again). A reply to one of them meanwhile waits for the commit (awaitRecord).
	var early []string
	written := func() {
		for _, i := range queued {
			slots[i].committed()
			early = append(early, ins[i].ID)
		}
		b.recording(early)
		if len(queued) > 0 {
			b.queues.Fire(t.SessionID)
		}
		if b.q.testWritten != nil {
			b.q.testWritten()
		}
	}
	err = b.cfg.Store.UpdateWritten(func(tx *store.Tx) error {
		n, queued, txFull = 0, queued[:0], nil
		for i, in := range ins {
			if _, found, err := tx.Message(in.ID); err != nil {
				return err
			} else if found {
				n++
				continue
			}
			if slots[i] == nil {
				return nil // what came before is committed; the rest waits on the hub
			}
			a := in.arrival()
			msg, err := b.record(h, t, a)
			if err != nil {
				return err
			}
			if err := slots[i].enqueue(tx, *b.entry(h, t.SessionID, msg, a)); errors.Is(err, store.ErrShareFull) {
				txFull = shareFull(t.Harness, b.cfg.Bounds.queueShare())
				return nil
			} else if errors.Is(err, store.ErrQueueFull) {
				txFull = queueFull(t.Harness)
				return nil
			} else if err != nil {
				return err
			}
			if err := records.Sent(tx, msg, nil); err != nil {
				return err
			}
			queued = append(queued, i)
			n++
		}
		return nil
	}, written)
	if err != nil {
		if len(early) > 0 {
			// In memory, never committed: the queue is read again from the store.
			b.uncounted(t.SessionID)
		}
		b.recorded(early)
		return 0, err
	}
	b.recorded(early)
	if newly != nil {
		for _, i := range queued {
			newly(ins[i])
		}
	}
	if n == 0 && txFull != nil {
		return 0, txFull
	}
	if n == 0 && full != nil {
		return 0, full
	}
	return n, nil
}
