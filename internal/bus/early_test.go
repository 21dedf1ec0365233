package bus

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/xmsg/xmsg/internal/store"
)

// leafBus is a leaf's bus whose pulled rows' records ride a commit for ride, and whose
// service's acks make no commit of their own (they ride the test's).
func leafBus(t *testing.T, ride time.Duration) (*Bus, Target, *Registration) {
	b, _ := newBusWith(t, func(c *Config) {
		c.Leaf = &LeafService{Name: "bot", Principal: "svc:bot"}
		c.RecordRide = ride
		c.AckRide = time.Hour
	})
	// The retention's first purge is a commit of its own: it is made before the test starts,
	// so that the test knows which commit carries what.
	for i := 0; b.cfg.Store.Commits() == 0; i++ {
		if i == 10000 {
			t.Fatal("the retention's first purge made no commit")
		}
		time.Sleep(time.Millisecond)
	}
	return b, Target{Harness: "svc", SessionID: "svc:bot"}, &Registration{Harness: "svc", SessionID: "svc:bot", Name: "bot"}
}

func pulledRows(texts ...string) []Inbound {
	var ins []Inbound
	for _, text := range texts {
		ins = append(ins, Inbound{ID: uuid.Must(uuid.NewV7()).String(), Peer: "hub", Body: text, FromName: "xmsg@hub · a"})
	}
	return ins
}

