package bus

import (
	"context"
	"time"

	"github.com/xmsg/xmsg/internal/envelope"
	"github.com/xmsg/xmsg/internal/store"
)

// What the bus knows of leaf nodes (docs/protocol.md §7.5): in leaf mode, its one service and
// the principal it sends as. A hub's mailboxes are internal/hub's, the pull loop is
// internal/leaf's; what a leaf pulls comes in through AcceptBatch.

// LeafIdentity is a leaf's configured principal (--leaf-principal).
type LeafIdentity struct {
	Principal string    // as configured, e.g. "svc:matrix": fromName suffix and idempotency scope
	Fed       Principal // its federation principal (§7.5 parsing rules)
	Service   string    // the one local service admitted: Principal minus "svc:"
}

// Leaf returns the leaf identity, or nil when this bus is not a leaf's.
func (b *Bus) Leaf() *LeafIdentity { return b.cfg.Leaf }

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

// Badge is a principal's name in svc origins and policy strings: "claude:alice",
// "svc:matrix", "anon:bob".
func (p Principal) Badge() string {
	switch p.Kind {
	case "session":
		return p.Harness + ":" + envelope.AttestedName(p.Harness, p.Name)
	case "service":
		return "svc:" + p.Name
	}
	return "anon:" + p.From
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
	return b.cfg.Fed.Leaf(out.Peer)
}
