// Package store keeps xmsg's durable state in one bbolt file: messages (metadata), replies,
// the per-session delivery queues of registered harnesses, and idempotency keys.
//
// Every write goes through Update, which commits and fsyncs before it returns, so an answer
// given after Update is never lost. Concurrent writers share commits (group commit, with a
// leader): a writer that finds no commit in progress commits itself, on its own goroutine;
// writers arriving meanwhile queue up, and when the commit ends the first of them leads the
// next one, taking every queued write into one transaction. A lone writer therefore pays
// exactly one commit, with no batch timer and no hand-off to another goroutine, while many
// writers pay one fsync between them.
package store

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/xmsg/xmsg/internal/ledger"
)

// Bucket names. Keys are chosen so that iteration order is time order:
//   - messages: UUID v7 id (canonical lowercase text sorts by creation time);
//   - replies: 8-byte big-endian global sequence (NextSequence), the protocol's `seq`;
//   - replyIndex: message id + seq, for one message's replies in order;
//   - queue: session id + 0x00 + 8-byte big-endian sequence, FIFO per session;
//   - idem: principal + 0x00 + key.
var (
	bucketMessages   = []byte("messages")
	bucketReplies    = []byte("replies")
	bucketReplyIndex = []byte("reply_index")
	bucketQueue      = []byte("queue")
	bucketIdem       = []byte("idempotency")
)

// allBuckets are created at open, in one transaction.
var allBuckets = [][]byte{bucketMessages, bucketReplies, bucketReplyIndex, bucketQueue, bucketIdem, bucketProcessSessions}

// MaxQueue is the number of unacknowledged messages one registered session may hold.
const MaxQueue = 100

// MaxStored bounds the rows of one session's queue, acknowledged or not. The bus enforces
// MaxQueue on unacknowledged messages before a write reaches a commit, and an acknowledged
// row is deleted by a later commit, so rows can exceed MaxQueue for a moment; this bound is
// the backstop should that delete be stuck (a failing disk), not the rule.
const MaxStored = 2 * MaxQueue

// ErrQueueFull is returned by Tx.Enqueue when a session already holds MaxQueue messages.
var ErrQueueFull = errors.New("store: queue is full")

// ErrClosed is returned by writes after Close.
var ErrClosed = errors.New("store: closed")

// Message is the metadata of one accepted message (bodies of Claude deliveries are not kept).
type Message struct {
	ID               string         `json:"id"`
	CreatedAt        int64          `json:"createdAt"`
	SessionID        string         `json:"sessionId"`
	FromName         string         `json:"fromName"`
	Bytes            int            `json:"bytes"`
	Outcome          ledger.Outcome `json:"outcome"`
	RecipientHarness string         `json:"recipientHarness"`
	ReturnHarness    string         `json:"returnHarness,omitempty"`
	ReturnSessionID  string         `json:"returnSessionId,omitempty"`
	ReturnHost       string         `json:"returnHost,omitempty"`
	PushReplies      bool           `json:"pushReplies"`
	ThreadID         string         `json:"threadId"`
	// Report is what the recipient session last said of the message (a Claude Code
	// session's peer status: "held", "delivered", "denied", ...), or "written" when its line
	// was written to the session's inbox and no report has come; "" for other harnesses.
	Report string `json:"report,omitempty"`
}

// Reply is a reply attached to a stored message by its recipient.
type Reply struct {
	Seq              uint64         `json:"seq"`
	MessageID        string         `json:"messageId"`
	CreatedAt        int64          `json:"createdAt"`
	ReplierSessionID string         `json:"replierSessionId"`
	Text             string         `json:"text"`
	PushOutcome      ledger.Outcome `json:"pushOutcome,omitempty"`
	PushedMessageID  string         `json:"pushedMessageId,omitempty"`
}

