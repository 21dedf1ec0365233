package bus

import (
	"context"
	"encoding/json"
	"errors"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/xmsg/xmsg/internal/envelope"
	"github.com/xmsg/xmsg/internal/harness"
	"github.com/xmsg/xmsg/internal/store"
)

// Federation is what the bus needs from the federation package (internal/fed) to reach
// other nodes. The bus stays the one place that routes and stores; the implementation only
// speaks the wire (docs/protocol.md §8), so the bus never imports it. Every method returns
// refusals as *Error with the protocol's status and code.
type Federation interface {
	// Known reports whether peer is configured (the current peers file).
	Known(peer string) bool
	// Leaf reports whether peer is a leaf (it pulls its mail from us; we never connect to
	// it), and for a leaf whether its `targets` allow ref (else an op_denied *Error).
	Leaf(peer, ref string) (bool, error)
	// Send posts a message envelope to its peer (docs/protocol.md §8.4).
	Send(ctx context.Context, m Outgoing) (RemoteDelivery, error)
	// PushReply posts a reply envelope (§8.5) and returns the push outcome: pushed,
	// sender_gone or push_failed.
	PushReply(ctx context.Context, r OutgoingReply) string
	// Sessions lists a peer's sessions (GET /fed/v2/sessions).
	Sessions(ctx context.Context, peer string) ([]RemoteSession, error)
	// Replies long-polls a peer for replies to a message we sent it.
	Replies(ctx context.Context, peer, id string, after uint64, wait time.Duration) ([]ReplyView, error)
}

// Principal is a sender's identity on the federation wire: Kind "session" (an attested
// caller), "service" (a leaf's configured principal, Name is the service name), or
// "anonymous" (an HTTP sender, From is its sanitized name).
type Principal struct {
	Kind      string
	Harness   string
	SessionID string
	Name      string
	From      string
}

// Outgoing is a message for a peer.
type Outgoing struct {
	Peer, ID, TargetRef, Body string
	Principal                 Principal
	PushReplies               bool
	ThreadID                  string
	CreatedAt                 int64
}

// RemoteDelivery is a peer's answer to an accepted message.
type RemoteDelivery struct {
	SessionID string
	Outcome   string
}

// OutgoingReply is a reply for a peer's sender.
type OutgoingReply struct {
	Peer, ID, InReplyTo string
	Replier             Caller
	Text                string
	CreatedAt           int64
}

// RemoteSession is an entry of GET /v1/sessions?peer=P (docs/protocol.md §3.3).
type RemoteSession struct {
	Harness   string  `json:"harness"`
	Kind      string  `json:"kind"`
	Name      *string `json:"name"`
	Ref       string  `json:"ref"`
	SessionID string  `json:"sessionId"`
	Status    string  `json:"status"`
}

// fedTimeout bounds the finishing commits run after the answer is sent.
const fedTimeout = 5 * time.Second

func fedOrigin(host, principal string) json.RawMessage {
	raw, _ := json.Marshal(map[string]string{"kind": "fed", "host": host, "principal": principal})
	return raw
}

func unknownPeer(host string) *Error {
	return errorf("unknown_peer", "unknown peer '%s'", host)
}

