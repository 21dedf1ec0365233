package fed

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/xmsg/xmsg/internal/bus"
	"github.com/xmsg/xmsg/internal/hub"
	"github.com/xmsg/xmsg/internal/ledger"
	"github.com/xmsg/xmsg/internal/principal"
	"github.com/xmsg/xmsg/internal/records"
	"github.com/xmsg/xmsg/internal/store"
)

// The outbound half of federation: what a send to another node is, and the records that say
// so. The bus hands a remote ref here (bus.Federation.Send) and nothing else of it: the
// message row with the sender's return address, the outbound row naming the peer and the
// idempotency key are written here, for a peer over the wire and for a leaf into its mailbox.

// outbox is what the outbound half writes to: the node's store, its leaves' mailboxes and
// its clock. Attach sets it once the store is open.
type outbox struct {
	store    *store.Store
	mail     *hub.Mailboxes
	now      func() time.Time
	inflight inflight       // remote sends not yet recorded
	bg       sync.WaitGroup // final records of remote sends, written after the answer
}

// Attach gives the node the store its sends are recorded in and the mailboxes of its leaves
// (nil: this node is a leaf, or has none); now is the clock of the records (nil: time.Now).
// It must be called before the node is handed to a bus.
func (n *Node) Attach(st *store.Store, mail *hub.Mailboxes, now func() time.Time) {
	if now == nil {
		now = time.Now
	}
	n.rec = &outbox{store: st, mail: mail, now: now}
}

// Mailboxes are the node's leaf mailboxes (nil before Attach, or without any).
func (n *Node) Mailboxes() *hub.Mailboxes {
	if n.rec == nil {
		return nil
	}
	return n.rec.mail
}

// LeafPeers are the names of the configured leaf peers, sorted (for their mailboxes' depth).
func (n *Node) LeafPeers() []string {
	var out []string
	for _, p := range n.st.Load().peers.All() {
		if p.Leaf {
			out = append(out, p.Name)
		}
	}
	return out
}

// Leaf implements bus.Federation.
func (n *Node) Leaf(peer string) bool {
	p, ok := n.st.Load().peers.Get(peer)
	return ok && p.Leaf
}

// Send implements bus.Federation: s goes to a leaf peer's mailbox, or over the wire.
//
// Over the wire the record is committed WHILE the envelope travels: a pre-record (outcome
// accepted, as the protocol's own pre-records) runs concurrently with the peer's commit and
// the round trip, and the send is answered once both are done. So a durable remote send
// costs about what the peer's commit and one round trip cost, not that plus a commit here.
// The final outcome (and the peer's session id) is written afterwards without holding the
// answer; a crash before it lands leaves "accepted", which is true. With an idempotency key
// the final write is awaited: a retry must find the key. A refused or failed send deletes the
// pre-record, so it changes nothing.
//
// The recipient may reply before the pre-record is committed: the id is registered as in
// flight first, and an inbound reply to an in-flight id waits for it (Server.replies).
func (n *Node) Send(ctx context.Context, s bus.RemoteSend) (bus.Delivery, error) {
	p, ok := n.st.Load().peers.Get(s.Peer)
	if !ok || n.rec == nil {
		return bus.Delivery{}, &bus.Error{Code: ledger.UnknownPeer, Detail: fmt.Sprintf("unknown peer '%s'", s.Peer)}
	}
	id, err := uuid.NewV7()
	if err != nil {
		return bus.Delivery{}, err
	}
	if p.Leaf {
		return n.queue(p, s, id.String())
	}
	r := n.rec
	now := r.now().Unix()
	msg := s.Message(id.String(), n.cfg.Host, ledger.Accepted, now)
	out := store.Outbound{ID: msg.ID, Peer: s.Peer, TargetRef: s.TargetRef, Outcome: ledger.Accepted, CreatedAt: now}
	done := r.inflight.add(msg.ID)
	defer done()
	pre := make(chan error, 1)
	go func() {
		pre <- r.store.Update(func(tx *store.Tx) error { return records.SentTo(tx, msg, out, nil) })
	}()
	rd, err := n.post(ctx, s.Peer, envelopeOf(s, msg))
	preErr := <-pre
	if err != nil || preErr != nil {
		if preErr == nil {
			if uerr := r.store.Update(func(tx *store.Tx) error { return records.Withdrawn(tx, msg.ID) }); uerr != nil {
				n.cfg.Log.Error("forgetting a failed remote send", "message_id", msg.ID, "err", uerr)
			}
		}
		if err == nil {
			// The peer has it, but we could not record it: the caller must not take this
			// for an ordinary success (a reply to it would be refused here).
			n.cfg.Log.Error("recording a remote send", "message_id", msg.ID, "err", preErr)
			return bus.Delivery{}, preErr
		}
		return bus.Delivery{}, err
	}
	msg.SessionID, msg.Outcome, out.Outcome = rd.SessionID, rd.Outcome, rd.Outcome
	d := bus.Delivery{SessionID: rd.SessionID, FromName: s.FromName, Bytes: s.Bytes, MessageID: msg.ID, Outcome: rd.Outcome}
	idem := s.Idem(d, now)
	final := func() error {
		return r.store.Update(func(tx *store.Tx) error { return records.SentTo(tx, msg, out, idem) })
	}
	if idem != nil {
		return d, final()
	}
	r.bg.Add(1)
	go func() {
		defer r.bg.Done()
		if err := final(); err != nil {
			n.cfg.Log.Error("recording a remote delivery", "message_id", msg.ID, "err", err)
		}
	}()
	return d, nil
}