// Pending is a message waiting in a registered session's queue until the session acks it.
type Pending struct {
	ID string `json:"id"`
	// Share names the origin the row counts against in its queue (a federation peer, a
	// local principal; see EnqueueShare); "" counts against none. It is the second field,
	// so that it is read from the encoding's first bytes, like the id (pendingHead).
	Share     string          `json:"share,omitempty"`
	SessionID string          `json:"sessionId"`
	CreatedAt int64           `json:"createdAt"`
	FromName  string          `json:"fromName"`
	Bytes     int             `json:"bytes"`
	Text      string          `json:"text"`
	Envelope  string          `json:"envelope"`
	Origin    json.RawMessage `json:"origin,omitempty"`
}

// Idem is a remembered idempotent send: the same (principal, key) with the same body answers
// with the stored delivery; with another body it is a conflict.
type Idem struct {
	Principal string         `json:"principal"`
	Key       string         `json:"key"`
	Body      string         `json:"body"`
	MessageID string         `json:"messageId"`
	SessionID string         `json:"sessionId"`
	FromName  string         `json:"fromName"`
	Bytes     int            `json:"bytes"`
	Outcome   ledger.Outcome `json:"outcome"`
	CreatedAt int64          `json:"createdAt"`
}

// Store is the open database.
type Store struct {
	db           *bolt.DB
	path         string
	migratedFrom uint64 // the format the file had at open (Format for a new or current one)

	mu      sync.Mutex
	idle    sync.Cond // signalled when leading turns false
	pending []*op     // writes waiting for the next commit, oldest first
	riders  []*op     // writes that wait for a commit without asking for one (Defer)
	rider   Rider     // asked for more such writes as each commit's batch is formed
	leading bool      // a writer is committing (or has been handed the lead)
	closed  bool
	shut    atomic.Bool // closed, readable without mu
	commits atomic.Uint64
	times   commitTimes  // durations of the commits that succeeded (metrics)
	boxes   mailboxSizes // the leaves' mailboxes' sizes as of the last commit
}

// Closed reports whether Close was called: no write can be stored any more.
func (s *Store) Closed() bool { return s.shut.Load() }

// Quiet reports whether no write is committing or waiting for a commit: a writer that finds
// the store quiet after its own commit was the only one of its moment.
func (s *Store) Quiet() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return !s.leading && len(s.pending) == 0
}

// Commits is the number of commits made so far (for benchmarks: commits per send).
func (s *Store) Commits() uint64 { return s.commits.Load() }

type op struct {
	fn   func(*Tx) error
	err  chan error  // buffered: the result, or errLead
	done func(error) // instead of err: called with the result (a Rider's writes)
	// written, when set, is called once fn's writes are final (its last run succeeded)
	// and before the commit's fsync; the commit may still fail after it (UpdateWritten).
	written func()
}

// Rider supplies writes that ride every commit without asking for one, for a writer with a
// steady trickle of them (the bus's acknowledged deletes): it is called as each commit's batch
// is formed, under the store's lock, so it must be quick and take no lock that is held while
// calling the store. It returns the writes for this commit (nil: none) and done, which is
// called once with the commit's result, on the committing goroutine. As for Update, fn may
// run more than once.
type Rider func() (fn func(*Tx) error, done func(error))

// SetRider installs r (nil: none). Set it before the first write.
func (s *Store) SetRider(r Rider) {
	s.mu.Lock()
	s.rider = r
	s.mu.Unlock()
}

// maxBatch bounds one group commit so a flood of writers cannot make one transaction huge.
const maxBatch = 256

// errLead, sent instead of a result, tells a queued writer that it now leads the next commit.
var errLead = errors.New("store: lead the next commit")

