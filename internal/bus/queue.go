package bus

import (
	"bytes"
	"context"
	"encoding/json"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/xmsg/xmsg/internal/jsonline"
	"github.com/xmsg/xmsg/internal/ledger"
	"github.com/xmsg/xmsg/internal/limits"
	"github.com/xmsg/xmsg/internal/store"
)

// queueState is what the bus knows about the queues of registered sessions beyond the store,
// which stays the durable truth (loaded again at start, and whenever a write bypassed the
// bus's bookkeeping):
//
//   - each loaded session's queue in memory (sessionQueue): the key and id of every
//     unacknowledged row, and the message itself for as many as a byte budget allows, so that
//     a poll hands out the head without a read transaction or a decode, an ack finds its row
//     without a scan, and a send to a full queue is refused before its write enters a shared
//     commit (a write failing inside a commit costs its whole batch a second pass);
//   - which messages were acknowledged but whose delete is not committed yet. An ack is
//     answered at once and its delete rides the next shared commit: delivery is at-least-once,
//     so an ack lost in a crash only means the message is delivered again.
//
// No store transaction's function ever takes mu: a read under mu (load) would otherwise
// deadlock with a commit waiting to remap the file.
type queueState struct {
	mu sync.Mutex
	s  map[string]*sessionQueue // per session, once loaded
	// cached is the bytes of messages held by the queues in s (at most totalBudget).
	cached int
	acked  map[string]map[string]ackOp // per session, by message id: acknowledged, delete not committed
	// failing is set while committing acks fails (a full disk): acks are then committed
	// before they are answered, so that an ack that cannot be stored is answered an error.
	failing bool
	// todo are the acks whose deletes wait for a commit (rideAcks). todoMu guards it alone:
	// it is taken under the store's lock, so nothing holding it may call the store.
	todoMu sync.Mutex
	todo   []ackOp
	wake   chan struct{} // buffered(1): todo was empty and is not
	done   chan struct{} // the flusher has exited
	// inFlight holds, by message id, the records queued in memory before their commit
	// (AcceptBatch), until that commit is done or failed.
	inFlight map[string]*pendingRecord
	// early holds, per session, the rows AcceptBatch queued in memory whose commit is not
	// done, in queue order: they come after every committed row (their keys are given by
	// the commit that writes them, after every key there now), and join rows once committed.
	early    map[string][]*earlyRow
	awaiting int // callers in awaitRecord now (tests)
	// testQueued, when set (tests), is called once AcceptBatch's rows are in the queue in
	// memory, before anything is done to commit them; testRecordErr, when set, fails the
	// write of their records in whatever commit carries them.
	testQueued    func()
	testRecordErr error
}

// pendingRecord is the records of one AcceptBatch, riding the next commit.
type pendingRecord struct {
	done  chan struct{} // closed once the commit that carried them is done, or failed
	err   error         // that commit's result, set before done is closed
	force chan struct{} // closed by whoever needs the records now (forceOnce)
	once  sync.Once
}

// now asks for the records' commit at once instead of at the end of their ride.
func (r *pendingRecord) now() { r.once.Do(func() { close(r.force) }) }

// earlyRow is a row of a session's queue held in memory before its commit (AcceptBatch).
type earlyRow struct {
	id, share string
	slot      *queueSlot // its key is set by the transaction that writes it
	m         *queuedMsg
	rec       *pendingRecord
	// failed is set once the commit that was to write it failed: the key its transaction
	// gave it was never stored, and may be given again (to this same message pulled again).
	failed atomic.Bool
}

// sessionQueue is one session's unacknowledged rows, in queue (key) order, plus the places
// reserved by writes not committed yet. rows holds at most MaxStored entries (what the store
// can hold for the session), and the messages kept in them at most cacheBudget bytes, so
// memory per session stays bounded whatever its senders do.
type sessionQueue struct {
	rows     []queueRow
	reserved int
	cached   int // bytes of the messages held in rows
	q        *queueState
}

