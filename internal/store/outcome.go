package store

import (
	"bytes"

	"github.com/xmsg/xmsg/internal/ledger"
)

// A later step of a message's life changes only its outcome: a leaf took its mail, a queued
// row was delivered. Such a row is rewritten in place, its outcome's bytes and nothing else,
// not decoded and encoded again: on a hub each leaf message's settle changes two rows inside
// the commit's transaction, while the writer lock is held, and the decode was most of that.
// A row this package wrote comes out as the send would have written it with that outcome
// (TestSetOutcomeIsReencode); any row reads as the decode, the change and the encode would
// leave it (FuzzSetOutcome), and one not in the shape stringAfter and flat look for is
// decoded and encoded.

var (
	outcomeKey = []byte(`,"outcome":"`)
	peerKey    = []byte(`,"peer":"`)
)

// stringAfter finds the value of the string that key (a key's comma, name, colon and opening
// quote) opens in row, a flat one: its bytes are row[i:j]. ok is false unless key occurs once
// and its value holds no escape, so that the bytes are the string itself. In valid JSON,
// `,"name":"` is never inside a string (a quote there follows a backslash) and is always a
// key; in a flat row it is a key of the row's own.
func stringAfter(row, key []byte) (i, j int, ok bool) {
	at := bytes.Index(row, key)
	if at < 0 || bytes.Contains(row[at+len(key):], key) {
		return 0, 0, false
	}
	i = at + len(key)
	end := bytes.IndexByte(row[i:], '"')
	if end < 0 || bytes.IndexByte(row[i:i+end], '\\') >= 0 {
		return 0, 0, false
	}
	return i, i + end, true
}

// flat reports whether row can hold no object but itself: it has one brace, its own (a key
// is only ever in an object, in an array's too; a string holding a brace sends the row to the
// decode, which is only slower).
func flat(row []byte) bool {
	return bytes.Count(row, []byte{'{'}) == 1
}

// withOutcome returns a copy of row with the outcome's bytes row[i:j] replaced by now's word.
func withOutcome(row []byte, i, j int, now ledger.Outcome) []byte {
	word := now.String()
	out := make([]byte, 0, len(row)-(j-i)+len(word))
	out = append(out, row[:i]...)
	out = append(out, word...)
	return append(out, row[j:]...)
}

// SetMessageOutcome makes message id read now where when(its outcome) holds, and reports
// whether the message exists and whether its row was changed.
func (t *Tx) SetMessageOutcome(id string, now ledger.Outcome, when func(ledger.Outcome) bool) (found, changed bool, err error) {
	b := t.btx.Bucket(bucketMessages)
	row := b.Get([]byte(id))
	if row == nil {
		return false, false, nil
	}
	i, j, ok := stringAfter(row, outcomeKey)
	if !ok || !flat(row) {
		m, found, err := t.Message(id)
		if err != nil || !found || !when(m.Outcome) {
			return found, false, err
		}
		m.Outcome = now
		return true, true, b.Put([]byte(id), appendMessage(make([]byte, 0, len(row)), m))
	}
	// An unknown word reads as NoOutcome, as the decode reads it.
	if cur, _ := ledger.ParseOutcome(string(row[i:j])); !when(cur) {
		return true, false, nil
	}
	return true, true, b.Put([]byte(id), withOutcome(row, i, j, now))
}

// SetOutboundOutcome makes outbound row id read now if the row is peer's, and reports whether
// it was changed (false: no such row, or another peer's).
func (t *Tx) SetOutboundOutcome(id, peer string, now ledger.Outcome) (bool, error) {
	b := t.btx.Bucket(bucketOutbound)
	row := b.Get([]byte(id))
	if row == nil {
		return false, nil
	}
	pi, pj, okPeer := stringAfter(row, peerKey)
	i, j, ok := stringAfter(row, outcomeKey)
	if !ok || !okPeer || !flat(row) {
		out, found, err := t.Outbound(id)
		if err != nil || !found || out.Peer != peer {
			return false, err
		}
		out.Outcome = now
		return true, b.Put([]byte(id), appendOutbound(make([]byte, 0, len(row)), out))
	}
	if string(row[pi:pj]) != peer {
		return false, nil
	}
	return true, b.Put([]byte(id), withOutcome(row, i, j, now))
}