// Open opens (creating if needed) the database at path. The parent directory is created 0700
// and the file 0600. A second daemon on the same file fails after timeout with a message that
// says so, instead of hanging: bbolt holds an exclusive flock for the life of the DB.
//
// An existing file is checked before bbolt reads it (Check), and its format is read: an older
// one is migrated (format.go), a newer one, damage, or a file that is no xmsg store is refused
// with a *RefusedError, and the file is left as it was.
func Open(path string, timeout time.Duration) (*Store, error) {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("store: create %s: %w", dir, err)
	}
	if err := checkLocked(path, timeout); err != nil {
		return nil, err
	}
	// NoFreelistSync: the freelist is rebuilt from the pages at open instead of being written on
	// every commit (as etcd does). Each commit still fsyncs its data and meta pages. With it,
	// bbolt writes nothing to an existing file at open, so a refusal below leaves it as it was.
	db, err := openBolt(path, &bolt.Options{Timeout: timeout, NoFreelistSync: true, FreelistType: bolt.FreelistMapType})
	if errors.Is(err, bolt.ErrTimeout) {
		return nil, locked(path)
	}
	if err != nil {
		return nil, fmt.Errorf("store: open %s: %w", path, err)
	}
	format, err := openFormat(db, path)
	if err != nil {
		db.Close()
		return nil, err
	}
	// bolt.Open honours the umask only at creation; an existing file may be wider.
	if err := os.Chmod(path, 0o600); err != nil {
		db.Close()
		return nil, fmt.Errorf("store: chmod %s: %w", path, err)
	}
	s := &Store{db: db, path: path, migratedFrom: format}
	s.idle.L = &s.mu
	return s, nil
}

// openBolt is bolt.Open, with a panic of bbolt's own (an assertion on a page it reads while it
// rebuilds the freelist) reported as damage. It is the last resort behind Check, which finds
// what bbolt would panic on before bbolt reads the file; a panic in a goroutine bbolt starts
// cannot be caught at all. After one the half-opened file is not closed (bbolt may hold its
// locks): the caller is to stop, as the daemon does.
func openBolt(path string, opts *bolt.Options) (db *bolt.DB, err error) {
	defer func() {
		if r := recover(); r != nil {
			db, err = nil, damaged(path, "bbolt failed reading it: %s", strings.Join(strings.Fields(fmt.Sprint(r)), " "))
		}
	}()
	return bolt.Open(path, 0o600, opts)
}

func locked(path string) error {
	return fmt.Errorf("store: %s is locked by another process (is another xmsg serve running on this database?)", path)
}

// checkLocked runs Check on an existing file under a shared flock, so that it never reads a
// file another daemon is writing (that one holds bbolt's exclusive lock: this waits for it as
// bbolt would, then says it is locked). A missing file is no error: bbolt creates it.
func checkLocked(path string, timeout time.Duration) error {
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("store: open %s: %w", path, err)
	}
	defer f.Close()
	deadline := time.Now().Add(timeout)
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_SH|syscall.LOCK_NB)
		if err == nil {
			break
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) {
			return fmt.Errorf("store: flock %s: %w", path, err)
		}
		if time.Now().After(deadline) {
			return locked(path)
		}
		time.Sleep(50 * time.Millisecond)
	}
	// Closing f drops the lock; bbolt takes its own exclusive one next.
	return check(f, path)
}

// openFormat creates a new file's buckets and format, or reads an existing file's format and
// migrates it. It returns the format the file had (Format for a new one).
func openFormat(db *bolt.DB, path string) (uint64, error) {
	var format uint64
	err := db.View(func(tx *bolt.Tx) (err error) {
		format, err = formatOf(tx)
		return err
	})
	if err != nil {
		return 0, &RefusedError{Path: path, Problem: err.Error(), Remedy: restoreHint}
	}
	switch {
	case format > Format:
		return format, &RefusedError{Path: path, Problem: fmt.Sprintf("the store is format %d, newer than this xmsg's format %d", format, Format),
			Remedy: "run the xmsg release that wrote it, or restore a backup of format " + fmt.Sprint(Format) + " or older"}
	case format == 0:
		// A new file (or one bbolt made before the buckets were): everything in one commit.
		if err := db.Update(create); err != nil {
			return 0, fmt.Errorf("store: create buckets: %w", err)
		}
		return Format, nil
	case format < Format:
		if err := migrate(db, format); err != nil {
			return format, err
		}
	}
	// A file of this format has every bucket (create and the steps make them); one that lacks
	// one was changed by something else, and is not mended here.
	err = db.View(func(tx *bolt.Tx) error {
		for _, b := range allBuckets {
			if tx.Bucket(b) == nil {
				return fmt.Errorf("the format %d store has no bucket %q", Format, b)
			}
		}
		return nil
	})
	if err != nil {
		return format, &RefusedError{Path: path, Problem: err.Error(), Remedy: restoreHint}
	}
	return format, nil
}

