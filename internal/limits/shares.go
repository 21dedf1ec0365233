package limits

// Shares of what senders share (issue 18): the bus's queues and a hub's leaf mailboxes.
const (
	// QueueMaxPerOrigin is how many of a queue's 100 places (store.MaxQueue) one origin may
	// hold: a federation peer, whatever principals it names, or an attested local session
	// (--queue-max-per-origin). Half: a second sender always finds room.
	QueueMaxPerOrigin = 50
	// LeafMailboxMax and LeafMailboxMaxBytes bound one leaf's mailbox on its hub, in
	// messages and in stored bytes (--leaf-mailbox-max, --leaf-mailbox-max-bytes): what a
	// leaf drains in seconds, and what one leaf's mail can add to the hub's database.
	LeafMailboxMax      = 1000
	LeafMailboxMaxBytes = 16 << 20
)

// Or is bound v with def for 0: a configured bound of 0 means the default (so that a config
// without bounds is bounded), one below 0 no bound, which the store spells 0. It is the one
// 0-means-default rule of every bound, count and duration alike.
func Or[T ~int | ~int64](v, def T) T {
	switch {
	case v == 0:
		return def
	case v < 0:
		return 0
	}
	return v
}

// RequestCap is the largest request that may carry a text of maxBody bytes: every byte of the
// text JSON-escaped (at most 6 bytes each, \u00XX), plus 4,096 for the rest of the object. The
// one rule of http.sock's send, agent.sock's frame and the federation envelope, so a text one
// accepts is never refused by another for its escaping.
func RequestCap(maxBody int) int { return maxBody*6 + 4096 }
