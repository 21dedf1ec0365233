package bus

import (
	"errors"
	"fmt"
	"strings"

	"github.com/xmsg/xmsg/internal/agy"
	"github.com/xmsg/xmsg/internal/envelope"
	"github.com/xmsg/xmsg/internal/ledger"
	"github.com/xmsg/xmsg/internal/peercred"
	"github.com/xmsg/xmsg/internal/records"
	"github.com/xmsg/xmsg/internal/store"
)

// agySession is what an agy registration holds beyond the common fields. Its
// credentials live in memory only (docs/protocol.md §9), guarded by Bus.mu, never logged.
type agySession struct {
	presence agy.Presence
	creds    *agy.Credentials
	stale    bool
}

// agyQueue is the durable queue of a conversation: it outlives the agy process, so that
// messages queued before a restart are flushed to the next one.
func agyQueue(conversation string) string { return agy.Name + ":" + conversation }

// Agy is the bus's Antigravity side: what only agy sessions ask of it (an MCP bridge's
// start, a conversation's credentials, the flush of its queue once they are known).
type Agy struct{ b *Bus }

// Agy is the bus's Antigravity side.
func (b *Bus) Agy() Agy { return Agy{b} }

// MCPStart attests the agy session an MCP bridge runs under (docs/protocol.md §4.1 mcp_start): an
// ancestor of pid runs a trusted agy executable and holds a conversation's presence lock.
// The session is created unregistered (no credentials) and stays while the lock is held.
func (a Agy) MCPStart(pid int) (string, error) {
	b := a.b
	chain, err := b.cfg.Proc.Ancestors(pid, 32)
	if err == nil {
		for _, st := range chain {
			if !b.cfg.Agy.IsAgy(st.PID) {
				continue
			}
			p, err := b.cfg.Agy.Attest(st.PID, "")
			if err != nil {
				b.cfg.Log.Warn("agy attestation failed", "peer_pid", pid, "err", err)
				break
			}
			r, err := b.agyLease(st, p, nil)
			if err != nil {
				return "", err
			}
			return r.SessionID, nil
		}
	}
	return "", errorf(ledger.Unattested, "peer PID %d does not descend from a trusted agy process holding a presence lock", pid)
}

// Register stores the credentials of a conversation (register.sock credential frame):
// the peer must descend from the trusted agy process holding that conversation's presence
// lock. connectStart is the peer's start time at connect.
func (a Agy) Register(c agy.Credentials, cred peercred.Cred, connectStart string) (*Registration, error) {
	b := a.b
	if err := b.checkUID(cred); err != nil {
		return nil, err
	}
	chain, err := b.cfg.Proc.Ancestors(cred.PID, 32)
	if err != nil || (connectStart != "" && chain[0].StartTime != connectStart) {
		return nil, errorf(ledger.NotRecipient, "peer process %d is gone", cred.PID)
	}
	for _, st := range chain {
		if !b.cfg.Agy.IsAgy(st.PID) {
			continue
		}
		p, err := b.cfg.Agy.Attest(st.PID, c.Conversation)
		if err != nil {
			b.cfg.Log.Warn("agy attestation failed", "peer_pid", cred.PID, "err", err)
			break
		}
		return b.agyLease(st, p, &c)
	}
	return nil, errorf(ledger.Unattested, "peer process %d does not descend from a trusted agy process holding the presence lock of conversation %s", cred.PID, c.Conversation)
}

// agyLease makes (or renews) the registration of the agy process st present in p's
// conversation; creds, when not nil, replace its credentials.
func (b *Bus) agyLease(st peercred.Stat, p agy.Presence, creds *agy.Credentials) (*Registration, error) {
	if b.locks == nil {
		return nil, errorf(ledger.Unattested, "agy presence locks cannot be watched")
	}
	// Watch before the lease exists, then check the lock again: a lock removed in between is
	// reported or seen, never missed.
	if err := b.locks.Watch(strings.TrimSuffix(p.Lock, "/"+p.Conversation+".lock")); err != nil {
		b.cfg.Log.Warn("agy presence dir not watchable", "err", err)
		return nil, errorf(ledger.Unattested, "the presence lock of %s cannot be watched", p.Conversation)
	}
	if !b.cfg.Agy.Held(p) {
		return nil, errorf(ledger.Unattested, "the presence lock of %s is no longer held", p.Conversation)
	}
	id := fmt.Sprintf("%s:%d:%s", agy.Name, st.PID, st.StartTime)
	b.mu.Lock()
	defer b.mu.Unlock()
	r := b.regs[id]
	if r == nil || r.agy == nil || r.agy.presence != p {
		r = &Registration{Harness: agy.Name, SessionID: id, Name: p.Conversation, Cwd: "/", PID: st.PID, Start: st.StartTime,
			RegisteredAt: b.nowUnix(), Lock: p.Lock, agy: &agySession{presence: p}}
		b.install(r)
		b.cfg.Log.Info("agy session", "session_id", id, "peer_pid", st.PID)
	}
	if creds != nil {
		c := *creds
		r.agy.creds, r.agy.stale = &c, false
		b.cfg.Log.Info("agy credentials registered", "session_id", id) // never the credentials
	}
	return r, nil
}

