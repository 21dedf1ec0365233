package bus

import (
	"context"
	"encoding/json"
	"time"

	"github.com/google/uuid"

	"github.com/xmsg/xmsg/internal/envelope"
	"github.com/xmsg/xmsg/internal/jsonline"
	"github.com/xmsg/xmsg/internal/ledger"
	"github.com/xmsg/xmsg/internal/principal"
	"github.com/xmsg/xmsg/internal/records"
	"github.com/xmsg/xmsg/internal/store"
)

// Federation is what the bus needs to reach other nodes (internal/fed implements it). The
// bus routes: a ref naming another host goes to Send, a reply to a sender on another host to
// PushReply. What a remote send is on the wire, or in a leaf's mailbox, and the records that
// say so, are federation's own, so the bus never imports it. Every method returns refusals as
// *Error with the protocol's code.
type Federation interface {
	// Known reports whether peer is configured (the current peers file).
	Known(peer string) bool
	// Leaf reports whether peer is a leaf: it pulls its mail from us and pushes its replies;
	// we never connect to it.
	Leaf(peer string) bool
	// Send sends s to its peer (docs/protocol.md §8.4), or queues it in a leaf peer's mailbox,
	// and records it: the message row with the sender's return address, the outbound row
	// naming the peer, and s's idempotency key, if any.
	Send(ctx context.Context, s RemoteSend) (Delivery, error)
	// PushReply posts a reply envelope (§8.5) and returns the push outcome: pushed,
	// sender_gone or push_failed.
	PushReply(ctx context.Context, r OutgoingReply) ledger.Outcome
	// Sessions lists a peer's sessions (GET /fed/v2/sessions).
	Sessions(ctx context.Context, peer string) ([]RemoteSession, error)
	// Replies long-polls a peer for replies to a message we sent it.
	Replies(ctx context.Context, peer, id string, after uint64, wait time.Duration) ([]Reply, error)
}

// RemoteHarness is the recipient harness of a message sent to another node (its row's
// RecipientHarness): no harness of this bus, so a reply to it comes from that node.
const RemoteHarness = "fed"

// RemoteSend is a message for a session on another node, with what its records need.
type RemoteSend struct {
	Peer, TargetRef, Text string
	FromName              string
	Bytes                 int
	Principal             principal.Principal // the sender's federation principal
	Return                *Caller             // the sender as return address; nil for anonymous senders
	PushReplies           bool
	// IdemPrincipal and Key are the send's idempotency key; Key "" is none.
	IdemPrincipal, Key string
}

// Message is s's message row: sent from host as id, with outcome.
func (s RemoteSend) Message(id, host string, outcome ledger.Outcome, now int64) store.Message {
	m := store.Message{ID: id, CreatedAt: now, SessionID: s.TargetRef, FromName: s.FromName, Bytes: s.Bytes,
		Outcome: outcome, RecipientHarness: RemoteHarness, ThreadID: id, ReturnHost: host}
	if s.Return != nil {
		m.ReturnHarness, m.ReturnSessionID, m.PushReplies = s.Return.Harness, s.Return.SessionID, s.PushReplies
	}
	return m
}

// Idem is the idempotency record of s answered d, nil without a key.
func (s RemoteSend) Idem(d Delivery, now int64) *store.Idem {
	if s.Key == "" {
		return nil
	}
	return &store.Idem{Principal: s.IdemPrincipal, Key: s.Key, Body: s.Text, MessageID: d.MessageID,
		SessionID: d.SessionID, FromName: d.FromName, Bytes: d.Bytes, Outcome: d.Outcome, CreatedAt: now}
}

// OutgoingReply is a reply for a peer's sender.
type OutgoingReply struct {
	Peer, ID, InReplyTo string
	Replier             Caller
	Text                string
	CreatedAt           int64
}

// RemoteSession is one of a peer's sessions (GET /v1/sessions?peer=P, docs/protocol.md §3.3).
type RemoteSession struct {
	Harness   string
	Kind      string
	Name      *string // nil when the peer gave none
	Ref       string  // <sessionId>@<peer>: how a send here names it
	SessionID string
	Status    string
}