type queueRow struct {
	key []byte
	id  string
	m   *queuedMsg // nil: not kept in memory, read from the store when it is polled
}

type queuedMsg struct {
	Queued
	createdAt int64
}

// cacheBudget bounds the bytes of messages one session's queue keeps in memory, and
// totalBudget those of all queues together (sessions whose registration ended without an
// Unregister, such as Codex leases, keep theirs until the purge); rows past either are read
// from the store when they reach the head. 100 messages of a few KiB fit.
var (
	cacheBudget = 512 << 10 // variables for tests
	totalBudget = 32 << 20
)

func (m *queuedMsg) size() int {
	return len(m.ID) + len(m.FromName) + len(m.Text) + len(m.Envelope) + len(m.Origin) + 96
}

type ackOp struct {
	session, id string
	key         []byte
	// early is a row acked before its commit (AcceptBatch): its key is the one that commit
	// gave it (rowKey), written by a transaction before the one that deletes it, or earlier
	// in the same one.
	early *earlyRow
	at    time.Time // when acknowledged
}

// rowKey is the key of the acked row. It is read inside a transaction's function: the
// commit that wrote an early row ran before (or earlier in the same transaction).
func (o ackOp) rowKey() []byte {
	if o.early != nil {
		if o.early.failed.Load() {
			return nil
		}
		return o.early.slot.key
	}
	return o.key
}

func (q *queueState) init() {
	q.s, q.acked, q.wake, q.done = map[string]*sessionQueue{}, map[string]map[string]ackOp{}, make(chan struct{}, 1), make(chan struct{})
	q.inFlight, q.early = map[string]*pendingRecord{}, map[string][]*earlyRow{}
}

// awaitRecord waits while message id is queued in memory and its record not committed, so
// that whoever got it from the queue and asks about it (a reply, a read) finds its record.
// It asks for that commit now rather than at the end of the records' ride: at most one
// commit's wait.
func (b *Bus) awaitRecord(id string) {
	b.q.mu.Lock()
	r := b.q.inFlight[id]
	if r != nil {
		b.q.awaiting++
	}
	b.q.mu.Unlock()
	if r == nil {
		return
	}
	r.now()
	<-r.done
	b.q.mu.Lock()
	b.q.awaiting--
	b.q.mu.Unlock()
}

// earlyIndex returns the position of message id among session's early rows, or -1. The
// caller holds q.mu.
func (q *queueState) earlyIndex(session, id string) int {
	return slices.IndexFunc(q.early[session], func(e *earlyRow) bool { return e.id == id })
}

// load returns session's queue, reading its rows from the store if it is not loaded. The
// caller holds q.mu, which keeps the flusher from forgetting an ack between the read and
// the install (the row would come back as unacknowledged).
func (b *Bus) load(session string) (*sessionQueue, error) {
	q := &b.q
	if sq := q.s[session]; sq != nil {
		return sq, nil
	}
	var keys []store.QueueKey
	if err := b.cfg.Store.View(func(tx *store.Tx) (err error) {
		keys, err = tx.QueueKeys(session)
		return err
	}); err != nil {
		return nil, err
	}
	sq := &sessionQueue{rows: make([]queueRow, 0, len(keys)), q: q}
	for _, k := range keys {
		if q.earlyIndex(session, k.ID) >= 0 {
			continue // committed just now: it joins rows when its commit is settled
		}
		if _, acked := q.acked[session][k.ID]; !acked {
			sq.rows = append(sq.rows, queueRow{key: k.Key, id: k.ID})
		}
	}
	q.s[session] = sq
	return sq, nil
}

// index returns the position of key in rows, and whether it is there.
func (sq *sessionQueue) index(key []byte) (int, bool) {
	return sort.Find(len(sq.rows), func(i int) int { return bytes.Compare(key, sq.rows[i].key) })
}

// remove drops rows[i].
func (sq *sessionQueue) remove(i int) {
	if m := sq.rows[i].m; m != nil {
		sq.cached -= m.size()
		sq.q.cached -= m.size()
	}
	sq.rows = slices.Delete(sq.rows, i, i+1)
}

