// Package hub is the hub side of leaf nodes (docs/protocol.md §7.5, §8.4): a mailbox per leaf
// peer, which a send to a leaf's ref fills, and which the leaf drains over the federation
// link (GET and POST /fed/v2/inbox), acknowledging each row only once its service has
// acknowledged it. A mailbox is bounded (a leaf that stopped pulling cannot make the hub's
// database grow without end), its long-polls wake when mail comes, and an ack marks the
// message delivered. What a row is on the wire is internal/fed's; the leaf side is
// internal/leaf's.
package hub

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/xmsg/xmsg/internal/bus"
	"github.com/xmsg/xmsg/internal/envelope"
	"github.com/xmsg/xmsg/internal/harness/svc"
	"github.com/xmsg/xmsg/internal/jsonline"
	"github.com/xmsg/xmsg/internal/ledger"
	"github.com/xmsg/xmsg/internal/limits"
	"github.com/xmsg/xmsg/internal/records"
	"github.com/xmsg/xmsg/internal/store"
	"github.com/xmsg/xmsg/internal/wake"
)

// MaxWait caps an inbox long-poll, as every long-poll (bus.MaxWait).
const MaxWait = bus.MaxWait

// Mailboxes are a hub's mailboxes, one per leaf peer. Safe for concurrent use.
type Mailboxes struct {
	store         *store.Store
	log           *slog.Logger
	max, maxBytes int
	wake          wake.Set // keyed by peer
	// Events is where a leaf's acks and rejects are announced (nil: nowhere); set before use.
	Events *ledger.Stream
	// settling holds, per peer, the rows a leaf acked or rejected whose delete waits for a
	// commit (settle): they are never handed out again meanwhile.
	mu       sync.Mutex
	settling map[string]map[string]bool
	// handed holds, per peer, the stream the leaf pulls on and the rows handed out on it that
	// it has not settled yet: a leaf that pulls its next batch while its service still works
	// on the last is not handed those rows again. A pull on another stream, or on none, starts
	// over: every row not settled is handed out again (the leaf knows each by its id).
	handed map[string]*stream
	// wire holds, per peer, the rows of its mailbox as a pull hands them out (a Row's JSON),
	// encoded once when the mail is put: a pull then reads no row and decodes nothing. It is
	// a cache of the mailbox, never more: a row not in it is read from the store, and an entry
	// whose row is gone is never handed out (a pull takes its ids from the store). Its bytes
	// are bounded in all (wireCap), its entries per peer by the mailbox's bound.
	wire      map[string]map[string][]byte
	wireBytes int
	// fullAt holds, per peer, that a commit found its mailbox full, and when: mail for it is
	// refused before any commit (as a full service queue is) until a settle of its rows
	// (settles moves on) or fullFor passes. Without it every send to a full mailbox (an
	// offline leaf's, most often) costs a write transaction that scans the mailbox and
	// fails, and its batch a second pass (or, alone, a commit of nothing).
	fullAt map[string]fullMark
	// settles counts, per peer, the settles that removed rows of its mailbox (under mu): a
	// mark taken before a commit that found the mailbox full holds only while it is the same.
	settles map[string]uint64
}

// fullMark is a commit's finding that a peer's mailbox is full: the peer's settle count
// before that commit, when it was found, and, where only the bound on bytes refused the row,
// that row's size (0: full in rows, no row fits): a row at least as big is refused too.
type fullMark struct {
	settles uint64
	at      time.Time
	size    int
}

// fullFor is how long a mailbox found full is taken to be so without a settle: rows a
// retention purge removes (it says nothing to the mailboxes) make room at most this late.
// (A variable for the tests.)
var fullFor = time.Second

// wireCap bounds the encoded rows the mailboxes keep in memory, all leaves together: past it
// a row is read from the store when pulled, which is slower, never wrong.
const wireCap = 16 << 20

// stream is one leaf's pull stream: the rows handed out on it, not settled yet.
type stream struct {
	name string
	ids  map[string]bool
}

// pruneHanded is how many handed ids a stream holds before those whose rows are gone (a
// retention purge removes rows nobody settled) are dropped: ids are added only for rows in
// the mailbox, so after a prune a stream holds at most the mailbox's rows.
const pruneHanded = 4 * 256