// HasCredentials reports whether a live agy session of the conversation (or with that
// session id) holds credentials that are not known to be stale.
func (a Agy) HasCredentials(ref string) bool {
	b := a.b
	ref = strings.ToLower(strings.TrimSpace(ref))
	for _, r := range b.liveRegistrations() {
		if r.agy == nil || (r.agy.presence.Conversation != ref && r.SessionID != ref && r.SessionID != agy.Name+":"+ref) {
			continue
		}
		if c, _ := b.agyCredentials(r); c != nil {
			return true
		}
	}
	return false
}

// agyCredentials returns a copy of r's usable credentials (nil when none or stale).
func (b *Bus) agyCredentials(r *Registration) (*agy.Credentials, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if r.agy == nil || r.agy.creds == nil || r.agy.stale {
		return nil, false
	}
	c := *r.agy.creds
	return &c, true
}

func (b *Bus) markStale(r *Registration) {
	b.mu.Lock()
	if r.agy != nil {
		r.agy.stale = true
	}
	b.mu.Unlock()
	b.cfg.Log.Warn("agy credentials stale", "session_id", r.SessionID)
}

// agyDeliver runs agentapi for one message and maps its outcome to the protocol's errors
// (docs/protocol.md §5.3): auth failure marks the credentials stale (503 credentials_stale), a
// non-zero exit is 502, a timeout 504.
func (b *Bus) agyDeliver(r *Registration, c *agy.Credentials, title, env string) error {
	if b.cfg.AgySend == nil {
		return errorf(ledger.InboxUnavailable, "agentapi is not configured")
	}
	out, err := b.cfg.AgySend(*c, title, env)
	switch out {
	case agy.Delivered:
		return nil
	case agy.AuthFailed:
		b.markStale(r)
		return errorf(ledger.CredentialsStale, "agy credentials for %s are stale; run the agy hook again", r.agy.presence.Conversation)
	case agy.TimedOut:
		return errorf(ledger.InboxTimeout, "agentapi did not deliver within %s", agy.Timeout)
	}
	b.cfg.Log.Warn("agentapi failed", "session_id", r.SessionID, "err", err)
	return errorf(ledger.InboxUnavailable, "agentapi failed")
}

// Flush delivers r's conversation queue in FIFO order now that it has credentials. Each
// message is removed only after agentapi took it, so each is delivered exactly once unless
// the daemon dies in between; the first failure stops the flush (the rest stay queued).
func (a Agy) Flush(r *Registration) int {
	b := a.b
	n := 0
	for {
		c, ok := b.agyCredentials(r)
		if !ok {
			return n
		}
		var p store.Pending
		var found bool
		err := b.cfg.Store.View(func(tx *store.Tx) (err error) {
			p, found, err = tx.Head(agyQueue(r.agy.presence.Conversation))
			return err
		})
		if err != nil || !found {
			return n
		}
		if err := b.agyDeliver(r, c, p.FromName, p.Envelope); err != nil {
			b.cfg.Log.Warn("agy flush stopped", "session_id", r.SessionID, "message_id", p.ID, "code", AsError(err).Code)
			return n
		}
		if err := b.cfg.Store.Update(func(tx *store.Tx) error {
			if _, err := tx.Ack(agyQueue(r.agy.presence.Conversation), p.ID); err != nil {
				return err
			}
			// A pushed reply's row was written as delivered already; a queued message's
			// reads delivered from now on.
			_, err := records.Settled(tx, p.ID, ledger.Queued, ledger.Delivered)
			return err
		}); err != nil {
			b.cfg.Log.Error("agy flush: ack failed", "message_id", p.ID, "err", err)
			return n
		}
		b.cfg.Events.Emit(ledger.Event{Kind: ledger.Acked, Request: "flush", Transport: ledger.Register, From: r.Caller().Actor(),
			MessageID: p.ID, Harness: r.Harness, Outcome: ledger.Delivered})
		n++
	}
}

