package leaf

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/xmsg/xmsg/internal/bus"
	inbox "github.com/xmsg/xmsg/internal/hub"
)

// longPollHub is a hub whose batched pull, when it has nothing to hand out, waits the whole
// wait asked for, as a real hub's 30 s long-poll does (the test asks an hour).
type longPollHub struct {
	*fakeHub
	forever bool // a pull that gets no rows waits until its context ends, whatever its wait
}

func (h longPollHub) Pull(ctx context.Context, peer, stream string, ack, reject []string, max, maxBytes int, wait time.Duration) ([]inbox.Row, error) {
	h.mu.Lock()
	h.polls++
	h.settle(ack, reject)
	if stream != h.stream {
		h.stream, h.handed = stream, map[string]bool{}
	}
	var out []inbox.Row
	for _, r := range h.rows {
		if len(out) < max && !h.handed[r.ID] {
			out = append(out, *r)
			h.handed[r.ID] = true
		}
	}
	h.mu.Unlock()
	if len(out) > 0 {
		return out, nil
	}
	var after <-chan time.Time
	if !h.forever {
		after = time.After(wait)
	}
	select {
	case <-after:
		return nil, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// TestPullerStatusFollowsTheHubsAck: once the service has acked a batch, the hub gets the
// acks and doctor's pull line says so within AckWait (the pull that carries them waits no
// longer), not only when a long-poll ends (up to 30 s later). Mutant tried: acks sent with
// the long-poll's wait (an earlier loop): the line stays at the service's ack, red.
func TestPullerStatusFollowsTheHubsAck(t *testing.T) {
	log := slog.New(slog.DiscardHandler)
	b := leafBus(t, bus.Bounds{})
	principal, _ := json.Marshal(map[string]string{"kind": "service", "name": "alice"})
	hub := longPollHub{fakeHub: &fakeHub{localAcked: map[string]bool{}}}
	for _, text := range []string{"one", "two"} {
		hub.rows = append(hub.rows, &inbox.Row{ID: uuid.Must(uuid.NewV7()).String(), Body: text, To: "svc:bot", Principal: principal})
	}
	p := &Puller{Bus: b, Hub: hub, Peer: "hub", Service: "bot", MaxBody: 65536, Log: log, Wait: time.Hour}
	ctx := run(t, p)
	reg := &bus.Registration{Harness: "svc", SessionID: "svc:bot", Name: "bot"}
	for range 2 {
		m, err := b.Poll(ctx, reg, 10*time.Second)
		if err != nil || m == nil {
			t.Fatalf("local poll = %+v %v", m, err)
		}
		hub.mu.Lock()
		hub.localAcked[m.ID] = true
		hub.mu.Unlock()
		if err := b.Ack(context.Background(), reg, m.ID); err != nil {
			t.Fatal(err)
		}
	}
	// Bounded: the pull carrying the acks waits at most AckWait; a long-poll here lasts an hour.
	deadline := time.Now().Add(10 * time.Second)
	for st := p.Status(); !strings.Contains(st, "2 delivered") || !strings.Contains(st, "acked 2"); st = p.Status() {
		if time.Now().After(deadline) {
			hub.mu.Lock()
			acks := len(hub.acks)
			hub.mu.Unlock()
			t.Fatalf("doctor's pull line after the service's acks (hub holds %d acks): %q; want the hub's ack of both", acks, p.Status())
		}
		time.Sleep(time.Millisecond)
	}
}

// TestPullerPullsWhileTheServiceWorks: with a hub that knows streams, a leaf that is behind
// (its last pull filled all the room it asked for) pulls the next rows while its service has
// not acked the last, so the service's next poll finds them at once; the hub still gets no
// ack before the service's. Mutant tried: room() in lockstep always (none while the service
// works): the fifth row is never pulled, red.
func TestPullerPullsWhileTheServiceWorks(t *testing.T) {
	log := slog.New(slog.DiscardHandler)
	b := leafBus(t, bus.Bounds{})
	hub := &fakeHub{localAcked: map[string]bool{}}
	row := func(i int) *inbox.Row {
		return &inbox.Row{ID: uuid.Must(uuid.NewV7()).String(), Body: fmt.Sprint("m", i), To: "svc:bot"}
	}
	var rows []*inbox.Row
	for i := range 4 {
		rows = append(rows, row(i))
	}
	hub.rows = append(hub.rows, rows...)
	// Batch 4: the first pull fills it; the next may go once one row is left with the service.
	p := &Puller{Bus: b, Hub: hub, Peer: "hub", Service: "bot", MaxBody: 65536, Log: log, MinBackoff: time.Millisecond, MaxBackoff: 4 * time.Millisecond, Batch: 4}
	ctx := run(t, p)
	reg := &bus.Registration{Harness: "svc", SessionID: "svc:bot", Name: "bot"}
	ack := func(m *bus.Queued) {
		t.Helper()
		hub.mu.Lock()
		hub.localAcked[m.ID] = true
		hub.mu.Unlock()
		if err := b.Ack(context.Background(), reg, m.ID); err != nil {
			t.Fatal(err)
		}
	}
	var last *bus.Queued
	for i := range 4 {
		m, err := b.Poll(ctx, reg, 10*time.Second)
		if err != nil || m == nil || m.ID != rows[i].ID {
			t.Fatalf("poll %d = %+v %v", i, m, err)
		}
		if i < 3 {
			ack(m)
		}
		last = m
	}
	fifth := row(4)
	hub.mu.Lock()
	hub.rows = append(hub.rows, fifth)
	hub.mu.Unlock()
	deadline := time.Now().Add(10 * time.Second)
	for {
		hub.mu.Lock()
		handed := hub.handed[fifth.ID]
		hub.mu.Unlock()
		if handed {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the fifth row was not pulled while the service worked on the fourth")
		}
		time.Sleep(time.Millisecond)
	}
	hub.mu.Lock()
	early := append([]string(nil), hub.early...)
	hub.mu.Unlock()
	if len(early) != 0 {
		t.Fatalf("hub acks before the service's: %v", early)
	}
	ack(last)
	if m, err := b.Poll(ctx, reg, 10*time.Second); err != nil || m == nil || m.ID != fifth.ID {
		t.Fatalf("fifth poll = %+v %v", m, err)
	} else {
		ack(m)
	}
	for !strings.Contains(p.Status(), "5 delivered") {
		if time.Now().After(deadline) {
			t.Fatalf("status %q; want all delivered", p.Status())
		}
		time.Sleep(time.Millisecond)
	}
}

// TestPullerAcksAside: a leaf that pulled ahead (its pull waiting on the hub, which answers
// only with rows) still gets the service's last acks to the hub, on their own after
// AckLinger. Mutant tried: ackAside sending nothing: the fourth ack never reaches the hub, red.
func TestPullerAcksAside(t *testing.T) {
	log := slog.New(slog.DiscardHandler)
	b := leafBus(t, bus.Bounds{})
	hub := longPollHub{&fakeHub{localAcked: map[string]bool{}}, true}
	for i := range 4 {
		hub.rows = append(hub.rows, &inbox.Row{ID: uuid.Must(uuid.NewV7()).String(), Body: fmt.Sprint("m", i), To: "svc:bot"})
	}
	// Batch 4: the first pull fills it (the leaf is behind); the next goes with one row left.
	p := &Puller{Bus: b, Hub: hub, Peer: "hub", Service: "bot", MaxBody: 65536, Log: log, Batch: 4, Wait: time.Hour, AckLinger: time.Millisecond}
	ctx := run(t, p)
	reg := &bus.Registration{Harness: "svc", SessionID: "svc:bot", Name: "bot"}
	deadline := time.Now().Add(10 * time.Second)
	for i := range 4 {
		m, err := b.Poll(ctx, reg, 10*time.Second)
		if err != nil || m == nil {
			t.Fatalf("poll %d = %+v %v", i, m, err)
		}
		if i == 3 {
			// The pull ahead is on the hub, with the first three acks, waiting for rows.
			for hub.acked() < 3 {
				if time.Now().After(deadline) {
					t.Fatalf("the hub has %d acks, want the first three", hub.acked())
				}
				time.Sleep(time.Millisecond)
			}
		}
		hub.mu.Lock()
		hub.localAcked[m.ID] = true
		hub.mu.Unlock()
		if err := b.Ack(context.Background(), reg, m.ID); err != nil {
			t.Fatal(err)
		}
	}
	for hub.acked() < 4 {
		if time.Now().After(deadline) {
			t.Fatalf("the hub has %d acks, want 4 (the last on its own)", hub.acked())
		}
		time.Sleep(time.Millisecond)
	}
	hub.mu.Lock()
	own, early := hub.ownAcks, len(hub.early)
	hub.mu.Unlock()
	if own == 0 || early != 0 {
		t.Fatalf("acks on their own %d (want some), before the service's %d (want none)", own, early)
	}
}

// TestPullerRowsThatDidNotFitComeAgain: rows of a batch the service's queue could not take
// (its share for the hub is full) are neither held nor acked: the leaf starts a new stream, the
// hub hands them out again once the service made room, and each row reaches the service once.
// Mutant tried: no new stream after a batch that did not fit: rows three and four are never
// handed out again, red.
func TestPullerRowsThatDidNotFitComeAgain(t *testing.T) {
	log := slog.New(slog.DiscardHandler)
	b := leafBus(t, bus.Bounds{QueueShare: 2})
	hub := &fakeHub{localAcked: map[string]bool{}}
	var want []string
	for i := range 4 {
		r := &inbox.Row{ID: uuid.Must(uuid.NewV7()).String(), Body: fmt.Sprint("m", i), To: "svc:bot"}
		hub.rows = append(hub.rows, r)
		want = append(want, r.ID)
	}
	p := &Puller{Bus: b, Hub: hub, Peer: "hub", Service: "bot", MaxBody: 65536, Log: log, MinBackoff: time.Millisecond, MaxBackoff: 4 * time.Millisecond, Batch: 4}
	ctx := run(t, p)
	reg := &bus.Registration{Harness: "svc", SessionID: "svc:bot", Name: "bot"}
	var got []string
	for range want {
		m, err := b.Poll(ctx, reg, 10*time.Second)
		if err != nil || m == nil {
			t.Fatalf("poll after %v = %+v %v", got, m, err)
		}
		got = append(got, m.ID)
		hub.mu.Lock()
		hub.localAcked[m.ID] = true
		hub.mu.Unlock()
		if err := b.Ack(context.Background(), reg, m.ID); err != nil {
			t.Fatal(err)
		}
	}
	if strings.Join(got, ",") != strings.Join(want, ",") {
		t.Fatalf("service got %v, want each row once, in order: %v", got, want)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		hub.mu.Lock()
		acks, early := len(hub.acks), len(hub.early)
		hub.mu.Unlock()
		if early != 0 {
			t.Fatalf("%d hub acks before the service's", early)
		}
		if acks == len(want) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("hub has %d acks, want %d", acks, len(want))
		}
		time.Sleep(time.Millisecond)
	}
}