// queueSlot is a place reserved in a session's queue for one write about to be committed
// (see reserve). Its methods may be called on a nil slot (no queued write), and do nothing.
type queueSlot struct {
	b       *Bus
	session string
	sq      *sessionQueue // the queue the place was taken in
	key     []byte        // set by enqueue, in the transaction
	p       *store.Pending
	settled bool
}

// reserve takes a place in session's queue for a write about to be committed: enqueue writes
// it in that commit's transaction, then committed (after the commit) or release (the write
// was not committed) settles it. A full queue is refused here, before any commit.
func (b *Bus) reserve(session string) (*queueSlot, error) {
	q := &b.q
	q.mu.Lock()
	defer q.mu.Unlock()
	sq, err := b.load(session)
	if err != nil {
		return nil, err
	}
	// Acknowledged rows not yet deleted still take room in the store (MaxStored).
	if n := len(sq.rows) + sq.reserved + len(q.early[session]); n >= store.MaxQueue || n+len(q.acked[session]) >= store.MaxStored {
		return nil, store.ErrQueueFull
	}
	sq.reserved++
	return &queueSlot{b: b, session: session, sq: sq}, nil
}

// enqueue writes p in tx (under the store's own bound, MaxStored, as a backstop, and the
// origin's share of the queue) and remembers its key. It runs inside a transaction's
// function, which may run more than once: the last run is the one committed.
func (s *queueSlot) enqueue(tx *store.Tx, p store.Pending) error {
	if p.Share == "" {
		p.Share = shareOf(p.Origin)
	}
	key, err := tx.EnqueueShare(p, store.MaxStored, s.b.cfg.Bounds.queueShare())
	s.key, s.p = key, &p
	return err
}

// Bounds are the limits on what one sender may take of what others share (issue 18).
type Bounds struct {
	// QueueShare is how many places of one queue (store.MaxQueue) one origin may hold: a
	// federation peer (whatever principals it names) or an attested local session (shareOf).
	// 0 = DefaultQueueShare; < 0 = no bound but the queue's.
	QueueShare int
}

// DefaultQueueShare is half a queue per origin (internal/limits), so that a second sender
// always finds room.
const DefaultQueueShare = limits.QueueMaxPerOrigin

func (b Bounds) queueShare() int { return limits.Or(b.QueueShare, DefaultQueueShare) }

// shareOf names the origin a queued row counts against, from the origin the bus recorded
// for it (docs/protocol.md §7.3): a federation peer by its name (the principals it names are
// its own to choose), a local session by its attested id. Anonymous senders on http.sock
// (the owner's own processes, under names of their choosing) and rows without an origin
// count against no share, only the queue's bound.
func shareOf(origin json.RawMessage) string {
	if len(origin) == 0 {
		return ""
	}
	o, ok := quickOrigin(origin)
	if !ok {
		if o = (originFields{}); json.Unmarshal(origin, &o) != nil {
			return ""
		}
	}
	switch o.Kind {
	case "fed":
		return "fed:" + o.Host
	case "local":
		if o.SessionID != "" {
			return "local:" + o.Harness + ":" + o.SessionID
		}
	}
	return ""
}

// originFields is what a share is read from.
type originFields struct{ Kind, Host, Harness, SessionID string }

// quickOrigin reads origin as json.Unmarshal would into originFields, in one pass, where it
// is the shape this daemon writes (a flat object, plain string values, the fields under their
// own spelling, other keys skipped; a repeated key's last value counts, as there): shareOf
// runs in every queued send's transaction. ok is false for anything else, left to
// json.Unmarshal (FuzzQuickOrigin holds them equal).
func quickOrigin(origin []byte) (o originFields, ok bool) {
	if !utf8.Valid(origin) {
		return o, false
	}
	ok = jsonline.EachString(origin, func(key, val string) bool {
		switch key {
		case "kind":
			o.Kind = val
		case "host":
			o.Host = val
		case "harness":
			o.Harness = val
		case "sessionId":
			o.SessionID = val
		default:
			// json.Unmarshal matches a field's name whatever its case: such a key is
			// its to read, any other it skips.
			for _, name := range [...]string{"kind", "host", "harness", "sessionid"} {
				if strings.EqualFold(key, name) {
					return false
				}
			}
		}
		return true
	})
	return o, ok
}