// sendRemote sends s to target on peer and records the message row (with the caller's
// return address and this host as return host) and the outbound row naming the peer.
//
// The record is committed WHILE the envelope travels: a pre-record (outcome accepted, as
// the protocol's own pre-records) runs concurrently with the peer's commit and the round
// trip, and the send is answered once both are done. So a durable remote send costs about
// what the peer's commit and one round trip cost, not that plus a commit here. The final
// outcome (and the peer's session id) is written afterwards without holding the answer;
// a crash before it lands leaves "accepted", which is true. With an idempotency key the
// final write is awaited: a retry must find the key. A refused or failed send deletes the
// pre-record, so it changes nothing.
//
// The recipient may reply before the pre-record is committed: the id is registered as in
// flight first, and an inbound reply to an in-flight id waits for it (FedReply).
func (b *Bus) sendRemote(ctx context.Context, s Send, target, peer string) (Delivery, error) {
	if b.cfg.Fed == nil || !b.cfg.Fed.Known(peer) {
		return Delivery{}, unknownPeer(peer)
	}
	if leaf, err := b.cfg.Fed.Leaf(peer, target); err != nil {
		return Delivery{}, err
	} else if leaf {
		return b.sendLeaf(s, target, peer)
	}
	id, err := uuid.NewV7()
	if err != nil {
		return Delivery{}, err
	}
	now := b.nowUnix()
	msg := store.Message{ID: id.String(), CreatedAt: now, SessionID: target, FromName: s.FromName, Bytes: s.Bytes,
		Outcome: "accepted", RecipientHarness: remoteHarness, ThreadID: id.String(), ReturnHost: b.cfg.Host}
	p := s.fedPrincipal()
	if s.Caller != nil {
		msg.ReturnHarness, msg.ReturnSessionID, msg.PushReplies = s.Caller.Harness, s.Caller.SessionID, s.PushReplies
	}
	out := store.Outbound{ID: msg.ID, Peer: peer, TargetRef: target, Outcome: "accepted", CreatedAt: now}
	done := b.inflight.add(msg.ID)
	defer done()
	pre := make(chan error, 1)
	go func() {
		pre <- b.cfg.Store.Update(func(tx *store.Tx) error {
			if err := tx.PutMessage(msg); err != nil {
				return err
			}
			return tx.PutOutbound(out)
		})
	}()
	rd, err := b.cfg.Fed.Send(ctx, Outgoing{Peer: peer, ID: msg.ID, TargetRef: target, Body: s.Text, Principal: p,
		PushReplies: msg.PushReplies, ThreadID: msg.ThreadID, CreatedAt: now})
	preErr := <-pre
	if err != nil || preErr != nil {
		if preErr == nil {
			if uerr := b.cfg.Store.Update(func(tx *store.Tx) error {
				if err := tx.DeleteMessage(msg.ID); err != nil {
					return err
				}
				return tx.DeleteOutbound(msg.ID)
			}); uerr != nil {
				b.cfg.Log.Error("forgetting a failed remote send", "message_id", msg.ID, "err", uerr)
			}
		}
		if err == nil {
			// The peer has it, but we could not record it: the caller must not take this
			// for an ordinary success (a reply to it would be refused here).
			b.cfg.Log.Error("recording a remote send", "message_id", msg.ID, "err", preErr)
			return Delivery{}, preErr
		}
		return Delivery{}, err
	}
	msg.SessionID, msg.Outcome, out.Outcome = rd.SessionID, rd.Outcome, rd.Outcome
	d := Delivery{SessionID: rd.SessionID, FromName: s.FromName, Bytes: s.Bytes, MessageID: msg.ID, Outcome: rd.Outcome}
	final := func() error {
		return b.cfg.Store.Update(func(tx *store.Tx) error {
			if err := tx.PutMessage(msg); err != nil {
				return err
			}
			if err := tx.PutOutbound(out); err != nil {
				return err
			}
			if s.Key == "" {
				return nil
			}
			return tx.PutIdem(store.Idem{Principal: s.Principal, Key: s.Key, Body: s.Text, MessageID: d.MessageID,
				SessionID: d.SessionID, FromName: d.FromName, Bytes: d.Bytes, Outcome: d.Outcome, CreatedAt: now})
		})
	}
	if s.Key != "" {
		return d, final()
	}
	b.bg.Add(1)
	go func() {
		defer b.bg.Done()
		if err := final(); err != nil {
			b.cfg.Log.Error("recording a remote delivery", "message_id", msg.ID, "err", err)
		}
	}()
	return d, nil
}

// leafKey is the signal key of a leaf peer's mailbox (distinct from every session id).
func leafKey(peer string) string { return "\x00leaf:" + peer }

