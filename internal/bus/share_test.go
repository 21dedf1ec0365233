package bus

import (
	"context"
	"testing"

	"github.com/xmsg/xmsg/internal/envelope"
	"github.com/xmsg/xmsg/internal/ledger"
	"github.com/xmsg/xmsg/internal/store"
)

// An attested local session holds at most its share of a service's queue; another session
// and anonymous senders still get in; with the share off (Bounds.QueueShare < 0) the first
// takes the whole queue. Mutant tried: slot.enqueue without the share (EnqueueShare with 0):
// the first session's 100 sends all accepted, red.
func TestQueueSharePerLocalSession(t *testing.T) {
	for _, off := range []bool{false, true} {
		b, _ := newBusWith(t, func(c *Config) {
			if off {
				c.Bounds.QueueShare = -1
			}
		})
		send := func(c *Caller) error {
			_, err := b.Send(context.Background(), Send{To: envelope.ParseRef("svc:known"), Text: "x", FromName: "f", Principal: "p", Caller: c})
			return err
		}
		alice := &Caller{Harness: "claude", SessionID: "alice-1", Name: "alice"}
		bob := &Caller{Harness: "claude", SessionID: "bob-1", Name: "bob"}
		accepted := 0
		for range store.MaxQueue {
			if send(alice) == nil {
				accepted++
			}
		}
		want := DefaultQueueShare
		if off {
			want = store.MaxQueue
		}
		if accepted != want {
			t.Errorf("share off %v: the flooding session got %d places, want %d", off, accepted, want)
		}
		if off {
			continue
		}
		for i := range 10 {
			if err := send(bob); err != nil {
				t.Fatalf("second session, send %d: %v", i, err)
			}
			if err := send(nil); err != nil {
				t.Fatalf("anonymous sender, send %d: %v", i, err)
			}
		}
		if err := send(alice); AsError(err).Code != ledger.ServiceUnavailable {
			t.Errorf("over its share: %v, want 503 service_unavailable", err)
		}
	}
}
