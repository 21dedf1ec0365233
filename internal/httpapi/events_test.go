package httpapi

import (
	"bufio"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/xmsg/xmsg/internal/ledger"
)

// streamBus is a Bus of which GET /v1/events uses only the event stream.
type streamBus struct {
	Bus
	s *ledger.Stream
}

func (b streamBus) Events() *ledger.Stream { return b.s }

// seamTier replays m0, m1, m2 from its "store"; m1 and m2 were committed before the store
// was read but their live events arrive after the watch attached (they are emitted during
// the read), and m3 is sent after it.
type seamTier struct {
	t        *testing.T
	w        *ledger.Watchers
	s        *ledger.Stream
	attached bool // the watch was attached when the store was read
}

func (x *seamTier) Watch(keep func(*ledger.Event) bool, text bool) (*ledger.Watch, error) {
	return x.w.Watch(keep, text)
}
func (x *seamTier) MaxWatches() int     { return x.w.Max() }
func (x *seamTier) Metrics(w io.Writer) {}
func (x *seamTier) Replay(since time.Time, keep func(*ledger.Event) bool, fn func(*ledger.Event) bool) error {
	x.attached = x.w.Len() == 1
	x.s.Emit(ledger.Event{Kind: ledger.Sent, MessageID: "m1"})
	x.s.Emit(ledger.Event{Kind: ledger.Replied, InReplyTo: "m0", ReplySeq: 1})
	x.s.Emit(ledger.Event{Kind: ledger.Sent, MessageID: "m2"})
	for _, e := range []ledger.Event{{Kind: ledger.Sent, MessageID: "m0"}, {Kind: ledger.Sent, MessageID: "m1"},
		{Kind: ledger.Replied, InReplyTo: "m0", ReplySeq: 1}, {Kind: ledger.Sent, MessageID: "m2"}} {
		if !fn(&e) {
			return nil
		}
	}
	x.s.Emit(ledger.Event{Kind: ledger.Sent, MessageID: "m3"})
	x.s.Emit(ledger.Event{Kind: ledger.Replied, InReplyTo: "m0", ReplySeq: 2})
	return nil
}

// TestEventsSinceSeam: with since, the watch is attached before the store is read, and the
// live events of what the replay already showed are dropped: each message and reply is
// shown once, in order. Mutants tried: the seam check removed (m1, m2 and the reply shown
// twice); the watch attached after the replay (the store read without a watch: a gap).
func TestEventsSinceSeam(t *testing.T) {
	w := ledger.NewWatchers(8, 64)
	s := ledger.NewStream(w)
	tier := &seamTier{t: t, w: w, s: s}
	path, _ := serveHandler(t, Handler(Config{Log: slog.New(slog.DiscardHandler), Bus: streamBus{s: s}, Tier: tier}), nil)
	resp, err := unixClient(path).Get("http://x/v1/events?since=2026-01-01T00:00:00Z&event=sent,replied")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d", resp.StatusCode)
	}
	want := []string{"sent m0", "sent m1", "replied m0#1", "sent m2", "sent m3", "replied m0#2"}
	sc := bufio.NewScanner(resp.Body)
	for i := 0; i < len(want) && sc.Scan(); i++ {
		var e ledger.Event
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			t.Fatal(err)
		}
		got := e.Kind.String() + " " + e.MessageID
		if e.Kind == ledger.Replied {
			got = e.Kind.String() + " " + e.InReplyTo + "#" + string(rune('0'+e.ReplySeq))
		}
		if got != want[i] {
			t.Fatalf("event %d: %s, want %s", i, got, want[i])
		}
	}
	if !tier.attached {
		t.Error("the store was read before the watch was attached")
	}
}

// TestEventsBadQuery: an unknown event kind, a bad since, and asking for text are refused.
func TestEventsBadQuery(t *testing.T) {
	w := ledger.NewWatchers(8, 64)
	s := ledger.NewStream(w)
	path, _ := serveHandler(t, Handler(Config{Log: slog.New(slog.DiscardHandler), Bus: streamBus{s: s}, Tier: &seamTier{t: t, w: w, s: s}}), nil)
	for _, q := range []string{"event=nonsense", "since=yesterday", "text=yes"} {
		resp, err := unixClient(path).Get("http://x/v1/events?" + q)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest {
			t.Errorf("%s: %d, want 400", q, resp.StatusCode)
		}
	}
	if w.Len() != 0 {
		t.Errorf("%d watches left attached", w.Len())
	}
}

// TestEventsRefusedOnTCP: the TCP listener checks no peer, so it never serves the event
// stream (every message's id, sender and recipient; an id is all a reply read asks for):
// 403 op_denied, and no watch is attached. Mutant tried: the socket check removed: 200 and
// a stream (the reviewer's finding before the fix).
func TestEventsRefusedOnTCP(t *testing.T) {
	w := ledger.NewWatchers(8, 64)
	s := ledger.NewStream(w)
	path, _ := serveHandler(t, Handler(Config{Log: slog.New(slog.DiscardHandler), Socket: "tcp", Bus: streamBus{s: s}, Tier: &seamTier{t: t, w: w, s: s}}), nil)
	resp, err := unixClient(path).Get("http://localhost/v1/events") // a Host the TCP listener admits
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden || !strings.Contains(string(body), `"op_denied"`) {
		t.Fatalf("GET /v1/events on tcp: %d %s, want 403 op_denied", resp.StatusCode, body)
	}
	if w.Len() != 0 {
		t.Errorf("%d watches attached on tcp", w.Len())
	}
}
