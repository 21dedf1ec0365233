package bus

import "github.com/xmsg/xmsg/internal/store"

// Peek returns up to limit of the oldest unacknowledged messages of r's session, together at
// most maxBytes of text and envelope (the first message is returned whatever its size, so a
// large one cannot block the queue), without waiting and without taking them: they stay
// queued until Ack, as with Poll. It also returns how many more wait behind them. A reader
// whose only way in is a tool call (a Codex thread through `xmsg mcp`) takes a batch this
// way and acknowledges what it handed on, once it has.
func (b *Bus) Peek(r *Registration, limit, maxBytes int) (msgs []Queued, more int, err error) {
	type ref struct {
		key []byte
		m   *queuedMsg
	}
	b.q.mu.Lock()
	sq, err := b.load(r.SessionID)
	if err != nil {
		b.q.mu.Unlock()
		return nil, 0, err
	}
	refs := make([]ref, 0, min(len(sq.rows)+len(b.q.early[r.SessionID]), limit))
	for _, row := range sq.rows {
		if len(refs) == limit {
			break
		}
		refs = append(refs, ref{row.key, row.m})
	}
	for _, e := range b.q.early[r.SessionID] { // queued in memory, their commit not done
		if len(refs) == limit {
			break
		}
		refs = append(refs, ref{nil, e.m})
	}
	total := len(sq.rows) + len(b.q.early[r.SessionID])
	b.q.mu.Unlock()

	used, taken := 0, 0
	for _, rf := range refs {
		m := rf.m
		if m == nil {
			// Not kept in memory: read it outside q.mu, as head does.
			var p store.Pending
			var found bool
			if err := b.cfg.Store.View(func(tx *store.Tx) (err error) {
				p, found, err = tx.QueueRow(rf.key)
				return err
			}); err != nil {
				return nil, 0, err
			}
			if !found {
				taken++ // deleted meanwhile (acked, or retention): not waiting any more
				continue
			}
			m = &queuedMsg{Queued: Queued{ID: p.ID, FromName: p.FromName, Text: p.Text, Envelope: p.Envelope, Origin: p.Origin}, createdAt: p.CreatedAt}
		}
		if rf.key != nil && b.expired(m.createdAt) {
			// Past the TTL: never handed out; the purge (or the next Poll) removes it.
			taken++
			continue
		}
		size := len(m.Text) + len(m.Envelope)
		if len(msgs) > 0 && used+size > maxBytes {
			break
		}
		used += size
		msgs = append(msgs, m.Queued)
		taken++
	}
	return msgs, max(total-taken, 0), nil
}
