package store

import (
	"errors"
	"fmt"
	"path/filepath"
	"testing"
	"time"
)

// A queue row carries its origin's share: EnqueueShare refuses the row past shareMax rows of
// that share, others still get in; pendingHead reads id and share without a decode, with or
// without a share, and falls back to a decode when an escape is in the way.
func TestEnqueueShare(t *testing.T) {
	st, err := Open(filepath.Join(t.TempDir(), "x.db"), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	put := func(id, share string) error {
		return st.Update(func(tx *Tx) error {
			_, err := tx.EnqueueShare(Pending{ID: id, Share: share, SessionID: "svc:bot", Text: "x"}, MaxQueue, 3)
			return err
		})
	}
	for i := range 3 {
		if err := put(fmt.Sprintf("a%d", i), "fed:a"); err != nil {
			t.Fatal(err)
		}
	}
	if err := put("a3", "fed:a"); !errors.Is(err, ErrShareFull) || !errors.Is(err, ErrQueueFull) {
		t.Fatalf("fourth row of one share: %v, want ErrShareFull (an ErrQueueFull)", err)
	}
	for _, r := range [][2]string{{"b0", "fed:b"}, {"n0", ""}, {"n1", ""}, {"n2", ""}, {"n3", ""}} {
		if err := put(r[0], r[1]); err != nil {
			t.Fatalf("%v: %v", r, err)
		}
	}
	for _, c := range []struct{ v, id, share string }{
		{`{"id":"x1","share":"fed:a","sessionId":"s"}`, "x1", "fed:a"},
		{`{"id":"x2","sessionId":"s"}`, "x2", ""},
		{`{"id":"x3","share":"local:claude:\u003ca\u003e","sessionId":"s"}`, "x3", "local:claude:<a>"},
	} {
		id, share, err := pendingHead([]byte(c.v))
		if err != nil || id != c.id || share != c.share {
			t.Errorf("pendingHead(%s) = %q %q %v", c.v, id, share, err)
		}
	}
}

// A leaf's mailbox is bounded in messages and in stored bytes.
func TestPutMailboxMax(t *testing.T) {
	st, err := Open(filepath.Join(t.TempDir(), "x.db"), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	put := func(peer, id string, maxN, maxBytes int) error {
		return st.Update(func(tx *Tx) error {
			return tx.PutMailboxMax(MailboxEntry{ID: id, Peer: peer, Body: "0123456789"}, maxN, maxBytes)
		})
	}
	for i := range 3 {
		if err := put("l1", fmt.Sprint(i), 3, 0); err != nil {
			t.Fatal(err)
		}
	}
	if err := put("l1", "3", 3, 0); !errors.Is(err, ErrMailboxFull) {
		t.Fatalf("fourth message: %v", err)
	}
	if err := put("l2", "0", 3, 0); err != nil {
		t.Fatalf("another leaf's mailbox: %v", err)
	}
	var n, size int
	st.View(func(tx *Tx) error { n, size = tx.MailboxSize("l1"); return nil })
	if n != 3 {
		t.Fatalf("l1 holds %d", n)
	}
	if err := put("l1", "4", 0, size+10); !errors.Is(err, ErrMailboxFull) {
		t.Fatalf("over the byte bound: %v", err)
	}
	if err := put("l1", "4", 0, size+1000); err != nil {
		t.Fatalf("under the byte bound: %v", err)
	}
	var rows []MailboxEntry
	st.View(func(tx *Tx) error {
		return tx.MailboxScan("l1", func(_, v []byte) (bool, error) {
			e, err := DecodeMailbox(v)
			rows = append(rows, e)
			return err == nil && len(rows) < 2, err
		})
	})
	if len(rows) != 2 || rows[0].ID != "0" || rows[1].ID != "1" {
		t.Errorf("the first two rows = %+v", rows)
	}
}
