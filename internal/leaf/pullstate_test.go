package leaf

import (
	"context"
	"encoding/json"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/xmsg/xmsg/internal/bus"
	"github.com/xmsg/xmsg/internal/claude"
	inbox "github.com/xmsg/xmsg/internal/hub"
	"github.com/xmsg/xmsg/internal/peercred"
	"github.com/xmsg/xmsg/internal/store"
)

// longPollHub is a hub whose batched pull, when it has nothing to hand out, waits the whole
// wait asked for, as a real hub's 30 s long-poll does (the test asks an hour).
type longPollHub struct{ *fakeHub }

func (h longPollHub) Pull(ctx context.Context, peer string, ack, reject []string, max, maxBytes int, wait time.Duration) ([]inbox.Row, error) {
	h.mu.Lock()
	h.polls++
	for _, id := range ack {
		h.ack(id)
	}
	var out []inbox.Row
	for _, r := range h.rows {
		if len(out) < max {
			out = append(out, *r)
		}
	}
	h.mu.Unlock()
	if len(out) > 0 {
		return out, nil
	}
	select {
	case <-time.After(wait):
		return nil, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// TestPullerStatusFollowsTheHubsAck: once the service has acked a batch, doctor's pull line
// says the hub acked it once the hub has answered the acks, which a pull carrying acks asks
// within AckWait, not only when the next long-poll ends (up to 30 s later, still "waiting
// for their acks"). Mutant tried: acks sent with the long-poll's wait: the line stays at the
// service's ack, red.
func TestPullerStatusFollowsTheHubsAck(t *testing.T) {
	st, err := store.Open(filepath.Join(t.TempDir(), "x.db"), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	id, _ := ParsePrincipal("svc:bot")
	log := slog.New(slog.DiscardHandler)
	b := bus.New(bus.Config{Host: "leaf", MaxBody: 65536, ReplyTTL: time.Hour, IdemTTL: time.Hour, Store: st, Proc: peercred.Proc{}, Log: log,
		Leaf: id.Bus(), Claude: &claude.Scanner{Log: log}})
	defer b.Close()
	principal, _ := json.Marshal(map[string]string{"kind": "service", "name": "alice"})
	hub := longPollHub{&fakeHub{localAcked: map[string]bool{}}}
	for _, text := range []string{"one", "two"} {
		hub.rows = append(hub.rows, &inbox.Row{ID: uuid.Must(uuid.NewV7()).String(), Body: text, To: "svc:bot", Principal: principal})
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	p := &Puller{Bus: b, Hub: hub, Peer: "hub", Service: "bot", MaxBody: 65536, Log: log, Wait: time.Hour}
	go func() { p.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
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
	// Bounded: the hub answers acks within AckWait; a long-poll here lasts an hour.
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(p.Status(), "acked 2, poll ok, mailbox empty") {
		if time.Now().After(deadline) {
			hub.mu.Lock()
			acks := len(hub.acks)
			hub.mu.Unlock()
			t.Fatalf("doctor's pull line after the service's acks (hub holds %d acks): %q; want the hub's ack of both", acks, p.Status())
		}
		time.Sleep(time.Millisecond)
	}
	if !strings.Contains(p.Status(), "2 delivered") {
		t.Errorf("status %q; want 2 delivered", p.Status())
	}
}
