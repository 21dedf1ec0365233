package leaf

import (
	"context"
	"sync"
	"time"
)

// inFlight is what a pull loop holds between its hub and its service: the rows handed to the
// service and not yet acked to the hub, how many of them the service still works on, and
// the acks and rejects ready for the hub. The pull loop, the bus's callbacks of the service's
// acks and of the records' commits, the sweep and the aside timer share it.
type inFlight struct {
	mu          sync.Mutex
	held        map[string]rowState // in the service's queue, or acked there, until the hub took the ack
	work        int                 // of held, those the service has not acked yet
	ack, reject []string            // ready for the hub, not taken by a request
	restream    bool                // a row must come again: the next pull starts a new stream
	changed     chan struct{}       // the pull loop's: room or acks may have come
	// The aside timer runs aside (when set) once acks have waited its delay for a request to
	// take them. It is armed when the first ack comes and stopped when a pull takes them, so
	// under load, where the next pull comes first, it costs no wake-up.
	aside      func()
	asideDelay time.Duration
	timer      *time.Timer
	timers     sync.WaitGroup // aside calls running or armed
	closed     bool
	// urgentAt, when not 0, is how many ready acks go aside at once, without the delay: on a
	// followed pull the hub hands out no more than a window of rows not settled, and the acks
	// are what makes room in it; half of it at a time keeps the service fed with a request
	// per half, not one per row.
	urgentAt int
	// interrupt, when set, ends the followed pull in progress: a row let go must come again
	// on a new stream, which a followed pull would not start before its answer ends.
	interrupt func()
	// awaiting is the held rows whose service's ack is awaited by a call of the bus's (await):
	// each one's cancel (nil until the bus returned it). No goroutine waits for them.
	awaiting map[string]awaited
}

// awaited is a row whose service's ack the bus tells (Bus.OnAcked).
type awaited struct {
	session string
	cancel  func() // nil until OnAcked returned
}

// rowState is what is known of a held row: a row is ready to be acked to the hub once both
// the service acked it and its records are stored.
type rowState uint8

const (
	serviceAcked rowState = 1 << iota
	recordStored
	readyForHub = serviceAcked | recordStored
)

func newInFlight() *inFlight {
	return &inFlight{held: map[string]rowState{}, awaiting: map[string]awaited{}, changed: make(chan struct{}, 1)}
}

// armAside arms the aside timer if acks wait and none is armed. Call with f.mu held.
func (f *inFlight) armAside() {
	if f.aside == nil || f.closed || len(f.ack)+len(f.reject) == 0 {
		return
	}
	delay := f.asideDelay
	if f.urgentAt > 0 && len(f.ack)+len(f.reject) >= f.urgentAt {
		delay = 0
		if f.timer != nil && f.timer.Stop() {
			f.timers.Done()
			f.timer = nil
		}
	}
	if f.timer != nil {
		return
	}
	f.timers.Add(1)
	var t *time.Timer
	t = time.AfterFunc(delay, func() {
		defer f.timers.Done()
		f.mu.Lock()
		if f.timer == t {
			f.timer = nil
		}
		f.mu.Unlock()
		f.aside()
	})
	f.timer = t
}

// stopAside stops an armed timer (its acks were taken). Call with f.mu held.
func (f *inFlight) stopAside() {
	if f.timer != nil && f.timer.Stop() {
		f.timers.Done()
	}
	f.timer = nil
}

// close stops the aside timer for good and waits for a call of it in progress.
func (f *inFlight) close() {
	f.mu.Lock()
	f.closed = true
	f.stopAside()
	f.mu.Unlock()
	f.timers.Wait()
}

func signal(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

// poke wakes the pull loop.
func (f *inFlight) poke() { signal(f.changed) }

// room is how many rows the next pull may ask for: what is left of batch beside the rows the
// service works on, once that is at most a quarter of batch (0 before: a leaf whose service
// is behind would otherwise pull a row or two per ack, a request and a commit each, where a
// pull when a quarter is left keeps the service fed as well: a pull's round trip is shorter
// than a dozen rows' work). In lockstep, none until the service has acked them all: without
// streams the hub would hand those rows out again, and when the last pull emptied the
// mailbox, pulling again at once would fetch each row of a trickle alone (a request and a
// commit per row), where rows that come while the service works wait for the next pull
// together.
func (f *inFlight) room(batch int, lockstep bool) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	if (lockstep && f.work > 0) || f.work > batch/4 {
		return 0
	}
	return batch - f.work
}

