package store

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/xmsg/xmsg/internal/ledger"
)

// Federation buckets (docs/protocol.md §9), in the same file as everything else so that a send
// and its outbound row commit together:
//   - outbound: message id (UUID v7, ordered) → Outbound, one row per message sent to a peer;
//   - mailbox: peer name + 0x00 + message id → MailboxEntry, mail held for a leaf peer to
//     pull. The peer prefix is the isolation: a leaf's scan starts and ends inside its own
//     prefix, so it can never see another peer's rows.
var (
	bucketOutbound = []byte("outbound")
	bucketMailbox  = []byte("peer_mailbox")
)

func init() { allBuckets = append(allBuckets, bucketOutbound, bucketMailbox) }

// Outbound records a message sent to a peer. Only that peer may reply to it.
type Outbound struct {
	ID        string         `json:"id"`
	Peer      string         `json:"peer"`
	TargetRef string         `json:"targetRef"`
	Outcome   ledger.Outcome `json:"outcome"`
	CreatedAt int64          `json:"createdAt"`
}

// MailboxEntry is a message waiting for a leaf peer to pull it (issue 13).
type MailboxEntry struct {
	ID        string `json:"id"`
	Peer      string `json:"peer"`
	TargetRef string `json:"targetRef"`
	CreatedAt int64  `json:"createdAt"`
	FromName  string `json:"fromName"`
	Bytes     int    `json:"bytes"`
	Body      string `json:"body"`
	Envelope  []byte `json:"envelope"` // the serialized federation envelope
	Origin    []byte `json:"origin"`
}

// Outbound returns the outbound row of message id.
func (t *Tx) Outbound(id string) (Outbound, bool, error) {
	return get[Outbound](t.btx.Bucket(bucketOutbound), []byte(id))
}

// PutOutbound inserts or replaces an outbound row.
func (t *Tx) PutOutbound(o Outbound) error {
	return t.btx.Bucket(bucketOutbound).Put([]byte(o.ID), appendOutbound(make([]byte, 0, 128+len(o.TargetRef)), o))
}

// DeleteOutbound removes an outbound row.
func (t *Tx) DeleteOutbound(id string) error {
	return t.btx.Bucket(bucketOutbound).Delete([]byte(id))
}

func mailboxKey(peer, id string) []byte {
	k := make([]byte, 0, len(peer)+1+len(id))
	k = append(k, peer...)
	k = append(k, 0)
	return append(k, id...)
}

// PutMailbox stores mail for a leaf peer.
func (t *Tx) PutMailbox(e MailboxEntry) error {
	if e.Peer == "" || strings.IndexByte(e.Peer, 0) >= 0 {
		// A NUL inside a name would let one peer's prefix reach into another's keys.
		return fmt.Errorf("store: mailbox entry without a valid peer name")
	}
	return t.putMailbox(e.Peer, mailboxKey(e.Peer, e.ID), appendMailbox(nil, e))
}

// putMailbox writes a mailbox row and counts it.
func (t *Tx) putMailbox(peer string, key, raw []byte) error {
	b := t.btx.Bucket(bucketMailbox)
	old := b.Get(key)
	if err := b.Put(key, raw); err != nil {
		return err
	}
	if old == nil {
		t.mailboxChanged(peer, 1, len(raw))
	} else {
		t.mailboxChanged(peer, 0, len(raw)-len(old))
	}
	return nil
}

// ErrMailboxFull is returned by PutMailboxMax when a leaf's mailbox already holds its bound.
var ErrMailboxFull = errors.New("store: mailbox is full")

// ErrMailboxBytes is the ErrMailboxFull of a row refused for the bound on bytes only: a
// smaller row may still fit.
var ErrMailboxBytes = fmt.Errorf("%w: no room for the row's bytes", ErrMailboxFull)

// MailboxRowSize is the bytes e takes in its mailbox, as PutMailboxMax counts them.
func MailboxRowSize(e MailboxEntry) int { return len(appendMailbox(nil, e)) }

