package leaf

import (
	"context"
	"encoding/json"
	"log/slog"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/xmsg/xmsg/internal/bus"
	"github.com/xmsg/xmsg/internal/claude"
	inbox "github.com/xmsg/xmsg/internal/hub"
	"github.com/xmsg/xmsg/internal/ledger"
	"github.com/xmsg/xmsg/internal/peercred"
	"github.com/xmsg/xmsg/internal/store"
)

// fakeHub hands out rows in order, fails the first polls and acks it is told to, and
// records each ack with whether the local service had acked the row by then.
type fakeHub struct {
	mu         sync.Mutex
	rows       []*inbox.Row
	failPolls  int
	failAcks   int
	acks       []string
	rejects    []string // rows rejected (batched pulls only)
	early      []string // hub acks that came before the local ack
	localAcked map[string]bool
	polls      int
	ids        []string // of the rows, in order
	noPull     bool     // a hub without POST /fed/v2/inbox
	noStreams  bool     // a hub whose POST /fed/v2/inbox knows no stream (and no max 0)
	pulls      int
	stream     string          // the stream of the last pull
	handed     map[string]bool // rows handed out on it, not acked since
	ownAcks    int             // acks that came on their own (AckPulled)
	// recorded, when set, holds the rows whose records the leaf has committed; unrecorded
	// the hub acks of rows not in it.
	recorded   map[string]bool
	unrecorded []string
}

func (h *fakeHub) rowID(i int) string { return h.ids[i] }

func (h *fakeHub) Inbox(ctx context.Context, peer string, wait time.Duration) (*inbox.Row, error) {
	h.mu.Lock()
	h.polls++
	if h.failPolls > 0 {
		h.failPolls--
		h.mu.Unlock()
		return nil, &bus.Error{Code: ledger.PeerUnreachable}
	}
	if len(h.rows) > 0 {
		r := h.rows[0]
		h.mu.Unlock()
		return r, nil
	}
	h.mu.Unlock()
	select {
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-time.After(10 * time.Millisecond):
		return nil, nil
	}
}

func (h *fakeHub) AckInbox(ctx context.Context, peer, id string) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.failAcks > 0 {
		h.failAcks--
		return &bus.Error{Code: ledger.PeerUnreachable}
	}
	return h.ack(id)
}

// Pull is the batched route: a failed pull acks nothing (the acks are sent again); rows
// handed out on a stream are not handed out again on it until acked (hub.Mailboxes.Pull).
func (h *fakeHub) Pull(ctx context.Context, peer, stream string, ack, reject []string, max, maxBytes int, wait time.Duration) ([]inbox.Row, error) {
	h.mu.Lock()
	if h.noPull {
		h.pulls++
		h.mu.Unlock()
		return nil, &bus.Error{Code: ledger.NotFound, Detail: "peer hub: no route POST /fed/v2/inbox"}
	}
	if h.noStreams && stream != "" {
		h.mu.Unlock()
		return nil, &bus.Error{Code: ledger.BadRequest, Detail: `pull request: json: unknown field "stream"`}
	}
	h.polls++
	if h.failPolls > 0 || (len(ack) > 0 && h.failAcks > 0) {
		if h.failPolls > 0 {
			h.failPolls--
		} else {
			h.failAcks--
		}
		h.mu.Unlock()
		return nil, &bus.Error{Code: ledger.PeerUnreachable}
	}
	h.settle(ack, reject)
	if stream == "" || stream != h.stream {
		h.stream, h.handed = stream, map[string]bool{}
	}
	var out []inbox.Row
	for _, r := range h.rows {
		if len(out) < max && !h.handed[r.ID] {
			out = append(out, *r)
			if stream != "" {
				h.handed[r.ID] = true
			}
		}
	}
	h.mu.Unlock()
	if len(out) > 0 {
		return out, nil
	}
	select {
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-time.After(10 * time.Millisecond):
		return nil, nil
	}
}

// Follow: this hub knows no followed pull (an older hub's refusal): the loop pulls a batch at
// a time, which is what these tests are of (followhub_test.go has a hub that follows).
func (h *fakeHub) Follow(ctx context.Context, peer, stream string, ack, reject []string, max, maxBytes int, wait time.Duration, each func([]inbox.Row, bool) error) error {
	return &bus.Error{Code: ledger.BadRequest, Detail: `pull request: json: unknown field "follow"`}
}

func (h *fakeHub) acked() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.acks)
}

