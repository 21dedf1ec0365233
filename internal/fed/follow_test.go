package fed

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/xmsg/xmsg/internal/bus"
	"github.com/xmsg/xmsg/internal/envelope"
	inbox "github.com/xmsg/xmsg/internal/hub"
)

// mailFor sends text to l1's service through hub and returns its message id.
func mailFor(t *testing.T, hub *node, text string) string {
	t.Helper()
	d, err := hub.bus.Send(context.Background(), bus.Send{To: envelope.ParseRef("svc:bot@l1"), Text: text, Bytes: len(text), FromName: "xmsg@hub · c", Principal: "http:c", From: "c"})
	if err != nil {
		t.Fatal(err)
	}
	return d.MessageID
}

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
	send := func(text string) string { return mailFor(t, hub, text) }
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

// TestLeafFollowReload: a reload of the peers file ends a followed pull, on either side. On
// the hub, before the next line is written, the rows it took for that line given back to the
// stream (the next request is judged again under the new file, and the same stream hands
// them out); on the leaf, at the next line, with hub.ErrRestream (what the hub wrote after
// that line is not read: the stream must start over). Mutants tried: the hub not giving back
// the rows (the next pull on the stream gets nothing): red; the leaf reading on (no
// ErrRestream): red.
func TestLeafFollowReload(t *testing.T) {
	hub, l1, _, plain := hubWithLeaves(t, "")
	leafPeers := "{" + peerEntry("hub", hub.addr(), hub.cert.Pin, "") + "}"
	l1.startLeaf(leafPeers)
	ctx := context.Background()
	send := func(text string) string { return mailFor(t, hub, text) }
	follow := func(stream string, lines chan<- []string) <-chan error {
		ended := make(chan error, 1)
		go func() {
			ended <- l1.n.Follow(ctx, "hub", stream, nil, nil, 10, 0, 30*time.Second, func(rows []inbox.Row, first bool) error {
				var ids []string
				for _, r := range rows {
					ids = append(ids, r.ID)
				}
				lines <- ids
				return nil
			})
		}()
		return ended
	}
	wait := func(what string, ended <-chan error, lines <-chan []string) error {
		t.Helper()
		for {
			select {
			case err := <-ended:
				return err
			case ids := <-lines:
				if len(ids) > 0 {
					t.Fatalf("%s: the follow handed out %v after the reload", what, ids)
				}
			case <-time.After(30 * time.Second):
				t.Fatalf("%s: the follow did not end", what)
			}
		}
	}

	// The hub's peers file changes (a peer added); the next mail ends the follow unwritten.
	stream := uuid.NewString()
	lines := make(chan []string, 16)
	ended := follow(stream, lines)
	if ids := <-lines; len(ids) != 0 {
		t.Fatalf("first line = %v, want none (an empty mailbox)", ids)
	}
	raw, err := os.ReadFile(filepath.Join(hub.dir, "peers.json"))
	if err != nil {
		t.Fatal(err)
	}
	hub.write("peers.json", append(raw[:len(raw)-1], []byte(","+peerEntry("late", "192.0.2.77:1", newNode(t, "late").cert.Pin, "")+"}")...))
	if changed, err := hub.n.Reload(); err != nil || !changed {
		t.Fatalf("hub reload = %v, %v", changed, err)
	}
	one := send("after the hub's reload")
	if err := wait("hub reloaded", ended, lines); err != nil {
		t.Fatalf("follow ended by the hub's reload: %v, want its clean end", err)
	}
	if rows, err := l1.n.Pull(ctx, "hub", stream, nil, nil, 10, 0, 0); err != nil || len(rows) != 1 || rows[0].ID != one {
		t.Fatalf("pull on the same stream = %v, %v; want the row the follow took back, %s", rows, err, one)
	}

	// The leaf's peers file changes: its follow ends at the next line.
	stream = uuid.NewString()
	ended = follow(stream, lines)
	if ids := <-lines; len(ids) != 1 || ids[0] != one {
		t.Fatalf("first line = %v, want the row not acked, %s", ids, one)
	}
	l1.write("peers.json", []byte("{"+peerEntry("hub", hub.addr(), hub.cert.Pin, "")+","+peerEntry("other", "192.0.2.9:1", plain.cert.Pin, "")+"}"))
	if changed, err := l1.n.Reload(); err != nil || !changed {
		t.Fatalf("leaf reload = %v, %v", changed, err)
	}
	send("after the leaf's reload")
	if err := wait("leaf reloaded", ended, lines); !errors.Is(err, inbox.ErrRestream) {
		t.Fatalf("follow after the leaf's reload ended with %v, want hub.ErrRestream", err)
	}
}
