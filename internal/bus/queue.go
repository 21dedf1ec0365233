package bus

import (
	"context"
	"encoding/json"
	"time"

	"github.com/xmsg/xmsg/internal/store"
)

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
		var p store.Pending
		var found bool
		err := b.cfg.Store.View(func(tx *store.Tx) (err error) {
			p, found, err = tx.Head(r.SessionID)
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
func (b *Bus) Ack(r *Registration, messageID string) error {
	var acked bool
	err := b.cfg.Store.Update(func(tx *store.Tx) (err error) {
		acked, err = tx.Ack(r.SessionID, messageID)
		return err
	})
	if err == nil && acked {
		b.acks.fire(messageID)
		b.cfg.Log.Info("accepted", "socket", "register", "actor", r.Caller().Actor(), "request", "ack", "message_id", messageID)
	}
	return err
}

// Counts summarizes the store for STATUS= and doctor.
func (b *Bus) Counts() (store.Counts, error) {
	var c store.Counts
	err := b.cfg.Store.View(func(tx *store.Tx) error { c = tx.Counts(); return nil })
	return c, err
}