// settleRide is how long a settled row's delete waits for a commit made anyway (a send's, most
// often the next mail's) before a commit is made for it. Nothing waits for that commit (the
// leaf was answered, the row is out of every batch), so it may be long enough that a hub
// whose CPUs are all busy, where a 5 ms timer fires before the next commit is scheduled,
// still makes no commit of its own for it.
const settleRide = 50 * time.Millisecond

// New returns the mailboxes kept in st, each bounded to max messages and maxBytes of stored
// rows (0: limits.LeafMailboxMax and LeafMailboxMaxBytes; < 0: no bound).
func New(st *store.Store, log *slog.Logger, max, maxBytes int) *Mailboxes {
	return &Mailboxes{store: st, log: log, max: limits.Or(max, limits.LeafMailboxMax), maxBytes: limits.Or(maxBytes, limits.LeafMailboxMaxBytes)}
}

// Put queues mail for its leaf peer: the message row, its outbound row (outcome queued), the
// mail and the sender's idempotency record (idem, nil for none) commit together, and the
// leaf's long-poll wakes. wire is the mail's row as a pull hands it out (EncodeRow; nil: made
// here from the mail). A full mailbox is refused like a full service queue: the leaf is
// behind, the sender may retry.
func (m *Mailboxes) Put(mail store.MailboxEntry, wire []byte, msg store.Message, out store.Outbound, idem *store.Idem) error {
	m.mu.Lock()
	mark := m.settles[mail.Peer]
	f, known := m.fullAt[mail.Peer]
	if known && (f.settles != mark || time.Since(f.at) >= fullFor) {
		delete(m.fullAt, mail.Peer)
		known = false
	}
	m.mu.Unlock()
	if known && (f.size == 0 || store.MailboxRowSize(mail) >= f.size) {
		return m.full(mail.Peer)
	}
	err := m.store.Update(func(tx *store.Tx) error { return records.Mailed(tx, mail, m.max, m.maxBytes, msg, out, idem) })
	if errors.Is(err, store.ErrMailboxFull) {
		// The mark is the one taken before the commit: a settle since (its deletes in a
		// commit after this one) has moved on from it, and the next put goes to the store.
		f := fullMark{settles: mark, at: time.Now()}
		if errors.Is(err, store.ErrMailboxBytes) {
			f.size = store.MailboxRowSize(mail) // a smaller row may fit
		}
		m.mu.Lock()
		if m.fullAt == nil {
			m.fullAt = map[string]fullMark{}
		}
		m.fullAt[mail.Peer] = f
		m.mu.Unlock()
		return m.full(mail.Peer)
	}
	if err != nil {
		return err
	}
	if wire == nil {
		wire, _ = EncodeRow(RowOf(mail))
	}
	if wire != nil {
		m.mu.Lock()
		m.keepWire(mail.Peer, mail.ID, wire)
		m.mu.Unlock()
	}
	if m.wake.Fire(mail.Peer) && m.store.Quiet() {
		// The woken pull is next on this goroutine's P and would run only once this sender
		// blocks (its answer, its audit line, its next read): tens of microseconds that
		// another P's thread, on a busy machine, often does not take from it. A sender alone
		// with the store lets it run now. With other writers about, the pull is seldom idle
		// and a yield would be a switch for nothing (measured: docs/performance.md §5).
		runtime.Gosched()
	}
	return nil
}

// keepWire keeps w as the wire row of peer's mail id, if the cache has room for it. Call with
// m.mu held.
func (m *Mailboxes) keepWire(peer, id string, w []byte) {
	rows := m.wire[peer]
	if m.wireBytes+len(w) > wireCap || len(rows) >= m.wireRows() {
		return
	}
	if rows == nil {
		if m.wire == nil {
			m.wire = map[string]map[string][]byte{}
		}
		rows = map[string][]byte{}
		m.wire[peer] = rows
	}
	if old, ok := rows[id]; ok {
		m.wireBytes -= len(old)
	}
	rows[id] = w
	m.wireBytes += len(w)
}