// FedOrigin is the svc origin (docs/protocol.md §7.3) of mail that came from, or goes to,
// host on behalf of principal (a badge: "claude:alice", "svc:matrix", "anon:bob").
// It is json.Marshal of the map {kind, host, principal} (keys sorted), written by hand: a hub
// writes one with each leaf message and a leaf with each row it pulls (TestFedOriginIsMarshal).
func FedOrigin(host, principal string) json.RawMessage {
	raw := make([]byte, 0, 40+len(host)+len(principal))
	raw = append(raw, `{"host":`...)
	raw = jsonline.AppendString(raw, host, true)
	raw = append(raw, `,"kind":"fed","principal":`...)
	raw = jsonline.AppendString(raw, principal, true)
	return append(raw, '}')
}

func unknownPeer(host string) *Error {
	return errorf(ledger.UnknownPeer, "unknown peer '%s'", host)
}

// sendRemote hands s for target on peer to federation, which sends and records it.
func (b *Bus) sendRemote(ctx context.Context, s Send, target, peer string) (Delivery, error) {
	if b.cfg.Fed == nil || !b.cfg.Fed.Known(peer) {
		return Delivery{}, unknownPeer(peer)
	}
	d, err := b.cfg.Fed.Send(ctx, RemoteSend{Peer: peer, TargetRef: target, Text: s.Text, FromName: s.FromName, Bytes: s.Bytes,
		Principal: s.fedPrincipal(), Return: s.Caller, PushReplies: s.PushReplies, IdemPrincipal: s.Principal, Key: s.Key})
	d.Peer = peer // a configured peer's name: the send's event counts under it, sent or refused
	return d, err
}

// pushRemote plans the push of a reply to a sender on another node (docs/protocol.md §8.5). The
// pushed message's rows (message + outbound) commit with the reply, so the peer's sender
// can reply to the reply and only that peer may.
func (b *Bus) pushRemote(ctx context.Context, caller Caller, msg store.Message, text string, now int64) pushPlan {
	if b.cfg.Fed == nil || !b.cfg.Fed.Known(msg.ReturnHost) {
		return pushPlan{outcome: ledger.PushFailed}
	}
	id, err := uuid.NewV7()
	if err != nil {
		return pushPlan{outcome: ledger.PushFailed}
	}
	pushed := &store.Message{ID: id.String(), CreatedAt: now, SessionID: msg.ReturnSessionID, FromName: envelope.AttestedBadge(b.cfg.Host, caller.Harness, caller.Name),
		Bytes: len(text), Outcome: ledger.Accepted, RecipientHarness: RemoteHarness, ReturnHarness: caller.Harness, ReturnSessionID: caller.SessionID,
		ReturnHost: b.cfg.Host, PushReplies: true, ThreadID: msg.ThreadID}
	out := &store.Outbound{ID: pushed.ID, Peer: msg.ReturnHost, TargetRef: msg.ReturnSessionID, Outcome: ledger.Accepted, CreatedAt: now}
	return pushPlan{outcome: ledger.Pushed, msg: pushed, out: out, deliver: func() ledger.Outcome {
		return b.cfg.Fed.PushReply(context.WithoutCancel(ctx), OutgoingReply{Peer: msg.ReturnHost, ID: pushed.ID, InReplyTo: msg.ID,
			Replier: caller, Text: text, CreatedAt: now})
	}}
}

// InboundReply is an inbound reply envelope whose version, peer permission and rate fed
// already checked.
type InboundReply struct {
	ID, Peer, InReplyTo string
	Replier             Caller
	Text                string
}

