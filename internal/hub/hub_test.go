package hub

import (
	"context"
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/xmsg/xmsg/internal/bus"
	"github.com/xmsg/xmsg/internal/ledger"
	"github.com/xmsg/xmsg/internal/records"
	"github.com/xmsg/xmsg/internal/store"
)

func open(t *testing.T, max int) *Mailboxes {
	t.Helper()
	st, err := store.Open(filepath.Join(t.TempDir(), "xmsg.db"), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return New(st, slog.New(slog.DiscardHandler), max, -1)
}

// put queues one message for peer and returns its id.
func put(t *testing.T, m *Mailboxes, peer string) (string, error) {
	t.Helper()
	id := uuid.Must(uuid.NewV7()).String()
	return id, putBody(m, peer, id, "hi "+id)
}

// putBody queues message id with body for peer.
func putBody(m *Mailboxes, peer, id, body string) error {
	now := time.Now().Unix()
	return m.Put(store.MailboxEntry{ID: id, Peer: peer, TargetRef: "svc:bot", CreatedAt: now, Body: body}, nil,
		store.Message{ID: id, CreatedAt: now, SessionID: "svc:bot", Outcome: ledger.Queued, RecipientHarness: bus.RemoteHarness},
		store.Outbound{ID: id, Peer: peer, TargetRef: "svc:bot", Outcome: ledger.Queued, CreatedAt: now}, nil)
}

// putN queues n messages for peer and returns their ids, in order.
func putN(t *testing.T, m *Mailboxes, peer string, n int) []string {
	t.Helper()
	var ids []string
	for range n {
		id, err := put(t, m, peer)
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	return ids
}

func outcome(t *testing.T, m *Mailboxes, id string) (string, string) {
	t.Helper()
	var msg store.Message
	var out store.Outbound
	m.store.View(func(tx *store.Tx) error {
		msg, _, _ = tx.Message(id)
		out, _, _ = tx.Outbound(id)
		return nil
	})
	return msg.Outcome.String(), out.Outcome.String()
}

// committed makes a commit, which carries the settled rows' deletes and records.
func committed(t *testing.T, m *Mailboxes) {
	t.Helper()
	if err := m.store.Update(func(*store.Tx) error { return nil }); err != nil {
		t.Fatal(err)
	}
}

// TestBound: a mailbox holds its bound and refuses the next message with a clear 503-class
// error naming the leaf and the bound, while another leaf's mailbox still takes mail; an ack
// makes room again. Mutant tried: Put without the bound (tx.PutMailbox): red.
func TestBound(t *testing.T) {
	m := open(t, 3)
	for i := range 3 {
		if _, err := put(t, m, "l1"); err != nil {
			t.Fatalf("put %d: %v", i, err)
		}
	}
	_, err := put(t, m, "l1")
	if e := bus.AsError(err); e.Code != ledger.ServiceUnavailable || !strings.Contains(e.Detail, "leaf 'l1'") || !strings.Contains(e.Detail, "3 messages") {
		t.Fatalf("put past the bound = %v, want service_unavailable naming leaf 'l1' and 3 messages", err)
	}
	if _, err := put(t, m, "l2"); err != nil {
		t.Fatalf("another leaf's mailbox refused: %v", err)
	}
	rows, err := m.Pull(context.Background(), "l1", "", 0, 1, 0)
	if err != nil || len(rows) != 1 {
		t.Fatalf("batch = %v %v", rows, err)
	}
	if n, err := m.Ack("l1", []string{rows[0].ID}); n != 1 || err != nil {
		t.Fatalf("ack = %d %v", n, err)
	}
	if _, err := put(t, m, "l1"); err != nil {
		t.Fatalf("put after an ack made room: %v", err)
	}
	if m.Len("l1") != 3 || m.Len("l2") != 1 {
		t.Fatalf("lengths %d, %d; want 3, 1", m.Len("l1"), m.Len("l2"))
	}
}

// TestFullRefusedBeforeCommit: once a commit found a leaf's mailbox full, mail for it is
// refused before any commit (a flood at an offline leaf's full mailbox costs the store
// nothing: no write transaction, no batch run twice, no commit of nothing), with the same
// error; another leaf's mail still commits; a settle of the leaf's rows makes room at once
// (the put's own commit carries the delete); rows that go without a settle (a retention purge)
// make room once fullFor passes. Mutant tried: Put without the fullAt check: red (a commit
// per refused send).
func TestFullRefusedBeforeCommit(t *testing.T) {
	m := open(t, 2)
	ids := putN(t, m, "l1", 2)
	if _, err := put(t, m, "l1"); err == nil {
		t.Fatal("a put past the bound was taken")
	}
	before := m.store.Commits()
	for range 5 {
		_, err := put(t, m, "l1")
		if e := bus.AsError(err); e.Code != ledger.ServiceUnavailable || !strings.Contains(e.Detail, "leaf 'l1'") {
			t.Fatalf("put to a full mailbox = %v, want service_unavailable naming leaf 'l1'", err)
		}
	}
	if n := m.store.Commits() - before; n != 0 {
		t.Fatalf("refusals of a mailbox known full made %d commits, want none", n)
	}
	if _, err := put(t, m, "l2"); err != nil {
		t.Fatalf("another leaf's mailbox refused: %v", err)
	}
	if n, err := m.Ack("l1", ids[:1]); n != 1 || err != nil {
		t.Fatalf("ack = %d %v", n, err)
	}
	if _, err := put(t, m, "l1"); err != nil {
		t.Fatalf("put after an ack made room: %v", err)
	}
	if _, err := put(t, m, "l1"); err == nil {
		t.Fatal("a put past the bound was taken after the ack")
	}

	// A row gone without a settle (as a purge removes it): refused until fullFor passes.
	if err := m.store.Update(func(tx *store.Tx) error { _, err := tx.AckMailbox("l1", ids[1]); return err }); err != nil {
		t.Fatal(err)
	}
	if _, err := put(t, m, "l1"); err == nil {
		t.Fatal("a mailbox found full a moment ago took mail without a settle, before fullFor")
	}
	defer func(d time.Duration) { fullFor = d }(fullFor)
	fullFor = 0
	if _, err := put(t, m, "l1"); err != nil {
		t.Fatalf("put once fullFor passed, with room: %v", err)
	}
}

// TestFullForBytes: a mailbox that refused a row for its bound on bytes still takes a smaller
// row that fits, and refuses one at least as big before any commit. Mutant tried: every
// refusal remembered as full in rows (size 0): red.
func TestFullForBytes(t *testing.T) {
	st, err := store.Open(filepath.Join(t.TempDir(), "xmsg.db"), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	m := New(st, slog.New(slog.DiscardHandler), -1, 4000)
	sized := func(n int) error { return putBody(m, "l1", uuid.Must(uuid.NewV7()).String(), strings.Repeat("x", n)) }
	if err := sized(2500); err != nil {
		t.Fatal(err)
	}
	if err := sized(2000); err == nil {
		t.Fatal("a row past the bound on bytes was taken")
	}
	before := st.Commits()
	if err := sized(2100); err == nil {
		t.Fatal("a bigger row past the bound on bytes was taken")
	}
	if n := st.Commits() - before; n != 0 {
		t.Fatalf("a row at least as big as one refused for bytes made %d commits, want none", n)
	}
	if err := sized(100); err != nil {
		t.Fatalf("a small row that fits was refused after a big one: %v", err)
	}
}

// TestFullFoundBeforeASettle: a commit that found the mailbox full before a settle of its rows
// (the settle came while that commit was still running) does not have the next put refused:
// the settle's deletes ride that put's commit. Mutant tried: the mark taken after the
// commit instead of before it: red (the put refused though the ack made room).
func TestFullFoundBeforeASettle(t *testing.T) {
	m := open(t, 1)
	ids := putN(t, m, "l1", 1)
	var armed atomic.Bool
	inTx, release := make(chan struct{}), make(chan struct{})
	m.store.SetRider(func() (func(*store.Tx) error, func(error)) {
		if !armed.Load() {
			return nil, nil
		}
		return func(*store.Tx) error {
			if armed.CompareAndSwap(true, false) {
				close(inTx)
				<-release
			}
			return nil
		}, func(error) {}
	})
	armed.Store(true)
	refused := make(chan error, 1)
	go func() { _, err := put(t, m, "l1"); refused <- err }()
	<-inTx // the put's commit found the mailbox full and runs on without it
	var once sync.Once
	let := func() { once.Do(func() { close(release) }) }
	defer let() // a failure below must not leave the store's Close waiting for that commit
	if n, err := m.Ack("l1", ids); n != 1 || err != nil {
		t.Fatalf("ack = %d %v", n, err)
	}
	let()
	if err := <-refused; err == nil {
		t.Fatal("the put past the bound was taken")
	}
	if _, err := put(t, m, "l1"); err != nil {
		t.Fatalf("put after an ack made room, the full mailbox found before it: %v", err)
	}
}

// TestAckMarksDelivered: an ack removes the row and marks the message and its outbound row
// delivered; an ack by another leaf, or of an id acked before, removes nothing. Mutant
// tried: Ack without its record (settle): red.
func TestAckMarksDelivered(t *testing.T) {
	m := open(t, 0)
	id, err := put(t, m, "l1")
	if err != nil {
		t.Fatal(err)
	}
	if n, err := m.Ack("l2", []string{id}); n != 0 || err != nil || m.Len("l1") != 1 {
		t.Fatalf("another leaf's ack = %d %v, mailbox %d; want 0, nil, 1", n, err, m.Len("l1"))
	}
	if msg, out := outcome(t, m, id); msg != "queued" || out != "queued" {
		t.Fatalf("before the ack: %s, %s", msg, out)
	}
	if n, err := m.Ack("l1", []string{id, id}); n != 1 || err != nil {
		t.Fatalf("ack = %d %v, want 1", n, err)
	}
	committed(t, m)
	if msg, out := outcome(t, m, id); msg != "delivered" || out != "delivered" {
		t.Fatalf("after the ack: message %s, outbound %s; want delivered", msg, out)
	}
	if n, _ := m.Ack("l1", []string{id}); n != 0 {
		t.Fatalf("second ack removed %d", n)
	}
}

// TestSettlingNotHandedOut: a row acked is answered before its delete is committed, and until
// that commit it is never handed out again: a batch read while a commit holds the store skips
// it and hands out the next row, and a second ack of it counts nothing. Mutant tried: Batch
// without the settling filter (unsettled returning rows as read): red.
func TestSettlingNotHandedOut(t *testing.T) {
	m := open(t, 0)
	first, err := put(t, m, "l1")
	if err != nil {
		t.Fatal(err)
	}
	second, err := put(t, m, "l1")
	if err != nil {
		t.Fatal(err)
	}
	// A commit in flight that does not end until told: the ack's delete cannot be committed.
	hold, holding := make(chan struct{}), make(chan struct{})
	go m.store.Update(func(*store.Tx) error {
		select {
		case <-holding:
		default:
			close(holding)
		}
		<-hold
		return nil
	})
	<-holding
	var release sync.Once
	defer release.Do(func() { close(hold) })
	if n, err := m.Ack("l1", []string{first}); n != 1 || err != nil {
		t.Fatalf("ack = %d %v, want 1", n, err)
	}
	if n, err := m.Ack("l1", []string{first}); n != 0 || err != nil {
		t.Fatalf("second ack while settling = %d %v, want 0", n, err)
	}
	rows, err := m.Pull(context.Background(), "l1", "", 0, 10, 0)
	if err != nil || len(rows) != 1 || rows[0].ID != second {
		t.Fatalf("batch while the ack waits for its commit = %+v %v; want only %s", rows, err, second)
	}
	release.Do(func() { close(hold) })
	committed(t, m)
	if msg, out := outcome(t, m, first); msg != "delivered" || out != "delivered" || m.Len("l1") != 1 {
		t.Fatalf("after the commit: %s, %s, mailbox %d; want delivered and 1 row", msg, out, m.Len("l1"))
	}
}

// TestBatchWakes: a long-poll on an empty mailbox returns the mail put while it waits (the
// put wakes it; the wait given is far longer than the test), and only its own leaf's.
// Mutant tried: Put without the wake: the poll waits its whole minute (red by the test's
// deadline).
func TestBatchWakes(t *testing.T) {
	m := open(t, 0)
	got := make(chan []Wire, 1)
	go func() {
		rows, err := m.Pull(context.Background(), "l1", "", time.Minute, 10, 0)
		if err != nil {
			panic(fmt.Sprint("batch: ", err))
		}
		got <- rows
	}()
	// Mail for another leaf first: it must not end l1's poll with l2's rows.
	if _, err := put(t, m, "l2"); err != nil {
		t.Fatal(err)
	}
	id, err := put(t, m, "l1")
	if err != nil {
		t.Fatal(err)
	}
	rows := <-got
	if len(rows) != 1 || rows[0].ID != id {
		t.Fatalf("poll woke with %+v, want l1's one row %s", rows, id)
	}
}

// TestReject: a row the leaf can never deliver is removed and its message reads not_found,
// not delivered: nobody received it. Mutant tried: Reject recording "delivered": red.
func TestReject(t *testing.T) {
	m := open(t, 0)
	id, err := put(t, m, "l1")
	if err != nil {
		t.Fatal(err)
	}
	if n, err := m.Reject("l1", []string{id}); n != 1 || err != nil {
		t.Fatalf("reject = %d %v", n, err)
	}
	committed(t, m)
	if m.Len("l1") != 0 {
		t.Fatalf("after the reject's commit: mailbox %d", m.Len("l1"))
	}
	if msg, out := outcome(t, m, id); msg != "not_found" || out != "not_found" {
		t.Fatalf("after the reject: message %s, outbound %s; want not_found", msg, out)
	}
}

// TestServiceName: what a leaf's ref may be, as the leaf reads a row's `to`.
func TestServiceName(t *testing.T) {
	for ref, want := range map[string]string{"bot": "bot", "svc:bot": "bot", "SVC:bot": "bot"} {
		if got, ok := ServiceName(ref); !ok || got != want {
			t.Errorf("ServiceName(%q) = %q %v, want %q", ref, got, ok, want)
		}
	}
	for _, ref := range []string{"claude:x", "session:svc:bot", "codex:t", "pi:p", "svc:", "svc:a b", "a/b", ""} {
		if got, ok := ServiceName(ref); ok {
			t.Errorf("ServiceName(%q) = %q, want none", ref, got)
		}
	}
}

// TestStreamHandsEachRowOnce: on one stream a row handed out is not handed out again until
// it is settled, so a leaf may pull its next batch while its service works on the last; a
// pull on a new stream (the leaf lost an answer, or could not take a row), or on none, hands
// out every row not settled again; and another leaf's stream is its own. Mutants tried:
// Batch not passing over handed rows: the second pull gets the first's rows again, red;
// a new stream keeping the old one's ids: the restart gets nothing, red.
func TestStreamHandsEachRowOnce(t *testing.T) {
	m := open(t, 0)
	ids := putN(t, m, "l1", 3)
	other, err := put(t, m, "l2")
	if err != nil {
		t.Fatal(err)
	}
	got := func(peer, s string, n int) []string {
		t.Helper()
		rows, err := m.Pull(context.Background(), peer, s, 0, n, 0)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, r := range rows {
			out = append(out, r.ID)
		}
		return out
	}
	same := func(a, b []string) bool { return strings.Join(a, ",") == strings.Join(b, ",") }
	if g := got("l1", "a", 2); !same(g, ids[:2]) {
		t.Fatalf("first pull on stream a = %v, want %v", g, ids[:2])
	}
	if g := got("l1", "a", 10); !same(g, ids[2:]) {
		t.Fatalf("next pull on stream a = %v, want only the row not handed yet %v", g, ids[2:])
	}
	if g := got("l1", "a", 10); len(g) != 0 {
		t.Fatalf("a third pull on stream a = %v, want nothing (all handed)", g)
	}
	// l2's stream of the same name is its own.
	if g := got("l2", "a", 10); !same(g, []string{other}) {
		t.Fatalf("l2 on its stream a = %v, want its row", g)
	}
	// A settled row leaves the stream; one not settled comes again on a new stream.
	if n, err := m.Ack("l1", ids[:1]); n != 1 || err != nil {
		t.Fatalf("ack = %d %v", n, err)
	}
	committed(t, m)
	if g := got("l1", "b", 10); !same(g, ids[1:]) {
		t.Fatalf("pull on a new stream b = %v, want every row not settled %v", g, ids[1:])
	}
	if g := got("l1", "", 10); !same(g, ids[1:]) {
		t.Fatalf("pull on no stream = %v, want every row not settled %v", g, ids[1:])
	}
	// After a pull on no stream, stream b starts over too.
	if g := got("l1", "b", 10); !same(g, ids[1:]) {
		t.Fatalf("stream b after a pull on none = %v, want %v", g, ids[1:])
	}
}

// TestStreamBound: the ids a stream holds are bounded by the rows in the mailbox: rows
// removed without being settled (retention) are dropped from it once it is large.
// Mutant tried: stream never pruning: it keeps every id, red.
func TestStreamBound(t *testing.T) {
	m := open(t, -1)
	for range pruneHanded + 10 {
		if _, err := put(t, m, "l1"); err != nil {
			t.Fatal(err)
		}
	}
	if rows, err := m.Pull(context.Background(), "l1", "a", 0, pruneHanded+10, 0); err != nil || len(rows) != pruneHanded+10 {
		t.Fatalf("batch = %d %v", len(rows), err)
	}
	// Retention takes every row without a settle.
	if err := m.store.Update(func(tx *store.Tx) error {
		var ids []string
		rows, err := mail(tx, "l1")
		for _, r := range rows {
			ids = append(ids, r.ID)
		}
		for _, id := range ids {
			if _, err := records.Taken(tx, "l1", id, ledger.Expired); err != nil {
				return err
			}
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := put(t, m, "l1"); err != nil {
		t.Fatal(err)
	}
	if rows, err := m.Pull(context.Background(), "l1", "a", 0, 10, 0); err != nil || len(rows) != 1 {
		t.Fatalf("batch after the purge = %d %v, want the new row", len(rows), err)
	}
	m.mu.Lock()
	n := len(m.handed["l1"].ids)
	m.mu.Unlock()
	if n != 1 {
		t.Fatalf("stream holds %d ids after its rows were removed, want 1 (the new row)", n)
	}
}

// BenchmarkPutFullMailbox is a send to a leaf whose mailbox is full (1,000 rows, the default
// bound): refused before any commit once a commit found it full, against the store's own
// check each time (fullFor 0: a write transaction that scans the mailbox and fails, then a
// commit of nothing).
func BenchmarkPutFullMailbox(b *testing.B) {
	for _, c := range []struct {
		name     string
		remember time.Duration
	}{{"known full", fullFor}, {"store checks each", 0}} {
		b.Run(c.name, func(b *testing.B) {
			defer func(d time.Duration) { fullFor = d }(fullFor)
			fullFor = c.remember
			st, err := store.Open(filepath.Join(b.TempDir(), "xmsg.db"), time.Second)
			if err != nil {
				b.Fatal(err)
			}
			defer st.Close()
			m := New(st, slog.New(slog.DiscardHandler), 1000, -1)
			err = st.Update(func(tx *store.Tx) error {
				for range 1000 {
					id := uuid.Must(uuid.NewV7()).String()
					if err := tx.PutMailbox(store.MailboxEntry{ID: id, Peer: "l1", TargetRef: "svc:bot", Body: strings.Repeat("x", 200)}); err != nil {
						return err
					}
				}
				return nil
			})
			if err != nil {
				b.Fatal(err)
			}
			b.ResetTimer()
			for range b.N {
				if err := putBody(m, "l1", uuid.Must(uuid.NewV7()).String(), "hi"); err == nil {
					b.Fatal("a put to a full mailbox was taken")
				}
			}
		})
	}
}
