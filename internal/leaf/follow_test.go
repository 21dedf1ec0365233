package leaf

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/xmsg/xmsg/internal/bus"
	inbox "github.com/xmsg/xmsg/internal/hub"
)

// TestFollowAcksUrgent: on a followed pull, acks ready for the hub go aside at once when
// enough of them are ready (they make room in the hub's window), not after the linger; fewer
// wait for it. Mutant tried: armAside ignoring urgentAt: the aside never comes, red.
func TestFollowAcksUrgent(t *testing.T) {
	f := newInFlight()
	asides := make(chan []string, 4)
	f.aside, f.asideDelay = func() {
		ack, _ := f.take()
		asides <- ack
	}, time.Hour
	defer f.close()
	f.following(func() {}, 3)
	ids := []string{"a", "b", "c", "d"}
	f.hold(ids)
	for _, id := range ids[:2] {
		f.served(id, nil, false)
		f.stored([]string{id}, nil, false)
	}
	select {
	case ack := <-asides:
		t.Fatalf("two acks ready (fewer than 3) went aside at once: %v", ack)
	default:
	}
	f.served("c", nil, false)
	f.stored([]string{"c"}, nil, false)
	select {
	case ack := <-asides:
		if len(ack) != 3 {
			t.Fatalf("aside took %v, want the three ready", ack)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("three acks ready did not go aside at once")
	}
}

// TestFollowInterruptedToRestream: a row let go (its commit failed, or the service's ack
// could not be waited for) must come again on a new stream, which a followed pull would not
// start before its answer ends: it is interrupted; once it is over, nothing is.
func TestFollowInterruptedToRestream(t *testing.T) {
	f := newInFlight()
	defer f.close()
	interrupted := 0
	f.following(func() { interrupted++ }, 3)
	f.hold([]string{"a", "b"})
	f.stored([]string{"a"}, errors.New("commit failed"), false)
	if interrupted != 1 || !f.mustRestream() {
		t.Fatalf("a row let go: interrupted %d times, restream %v; want 1, true", interrupted, f.mustRestream())
	}
	f.following(nil, 0)
	f.stored([]string{"b"}, errors.New("commit failed"), false)
	if interrupted != 1 {
		t.Fatalf("interrupted %d times after the follow ended, want 1", interrupted)
	}
}

// followHub is a fakeHub that follows: each Follow hands out, on its stream, the rows not
// handed yet while fewer than max are out and not acked, as the hub's Mailboxes.Follow does,
// until nothing came for wait or another stream took over.
type followHub struct {
	*fakeHub
	follows int
}

func (h *followHub) Follow(ctx context.Context, peer, stream string, ack, reject []string, max, maxBytes int, wait time.Duration, each func([]inbox.Row, bool) error) error {
	h.mu.Lock()
	h.follows++
	h.settle(ack, reject)
	if stream != h.stream {
		h.stream, h.handed = stream, map[string]bool{}
	}
	h.mu.Unlock()
	first, quiet := true, time.Now().Add(wait)
	for {
		h.mu.Lock()
		if h.stream != stream {
			h.mu.Unlock()
			return nil
		}
		var out []inbox.Row
		for _, r := range h.rows {
			if len(out)+len(h.handed) < max && !h.handed[r.ID] {
				out = append(out, *r)
			}
		}
		for _, r := range out {
			h.handed[r.ID] = true
		}
		h.mu.Unlock()
		if len(out) > 0 || first {
			if err := each(out, first); err != nil {
				return err
			}
			first, quiet = false, time.Now().Add(wait)
			continue
		}
		if time.Now().After(quiet) {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Millisecond):
		}
	}
}

// TestFollowRowsThatDidNotFitComeAgain: on a followed pull, rows the service's queue could
// not take are neither held nor acked; the leaf starts a new stream once the service has
// taken some, the hub hands them out again, and each row reaches the service once, in order,
// every one acked to the hub after the service's ack. Mutant tried: re-following at once
// (no wait for the service): the follows run into the thousands, red.
func TestFollowRowsThatDidNotFitComeAgain(t *testing.T) {
	log := slog.New(slog.DiscardHandler)
	b := leafBus(t, bus.Bounds{QueueShare: 2})
	hub := &followHub{fakeHub: &fakeHub{localAcked: map[string]bool{}}}
	var want []string
	for i := range 4 {
		r := &inbox.Row{ID: uuid.Must(uuid.NewV7()).String(), Body: fmt.Sprint("m", i), To: "svc:bot"}
		hub.rows = append(hub.rows, r)
		want = append(want, r.ID)
	}
	p := &Puller{Bus: b, Hub: hub, Peer: "hub", Service: "bot", MaxBody: 65536, Log: log, MinBackoff: time.Millisecond, MaxBackoff: 4 * time.Millisecond,
		Batch: 4, Wait: 200 * time.Millisecond, AckLinger: 5 * time.Millisecond}
	ctx := run(t, p)
	reg := &bus.Registration{Harness: "svc", SessionID: "svc:bot", Name: "bot"}
	var got []string
	for range want {
		m, err := b.Poll(ctx, reg, 10*time.Second)
		if err != nil || m == nil {
			t.Fatalf("poll after %v = %+v %v", got, m, err)
		}
		got = append(got, m.ID)
		// The service takes its time: a leaf that re-followed at once would spin meanwhile.
		time.Sleep(50 * time.Millisecond)
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
	for deadline := time.Now().Add(10 * time.Second); hub.acked() < len(want); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("hub has %d acks, want %d", hub.acked(), len(want))
		}
	}
	hub.mu.Lock()
	follows, early := hub.follows, len(hub.early)
	hub.mu.Unlock()
	if early != 0 {
		t.Fatalf("%d hub acks before the service's", early)
	}
	if follows > 100 {
		t.Fatalf("%d follows for 4 rows: the leaf re-followed without waiting for the service", follows)
	}
}
