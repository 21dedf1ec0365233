package fed

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/xmsg/xmsg/internal/bus"
	"github.com/xmsg/xmsg/internal/envelope"
	inbox "github.com/xmsg/xmsg/internal/hub"
)

// followLine is one line of a followed pull, as the leaf's Follow hands it on.
type followLine struct {
	ids   []string
	first bool
}

// TestLeafFollow: a followed pull answers at once with the rows there are, then a line for
// each batch that comes, never more rows out (handed and not acked) than its max; acks on
// their own (max 0) make room and wake it; a pull on another stream ends it without its
// handing out another row; a quiet mailbox ends it after its wait; and it needs a stream.
// Mutants tried: the window not held (the first line has all five rows): red; the stream
// not checked after the first batch (the superseded follow hands out the next row): red;
// settles not waking a follow waiting for room (the follow ends at its wait, the rows
// never come on it): red.
func TestLeafFollow(t *testing.T) {
	hub, l1, _, _ := hubWithLeaves(t, "")
	l1.startLeaf("{" + peerEntry("hub", hub.addr(), hub.cert.Pin, "") + "}")
	ctx := context.Background()
	send := func(text string) string {
		d, err := hub.bus.Send(ctx, bus.Send{To: envelope.ParseRef("svc:bot@l1"), Text: text, Bytes: len(text), FromName: "xmsg@hub · c", Principal: "http:c", From: "c"})
		if err != nil {
			t.Fatal(err)
		}
		return d.MessageID
	}
	var ids []string
	for i := range 5 {
		ids = append(ids, send(fmt.Sprintf("m%d", i)))
	}
	stream := uuid.NewString()
	lines := make(chan followLine, 16)
	ended := make(chan error, 1)
	go func() {
		ended <- l1.n.Follow(ctx, "hub", stream, nil, nil, 3, 0, 5*time.Second, func(rows []inbox.Row, first bool) error {
			l := followLine{first: first}
			for _, r := range rows {
				l.ids = append(l.ids, r.ID)
			}
			lines <- l
			return nil
		})
	}()
	next := func(what string) followLine {
		t.Helper()
		select {
		case l := <-lines:
			return l
		case err := <-ended:
			t.Fatalf("%s: the follow ended (%v) before its line", what, err)
		case <-time.After(30 * time.Second):
			t.Fatalf("%s: no line in 30 s", what)
		}
		return followLine{}
	}
	same := func(a, b []string) bool { return strings.Join(a, ",") == strings.Join(b, ",") }
	if l := next("first line"); !l.first || !same(l.ids, ids[:3]) {
		t.Fatalf("first line = %+v, want the first three rows (max 3), first", l)
	}
	// Each ack makes room for one row.
	for i := range 2 {
		if err := l1.n.AckPulled(ctx, "hub", ids[i:i+1], nil); err != nil {
			t.Fatal(err)
		}
		if l := next("after an ack"); l.first || !same(l.ids, ids[3+i:4+i]) {
			t.Fatalf("line after ack %d = %+v, want the one row %s (three out at most)", i+1, l, ids[3+i])
		}
	}
	// Three out: a new row waits for room.
	six := send("m5")
	if err := l1.n.AckPulled(ctx, "hub", ids[2:5], nil); err != nil {
		t.Fatal(err)
	}
	if l := next("after three more acks"); !same(l.ids, []string{six}) {
		t.Fatalf("line after the acks = %+v, want the new row %s", l, six)
	}
	if err := l1.n.AckPulled(ctx, "hub", []string{six}, nil); err != nil {
		t.Fatal(err)
	}
	// Another stream takes over (a pull on a connection of its own: the leaf's pull
	// connection is the follow's): the follow hands out nothing more, and ends.
	c := rawClient(l1.cert)
	other := uuid.NewString()
	if status, ans, out := pullRaw(t, c, hub.addr(), map[string]any{"max": 10, "stream": other}); status != 200 || len(ans.Rows) != 0 {
		t.Fatalf("pull on another stream = %d %v; want nothing", status, out)
	}
	seven := send("m6")
	select {
	case err := <-ended:
		if err != nil {
			t.Fatalf("superseded follow ended with %v", err)
		}
	case l := <-lines:
		t.Fatalf("a superseded follow handed out %+v", l)
	case <-time.After(30 * time.Second):
		t.Fatal("a superseded follow did not end")
	}
	if rows, err := l1.n.Pull(ctx, "hub", other, nil, nil, 10, 0, 0); err != nil || len(rows) != 1 || rows[0].ID != seven {
		t.Fatalf("pull on the stream that took over = %v, %v; want %s", rows, err, seven)
	}
	// A quiet mailbox: the first line (the acks' answer), then the end after the wait.
	quiet := uuid.NewString()
	n := 0
	err := l1.n.Follow(ctx, "hub", quiet, []string{seven}, nil, 3, 0, time.Second, func(rows []inbox.Row, first bool) error {
		n++
		if !first || len(rows) != 0 {
			t.Errorf("quiet follow's line: %d rows, first %v", len(rows), first)
		}
		return nil
	})
	if err != nil || n != 1 {
		t.Fatalf("quiet follow = %v after %d lines, want nil after 1", err, n)
	}
	if hub.mailbox("l1") != 0 {
		t.Errorf("mailbox %d after every row was acked", hub.mailbox("l1"))
	}
	// A follow needs a stream and a window.
	for _, bad := range []map[string]any{{"follow": true, "max": 3}, {"follow": true, "max": 0, "stream": uuid.NewString()}} {
		if status, out := post(t, c, hub.addr(), "/fed/v2/inbox", bad); status != 400 {
			t.Errorf("%v: %d %v, want 400", bad, status, out)
		}
	}
}