// queue puts s into leaf peer p's mailbox (docs/protocol.md §8.4): no connection is made; p's
// `targets` apply to what is queued for it. The mail keeps the envelope: the leaf records
// the sender as the return address of its copy (principal, push_replies, thread), so its
// service's reply comes back here.
func (n *Node) queue(p *Peer, s bus.RemoteSend, id string) (bus.Delivery, error) {
	if p.TargetsSet {
		names := []string{s.TargetRef}
		if !strings.Contains(s.TargetRef, ":") {
			names = append(names, "svc:"+s.TargetRef, "session:svc:"+s.TargetRef)
		}
		if !intersects(names, p.Targets) {
			return bus.Delivery{}, &bus.Error{Code: ledger.OpDenied, Detail: "target not allowed for peer"}
		}
	}
	if _, ok := hub.ServiceName(s.TargetRef); !ok {
		// A leaf hosts one service and no session: a ref of any other shape could never be
		// delivered there, and is refused now rather than queued to be dropped.
		return bus.Delivery{}, &bus.Error{Code: ledger.NotFound, Detail: fmt.Sprintf("leaf '%s' serves one service: '%s' names none (want svc:NAME)", s.Peer, s.TargetRef)}
	}
	if n.rec.mail == nil {
		return bus.Delivery{}, &bus.Error{Code: ledger.UnknownPeer, Detail: fmt.Sprintf("unknown peer '%s'", s.Peer)}
	}
	now := n.rec.now().Unix()
	msg := s.Message(id, n.cfg.Host, ledger.Queued, now)
	mail, wire := mailOf(s, msg, n.cfg.Host, now)
	d := bus.Delivery{SessionID: s.TargetRef, FromName: s.FromName, Bytes: s.Bytes, MessageID: id, Outcome: ledger.Queued}
	out := store.Outbound{ID: id, Peer: s.Peer, TargetRef: s.TargetRef, Outcome: ledger.Queued, CreatedAt: now}
	if err := n.rec.mail.Put(mail, wire, msg, out, s.Idem(d, now)); err != nil {
		return bus.Delivery{}, err
	}
	return d, nil
}

// mailOf is the mail that queues s, recorded as msg at now, for its leaf peer, with the
// envelope it keeps, and its row as a pull hands it out: built from s, not read back from
// that envelope as hub.RowOf reads mail from the store (TestMailRowIsRowOf holds the two
// equal). The origin's principal is the sender's badge as in a svc origin (docs/protocol.md
// §7.3: "claude:alice", "svc:matrix", "anon:bob"), the same a service sees for mail that came
// over federation.
func mailOf(s bus.RemoteSend, msg store.Message, host string, now int64) (mail store.MailboxEntry, wire []byte) {
	e := envelopeOf(s, msg)
	p := principal.Append(nil, e.Principal)
	mail = store.MailboxEntry{ID: msg.ID, Peer: s.Peer, TargetRef: s.TargetRef, CreatedAt: now, FromName: s.FromName, Bytes: s.Bytes,
		Body: s.Text, Envelope: appendEnvelope(make([]byte, 0, 256+len(s.Text)), e, p), Origin: bus.FedOrigin(host, s.Principal.Badge())}
	wire, err := hub.EncodeRow(hub.Row{ID: mail.ID, Origin: mail.Origin, Body: mail.Body, To: mail.TargetRef,
		Principal: p, PushReplies: e.PushReplies, ThreadID: e.ThreadID, CreatedAt: now})
	if err != nil {
		return mail, nil // the hub's to build from the mail, as for mail read from the store
	}
	return mail, wire
}

// envelopeOf is the envelope (§8.3) of s, recorded as msg: what goes over the wire, or is
// kept with a leaf's mail.
func envelopeOf(s bus.RemoteSend, msg store.Message) Envelope {
	e := Envelope{V: Version, ID: msg.ID, Principal: s.Principal, Body: s.Text, PushReplies: msg.PushReplies,
		ThreadID: msg.ThreadID, CreatedAt: msg.CreatedAt}
	e.To.Ref = s.TargetRef
	return e
}

// waitRecorded blocks until the send of message id, if in flight, is recorded, at most
// CallTimeout: a reply can overtake the commit of the send it answers.
func (n *Node) waitRecorded(ctx context.Context, id string) {
	if n.rec == nil {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, CallTimeout)
	defer cancel()
	n.rec.inflight.wait(ctx, id)
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