// resolveAgy matches live agy sessions by session id (agy:<pid>:<start>, so a recycled pid
// never matches) or by conversation id. An unregistered session is only visible (GET) by its
// exact session id; it can still be sent to by conversation, which queues.
func (b *Bus) resolveAgy(bare string) (Target, error, bool) {
	var hits []*Registration
	for _, r := range b.liveRegistrations() {
		if r.agy == nil {
			continue
		}
		if strings.EqualFold(strings.TrimPrefix(r.SessionID, agy.Name+":"), bare) || strings.EqualFold(r.agy.presence.Conversation, bare) {
			hits = append(hits, r)
		}
	}
	switch len(hits) {
	case 0:
		return Target{}, nil, false
	case 1:
		r := hits[0]
		_, registered := b.agyCredentials(r)
		exact := strings.EqualFold(strings.TrimPrefix(r.SessionID, agy.Name+":"), bare)
		return Target{Harness: agy.Name, SessionID: r.SessionID, Session: b.agyEntry(r), Offline: !registered && !exact, reg: r}, nil, true
	}
	ids := make([]string, len(hits))
	for i, r := range hits {
		ids[i] = r.SessionID
	}
	return Target{}, errorf(ledger.Ambiguous, "%s", strings.Join(ids, ",")), true
}

func (b *Bus) agyEntry(r *Registration) Session {
	v := b.regEntry(r)
	_, registered := b.agyCredentials(r)
	v.Registered = &registered
	if !registered {
		v.Status = "unregistered"
	}
	return v
}

// sendAgy delivers s to the agy target t: through agentapi when the session has usable
// credentials, else into the conversation's queue (outcome queued, sessionId = the
// conversation id). msg is committed before agentapi runs, so a reply finds it.
func (b *Bus) sendAgy(a arrival, t Target, msg store.Message) (Delivery, error) {
	r := t.reg
	env := envelope.Plain(a.fromName, msg.ID, a.text)
	d := Delivery{SessionID: t.SessionID, FromName: a.fromName, Bytes: a.bytes, MessageID: msg.ID, Outcome: ledger.Delivered, Harness: t.Harness}
	c, ok := b.agyCredentials(r)
	var pending *store.Pending
	if !ok {
		d.SessionID, d.Outcome, msg.Outcome = r.agy.presence.Conversation, ledger.Queued, ledger.Queued
		pending = &store.Pending{ID: msg.ID, SessionID: agyQueue(r.agy.presence.Conversation), CreatedAt: msg.CreatedAt, FromName: a.fromName,
			Bytes: a.bytes, Text: a.text, Envelope: env}
	}
	if a.idem != nil {
		a.idem.SessionID, a.idem.Outcome = d.SessionID, d.Outcome
	}
	var enqueue func(*store.Tx) error
	if pending != nil {
		enqueue = func(tx *store.Tx) error { return tx.Enqueue(*pending) }
	}
	err := b.commit(enqueue, msg, a.idem)
	if errors.Is(err, store.ErrQueueFull) {
		return Delivery{}, errorf(ledger.ServiceUnavailable, "agy session message queue is full")
	}
	if err == nil && pending != nil {
		b.uncounted(pending.SessionID)
	}
	if err != nil || pending != nil {
		return d, err
	}
	if err := b.agyDeliver(r, c, a.fromName, env); err != nil {
		b.failed(msg, a.idem)
		return Delivery{}, err
	}
	return d, nil
}

// pushAgy pushes a reply to an agy sender: through agentapi now (after the commit) when it
// has credentials, else into its conversation's queue.
func (b *Bus) pushAgy(sessionID string, pushed *store.Message, badge, body string, now int64, text string) (ledger.Outcome, *store.Pending, func() ledger.Outcome) {
	var r *Registration
	for _, x := range b.liveRegistrations() {
		if x.SessionID == sessionID && x.agy != nil {
			r = x
		}
	}
	if r == nil {
		return ledger.SenderGone, nil, nil
	}
	if c, ok := b.agyCredentials(r); ok {
		return ledger.Pushed, nil, func() ledger.Outcome {
			if err := b.agyDeliver(r, c, badge, body); err != nil {
				return ledger.PushFailed
			}
			return ledger.Pushed
		}
	}
	return ledger.Pushed, &store.Pending{ID: pushed.ID, SessionID: agyQueue(r.agy.presence.Conversation), CreatedAt: now, FromName: badge,
		Bytes: len(text), Text: text, Envelope: body}, nil
}