// shareFull is the refusal of a row whose origin holds its share of the queue: a full queue,
// as far as that sender can tell, said so.
func shareFull(harness string, share int) *Error {
	return errorf(ledger.ServiceUnavailable, "%s session message queue is full for this sender (%d of %d places per sender)", harness, share, store.MaxQueue)
}

// committed settles s after its write was committed: the row joins the queue in memory (in
// key order: concurrent writers settle in any order), unless the queue was loaded again
// since, from a store that already holds it.
func (s *queueSlot) committed() {
	if s == nil || s.settled {
		return
	}
	s.settled = true
	q := &s.b.q
	q.mu.Lock()
	defer q.mu.Unlock()
	if s.sq.reserved > 0 {
		s.sq.reserved--
	}
	m := &queuedMsg{Queued: Queued{ID: s.p.ID, FromName: s.p.FromName, Text: s.p.Text, Envelope: s.p.Envelope, Origin: s.p.Origin}, createdAt: s.p.CreatedAt}
	q.join(s.session, s.key, m)
}

// join puts a committed row (key, m) in session's queue in memory, in key order, unless the
// queue is not loaded or was loaded again since, from a store that already holds it. The
// caller holds q.mu.
func (q *queueState) join(session string, key []byte, m *queuedMsg) {
	sq := q.s[session]
	if sq == nil || key == nil {
		return // forgotten: the next load reads the row from the store
	}
	i, found := sq.index(key)
	if found {
		return
	}
	row := queueRow{key: key, id: m.ID}
	if sz := m.size(); sq.cached+sz <= cacheBudget && q.cached+sz <= totalBudget {
		row.m = m
		sq.cached += sz
		q.cached += sz
	}
	sq.rows = slices.Insert(sq.rows, i, row)
}

// settleEarly ends the ride of rec's rows, of session: after a commit that stored them
// (err nil) each one not acked meanwhile joins the committed rows under the key that commit
// gave it; after a failed one they leave the queue in memory, which so claims no row the
// store lacks (their senders' copies are still held elsewhere: a leaf's hub hands them out
// again, since its puller acks nothing there for a failed commit).
func (b *Bus) settleEarly(session string, rec *pendingRecord, rows []*earlyRow, err error) {
	q := &b.q
	if err != nil {
		for _, e := range rows {
			e.failed.Store(true)
		}
	}
	q.mu.Lock()
	for _, e := range rows {
		if i := q.earlyIndex(session, e.id); i >= 0 && q.early[session][i] == e {
			q.early[session] = slices.Delete(q.early[session], i, i+1)
			if err == nil {
				q.join(session, e.slot.key, e.m)
			}
		} else if a := q.acked[session]; err != nil && a != nil && a[e.id].early == e {
			// Acked before its commit, which failed: the ack's delete (still to come) finds
			// nothing, and the row, pulled again, may be acked again meanwhile.
			delete(a, e.id)
			if len(a) == 0 {
				delete(q.acked, session)
			}
		}
		if q.inFlight[e.id] == rec {
			delete(q.inFlight, e.id)
		}
	}
	if len(q.early[session]) == 0 {
		delete(q.early, session)
	}
	rec.err = err
	q.mu.Unlock()
	close(rec.done)
}

// earlyShare counts session's rows of share that are riding a commit, queued or acked: the
// commit that writes them counts them in the store (EnqueueShare). The caller holds q.mu.
func (q *queueState) earlyShare(session, share string) int {
	n := 0
	for _, e := range q.early[session] {
		if e.share == share {
			n++
		}
	}
	for _, o := range q.acked[session] {
		if o.early != nil && o.early.share == share && q.inFlight[o.id] == o.early.rec {
			n++
		}
	}
	return n
}

