package ledger

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
)

// ErrWatchersFull is the refusal of a watch beyond the tier's bound.
var ErrWatchersFull = errors.New("ledger: too many monitors attached")

// Watchers is the sink that feeds monitors. Each watch has a ring of its own; a watch that
// does not read fast enough loses its oldest unread events (counted, and told with the next
// read), so a stopped monitor costs its ring and nothing else: the stream never waits on it.
// Safe for concurrent use.
type Watchers struct {
	max  int
	size int
	n    atomic.Int32 // watches attached; 0 makes Event a load and a return
	// dropped counts the events any watch lost to a full ring, since start (for /metrics).
	dropped atomic.Uint64
	mu      sync.Mutex
	all     map[*Watch]struct{}
}

// NewWatchers bounds the watches to max at a time, each holding at most size unread events.
func NewWatchers(max, size int) *Watchers {
	if max < 1 {
		max = 1
	}
	if size < 1 {
		size = 1
	}
	return &Watchers{max: max, size: size, all: map[*Watch]struct{}{}}
}

// Len is the number of watches attached.
func (w *Watchers) Len() int { return int(w.n.Load()) }

// Dropped is the number of events watches lost to a full ring since start.
func (w *Watchers) Dropped() uint64 { return w.dropped.Load() }

// Max is the bound on watches.
func (w *Watchers) Max() int { return w.max }

// MaxTextBytes bounds the texts one watch that asked for them may hold unread: past it the
// oldest unread items go, as past the ring's size, so a watch costs bounded memory whatever
// the messages' sizes.
const MaxTextBytes = 16 << 20

// Watch attaches a watch taking the events keep accepts (nil: all); with text, each item also
// holds the text of its message or reply where the stream was handed one. It fails with
// ErrWatchersFull when max watches are attached.
func (w *Watchers) Watch(keep func(*Event) bool, text bool) (*Watch, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.all) >= w.max {
		return nil, ErrWatchersFull
	}
	x := &Watch{w: w, keep: keep, text: text, ring: make([]Item, w.size), ready: make(chan struct{}, 1)}
	w.all[x] = struct{}{}
	w.n.Store(int32(len(w.all)))
	return x, nil
}

// Event hands e to every watch that keeps it.
func (w *Watchers) Event(e *Event) { w.EventText(e, "") }

// EventText hands e to every watch that keeps it, with text to those that asked for it.
func (w *Watchers) EventText(e *Event, text string) {
	if w.n.Load() == 0 {
		return
	}
	w.mu.Lock()
	for x := range w.all {
		if x.keep == nil || x.keep(e) {
			if !x.text {
				x.push(e, "")
			} else {
				x.push(e, text)
			}
		}
	}
	w.mu.Unlock()
}

// Item is one unread event of a watch, with its text for a watch that asked for text (""
// where the stream was handed none: a daemon's own event, a refusal).
type Item struct {
	Event
	Text string `json:"text,omitempty"`
}

// Watch is one monitor's view of the stream.
type Watch struct {
	w     *Watchers
	keep  func(*Event) bool
	mu    sync.Mutex
	text  bool // the watch asked for texts
	ring  []Item
	head  int // oldest unread
	len   int
	bytes int    // texts held unread (MaxTextBytes)
	lost  uint64 // events dropped since the last read
	ready chan struct{}
	done  atomic.Bool
}

func (x *Watch) push(e *Event, text string) {
	x.mu.Lock()
	c := Item{Event: *e, Text: text}
	c.Err = nil // a cause may name paths; a monitor sees the code and detail only
	if len(text) > MaxTextBytes {
		c.Text = "" // never held whole: the event alone
	}
	for x.len > 0 && (x.len == len(x.ring) || x.bytes+len(c.Text) > MaxTextBytes) {
		// Full: the oldest unread item goes, so the newest is always seen.
		x.bytes -= len(x.ring[x.head].Text)
		x.ring[x.head] = Item{}
		x.head = (x.head + 1) % len(x.ring)
		x.len--
		x.lost++
		x.w.dropped.Add(1)
	}
	x.ring[(x.head+x.len)%len(x.ring)] = c
	x.bytes += len(c.Text)
	x.len++
	x.mu.Unlock()
	select {
	case x.ready <- struct{}{}:
	default:
	}
}

// Next waits until events are unread (or ctx ends) and takes them, appended to buf, with the
// number of events lost since the last call.
func (x *Watch) Next(ctx context.Context, buf []Item) ([]Item, uint64, error) {
	for {
		x.mu.Lock()
		if x.len > 0 || x.lost > 0 {
			for ; x.len > 0; x.len-- {
				buf = append(buf, x.ring[x.head])
				x.ring[x.head] = Item{}
				x.head = (x.head + 1) % len(x.ring)
			}
			x.bytes = 0
			lost := x.lost
			x.lost = 0
			x.mu.Unlock()
			return buf, lost, nil
		}
		x.mu.Unlock()
		select {
		case <-ctx.Done():
			return buf, 0, ctx.Err()
		case <-x.ready:
		}
	}
}

// Close detaches the watch; its place is free again.
func (x *Watch) Close() {
	if x.done.Swap(true) {
		return
	}
	x.w.mu.Lock()
	delete(x.w.all, x)
	x.w.n.Store(int32(len(x.w.all)))
	x.w.mu.Unlock()
}