// sendLeaf queues s for a leaf peer (docs/protocol.md §8.4): no connection is made; the message,
// its outbound row (outcome queued) and the mailbox entry commit together, and the leaf's
// long-poll on GET /fed/v2/inbox wakes.
func (b *Bus) sendLeaf(s Send, target, peer string) (Delivery, error) {
	id, err := uuid.NewV7()
	if err != nil {
		return Delivery{}, err
	}
	now := b.nowUnix()
	msg := store.Message{ID: id.String(), CreatedAt: now, SessionID: target, FromName: s.FromName, Bytes: s.Bytes,
		Outcome: "queued", RecipientHarness: remoteHarness, ThreadID: id.String(), ReturnHost: b.cfg.Host}
	if s.Caller != nil {
		msg.ReturnHarness, msg.ReturnSessionID, msg.PushReplies = s.Caller.Harness, s.Caller.SessionID, s.PushReplies
	}
	out := store.Outbound{ID: msg.ID, Peer: peer, TargetRef: target, Outcome: "queued", CreatedAt: now}
	// The principal is the sender's badge as in a svc origin (docs/protocol.md §7.3: "claude:alice",
	// "svc:matrix", "anon:bob"), the same a service sees for mail that came over federation.
	origin := fedOrigin(b.cfg.Host, s.fedPrincipal().badge())
	// The envelope is kept with the mail: the leaf records the sender as the return address
	// of its copy (principal, push_replies, thread), so its service's reply comes back here.
	env, err := mailEnvelope(msg, s.fedPrincipal(), target, s.Text)
	if err != nil {
		return Delivery{}, err
	}
	mail := store.MailboxEntry{ID: msg.ID, Peer: peer, TargetRef: target, CreatedAt: now, FromName: s.FromName, Bytes: s.Bytes, Body: s.Text,
		Envelope: env, Origin: origin}
	d := Delivery{SessionID: target, FromName: s.FromName, Bytes: s.Bytes, MessageID: msg.ID, Outcome: "queued"}
	maxN, maxBytes := b.cfg.Bounds.mailbox()
	err = b.cfg.Store.Update(func(tx *store.Tx) error {
		if err := tx.PutMessage(msg); err != nil {
			return err
		}
		if err := tx.PutOutbound(out); err != nil {
			return err
		}
		if err := tx.PutMailboxMax(mail, maxN, maxBytes); err != nil {
			return err
		}
		if s.Key == "" {
			return nil
		}
		return tx.PutIdem(store.Idem{Principal: s.Principal, Key: s.Key, Body: s.Text, MessageID: d.MessageID,
			SessionID: d.SessionID, FromName: d.FromName, Bytes: d.Bytes, Outcome: d.Outcome, CreatedAt: now})
	})
	if errors.Is(err, store.ErrMailboxFull) {
		// Answered like a full service queue: the leaf is behind, the sender may retry.
		return Delivery{}, mailboxFull(peer, maxN, maxBytes)
	}
	if err != nil {
		return Delivery{}, err
	}
	b.queues.fire(leafKey(peer))
	return d, nil
}

// LeafInbox returns the oldest mail for leaf peer without removing it, waiting up to wait
// (at most MaxWait) for one; nil when there is none. It is LeafInboxBatch of one row.
func (b *Bus) LeafInbox(ctx context.Context, peer string, wait time.Duration) (*store.MailboxEntry, error) {
	rows, err := b.LeafInboxBatch(ctx, peer, wait, 1, 0)
	if err != nil || len(rows) == 0 {
		return nil, err
	}
	return &rows[0], nil
}

// LeafAck deletes mail id from leaf peer's mailbox; only that peer's mailbox is searched.
func (b *Bus) LeafAck(peer, id string) error {
	var acked bool
	err := b.cfg.Store.Update(func(tx *store.Tx) (err error) {
		if acked, err = tx.AckMailbox(peer, id); err != nil || !acked {
			return err
		}
		// The leaf acks only after its service acknowledged the message (docs/protocol.md §7.5):
		// from now on the message and its outbound row say delivered.
		return markDelivered(tx, peer, id)
	})
	if err != nil {
		return err
	}
	if !acked {
		return errorf("not_found", "no mail '%s' for peer '%s'", id, peer)
	}
	b.cfg.Log.Info("accepted", "socket", "fed", "actor", "fed:"+peer, "request", "inbox_ack", "message_id", id)
	return nil
}

// inflight holds the ids of remote sends whose records are not committed yet.
type inflight struct {
	mu sync.Mutex
	m  map[string]chan struct{}
}

