package ledger

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"
)

// TestCodeTable: every code has a distinct wire word and a 4xx or 5xx status, parses back to
// itself, and an unknown word reads as internal (500), as an unknown code always has.
func TestCodeTable(t *testing.T) {
	seen := map[string]Code{}
	for _, c := range Codes() {
		w := c.String()
		if w == "" || strings.ToLower(w) != w {
			t.Errorf("code %d has word %q", c, w)
		}
		if prev, dup := seen[w]; dup {
			t.Errorf("codes %d and %d share %q", prev, c, w)
		}
		seen[w] = c
		if s := c.Status(); s < 400 || s > 599 {
			t.Errorf("%s: status %d", w, s)
		}
		if got, ok := ParseCode(w); !ok || got != c {
			t.Errorf("ParseCode(%q) = %v, %v", w, got, ok)
		}
	}
	if c, ok := ParseCode("no_such_code"); ok || c != Internal || c.Status() != http.StatusInternalServerError {
		t.Errorf("unknown word: %v %v", c, ok)
	}
	var zero Code
	if zero != Internal {
		t.Error("the zero Code must be internal: a refusal built without a code fails closed")
	}
	for word, status := range map[string]int{"bad_request": 400, "not_found": 404, "unattested": 403, "conflict": 409,
		"payload_too_large": 413, "rate_limited": 429, "inbox_unavailable": 502, "service_unavailable": 503,
		"inbox_timeout": 504, "insufficient_storage": 507, "gone": 410} {
		if c, _ := ParseCode(word); c.Status() != status {
			t.Errorf("%s: status %d, want %d", word, c.Status(), status)
		}
	}
}

// TestWordsRoundTrip: outcomes, kinds and transports encode as their words in JSON and parse
// back; an event's JSON carries the words the monitor documents.
func TestWordsRoundTrip(t *testing.T) {
	for o := Delivered; o < numOutcomes; o++ {
		if got, ok := ParseOutcome(o.String()); !ok || got != o {
			t.Errorf("outcome %q: %v %v", o, got, ok)
		}
	}
	for _, k := range Kinds() {
		if got, ok := ParseKind(k.String()); !ok || got != k {
			t.Errorf("kind %q", k)
		}
	}
	for _, x := range Transports() {
		if got, ok := ParseTransport(x.String()); !ok || got != x {
			t.Errorf("transport %q", x)
		}
	}
	e := Event{Kind: Sent, MessageID: "m", From: "anon:a", To: "svc:x", Outcome: Queued, Transport: Register}
	b, err := json.Marshal(e)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`"event":"sent"`, `"outcome":"queued"`, `"transport":"register"`, `"message_id":"m"`} {
		if !strings.Contains(string(b), want) {
			t.Errorf("%s lacks %s", b, want)
		}
	}
	var back Event
	if err := json.Unmarshal(b, &back); err != nil || back.Kind != Sent || back.Outcome != Queued || back.Transport != Register {
		t.Errorf("round trip: %+v %v", back, err)
	}
	if err := json.Unmarshal([]byte(`{"event":"nonsense"}`), &back); err == nil {
		t.Error("an unknown event kind parsed")
	}
}

// TestRefusalAuditRateLimited: a client looping on a full queue gets its refusals, but the
// log gets one line a second per kind of refusal, not one per request. Mutant tried: the
// sink logging every refusal directly: 200 lines.
func TestRefusalAuditRateLimited(t *testing.T) {
	var logs strings.Builder
	s := NewStream(AuditLog(slog.New(slog.NewTextHandler(&logs, nil))))
	for range 200 {
		s.Request(Via{Transport: HTTP, Actor: "a"}, Sent, "send", "svc:known", Result{}, Errorf(ServiceUnavailable, "queue full"))
	}
	if n := strings.Count(logs.String(), "msg=refused"); n < 1 || n > 5 {
		t.Fatalf("%d refusal lines for 200 refusals, want one a second:\n%s", n, logs.String())
	}
}