func (f *inFlight) working() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.work
}

// holds reports whether id is in the service's hands already (handed again on a new stream).
func (f *inFlight) holds(id string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	_, ok := f.held[id]
	return ok
}

// hold records ids as queued for the service.
func (f *inFlight) hold(ids []string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, id := range ids {
		f.held[id] = 0
	}
	f.work += len(ids)
}

// unhold forgets ids held a moment ago that the service's queue did not take after all:
// they are neither acked nor settled, and come again on a new stream.
func (f *inFlight) unhold(ids []string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, id := range ids {
		delete(f.held, id)
	}
	f.work -= len(ids)
}

// ackWatch is the bus's side of await (bus.Bus.OnAcked).
type ackWatch interface {
	OnAcked(sessionID, messageID string, f func()) (cancel func(), err error)
}

// waitAcked waits until the service acked id (or it left the queue otherwise), or ctx ends:
// for a loop that waits itself (in lockstep). It asks again each minute, as the purge of
// expired rows signals nothing.
func waitAcked(ctx context.Context, b ackWatch, session, id string) error {
	for {
		acked := make(chan struct{})
		cancel, err := b.OnAcked(session, id, func() { close(acked) })
		if err != nil {
			return err
		}
		t := time.NewTimer(time.Minute)
		select {
		case <-acked:
			t.Stop()
			return nil
		case <-t.C:
			cancel()
		case <-ctx.Done():
			t.Stop()
			cancel()
			return ctx.Err()
		}
	}
}

// await has the bus tell f when the service acked id (served), without a goroutine of its
// own: the bus calls back on the ack's goroutine. Waiting for it failed (an error of the
// bus's) lets it go, as served with that error.
func (f *inFlight) await(b ackWatch, session, id string) {
	f.mu.Lock()
	f.awaiting[id] = awaited{session: session}
	f.mu.Unlock()
	cancel, err := b.OnAcked(session, id, func() { f.ackedAwaited(id, nil) })
	if err != nil {
		f.ackedAwaited(id, err)
		return
	}
	f.mu.Lock()
	a, ok := f.awaiting[id]
	if ok {
		a.cancel = cancel
		f.awaiting[id] = a
	}
	f.mu.Unlock()
	if !ok {
		cancel() // served meanwhile (the sweep, or the loop's end): nothing to wait for
	}
}

// ackedAwaited is served for an awaited row, once: the bus's callback (under the bus's
// locks: it takes f.mu only), the sweep, or the loop's end.
func (f *inFlight) ackedAwaited(id string, err error) {
	f.mu.Lock()
	if _, ok := f.awaiting[id]; !ok {
		f.mu.Unlock()
		return
	}
	delete(f.awaiting, id)
	f.mu.Unlock()
	f.served(id, err, false)
}

// sweepAwaited looks again at the awaited rows: the purge of expired rows drops them from
// the queue without the ack's signal, and those are served as if acked (waitAcked too asks
// again each minute). Cancels and the bus are called outside f.mu: the bus calls back into f
// under its own locks.
func (f *inFlight) sweepAwaited(b ackWatch) {
	f.mu.Lock()
	rows := make(map[string]awaited, len(f.awaiting))
	for id, a := range f.awaiting {
		rows[id] = a
	}
	f.mu.Unlock()
	for id, a := range rows {
		// Asked again: called at once for a row that is gone (served), else a second
		// registration, dropped at once (the first stands).
		cancel, err := b.OnAcked(a.session, id, func() { f.ackedAwaited(id, nil) })
		if err != nil {
			f.ackedAwaited(id, err)
		} else {
			cancel()
		}
		f.mu.Lock()
		_, still := f.awaiting[id]
		f.mu.Unlock()
		if !still && a.cancel != nil {
			a.cancel()
		}
	}
}

