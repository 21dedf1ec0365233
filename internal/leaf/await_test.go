package leaf

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"
)

// watch is a bus's OnAcked: rows are acked by ack (which calls back), or drop out of the queue
// without a signal (gone, as the purge of expired rows does).
type watch struct {
	mu   sync.Mutex
	regs map[string][]*func()
	gone map[string]bool
}

func newWatch() *watch { return &watch{regs: map[string][]*func(){}, gone: map[string]bool{}} }

func (w *watch) OnAcked(session, id string, f func()) (func(), error) {
	w.mu.Lock()
	if w.gone[id] {
		w.mu.Unlock()
		f()
		return func() {}, nil
	}
	fp := &f
	w.regs[id] = append(w.regs[id], fp)
	w.mu.Unlock()
	return func() {
		w.mu.Lock()
		defer w.mu.Unlock()
		for i, g := range w.regs[id] {
			if g == fp {
				w.regs[id] = append(w.regs[id][:i], w.regs[id][i+1:]...)
				break
			}
		}
		if len(w.regs[id]) == 0 {
			delete(w.regs, id)
		}
	}, nil
}

func (w *watch) ack(id string) {
	w.mu.Lock()
	fs := w.regs[id]
	delete(w.regs, id)
	w.gone[id] = true
	w.mu.Unlock()
	for _, f := range fs {
		(*f)()
	}
}

func (w *watch) drop(id string) {
	w.mu.Lock()
	w.gone[id] = true
	w.mu.Unlock()
}

func (w *watch) registered(id string) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.regs[id])
}

// TestAwaitedRows: a held row's service ack is learned from the bus's callback (no goroutine
// waits for it); one the purge drops without a signal is served by the sweep, and its
// registration let go; at the loop's end every awaited row is let go (it comes again on a new
// stream) and nothing stays registered. Mutants tried: the sweep doing nothing (red: the
// dropped row never served); the end not cancelling (red: registrations left).
func TestAwaitedRows(t *testing.T) {
	f := newInFlight()
	defer f.close()
	w := newWatch()
	f.hold([]string{"a", "b", "c"})
	for _, id := range []string{"a", "b", "c"} {
		f.await(w, "svc:bot", id)
	}
	state := func(id string) (rowState, bool) {
		f.mu.Lock()
		defer f.mu.Unlock()
		st, ok := f.held[id]
		return st, ok
	}
	if st, _ := state("a"); st&serviceAcked != 0 || f.working() != 3 {
		t.Fatalf("a served before its ack: %v, working %d", st, f.working())
	}
	w.ack("a")
	if st, _ := state("a"); st&serviceAcked == 0 || f.working() != 2 {
		t.Fatalf("a not served on its ack: %v, working %d", st, f.working())
	}
	w.drop("b")
	f.sweepAwaited(w)
	if st, _ := state("b"); st&serviceAcked == 0 || w.registered("b") != 0 {
		t.Fatalf("b, dropped without a signal, after the sweep: %v, %d registered; want served, none", st, w.registered("b"))
	}
	if st, _ := state("c"); st&serviceAcked != 0 || w.registered("c") != 1 {
		t.Fatalf("c, still queued, after the sweep: %v, %d registered; want waiting, once", st, w.registered("c"))
	}
	f.endAwaiting(context.Canceled)
	if _, held := state("c"); held || !f.mustRestream() || w.registered("c") != 0 {
		t.Fatalf("c after the loop's end: held %v, restream %v, %d registered; want let go, none", held, f.mustRestream(), w.registered("c"))
	}
	if f.working() != 0 {
		t.Fatalf("working %d after all rows were served or let go", f.working())
	}
}

// TestWaitAcked: the lockstep loop's own wait ends on the ack, and on ctx with its error,
// leaving nothing registered.
func TestWaitAcked(t *testing.T) {
	w := newWatch()
	done := make(chan error, 1)
	go func() { done <- waitAcked(context.Background(), w, "svc:bot", "a") }()
	for w.registered("a") == 0 {
		time.Sleep(time.Millisecond)
		select {
		case err := <-done:
			t.Fatalf("waitAcked returned %v before the ack", err)
		default:
		}
	}
	w.ack("a")
	if err := <-done; err != nil {
		t.Fatalf("waitAcked after the ack = %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := waitAcked(ctx, w, "svc:bot", "b"); !errors.Is(err, context.Canceled) || w.registered("b") != 0 {
		t.Fatalf("waitAcked with its ctx ended = %v, %d registered; want context.Canceled, none", err, w.registered("b"))
	}
}