func (f *inflight) add(id string) (done func()) {
	ch := make(chan struct{})
	f.mu.Lock()
	if f.m == nil {
		f.m = map[string]chan struct{}{}
	}
	f.m[id] = ch
	f.mu.Unlock()
	return func() {
		f.mu.Lock()
		delete(f.m, id)
		f.mu.Unlock()
		close(ch)
	}
}

// wait blocks until id is no longer in flight (or ctx ends).
func (f *inflight) wait(ctx context.Context, id string) {
	f.mu.Lock()
	ch := f.m[id]
	f.mu.Unlock()
	if ch == nil {
		return
	}
	select {
	case <-ch:
	case <-ctx.Done():
	}
}

// pushRemote plans the push of a reply to a sender on another node (docs/protocol.md §8.5). The
// pushed message's rows (message + outbound) commit with the reply, so the peer's sender
// can reply to the reply and only that peer may.
func (b *Bus) pushRemote(ctx context.Context, caller Caller, msg store.Message, text string, now int64) pushPlan {
	if b.cfg.Fed == nil || !b.cfg.Fed.Known(msg.ReturnHost) {
		return pushPlan{outcome: "push_failed"}
	}
	id, err := uuid.NewV7()
	if err != nil {
		return pushPlan{outcome: "push_failed"}
	}
	pushed := &store.Message{ID: id.String(), CreatedAt: now, SessionID: msg.ReturnSessionID, FromName: envelope.AttestedBadge(b.cfg.Host, caller.Harness, caller.Name),
		Bytes: len(text), Outcome: "accepted", RecipientHarness: remoteHarness, ReturnHarness: caller.Harness, ReturnSessionID: caller.SessionID,
		ReturnHost: b.cfg.Host, PushReplies: true, ThreadID: msg.ThreadID}
	out := &store.Outbound{ID: pushed.ID, Peer: msg.ReturnHost, TargetRef: msg.ReturnSessionID, Outcome: "accepted", CreatedAt: now}
	return pushPlan{outcome: "pushed", msg: pushed, out: out, deliver: func() string {
		return b.cfg.Fed.PushReply(context.WithoutCancel(ctx), OutgoingReply{Peer: msg.ReturnHost, ID: pushed.ID, InReplyTo: msg.ID,
			Replier: caller, Text: text, CreatedAt: now})
	}}
}

// FedMessage is an inbound envelope that fed has checked (peer, policy, rate, principal):
// what is left is the bus's part, steps 8-10 of docs/protocol.md §8.3.
type FedMessage struct {
	ID, Peer    string
	Target      Target
	FromName    string
	Return      *Caller // the principal as return address; nil for anonymous senders
	Badge       string  // the principal's badge for svc origins, e.g. "claude:alice"
	Body        string
	PushReplies bool
	ThreadID    string
}

// FedStored returns the stored result of an envelope id already accepted from peer (step 8):
// ok is false when the id is new. An id that belongs to another peer's message, or to a
// local one, is a conflict: a peer can never read or replay what it did not send.
func (b *Bus) FedStored(id, peer string) (Delivery, bool, error) {
	m, found, err := b.message(id)
	if err != nil || !found {
		return Delivery{}, false, err
	}
	if m.ReturnHost != peer || m.RecipientHarness == remoteHarness {
		return Delivery{}, true, errorf("conflict", "message id '%s' is already in use", id)
	}
	switch m.Outcome {
	case "delivered", "queued", "accepted":
		return Delivery{SessionID: m.SessionID, FromName: m.FromName, Bytes: m.Bytes, MessageID: m.ID, Outcome: m.Outcome}, true, nil
	case "not_found":
		return Delivery{}, true, notFound(m.SessionID)
	case "ambiguous":
		return Delivery{}, true, errorf("ambiguous", "%s", m.SessionID)
	case "gone":
		return Delivery{}, true, errorf("gone", "session %s exited", m.SessionID)
	}
	return Delivery{}, true, errorf("delivery_failed", "delivery of message '%s' failed", id)
}