// endAwaiting cancels every await, each row served with err (the loop's end: its context's).
func (f *inFlight) endAwaiting(err error) {
	f.mu.Lock()
	rows := f.awaiting
	f.awaiting = map[string]awaited{}
	f.mu.Unlock()
	for id, a := range rows {
		if a.cancel != nil {
			a.cancel()
		}
		f.served(id, err, false)
	}
}

// watchAwaiting sweeps the awaited rows every interval until ctx ends, then ends them all.
func (f *inFlight) watchAwaiting(ctx context.Context, b ackWatch, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-t.C:
			f.sweepAwaited(b)
		case <-ctx.Done():
			f.endAwaiting(ctx.Err())
			return
		}
	}
}

// served records the service's ack of id (err nil) or that waiting for it failed. The pull
// loop itself, waiting in lockstep, takes the acks next (inline): no timer for them, and no
// signal to itself.
func (f *inFlight) served(id string, err error, inline bool) {
	f.known([]string{id}, serviceAcked, err, inline)
}

// stored records that the records of ids were committed (err nil) or that their commit
// failed (the bus took those rows out of the queue again).
func (f *inFlight) stored(ids []string, err error, inline bool) {
	f.known(ids, recordStored, err, inline)
}

// known records what is now known of ids; on err they are let go, and come again on a new
// stream.
func (f *inFlight) known(ids []string, what rowState, err error, inline bool) {
	f.mu.Lock()
	if what == serviceAcked {
		f.work -= len(ids)
	}
	for _, id := range ids {
		if err != nil {
			f.letGo(id)
		} else {
			f.learn(id, what, inline)
		}
	}
	f.mu.Unlock()
	if !inline {
		signal(f.changed)
	}
}

// learn adds what is known of a held row; one known for both is ready for the hub. Call with
// f.mu held.
func (f *inFlight) learn(id string, known rowState, inline bool) {
	st, ok := f.held[id]
	if !ok {
		return // let go already
	}
	if st |= known; st != readyForHub {
		f.held[id] = st
		return
	}
	f.held[id] = st
	f.ack = append(f.ack, id)
	if !inline {
		f.armAside()
	}
}

// letGo forgets a held row, which must come again from the hub. Call with f.mu held.
func (f *inFlight) letGo(id string) {
	delete(f.held, id)
	f.restream = true
	if f.interrupt != nil {
		f.interrupt()
	}
}

// rejected makes id ready to be rejected on the hub.
func (f *inFlight) rejected(id string) {
	f.mu.Lock()
	f.reject = append(f.reject, id)
	f.armAside()
	f.mu.Unlock()
}

// restart makes the next pull start a new stream.
func (f *inFlight) restart() {
	f.mu.Lock()
	f.restream = true
	if f.interrupt != nil {
		f.interrupt()
	}
	f.mu.Unlock()
}

// mustRestream reports whether the next pull must start a new stream, leaving that for it
// to take (restarted).
func (f *inFlight) mustRestream() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.restream
}

// following sets what ends the followed pull in progress when a row must come again (nil:
// none in progress), and how many ready acks go aside at once (0: they wait the delay).
func (f *inFlight) following(interrupt func(), urgentAt int) {
	f.mu.Lock()
	f.interrupt, f.urgentAt = interrupt, urgentAt
	f.mu.Unlock()
}

// restarted reports (once) whether the next pull must start a new stream.
func (f *inFlight) restarted() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	r := f.restream
	f.restream = false
	return r
}

// take hands the ready acks and rejects to one request; it gives them back if it fails
// (giveBack) or settles them (settled).
func (f *inFlight) take() (ack, reject []string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	ack, reject = f.ack, f.reject
	f.ack, f.reject = nil, nil
	f.stopAside()
	return ack, reject
}

// giveBack returns acks a request failed to deliver: they ride the next pull, which backs
// off as the hub's failures say (no aside timer for them: it would retry without backoff).
func (f *inFlight) giveBack(ack, reject []string) {
	if len(ack)+len(reject) == 0 {
		return
	}
	f.mu.Lock()
	f.ack = append(ack, f.ack...)
	f.reject = append(reject, f.reject...)
	f.mu.Unlock()
	signal(f.changed)
}

// settled lets go of the rows the hub took the acks of (rejected rows were never held).
func (f *inFlight) settled(ack []string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, id := range ack {
		delete(f.held, id)
	}
}