// Close waits for queued writes, then closes the file.
func (s *Store) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	for s.leading {
		s.idle.Wait()
	}
	riders := len(s.riders) > 0
	s.mu.Unlock()
	if riders {
		// Writes waiting for a commit get one before the file closes.
		s.Update(func(*Tx) error { return nil })
	}
	s.mu.Lock()
	s.closed = true
	s.shut.Store(true)
	for s.leading {
		s.idle.Wait()
	}
	for _, o := range s.riders { // deferred after the last commit began
		o.err <- ErrClosed
	}
	s.riders = nil
	s.mu.Unlock()
	return s.db.Close()
}

// Update runs fn in a read-write transaction and returns once that transaction is committed
// and fsynced (or failed). fn may run more than once (see commit) and must derive everything
// it writes from the transaction and its captured inputs. If fn returns an error, none of
// its writes are kept.
func (s *Store) Update(fn func(*Tx) error) error {
	return s.update(&op{fn: fn, err: make(chan error, 1)})
}

// UpdateWritten is Update that also calls written once fn's writes are final in the
// transaction and before the commit's fsync, so that the caller can overlap what follows the
// commit with the disk's wait (written runs on the committing goroutine, under the store's
// write lock: it must be quick and must not call the store). The commit may still fail after
// written: the caller must undo then whatever written did, and must use it only where a
// write that is lost in a crash is no loss (what it wrote is still held elsewhere).
func (s *Store) UpdateWritten(fn func(*Tx) error, written func()) error {
	return s.update(&op{fn: fn, err: make(chan error, 1), written: written})
}

func (s *Store) update(o *op) error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return ErrClosed
	}
	s.pending = append(s.pending, o)
	if s.leading {
		s.mu.Unlock()
		if err := <-o.err; err != errLead {
			return err // a leader committed our write
		}
		// Handed the lead: o is the oldest pending write, so it is in the batch below.
	} else {
		s.leading = true
		s.mu.Unlock()
	}
	s.mu.Lock()
	n := min(len(s.pending), maxBatch)
	batch := append(s.riders, s.pending[:n]...)
	s.riders = nil
	if s.rider != nil {
		if fn, done := s.rider(); fn != nil {
			batch = append(batch, &op{fn: fn, done: done})
		}
	}
	s.pending = s.pending[n:]
	s.mu.Unlock()
	s.commit(batch)
	s.mu.Lock()
	if len(s.pending) > 0 {
		next := s.pending[0]
		s.mu.Unlock()
		next.err <- errLead
	} else {
		s.leading = false
		s.idle.Broadcast()
		s.mu.Unlock()
	}
	return <-o.err
}

// Defer queues fn to ride the next commit without starting one: it is written by the next
// Update's transaction, whoever makes it. The channel receives its result once that commit
// is done (as for Update, fn may run more than once). Use Update (with a no-op) to force a
// commit when none comes.
func (s *Store) Defer(fn func(*Tx) error) <-chan error {
	o := &op{fn: fn, err: make(chan error, 1)}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		o.err <- ErrClosed
		return o.err
	}
	s.riders = append(s.riders, o)
	return o.err
}

// View runs fn in a read-only transaction. Values returned by Tx methods are copies and stay
// valid after View returns.
func (s *Store) View(fn func(*Tx) error) error {
	return s.db.View(func(btx *bolt.Tx) error { return fn(&Tx{btx: btx}) })
}

// errRetryWithout aborts a shared transaction when one of its writes fails, so that the others
// can be committed without the failed one's partial writes.
var errRetryWithout = errors.New("store: retry without the failed write")

