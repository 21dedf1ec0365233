package store

import (
	"encoding/json"
	"fmt"

	bolt "go.etcd.io/bbolt"
)

// Purged counts what one Purge removed.
type Purged struct{ Messages, Replies, Queued, IdempotencyKeys, Federation int }

// Purge deletes messages, replies and queued messages created before replyCutoff, and
// idempotency records created before idemCutoff (Unix seconds).
//
// Deleting under a bbolt cursor can skip the next key, so every loop re-seeks after a delete
// instead of calling Next.
func (t *Tx) Purge(replyCutoff, idemCutoff int64) (Purged, error) {
	var p Purged
	var err error
	// messages and replies are keyed in creation order, so the purge stops at the first young one.
	if p.Messages, err = purgeOrdered(t.btx.Bucket(bucketMessages), replyCutoff, nil); err != nil {
		return p, err
	}
	idx := t.btx.Bucket(bucketReplyIndex)
	p.Replies, err = purgeOrdered(t.btx.Bucket(bucketReplies), replyCutoff, func(v []byte) error {
		var r Reply
		if err := json.Unmarshal(v, &r); err != nil {
			return err
		}
		return idx.Delete(replyIndexKey(r.MessageID, r.Seq))
	})
	if err != nil {
		return p, err
	}
	// queue and idempotency keys are keyed by owner, not time: scan them whole.
	if p.Queued, err = purgeAll(t.btx.Bucket(bucketQueue), replyCutoff); err != nil {
		return p, err
	}
	if p.IdempotencyKeys, err = purgeAll(t.btx.Bucket(bucketIdem), idemCutoff); err != nil {
		return p, err
	}
	if p.Federation, err = purgeFed(t, replyCutoff); err != nil {
		return p, err
	}
	return p, nil
}

type stamped struct {
	CreatedAt int64 `json:"createdAt"`
}

func createdAt(v []byte) (int64, error) {
	var s stamped
	if err := json.Unmarshal(v, &s); err != nil {
		return 0, fmt.Errorf("store: decode timestamp: %w", err)
	}
	return s.CreatedAt, nil
}

func purgeOrdered(b *bolt.Bucket, cutoff int64, also func(v []byte) error) (int, error) {
	n := 0
	c := b.Cursor()
	for k, v := c.First(); k != nil; k, v = c.First() {
		at, err := createdAt(v)
		if err != nil {
			return n, err
		}
		if at >= cutoff {
			return n, nil
		}
		if also != nil {
			if err := also(v); err != nil {
				return n, err
			}
		}
		if err := c.Delete(); err != nil {
			return n, err
		}
		n++
	}
	return n, nil
}

func purgeAll(b *bolt.Bucket, cutoff int64) (int, error) {
	n := 0
	c := b.Cursor()
	for k, v := c.First(); k != nil; {
		at, err := createdAt(v)
		if err != nil {
			return n, err
		}
		if at >= cutoff {
			k, v = c.Next()
			continue
		}
		key := append([]byte(nil), k...)
		if err := c.Delete(); err != nil {
			return n, err
		}
		n++
		k, v = c.Seek(key) // re-seek: the deleted key is gone, Seek lands on its successor
	}
	return n, nil
}