// stored reports whether message id's record, and its queue row, are in the store.
func stored(t *testing.T, b *Bus, id string) (record, queued bool) {
	t.Helper()
	if err := b.cfg.Store.View(func(tx *store.Tx) (err error) {
		if _, record, err = tx.Message(id); err != nil {
			return err
		}
		queued, err = tx.Queued("svc:bot", id)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	return record, queued
}

// takeAll polls and acks want in order, then finds the queue empty: each row delivered once.
func takeAll(t *testing.T, b *Bus, reg *Registration, want []Inbound) {
	t.Helper()
	ctx := context.Background()
	for _, w := range want {
		m, err := b.Poll(ctx, reg, 0)
		if err != nil || m == nil || m.ID != w.ID {
			t.Fatalf("poll = %+v, %v; want %s", m, err, w.Body)
		}
		if err := b.Ack(ctx, reg, m.ID); err != nil {
			t.Fatal(err)
		}
	}
	if m, err := b.Poll(ctx, reg, 0); err != nil || m != nil {
		t.Fatalf("poll after every row was acked = %+v, %v; want nothing (each row queued once)", m, err)
	}
}

// ready returns committed's value if it has one now.
func ready(committed <-chan error) (error, bool) {
	select {
	case err := <-committed:
		return err, true
	default:
		return nil, false
	}
}

// within waits for committed's value, failing the test if it never comes (a ride of an hour,
// which the test must have ended).
func within(t *testing.T, committed <-chan error) error {
	t.Helper()
	select {
	case err := <-committed:
		return err
	case <-time.After(30 * time.Second):
		t.Fatal("the records' commit never came")
		return nil
	}
}

// TestAcceptBatchRecordsRide: pulled rows reach the service before their records are
// committed, and the records ride a commit made for something else; an ack in that window
// holds (its delete rides the same commit, after the row's write), the rows' announcement
// (newly) comes once they are stored, OnAcked waits for a row only in memory, and rows
// pulled again are known, not queued twice. Mutants tried: a commit made for the rows at once
// (two commits: red); the ack's delete taking the row's key before its write sets it (the
// acked row left in the store: red); OnAcked asking the store alone (the row in memory
// reads acked: red).
func TestAcceptBatchRecordsRide(t *testing.T) {
	b, target, reg := leafBus(t, time.Hour)
	ctx := context.Background()
	ins := pulledRows("one", "two")
	var announced atomic.Int32
	commits := b.cfg.Store.Commits()
	n, committed, err := b.AcceptBatch(target, ins, BatchOptions{Newly: func(Inbound) { announced.Add(1) }})
	if err != nil || n != 2 {
		t.Fatalf("AcceptBatch = %d, %v; want 2, nil", n, err)
	}
	if _, done := ready(committed); done {
		t.Fatal("committed at once: the records do not ride")
	}
	if record, _ := stored(t, b, ins[0].ID); record {
		t.Fatal("the record is stored before any commit was made for it")
	}
	m, err := b.Poll(ctx, reg, 0)
	if err != nil || m == nil || m.ID != ins[0].ID {
		t.Fatalf("poll before the commit = %+v, %v; want the first row", m, err)
	}
	if err := b.Ack(ctx, reg, m.ID); err != nil {
		t.Fatal(err)
	}
	// The second row is queued, though only in memory: the pull loop waits for its ack.
	if ackedNow(t, b, ins[1].ID) {
		t.Fatal("OnAcked of a row queued before its commit called at once")
	}
	if !ackedNow(t, b, ins[0].ID) {
		t.Fatal("OnAcked of the acked row not called at once")
	}
	if announced.Load() != 0 {
		t.Fatal("rows announced before their commit")
	}
	// Someone else's commit (a send's) carries them.
	if err := b.cfg.Store.Update(func(*store.Tx) error { return nil }); err != nil {
		t.Fatal(err)
	}
	if err := within(t, committed); err != nil {
		t.Fatalf("committed = %v", err)
	}
	if _, open := <-committed; open {
		t.Error("committed not closed after its value")
	}
	if got := b.cfg.Store.Commits() - commits; got != 1 {
		t.Errorf("%d commits for the rows and the test's, want the test's alone", got)
	}
	if got := announced.Load(); got != 2 {
		t.Errorf("%d rows announced after the commit, want 2", got)
	}
	for i, want := range []bool{false, true} {
		record, queued := stored(t, b, ins[i].ID)
		if !record || queued != want {
			t.Errorf("row %d: record %v, queued %v; want the record, queued %v", i, record, queued, want)
		}
	}
	// The queue read again from the store (as after a write behind the bus's back) has the
	// second row once.
	b.uncounted("svc:bot")
	m, err = b.Poll(ctx, reg, 0)
	if err != nil || m == nil || m.ID != ins[1].ID {
		t.Fatalf("poll after the commit = %+v, %v; want the second row", m, err)
	}
	if err := b.Ack(ctx, reg, m.ID); err != nil {
		t.Fatal(err)
	}
	if m, err := b.Poll(ctx, reg, 0); err != nil || m != nil {
		t.Fatalf("poll after both acks = %+v, %v; want nothing", m, err)
	}
	// Pulled again (the hub's ack was lost): known by id, queued nowhere again, and their
	// records are stored already.
	n, committed, err = b.AcceptBatch(target, ins, BatchOptions{})
	if err != nil || n != 2 {
		t.Fatalf("AcceptBatch again = %d, %v; want 2 known rows", n, err)
	}
	if err, done := ready(committed); !done || err != nil {
		t.Fatalf("committed of known rows = %v (ready %v); want nil at once", err, done)
	}
	if m, err := b.Poll(ctx, reg, 0); err != nil || m != nil {
		t.Fatalf("poll after the rows came again = %+v, %v; want nothing", m, err)
	}
}

// TestAcceptBatchRideEnds: with no other commit, one is made for the records once the ride
// is over. Mutant tried: no commit at the end of the ride (never committed: red).
func TestAcceptBatchRideEnds(t *testing.T) {
	b, target, _ := leafBus(t, time.Millisecond)
	ins := pulledRows("one")
	_, committed, err := b.AcceptBatch(target, ins, BatchOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := within(t, committed); err != nil {
		t.Fatalf("committed = %v", err)
	}
	if record, queued := stored(t, b, ins[0].ID); !record || !queued {
		t.Errorf("after the ride: record %v, queued %v; want both", record, queued)
	}
}

// TestAcceptBatchRowsAgainWhileRiding: rows pulled again while their records still ride (a
// hub that hands out what it has not been acked) are known, not queued twice, and their
// commit is the one the second batch reports. Mutant tried: the rows in flight not known
// (the first row queued twice: red).
func TestAcceptBatchRowsAgainWhileRiding(t *testing.T) {
	b, target, reg := leafBus(t, time.Hour)
	ins := pulledRows("one")
	_, first, err := b.AcceptBatch(target, ins, BatchOptions{})
	if err != nil {
		t.Fatal(err)
	}
	more := append(ins, pulledRows("two")...)
	n, second, err := b.AcceptBatch(target, more, BatchOptions{})
	if err != nil || n != 2 {
		t.Fatalf("AcceptBatch again = %d, %v; want 2", n, err)
	}
	takeAll(t, b, reg, more)
	b.cfg.Store.Update(func(*store.Tx) error { return nil })
	if err := within(t, first); err != nil {
		t.Fatal(err)
	}
	if err := within(t, second); err != nil {
		t.Fatal(err)
	}
}

// TestAcceptBatchReadForcesCommit: a reply to a pulled row, or a read of it, while its record
// rides has the commit made then, instead of waiting for the ride's end (an hour here) or
// finding no message. Mutants tried: awaitRecord not asking for the commit (the reply waits
// the hour: red); awaitRecord not waiting (the reply is answered not_found: red).
func TestAcceptBatchReadForcesCommit(t *testing.T) {
	for _, c := range []struct {
		name string
		use  func(b *Bus, reg *Registration, id string) error
	}{
		{"reply", func(b *Bus, reg *Registration, id string) error {
			_, err := b.Reply(context.Background(), reg.Caller(), id, "thanks")
			return err
		}},
		{"read", func(b *Bus, reg *Registration, id string) error {
			_, err := b.Message(id)
			return err
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			b, target, reg := leafBus(t, time.Hour)
			ins := pulledRows("one")
			_, committed, err := b.AcceptBatch(target, ins, BatchOptions{})
			if err != nil {
				t.Fatal(err)
			}
			m, err := b.Poll(context.Background(), reg, 0)
			if err != nil || m == nil {
				t.Fatalf("poll = %+v, %v", m, err)
			}
			used := make(chan error, 1)
			go func() { used <- c.use(b, reg, m.ID) }()
			select {
			case err := <-used:
				if err != nil {
					t.Fatalf("%s while the record rides: %v", c.name, err)
				}
			case <-time.After(30 * time.Second):
				t.Fatalf("%s waited for the end of the ride", c.name)
			}
			if err := within(t, committed); err != nil {
				t.Fatalf("committed = %v", err)
			}
		})
	}
}

// TestAcceptBatchFailedCommit: when the commit that carries the records fails, committed says
// so, and the rows leave the queue in memory (the store lacks them): nothing is delivered
// from it any more, OnAcked does not wait for them, and the same rows pulled again are
// queued again, the earlier ack of one of them counting for nothing. Mutant tried: the rows
// left in memory after the failure (polled again: red).
func TestAcceptBatchFailedCommit(t *testing.T) {
	b, target, reg := leafBus(t, time.Hour)
	ctx := context.Background()
	ins := pulledRows("one", "two")
	b.q.testRecordErr = errors.New("disk gone")
	_, committed, err := b.AcceptBatch(target, ins, BatchOptions{})
	if err != nil {
		t.Fatal(err)
	}
	b.q.testRecordErr = nil
	m, err := b.Poll(ctx, reg, 0)
	if err != nil || m == nil || m.ID != ins[0].ID {
		t.Fatalf("poll = %+v, %v; want the first row", m, err)
	}
	if err := b.Ack(ctx, reg, m.ID); err != nil {
		t.Fatal(err)
	}
	b.cfg.Store.Update(func(*store.Tx) error { return nil })
	if err := within(t, committed); err == nil {
		t.Fatal("committed = nil after a failed commit")
	}
	if m, err := b.Poll(ctx, reg, 0); err != nil || m != nil {
		t.Fatalf("poll after the failed commit = %+v, %v; want nothing", m, err)
	}
	if !ackedNow(t, b, ins[1].ID) {
		t.Fatal("OnAcked of a row the store lacks not called at once")
	}
	b.q.mu.Lock()
	left := len(b.q.early) + len(b.q.inFlight)
	b.q.mu.Unlock()
	if left != 0 {
		t.Fatalf("%d rows still held in memory after the failed commit", left)
	}
	for _, in := range ins {
		if record, queued := stored(t, b, in.ID); record || queued {
			t.Fatalf("row %s stored after a failed commit: record %v, queued %v", in.Body, record, queued)
		}
	}
	// The hub hands them out again: queued again, each delivered and acked once.
	n, committed, err := b.AcceptBatch(target, ins, BatchOptions{})
	if err != nil || n != 2 {
		t.Fatalf("AcceptBatch again = %d, %v; want 2", n, err)
	}
	takeAll(t, b, reg, ins)
	b.cfg.Store.Update(func(*store.Tx) error { return nil })
	if err := within(t, committed); err != nil {
		t.Fatalf("committed again = %v", err)
	}
	b.forceAcks(true)
	for _, in := range ins {
		if record, queued := stored(t, b, in.ID); !record || queued {
			t.Errorf("row %s: record %v, queued %v; want recorded and acked", in.Body, record, queued)
		}
	}
}

// TestAcceptBatchBounds: rows riding a commit count against the sender node's share of the
// queue as stored rows do, acked or not; a row refused for places that a commit would free
// (an acked row's, whose delete waits for one) has that commit made at once, and takes the
// place. Mutants tried: earlyShare not counting riding rows (a row past the share taken:
// red); no commit made on a refusal (the row refused: red).
func TestAcceptBatchBounds(t *testing.T) {
	b, target, reg := leafBus(t, time.Hour)
	ctx := context.Background()
	share := b.cfg.Bounds.queueShare()
	var ins []Inbound
	for range share + 1 {
		ins = append(ins, pulledRows("x")...)
	}
	n, first, err := b.AcceptBatch(target, ins[:share-1], BatchOptions{})
	if err != nil || n != share-1 {
		t.Fatalf("AcceptBatch = %d, %v; want %d", n, err, share-1)
	}
	// The service takes and acks one: its place is held until a commit deletes it.
	m, err := b.Poll(ctx, reg, 0)
	if err != nil || m == nil {
		t.Fatalf("poll = %+v, %v", m, err)
	}
	if err := b.Ack(ctx, reg, m.ID); err != nil {
		t.Fatal(err)
	}
	n, second, err := b.AcceptBatch(target, ins[share-1:share], BatchOptions{})
	if err != nil || n != 1 {
		t.Fatalf("AcceptBatch to the share = %d, %v; want 1", n, err)
	}
	if _, done := ready(first); done {
		t.Fatal("committed before the share was full")
	}
	// The share is full, one place held by the acked row: the commit is made, the row fits.
	n, third, err := b.AcceptBatch(target, ins[share:], BatchOptions{})
	if err != nil || n != 1 {
		t.Fatalf("AcceptBatch past the share with an acked row riding = %d, %v; want 1", n, err)
	}
	for _, c := range []<-chan error{first, second} {
		if err := within(t, c); err != nil {
			t.Fatalf("committed = %v", err)
		}
	}
	// Every place is now held by a row not acked: refused, though its commit is made.
	if n, _, err := b.AcceptBatch(target, pulledRows("y"), BatchOptions{}); err == nil || n != 0 {
		t.Fatalf("AcceptBatch with the share full = %d, %v; want 0 and the full queue's error", n, err)
	}
	if err := within(t, third); err != nil {
		t.Fatal(err)
	}
	var stored int
	b.cfg.Store.View(func(tx *store.Tx) (err error) { stored, err = tx.QueueShare("svc:bot", "fed:hub"); return err })
	if stored != share {
		t.Errorf("%d rows of the hub's share stored, want %d", stored, share)
	}
}

// ackedNow reports whether OnAcked calls back at once for svc:bot's row id: the row no longer
// waits in its queue (acked, or gone).
func ackedNow(t *testing.T, b *Bus, id string) bool {
	t.Helper()
	called := false
	cancel, err := b.OnAcked("svc:bot", id, func() { called = true })
	if err != nil {
		t.Fatalf("OnAcked(%s) = %v", id, err)
	}
	cancel()
	return called
}

// TestOnAckedCallsBack: OnAcked calls back once the service acks the row (not before, and
// once though the ack's commit signals again), on the ack's goroutine; a cancelled one is
// never called. Mutant tried: Ack not firing for a leaf's row (red: called only by the
// commit).
func TestOnAckedCallsBack(t *testing.T) {
	b, target, reg := leafBus(t, time.Hour)
	ctx := context.Background()
	ins := pulledRows("one", "two")
	if _, _, err := b.AcceptBatch(target, ins, BatchOptions{}); err != nil {
		t.Fatal(err)
	}
	var first, second atomic.Int32
	if _, err := b.OnAcked("svc:bot", ins[0].ID, func() { first.Add(1) }); err != nil {
		t.Fatal(err)
	}
	cancel, err := b.OnAcked("svc:bot", ins[1].ID, func() { second.Add(1) })
	if err != nil {
		t.Fatal(err)
	}
	cancel()
	if first.Load() != 0 || second.Load() != 0 {
		t.Fatal("called back before any ack")
	}
	for _, in := range ins {
		m, err := b.Poll(ctx, reg, 0)
		if err != nil || m == nil || m.ID != in.ID {
			t.Fatalf("poll = %+v, %v; want %s", m, err, in.ID)
		}
		if err := b.Ack(ctx, reg, m.ID); err != nil {
			t.Fatal(err)
		}
	}
	if first.Load() != 1 {
		t.Fatalf("called back %d times on the ack, want once", first.Load())
	}
	b.cfg.Store.Update(func(*store.Tx) error { return nil }) // the acks' deletes commit
	if first.Load() != 1 || second.Load() != 0 {
		t.Fatalf("after the acks' commit: called %d and %d times, want once and never (cancelled)", first.Load(), second.Load())
	}
}

// TestAcceptBatchTellsCommitted: with BatchOptions.Committed the commit's result comes to the
// callback, once, when the commit that carries the rows is done (nothing is returned to wait
// on), and at once for rows whose commit is done already. Mutant tried: the callback called
// when the rows are queued, before their commit (red).
func TestAcceptBatchTellsCommitted(t *testing.T) {
	b, target, _ := leafBus(t, time.Hour)
	ins := pulledRows("one", "two")
	type told struct {
		n   int
		err error
	}
	got := make(chan told, 4)
	tell := func(n int, err error) { got <- told{n, err} }
	n, committed, err := b.AcceptBatch(target, ins, BatchOptions{Committed: tell})
	if err != nil || n != 2 || committed != nil {
		t.Fatalf("AcceptBatch = %d, %v, %v; want 2, no channel, nil", n, committed, err)
	}
	select {
	case c := <-got:
		t.Fatalf("told %+v while the records ride", c)
	default:
	}
	b.cfg.Store.Update(func(*store.Tx) error { return nil })
	select {
	case c := <-got:
		if c.n != 2 || c.err != nil {
			t.Fatalf("told %+v, want 2 rows committed", c)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the commit was never told")
	}
	// The same rows again: known, their commit done: told before AcceptBatch returns.
	if n, _, err := b.AcceptBatch(target, ins, BatchOptions{Committed: tell}); err != nil || n != 2 {
		t.Fatalf("AcceptBatch again = %d, %v", n, err)
	}
	select {
	case c := <-got:
		if c.n != 2 || c.err != nil {
			t.Fatalf("told %+v for rows stored already, want 2, nil", c)
		}
	default:
		t.Fatal("rows stored already were not told at once")
	}
	if len(got) != 0 {
		t.Fatalf("told %d more times", len(got))
	}
}
