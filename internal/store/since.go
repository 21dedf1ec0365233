package store

import "encoding/json"

// MessagesSince calls fn for each message created at or after at (Unix seconds), in creation
// order, until fn returns false. It reads every row: message ids are mostly UUID v7 (time
// order), but a peer's are its own, so no key range is trusted to hold them all. The bucket
// is bounded by retention.
func (t *Tx) MessagesSince(at int64, fn func(Message) bool) error {
	c := t.btx.Bucket(bucketMessages).Cursor()
	for k, v := c.First(); k != nil; k, v = c.Next() {
		var m Message
		if err := json.Unmarshal(v, &m); err != nil {
			return err
		}
		if m.CreatedAt >= at && !fn(m) {
			return nil
		}
	}
	return nil
}

// RepliesSince calls fn for each reply created at or after at (Unix seconds), in seq order,
// until fn returns false. Replies are keyed by their global seq, which grows with time, so
// the scan starts from the newest and stops at the first one older than at.
func (t *Tx) RepliesSince(at int64, fn func(Reply) bool) error {
	c := t.btx.Bucket(bucketReplies).Cursor()
	var rows []Reply
	for k, v := c.Last(); k != nil; k, v = c.Prev() {
		var r Reply
		if err := json.Unmarshal(v, &r); err != nil {
			return err
		}
		if r.CreatedAt < at {
			break
		}
		rows = append(rows, r)
	}
	for i := len(rows) - 1; i >= 0; i-- {
		if !fn(rows[i]) {
			return nil
		}
	}
	return nil
}