// FedRecordFailure records an inbound envelope whose target did not resolve (step 5), with
// the resolution's outcome, so a retry of the same id gets the same answer.
func (b *Bus) FedRecordFailure(id, peer, ref, fromName string, bytes int, resolveErr error) error {
	outcome := "failed"
	switch AsError(resolveErr).Code {
	case "not_found", "ambiguous", "gone":
		outcome = AsError(resolveErr).Code
	}
	m := store.Message{ID: id, CreatedAt: b.nowUnix(), SessionID: ref, FromName: fromName, Bytes: bytes, Outcome: outcome,
		RecipientHarness: "", ReturnHost: peer, ThreadID: id}
	return b.cfg.Store.Update(func(tx *store.Tx) error { return tx.PutMessage(m) })
}

// DeliverFed records and delivers an inbound envelope (steps 9-10): the message row is
// committed before delivery, with the peer as return host, so that only that peer's sender
// gets the replies.
func (b *Bus) DeliverFed(ctx context.Context, m FedMessage) (d Delivery, err error) {
	defer func() { b.audit("fed", "fed:"+m.Peer, "send", m.Target.SessionID, d.MessageID, err) }()
	// Two copies of one envelope racing (a retry overtaking the original) must not both
	// deliver: the second one, under the lock, finds the first one's row.
	defer b.keys.lock("\x00fed-message\x00" + m.ID)()
	if stored, found, err := b.FedStored(m.ID, m.Peer); found || err != nil {
		return stored, err
	}
	t := m.Target
	now := b.nowUnix()
	msg := store.Message{ID: m.ID, CreatedAt: now, SessionID: t.SessionID, FromName: m.FromName, Bytes: len(m.Body),
		RecipientHarness: t.Harness, ReturnHost: m.Peer, ThreadID: m.ThreadID}
	if msg.ThreadID == "" {
		msg.ThreadID = m.ID
	}
	if m.Return != nil {
		msg.ReturnHarness, msg.ReturnSessionID, msg.PushReplies = m.Return.Harness, m.Return.SessionID, m.PushReplies
	}
	h := b.h.Lookup(t.Harness)
	if h == nil {
		return Delivery{}, errorf("internal", "internal error") // as in Send
	}
	if h.Delivery() == harness.Agentapi {
		// An agy session is reached the way a local send reaches it: agentapi now, or its
		// conversation's queue (which its credential frame flushes), never its session id's
		// queue, which nothing reads.
		msg.Outcome = "delivered"
		return b.sendAgy(Send{FromName: m.FromName, Bytes: len(m.Body), Text: m.Body}, t, msg, nil)
	}
	// Like a local send (bus.Send), the row is committed as delivered BEFORE the Claude
	// inbox sees the message (the session may reply at once, and its reply must find the
	// row), and rewritten as delivery_failed if the inbox refuses it: one commit on the
	// success path instead of the protocol's pre-record + update. A queued harness's row
	// commits together with its queue entry, so "delivered" is true at once.
	msg.Outcome = "delivered"
	var pending *store.Pending
	if h.Delivery() == harness.Queue {
		// The peer is the origin whose share of the queue this row takes (Bounds.QueueShare),
		// whatever principal it names.
		pending = &store.Pending{ID: m.ID, Share: "fed:" + m.Peer, SessionID: t.SessionID, CreatedAt: now, FromName: m.FromName, Bytes: len(m.Body),
			Text: m.Body, Envelope: h.Envelope(m.FromName, envelope.ClaudeBody(m.Body, m.ID), envelope.Plain(m.FromName, m.ID, m.Body))}
		if h.Origin() {
			pending.Origin = fedOrigin(m.Peer, m.Badge)
		}
	}
	err = b.cfg.Store.Update(func(tx *store.Tx) error {
		if pending != nil {
			if _, err := tx.EnqueueShare(*pending, store.MaxQueue, b.cfg.Bounds.queueShare()); err != nil {
				return err
			}
		}
		return tx.PutMessage(msg)
	})
	if errors.Is(err, store.ErrShareFull) {
		return Delivery{}, shareFull(t.Harness, b.cfg.Bounds.queueShare())
	}
	if errors.Is(err, store.ErrQueueFull) {
		return Delivery{}, errorf("service_unavailable", "%s session message queue is full", t.Harness)
	}
	if err != nil {
		return Delivery{}, err
	}
	if pending != nil {
		b.uncounted(t.SessionID)
	}
	d = Delivery{SessionID: t.SessionID, FromName: m.FromName, Bytes: len(m.Body), MessageID: m.ID, Outcome: "delivered"}
	if pending != nil {
		b.queues.fire(t.SessionID)
		return d, nil
	}
	line, err := envelope.ClaudeLine(m.FromName, envelope.ClaudeBody(m.Body, m.ID))
	if err == nil {
		err = b.deliverClaude(t.Claude.MessagingSocketPath, line)
	}
	if err != nil {
		msg.Outcome = "delivery_failed"
		if uerr := b.cfg.Store.Update(func(tx *store.Tx) error { return tx.PutMessage(msg) }); uerr != nil {
			b.cfg.Log.Error("recording failed delivery", "message_id", msg.ID, "err", uerr)
		}
		return Delivery{}, inboxError(err)
	}
	return d, nil
}