// TestAuditLine: the accepted line is the line Logger.Info would write with its pairs (the
// sink writes it to the handler directly), and a refusal names its code.
func TestAuditLine(t *testing.T) {
	var logs strings.Builder
	log := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
		if a.Key == slog.TimeKey {
			return slog.Attr{}
		}
		return a
	}}))
	s := NewStream(AuditLog(log))
	s.Request(Via{Transport: HTTP, Actor: "anon:a"}, Sent, "send", "svc:known", Result{MessageID: "m-1"}, nil)
	got := logs.String()
	logs.Reset()
	log.Info("accepted", "socket", "http", "actor", "anon:a", "request", "send", "target", "svc:known", "message_id", "m-1")
	if want := logs.String(); got != want {
		t.Errorf("accepted line %q, want %q", got, want)
	}
	logs.Reset()
	s.Request(Via{Transport: HTTP, Actor: "anon:a"}, Sent, "send", "svc:unknown", Result{}, Errorf(NotFound, "no live session matches 'svc:unknown'"))
	if got := logs.String(); !strings.Contains(got, "msg=refused socket=http actor=anon:a request=send target=svc:unknown code=not_found") {
		t.Errorf("refusal line %q", got)
	}
	logs.Reset()
	// What the daemon does on its own is not a request: counted and watched, not logged.
	s.Emit(Event{Kind: Acked, MessageID: "m-1"})
	if logs.Len() != 0 {
		t.Errorf("a non-request event wrote %q", logs.String())
	}
}