// commit writes batch in one transaction and answers each write. A write that fails is
// answered with its error and the transaction is run again without it: a rolled-back
// transaction costs no fsync, so one bad write costs its batch a second pass, not a commit
// per write. (Writes that run before it in the batch run again; fn may run more than once.)
func (s *Store) commit(batch []*op) {
	errs := make([]error, len(batch))
	failed := make([]bool, len(batch))
	for {
		start := time.Now()
		var boxes *boxTx
		err := s.db.Update(func(btx *bolt.Tx) error {
			tx := &Tx{btx: btx, boxes: boxTx{store: &s.boxes}}
			boxes = &tx.boxes
			for i, o := range batch {
				if failed[i] {
					continue
				}
				if errs[i] = o.fn(tx); errs[i] != nil {
					failed[i] = true
					return errRetryWithout
				}
			}
			// Every write is final: bbolt commits (writes and fsyncs) once this returns.
			for i, o := range batch {
				if o.written != nil && !failed[i] {
					o.written()
				}
			}
			return nil
		})
		if errors.Is(err, errRetryWithout) {
			continue
		}
		if err == nil {
			s.boxes.committed(boxes)
			s.commits.Add(1)
			s.times.observe(time.Since(start))
		}
		for i := range errs {
			if !failed[i] {
				errs[i] = err
			}
		}
		break
	}
	for i, o := range batch {
		if o.done != nil {
			o.done(errs[i])
			continue
		}
		o.err <- errs[i]
	}
}

// Tx is a transaction with xmsg's typed operations.
type Tx struct {
	btx   *bolt.Tx
	boxes boxTx // a write transaction's mailbox sizes (none in a read: count them)
}

func u64(n uint64) []byte {
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], n)
	return b[:]
}

func get[T any](b *bolt.Bucket, key []byte) (T, bool, error) {
	var v T
	raw := b.Get(key)
	if raw == nil {
		return v, false, nil
	}
	// json.Unmarshal copies, so nothing returned points into the mmap after the tx ends.
	if err := json.Unmarshal(raw, &v); err != nil {
		return v, false, fmt.Errorf("store: decode %s/%x: %w", b.Tx().DB().Path(), key, err)
	}
	return v, true, nil
}

func put(b *bolt.Bucket, key []byte, v any) error {
	raw, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("store: encode: %w", err)
	}
	return b.Put(key, raw)
}

// Message returns the message with id.
func (t *Tx) Message(id string) (Message, bool, error) {
	return get[Message](t.btx.Bucket(bucketMessages), []byte(id))
}

// PutMessage inserts or replaces a message.
func (t *Tx) PutMessage(m Message) error {
	return t.btx.Bucket(bucketMessages).Put([]byte(m.ID), appendMessage(make([]byte, 0, 256+len(m.FromName)), m))
}

// AddReply stores r with the next global sequence number and returns that number.
func (t *Tx) AddReply(r Reply) (uint64, error) {
	b := t.btx.Bucket(bucketReplies)
	seq, err := b.NextSequence()
	if err != nil {
		return 0, fmt.Errorf("store: reply sequence: %w", err)
	}
	r.Seq = seq
	if err := put(b, u64(seq), r); err != nil {
		return 0, err
	}
	return seq, t.btx.Bucket(bucketReplyIndex).Put(replyIndexKey(r.MessageID, seq), nil)
}

func replyIndexKey(messageID string, seq uint64) []byte {
	k := make([]byte, 0, len(messageID)+1+8)
	k = append(k, messageID...)
	k = append(k, 0)
	return append(k, u64(seq)...)
}

// PutReply rewrites a stored reply (same Seq), e.g. to record a push outcome.
func (t *Tx) PutReply(r Reply) error {
	return put(t.btx.Bucket(bucketReplies), u64(r.Seq), r)
}

// DeleteMessage removes a message row.
func (t *Tx) DeleteMessage(id string) error {
	return t.btx.Bucket(bucketMessages).Delete([]byte(id))
}