// dropWire forgets the wire rows of peer's ids. Call with m.mu held.
func (m *Mailboxes) dropWire(peer string, ids []string) {
	rows := m.wire[peer]
	for _, id := range ids {
		if w, ok := rows[id]; ok {
			m.wireBytes -= len(w)
			delete(rows, id)
		}
	}
	if rows != nil && len(rows) == 0 {
		delete(m.wire, peer)
	}
}

// wireRows is how many wire rows one peer's cache holds at most: its mailbox's bound. Rows
// that retention removed, never settled, are pruned once it is reached (pruneWire).
func (m *Mailboxes) wireRows() int {
	if m.max > 0 {
		return m.max
	}
	return pruneHanded
}

// pruneWire drops peer's wire rows whose mail is gone, once the cache holds its bound for
// peer. Call with m.mu held.
func (m *Mailboxes) pruneWire(tx *store.Tx, peer string) {
	rows := m.wire[peer]
	if len(rows) < m.wireRows() {
		return
	}
	var gone []string
	for id := range rows {
		if !tx.InMailbox(peer, id) {
			gone = append(gone, id)
		}
	}
	m.dropWire(peer, gone)
}

// full is the refusal of mail for a leaf whose mailbox holds its bound.
func (m *Mailboxes) full(peer string) *bus.Error {
	var bounds []string
	if m.max > 0 {
		bounds = append(bounds, fmt.Sprintf("%d messages", m.max))
	}
	if m.maxBytes > 0 {
		bounds = append(bounds, fmt.Sprintf("%d bytes", m.maxBytes))
	}
	return &bus.Error{Code: ledger.ServiceUnavailable, Detail: fmt.Sprintf("mailbox of leaf '%s' is full (%s)", peer, strings.Join(bounds, " or "))}
}

// Wire is a row of a leaf's mailbox as a pull hands it out: its id, and its JSON, a Row's
// encoding (EncodeRow), shared with the mailboxes' cache and never to be changed.
type Wire struct {
	ID   string
	JSON []byte
}

// Pull returns the oldest mail of leaf peer without removing it, as the leaf gets it (each
// row encoded when its mail was put, or, for a row the cache does not hold, now): at most
// maxN rows and, past the first, maxBytes of stored rows (<= 0: no bound), waiting up to wait
// (at most MaxWait) for one; nil when none came. On streamName (not ""), rows handed out on it before
// and not settled since are passed over, and those returned are counted as handed; a pull
// on another stream, or on none, hands out every row not settled again. The leaf must start
// a new stream whenever an answer may have been lost (a failed pull), and whenever it could
// not take a row it was handed: those rows come again only on a new stream.
func (m *Mailboxes) Pull(ctx context.Context, peer, streamName string, wait time.Duration, maxN, maxBytes int) ([]Wire, error) {
	return m.pull(ctx, peer, streamName, wait, maxN, maxBytes, followed{})
}

// ErrRestream is a followed pull that ended before its leaf read all it was handed (the
// leaf's peers file changed under it): those rows come again only on a new stream.
var ErrRestream = errors.New("hub: the followed pull ended early; its stream starts over")

// Unhand forgets that ids were handed out on peer's stream streamName (when it is still its
// stream): a followed pull that took them but ends before writing them (fed's follow) gives
// them back, so that the same stream hands them out again.
func (m *Mailboxes) Unhand(peer, streamName string, ids []string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if cur := m.handed[peer]; cur != nil && cur.name == streamName {
		for _, id := range ids {
			delete(cur.ids, id)
		}
	}
}

// ErrSuperseded ends a followed stream (Follow) that is no longer its leaf's stream: the leaf
// pulled on another one since, which started over.
var ErrSuperseded = errors.New("hub: the leaf pulls on another stream now")

// Follow is Pull for a stream a pull follows (fed's follow: one answer, a line per batch): it
// hands out no more than window rows not settled on streamName in all, waiting up to wait
// for mail and for room (a settle makes room, and wakes it); nil when neither came. The
// follow's first call (open) makes streamName peer's stream, as Pull does; every later one
// fails with ErrSuperseded once it is no longer, so that two pulls on two streams of one
// leaf never hand its rows out again and again in turn.
func (m *Mailboxes) Follow(ctx context.Context, peer, streamName string, open bool, wait time.Duration, window, maxBytes int) ([]Wire, error) {
	return m.pull(ctx, peer, streamName, wait, window, maxBytes, followed{window: window, open: open})
}

