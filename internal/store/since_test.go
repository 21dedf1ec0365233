package store

import (
	"fmt"
	"path/filepath"
	"testing"
)

// TestSince: MessagesSince and RepliesSince give the rows created at or after a time, in
// creation order (not key order: a peer picks its own ids), and stop when told to. Mutant
// tried: the scan in key order (red: the peer's message last).
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
		// A peer's id sorts after the others but was created first.
		return tx.PutMessage(Message{ID: "ffffffff-0000-4000-8000-000000000000", CreatedAt: 5})
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
		var all []int64
		tx.MessagesSince(0, func(m Message) bool { all = append(all, m.CreatedAt); return true })
		if fmt.Sprint(all) != "[5 10 20 30]" {
			t.Errorf("since 0: %v, want time order whatever the ids' order", all)
		}
		n := 0
		tx.MessagesSince(0, func(Message) bool { n++; return false })
		if n != 1 {
			t.Errorf("fn returning false: %d calls", n)
		}
		return nil
	})
}
