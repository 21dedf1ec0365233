// Package records writes the stored record of a message's life, and is the only package
// that does (docs/design.md §1, held by docs/layers_test.go): the message's row when it is
// sent and each later outcome, the reply rows, the idempotency keys, a federated message's
// outbound row and a leaf's mailbox entry. Each verb is one step of a message's life,
// written inside the caller's transaction so that it commits together with whatever else
// that step changes (a queue entry, a reservation); what the step announces is the caller's
// ledger.Event, emitted once the commit is done.
//
// The queue entries of a queued session are not records: they are where a message waits,
// and belong to the bus's queues.
package records

import (
	"github.com/xmsg/xmsg/internal/ledger"
	"github.com/xmsg/xmsg/internal/store"
)

// Sent records m as it was sent or accepted, with the sender's idempotency key (nil: none).
func Sent(tx *store.Tx, m store.Message, idem *store.Idem) error {
	if err := tx.PutMessage(m); err != nil {
		return err
	}
	return Key(tx, idem)
}

// SentTo records m as sent to a peer: its row, its outbound row (which peer has it, what
// the peer said) and the sender's idempotency key (nil: none).
func SentTo(tx *store.Tx, m store.Message, out store.Outbound, idem *store.Idem) error {
	if err := tx.PutMessage(m); err != nil {
		return err
	}
	if err := tx.PutOutbound(out); err != nil {
		return err
	}
	return Key(tx, idem)
}

// Mailed records m as queued for a leaf: SentTo's rows and the mail itself, in the leaf's
// mailbox bounded to maxN entries and maxBytes of stored rows (store.ErrMailboxFull beyond).
func Mailed(tx *store.Tx, mail store.MailboxEntry, maxN, maxBytes int, m store.Message, out store.Outbound, idem *store.Idem) error {
	if err := tx.PutMailboxMax(mail, maxN, maxBytes); err != nil {
		return err
	}
	return SentTo(tx, m, out, idem)
}

// Key records an idempotency key (nil: none) on its own: a step whose message row was
// written before (a pushed reply from a peer, keyed by its id).
func Key(tx *store.Tx, idem *store.Idem) error {
	if idem == nil {
		return nil
	}
	return tx.PutIdem(*idem)
}

// Withdrawn forgets the rows of a message that was never sent after all (the peer refused
// it, or it could not be reached): it changes nothing that anyone was told.
func Withdrawn(tx *store.Tx, id string) error {
	if err := tx.DeleteMessage(id); err != nil {
		return err
	}
	return tx.DeleteOutbound(id)
}

// Undelivered records that m, committed as delivered, did not reach its session, and
// forgets its idempotency key (nil: none), so a retry with the same key delivers again.
func Undelivered(tx *store.Tx, m store.Message, idem *store.Idem) error {
	if idem != nil {
		if err := tx.DeleteIdem(idem.Principal, idem.Key); err != nil {
			return err
		}
	}
	m.Outcome = ledger.Undelivered
	return tx.PutMessage(m)
}

// Settled records that message id, which reads was, now reads now; a message that reads
// anything else (or none) is left as it is. It reports whether it changed the row.
func Settled(tx *store.Tx, id string, was, now ledger.Outcome) (bool, error) {
	_, changed, err := tx.SetMessageOutcome(id, now, func(cur ledger.Outcome) bool { return cur == was })
	return changed, err
}

// Taken records what leaf peer did with mail id: it is out of the mailbox, and the message
// and its outbound row read outcome from now on. It reports false (and changes nothing) for
// mail the mailbox no longer holds: taken before.
func Taken(tx *store.Tx, peer, id string, outcome ledger.Outcome) (bool, error) {
	ok, err := tx.AckMailbox(peer, id)
	if err != nil || !ok {
		return false, err
	}
	if mine, err := tx.SetOutboundOutcome(id, peer, outcome); err != nil || !mine {
		return true, err
	}
	_, _, err = tx.SetMessageOutcome(id, outcome, func(ledger.Outcome) bool { return true })
	return true, err
}

// Reported applies what a message's recipient reported of it (change returns false to keep
// the row as it is: a settled message stays settled), in a commit of its own. It reports
// whether the message exists.
func Reported(st *store.Store, id string, change func(*store.Message) bool) (bool, error) {
	found := false
	err := st.Update(func(tx *store.Tx) error {
		m, ok, err := tx.Message(id)
		if found = ok; err != nil || !ok || !change(&m) {
			return err
		}
		return tx.PutMessage(m)
	})
	return found, err
}

// Replied records reply r to its message and returns its sequence number.
func Replied(tx *store.Tx, r store.Reply) (uint64, error) {
	return tx.AddReply(r)
}

// PushUndone records that reply r's push did not arrive after all: the pushed message's rows
// (id pushed) go, and the reply says what became of its push.
func PushUndone(tx *store.Tx, r store.Reply, pushed string) error {
	if err := Withdrawn(tx, pushed); err != nil {
		return err
	}
	return tx.PutReply(r)
}