// release gives s's place back: its write was not committed (or not queued). After
// committed it does nothing.
func (s *queueSlot) release() {
	if s == nil || s.settled {
		return
	}
	s.settled = true
	s.b.q.mu.Lock()
	if s.sq.reserved > 0 {
		s.sq.reserved--
	}
	s.b.q.mu.Unlock()
}

// uncounted forgets session's queue after a write that enqueued without a reservation (the
// federation and agy paths, bounded by Tx.Enqueue): it is loaded again from the store.
func (b *Bus) uncounted(session string) {
	b.q.mu.Lock()
	if sq := b.q.s[session]; sq != nil {
		b.q.cached -= sq.cached
		delete(b.q.s, session)
	}
	b.q.mu.Unlock()
}

// forgetCounts forgets every queue after rows were deleted behind the bus's back (retention).
func (b *Bus) forgetCounts() {
	b.q.mu.Lock()
	clear(b.q.s)
	b.q.cached = 0
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
	var q *Queued
	_, err := b.queues.Until(ctx, r.SessionID, min(wait, MaxWait), func() (bool, error) {
		for {
			m, key, err := b.head(r.SessionID)
			if err != nil || m == nil {
				return false, err
			}
			if key == nil || !b.expired(m.createdAt) { // (a row not committed yet is new)
				head := m.Queued
				q = &head
				return true, nil
			}
			// Past the TTL: it must not be delivered. Drop it now rather than wait for the
			// purge, and look at the next one.
			if err := b.cfg.Store.Update(func(tx *store.Tx) error { return tx.UnqueueID(key, m.ID) }); err != nil {
				return false, err
			}
			b.q.mu.Lock()
			if sq := b.q.s[r.SessionID]; sq != nil {
				if i, found := sq.index(key); found {
					sq.remove(i)
				}
			}
			b.q.mu.Unlock()
			b.acks.Fire(m.ID) // no longer queued: OnAcked
		}
	})
	if err == nil && q == nil && ctx.Err() != nil {
		return nil, ctx.Err()
	}
	return q, err
}

// NotifyQueuedThen has f called when something may have been queued for r's session (what
// wakes a waiting Poll), unless the returned func comes first; f runs on the queuing
// goroutine under the queue's wake-up lock and must be quick. What f returns (nil: nothing)
// that goroutine does once the lock is released, before its own answer, holding no lock of the
// bus (wake.Set.NotifyThen): register.sock's waiting poll answered by the goroutine that queued
// its message, no goroutine woken for it. A Poll(ctx, r, 0) after NotifyQueuedThen sees a
// message or f is called for it: a waiter that is not a goroutine of its own loses no wakeup.
func (r *Registration) NotifyQueuedThen(f func() func()) (cancel func()) {
	return r.bus.queues.NotifyThen(r.SessionID, f)
}

// head returns the oldest unacknowledged message of session and its key, or nil. A message
// not kept in memory is read from the store, outside q.mu.
func (b *Bus) head(session string) (*queuedMsg, []byte, error) {
	for {
		b.q.mu.Lock()
		sq, err := b.load(session)
		if err != nil {
			b.q.mu.Unlock()
			return nil, nil, err
		}
		if len(sq.rows) == 0 {
			// Rows whose commit is not done come after every committed one; they have no
			// key yet.
			var m *queuedMsg
			if early := b.q.early[session]; len(early) > 0 {
				m = early[0].m
			}
			b.q.mu.Unlock()
			return m, nil, nil
		}
		row := sq.rows[0]
		b.q.mu.Unlock()
		if row.m != nil {
			return row.m, row.key, nil
		}
		var p store.Pending
		var found bool
		if err := b.cfg.Store.View(func(tx *store.Tx) (err error) {
			p, found, err = tx.QueueRow(row.key)
			return err
		}); err != nil {
			return nil, nil, err
		}
		if found {
			return &queuedMsg{Queued: Queued{ID: p.ID, FromName: p.FromName, Text: p.Text, Envelope: p.Envelope, Origin: p.Origin}, createdAt: p.CreatedAt}, row.key, nil
		}
		// Deleted behind the bus's back (retention, before it forgot the queues): read the
		// queue again.
		b.uncounted(session)
	}
}