// Replies returns the replies to messageID with seq > after, in seq order.
func (t *Tx) Replies(messageID string, after uint64) ([]Reply, error) {
	idx := t.btx.Bucket(bucketReplyIndex).Cursor()
	replies := t.btx.Bucket(bucketReplies)
	prefix := append([]byte(messageID), 0)
	out := []Reply{}
	for k, _ := idx.Seek(replyIndexKey(messageID, after+1)); k != nil && hasPrefix(k, prefix); k, _ = idx.Next() {
		r, ok, err := get[Reply](replies, k[len(prefix):])
		if err != nil {
			return nil, err
		}
		if ok {
			out = append(out, r)
		}
	}
	return out, nil
}

func hasPrefix(k, prefix []byte) bool {
	return len(k) >= len(prefix) && string(k[:len(prefix)]) == string(prefix)
}

func queuePrefix(sessionID string) []byte { return append([]byte(sessionID), 0) }

// Enqueue appends p to its session's queue, or returns ErrQueueFull when the session already
// holds MaxQueue rows.
func (t *Tx) Enqueue(p Pending) error { return t.EnqueueMax(p, MaxQueue) }

// EnqueueMax is Enqueue with another bound on the rows.
func (t *Tx) EnqueueMax(p Pending, limit int) error {
	_, err := t.EnqueueKey(p, limit)
	return err
}

// EnqueueKey is EnqueueMax returning the row's key, which names it for QueueRow and Unqueue.
// Keys of one session sort in queue order (bytes.Compare) and are never reused.
func (t *Tx) EnqueueKey(p Pending, limit int) ([]byte, error) {
	return t.EnqueueShare(p, limit, 0)
}

// ErrShareFull is returned by EnqueueShare when the row's origin already holds its share of
// the queue. It is an ErrQueueFull: the sender is answered as for a full queue.
var ErrShareFull = fmt.Errorf("%w: this origin's share of the queue is taken", ErrQueueFull)

// EnqueueShare is EnqueueKey that also refuses the row (ErrShareFull) when p.Share is set
// and shareMax (> 0) rows of the queue already carry that share: no one origin holds more
// than shareMax places of a queue the others need too (issue 18). The count is the store's
// own, in the writing transaction, so it holds whatever path wrote the rows.
func (t *Tx) EnqueueShare(p Pending, limit, shareMax int) ([]byte, error) {
	b := t.btx.Bucket(bucketQueue)
	prefix := queuePrefix(p.SessionID)
	n, mine := 0, 0
	count := p.Share != "" && shareMax > 0
	c := b.Cursor()
	for k, v := c.Seek(prefix); k != nil && hasPrefix(k, prefix); k, v = c.Next() {
		if n++; n >= limit {
			return nil, ErrQueueFull
		}
		if count {
			_, share, err := pendingHead(v)
			if err != nil {
				return nil, err
			}
			if share == p.Share {
				if mine++; mine >= shareMax {
					return nil, ErrShareFull
				}
			}
		}
	}
	seq, err := b.NextSequence()
	if err != nil {
		return nil, fmt.Errorf("store: queue sequence: %w", err)
	}
	key := append(prefix, u64(seq)...)
	raw, ok := appendPending(make([]byte, 0, 256+len(p.Text)+len(p.Envelope)+len(p.Origin)), p)
	if !ok {
		return key, put(b, key, p) // json.Marshal's error for the origin
	}
	return key, b.Put(key, raw)
}

// QueueShare counts the rows of sessionID's queue that carry share (EnqueueShare's count).
func (t *Tx) QueueShare(sessionID, share string) (int, error) {
	prefix := queuePrefix(sessionID)
	n := 0
	c := t.btx.Bucket(bucketQueue).Cursor()
	for k, v := c.Seek(prefix); k != nil && hasPrefix(k, prefix); k, v = c.Next() {
		_, s, err := pendingHead(v)
		if err != nil {
			return 0, err
		}
		if s == share {
			n++
		}
	}
	return n, nil
}

// QueueKey is one row of a session's queue: its key and its message id.
type QueueKey struct {
	Key []byte
	ID  string
}

