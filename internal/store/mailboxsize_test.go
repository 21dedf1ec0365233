package store

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"strings"
	"testing"
)

// checkBoxes fails t where what the store knows of a mailbox is not what its rows say.
func checkBoxes(t *testing.T, st *Store, step string) {
	t.Helper()
	st.boxes.mu.Lock()
	known := make(map[string]boxSize, len(st.boxes.known))
	for peer, size := range st.boxes.known {
		known[peer] = size
	}
	st.boxes.mu.Unlock()
	if err := st.View(func(tx *Tx) error {
		for peer, size := range known {
			if n, bytes := tx.MailboxSize(peer); size != (boxSize{n, bytes}) {
				t.Errorf("%s: the store knows %s's mailbox as %+v, its rows are %d and %d bytes", step, peer, size, n, bytes)
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

// The sizes a put's bound is checked against are the rows' own after any sequence of puts,
// puts of an id again, acks, purges and writes that fail in a shared commit, each peer's
// count apart from the others' (one name the prefix of another's).
func TestMailboxSizesFollowTheRows(t *testing.T) {
	st := open(t, filepath.Join(t.TempDir(), "x.db"))
	rng := rand.New(rand.NewPCG(7, 11))
	peers := []string{"a", "ab", "b"}
	var ids []string
	entry := func(id string) MailboxEntry {
		return MailboxEntry{ID: id, Peer: peers[rng.IntN(len(peers))], TargetRef: "svc:x", CreatedAt: int64(rng.IntN(100)),
			Body: strings.Repeat("x", rng.IntN(300))}
	}
	// put checks, inside the transaction, that the size the bound is checked against is
	// the rows' own, and then puts e under bounds that refuse it now and then.
	put := func(tx *Tx, e MailboxEntry) error {
		got := tx.mailboxSize(e.Peer)
		if n, bytes := tx.MailboxSize(e.Peer); got != (boxSize{n, bytes}) {
			return fmt.Errorf("%s's mailbox counted as %+v, its rows are %d and %d bytes", e.Peer, got, n, bytes)
		}
		err := tx.PutMailboxMax(e, 3+rng.IntN(20), 1500+rng.IntN(3000))
		if errors.Is(err, ErrMailboxFull) {
			return nil
		}
		return err
	}
	for step := range 2000 {
		var err error
		what := ""
		switch r := rng.IntN(20); {
		case r < 9:
			what = "put"
			id := fmt.Sprintf("m%d", step)
			ids = append(ids, id)
			err = st.Update(func(tx *Tx) error { return put(tx, entry(id)) })
		case r < 11 && len(ids) > 0:
			what = "put again"
			e := entry(ids[rng.IntN(len(ids))])
			err = st.Update(func(tx *Tx) error { return tx.PutMailbox(e) })
		case r < 16 && len(ids) > 0:
			what = "ack"
			peer, id := peers[rng.IntN(len(peers))], ids[rng.IntN(len(ids))]
			err = st.Update(func(tx *Tx) error { _, err := tx.AckMailbox(peer, id); return err })
		case r < 17:
			what = "purge, then a put"
			cutoff, id := int64(rng.IntN(30)), fmt.Sprintf("m%d", step)
			ids = append(ids, id)
			e := entry(id)
			err = st.Update(func(tx *Tx) error {
				if _, err := purgeFed(tx, cutoff); err != nil {
					return err
				}
				return put(tx, e)
			})
		default:
			// A shared commit whose second write fails after changing rows: the batch is
			// run again without it, and none of its changes may be counted.
			what = "shared commit with a failed write"
			a, b := fmt.Sprintf("m%d-a", step), fmt.Sprintf("m%d-b", step)
			ids = append(ids, a, b)
			ea, eb, peer, acked := entry(a), entry(b), peers[rng.IntN(len(peers))], ids[rng.IntN(len(ids))]
			ops := []*op{
				{fn: func(tx *Tx) error { return put(tx, ea) }, err: make(chan error, 1)},
				{fn: func(tx *Tx) error {
					if err := tx.PutMailbox(eb); err != nil {
						return err
					}
					if _, err := tx.AckMailbox(peer, acked); err != nil {
						return err
					}
					return errors.New("refused")
				}, err: make(chan error, 1)},
			}
			st.commit(ops)
			if err = <-ops[0].err; err == nil && (<-ops[1].err) == nil {
				err = errors.New("the failing write was committed")
			}
		}
		if err != nil {
			t.Fatalf("step %d (%s): %v", step, what, err)
		}
		checkBoxes(t, st, fmt.Sprintf("step %d (%s)", step, what))
		checkLens(t, st, append(peers, "none"), fmt.Sprintf("step %d (%s)", step, what))
	}
}

// checkLens fails t where MailboxLens, the metrics' reading, differs from a count of the rows.
func checkLens(t *testing.T, st *Store, peers []string, step string) {
	t.Helper()
	lens, err := st.MailboxLens(peers)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.View(func(tx *Tx) error {
		for i, peer := range peers {
			if n := tx.MailboxLen(peer); lens[i] != n {
				t.Errorf("%s: MailboxLens says %d for %s, its rows are %d", step, lens[i], peer, n)
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

// What the store keeps is bounded: past maxKnownBoxes mailboxes it forgets them and counts
// again, and the counts stay the rows'.
func TestMailboxSizesBounded(t *testing.T) {
	defer func(was int) { maxKnownBoxes = was }(maxKnownBoxes)
	maxKnownBoxes = 3
	st := open(t, filepath.Join(t.TempDir(), "x.db"))
	for i := range 40 {
		peer := fmt.Sprintf("leaf-%d", i%7)
		e := MailboxEntry{ID: fmt.Sprintf("m%d", i), Peer: peer, Body: strings.Repeat("x", i)}
		if err := st.Update(func(tx *Tx) error { return tx.PutMailboxMax(e, 100, 0) }); err != nil {
			t.Fatal(err)
		}
		if n := len(st.boxes.known); n > maxKnownBoxes {
			t.Fatalf("the store keeps %d mailboxes' sizes, past its bound of %d", n, maxKnownBoxes)
		}
		checkBoxes(t, st, fmt.Sprintf("put %d", i))
	}
}

// A put to a mailbox near a bound of thousands of rows, each in a commit of its own: the
// size known from the last commit against a pass over the mailbox (TMPDIR on tmpfs leaves
// the disk out of it).
func BenchmarkPutMailboxNearBound(b *testing.B) {
	for _, rows := range []int{100, 1000, 10000} {
		b.Run(fmt.Sprint(rows), func(b *testing.B) {
			st := open(b, filepath.Join(b.TempDir(), "x.db"))
			e := func(i int) MailboxEntry {
				return MailboxEntry{ID: fmt.Sprintf("%08d", i), Peer: "leaf", TargetRef: "svc:x", Body: strings.Repeat("x", 200)}
			}
			if err := st.Update(func(tx *Tx) error {
				for i := range rows {
					if err := tx.PutMailbox(e(i)); err != nil {
						return err
					}
				}
				return nil
			}); err != nil {
				b.Fatal(err)
			}
			b.ResetTimer()
			for i := range b.N {
				// One in, one out: the mailbox stays at its size.
				if err := st.Update(func(tx *Tx) error {
					if _, err := tx.AckMailbox("leaf", e(i).ID); err != nil {
						return err
					}
					return tx.PutMailboxMax(e(rows+i), rows+1, 0)
				}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