func (h *fakeHub) settle(ack, reject []string) {
	for _, id := range ack {
		h.ack(id)
	}
	for _, id := range reject {
		for i, r := range h.rows {
			if r.ID == id {
				h.rows = append(h.rows[:i], h.rows[i+1:]...)
				h.rejects = append(h.rejects, id)
				break
			}
		}
	}
}

func (h *fakeHub) AckPulled(ctx context.Context, peer string, ack, reject []string) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.noStreams {
		return &bus.Error{Code: ledger.BadRequest, Detail: "max must be >= 1"}
	}
	if h.failAcks > 0 {
		h.failAcks--
		return &bus.Error{Code: ledger.PeerUnreachable}
	}
	h.ownAcks++
	h.settle(ack, reject)
	return nil
}

func (h *fakeHub) ack(id string) error {
	if !h.localAcked[id] {
		h.early = append(h.early, id)
	}
	if h.recorded != nil && !h.recorded[id] {
		h.unrecorded = append(h.unrecorded, id)
	}
	for i, r := range h.rows {
		if r.ID == id {
			h.rows = append(h.rows[:i], h.rows[i+1:]...)
			h.acks = append(h.acks, id)
			delete(h.handed, id)
			return nil
		}
	}
	return &bus.Error{Code: ledger.NotFound}
}

// Every way of pulling: batches (the default), one row at a time (Batch 1, the protocol's
// own routes), and batches against a hub that does not know the batched route (it falls
// back to one row at a time, after one try).
func TestPullerAcksTheHubAfterTheLocalAckAndRetries(t *testing.T) {
	for _, c := range []struct {
		name              string
		batch             int
		noPull, noStreams bool
	}{{"batched", 0, false, false}, {"one row at a time", 1, false, false}, {"hub without batches", 0, true, false},
		{"hub without streams", 0, false, true}} {
		t.Run(c.name, func(t *testing.T) { pullerAcksAfterLocalAck(t, c.batch, c.noPull, c.noStreams) })
	}
}