// followed is how a followed stream's batch is taken (Follow); the zero value: a pull's.
type followed struct {
	window int  // rows handed out and not settled at most; 0: no bound but the batch's
	open   bool // the follow's first batch: it may start the stream
}

func (m *Mailboxes) pull(ctx context.Context, peer, streamName string, wait time.Duration, maxN, maxBytes int, fw followed) ([]Wire, error) {
	var rows []Wire
	err := m.batch(ctx, peer, streamName, wait, maxN, maxBytes, fw, func(id string, w, v []byte) error {
		if w != nil {
			rows = append(rows, Wire{ID: id, JSON: w})
			return nil
		}
		e, err := store.DecodeMailbox(v)
		if err != nil {
			return err
		}
		if w, err = EncodeRow(RowOf(e)); err != nil {
			return err
		}
		rows = append(rows, Wire{ID: id, JSON: w})
		m.keepWire(peer, id, w)
		return nil
	})
	return rows, err
}

// batch waits up to wait for mail of peer and takes its oldest rows as Pull says, each row
// once, in order, with m.mu held: take gets its wire row from the cache (w), or nil and the
// stored row (v, valid during the call). A followed stream (fw.window > 0) hands out at most
// fw.window rows not settled, and past its first batch must still be peer's stream.
func (m *Mailboxes) batch(ctx context.Context, peer, streamName string, wait time.Duration, maxN, maxBytes int, fw followed, take func(id string, w, v []byte) error) error {
	if maxBytes <= 0 {
		maxBytes = math.MaxInt
	}
	_, err := m.wake.Until(ctx, peer, min(wait, MaxWait), func() (bool, error) {
		n := 0
		err := m.store.View(func(tx *store.Tx) error {
			m.mu.Lock()
			defer m.mu.Unlock()
			if fw.window > 0 && !fw.open {
				if cur := m.handed[peer]; cur == nil || cur.name != streamName {
					return ErrSuperseded
				}
			}
			settling, handed := m.settling[peer], m.stream(tx, peer, streamName)
			limit := maxN
			if fw.window > 0 {
				fw.open = false // the stream is peer's now: a later look is no first batch
				if limit = min(maxN, fw.window-len(handed)); limit <= 0 {
					return nil // no room: a settle wakes the wait
				}
			}
			m.pruneWire(tx, peer)
			wire, size := m.wire[peer], 0
			return tx.MailboxScan(peer, func(key, v []byte) (bool, error) {
				if n >= limit {
					return false, nil
				}
				if settling[string(key)] || handed[string(key)] {
					return true, nil
				}
				if size += len(v); n > 0 && size > maxBytes {
					return false, nil
				}
				id := string(key)
				if err := take(id, wire[id], v); err != nil {
					return false, err
				}
				n++
				if handed != nil {
					handed[id] = true
				}
				return true, nil
			})
		})
		return n > 0, err
	})
	return err
}

// stream returns the ids handed out on peer's stream name, making it peer's current stream
// (nil for name "": no stream, and none kept). Call with m.mu held.
func (m *Mailboxes) stream(tx *store.Tx, peer, name string) map[string]bool {
	cur := m.handed[peer]
	if name == "" {
		delete(m.handed, peer)
		return nil
	}
	if cur == nil || cur.name != name {
		if m.handed == nil {
			m.handed = map[string]*stream{}
		}
		cur = &stream{name: name, ids: map[string]bool{}}
		m.handed[peer] = cur
	}
	if len(cur.ids) > pruneHanded {
		for id := range cur.ids {
			if !tx.InMailbox(peer, id) {
				delete(cur.ids, id)
			}
		}
	}
	return cur.ids
}

// Ack deletes the mail ids from leaf peer's mailbox and marks each delivered: the leaf acks
// only after its service acknowledged the message. Only that peer's mailbox is searched; ids
// not there (acked before) are skipped. It returns how many it took: their deletes ride the
// next commit (settle), so a count answered is of rows taken, not yet of rows committed; a
// failed commit hands them out again, and the leaf, knowing each by its id, acks it again.
func (m *Mailboxes) Ack(peer string, ids []string) (int, error) {
	return m.settle(peer, ids, ledger.Acked, "inbox_ack")
}