// QueueKeys returns the rows of a session's queue, oldest first, without decoding them.
func (t *Tx) QueueKeys(sessionID string) ([]QueueKey, error) {
	prefix := queuePrefix(sessionID)
	var out []QueueKey
	c := t.btx.Bucket(bucketQueue).Cursor()
	for k, v := c.Seek(prefix); k != nil && hasPrefix(k, prefix); k, v = c.Next() {
		id, err := pendingID(v)
		if err != nil {
			return nil, err
		}
		out = append(out, QueueKey{Key: append([]byte(nil), k...), ID: id})
	}
	return out, nil
}

// QueueRow returns the queued message stored under key (from EnqueueKey or QueueKeys).
func (t *Tx) QueueRow(key []byte) (Pending, bool, error) {
	return get[Pending](t.btx.Bucket(bucketQueue), key)
}

// Unqueue deletes the queue row stored under key; a key that is not there changes nothing.
func (t *Tx) Unqueue(key []byte) error {
	return t.btx.Bucket(bucketQueue).Delete(key)
}

// UnqueueID deletes the queue row stored under key if it is message id's, and changes nothing
// otherwise: a key whose write was never committed (its transaction failed) may be given
// again to another row, which an ack of the first must not delete.
func (t *Tx) UnqueueID(key []byte, id string) error {
	if len(key) == 0 {
		return nil // no key was stored
	}
	b := t.btx.Bucket(bucketQueue)
	v := b.Get(key)
	if v == nil {
		return nil
	}
	if got, err := pendingID(v); err == nil && got != id {
		return nil // another row's (a row that cannot be read is deleted, as by Unqueue)
	}
	return b.Delete(key)
}

// Head returns the oldest unacknowledged message of a session.
func (t *Tx) Head(sessionID string) (Pending, bool, error) {
	prefix := queuePrefix(sessionID)
	c := t.btx.Bucket(bucketQueue).Cursor()
	k, _ := c.Seek(prefix)
	if k == nil || !hasPrefix(k, prefix) {
		return Pending{}, false, nil
	}
	return get[Pending](t.btx.Bucket(bucketQueue), k)
}

// pendingID returns the message id of an encoded Pending. The encoding starts with the id
// (it is the struct's first field and a UUID needs no escaping), so the id is read without
// decoding the rest (the text may be 64 KiB); anything else is decoded in full.
func pendingID(v []byte) (string, error) {
	id, _, err := pendingHead(v)
	return id, err
}

// pendingHead returns the id and the share of an encoded Pending, both read from its first
// bytes when they need no escaping (Share is the second field); anything else is decoded in
// full.
func pendingHead(v []byte) (id, share string, err error) {
	if id, rest, ok := quoted(v, `{"id":"`); ok {
		if share, _, ok := quoted(rest, `,"share":"`); ok {
			return id, share, nil
		}
		if len(rest) > 0 && rest[0] == ',' && !bytes.HasPrefix(rest, []byte(`,"share"`)) {
			return id, "", nil // no share: the next field is another one
		}
	}
	var h struct {
		ID    string `json:"id"`
		Share string `json:"share"`
	}
	if err := json.Unmarshal(v, &h); err != nil {
		return "", "", fmt.Errorf("store: decode queue entry: %w", err)
	}
	return h.ID, h.Share, nil
}

// quoted reads prefix and then a string up to its closing quote, with no escape in it; it
// returns the string and what follows the quote.
func quoted(v []byte, prefix string) (string, []byte, bool) {
	if len(v) <= len(prefix) || string(v[:len(prefix)]) != prefix {
		return "", nil, false
	}
	rest := v[len(prefix):]
	for i, c := range rest {
		if c == '"' {
			return string(rest[:i]), rest[i+1:], true
		}
		if c == '\\' {
			break
		}
	}
	return "", nil, false
}

