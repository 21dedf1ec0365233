package records

import (
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/xmsg/xmsg/internal/ledger"
	"github.com/xmsg/xmsg/internal/store"
)

func open(t *testing.T) *store.Store {
	t.Helper()
	st, err := store.Open(filepath.Join(t.TempDir(), "xmsg.db"), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}

func update(t *testing.T, st *store.Store, fn func(*store.Tx) error) {
	t.Helper()
	if err := st.Update(fn); err != nil {
		t.Fatal(err)
	}
}

// row reads message id's outcome, its outbound row's outcome ("" without one) and whether
// key k of principal p is held.
func row(t *testing.T, st *store.Store, id, p, k string) (outcome, outbound string, keyed bool) {
	t.Helper()
	if err := st.View(func(tx *store.Tx) error {
		m, _, err := tx.Message(id)
		if err != nil {
			return err
		}
		o, _, err := tx.Outbound(id)
		if err != nil {
			return err
		}
		_, keyed, err = tx.Idem(p, k)
		outcome, outbound = m.Outcome.String(), o.Outcome.String()
		return err
	}); err != nil {
		t.Fatal(err)
	}
	return
}

func msg(id string, o ledger.Outcome) store.Message {
	return store.Message{ID: id, CreatedAt: 1, SessionID: "svc:s", FromName: "a", Bytes: 2, Outcome: o, ThreadID: id}
}

// A send's record and its key commit together; a failed delivery reads undelivered and
// forgets the key, so a retry with it delivers again.
func TestSentThenUndelivered(t *testing.T) {
	st := open(t)
	idem := &store.Idem{Principal: "p", Key: "k", MessageID: "m1", Outcome: ledger.Delivered, CreatedAt: 1}
	update(t, st, func(tx *store.Tx) error { return Sent(tx, msg("m1", ledger.Delivered), idem) })
	if o, _, keyed := row(t, st, "m1", "p", "k"); o != "delivered" || !keyed {
		t.Fatalf("after Sent: outcome %q keyed %v", o, keyed)
	}
	update(t, st, func(tx *store.Tx) error { return Undelivered(tx, msg("m1", ledger.Delivered), idem) })
	if o, _, keyed := row(t, st, "m1", "p", "k"); o != "delivery_failed" || keyed {
		t.Fatalf("after Undelivered: outcome %q keyed %v; want delivery_failed and no key", o, keyed)
	}
}

// Settled changes only a message that reads what the caller expects: a pushed reply's row,
// written as delivered, is not rewritten by a flush.
func TestSettledOnlyFromWas(t *testing.T) {
	st := open(t)
	update(t, st, func(tx *store.Tx) error {
		if err := Sent(tx, msg("q", ledger.Queued), nil); err != nil {
			return err
		}
		return Sent(tx, msg("d", ledger.Undelivered), nil)
	})
	for _, c := range []struct {
		id   string
		want bool
		then string
	}{{"q", true, "delivered"}, {"q", false, "delivered"}, {"d", false, "delivery_failed"}, {"none", false, ""}} {
		var changed bool
		update(t, st, func(tx *store.Tx) (err error) {
			changed, err = Settled(tx, c.id, ledger.Queued, ledger.Delivered)
			return err
		})
		if o, _, _ := row(t, st, c.id, "", ""); changed != c.want || o != c.then {
			t.Errorf("Settled(%s): changed %v, reads %q; want %v, %q", c.id, changed, o, c.want, c.then)
		}
	}
}

// A leaf's mail: queued with its outbound row; full beyond the bound with nothing written;
// taken once, after which the message and the outbound row say what the leaf did.
func TestMailedThenTaken(t *testing.T) {
	st := open(t)
	put := func(id string) error {
		return st.Update(func(tx *store.Tx) error {
			m := msg(id, ledger.Queued)
			return Mailed(tx, store.MailboxEntry{ID: id, Peer: "leaf", TargetRef: "svc:s", CreatedAt: 1, Body: "x"}, 1, 0,
				m, store.Outbound{ID: id, Peer: "leaf", TargetRef: "svc:s", Outcome: m.Outcome, CreatedAt: 1}, nil)
		})
	}
	if err := put("m1"); err != nil {
		t.Fatal(err)
	}
	if err := put("m2"); !errors.Is(err, store.ErrMailboxFull) {
		t.Fatalf("second mail past a bound of 1: %v; want ErrMailboxFull", err)
	}
	if o, _, _ := row(t, st, "m2", "", ""); o != "" {
		t.Fatalf("refused mail left a record reading %q", o)
	}
	for i, want := range []bool{true, false} {
		var took bool
		update(t, st, func(tx *store.Tx) (err error) {
			took, err = Taken(tx, "leaf", "m1", ledger.Delivered)
			return err
		})
		if took != want {
			t.Fatalf("Taken #%d = %v; want %v", i+1, took, want)
		}
	}
	if o, out, _ := row(t, st, "m1", "", ""); o != "delivered" || out != "delivered" {
		t.Fatalf("after Taken: message %q outbound %q; want delivered, delivered", o, out)
	}
	var other bool
	update(t, st, func(tx *store.Tx) (err error) {
		other, err = Taken(tx, "another", "m1", ledger.NoRecipient)
		return err
	})
	if o, _, _ := row(t, st, "m1", "", ""); other || o != "delivered" {
		t.Fatalf("another peer's ack: took %v, reads %q", other, o)
	}
}

// A send that never happened leaves nothing; a reply whose push did not arrive keeps the
// reply and drops the pushed message's rows.
func TestWithdrawnAndPushUndone(t *testing.T) {
	st := open(t)
	update(t, st, func(tx *store.Tx) error {
		return SentTo(tx, msg("r1", ledger.Accepted), store.Outbound{ID: "r1", Peer: "b", Outcome: ledger.Accepted, CreatedAt: 1}, nil)
	})
	update(t, st, func(tx *store.Tx) error { return Withdrawn(tx, "r1") })
	if o, out, _ := row(t, st, "r1", "", ""); o != "" || out != "" {
		t.Fatalf("withdrawn send reads %q / %q", o, out)
	}
	var seq uint64
	update(t, st, func(tx *store.Tx) (err error) {
		if err := Sent(tx, msg("orig", ledger.Delivered), nil); err != nil {
			return err
		}
		if err := Sent(tx, msg("pushed", ledger.Delivered), nil); err != nil {
			return err
		}
		seq, err = Replied(tx, store.Reply{MessageID: "orig", CreatedAt: 2, Text: "hi", PushOutcome: ledger.Pushed, PushedMessageID: "pushed"})
		return err
	})
	update(t, st, func(tx *store.Tx) error {
		return PushUndone(tx, store.Reply{Seq: seq, MessageID: "orig", CreatedAt: 2, Text: "hi", PushOutcome: ledger.PushFailed}, "pushed")
	})
	if o, _, _ := row(t, st, "pushed", "", ""); o != "" {
		t.Fatalf("undone push's message still reads %q", o)
	}
	if err := st.View(func(tx *store.Tx) error {
		rs, err := tx.Replies("orig", 0)
		if err != nil {
			return err
		}
		if len(rs) != 1 || rs[0].PushOutcome != ledger.PushFailed || rs[0].PushedMessageID != "" {
			t.Errorf("replies after PushUndone: %+v", rs)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

// Reported changes a row only as change says, and says whether the message exists.
func TestReported(t *testing.T) {
	st := open(t)
	update(t, st, func(tx *store.Tx) error { return Sent(tx, msg("m", ledger.Delivered), nil) })
	found, err := Reported(st, "m", func(m *store.Message) bool { m.Report = "held"; return true })
	if err != nil || !found {
		t.Fatal(found, err)
	}
	found, err = Reported(st, "m", func(m *store.Message) bool { m.Report = "denied"; return false })
	if err != nil || !found {
		t.Fatal(found, err)
	}
	if found, _ := Reported(st, "none", func(*store.Message) bool { return true }); found {
		t.Fatal("found a message never sent")
	}
	_ = st.View(func(tx *store.Tx) error {
		m, _, _ := tx.Message("m")
		if m.Report != "held" {
			t.Errorf("report %q; want held (a change that declines writes nothing)", m.Report)
		}
		return nil
	})
}
