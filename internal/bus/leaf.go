package bus

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/xmsg/xmsg/internal/envelope"
	"github.com/xmsg/xmsg/internal/harness/svc"
	"github.com/xmsg/xmsg/internal/store"
)

// Leaf nodes (docs/protocol.md §7.5, §8.2-§8.4). Two sides live here, because both route and
// store: the hub keeps a mailbox per leaf peer (bounded, Bounds) and hands its rows out in
// batches (or one at a time, to a leaf that asks so), and the leaf puts each pulled row into
// its one service's queue. The wire and the pull loop are elsewhere (internal/fed,
// internal/leaf).

// LeafIdentity is a leaf's configured principal (--leaf-principal).
type LeafIdentity struct {
	Principal string    // as configured, e.g. "svc:matrix": fromName suffix and idempotency scope
	Fed       Principal // its federation principal (§7.5 parsing rules)
	Service   string    // the one local service admitted: Principal minus "svc:"
}

// Leaf returns the leaf identity, or nil when this bus is not a leaf's.
func (b *Bus) Leaf() *LeafIdentity { return b.cfg.Leaf }

// mailEnvelope returns the FedEnvelope of docs/protocol.md §8.3 that the mailbox keeps with a
// message for a leaf (the bus does not import internal/fed; the field names are the wire's).
func mailEnvelope(msg store.Message, p Principal, target, text string) ([]byte, error) {
	return json.Marshal(wireEnvelope{V: 2, ID: msg.ID, To: map[string]any{"ref": target}, Body: text,
		Principal: mailPrincipal{Kind: p.Kind, Harness: p.Harness, SessionID: p.SessionID, Name: p.Name, From: p.From},
		Push:      msg.PushReplies, ThreadID: msg.ThreadID, CreatedAt: msg.CreatedAt})
}

// markDelivered records that the leaf peer acknowledged message id.
func markDelivered(tx *store.Tx, peer, id string) error {
	out, ok, err := tx.Outbound(id)
	if err != nil || !ok || out.Peer != peer {
		return err
	}
	out.Outcome = "delivered"
	if err := tx.PutOutbound(out); err != nil {
		return err
	}
	m, ok, err := tx.Message(id)
	if err != nil || !ok {
		return err
	}
	m.Outcome = "delivered"
	return tx.PutMessage(m)
}

// fedPrincipal is the sender's federation principal: the leaf principal when set, else the
// attested caller's session, else the anonymous sender.
func (s Send) fedPrincipal() Principal {
	switch {
	case s.FedPrincipal != nil:
		return *s.FedPrincipal
	case s.Caller != nil:
		return Principal{Kind: "session", Harness: s.Caller.Harness, SessionID: s.Caller.SessionID, Name: s.Caller.Name}
	}
	return Principal{Kind: "anonymous", From: s.From}
}

type wireEnvelope struct {
	V         int            `json:"v"`
	ID        string         `json:"id"`
	Principal mailPrincipal  `json:"principal"`
	To        map[string]any `json:"to"`
	Body      string         `json:"body"`
	Push      bool           `json:"push_replies"`
	ThreadID  string         `json:"thread_id"`
	CreatedAt int64          `json:"created_at"`
}

type mailPrincipal struct {
	Kind      string `json:"kind"`
	Harness   string `json:"harness,omitempty"`
	SessionID string `json:"session_id,omitempty"`
	Name      string `json:"name,omitempty"`
	From      string `json:"from,omitempty"`
}

// badge is a principal's name in svc origins and policy strings: "claude:alice",
// "svc:matrix", "anon:bob".
func (p Principal) badge() string {
	switch p.Kind {
	case "session":
		return p.Harness + ":" + envelope.AttestedName(p.Harness, p.Name)
	case "service":
		return "svc:" + p.Name
	}
	return "anon:" + p.From
}

// InboxRow is one row of a leaf's mailbox as GET /fed/v2/inbox answers it: the §8.3 fields
// (id, origin, body, to) and, from the stored envelope, what the leaf needs to record the
// message with its return address (principal, push_replies, thread_id, created_at).
type InboxRow struct {
	ID          string          `json:"id"`
	Origin      json.RawMessage `json:"origin"`
	Body        string          `json:"body"`
	To          string          `json:"to"`
	Principal   json.RawMessage `json:"principal,omitempty"`
	PushReplies bool            `json:"push_replies"`
	ThreadID    string          `json:"thread_id,omitempty"`
	CreatedAt   int64           `json:"created_at"`
}

