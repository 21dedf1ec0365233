package bus

import (
	"context"
	"testing"
	"time"

	"github.com/xmsg/xmsg/internal/envelope"
	"github.com/xmsg/xmsg/internal/ledger"
)

// TestOfflineRecipientIsQueued: a send to a recipient that is not connected (a uid-admitted
// session between two registrations, a configured service not registered) answers queued
// and reads queued until the recipient has taken and acknowledged it, then delivered; a
// connected one answers delivered at once (docs/protocol.md §3.5, §5.2). Mutant tried: the
// outcome left delivered for an offline target: red.
func TestOfflineRecipientIsQueued(t *testing.T) {
	b, _ := newBus(t)
	ctx := context.Background()
	reg, err := b.RegisterSession("pi", "later", "/", self(), "")
	if err != nil {
		t.Fatal(err)
	}
	online, err := b.Send(ctx, Send{To: envelope.ParseRef(reg.SessionID), Text: "while connected", FromName: "t", Principal: "t"})
	if err != nil || online.Outcome.String() != "delivered" {
		t.Fatalf("send to a connected session: %+v %v; want delivered", online, err)
	}
	b.Unregister(reg)
	for _, ref := range []string{reg.SessionID, "svc:known"} {
		d, err := b.Send(ctx, Send{To: envelope.ParseRef(ref), Text: "while away", FromName: "t", Principal: "t"})
		if err != nil || d.Outcome.String() != "queued" {
			t.Fatalf("send to %s, not connected: %+v %v; want queued", ref, d, err)
		}
		if v, err := b.Message(d.MessageID); err != nil || v.Outcome != ledger.Queued {
			t.Errorf("GET %s's message before it was taken: %+v %v; want queued", ref, v, err)
		}
	}
	// It connects again and takes both: the one from before and the one sent while away.
	again, err := b.RegisterSession("pi", "later", "/", self(), "")
	if err != nil || again.SessionID != reg.SessionID {
		t.Fatalf("registered again as %+v %v; want %s", again, err, reg.SessionID)
	}
	var away string
	for range 2 {
		m, err := b.Poll(ctx, again, time.Second)
		if err != nil || m == nil {
			t.Fatalf("poll: %+v %v", m, err)
		}
		if m.ID != online.MessageID {
			away = m.ID
		}
		if err := b.Ack(context.Background(), again, m.ID); err != nil {
			t.Fatal(err)
		}
	}
	if v, err := b.Message(away); err != nil || v.Outcome != ledger.Delivered {
		t.Errorf("GET the message sent while away, after the ack: %+v %v; want delivered", v, err)
	}
}