// Reject is Ack for rows the leaf can never deliver (a `to` naming another service than its
// own): they are removed, and their messages read not_found, which is what they found there.
func (m *Mailboxes) Reject(peer string, ids []string) (int, error) {
	return m.settle(peer, ids, ledger.Failed, "inbox_reject")
}

// settle removes ids from peer's mailbox and records outcome for each one removed. It
// answers at once: the rows of ids that are there (and not settling already) are marked
// settling, never handed out again, and their deletes and records ride the next commit, which
// is most often the next mail's (a commit is made for them when none comes within
// settleRide). A crash before that commit hands them out again: the leaf knows each by its id
// and acks it again, so a leaf's ack costs the hub no commit of its own.
func (m *Mailboxes) settle(peer string, ids []string, kind ledger.Kind, request string) (int, error) {
	outcome := ledger.Delivered
	if kind == ledger.Failed {
		outcome = ledger.NoRecipient // what the leaf found for it: no such service
	}
	var fresh []string
	err := m.store.View(func(tx *store.Tx) error {
		m.mu.Lock()
		defer m.mu.Unlock()
		for _, id := range ids {
			if !m.settling[peer][id] && tx.InMailbox(peer, id) {
				if m.settling == nil {
					m.settling = map[string]map[string]bool{}
				}
				if m.settling[peer] == nil {
					m.settling[peer] = map[string]bool{}
				}
				m.settling[peer][id] = true
				fresh = append(fresh, id)
				if h := m.handed[peer]; h != nil {
					delete(h.ids, id)
				}
			}
		}
		if len(fresh) > 0 {
			// Room, once the next commit carries the deletes: a put's own commit does.
			if m.settles == nil {
				m.settles = map[string]uint64{}
			}
			m.settles[peer]++
		}
		return nil
	})
	if err != nil || len(fresh) == 0 {
		return 0, err
	}
	// The settled rows left their stream: a followed stream waiting for room has it now.
	m.wake.Fire(peer)
	var done []string
	committed := m.store.Defer(func(tx *store.Tx) error {
		done = done[:0]
		for _, id := range fresh {
			ok, err := records.Taken(tx, peer, id, outcome)
			if err != nil {
				return err
			}
			if ok {
				done = append(done, id)
			}
		}
		return nil
	})
	go func() {
		t := time.NewTimer(settleRide)
		var err error
		select {
		case err = <-committed:
			t.Stop()
		case <-t.C:
			m.store.Update(func(*store.Tx) error { return nil }) // carries it
			err = <-committed
		}
		if err != nil {
			m.log.Error("committing a leaf's acks failed; its rows stay queued", "peer", peer, "ids", len(fresh), "err", err)
			done = nil
		}
		m.mu.Lock()
		if err == nil {
			m.dropWire(peer, fresh)
		}
		for _, id := range fresh {
			delete(m.settling[peer], id)
		}
		if len(m.settling[peer]) == 0 {
			delete(m.settling, peer)
		}
		m.mu.Unlock()
		for _, id := range done {
			e := ledger.Event{Kind: kind, Request: request, Transport: ledger.Fed, From: "fed:" + peer, Peer: peer, MessageID: id, Outcome: ledger.Delivered}
			if kind == ledger.Failed {
				e.Outcome, e.Code = ledger.NoOutcome, new(ledger.NotFound)
			}
			m.Events.Emit(e)
		}
	}()
	return len(fresh), nil
}

// ServiceName is the service a leaf's ref names, as the leaf reads a row's `to` (docs/protocol.md
// §7.5): svc:NAME or a bare NAME. A leaf hosts that one service and no session, so a ref of
// any other shape names nothing there.
func ServiceName(ref string) (string, bool) {
	name := ref
	if h, rest, ok := strings.Cut(ref, ":"); ok {
		if !strings.EqualFold(h, svc.Name) {
			return "", false
		}
		name = rest
	}
	return name, envelope.ValidServiceName(name)
}