// AcceptReply records a reply from peer to a message we sent it and pushes it to the local
// sender (docs/protocol.md §8.3 POST /fed/v2/replies). The caller has waited for the record
// of that send, which a reply can overtake. Only the peer the message went to may
// reply, and only to a sender that asked for pushes. Retries of an envelope id answer the
// stored result.
func (b *Bus) AcceptReply(ctx context.Context, r InboundReply) (outcome ledger.Outcome, messageID string, err error) {
	if len(r.Text) > b.cfg.MaxBody {
		return ledger.NoOutcome, "", errorf(ledger.PayloadTooLarge, "text %d exceeds limit %d", len(r.Text), b.cfg.MaxBody)
	}
	idemPrincipal := "fed-reply:" + r.Peer
	defer b.keys.lock(idemPrincipal + "\x00" + r.ID)()
	if rec, found, err := b.idem(idemPrincipal, r.ID); err != nil {
		return ledger.NoOutcome, "", err
	} else if found {
		return rec.Outcome, rec.MessageID, nil
	}
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
		return ledger.NoOutcome, "", err
	}
	if !foundOut || !foundMsg || out.Peer != r.Peer || b.expired(msg.CreatedAt) {
		return ledger.NoOutcome, "", errorf(ledger.NotRecipient, "message '%s' was not sent to peer '%s'", r.InReplyTo, r.Peer)
	}
	if msg.ReturnHarness == "" || msg.ReturnSessionID == "" || !msg.PushReplies {
		return ledger.NoOutcome, "", errorf(ledger.NotRecipient, "message '%s' takes no pushed replies", r.InReplyTo)
	}
	// The new message id is the peer's: it is the pushed message here, and the peer holds
	// the outbound row for it, so the sender can reply to the reply.
	if _, err := uuid.Parse(r.ID); err != nil {
		return ledger.NoOutcome, "", badRequest("id must be a UUID")
	}
	now := b.nowUnix()
	badge := envelope.AttestedBadge(r.Peer, r.Replier.Harness, r.Replier.Name)
	plan := b.push(r.Replier, r.Peer, msg, r.ID, badge, envelope.ReplyBody(msg.ID, r.ID, r.Text),
		envelope.FedReplyPlain(msg.ID, badge, r.ID, r.Text), r.Text, now)
	reply := store.Reply{MessageID: msg.ID, CreatedAt: now, ReplierSessionID: r.Replier.SessionID, Text: r.Text}
	reply, err = b.commitReply(reply, plan)
	if err != nil {
		return ledger.NoOutcome, "", err
	}
	if err := b.cfg.Store.Update(func(tx *store.Tx) error {
		return records.Key(tx, &store.Idem{Principal: idemPrincipal, Key: r.ID, Body: r.Text, MessageID: r.ID, Outcome: reply.PushOutcome, CreatedAt: now})
	}); err != nil {
		return ledger.NoOutcome, "", err
	}
	return reply.PushOutcome, r.ID, nil
}

// PeerReplies is a peer's long-poll for replies to a message it sent us: only the message's
// return host may read them.
func (b *Bus) PeerReplies(ctx context.Context, peer, id string, after uint64, wait time.Duration) ([]Reply, error) {
	m, found, err := b.message(id)
	if err != nil {
		return nil, err
	}
	if !found {
		return nil, messageNotFound(id)
	}
	if m.ReturnHost != peer || m.RecipientHarness == RemoteHarness {
		return nil, errorf(ledger.OpDenied, "message '%s' did not come from peer '%s'", id, peer)
	}
	return b.Replies(ctx, id, after, wait)
}

// RemoteSessions lists peer's sessions (GET /v1/sessions?peer=P).
func (b *Bus) RemoteSessions(ctx context.Context, peer string) ([]RemoteSession, error) {
	if b.cfg.Fed == nil || !b.cfg.Fed.Known(peer) {
		return nil, errorf(ledger.NotFound, "unknown peer '%s'", peer)
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
func (b *Bus) cacheReplies(id string, remote []Reply) (bool, error) {
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
			if _, err := records.Replied(tx, store.Reply{MessageID: id, CreatedAt: r.CreatedAt, ReplierSessionID: r.ReplierSessionID, Text: r.Text}); err != nil {
				return err
			}
			added = true
		}
		return nil
	})
	if added {
		b.replies.Fire(id)
	}
	return added, err
}

// fedPrincipal is the sender's federation principal: the leaf principal when set, else the
// attested caller's session, else the anonymous sender.
func (s Send) fedPrincipal() principal.Principal {
	switch {
	case s.FedPrincipal != nil:
		return *s.FedPrincipal
	case s.Caller != nil:
		return principal.Principal{Kind: principal.Session, Harness: s.Caller.Harness, SessionID: s.Caller.SessionID, Name: s.Caller.Name}
	}
	return principal.Principal{Kind: principal.Anonymous, From: s.From}
}
