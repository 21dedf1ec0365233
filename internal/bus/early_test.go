package bus

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/xmsg/xmsg/internal/store"
)

// TestAcceptBatchDeliversDuringItsCommit: pulled rows reach the service while their commit is
// in flight (the hub still holds them, so a crash then loses nothing); an ack in that window
// holds (the row does not come back once the commit is done), and a reply in that window
// waits for the record instead of finding no message. Mutants tried: the rows joining the
// queue after the commit (the poll in the window finds nothing: red); awaitRecord not
// waiting (the reply is answered not_found in the window: red).
func TestAcceptBatchDeliversDuringItsCommit(t *testing.T) {
	b, _ := newBusWith(t, func(c *Config) { c.Leaf = &LeafService{Name: "bot", Principal: "svc:bot"} })
	ctx := context.Background()
	target := Target{Harness: "svc", SessionID: "svc:bot"}
	reg := &Registration{Harness: "svc", SessionID: "svc:bot", Name: "bot"}
	ins := []Inbound{
		{ID: uuid.Must(uuid.NewV7()).String(), Peer: "hub", Body: "one", FromName: "xmsg@hub · a"},
		{ID: uuid.Must(uuid.NewV7()).String(), Peer: "hub", Body: "two", FromName: "xmsg@hub · a"},
	}
	inWindow, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	open := func() { once.Do(func() { close(release) }) }
	defer open() // a failed check must not leave the commit waiting (the cleanup closes the store)
	b.q.testWritten = func() { close(inWindow); <-release }
	type result struct {
		n   int
		err error
	}
	accepted := make(chan result, 1)
	go func() { n, err := b.AcceptBatch(target, ins, nil); accepted <- result{n, err} }()
	<-inWindow

	var stored bool
	b.cfg.Store.View(func(tx *store.Tx) error { _, stored, _ = tx.Message(ins[0].ID); return nil })
	if stored {
		t.Fatal("the record is visible in the window: the test is not inside the commit")
	}
	m, err := b.Poll(ctx, reg, 0)
	if err != nil || m == nil || m.ID != ins[0].ID {
		t.Fatalf("poll during the commit = %+v, %v; want the first row", m, err)
	}
	if err := b.Ack(ctx, reg, m.ID); err != nil {
		t.Fatal(err)
	}
	m, err = b.Poll(ctx, reg, 0)
	if err != nil || m == nil || m.ID != ins[1].ID {
		t.Fatalf("poll after the ack = %+v, %v; want the second row", m, err)
	}
	replied := make(chan error, 1)
	go func() {
		_, err := b.Reply(ctx, reg.Caller(), ins[1].ID, "thanks")
		replied <- err
	}()
	// Wait (bounded) until the reply waits for the record, or was answered without it.
	for i := 0; ; i++ {
		b.q.mu.Lock()
		waiting := b.q.awaiting
		b.q.mu.Unlock()
		if waiting > 0 {
			break
		}
		select {
		case err := <-replied:
			t.Fatalf("reply during the commit answered before the record was committed: %v", err)
		default:
		}
		if i == 10000 {
			t.Fatal("the reply neither waited nor was answered")
		}
		time.Sleep(time.Millisecond)
	}
	open()
	if r := <-accepted; r.err != nil || r.n != 2 {
		t.Fatalf("AcceptBatch = %d, %v; want 2, nil", r.n, r.err)
	}
	if err := <-replied; err != nil {
		t.Fatalf("reply during the commit: %v", err)
	}
	m, err = b.Poll(ctx, reg, 0)
	if err != nil || m == nil || m.ID != ins[1].ID {
		t.Fatalf("poll after the commit = %+v, %v; want the second row (the first was acked)", m, err)
	}
	if err := b.Ack(ctx, reg, m.ID); err != nil {
		t.Fatal(err)
	}
	if m, err := b.Poll(ctx, reg, 0); err != nil || m != nil {
		t.Fatalf("poll after both acks = %+v, %v; want nothing", m, err)
	}
	// Pulled again (the hub's ack was lost): known by id, queued nowhere again.
	b.q.testWritten = nil
	if n, err := b.AcceptBatch(target, ins, nil); err != nil || n != 2 {
		t.Fatalf("AcceptBatch again = %d, %v; want 2 known rows", n, err)
	}
	if m, err := b.Poll(ctx, reg, 0); err != nil || m != nil {
		t.Fatalf("poll after the rows came again = %+v, %v; want nothing", m, err)
	}
}