// Len counts the mail waiting for peer.
func (m *Mailboxes) Len(peer string) int {
	n := 0
	m.store.View(func(tx *store.Tx) error { n = tx.MailboxLen(peer); return nil })
	return n
}

// Lens counts the mail waiting for each of peers (store.MailboxLens: a gauge's reading).
func (m *Mailboxes) Lens(peers []string) ([]int, error) { return m.store.MailboxLens(peers) }

// Row is one row of a leaf's mailbox as GET /fed/v2/inbox answers it: the §8.3 fields
// (id, origin, body, to) and, from the kept envelope, what the leaf needs to record the
// message with the sender as its copy's return address (principal, push_replies,
// thread_id, created_at).
type Row struct {
	ID          string          `json:"id"`
	Origin      json.RawMessage `json:"origin"`
	Body        string          `json:"body"`
	To          string          `json:"to"`
	Principal   json.RawMessage `json:"principal,omitempty"`
	PushReplies bool            `json:"push_replies"`
	ThreadID    string          `json:"thread_id,omitempty"`
	CreatedAt   int64           `json:"created_at"`
}

// EncodeRow is r as a pull's answer has it: what an encoding/json Encoder with HTML escaping
// off writes (TestEncodeRowIsEncoder), without its reflection: a pull's rows are written on
// every leaf message's way.
func EncodeRow(r Row) ([]byte, error) {
	dst := make([]byte, 0, 160+len(r.Body)+len(r.Origin)+len(r.Principal))
	dst = append(dst, `{"id":`...)
	dst = jsonline.AppendString(dst, r.ID, false)
	dst = append(dst, `,"origin":`...)
	var err error
	if dst, err = appendRaw(dst, r.Origin); err != nil {
		return nil, err
	}
	dst = append(dst, `,"body":`...)
	dst = jsonline.AppendString(dst, r.Body, false)
	dst = append(dst, `,"to":`...)
	dst = jsonline.AppendString(dst, r.To, false)
	if len(r.Principal) > 0 {
		dst = append(dst, `,"principal":`...)
		if dst, err = appendRaw(dst, r.Principal); err != nil {
			return nil, err
		}
	}
	dst = append(dst, `,"push_replies":`...)
	dst = strconv.AppendBool(dst, r.PushReplies)
	if r.ThreadID != "" {
		dst = append(dst, `,"thread_id":`...)
		dst = jsonline.AppendString(dst, r.ThreadID, false)
	}
	dst = append(dst, `,"created_at":`...)
	dst = strconv.AppendInt(dst, r.CreatedAt, 10)
	return append(dst, '}'), nil
}

// appendRaw appends raw as an Encoder without HTML escaping writes a json.RawMessage:
// compacted, null when empty; an error when it is not JSON.
func appendRaw(dst []byte, raw json.RawMessage) ([]byte, error) {
	if len(raw) == 0 {
		return append(dst, "null"...), nil
	}
	b := bytes.NewBuffer(dst)
	if err := json.Compact(b, raw); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

// RowOf is the wire row of a mailbox entry, from the envelope kept with it (fed.Node.queue).
func RowOf(e store.MailboxEntry) Row {
	r := Row{ID: e.ID, Origin: e.Origin, Body: e.Body, To: e.TargetRef, CreatedAt: e.CreatedAt}
	// The envelope as this daemon writes it (fed.Envelope), in one pass without reflection:
	// this is on every leaf message's way. Anything else is decoded as before.
	if obj, err := jsonline.Decode(e.Envelope); err == nil {
		p, hasP := obj["principal"]
		push, hasPush := obj["push_replies"]
		thread, _, terr := obj.OptString("thread_id")
		if hasP && len(p) > 0 && p[0] == '{' && hasPush && (string(push) == "true" || string(push) == "false") && terr == nil {
			r.Principal, r.PushReplies, r.ThreadID = append(json.RawMessage(nil), p...), string(push) == "true", thread
			return r
		}
	}
	var env struct {
		Principal json.RawMessage `json:"principal"`
		Push      bool            `json:"push_replies"`
		ThreadID  string          `json:"thread_id"`
	}
	if json.Unmarshal(e.Envelope, &env) == nil {
		r.Principal, r.PushReplies, r.ThreadID = env.Principal, env.Push, env.ThreadID
	}
	return r
}