// PutMailboxMax stores mail for a leaf peer unless its mailbox already holds maxN messages or
// the stored rows and this one would pass maxBytes (a bound <= 0 is no bound). The bytes
// are what the rows take in the file (their encodings), so the bound is on what one leaf's
// mail can make the hub's database grow by (issue 18).
func (t *Tx) PutMailboxMax(e MailboxEntry, maxN, maxBytes int) error {
	if maxN <= 0 && maxBytes <= 0 {
		return t.PutMailbox(e)
	}
	if e.Peer == "" || strings.IndexByte(e.Peer, 0) >= 0 {
		return fmt.Errorf("store: mailbox entry without a valid peer name")
	}
	raw := appendMailbox(make([]byte, 0, 256+len(e.Body)*2+len(e.Envelope)*4/3+len(e.Origin)*4/3), e)
	size := t.mailboxSize(e.Peer)
	if maxN > 0 && size.n >= maxN {
		return ErrMailboxFull
	}
	if maxBytes > 0 && size.bytes+len(raw) > maxBytes {
		return ErrMailboxBytes
	}
	return t.putMailbox(e.Peer, mailboxKey(e.Peer, e.ID), raw)
}

// MailboxSize returns how many rows peer's mailbox holds and their encoded bytes. It reads
// keys and value lengths only, nothing is decoded.
func (t *Tx) MailboxSize(peer string) (n, bytes int) {
	prefix := mailboxKey(peer, "")
	c := t.btx.Bucket(bucketMailbox).Cursor()
	for k, v := c.Seek(prefix); k != nil && hasPrefix(k, prefix); k, v = c.Next() {
		n++
		bytes += len(v)
	}
	return n, bytes
}

// MailboxScan calls each with the id and the encoded row of peer's mail, oldest first, until
// it returns false or an error (which MailboxScan returns). id and v are the database's own
// memory: valid during the call only, and never to be changed (DecodeMailbox copies what it
// keeps). A pull passes over every row its leaf holds already, so nothing is allocated for a
// row the caller does not take.
func (t *Tx) MailboxScan(peer string, each func(id, v []byte) (bool, error)) error {
	prefix := mailboxKey(peer, "")
	c := t.btx.Bucket(bucketMailbox).Cursor()
	for k, v := c.Seek(prefix); k != nil && hasPrefix(k, prefix); k, v = c.Next() {
		more, err := each(k[len(prefix):], v)
		if err != nil || !more {
			return err
		}
	}
	return nil
}

// DecodeMailbox decodes a mailbox row MailboxScan handed out.
func DecodeMailbox(v []byte) (MailboxEntry, error) {
	var e MailboxEntry
	if err := json.Unmarshal(v, &e); err != nil {
		return MailboxEntry{}, fmt.Errorf("store: decode mailbox entry: %w", err)
	}
	return e, nil
}

// MailboxHead returns the oldest mail of peer.
func (t *Tx) MailboxHead(peer string) (MailboxEntry, bool, error) {
	prefix := mailboxKey(peer, "")
	b := t.btx.Bucket(bucketMailbox)
	k, _ := b.Cursor().Seek(prefix)
	if k == nil || !hasPrefix(k, prefix) {
		return MailboxEntry{}, false, nil
	}
	return get[MailboxEntry](b, k)
}

// InMailbox reports whether peer's mail id is there.
func (t *Tx) InMailbox(peer, id string) bool {
	return t.btx.Bucket(bucketMailbox).Get(mailboxKey(peer, id)) != nil
}

// AckMailbox deletes peer's mail id; it reports whether it was there.
func (t *Tx) AckMailbox(peer, id string) (bool, error) {
	b := t.btx.Bucket(bucketMailbox)
	k := mailboxKey(peer, id)
	old := b.Get(k)
	if old == nil {
		return false, nil
	}
	if err := b.Delete(k); err != nil {
		return true, err
	}
	t.mailboxChanged(peer, -1, -len(old))
	return true, nil
}

// purgeFed drops outbound rows and mailbox entries older than cutoff.
func purgeFed(t *Tx, cutoff int64) (int, error) {
	n, err := purgeOrdered(t.btx.Bucket(bucketOutbound), cutoff, nil)
	if err != nil {
		return n, err
	}
	m, err := purgeAll(t.btx.Bucket(bucketMailbox), cutoff)
	if m > 0 {
		t.mailboxesPurged()
	}
	return n + m, err
}

// MailboxLen counts the mail waiting for peer.
func (t *Tx) MailboxLen(peer string) int {
	prefix := mailboxKey(peer, "")
	n := 0
	c := t.btx.Bucket(bucketMailbox).Cursor()
	for k, _ := c.Seek(prefix); k != nil && hasPrefix(k, prefix); k, _ = c.Next() {
		n++
	}
	return n
}
