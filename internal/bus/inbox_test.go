package bus

import (
	"bufio"
	"context"
	"net"
	"path/filepath"
	"regexp"
	"testing"
	"time"

	"github.com/xmsg/xmsg/internal/envelope"
	"github.com/xmsg/xmsg/internal/store"
)

// inboxConn is what one connection to a fake Claude inbox carried.
type inboxConn struct {
	line  string
	found bool // the line's message was in the store when the line arrived
}

// listenInbox serves a Claude inbox at path that looks the message up in st the moment its
// line arrives (as a session replying at once would), and reports each connection twice: when
// its line (or nothing) has arrived, and when the daemon has closed it.
func listenInbox(t *testing.T, path string, st *store.Store) (lines chan inboxConn, closed chan struct{}) {
	l, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	lines, closed = make(chan inboxConn, 4), make(chan struct{}, 4)
	idRe := regexp.MustCompile(`message_id=([0-9a-f-]{36})`)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				r := bufio.NewReader(c)
				line, _ := r.ReadString('\n')
				var got inboxConn
				got.line = line
				if m := idRe.FindStringSubmatch(line); m != nil {
					st.View(func(tx *store.Tx) error {
						_, got.found, _ = tx.Message(m[1])
						return nil
					})
				}
				lines <- got
				r.ReadByte() // until the daemon closes
				closed <- struct{}{}
			}()
		}
	}()
	return lines, closed
}

// TestInboxAfterCommit: a Claude inbox is connected before the commit but sees the line only
// once the message is stored (a session that looks it up on arrival finds it), the connection
// is closed only by the work handed to WithAfter's runner (off the sender's wait), and a send whose commit
// fails leaves the inbox a connection that carried nothing. Mutants tried: the line written
// before the commit (red: not found); the close done at once instead of handed over (red:
// closed early); the line written although the commit failed (red: a line arrived).
func TestInboxAfterCommit(t *testing.T) {
	b, dir := newBus(t)
	lines, closed := listenInbox(t, filepath.Join(dir, "nobody.sock"), b.cfg.Store)
	var later []func()
	ctx := WithAfter(context.Background(), func(fn func()) { later = append(later, fn) })
	d, err := b.Send(ctx, Send{To: envelope.ParseRef("alice"), Text: "hello", FromName: "f", Principal: "p"})
	if err != nil {
		t.Fatal(err)
	}
	select {
	case got := <-lines:
		if !got.found {
			t.Fatalf("line %q arrived before message %s was stored", got.line, d.MessageID)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no line arrived")
	}
	select {
	case <-closed:
		t.Fatal("the inbox was closed before the handed-over work ran")
	case <-time.After(50 * time.Millisecond):
	}
	if len(later) != 1 {
		t.Fatalf("%d pieces of work handed over, want 1 (the inbox's close)", len(later))
	}
	for _, fn := range later {
		fn()
	}
	select {
	case <-closed:
	case <-time.After(5 * time.Second):
		t.Fatal("the inbox was never closed")
	}

	// A commit that fails: the store is closed under the send.
	b.cfg.Store.Close()
	if _, err := b.Send(context.Background(), Send{To: envelope.ParseRef("alice"), Text: "lost", FromName: "f", Principal: "p"}); err == nil {
		t.Fatal("a send on a closed store was accepted")
	}
	select {
	case got := <-lines:
		if got.line != "" {
			t.Fatalf("a send whose commit failed wrote %q to the inbox", got.line)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the inbox connected before the commit was never closed")
	}
}
