package store

import (
	"fmt"
	"path/filepath"
	"testing"
)

// TestSince: MessagesSince and RepliesSince give the rows created at or after a time, in
// creation order, and stop when told to.
func TestSince(t *testing.T) {
	s := open(t, filepath.Join(t.TempDir(), "x.db"))
	t.Cleanup(func() { s.Close() })
	err := s.Update(func(tx *Tx) error {
		for i, at := range []int64{10, 20, 30} {
			id := fmt.Sprintf("0000000%d-0000-7000-8000-000000000000", i)
			if err := tx.PutMessage(Message{ID: id, CreatedAt: at}); err != nil {
				return err
			}
			if _, err := tx.AddReply(Reply{MessageID: id, CreatedAt: at, Text: "r"}); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	s.View(func(tx *Tx) error {
		var msgs []int64
		tx.MessagesSince(20, func(m Message) bool { msgs = append(msgs, m.CreatedAt); return true })
		var replies []uint64
		tx.RepliesSince(20, func(r Reply) bool { replies = append(replies, r.Seq); return true })
		if fmt.Sprint(msgs) != "[20 30]" || fmt.Sprint(replies) != "[2 3]" {
			t.Errorf("since 20: messages %v, replies %v", msgs, replies)
		}
		n := 0
		tx.MessagesSince(0, func(Message) bool { n++; return false })
		if n != 1 {
			t.Errorf("fn returning false: %d calls", n)
		}
		return nil
	})
}