// TestWatchSlowNeverBlocks: a watch that does not read loses its oldest events, never the
// stream's time: emitting 100,000 events into a ring of 16 returns, and the next read gets the
// 16 newest in order and the count of those lost. Mutant tried: push waiting for room (a
// blocking channel send): the emit loop never returns (the test times out).
func TestWatchSlowNeverBlocks(t *testing.T) {
	w := NewWatchers(2, 16)
	s := NewStream(w)
	x, err := w.Watch(nil, false)
	if err != nil {
		t.Fatal(err)
	}
	defer x.Close()
	const n = 100_000
	for i := range n {
		s.Emit(Event{Kind: Sent, MessageID: fmt.Sprint(i)})
	}
	got, lost, err := x.Next(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 16 || lost != n-16 {
		t.Fatalf("got %d events, lost %d; want 16 and %d", len(got), lost, n-16)
	}
	if w.Dropped() != n-16 {
		t.Fatalf("Dropped = %d, want %d", w.Dropped(), n-16)
	}
	for i, e := range got {
		if want := fmt.Sprint(n - 16 + i); e.MessageID != want || e.Seq != uint64(n-16+i+1) {
			t.Errorf("event %d: %s seq %d, want %s", i, e.MessageID, e.Seq, want)
		}
	}
}

// TestWatchersBounded: a tier serves at most max watches; a closed one frees its place; a
// watch keeps only what its filter accepts, and never sees a refusal's cause.
func TestWatchersBounded(t *testing.T) {
	w := NewWatchers(2, 8)
	a, err1 := w.Watch(func(e *Event) bool { return e.To == "svc:a" }, false)
	b, err2 := w.Watch(nil, false)
	if err1 != nil || err2 != nil {
		t.Fatal(err1, err2)
	}
	if _, err := w.Watch(nil, false); err != ErrWatchersFull {
		t.Fatalf("third watch: %v, want ErrWatchersFull", err)
	}
	s := NewStream(w)
	s.Emit(Event{Kind: Sent, To: "svc:b"})
	s.Request(Via{Transport: HTTP}, Sent, "send", "svc:a", Result{}, fmt.Errorf("open /home/secret: %w", Errorf(NotFound, "x")))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	got, _, _ := a.Next(ctx, nil)
	if len(got) != 1 || got[0].To != "svc:a" || got[0].Err != nil || got[0].CodeWord() != "not_found" {
		t.Fatalf("filtered watch got %+v", got)
	}
	if got, _, _ := b.Next(ctx, nil); len(got) != 2 {
		t.Fatalf("unfiltered watch got %d events", len(got))
	}
	a.Close()
	a.Close() // twice is once
	if w.Len() != 1 {
		t.Fatalf("%d watches after a close", w.Len())
	}
	if c, err := w.Watch(nil, false); err != nil {
		t.Fatalf("a freed place is refused: %v", err)
	} else {
		c.Close()
	}
	b.Close()
}

// TestCounterBoundedLabels: 10,000 distinct unknown harness and peer names make one series
// each ("other"), not 10,000: no sender can grow the metrics. Mutant tried: no harnessOK
// check: 10,000 series.
func TestCounterBoundedLabels(t *testing.T) {
	c := NewCounter(func(h string) bool { return h == "svc" }, func(p string) bool { return p == "hub" })
	s := NewStream(c)
	for i := range 10_000 {
		s.Emit(Event{Kind: Sent, Harness: fmt.Sprint("h", i), Peer: fmt.Sprint("p", i), Transport: Fed, Outcome: Delivered, Bytes: 3})
	}
	s.Emit(Event{Kind: Sent, Harness: "svc", Peer: "hub", Transport: Fed, Outcome: Delivered, Bytes: 3})
	counts := c.Counts()
	if len(counts) != 2 {
		t.Fatalf("%d series, want 2: %+v", len(counts), counts)
	}
	var total, bytes uint64
	for _, n := range counts {
		total += n.Events
		bytes += n.Bytes
	}
	if total != 10_001 || bytes != 30_003 {
		t.Fatalf("counted %d events, %d bytes", total, bytes)
	}
}

// TestNilStream: a bus or server built without a stream takes events and drops them.
func TestNilStream(t *testing.T) {
	var s *Stream
	s.Emit(Event{Kind: Sent})
	s.Request(Via{}, Sent, "send", "x", Result{}, nil)
}

// TestWatchText: a watch that asked for texts holds each event's text, and only it: the
// audit and counter sinks and a watch without text never see one; the texts a watch holds
// unread are bounded (MaxTextBytes), the oldest going first, counted as lost. Mutant tried:
// the byte bound off (red: 40 MiB held).
func TestWatchText(t *testing.T) {
	w := NewWatchers(4, 64)
	var seen []string
	spy := sinkFunc(func(e *Event) { seen = append(seen, e.Detail) })
	s := NewStream(w, spy)
	with, _ := w.Watch(nil, true)
	without, _ := w.Watch(nil, false)
	s.Request(Via{Transport: HTTP}, Sent, "send", "svc:a", Result{MessageID: "m", Text: "hello"}, nil)
	ctx := context.Background()
	if got, _, _ := with.Next(ctx, nil); len(got) != 1 || got[0].Text != "hello" || got[0].MessageID != "m" {
		t.Fatalf("with text: %+v", got)
	}
	if got, _, _ := without.Next(ctx, nil); len(got) != 1 || got[0].Text != "" {
		t.Fatalf("without text: %+v", got)
	}
	if len(seen) != 1 {
		t.Fatalf("the other sink saw %d events", len(seen))
	}
	big := strings.Repeat("x", 1<<20)
	for range 40 {
		s.Request(Via{Transport: HTTP}, Sent, "send", "svc:a", Result{MessageID: "m", Text: big}, nil)
	}
	got, lost, _ := with.Next(ctx, nil)
	held := 0
	for _, it := range got {
		held += len(it.Text)
	}
	if held > MaxTextBytes || lost == 0 || len(got)+int(lost) != 40 {
		t.Fatalf("held %d bytes of text in %d items, lost %d; want at most %d, the rest lost", held, len(got), lost, MaxTextBytes)
	}
}

type sinkFunc func(*Event)

func (f sinkFunc) Event(e *Event) { f(e) }
