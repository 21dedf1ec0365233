package bus

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/xmsg/xmsg/internal/envelope"
)

// TestPeek: a peek returns the oldest queued messages in order, bounded in count and in bytes
// (the first one whatever its size), takes nothing (a second peek sees the same), counts what
// waits behind, and skips what was acked.
func TestPeek(t *testing.T) {
	b, _ := newBus(t)
	ctx := context.Background()
	r, err := b.RegisterSession("pi", "q", "/", self(), "")
	if err != nil {
		t.Fatal(err)
	}
	texts := []string{strings.Repeat("a", 90), "m1", "m2", "m3", "m4"}
	for _, tx := range texts {
		if _, err := b.Send(ctx, Send{To: envelope.ParseRef(r.SessionID), Text: tx, Bytes: len(tx), FromName: "a", Principal: "p"}); err != nil {
			t.Fatal(err)
		}
	}
	got := func(limit, bytes int) string {
		t.Helper()
		msgs, more, err := b.Peek(r, limit, bytes)
		if err != nil {
			t.Fatal(err)
		}
		var s []string
		for _, m := range msgs {
			s = append(s, m.Text[:2])
		}
		return fmt.Sprintf("%s+%d", strings.Join(s, ","), more)
	}
	for _, c := range []struct {
		limit, bytes int
		want         string
	}{
		{0, 1 << 20, "+5"},         // the count alone
		{3, 1 << 20, "aa,m1,m2+2"}, // count bound
		{3, 1 << 20, "aa,m1,m2+2"}, // nothing taken
		{10, 1, "aa+4"},            // the first one whatever its size, then the byte bound
		{10, 1 << 20, "aa,m1,m2,m3,m4+0"},
	} {
		if g := got(c.limit, c.bytes); g != c.want {
			t.Errorf("Peek(%d, %d) = %s, want %s", c.limit, c.bytes, g, c.want)
		}
	}
	msgs, _, _ := b.Peek(r, 2, 1<<20)
	for _, m := range msgs {
		if err := b.Ack(context.Background(), r, m.ID); err != nil {
			t.Fatal(err)
		}
	}
	if g := got(10, 1<<20); g != "m2,m3,m4+0" {
		t.Errorf("after acking two: %s, want m2,m3,m4+0", g)
	}
}