// HeadSkip returns the oldest message of a session that skip does not name (acknowledged
// messages whose delete is not committed yet).
func (t *Tx) HeadSkip(sessionID string, skip map[string]bool) (Pending, bool, error) {
	prefix := queuePrefix(sessionID)
	c := t.btx.Bucket(bucketQueue).Cursor()
	for k, v := c.Seek(prefix); k != nil && hasPrefix(k, prefix); k, v = c.Next() {
		if len(skip) > 0 {
			id, err := pendingID(v)
			if err != nil {
				return Pending{}, false, err
			}
			if skip[id] {
				continue
			}
		}
		return get[Pending](t.btx.Bucket(bucketQueue), k)
	}
	return Pending{}, false, nil
}

// QueueIDs returns the ids of a session's queued messages, oldest first.
func (t *Tx) QueueIDs(sessionID string) ([]string, error) {
	prefix := queuePrefix(sessionID)
	var out []string
	c := t.btx.Bucket(bucketQueue).Cursor()
	for k, v := c.Seek(prefix); k != nil && hasPrefix(k, prefix); k, v = c.Next() {
		id, err := pendingID(v)
		if err != nil {
			return nil, err
		}
		out = append(out, id)
	}
	return out, nil
}

// Queued reports whether messageID is in the session's queue.
func (t *Tx) Queued(sessionID, messageID string) (bool, error) {
	prefix := queuePrefix(sessionID)
	c := t.btx.Bucket(bucketQueue).Cursor()
	for k, v := c.Seek(prefix); k != nil && hasPrefix(k, prefix); k, v = c.Next() {
		id, err := pendingID(v)
		if err != nil {
			return false, err
		}
		if id == messageID {
			return true, nil
		}
	}
	return false, nil
}

// QueueLen returns how many messages wait for a session.
func (t *Tx) QueueLen(sessionID string) int {
	prefix := queuePrefix(sessionID)
	n := 0
	c := t.btx.Bucket(bucketQueue).Cursor()
	for k, _ := c.Seek(prefix); k != nil && hasPrefix(k, prefix); k, _ = c.Next() {
		n++
	}
	return n
}

// Ack removes messageID from the session's queue. It reports whether it was there; acking
// a message of another session, or one already acked, changes nothing.
func (t *Tx) Ack(sessionID, messageID string) (bool, error) {
	b := t.btx.Bucket(bucketQueue)
	prefix := queuePrefix(sessionID)
	c := b.Cursor()
	for k, v := c.Seek(prefix); k != nil && hasPrefix(k, prefix); k, v = c.Next() {
		id, err := pendingID(v)
		if err != nil {
			return false, err
		}
		if id == messageID {
			return true, c.Delete()
		}
	}
	return false, nil
}

func idemKey(principal, key string) []byte {
	k := make([]byte, 0, len(principal)+1+len(key))
	k = append(k, principal...)
	k = append(k, 0)
	return append(k, key...)
}

// Idem returns the idempotency record for (principal, key).
func (t *Tx) Idem(principal, key string) (Idem, bool, error) {
	return get[Idem](t.btx.Bucket(bucketIdem), idemKey(principal, key))
}

// PutIdem stores an idempotency record.
func (t *Tx) PutIdem(r Idem) error {
	return put(t.btx.Bucket(bucketIdem), idemKey(r.Principal, r.Key), r)
}

// DeleteIdem forgets an idempotency record.
func (t *Tx) DeleteIdem(principal, key string) error {
	return t.btx.Bucket(bucketIdem).Delete(idemKey(principal, key))
}

// Counts is a summary for STATUS= and doctor.
type Counts struct{ Messages, Replies, Queued, IdempotencyKeys int }

// Counts returns how many records each bucket holds.
func (t *Tx) Counts() Counts {
	return Counts{
		Messages:        t.btx.Bucket(bucketMessages).Stats().KeyN,
		Replies:         t.btx.Bucket(bucketReplies).Stats().KeyN,
		Queued:          t.btx.Bucket(bucketQueue).Stats().KeyN,
		IdempotencyKeys: t.btx.Bucket(bucketIdem).Stats().KeyN,
	}
}