// Ack removes messageID from r's queue if it is there; acking anything else changes nothing.
// It returns before the delete is committed (see queueState), unless committing acks is
// failing: then the ack is committed first, and answered an error if that fails too. The
// ack's event (and so its audit line) goes to ctx's WithAfter, as a send's does: register.sock
// announces it once the answer is out, off the consumer's wait.
func (b *Bus) Ack(ctx context.Context, r *Registration, messageID string) error {
	q := &b.q
	q.mu.Lock()
	if _, ok := q.acked[r.SessionID][messageID]; ok {
		q.mu.Unlock()
		return nil
	}
	// Under q.mu, so two acks of one message count once; the flusher forgets an ack only
	// after its delete is committed, so the message is either in acked or (if at all) queued.
	sq, err := b.load(r.SessionID)
	if err != nil {
		q.mu.Unlock()
		return err
	}
	i := slices.IndexFunc(sq.rows, func(row queueRow) bool { return row.id == messageID }) // the head, mostly
	e := -1
	if i < 0 {
		if e = q.earlyIndex(r.SessionID, messageID); e < 0 {
			q.mu.Unlock()
			return nil
		}
	}
	if b.cfg.Store.Closed() {
		q.mu.Unlock()
		return store.ErrClosed // it could never be committed: the client must not believe it was
	}
	var row queueRow
	var op ackOp
	if e >= 0 {
		er := q.early[r.SessionID][e]
		if q.failing {
			// An ack committed before its answer needs the row's own commit first: ask for
			// it, and ack the row where that leaves it.
			q.mu.Unlock()
			b.awaitRecord(messageID)
			return b.Ack(ctx, r, messageID)
		}
		op = ackOp{session: r.SessionID, id: messageID, early: er}
		q.early[r.SessionID] = slices.Delete(q.early[r.SessionID], e, e+1)
		if len(q.early[r.SessionID]) == 0 {
			delete(q.early, r.SessionID)
		}
	} else {
		row = sq.rows[i]
		op = ackOp{session: r.SessionID, id: messageID, key: row.key}
		sq.remove(i)
	}
	if q.acked[r.SessionID] == nil {
		q.acked[r.SessionID] = map[string]ackOp{}
	}
	q.acked[r.SessionID][messageID] = op
	failing := q.failing
	if !failing {
		op.at = time.Now() // the flusher makes a commit for it if none comes in time
		q.todoMu.Lock()
		first := len(q.todo) == 0
		q.todo = append(q.todo, op)
		q.todoMu.Unlock()
		if first {
			b.wakeFlusher() // to make a commit should none come
		}
	}
	q.mu.Unlock()
	if !failing && b.cfg.Leaf != nil {
		// A leaf's puller waits for this ack to ack the hub (OnAcked), not for its commit:
		// the row stays in this store until the delete commits, so a crash before that
		// delivers it again from here, as for any ack (at-least-once), and loses nothing.
		b.acks.Fire(messageID)
	}
	if failing {
		// Committed before the answer, outside q.mu: a commit's rider takes q.mu when done.
		err := b.cfg.Store.Update(func(tx *store.Tx) error { return tx.UnqueueID(op.rowKey(), op.id) })
		q.mu.Lock()
		if err != nil {
			// Queued again, as if never acknowledged: it comes again.
			delete(q.acked[r.SessionID], messageID)
			if sq := q.s[r.SessionID]; sq != nil {
				if j, found := sq.index(row.key); !found {
					row.m = nil // read from the store again: the budget is not rechecked here
					sq.rows = slices.Insert(sq.rows, j, row)
				}
			}
			q.mu.Unlock()
			return err
		}
		delete(q.acked[r.SessionID], messageID)
		if len(q.acked[r.SessionID]) == 0 {
			delete(q.acked, r.SessionID)
		}
		q.failing = false // this commit worked: back to acks that ride the next commit
		q.mu.Unlock()
		b.acks.Fire(messageID)
		b.auditAck(ctx, r, messageID)
		return nil
	}
	b.auditAck(ctx, r, messageID)
	return nil
}

