package bus

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/xmsg/xmsg/internal/envelope"
	"github.com/xmsg/xmsg/internal/ledger"
)

// clock is a test clock: Now is what it was set to.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// TestExpiredRowsInvisible: once --reply-ttl has passed on the bus clock, a message and its
// reply answer not_found and an expired queued message is not delivered, though no purge has
// run; once --idempotency-ttl has passed, a key is free again. No test sleeps for it: the
// clock is the bus's. Mutants tried: expired() always false (the three reply-ttl checks go
// red); idem() without its TTL check (the idempotency check goes red).
func TestExpiredRowsInvisible(t *testing.T) {
	c := &clock{t: time.Unix(1_800_000_000, 0)}
	b, _ := newBusWith(t, func(cfg *Config) { cfg.Now, cfg.ReplyTTL, cfg.IdemTTL = c.Now, 2*time.Second, time.Hour })
	ctx := context.Background()
	r, err := b.RegisterSession("pi", "p", "/", self(), "")
	if err != nil {
		t.Fatal(err)
	}
	d, err := b.Send(ctx, Send{To: envelope.ParseRef(r.SessionID), Text: "old", Bytes: 3, FromName: "a", Principal: "p"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.Reply(ctx, r.Caller(), d.MessageID, "r"); err != nil {
		t.Fatal(err)
	}
	if err := b.Ack(context.Background(), r, d.MessageID); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Send(ctx, Send{To: envelope.ParseRef(r.SessionID), Text: "stale", Bytes: 5, FromName: "a", Principal: "p"}); err != nil {
		t.Fatal(err)
	}
	if rs, err := b.Replies(ctx, d.MessageID, 0, 0); err != nil || len(rs) != 1 {
		t.Fatalf("the fresh reply: %v, %v", rs, err)
	}
	c.advance(3500 * time.Millisecond)
	if rs, err := b.Replies(ctx, d.MessageID, 0, 0); AsError(err).Code != ledger.NotFound {
		t.Errorf("an expired reply is listed: %v, %v; want not_found", rs, err)
	}
	if v, err := b.Message(d.MessageID); AsError(err).Code != ledger.NotFound {
		t.Errorf("an expired message: %+v, %v; want not_found", v, err)
	}
	if p, err := b.Poll(ctx, r, 0); p != nil || err != nil {
		t.Errorf("an expired queued message was delivered: %+v, %v", p, err)
	}

	k := Send{To: envelope.ParseRef(r.SessionID), Text: "one", Bytes: 3, FromName: "a", Principal: "p", Key: "k-1"}
	if _, err := b.Send(ctx, k); err != nil {
		t.Fatal(err)
	}
	k.Text = "two"
	if _, err := b.Send(ctx, k); AsError(err).Code != ledger.Conflict {
		t.Fatalf("a fresh key reused with another body: %v, want conflict", err)
	}
	c.advance(time.Hour + time.Second)
	if _, err := b.Send(ctx, k); err != nil {
		t.Errorf("a key past --idempotency-ttl: %v, want a new send", err)
	}
}