// FedReplyIn is an inbound reply envelope whose version, peer permission and rate fed
// already checked.
type FedReplyIn struct {
	ID, Peer, InReplyTo string
	Replier             Caller
	Text                string
}

// FedReply records a reply from peer to a message we sent it and pushes it to the local
// sender (docs/protocol.md §8.3 POST /fed/v2/replies). Only the peer the message went to may
// reply, and only to a sender that asked for pushes. Retries of an envelope id answer the
// stored result.
func (b *Bus) FedReply(ctx context.Context, r FedReplyIn) (outcome, messageID string, err error) {
	defer func() { b.audit("fed", "fed:"+r.Peer, "reply", r.InReplyTo, messageID, err) }()
	if len(r.Text) > b.cfg.MaxBody {
		return "", "", errorf("payload_too_large", "text %d exceeds limit %d", len(r.Text), b.cfg.MaxBody)
	}
	idemPrincipal := "fed-reply:" + r.Peer
	defer b.keys.lock(idemPrincipal + "\x00" + r.ID)()
	if rec, found, err := b.idem(idemPrincipal, r.ID); err != nil {
		return "", "", err
	} else if found {
		return rec.Outcome, rec.MessageID, nil
	}
	// A reply can overtake the commit of the send it answers (see sendRemote).
	wctx, cancel := context.WithTimeout(ctx, fedTimeout)
	b.inflight.wait(wctx, r.InReplyTo)
	cancel()
	var out store.Outbound
	var msg store.Message
	var foundOut, foundMsg bool
	err = b.cfg.Store.View(func(tx *store.Tx) (err error) {
		if out, foundOut, err = tx.Outbound(r.InReplyTo); err != nil {
			return err
		}
		msg, foundMsg, err = tx.Message(r.InReplyTo)
		return err
	})
	if err != nil {
		return "", "", err
	}
	if !foundOut || !foundMsg || out.Peer != r.Peer || b.expired(msg.CreatedAt) {
		return "", "", errorf("not_recipient", "message '%s' was not sent to peer '%s'", r.InReplyTo, r.Peer)
	}
	if msg.ReturnHarness == "" || msg.ReturnSessionID == "" || !msg.PushReplies {
		return "", "", errorf("not_recipient", "message '%s' takes no pushed replies", r.InReplyTo)
	}
	// The new message id is the peer's: it is the pushed message here, and the peer holds
	// the outbound row for it, so the sender can reply to the reply.
	if _, err := uuid.Parse(r.ID); err != nil {
		return "", "", badRequest("id must be a UUID")
	}
	now := b.nowUnix()
	badge := envelope.AttestedBadge(r.Peer, r.Replier.Harness, r.Replier.Name)
	plan := b.push(r.Replier, r.Peer, msg, r.ID, badge, envelope.ReplyBody(msg.ID, r.ID, r.Text),
		envelope.FedReplyPlain(msg.ID, badge, r.ID, r.Text), r.Text, now)
	reply := store.Reply{MessageID: msg.ID, CreatedAt: now, ReplierSessionID: r.Replier.SessionID, Text: r.Text}
	reply, err = b.commitReply(reply, plan)
	if err != nil {
		return "", "", err
	}
	if err := b.cfg.Store.Update(func(tx *store.Tx) error {
		return tx.PutIdem(store.Idem{Principal: idemPrincipal, Key: r.ID, Body: r.Text, MessageID: r.ID, Outcome: reply.PushOutcome, CreatedAt: now})
	}); err != nil {
		return "", "", err
	}
	return reply.PushOutcome, r.ID, nil
}