func pullerAcksAfterLocalAck(t *testing.T, batch int, noPull, noStreams bool) {
	log := slog.New(slog.DiscardHandler)
	b := leafBus(t, bus.Bounds{})
	principal, _ := json.Marshal(map[string]string{"kind": "session", "harness": "claude", "session_id": "s1", "name": "alice"})
	hub := &fakeHub{failPolls: 3, failAcks: 3, localAcked: map[string]bool{}, noPull: noPull, noStreams: noStreams}
	for _, text := range []string{"one", "two", "three"} {
		hub.rows = append(hub.rows, &inbox.Row{ID: uuid.Must(uuid.NewV7()).String(), Body: text, To: "svc:bot", Principal: principal, PushReplies: true})
	}
	// A row for another target is dropped rather than blocking the mailbox: rejected with a
	// batched pull (the hub reads not_found), acked one row at a time (no reject there).
	hub.rows = append(hub.rows, &inbox.Row{ID: uuid.Must(uuid.NewV7()).String(), Body: "x", To: "svc:other"})
	want := len(hub.rows)
	hub.ids = nil
	for _, r := range hub.rows {
		hub.ids = append(hub.ids, r.ID)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	p := &Puller{Bus: b, Hub: hub, Peer: "hub", Service: "bot", MaxBody: 65536, Log: log, MinBackoff: time.Millisecond, MaxBackoff: 4 * time.Millisecond, Batch: batch}
	go func() { p.Run(ctx); close(done) }()
	reg := &bus.Registration{Harness: "svc", SessionID: "svc:bot", Name: "bot"}
	for _, text := range []string{"one", "two", "three"} {
		m, err := b.Poll(ctx, reg, 10*time.Second)
		if err != nil || m == nil || m.Text != text {
			t.Fatalf("local poll = %+v %v, want %q", m, err, text)
		}
		if m.FromName != "xmsg@hub · claude:alice" {
			t.Errorf("fromName = %q", m.FromName)
		}
		hub.mu.Lock()
		hub.localAcked[m.ID] = true
		hub.mu.Unlock()
		if err := b.Ack(context.Background(), reg, m.ID); err != nil {
			t.Fatal(err)
		}
	}
	for i := 0; i < 2000; i++ {
		hub.mu.Lock()
		n := len(hub.acks) + len(hub.rejects)
		hub.mu.Unlock()
		if n == want {
			break
		}
		time.Sleep(time.Millisecond)
	}
	cancel()
	<-done
	if len(hub.acks)+len(hub.rejects) != want {
		t.Errorf("hub acks = %d, rejects %d, want %d in all", len(hub.acks), len(hub.rejects), want)
	}
	// Only the undeliverable row may be settled without a local ack: rejected when batched,
	// else acked.
	if batched := batch != 1 && !noPull; batched {
		if len(hub.early) != 0 || len(hub.rejects) != 1 || hub.rejects[0] != hub.rowID(want-1) {
			t.Errorf("batched: acked before the local ack %v, rejected %v; want only the undeliverable row rejected", hub.early, hub.rejects)
		}
	} else if len(hub.early) != 1 || hub.early[0] != hub.rowID(want-1) || len(hub.rejects) != 0 {
		t.Errorf("hub acked before the local ack: %v (rejected %v)", hub.early, hub.rejects)
	}
	if noPull && hub.pulls != 1 {
		t.Errorf("a hub without batches was asked for one %d times, want once", hub.pulls)
	}
	if hub.failPolls != 0 || hub.failAcks != 0 {
		t.Errorf("failures not retried: polls %d acks %d left", hub.failPolls, hub.failAcks)
	}
	// The message rows carry the hub as return host: a reply goes back there.
	v, err := b.Message(hub.rowID(0))
	if err != nil || v.ReturnHarness != "claude" || !v.PushReplies {
		t.Errorf("message row = %+v %v", v, err)
	}
}

// A hub that stays unreachable: the leaf logs each retry while its backoff grows, then one
// line a minute at the longest delay, not one per retry. Mutant tried: retryWarn logging
// every retry: about 200 lines, red.
func TestPullerRetryLogIsRateLimited(t *testing.T) {
	b := leafBus(t, bus.Bounds{})
	hub := &fakeHub{failPolls: 1 << 30, localAcked: map[string]bool{}}
	var logs strings.Builder
	var mu sync.Mutex
	log := slog.New(slog.NewTextHandler(writerFunc(func(p []byte) (int, error) { mu.Lock(); defer mu.Unlock(); return logs.Write(p) }), nil))
	p := &Puller{Bus: b, Hub: hub, Peer: "hub", Service: "bot", MaxBody: 65536, Log: log, MinBackoff: 100 * time.Microsecond, MaxBackoff: 400 * time.Microsecond}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { p.Run(ctx); close(done) }()
	for i := 0; i < 5000; i++ {
		hub.mu.Lock()
		n := hub.polls
		hub.mu.Unlock()
		if n >= 200 {
			break
		}
		time.Sleep(time.Millisecond)
	}
	cancel()
	<-done
	mu.Lock()
	lines := strings.Count(logs.String(), "leaf pull failed")
	mu.Unlock()
	t.Logf("%d failed pulls, %d lines logged", hub.polls, lines)
	if lines < 2 || lines > 5 {
		t.Errorf("%d lines for %d failed pulls, want the growing retries and one at the longest delay:\n%s", lines, hub.polls, logs.String())
	}
}

// leafBus is a leaf's bus serving svc:bot, on a store of its own, closed with the test.
func leafBus(t *testing.T, bounds bus.Bounds) *bus.Bus {
	t.Helper()
	st, err := store.Open(filepath.Join(t.TempDir(), "x.db"), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	id, _ := ParsePrincipal("svc:bot")
	log := slog.New(slog.DiscardHandler)
	b := bus.New(bus.Config{Host: "leaf", MaxBody: 65536, ReplyTTL: time.Hour, IdemTTL: time.Hour, Store: st, Proc: peercred.Proc{}, Log: log,
		Leaf: id.Bus(), Claude: &claude.Scanner{Log: log}, Bounds: bounds})
	t.Cleanup(func() { b.Close() })
	return b
}

// run runs p until the test ends, and returns the context it runs in.
func run(t *testing.T, p *Puller) context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { p.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return ctx
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

// TestBackoffJitter: a retry waits between half the current delay and all of it, drawn at
// random, so a fleet that lost its hub at one instant does not come back at the same instants
// each time the delay doubles. Mutant tried: delay returning the current delay: red.
func TestBackoffJitter(t *testing.T) {
	b := backoff{min: 100 * time.Millisecond, max: 5 * time.Second}
	b.reset()
	seen := map[time.Duration]bool{}
	for range 1000 {
		d := b.delay()
		if d < b.cur/2 || d > b.cur {
			t.Fatalf("delay %v outside [%v, %v]", d, b.cur/2, b.cur)
		}
		seen[d] = true
	}
	if len(seen) < 500 {
		t.Errorf("1000 retries of a fleet at 100 ms: %d distinct delays, want them spread", len(seen))
	}
}

// commitBus is a leaf's bus whose service acks every row at once and whose records' commits
// give the results the test set, in turn (nil once they are spent).
type commitBus struct {
	hub     *fakeHub
	results chan error
	batches int
}

func (c *commitBus) AcceptBatch(t bus.Target, ins []bus.Inbound, o bus.BatchOptions) (int, <-chan error, error) {
	var res error
	select {
	case res = <-c.results:
	default:
	}
	c.hub.mu.Lock()
	c.batches++
	for _, in := range ins {
		c.hub.localAcked[in.ID] = true
		if res == nil {
			c.hub.recorded[in.ID] = true
		}
	}
	c.hub.mu.Unlock()
	if o.Committed != nil {
		o.Committed(len(ins), res)
		return len(ins), nil, nil
	}
	committed := make(chan error, 1)
	committed <- res
	close(committed)
	return len(ins), committed, nil
}

// The service acks every row at once.
func (c *commitBus) OnAcked(sessionID, messageID string, f func()) (func(), error) {
	f()
	return func() {}, nil
}

// TestPullerAcksTheHubAfterTheRecordsCommit: the hub is acked a row only once its records are
// committed on the leaf (and its service acked it): after a failed commit the row is not acked
// there, and is pulled and queued again. Mutant tried: the loop not waiting for committed
// (the row acked to the hub after the failed commit: red, both ways of pulling).
func TestPullerAcksTheHubAfterTheRecordsCommit(t *testing.T) {
	for _, c := range []struct {
		name  string
		batch int
	}{{"batched", 0}, {"one row at a time", 1}} {
		t.Run(c.name, func(t *testing.T) {
			hub := &fakeHub{localAcked: map[string]bool{}, recorded: map[string]bool{}}
			row := &inbox.Row{ID: uuid.Must(uuid.NewV7()).String(), Body: "one", To: "svc:bot"}
			hub.rows, hub.ids = []*inbox.Row{row}, []string{row.ID}
			b := &commitBus{hub: hub, results: make(chan error, 1)}
			b.results <- &bus.Error{Code: ledger.InsufficientStorage}
			log := slog.New(slog.DiscardHandler)
			p := &Puller{Bus: b, Hub: hub, Peer: "hub", Service: "bot", MaxBody: 65536, Log: log, MinBackoff: time.Millisecond, MaxBackoff: 4 * time.Millisecond, Batch: c.batch}
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan struct{})
			go func() { p.Run(ctx); close(done) }()
			for i := 0; ; i++ {
				hub.mu.Lock()
				n := len(hub.acks)
				hub.mu.Unlock()
				if n > 0 {
					break
				}
				if i == 10000 {
					t.Fatal("the row was never acked to the hub")
				}
				time.Sleep(time.Millisecond)
			}
			cancel()
			<-done
			if len(hub.unrecorded) != 0 || len(hub.acks) != 1 || b.batches != 2 {
				t.Errorf("hub acks %v, of rows not recorded %v, batches queued %d; want the row acked once, after its second, committed batch",
					hub.acks, hub.unrecorded, b.batches)
			}
		})
	}
}

// TestLackOf: an earlier hub's refusals, as its versions answer them, read as what it lacks;
// anything else is a refusal of the pull itself.
func TestLackOf(t *testing.T) {
	for _, c := range []struct {
		err  error
		want hubLack
	}{
		{&bus.Error{Code: ledger.NotFound, Detail: "peer hub: no route POST /fed/v2/inbox"}, lacksBatchRoute},
		{&bus.Error{Code: ledger.BadRequest, Detail: `pull request: json: unknown field "stream"`}, lacksStreams},
		{&bus.Error{Code: ledger.BadRequest, Detail: `pull request: json: unknown field "follow"`}, lacksFollow},
		{&bus.Error{Code: ledger.NotFound, Detail: "no such message"}, lacksNothing},
		{&bus.Error{Code: ledger.BadRequest, Detail: "max must be at least 1"}, lacksNothing},
		{&bus.Error{Code: ledger.ServiceUnavailable, Detail: "no route to host"}, lacksNothing},
	} {
		if got := lackOf(c.err); got != c.want {
			t.Errorf("lackOf(%v) = %d, want %d", c.err, got, c.want)
		}
	}
}
