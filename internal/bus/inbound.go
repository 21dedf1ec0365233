package bus

import (
	"context"
	"encoding/json"
	"slices"
	"time"

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

// BatchOptions are AcceptBatch's.
type BatchOptions struct {
	Newly func(Inbound) // told each row queued, once committed (nil: nobody)
	Now   bool          // commit at once, not after Config.RecordRide
	// Soon commits at once too, but returns before it is done (committed says when): for a
	// caller that goes on taking rows meanwhile, whose acks should not wait for a ride.
	Soon bool
	// Committed, when set, is told n (AcceptBatch's) and what committed would receive, on
	// the goroutine that learns it (the one that settles the commit, or the caller's, before
	// AcceptBatch returns, when it is known at once), and committed is nil: a caller that
	// takes many small batches waits for none of them with a goroutine of its own.
	Committed func(n int, err error)
}

// AcceptBatch is Accept for rows that came together for one queued session t (a leaf's
// pull, docs/protocol.md §7.5): it queues them in order until t's queue (or the sender
// node's share of it) is full. It returns how many of ins, from the first, are taken: those
// now wait in the queue, or were recorded before (a redelivery after a crash between the
// local ack and the hub's; the queue, or an ack, has them), or are riding a commit already
// (a batch before). The rest are not, and come again with the next pull. When not even the
// first fits, err is the full queue's, and nothing is queued.
//
// The rows are in the queue in memory when it returns (the service may have them at once);
// their records ride the next commit, made anyway or, after Config.RecordRide, for them.
// committed receives that commit's result once it is done, for every row counted in n (one
// value, then it is closed): only then are they stored, and until then they must stay held
// where they came from (the hub's mailbox). After a failed commit they are no longer in
// the queue. When a row does not fit while places are held by rows riding a commit or by
// acked rows whose deletes wait for one, that commit is made at once and the rows are
// admitted again. o.Newly, when not nil, is told each row queued by this call, once
// committed; o.Now makes the commit at once instead of after a ride (a caller that waits
// for it before it goes on).
func (b *Bus) AcceptBatch(t Target, ins []Inbound, o BatchOptions) (n int, committed <-chan error, err error) {
	newly, rideFor := o.Newly, b.cfg.RecordRide
	if o.Now || o.Soon {
		rideFor = 0
	}
	h := b.h.Named(t.Harness)
	if h == nil || h.Delivery() != harness.Queue {
		return 0, nil, errorf(ledger.Internal, "internal error")
	}
	// One batch at a time per queue (a leaf pulls from each of its hubs): a row is in the
	// store, or riding a commit, or admitted here, never twice.
	unlock := b.keys.lock("\x00accept\x00" + t.SessionID)
	defer func() {
		if unlock != nil {
			unlock()
		}
	}()
	rec := &pendingRecord{done: make(chan struct{}), force: make(chan struct{})}
	type admitted struct {
		e   *earlyRow
		p   store.Pending
		msg store.Message
		in  Inbound
	}
	var rows []admitted
	var deps []*pendingRecord // the earlier batches' commits that rows counted here ride
	var full error
	for attempt := 0; ; attempt++ {
		known := make([]bool, len(ins))
		b.q.mu.Lock()
		for i, in := range ins {
			if r := b.q.inFlight[in.ID]; r != nil {
				known[i] = true
				if !slices.Contains(deps, r) {
					deps = append(deps, r)
				}
			}
		}
		b.q.mu.Unlock()
		shares := map[string]int{} // the stored rows of each sender node's share
		if err := b.cfg.Store.View(func(tx *store.Tx) error {
			for i, in := range ins {
				if known[i] {
					continue
				}
				_, found, err := tx.Message(in.ID)
				if err != nil {
					return err
				}
				known[i] = found
				if a := in.arrival(); !found {
					if _, ok := shares[a.share]; !ok {
						if shares[a.share], err = tx.QueueShare(t.SessionID, a.share); err != nil {
							return err
						}
					}
				}
			}
			return nil
		}); err != nil {
			return 0, nil, err
		}

		// The places are taken in memory, as reserve does, under the same lock as the rows are
		// added, and the commit that will write them is queued before any of them can be acked
		// (an ack's delete rides that commit or a later one, never an earlier).
		shareMax := b.cfg.Bounds.queueShare()
		b.q.mu.Lock()
		sq, err := b.load(t.SessionID)
		if err != nil {
			b.q.mu.Unlock()
			return 0, nil, err
		}
		early := len(b.q.early[t.SessionID])
		for i, in := range ins {
			if known[i] {
				n++
				continue
			}
			a := in.arrival()
			if q := len(sq.rows) + sq.reserved + early + len(rows); q >= store.MaxQueue || q+len(b.q.acked[t.SessionID]) >= store.MaxStored {
				full = queueFull(t.Harness)
				break
			}
			mine := 0
			for _, r := range rows {
				if r.e.share == a.share {
					mine++
				}
			}
			if shareMax > 0 && shares[a.share]+b.q.earlyShare(t.SessionID, a.share)+mine >= shareMax {
				full = shareFull(t.Harness, shareMax)
				break
			}
			msg, err := b.record(h, t, a)
			if err != nil {
				b.q.mu.Unlock()
				return 0, nil, err
			}
			p := *b.entry(h, t.SessionID, msg, a)
			m := &queuedMsg{Queued: Queued{ID: p.ID, FromName: p.FromName, Text: p.Text, Envelope: p.Envelope, Origin: p.Origin}, createdAt: p.CreatedAt}
			e := &earlyRow{id: in.ID, share: p.Share, slot: &queueSlot{b: b, session: t.SessionID, sq: sq}, m: m, rec: rec}
			rows = append(rows, admitted{e, p, msg, in})
			n++
		}
		if full == nil || attempt > 0 {
			break
		}
		// Places held by rows riding a commit, or by acked rows whose deletes wait for one,
		// are freed (or counted in the store) by that commit: made now, once, and the rows
		// are admitted again.
		var riding []*pendingRecord
		for _, e := range b.q.early[t.SessionID] {
			if !slices.Contains(riding, e.rec) {
				riding = append(riding, e.rec)
			}
		}
		for _, o := range b.q.acked[t.SessionID] {
			if o.early != nil && b.q.inFlight[o.id] == o.early.rec && !slices.Contains(riding, o.early.rec) {
				riding = append(riding, o.early.rec)
			}
		}
		if len(riding) == 0 && len(b.q.acked[t.SessionID]) == 0 {
			break
		}
		b.q.mu.Unlock()
		for _, r := range riding {
			r.now()
		}
		b.cfg.Store.Update(func(*store.Tx) error { return nil })
		for _, r := range riding {
			<-r.done // settled: out of the early rows, counted in the store
		}
		rows, n, full, deps = rows[:0], 0, nil, deps[:0]
	}
	if len(rows) == 0 {
		b.q.mu.Unlock()
		if n == 0 && full != nil {
			return 0, nil, full
		}
		return n, o.tell(n, b.afterAll(nil, deps)), nil
	}
	testErr := b.q.testRecordErr
	ride := b.cfg.Store.Defer(func(tx *store.Tx) error {
		if testErr != nil {
			return testErr
		}
		for _, r := range rows {
			if err := r.e.slot.enqueue(tx, r.p); err != nil {
				return err // a bound the store counts and this did not: the rows come again
			}
			if err := records.Sent(tx, r.msg, nil); err != nil {
				return err
			}
		}
		return nil
	})
	es := make([]*earlyRow, len(rows))
	for i, r := range rows {
		es[i] = r.e
		b.q.early[t.SessionID] = append(b.q.early[t.SessionID], r.e)
		b.q.inFlight[r.in.ID] = rec
	}
	b.q.mu.Unlock()
	unlock()
	unlock = nil
	b.queues.Fire(t.SessionID)
	if b.q.testQueued != nil {
		b.q.testQueued()
	}

	settle := func() error {
		var err error
		done := false
		if rideFor > 0 {
			timer := time.NewTimer(rideFor)
			select {
			case err = <-ride:
				done = true
			case <-timer.C:
			case <-rec.force:
			}
			timer.Stop()
		}
		if !done {
			select {
			case err = <-ride:
			default:
				// No commit came within the ride, or the records are needed now: one is
				// made for them (and for whatever else rides it).
				b.cfg.Store.Update(func(*store.Tx) error { return nil })
				err = <-ride
			}
		}
		b.settleEarly(t.SessionID, rec, es, err)
		if err != nil {
			b.cfg.Log.Warn("committing pulled rows failed; they leave the queue", "rows", len(es), "err", err)
		} else if newly != nil {
			for _, r := range rows {
				newly(r.in)
			}
		}
		return err
	}
	if rideFor <= 0 && !o.Soon {
		err := settle()
		return n, o.tell(n, b.afterAll(&err, deps)), nil
	}
	if o.Committed != nil {
		go func() { o.Committed(n, firstErr(settle(), deps)) }()
		return n, nil, nil
	}
	out := make(chan error, 1)
	go func() {
		err := settle()
		out <- firstErr(err, deps)
		close(out)
	}()
	return n, out, nil
}

// tell hands n and the result committed will receive to o.Committed, where that is set (at once
// when it is there already, else from a goroutine that waits for it), and returns nil; else
// committed itself.
func (o BatchOptions) tell(n int, committed <-chan error) <-chan error {
	if o.Committed == nil {
		return committed
	}
	select {
	case err := <-committed:
		o.Committed(n, err)
	default:
		go func() { o.Committed(n, <-committed) }()
	}
	return nil
}

// afterAll is a channel that receives the first error of own (nil: none) and of the
// commits deps, once they are done.
func (b *Bus) afterAll(own *error, deps []*pendingRecord) <-chan error {
	out := make(chan error, 1)
	var err error
	if own != nil {
		err = *own
	}
	if len(deps) == 0 {
		out <- err
		close(out)
		return out
	}
	go func() {
		out <- firstErr(err, deps)
		close(out)
	}()
	return out
}

// firstErr waits for deps' commits and returns err, or else the first of theirs that failed.
func firstErr(err error, deps []*pendingRecord) error {
	for _, d := range deps {
		<-d.done
		if err == nil {
			err = d.err
		}
	}
	return err
}