// FedReplies is a peer's long-poll for replies to a message it sent us: only the message's
// return host may read them.
func (b *Bus) FedReplies(ctx context.Context, peer, id string, after uint64, wait time.Duration) ([]ReplyView, error) {
	m, found, err := b.message(id)
	if err != nil {
		return nil, err
	}
	if !found {
		return nil, messageNotFound(id)
	}
	if m.ReturnHost != peer || m.RecipientHarness == remoteHarness {
		return nil, errorf("op_denied", "message '%s' did not come from peer '%s'", id, peer)
	}
	return b.Replies(ctx, id, after, wait)
}

// RemoteSessions lists peer's sessions (GET /v1/sessions?peer=P).
func (b *Bus) RemoteSessions(ctx context.Context, peer string) ([]RemoteSession, error) {
	if b.cfg.Fed == nil || !b.cfg.Fed.Known(peer) {
		return nil, errorf("not_found", "unknown peer '%s'", peer)
	}
	list, err := b.cfg.Fed.Sessions(ctx, peer)
	if err != nil {
		return nil, err
	}
	for i := range list {
		list[i].Ref = list[i].SessionID + "@" + peer
	}
	return list, nil
}

// remoteReplies serves a reply long-poll on a message we sent to a peer when no reply with
// seq > after is cached here: it fetches the peer's replies and caches what is new
// (deduplicated by text and replier). The peer numbers replies its own way, so the local
// `after` means nothing there: first everything the peer has is fetched at once; if that
// brings nothing new for this caller, the peer is long-polled for replies after the last one
// it numbered, so the wait happens there and the caller is answered when a reply lands.
func (b *Bus) remoteReplies(ctx context.Context, id string, after uint64, wait time.Duration) error {
	var out store.Outbound
	var found bool
	if err := b.cfg.Store.View(func(tx *store.Tx) (err error) {
		out, found, err = tx.Outbound(id)
		return err
	}); err != nil || !found || b.cfg.Fed == nil {
		return err
	}
	remote, err := b.cfg.Fed.Replies(ctx, out.Peer, id, 0, 0)
	if err != nil {
		return err
	}
	added, err := b.cacheReplies(id, remote)
	if err != nil || added || wait <= 0 {
		return err
	}
	var last uint64
	for _, r := range remote {
		last = max(last, r.Seq)
	}
	if remote, err = b.cfg.Fed.Replies(ctx, out.Peer, id, last, wait); err != nil {
		return err
	}
	_, err = b.cacheReplies(id, remote)
	return err
}

// cacheReplies stores the replies of remote not yet cached for message id; it reports
// whether it stored any (and then wakes the local long-polls).
func (b *Bus) cacheReplies(id string, remote []ReplyView) (bool, error) {
	if len(remote) == 0 {
		return false, nil
	}
	added := false
	err := b.cfg.Store.Update(func(tx *store.Tx) error {
		added = false
		have, err := tx.Replies(id, 0)
		if err != nil {
			return err
		}
		seen := map[[2]string]bool{}
		for _, r := range have {
			seen[[2]string{r.Text, r.ReplierSessionID}] = true
		}
		for _, r := range remote {
			k := [2]string{r.Text, r.ReplierSessionID}
			if seen[k] {
				continue
			}
			seen[k] = true
			if _, err := tx.AddReply(store.Reply{MessageID: id, CreatedAt: r.CreatedAt, ReplierSessionID: r.ReplierSessionID, Text: r.Text}); err != nil {
				return err
			}
			added = true
		}
		return nil
	})
	if added {
		b.replies.fire(id)
	}
	return added, err
}
