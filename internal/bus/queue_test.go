package bus

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/xmsg/xmsg/internal/envelope"
	"github.com/xmsg/xmsg/internal/ledger"
	"github.com/xmsg/xmsg/internal/peercred"
	"github.com/xmsg/xmsg/internal/store"
)

func self() peercred.Cred { return peercred.Cred{PID: os.Getpid(), UID: uint32(os.Geteuid())} }

// TestQueueBoundBeforeCommit: the 100-message bound counts unacknowledged messages and is
// enforced before the commit; an ack frees a place at once (its delete is committed later),
// a second ack of the same message frees nothing, and polls skip acknowledged messages.
func TestQueueBoundBeforeCommit(t *testing.T) {
	b, _ := newBus(t)
	ctx := context.Background()
	r, err := b.RegisterSession("pi", "q", "/", self(), "")
	if err != nil {
		t.Fatal(err)
	}
	send := func(i int) error {
		_, err := b.Send(ctx, Send{To: envelope.ParseRef(r.SessionID), Text: fmt.Sprint("m", i), Bytes: 2, FromName: "a", Principal: "p"})
		return err
	}
	for i := range store.MaxQueue {
		if err := send(i); err != nil {
			t.Fatalf("send %d: %v", i, err)
		}
	}
	commits := b.cfg.Store.Commits()
	if err := send(100); AsError(err).Code != ledger.ServiceUnavailable {
		t.Fatalf("send to a full queue = %v, want service_unavailable", err)
	}
	if got := b.cfg.Store.Commits(); got != commits {
		t.Errorf("a refused send made %d commits, want none", got-commits)
	}
	p, err := b.Poll(ctx, r, 0)
	if err != nil || p == nil || p.Text != "m0" {
		t.Fatalf("poll = %+v, %v", p, err)
	}
	for range 2 { // the second ack of m0 changes nothing
		if err := b.Ack(context.Background(), r, p.ID); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.Ack(context.Background(), r, "not-queued"); err != nil {
		t.Fatal(err)
	}
	if p2, _ := b.Poll(ctx, r, 0); p2 == nil || p2.Text != "m1" {
		t.Fatalf("poll after the ack = %+v, want m1 (the acked m0 skipped)", p2)
	}
	if err := send(101); err != nil {
		t.Fatalf("send after one ack: %v", err)
	}
	if err := send(102); AsError(err).Code != ledger.ServiceUnavailable {
		t.Fatalf("second send after one ack = %v, want service_unavailable", err)
	}
	// Once committed (Close flushes), the store agrees: m0 is gone, 100 remain.
	b.Close()
	var n int
	b.cfg.Store.View(func(tx *store.Tx) error { n = tx.QueueLen(r.SessionID); return nil })
	if n != store.MaxQueue {
		t.Errorf("%d rows after the flush, want %d", n, store.MaxQueue)
	}
	b.stop = make(chan struct{}) // newBus's cleanup closes it again
}

// TestDeadRegistrationIsGoneAtOnce: a registered process killed just before a request is not
// resolved by it, and its registration is dropped by its watch without any request.
func TestDeadRegistrationIsGoneAtOnce(t *testing.T) {
	b, _ := newBus(t)
	child := exec.Command("sleep", "60")
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	defer child.Process.Kill()
	r, err := b.RegisterSession("pi", "child", "/", peercred.Cred{PID: child.Process.Pid, UID: uint32(os.Geteuid())}, "")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.Resolve(r.SessionID); err != nil {
		t.Fatalf("resolve while alive: %v", err)
	}
	if r.watch == nil {
		t.Log("no pidfd here: the registration is checked in /proc instead")
	}
	child.Process.Kill()
	child.Wait()
	if _, err := b.Resolve(r.SessionID); err == nil {
		t.Fatal("a dead registration still resolves")
	}
	if r.watch != nil {
		for i := 0; ; i++ {
			b.mu.Lock()
			left := len(b.regs)
			b.mu.Unlock()
			if left == 0 {
				break
			}
			if i == 2000 {
				t.Fatal("the watch never dropped the registration")
			}
			waitABit()
		}
	}
}

func waitABit() { time.Sleep(5 * time.Millisecond) }

// TestDeadRegistrationWithoutPidfd: where no pidfd can be had (here: a procfs path other than
// /proc itself, which OpenPidfd refuses), a registration is checked in /proc when it is used,
// and a dead one is neither resolved nor listed.
func TestDeadRegistrationWithoutPidfd(t *testing.T) {
	b0, _ := newBus(t)
	cfg := b0.cfg
	cfg.Proc = peercred.Proc{Root: "/proc/."}
	b := New(cfg) // on the same store; its retention loop reads cfg.Proc, so no change after New
	t.Cleanup(b.Close)
	child := exec.Command("sleep", "60")
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	defer child.Process.Kill()
	r, err := b.RegisterSession("pi", "child", "/", peercred.Cred{PID: child.Process.Pid, UID: uint32(os.Geteuid())}, "")
	if err != nil {
		t.Fatal(err)
	}
	if r.watch != nil {
		t.Fatal("a pidfd was opened for a procfs that is not /proc")
	}
	if _, err := b.Resolve(r.SessionID); err != nil {
		t.Fatalf("resolve while alive: %v", err)
	}
	child.Process.Kill()
	child.Wait()
	if _, err := b.Resolve(r.SessionID); err == nil {
		t.Fatal("a dead registration still resolves")
	}
	if n := len(b.liveRegistrations()); n != 0 {
		t.Errorf("%d registrations listed, want 0", n)
	}
}

// TestDeadClaudeSessionIsGone: a Claude session whose process exits just before a request is
// answered `gone` by it, with no wait in between (liveness is checked at request time).
func TestDeadClaudeSessionIsGone(t *testing.T) {
	b, dir := newBus(t)
	child := exec.Command("sleep", "60")
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	defer child.Process.Kill()
	start, err := peercred.Proc{}.StartTime(child.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	raw := fmt.Sprintf(`{"pid":%d,"sessionId":"22222222-aaaa-bbbb-cccc-000000000009","name":"carol","procStart":%q,"messagingSocketPath":"/nonexistent"}`, child.Process.Pid, start)
	if err := os.WriteFile(filepath.Join(dir, "s", "carol.json"), []byte(raw), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Resolve("carol"); err != nil {
		t.Fatalf("resolve while alive: %v", err)
	}
	child.Process.Kill()
	child.Wait()
	_, err = b.Resolve("carol")
	if e := AsError(err); e.Code != ledger.Gone {
		t.Fatalf("resolve after the process exited = %v, want 410 gone", err)
	}
}

// BenchmarkRefusedSend: a send to a full queue, the 503 storm of a consumer that cannot keep
// up. It must be refused without a commit and cheaply.
func BenchmarkRefusedSend(b *testing.B) {
	bus, _ := newBus(b)
	ctx := context.Background()
	r, err := bus.RegisterSession("pi", "q", "/", self(), "")
	if err != nil {
		b.Fatal(err)
	}
	text := "a message of the storm"
	send := func() error {
		_, err := bus.Send(ctx, Send{To: envelope.ParseRef(r.SessionID), Text: text, Bytes: len(text), FromName: "a", Principal: "p"})
		return err
	}
	for range store.MaxQueue {
		if err := send(); err != nil {
			b.Fatal(err)
		}
	}
	commits := bus.cfg.Store.Commits()
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		if err := send(); AsError(err).Code != ledger.ServiceUnavailable {
			b.Fatalf("send to a full queue = %v", err)
		}
	}
	b.StopTimer()
	if n := bus.cfg.Store.Commits() - commits; n != 0 {
		b.Fatalf("%d commits for refused sends", n)
	}
}

// TestQueueInMemory: the queue a poll reads is kept in memory, within a byte budget: messages
// past it are read from the store when they reach the head, in order; an acknowledged message
// whose delete is not committed yet stays skipped when the queue is read again from the store
// (here: forgotten, as after a write that bypassed the bus).
func TestQueueInMemory(t *testing.T) {
	b, _ := newBusWith(t, func(c *Config) { c.AckDelay = time.Hour }) // no ack is committed during the test
	defer func(old int) { cacheBudget = old }(cacheBudget)
	cacheBudget = 300 // about two of these messages
	ctx := context.Background()
	r, err := b.RegisterSession("pi", "q", "/", self(), "")
	if err != nil {
		t.Fatal(err)
	}
	for i := range 6 {
		if _, err := b.Send(ctx, Send{To: envelope.ParseRef(r.SessionID), Text: fmt.Sprint("m", i), Bytes: 2, FromName: "a", Principal: "p"}); err != nil {
			t.Fatal(err)
		}
	}
	b.q.mu.Lock()
	sq := b.q.s[r.SessionID]
	kept := 0
	for _, row := range sq.rows {
		if row.m != nil {
			kept++
		}
	}
	b.q.mu.Unlock()
	if kept == 0 || kept == 6 || sq.cached > cacheBudget {
		t.Fatalf("%d of 6 messages kept in memory (%d bytes), want some within %d bytes", kept, sq.cached, cacheBudget)
	}
	for i := range 6 {
		if i == 3 {
			b.q.mu.Lock()
			total, own := b.q.cached, b.q.s[r.SessionID].cached
			b.q.mu.Unlock()
			if total != own {
				t.Fatalf("the queues hold %d bytes in all, the only queue %d", total, own)
			}
			b.forgetCounts() // read again from the store: m0..m2 are acked, not yet deleted
		}
		p, err := b.Poll(ctx, r, 0)
		if err != nil || p == nil || p.Text != fmt.Sprint("m", i) {
			t.Fatalf("poll %d = %+v, %v; want m%d", i, p, err, i)
		}
		if err := b.Ack(context.Background(), r, p.ID); err != nil {
			t.Fatal(err)
		}
	}
	if p, err := b.Poll(ctx, r, 0); p != nil || err != nil {
		t.Fatalf("poll of the drained queue = %+v, %v", p, err)
	}
	if b.q.cached != 0 {
		t.Errorf("%d bytes held by the queues after the drain, want 0", b.q.cached)
	}
	// All queues together stay within totalBudget too.
	defer func(old int) { totalBudget = old }(totalBudget)
	cacheBudget, totalBudget = 1<<20, 400 // one or two of the four
	for i := range 4 {
		if _, err := b.Send(ctx, Send{To: envelope.ParseRef(r.SessionID), Text: fmt.Sprint("n", i), Bytes: 2, FromName: "a", Principal: "p"}); err != nil {
			t.Fatal(err)
		}
	}
	if b.q.cached > totalBudget || b.q.cached == 0 {
		t.Errorf("%d bytes held by the queues, want some within %d", b.q.cached, totalBudget)
	}
}

// TestLoneAckIsCommitted: an ack that no other commit carries gets a commit of its own from
// the flusher (soon after ackRide), without Close.
func TestLoneAckIsCommitted(t *testing.T) {
	b, _ := newBus(t)
	ctx := context.Background()
	r, err := b.RegisterSession("pi", "q", "/", self(), "")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.Send(ctx, Send{To: envelope.ParseRef(r.SessionID), Text: "m", Bytes: 1, FromName: "a", Principal: "p"}); err != nil {
		t.Fatal(err)
	}
	p, err := b.Poll(ctx, r, 0)
	if err != nil || p == nil {
		t.Fatalf("poll = %+v, %v", p, err)
	}
	if err := b.Ack(context.Background(), r, p.ID); err != nil {
		t.Fatal(err)
	}
	for i := 0; ; i++ {
		var n int
		b.cfg.Store.View(func(tx *store.Tx) error { n = tx.QueueLen(r.SessionID); return nil })
		if n == 0 {
			break
		}
		if i == 2000 {
			t.Fatal("the acknowledged row was never deleted")
		}
		waitABit()
	}
}

// TestAckRide: with AckRide (a leaf's), an acknowledged delete waits for a commit made anyway
// instead of one of its own after 5 ms: none is made for it, and the next send's commit
// carries it. The pause is the mutant's chance to commit, never a bound the code must meet.
// Mutant tried: flushAcks ignoring AckRide: red.
func TestAckRide(t *testing.T) {
	b, _ := newBusWith(t, func(c *Config) { c.AckRide = time.Hour })
	ctx := context.Background()
	// The retention purge at start is a commit of its own, on its own goroutine: done
	// before anything is counted (the bound is a hang guard).
	for deadline := time.Now().Add(10 * time.Second); b.cfg.Store.Commits() == 0 && time.Now().Before(deadline); {
		time.Sleep(time.Millisecond)
	}
	r, err := b.RegisterSession("pi", "q", "/", self(), "")
	if err != nil {
		t.Fatal(err)
	}
	send := func(text string) {
		if _, err := b.Send(ctx, Send{To: envelope.ParseRef(r.SessionID), Text: text, Bytes: len(text), FromName: "a", Principal: "p"}); err != nil {
			t.Fatal(err)
		}
	}
	send("m0")
	p, err := b.Poll(ctx, r, 0)
	if err != nil || p == nil {
		t.Fatalf("poll = %+v, %v", p, err)
	}
	queued := func() bool {
		var q bool
		b.cfg.Store.View(func(tx *store.Tx) (err error) { q, err = tx.Queued(r.SessionID, p.ID); return err })
		return q
	}
	commits := b.cfg.Store.Commits()
	if err := b.Ack(ctx, r, p.ID); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond) // 20 times the default ride
	if n := b.cfg.Store.Commits() - commits; n != 0 || !queued() {
		t.Fatalf("after the ack: %d commits, row stored %v; want none and still stored", n, queued())
	}
	send("m1")
	if n := b.cfg.Store.Commits() - commits; n != 1 || queued() {
		t.Fatalf("after the next send: %d commits, row stored %v; want one, carrying the delete", n, queued())
	}
}