// InboxRowOf is the wire row of a mailbox entry.
func InboxRowOf(e store.MailboxEntry) *InboxRow {
	r := &InboxRow{ID: e.ID, Origin: e.Origin, Body: e.Body, To: e.TargetRef, CreatedAt: e.CreatedAt}
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

// MailboxLen counts the rows waiting for peer.
func (b *Bus) MailboxLen(peer string) int {
	n := 0
	b.cfg.Store.View(func(tx *store.Tx) error { n = tx.MailboxLen(peer); return nil })
	return n
}

// Pulled is a message a leaf pulled from its hub's mailbox, for the leaf's one service.
type Pulled struct {
	ID, Peer    string // the hub's message id (kept, so replies find it there) and the hub
	FromName    string
	Badge       string  // the sender's badge, for the service's origin
	Return      *Caller // the sender as return address; nil for anonymous senders
	Body        string
	PushReplies bool
	ThreadID    string
}

// ErrNotLeaf is returned by the leaf-only operations of a bus that is not a leaf's.
var ErrNotLeaf = errors.New("bus: not a leaf")

// DeliverPulled records a pulled message and queues it for the leaf service, with the hub
// as return host, so a reply goes back there (§7.5). A message already recorded is not
// queued again: after a crash between the local ack and the hub's ack the hub hands the
// row out again, and the service has already acknowledged it; a row still queued is
// delivered by the queue itself. It returns the local session id to wait on.
func (b *Bus) DeliverPulled(p Pulled) (string, error) {
	session, _, err := b.DeliverPulledBatch([]Pulled{p})
	return session, err
}

// WaitAcked blocks until messageID no longer waits in sessionID's queue (its service acked
// it, or retention dropped it), or ctx ends. An ack counts once it is answered, before its
// delete is committed (AckAfter): until then the row is still in the store, and a crash
// delivers it again from there, so the hub may be acked at once.
func (b *Bus) WaitAcked(ctx context.Context, sessionID, messageID string) error {
	for {
		ch, cancel := b.acks.subscribe(messageID)
		b.q.mu.Lock()
		_, acked := b.q.acked[sessionID][messageID]
		b.q.mu.Unlock()
		if acked {
			cancel()
			return nil
		}
		var queued bool
		err := b.cfg.Store.View(func(tx *store.Tx) (err error) {
			queued, err = tx.Queued(sessionID, messageID)
			return err
		})
		if err != nil || !queued {
			cancel()
			return err
		}
		// Retention removes rows without an ack signal: look again now and then.
		t := time.NewTimer(time.Minute)
		select {
		case <-ch:
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			cancel()
			return ctx.Err()
		}
		t.Stop()
		cancel()
	}
}

// leafService admits a registration in leaf mode: only the leaf principal's service name,
// on uid alone (the caller checked the uid). There is no executable to attest: in a pod the
// service runs in another container, whose files the leaf cannot see.
func (b *Bus) leafService(name string) *Error {
	if name != b.cfg.Leaf.Service {
		return errorf("not_recipient", "service '%s' does not match leaf principal '%s'", name, b.cfg.Leaf.Principal)
	}
	return nil
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
	leaf, _ := b.cfg.Fed.Leaf(out.Peer, out.TargetRef)
	return leaf
}

// LeafInboxBatch is LeafInbox for a batch (docs/protocol.md §8.3, this daemon's extension):
// the oldest mail of leaf peer, at most maxN rows and, past the first, maxBytes of stored
// rows, waiting up to wait (at most MaxWait) for one; nil when none came.
func (b *Bus) LeafInboxBatch(ctx context.Context, peer string, wait time.Duration, maxN, maxBytes int) ([]store.MailboxEntry, error) {
	if wait > MaxWait {
		wait = MaxWait
	}
	var timer *time.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	for {
		ch, cancel := b.queues.subscribe(leafKey(peer))
		var rows []store.MailboxEntry
		err := b.cfg.Store.View(func(tx *store.Tx) (err error) {
			rows, err = tx.MailboxBatch(peer, maxN, maxBytes)
			return err
		})
		if err != nil || len(rows) > 0 || wait <= 0 {
			cancel()
			return rows, err
		}
		if timer == nil {
			timer = time.NewTimer(wait)
		}
		select {
		case <-ch:
			cancel()
		case <-timer.C:
			cancel()
			return nil, nil
		case <-ctx.Done():
			cancel()
			return nil, nil
		}
	}
}

// LeafAckBatch deletes the mail ids from leaf peer's mailbox in one commit and marks each
// delivered, as LeafAck does one; ids not there (acked before) are skipped. It returns how
// many it removed.
func (b *Bus) LeafAckBatch(peer string, ids []string) (int, error) {
	var acked []string
	err := b.cfg.Store.Update(func(tx *store.Tx) error {
		acked = acked[:0]
		for _, id := range ids {
			ok, err := tx.AckMailbox(peer, id)
			if err != nil {
				return err
			}
			if !ok {
				continue
			}
			if err := markDelivered(tx, peer, id); err != nil {
				return err
			}
			acked = append(acked, id)
		}
		return nil
	})
	if err != nil {
		return 0, err
	}
	for _, id := range acked {
		b.cfg.Log.Info("accepted", "socket", "fed", "actor", "fed:"+peer, "request", "inbox_ack", "message_id", id)
	}
	return len(acked), nil
}

// DeliverPulledBatch is DeliverPulled for rows pulled together, in one commit: it records
// and queues them in order until the service's queue (or the hub's share of it) is full.
// It returns how many of ps, from the first, are recorded (those now wait in the queue, or
// were acknowledged before); the rest are not, and come again with the next pull. When
// not even the first fits, the error is the full queue's 503.
func (b *Bus) DeliverPulledBatch(ps []Pulled) (session string, n int, err error) {
	if b.cfg.Leaf == nil {
		return "", 0, ErrNotLeaf
	}
	session = "svc:" + b.cfg.Leaf.Service
	share := b.cfg.Bounds.queueShare()
	var queued []string
	full := false
	err = b.cfg.Store.Update(func(tx *store.Tx) error {
		now := b.nowUnix()
		n, queued, full = 0, queued[:0], false
		for _, p := range ps {
			if _, found, err := tx.Message(p.ID); err != nil {
				return err
			} else if found {
				n++ // recorded before (a redelivery): the queue, or an ack, has it
				continue
			}
			msg, pending := pulledRecord(p, session, now)
			// The hub is the origin whose share this row takes: with several hubs, one of
			// them cannot fill the service's queue for the others.
			pending.Share = "fed:" + p.Peer
			if _, err := tx.EnqueueShare(pending, store.MaxQueue, share); errors.Is(err, store.ErrQueueFull) {
				full = true
				return nil // what came before is committed; the rest waits on the hub
			} else if err != nil {
				return err
			}
			if err := tx.PutMessage(msg); err != nil {
				return err
			}
			queued = append(queued, p.ID)
			n++
		}
		return nil
	})
	if err != nil {
		return "", 0, err
	}
	if len(queued) > 0 {
		b.uncounted(session)
		for _, id := range queued {
			b.audit("leaf", "fed:"+ps[0].Peer, "pull", session, id, nil)
		}
		b.queues.fire(session)
	}
	if n == 0 && full {
		return "", 0, errorf("service_unavailable", "svc session message queue is full")
	}
	return session, n, nil
}

// pulledRecord is the message row and queue entry of a pulled message.
func pulledRecord(p Pulled, session string, now int64) (store.Message, store.Pending) {
	msg := store.Message{ID: p.ID, CreatedAt: now, SessionID: session, FromName: p.FromName, Bytes: len(p.Body), Outcome: "delivered",
		RecipientHarness: svc.Name, ReturnHost: p.Peer, ThreadID: p.ThreadID}
	if msg.ThreadID == "" {
		msg.ThreadID = p.ID
	}
	if p.Return != nil {
		msg.ReturnHarness, msg.ReturnSessionID, msg.PushReplies = p.Return.Harness, p.Return.SessionID, p.PushReplies
	}
	pending := store.Pending{ID: p.ID, SessionID: session, CreatedAt: now, FromName: p.FromName, Bytes: len(p.Body),
		Text: p.Body, Envelope: envelope.Plain(p.FromName, p.ID, p.Body), Origin: fedOrigin(p.Peer, p.Badge)}
	return msg, pending
}

// mailboxFull is the refusal of a send to a leaf whose mailbox holds its bound.
func mailboxFull(peer string, maxN, maxBytes int) *Error {
	var bounds []string
	if maxN > 0 {
		bounds = append(bounds, fmt.Sprintf("%d messages", maxN))
	}
	if maxBytes > 0 {
		bounds = append(bounds, fmt.Sprintf("%d bytes", maxBytes))
	}
	return errorf("service_unavailable", "mailbox of leaf '%s' is full (%s)", peer, strings.Join(bounds, " or "))
}
