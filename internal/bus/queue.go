package bus

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/xmsg/xmsg/internal/store"
)

// queueState is what the bus knows about the queues of registered sessions beyond the store:
//
//   - how many unacknowledged messages each holds, so that a send to a full queue is refused
//     before its write enters a shared commit (a write failing inside a commit costs its whole
//     batch a second pass);
//   - which messages were acknowledged but whose delete is not committed yet. An ack is
//     answered at once and its delete rides the next shared commit: delivery is at-least-once,
//     so an ack lost in a crash only means the message is delivered again. Polls skip these.
type queueState struct {
	mu    sync.Mutex
	n     map[string]int             // per session: unacknowledged + reserved, once loaded
	acked map[string]map[string]bool // per session: acknowledged, delete not committed
	// failing is set while committing acks fails (a full disk): acks are then committed
	// before they are answered, so that an ack that cannot be stored is answered an error.
	failing bool
	todo    []ackOp       // acks for the flusher
	wake    chan struct{} // buffered(1): there is todo
	done    chan struct{} // the flusher has exited
}

type ackOp struct{ session, id string }

func (q *queueState) init() {
	q.n, q.acked, q.wake, q.done = map[string]int{}, map[string]map[string]bool{}, make(chan struct{}, 1), make(chan struct{})
}

// reserve takes a place in session's queue for a write about to be committed. release gives
// it back if that write is not committed.
func (b *Bus) reserve(session string) (release func(), err error) {
	q := &b.q
	q.mu.Lock()
	defer q.mu.Unlock()
	n, ok := q.n[session]
	if !ok {
		if n, err = b.loadCount(session); err != nil {
			return nil, err
		}
	}
	if n >= store.MaxQueue {
		q.n[session] = n
		return nil, store.ErrQueueFull
	}
	q.n[session] = n + 1
	return func() {
		q.mu.Lock()
		defer q.mu.Unlock()
		if _, ok := q.n[session]; ok {
			q.n[session]--
		}
	}, nil
}

// loadCount counts session's unacknowledged messages in the store. The caller holds q.mu.
func (b *Bus) loadCount(session string) (int, error) {
	var ids []string
	err := b.cfg.Store.View(func(tx *store.Tx) (err error) {
		ids, err = tx.QueueIDs(session)
		return err
	})
	n := 0
	for _, id := range ids {
		if !b.q.acked[session][id] {
			n++
		}
	}
	return n, err
}

// uncounted drops session's count after a write that enqueued without a reservation (the
// federation and agy paths, bounded by Tx.Enqueue): it is loaded again from the store.
func (b *Bus) uncounted(session string) {
	b.q.mu.Lock()
	delete(b.q.n, session)
	b.q.mu.Unlock()
}

// forgetCounts drops the counts after rows were deleted behind the bus's back (retention).
func (b *Bus) forgetCounts() {
	b.q.mu.Lock()
	clear(b.q.n)
	b.q.mu.Unlock()
}

// Queued is a message Poll hands to a registered session: what its deliver frame carries
// (docs/protocol.md §4.2).
type Queued struct {
	ID, FromName, Text, Envelope string
	// Origin is the sender as resolved when the message was queued (docs/protocol.md §7.3),
	// a JSON object; nil when none was recorded.
	Origin json.RawMessage
}

// Poll returns the oldest unacknowledged message of r's session, waiting up to wait for one.
// It returns (nil, nil) on timeout. The message stays queued until Ack: a crash or a dropped
// connection before the ack means it is delivered again (at-least-once).
func (b *Bus) Poll(ctx context.Context, r *Registration, wait time.Duration) (*Queued, error) {
	if wait > MaxWait {
		wait = MaxWait
	}
	timer := time.NewTimer(wait)
	defer timer.Stop()
	for {
		ch, cancel := b.queues.subscribe(r.SessionID)
		// A copy, taken before the read transaction: no lock is held inside one.
		b.q.mu.Lock()
		var skip map[string]bool
		if a := b.q.acked[r.SessionID]; len(a) > 0 {
			skip = make(map[string]bool, len(a))
			for id := range a {
				skip[id] = true
			}
		}
		b.q.mu.Unlock()
		var p store.Pending
		var found bool
		err := b.cfg.Store.View(func(tx *store.Tx) (err error) {
			p, found, err = tx.HeadSkip(r.SessionID, skip)
			return err
		})
		if err == nil && found && b.expired(p.CreatedAt) {
			// Past the TTL: it must not be delivered. Drop it now rather than wait for the
			// purge, and look at the next one.
			cancel()
			if err := b.cfg.Store.Update(func(tx *store.Tx) error { _, err := tx.Ack(r.SessionID, p.ID); return err }); err != nil {
				return nil, err
			}
			continue
		}
		if err != nil || found {
			cancel()
			if found {
				return &Queued{ID: p.ID, FromName: p.FromName, Text: p.Text, Envelope: p.Envelope, Origin: p.Origin}, nil
			}
			return nil, err
		}
		if wait <= 0 {
			cancel()
			return nil, nil
		}
		select {
		case <-ch:
			cancel()
		case <-timer.C:
			cancel()
			return nil, nil
		case <-ctx.Done():
			cancel()
			return nil, ctx.Err()
		}
	}
}

