package leaf

import (
	"errors"
	"testing"
	"time"
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