// auditAck announces an ack that removed a message (its audit line is the stream's audit
// sink's), now or through ctx's WithAfter.
func (b *Bus) auditAck(ctx context.Context, r *Registration, messageID string) {
	later(ctx, func() {
		b.cfg.Events.Emit(ledger.Event{Kind: ledger.Acked, Request: "ack", Transport: ledger.Register, From: r.Caller().Actor(),
			MessageID: messageID, Harness: r.Harness, Outcome: ledger.Delivered})
	})
}

// ackRide is how long acknowledged deletes wait for a commit that is made anyway (a send's)
// before the flusher asks for one of their own.
const ackRide = 5 * time.Millisecond

// rideAcks is the store's Rider: every commit, whoever makes it, takes the acknowledged
// deletes waiting then (with AckDelay, those older than it). It runs under the store's lock
// and takes only q.todoMu.
func (b *Bus) rideAcks() (func(*store.Tx) error, func(error)) {
	ops := b.takeAcks(false)
	if len(ops) == 0 {
		return nil, nil
	}
	return func(tx *store.Tx) error {
		for _, o := range ops {
			if err := tx.UnqueueID(o.rowKey(), o.id); err != nil {
				return err
			}
		}
		return nil
	}, func(err error) { b.acksCommitted(ops, err) }
}

// takeAcks takes the acks waiting for a commit: all of them, or (without all) those past
// AckDelay.
func (b *Bus) takeAcks(all bool) []ackOp {
	q := &b.q
	q.todoMu.Lock()
	defer q.todoMu.Unlock()
	if len(q.todo) == 0 {
		return nil
	}
	n := len(q.todo)
	if d := b.cfg.AckDelay; d > 0 && !all {
		// The test knob: stands for a crash right after the ack.
		cutoff := time.Now().Add(-d)
		n = 0
		for n < len(q.todo) && !q.todo[n].at.After(cutoff) {
			n++
		}
	}
	ops := q.todo[:n:n]
	q.todo = q.todo[n:]
	if len(q.todo) == 0 {
		q.todo = nil
	}
	return ops
}

// acksCommitted records the outcome of the commit that carried ops.
func (b *Bus) acksCommitted(ops []ackOp, err error) {
	q := &b.q
	q.mu.Lock()
	defer q.mu.Unlock()
	if err != nil {
		// Still acknowledged in memory (not delivered again while the daemon runs); retried
		// with the next commit (or at Close), and meanwhile acks are committed before they
		// are answered.
		b.cfg.Log.Error("committing acks failed", "acks", len(ops), "err", err)
		q.todoMu.Lock()
		q.todo = append(ops, q.todo...)
		q.todoMu.Unlock()
		q.failing = true
		return
	}
	q.failing = false
	for _, o := range ops {
		b.acks.Fire(o.id) // committed: OnAcked (a leaf's forwarded ack)
		if a := q.acked[o.session]; a != nil && a[o.id].early == o.early {
			// (An early row whose record failed may be queued and acked again under its id
			// meanwhile: that later ack is not this one.)
			delete(a, o.id)
			if len(a) == 0 {
				delete(q.acked, o.session)
			}
		}
	}
}

func (b *Bus) wakeFlusher() {
	select {
	case b.q.wake <- struct{}{}:
	default:
	}
}