// Ack removes messageID from r's queue if it is there; acking anything else changes nothing.
// It returns before the delete is committed (see queueState).
func (b *Bus) Ack(r *Registration, messageID string) error {
	q := &b.q
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.acked[r.SessionID][messageID] {
		return nil
	}
	// Under q.mu, so two acks of one message count once; the flusher forgets an ack only
	// after its delete is committed, so the message is either in acked or (if at all) queued.
	var queued bool
	if err := b.cfg.Store.View(func(tx *store.Tx) (err error) {
		queued, err = tx.Queued(r.SessionID, messageID)
		return err
	}); err != nil {
		return err
	}
	if !queued {
		return nil
	}
	if q.failing {
		var acked bool
		if err := b.cfg.Store.Update(func(tx *store.Tx) (err error) {
			acked, err = tx.Ack(r.SessionID, messageID)
			return err
		}); err != nil {
			return err
		}
		if _, ok := q.n[r.SessionID]; ok && acked {
			q.n[r.SessionID]--
		}
		q.failing = false // this commit worked: back to acks that ride the next commit
		if acked {
			b.acks.fire(messageID)
		}
		b.cfg.Log.Info("accepted", "socket", "register", "actor", r.Caller().Actor(), "request", "ack", "message_id", messageID)
		return nil
	}
	if q.acked[r.SessionID] == nil {
		q.acked[r.SessionID] = map[string]bool{}
	}
	q.acked[r.SessionID][messageID] = true
	if _, ok := q.n[r.SessionID]; ok {
		q.n[r.SessionID]--
	}
	q.todo = append(q.todo, ackOp{r.SessionID, messageID})
	select {
	case q.wake <- struct{}{}:
	default:
	}
	// LogAttrs: the same line as Info with these pairs, without boxing each value.
	b.cfg.Log.LogAttrs(context.Background(), slog.LevelInfo, "accepted", slog.String("socket", "register"), slog.String("actor", r.Caller().Actor()),
		slog.String("request", "ack"), slog.String("message_id", messageID))
	return nil
}

// ackRide is how long acknowledged deletes wait for a commit that is made anyway (a send's)
// before the flusher asks for one of their own.
const ackRide = 5 * time.Millisecond

// flushAcks commits acknowledged deletes: each batch rides the store's next commit, whoever
// makes it, and only if none comes within ackRide does it get a commit of its own. It runs
// until Close, then commits what is left.
func (b *Bus) flushAcks() {
	q := &b.q
	defer close(q.done)
	for {
		select {
		case <-q.wake:
		case <-b.stop:
			b.flushOnce()
			return
		}
		b.flushOnce()
	}
}

func (b *Bus) flushOnce() {
	q := &b.q
	q.mu.Lock()
	ops := q.todo
	q.todo = nil
	q.mu.Unlock()
	if len(ops) == 0 {
		return
	}
	done := b.cfg.Store.Defer(func(tx *store.Tx) error {
		for _, o := range ops {
			if _, err := tx.Ack(o.session, o.id); err != nil {
				return err
			}
		}
		return nil
	})
	wait := ackRide
	if b.cfg.AckDelay > 0 {
		wait = b.cfg.AckDelay // test knob: stands for a crash right after the ack
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	var err error
	select {
	case err = <-done:
	case <-t.C:
		err = b.forceCommit(done)
	case <-b.stop:
		err = b.forceCommit(done)
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	if err != nil {
		// Still acknowledged in memory (not delivered again while the daemon runs); retried
		// with the next ack or at Close.
		b.cfg.Log.Error("committing acks failed", "acks", len(ops), "err", err)
		q.todo = append(ops, q.todo...)
		q.failing = true
		return
	}
	q.failing = false
	for _, o := range ops {
		b.acks.fire(o.id) // committed: WaitAcked (a leaf's forwarded ack) may go on
		if a := q.acked[o.session]; a != nil {
			delete(a, o.id)
			if len(a) == 0 {
				delete(q.acked, o.session)
			}
		}
	}
}

// forceCommit makes a commit for deferred writes that no other commit carried, and returns
// their result.
func (b *Bus) forceCommit(done <-chan error) error {
	select {
	case err := <-done:
		return err
	default:
	}
	if err := b.cfg.Store.Update(func(*store.Tx) error { return nil }); err != nil {
		b.cfg.Log.Error("commit for acks failed", "err", err)
	}
	return <-done
}

// queueFull is the refusal of a send to a full queue.
func queueFull(harness string) *Error {
	return errorf(http.StatusServiceUnavailable, "service_unavailable", "%s session message queue is full", harness)
}

// Counts summarizes the store for STATUS= and doctor.
func (b *Bus) Counts() (store.Counts, error) {
	var c store.Counts
	err := b.cfg.Store.View(func(tx *store.Tx) error { c = tx.Counts(); return nil })
	return c, err
}
