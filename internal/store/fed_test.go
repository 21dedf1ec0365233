package store

import (
	"path/filepath"
	"testing"
)

// Mailboxes are isolated by their key prefix: peer "a" never sees or acks the mail of "ab",
// and a peer name with a NUL (which could reach into another's prefix) is refused.
func TestMailboxPerPeer(t *testing.T) {
	s := open(t, filepath.Join(t.TempDir(), "x.db"))
	err := s.Update(func(tx *Tx) error {
		if err := tx.PutMailbox(MailboxEntry{ID: "2", Peer: "ab", CreatedAt: 1}); err != nil {
			return err
		}
		return tx.PutMailbox(MailboxEntry{ID: "3", Peer: "a", CreatedAt: 1})
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Update(func(tx *Tx) error { return tx.PutMailbox(MailboxEntry{ID: "1", Peer: "a\x00b", CreatedAt: 1}) }); err == nil {
		t.Error("a peer name with a NUL was accepted")
	}
	s.View(func(tx *Tx) error {
		if e, ok, _ := tx.MailboxHead("a"); !ok || e.ID != "3" {
			t.Errorf("head of a = %+v %v, want its own 3", e, ok)
		}
		if n := tx.MailboxLen("a"); n != 1 {
			t.Errorf("a holds %d, want 1", n)
		}
		return nil
	})
	s.Update(func(tx *Tx) error {
		if ok, _ := tx.AckMailbox("a", "2"); ok {
			t.Error("a acked ab's mail")
		}
		return nil
	})
	s.View(func(tx *Tx) error {
		if n := tx.MailboxLen("ab"); n != 1 {
			t.Errorf("ab holds %d after a's ack, want 1", n)
		}
		return nil
	})
}