// flushAcks makes a commit for acknowledged deletes that no other commit carried within
// ackRide (or AckRide, or AckDelay) of their ack. It runs until Close, then commits what is
// left.
func (b *Bus) flushAcks() {
	q := &b.q
	defer close(q.done)
	wait := ackRide
	if b.cfg.AckRide > 0 {
		wait = b.cfg.AckRide
	}
	if b.cfg.AckDelay > 0 {
		wait = b.cfg.AckDelay
	}
	t := time.NewTimer(time.Hour)
	t.Stop()
	for {
		select {
		case <-q.wake:
		case <-b.stop:
			b.forceAcks(true)
			return
		}
		for {
			q.todoMu.Lock()
			var oldest time.Time
			waiting := len(q.todo) > 0
			if waiting {
				oldest = q.todo[0].at
			}
			q.todoMu.Unlock()
			if !waiting {
				break // every ack rode a commit
			}
			if d := time.Until(oldest.Add(wait)); d > 0 {
				t.Reset(d)
				select {
				case <-t.C:
				case <-b.stop:
					t.Stop()
					b.forceAcks(true)
					return
				}
				continue
			}
			if err := b.forceAcks(false); err != nil {
				break // retried with the next commit, the next ack, or at Close
			}
		}
	}
}

// forceAcks makes a commit if acks are waiting (all: every one, whatever AckDelay says).
func (b *Bus) forceAcks(all bool) error {
	q := &b.q
	q.todoMu.Lock()
	waiting := len(q.todo) > 0
	q.todoMu.Unlock()
	if !waiting {
		return nil
	}
	if all {
		ops := b.takeAcks(true)
		err := b.cfg.Store.Update(func(tx *store.Tx) error {
			for _, o := range ops {
				if err := tx.UnqueueID(o.rowKey(), o.id); err != nil {
					return err
				}
			}
			return nil
		})
		b.acksCommitted(ops, err)
		return err
	}
	// The commit takes them (rideAcks).
	err := b.cfg.Store.Update(func(*store.Tx) error { return nil })
	if err != nil {
		b.cfg.Log.Error("commit for acks failed", "err", err)
	}
	return err
}

// queueFull is the refusal of a send to a full queue.
func queueFull(harness string) *Error {
	return errorf(ledger.ServiceUnavailable, "%s session message queue is full", harness)
}

// Counts is what the bus holds, for STATUS=, doctor and metrics: the store's rows and the
// live registrations.
type Counts struct {
	store.Counts
	Registrations int
	Waiters       int // reply long-polls waiting now (of MaxWaiters)
}

// Counts summarizes the store and the registrations.
func (b *Bus) Counts() (Counts, error) {
	c := Counts{Registrations: len(b.liveRegistrations()), Waiters: len(b.waiters)}
	err := b.cfg.Store.View(func(tx *store.Tx) error { c.Counts = tx.Counts(); return nil })
	return c, err
}

// OnAcked has f called once messageID no longer waits in sessionID's queue (its
// service acked it, or retention dropped it; an ack counts once it is answered, before its
// delete is committed, for the row stays in the store until then and a crash delivers it
// again from there): at once, on the caller's goroutine, when that is so already; else on the
// goroutine whose ack (or drop past the TTL) ends the wait, under the bus's locks, so f must
// be quick and must not call the bus. No goroutine waits meanwhile: a leaf holds up to a
// window of rows, and a goroutine, a timer and a wake-up each cost its one P more than the
// row's ack itself. Unless cancel comes first, f is called once. The purge of expired rows
// signals nothing: a caller that holds a row for long asks again now and then (another
// OnAcked, called at once for a row that is gone).
func (b *Bus) OnAcked(sessionID, messageID string, f func()) (cancel func(), err error) {
	var once sync.Once
	call := func() { once.Do(f) }
	cancel = b.acks.Notify(messageID, call)
	// After subscribing: an ack from now on calls f, one before it is seen here.
	b.q.mu.Lock()
	_, acked := b.q.acked[sessionID][messageID]
	// A row queued in memory before its commit is queued, though the store lacks it.
	queued := b.q.earlyIndex(sessionID, messageID) >= 0
	b.q.mu.Unlock()
	if !acked && !queued {
		err = b.cfg.Store.View(func(tx *store.Tx) (err error) {
			queued, err = tx.Queued(sessionID, messageID)
			return err
		})
	}
	if err != nil || acked || !queued {
		cancel()
		if err == nil {
			call()
		}
		return func() {}, err
	}
	return cancel, nil
}
