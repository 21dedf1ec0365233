package store

import (
	"encoding/json"
	"sort"
)

// MessagesSince calls fn for each message created at or after at (Unix seconds), in creation
// order (ties in key order), until fn returns false. It reads every row: message ids are
// mostly UUID v7 (time order), but a peer's are its own, so neither a key range nor key order
// is trusted; the rows are sorted by their time. The bucket is bounded by retention.
func (t *Tx) MessagesSince(at int64, fn func(Message) bool) error {
	var rows []Message
	c := t.btx.Bucket(bucketMessages).Cursor()
	for k, v := c.First(); k != nil; k, v = c.Next() {
		var m Message
		if err := json.Unmarshal(v, &m); err != nil {
			return err
		}
		if m.CreatedAt >= at {
			rows = append(rows, m)
		}
	}
	sort.SliceStable(rows, func(i, j int) bool { return rows[i].CreatedAt < rows[j].CreatedAt })
	for _, m := range rows {
		if !fn(m) {
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
