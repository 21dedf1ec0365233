package store

import "sync"

// A leaf's mailbox is bounded (PutMailboxMax), and the bound is checked in the transaction
// that puts the row, while the commit's writer lock is held. Counting the rows there is a
// pass over the mailbox: at a bound of thousands of rows, each put to a mailbox near its
// bound (a leaf slow to pull, a flood at an offline one) held every other writer of the hub
// for that long. So the store keeps what it knows of each mailbox's rows and bytes as of
// its last commit, and a write transaction counts from that, passing over a mailbox only the
// first time it is asked of it. The counts change only where this package changes the rows,
// each in the transaction that changes them; a transaction's counts are kept only once it
// is committed, and a purge forgets them all.

type boxSize struct{ n, bytes int }

// mailboxSizes is what the store knows of its mailboxes as of its last commit. Only the
// committing writer reads or changes it (one at a time); the lock is for the race detector
// and for peace of mind, never contended.
type mailboxSizes struct {
	mu    sync.Mutex
	known map[string]boxSize
}

// maxKnownBoxes bounds what is kept (a hub has one mailbox per configured leaf, and a peers
// file holds some 100,000 of them); past it the sizes are forgotten and counted again as they
// are asked for.
var maxKnownBoxes = 1 << 18

// boxTx is a write transaction's view of the mailboxes' sizes: those it has learned or
// changed (sizes), over what the store knew when it began (store; nil in a read transaction,
// which counts).
type boxTx struct {
	store *mailboxSizes
	sizes map[string]boxSize
	// purged: rows went without being counted; nothing the store knew holds in this
	// transaction, and only sizes is kept at its commit.
	purged bool
}

// committed keeps what b learned and changed, b's transaction having been committed.
func (s *mailboxSizes) committed(b *boxTx) {
	if b == nil || (b.sizes == nil && !b.purged) {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if b.purged || s.known == nil || len(s.known)+len(b.sizes) > maxKnownBoxes {
		s.known = make(map[string]boxSize, len(b.sizes))
	}
	if len(b.sizes) > maxKnownBoxes {
		return // more than is kept: counted again as they are asked for
	}
	for peer, size := range b.sizes {
		s.known[peer] = size
	}
}

// lookup returns what b knows of peer's mailbox.
func (b *boxTx) lookup(peer string) (boxSize, bool) {
	if size, ok := b.sizes[peer]; ok {
		return size, true
	}
	if b.purged {
		return boxSize{}, false
	}
	b.store.mu.Lock()
	size, ok := b.store.known[peer]
	b.store.mu.Unlock()
	return size, ok
}

func (b *boxTx) set(peer string, size boxSize) {
	if b.sizes == nil {
		b.sizes = map[string]boxSize{}
	}
	b.sizes[peer] = size
}

// mailboxSize is MailboxSize from what the transaction knows, counted once where it knows
// nothing of peer's mailbox.
func (t *Tx) mailboxSize(peer string) boxSize {
	if t.boxes.store == nil {
		n, bytes := t.MailboxSize(peer)
		return boxSize{n, bytes}
	}
	if size, ok := t.boxes.lookup(peer); ok {
		return size
	}
	n, bytes := t.MailboxSize(peer)
	t.boxes.set(peer, boxSize{n, bytes})
	return boxSize{n, bytes}
}

// mailboxChanged counts dn rows and dbytes bytes more in peer's mailbox. A mailbox the
// transaction knows nothing of stays unknown: counted later, the count sees the change in
// the rows themselves.
func (t *Tx) mailboxChanged(peer string, dn, dbytes int) {
	if t.boxes.store == nil {
		return
	}
	size, ok := t.boxes.lookup(peer)
	if !ok {
		return
	}
	t.boxes.set(peer, boxSize{size.n + dn, size.bytes + dbytes})
}

// mailboxesPurged forgets every size: rows went without being counted.
func (t *Tx) mailboxesPurged() {
	t.boxes.sizes, t.boxes.purged = nil, true
}

// MailboxLens counts the mail waiting for each of peers as of the last commit: from what the
// store knows of a mailbox, else by a pass over it, all in one read transaction. It is a
// gauge's reading (metrics): a scrape of a hub with thousands of leaves makes neither a
// transaction nor, for a mailbox a write has counted, a pass per leaf.
func (s *Store) MailboxLens(peers []string) ([]int, error) {
	lens := make([]int, len(peers))
	var unknown []int
	s.boxes.mu.Lock()
	for i, peer := range peers {
		if size, ok := s.boxes.known[peer]; ok {
			lens[i] = size.n
		} else {
			unknown = append(unknown, i)
		}
	}
	s.boxes.mu.Unlock()
	if len(unknown) == 0 {
		return lens, nil
	}
	return lens, s.View(func(tx *Tx) error {
		for _, i := range unknown {
			lens[i] = tx.MailboxLen(peers[i])
		}
		return nil
	})
}
