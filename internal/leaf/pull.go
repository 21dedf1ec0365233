package leaf

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"

	"github.com/xmsg/xmsg/internal/bus"
	"github.com/xmsg/xmsg/internal/envelope"
	"github.com/xmsg/xmsg/internal/harness/svc"
	"github.com/xmsg/xmsg/internal/hub"
	"github.com/xmsg/xmsg/internal/ledger"
	"github.com/xmsg/xmsg/internal/limits"
	"github.com/xmsg/xmsg/internal/principal"
	"github.com/xmsg/xmsg/internal/ratelog"
)

// Hub is what the pull loop needs from federation (fed.Node implements it).
type Hub interface {
	// Pull acks ids, rejects those of reject (rows the leaf can never deliver) and pulls the
	// next batch on stream (POST /fed/v2/inbox, this daemon's extension): rows handed out on
	// a stream are not handed out again on it until settled; "" names none.
	Pull(ctx context.Context, peer, stream string, ack, reject []string, max, maxBytes int, wait time.Duration) ([]hub.Row, error)
	// Follow is Pull that follows the stream (PullRequest.Follow): each batch that comes goes
	// to each (the first, with the acks taken, at once), no more than max rows not acked in
	// all, until none came for wait (nil) or each fails. A hub that does not follow refuses
	// it as a pull it cannot take; the acks are not taken then (first never came).
	Follow(ctx context.Context, peer, stream string, ack, reject []string, max, maxBytes int, wait time.Duration, each func(rows []hub.Row, first bool) error) error
	// AckPulled acks and rejects without pulling (the same route, max 0), while a pull waits.
	AckPulled(ctx context.Context, peer string, ack, reject []string) error
	// Inbox and AckInbox are the one-row routes of the protocol, for a hub without Pull.
	Inbox(ctx context.Context, peer string, wait time.Duration) (*hub.Row, error)
	AckInbox(ctx context.Context, peer, id string) error
}

// Backoff bounds of the retries (§7.5: 100 ms doubling to 5 s).
const (
	MinBackoff = 100 * time.Millisecond
	MaxBackoff = 5 * time.Second
	// PollWait is the inbox long-poll (§7.5: wait=30).
	PollWait = 30 * time.Second
	// AckWait bounds the wait of a pull that carries acks (the wire counts whole seconds).
	AckWait = time.Second
	// Batch and BatchBytes bound one pull: as many rows as the hub's share of the service's
	// queue (bus.DefaultQueueShare), and 1 MiB of stored rows past the first.
	Batch      = bus.DefaultQueueShare
	BatchBytes = 1 << 20
	// AckRide is how long the service's acks wait on a leaf for a commit made anyway (the
	// next batch's) before one is made for them (bus.Config.AckRide): a crash in that time
	// delivers those rows to the service again, from the leaf's queue.
	AckRide = time.Second
	// AckLinger is how long the service's acks wait for the next pull to carry them before
	// they are sent on their own (Hub.AckPulled): when each leaf gets a message every few
	// tens of milliseconds (a hub with many leaves) the next pull mostly comes within it, so
	// a message costs the hub one request; when the mail stops, the hub still learns of the
	// last acks (and marks those messages delivered) within it. On a followed pull no pull
	// carries them: they go on their own after it, or at once when half the window is ready.
	AckLinger = 200 * time.Millisecond
	// RecordRide is how long the records of pulled rows wait for a commit made anyway before
	// one is made for them (bus.Config.RecordRide): the service has the rows at once, and
	// the hub, which holds each row until it is acked there, is acked once they are stored.
	// The loop pulls its next rows without waiting for that commit (on its stream the hub
	// does not hand them out again), so the records of the rows a leaf gets within it share
	// one commit: a leaf that gets a message every few tens of milliseconds makes a commit
	// for several, not one each (with 50 leaves, 200 ms took a third off their CPU per
	// message against 50 ms, docs/performance.md §5). A busy leaf commits sooner: rows
	// riding hold places of the service's queue, and a batch short of places has the
	// commit made at once; on a followed pull, so does half the window riding. A reply to such a row, or a read of it, has the commit made at
	// once too. What the ride costs: the hub marks those messages delivered up to that much
	// later, and a crash within it delivers them again.
	RecordRide = 200 * time.Millisecond
)

// Bus is what a pull loop asks of the leaf's bus: recording pulled rows into its service's
// queue, and waiting for the service's ack. *bus.Bus is one.
type Bus interface {
	AcceptBatch(t bus.Target, ins []bus.Inbound, o bus.BatchOptions) (n int, committed <-chan error, err error)
	ackWatch
}

var _ Bus = (*bus.Bus)(nil)

// Puller pulls one hub's mailbox into the leaf service's queue.
type Puller struct {
	Bus     Bus
	Hub     Hub
	Peer    string // the hub's name in the peers file
	Service string // the leaf's one service, the recipient of every row
	// Events, when set, gets the event of each row queued for the service.
	Events  *ledger.Stream
	MaxBody int
	Log     *slog.Logger
	// Wait overrides PollWait (tests); MinBackoff/MaxBackoff, Batch, BatchBytes and AckLinger likewise
	// when non-zero. Batch 1 pulls one row at a time with the protocol's own routes.
	Wait                   time.Duration
	MinBackoff, MaxBackoff time.Duration
	Batch, BatchBytes      int
	AckLinger              time.Duration

	mu     sync.Mutex
	pulled int
	state  string
	quiet  ratelog.Limiter // retries at the longest backoff: a line a minute (retryWarn)
}

// retryWarn logs a failed round trip that will be retried after b's delay. While the delay
// still grows every retry is logged (a hub restarting shows its few lines); once it is at
// its longest (a hub down, or refusing us, for a while) one line a minute per message and
// code is, with the count of those left out since, so a leaf that cannot reach its hub for
// hours does not fill its log with a line every 5 s.
func (p *Puller) retryWarn(b *backoff, msg string, c ledger.Code, args ...any) {
	code := c.String()
	args = append(args, "peer", p.Peer, "code", code, "retry_in", b.cur.String())
	if b.cur >= b.max {
		p.quiet.Every = time.Minute
		ok, suppressed := p.quiet.Allow(msg + "\x00" + code)
		if !ok {
			return
		}
		args = append(args, "suppressed", suppressed)
	}
	p.Log.Warn(msg, args...)
}

func (p *Puller) set(format string, args ...any) {
	p.mu.Lock()
	p.state = fmt.Sprintf(format, args...) + " at " + time.Now().UTC().Format(time.RFC3339)
	p.mu.Unlock()
}

// Status is one line for doctor.
func (p *Puller) Status() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	s := p.state
	if s == "" {
		s = "starting"
	}
	return fmt.Sprintf("leaf: pulling from hub %s: %d delivered; %s", p.Peer, p.pulled, s)
}

func (p *Puller) delivered(n int) {
	p.mu.Lock()
	p.pulled += n
	p.mu.Unlock()
}

type backoff struct{ cur, min, max time.Duration }

func (b *backoff) reset() { b.cur = b.min }

// delay is the wait before the next retry: between half the current delay and all of it,
// drawn at random. A fleet of leaves that lost its hub at one instant (a hub restart) would
// otherwise come back at the same instants, every one of them, each time the delay doubles:
// bursts the hub's handshake pool cannot hold, and idle time between them.
func (b *backoff) delay() time.Duration {
	return b.cur/2 + rand.N(b.cur/2+1)
}

// wait sleeps delay (or until ctx ends) and doubles the current delay.
func (b *backoff) wait(ctx context.Context) bool {
	t := time.NewTimer(b.delay())
	defer t.Stop()
	b.cur = min(b.cur*2, b.max)
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// Run pulls until ctx ends. It follows its stream on the hub (follow: one request brings
// each batch as it comes) as long as the hub does; a hub that does not is pulled in batches.
// Each round trip of those acks what the service acked since the last one
// and pulls the next batch (POST /fed/v2/inbox) on the loop's stream, so the hub hands out
// only rows the leaf does not hold. While the leaf is behind (the last pull filled all the
// room it asked for), it pulls the next batch while the service still works on the last, up
// to Batch rows in the service's hands; once a pull emptied the mailbox, the next waits until
// the service acked what it has, so that a trickle's rows meanwhile come together (see
// inFlight.room). A row is acked to the hub only once the service acked it and its commit is
// done; acks no pull carries within AckLinger go on their own (ackAside). A hub that does
// not know streams is pulled only once the service acked all it was handed (it would hand
// those rows out again); one that does not know the batched route, one row at a time
// (runOne). Every failure of the hub (unreachable, restarting, rate limit) is retried with
// backoff, on a new stream (an answer may have been lost: its rows must come again); the
// acks not yet taken are sent again.
func (p *Puller) Run(ctx context.Context) {
	wait := limits.Or(p.Wait, PollWait)
	b := backoff{min: limits.Or(p.MinBackoff, MinBackoff), max: limits.Or(p.MaxBackoff, MaxBackoff)}
	b.reset()
	batch, batchBytes := limits.Or(p.Batch, Batch), limits.Or(p.BatchBytes, BatchBytes)
	if batch == 1 {
		p.runOne(ctx, wait, &b)
		return
	}
	f := newInFlight()
	var waiters sync.WaitGroup
	defer waiters.Wait()
	// The purge of expired rows drops a row without an ack's signal: the rows whose ack is
	// awaited are looked at again now and then, and all let go when the loop ends.
	waiters.Add(1)
	go func() {
		defer waiters.Done()
		f.watchAwaiting(ctx, p.Bus, time.Minute)
	}()
	var aside atomic.Bool
	aside.Store(true)
	f.aside, f.asideDelay = func() { p.ackAside(ctx, f, &aside) }, limits.Or(p.AckLinger, AckLinger)
	defer f.close()
	stream, streams, follow := uuid.NewString(), true, true
	// behind: the last pull filled all the room it asked for, so more rows are likely
	// waiting on the hub: the next pull goes while the service works (see inFlight.room).
	behind := false
	for ctx.Err() == nil {
		if follow && streams {
			if follow = p.follow(ctx, f, &stream, batch, batchBytes, wait, &b, &waiters); !follow {
				p.Log.Info("leaf: hub does not follow pulls; pulling a batch at a time", "peer", p.Peer)
			}
			continue
		}
		room := f.room(batch, !streams || !behind)
		if room <= 0 {
			select {
			case <-f.changed:
			case <-ctx.Done():
			}
			continue
		}
		if f.restarted() && streams {
			stream = uuid.NewString()
		}
		ack, reject := f.take()
		// A pull that carries acks waits at most AckWait: the hub records them at once, and
		// its answer, not the end of a 30 s long-poll, is what moves the state doctor shows.
		// Not 0: under a trickle the next row mostly comes within it, so acks still ride the
		// pull that fetches it. So does one made while the service works on rows when the
		// hub takes no acks on their own: those acks could only ride the next pull.
		w := wait
		if len(ack)+len(reject) > 0 || (!aside.Load() && f.working() > 0) {
			w = min(wait, AckWait)
		}
		rows, err := p.Hub.Pull(ctx, p.Peer, stream, ack, reject, room, batchBytes, w)
		if err != nil {
			f.giveBack(ack, reject)
			if ctx.Err() != nil {
				return
			}
			e := bus.AsError(err)
			lack := lackOf(err)
			if lack == lacksBatchRoute {
				// A hub without the batched route: the protocol's own, one row at a time.
				p.Log.Info("leaf: hub has no batched inbox; pulling one row at a time", "peer", p.Peer)
				f.close()
				// Its protocol has no reject: a row rejected is acked, so it cannot block.
				ack, reject = f.take()
				for _, id := range append(ack, reject...) {
					if err := p.ackHub(ctx, id, &b); err != nil {
						return
					}
				}
				p.delivered(len(ack))
				p.runOne(ctx, wait, &b)
				return
			}
			if streams && lack == lacksStreams {
				// A hub that does not know streams (unknown field): the same route, each
				// batch pulled once the service acked the last.
				p.Log.Info("leaf: hub has no pull streams; pulling each batch once the service acked the last", "peer", p.Peer)
				streams, stream = false, ""
				continue
			}
			p.set("pull failed: %s", e.Code.String())
			p.retryWarn(&b, "leaf pull failed", e.Code, "acks_pending", len(ack)+len(reject))
			if streams {
				stream = uuid.NewString()
			}
			b.wait(ctx)
			continue
		}
		b.reset()
		behind = len(rows) >= room
		f.settled(ack)
		acked := ""
		if len(ack) > 0 {
			p.delivered(len(ack))
			acked = fmt.Sprintf("acked %d, ", len(ack))
		}
		if len(rows) == 0 {
			p.set("%spoll ok, mailbox empty", acked)
			continue
		}
		// Behind, the service's acks are waited for beside the next pull; in lockstep the
		// loop waits for them itself (one wake-up per ack, not a waiter's and the loop's).
		if err := p.takeBatch(ctx, f, rows, &waiters, !streams || !behind, !streams, false); err != nil {
			if ctx.Err() != nil {
				return
			}
			p.retryWarn(&b, "leaf delivery failed", bus.AsError(err).Code, "rows", len(rows), "err", err)
			b.wait(ctx)
		}
	}
}

// hubLack is what an earlier hub's refusal of a pull says it lacks. Such a hub answers as its
// version always will, a 404 for a route it does not have and a 400 naming a field it does
// not know, so its answer is read here, once, and the pull loop goes on as that hub can.
type hubLack int

const (
	lacksNothing    hubLack = iota // a refusal of this pull, not of the protocol
	lacksBatchRoute                // no POST /fed/v2/inbox: one row at a time (GET, ack)
	lacksStreams                   // no "stream": each batch once the service acked the last
	lacksFollow                    // no "follow": batched pulls
)

// lackOf reads err (a hub's answer to a pull) as what the hub lacks.
func lackOf(err error) hubLack {
	e := bus.AsError(err)
	switch {
	case e.Code == ledger.NotFound && strings.Contains(e.Detail, "no route"):
		return lacksBatchRoute
	case e.Code == ledger.BadRequest && strings.Contains(e.Detail, "follow"):
		return lacksFollow
	case e.Code == ledger.BadRequest && strings.Contains(e.Detail, "stream"):
		return lacksStreams
	}
	return lacksNothing
}

// errRestream ends a followed pull whose stream must start over (a row let go, or one that did
// not fit the service's queue, must come again).
var errRestream = errors.New("leaf: the stream starts over")

// follow is one followed pull (Hub.Follow): it carries the acks ready, and takes each batch
// as it comes (takeBatch, its acks waited for aside, and sent aside: at once when half of
// the window is ready, else after AckLinger), until the hub ends it (no mail for wait), the stream
// must start over, or it fails (then as a failed pull: backoff, a new stream). The window
// is batch rows not acked to the hub; once half of it rides a commit, that commit is
// made at once (not waited for: the next batch is read meanwhile), so that the acks, which
// make room, are not held back a ride.
// It reports false, having taken nothing, for a hub that does not follow (or has no batched
// route, or no streams), which the batch loop then pulls as it can.
func (p *Puller) follow(ctx context.Context, f *inFlight, stream *string, batch, batchBytes int, wait time.Duration, b *backoff, waiters *sync.WaitGroup) bool {
	if f.restarted() {
		*stream = uuid.NewString()
	}
	fctx, interrupt := context.WithCancel(ctx)
	defer interrupt()
	f.following(interrupt, max(batch/2, 1))
	defer f.following(nil, 0)
	ack, reject := f.take()
	taken, riding := false, 0
	err := p.Hub.Follow(fctx, p.Peer, *stream, ack, reject, batch, batchBytes, wait, func(rows []hub.Row, first bool) error {
		if first {
			taken = true
			b.reset()
			f.settled(ack)
			if len(ack) > 0 {
				p.delivered(len(ack))
				p.set("acked %d, following the mailbox", len(ack))
			}
		}
		if len(rows) == 0 {
			return nil
		}
		// The records ride until half of the window rides with them: then the commit is
		// made for them all (a ride's timer may have made one before: it comes sooner then).
		riding += len(rows)
		soon := riding >= max(batch/2, 1)
		if soon {
			riding = 0
		}
		if err := p.takeBatch(ctx, f, rows, waiters, false, false, soon); err != nil {
			return err
		}
		if f.mustRestream() {
			return errRestream
		}
		return nil
	})
	if !taken {
		f.giveBack(ack, reject)
	}
	switch {
	case ctx.Err() != nil:
		return true
	case err == nil:
		p.set("follow ended, mailbox quiet")
		return true
	case errors.Is(err, errRestream), fctx.Err() != nil:
		// The next follow starts a new stream (f.restarted). Rows that did not fit the
		// queue fit only once the service has taken some: until then a new stream would hand
		// them out again at once, and again.
		if f.working() > 0 {
			select {
			case <-f.changed:
			case <-ctx.Done():
			}
		}
		return true
	case errors.Is(err, hub.ErrRestream):
		f.restart() // the answer was left unread: its rows come on a new stream
		return true
	}
	e := bus.AsError(err)
	if !taken && lackOf(err) != lacksNothing {
		return false
	}
	p.set("pull failed: %s", e.Code.String())
	p.retryWarn(b, "leaf pull failed", e.Code, "acks_pending", len(ack)+len(reject))
	f.restart()
	b.wait(ctx)
	return true
}

// takeBatch puts the rows f does not hold yet into the service's queue (their records ride
// a commit, or with soon are committed at once, not waited for) and hands each one's ack to
// f once the service acked it and that commit is done.
// Inline (in lockstep) it waits for the service's acks itself before it returns, and for the
// commit only when it is done by then, or when store says so (a hub without streams would
// hand the rows out again before they are acked: their commit is made at once, no ride);
// otherwise the bus tells f of each (Bus.OnAcked, BatchOptions.Committed) on the goroutine
// that learns it, and nothing waits: a goroutine, a timer and a wake-up per row were more of
// a leaf's one P than the row's own work. A row that can never be delivered is logged and
// rejected on the hub, which then reads it not_found. Rows that did not fit the queue are
// neither held nor settled: f starts a new stream so that the hub hands them out again.
func (p *Puller) takeBatch(ctx context.Context, f *inFlight, rows []hub.Row, waiters *sync.WaitGroup, inline, store, soon bool) error {
	pulled := make([]bus.Inbound, 0, len(rows))
	for i := range rows {
		if f.holds(rows[i].ID) {
			continue // handed again on a new stream while the service has it
		}
		pr, err := p.check(&rows[i])
		if err != nil {
			p.Log.Warn("leaf dropped an undeliverable row", "peer", p.Peer, "message_id", rows[i].ID, "reason", err.Error())
			f.rejected(rows[i].ID)
			continue
		}
		pulled = append(pulled, pr)
	}
	if len(pulled) == 0 {
		return nil
	}
	session := p.service()
	all := make([]string, len(pulled))
	for i := range pulled {
		all[i] = pulled[i].ID
	}
	// Held before the bus has them: the service may ack them, and the bus tell their commit
	// (o.Committed), before AcceptBatch returns.
	f.hold(all)
	o := bus.BatchOptions{Newly: p.audited(session), Now: store, Soon: soon}
	if !inline {
		// The commit is learned when it is done, whatever the service has acked by then.
		o.Committed = func(n int, err error) { f.stored(all[:n], err, false) }
	}
	n, committed, err := p.Bus.AcceptBatch(session, pulled, o)
	if err != nil {
		f.unhold(all)
		f.restart()
		return err
	}
	if n < len(pulled) {
		f.unhold(all[n:])
		f.restart()
	}
	ids := all[:n]
	p.set("delivered %d rows to %s; %d wait for the service's ack", n, session.SessionID, f.working())
	// A row is acked to the hub once the service acked it and its records are stored here.
	if !inline {
		for _, id := range ids {
			f.await(p.Bus, session.SessionID, id)
		}
		return nil
	}
	for _, id := range ids {
		// Not acked to the hub on an error: the row comes again on a new stream.
		f.served(id, waitAcked(ctx, p.Bus, session.SessionID, id), true)
	}
	if store {
		f.stored(ids, <-committed, true)
		return nil
	}
	select {
	case err := <-committed:
		f.stored(ids, err, true)
	default:
		// It rides on: its acks wait for it, the next pull need not.
		waiters.Add(1)
		go func() {
			defer waiters.Done()
			f.stored(ids, <-committed, false)
		}()
	}
	return nil
}

// ackAside sends the acks no pull took within AckLinger on their own, while the pull waits
// (Hub.AckPulled). A hub that refuses them (one that takes acks only with a pull) turns on
// off: the acks ride the next pull, which then waits at most AckWait.
func (p *Puller) ackAside(ctx context.Context, f *inFlight, on *atomic.Bool) {
	if !on.Load() || ctx.Err() != nil {
		return
	}
	ack, reject := f.take()
	if len(ack)+len(reject) == 0 {
		return
	}
	if err := p.Hub.AckPulled(ctx, p.Peer, ack, reject); err != nil {
		if e := bus.AsError(err); e.Code == ledger.BadRequest {
			p.Log.Info("leaf: hub takes acks only with a pull", "peer", p.Peer)
			on.Store(false)
		}
		f.giveBack(ack, reject)
		return
	}
	f.settled(ack)
	p.delivered(len(ack))
	p.set("acked %d, waiting for mail", len(ack))
}

// runOne is the protocol's pull, one row at a time: long-poll the hub's inbox; put the row
// in the local queue; wait for the service's ack; then ack the hub, retrying until it holds.
func (p *Puller) runOne(ctx context.Context, wait time.Duration, b *backoff) {
	for ctx.Err() == nil {
		row, err := p.Hub.Inbox(ctx, p.Peer, wait)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			p.set("poll failed: %s", bus.AsError(err).Code.String())
			p.retryWarn(b, "leaf poll failed", bus.AsError(err).Code)
			b.wait(ctx)
			continue
		}
		b.reset()
		if row == nil {
			p.set("poll ok, mailbox empty")
			continue
		}
		if err := p.take(ctx, row, b); err != nil {
			if ctx.Err() != nil {
				return
			}
			p.retryWarn(b, "leaf delivery failed", bus.AsError(err).Code, "message_id", row.ID, "err", err)
			b.wait(ctx)
			continue
		}
		b.reset()
	}
}

// take handles one row: queue it, wait for the local ack, ack the hub. A row the leaf can
// never deliver (malformed, or for a target it does not serve) is logged and acked, so it
// does not block the mailbox forever.
func (p *Puller) take(ctx context.Context, row *hub.Row, b *backoff) error {
	pulled, err := p.check(row)
	if err != nil {
		p.Log.Warn("leaf dropped an undeliverable row", "peer", p.Peer, "message_id", row.ID, "reason", err.Error())
		return p.ackHub(ctx, row.ID, b)
	}
	session := p.service()
	// Committed at once: the loop waits for it before the next row (a hub of this protocol
	// hands the row out again until it is acked).
	_, committed, err := p.Bus.AcceptBatch(session, []bus.Inbound{pulled}, bus.BatchOptions{Newly: p.audited(session), Now: true})
	if err != nil {
		return err
	}
	p.set("delivered %s to %s, waiting for its ack", row.ID, session.SessionID)
	if err := waitAcked(ctx, p.Bus, session.SessionID, row.ID); err != nil {
		return err
	}
	if err := <-committed; err != nil {
		return err
	}
	b.reset()
	if err := p.ackHub(ctx, row.ID, b); err != nil {
		return err
	}
	p.delivered(1)
	p.set("acked %s", row.ID)
	return nil
}

// ackHub acks id on the hub until the hub holds it (200), or has no such row (404: acked
// before, e.g. by a previous run whose answer was lost).
func (p *Puller) ackHub(ctx context.Context, id string, b *backoff) error {
	for {
		err := p.Hub.AckInbox(ctx, p.Peer, id)
		if err == nil || bus.AsError(err).Code == ledger.NotFound {
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		p.set("ack of %s failed: %s", id, bus.AsError(err).Code.String())
		p.retryWarn(b, "leaf hub ack failed", bus.AsError(err).Code, "message_id", id)
		if !b.wait(ctx) {
			return ctx.Err()
		}
	}
}

var errUndeliverable = errors.New("undeliverable")

// check checks a row and turns it into the bus's Pulled: what the hub says about the
// sender is its claim about its own users, named under the hub's (authenticated) peer name,
// as an inbound envelope's principal is (§8.3 step 7).
func (p *Puller) check(row *hub.Row) (bus.Inbound, error) {
	if u, err := uuid.Parse(row.ID); err != nil || u.String() != row.ID {
		return bus.Inbound{}, fmt.Errorf("%w: id is not a canonical UUID", errUndeliverable)
	}
	if row.Body == "" || (p.MaxBody > 0 && len(row.Body) > p.MaxBody) {
		return bus.Inbound{}, fmt.Errorf("%w: empty or oversized body", errUndeliverable)
	}
	if row.ThreadID != "" {
		if u, err := uuid.Parse(row.ThreadID); err != nil || u.String() != row.ThreadID {
			return bus.Inbound{}, fmt.Errorf("%w: thread_id is not a canonical UUID", errUndeliverable)
		}
	}
	if to, ok := hub.ServiceName(row.To); row.To != "" && (!ok || !strings.EqualFold(to, p.Service)) {
		return bus.Inbound{}, fmt.Errorf("%w: target %q is not this leaf's service", errUndeliverable, row.To)
	}
	var wp principal.Principal
	if len(row.Principal) > 0 {
		var err error
		if wp, err = principal.Decode(row.Principal); err != nil {
			return bus.Inbound{}, fmt.Errorf("%w: principal: %v", errUndeliverable, err)
		}
	}
	if wp.Kind != principal.Session && wp.Kind != principal.Service {
		// Anonymous (or a hub that sent no principal): no return address, replies
		// poll-only; a name that is no valid sender is "anonymous".
		wp = principal.Principal{Kind: principal.Anonymous, From: wp.From}
		if _, err := envelope.Anonymous(wp.From); err != nil {
			wp.From = "anonymous"
		}
	}
	sender, err := wp.Sender(p.Peer)
	if err != nil {
		return bus.Inbound{}, fmt.Errorf("%w: %s principal: %v", errUndeliverable, wp.Kind, err)
	}
	return bus.InboundFrom(sender, bus.Inbound{ID: row.ID, Peer: p.Peer, Body: row.Body, PushReplies: row.PushReplies, ThreadID: row.ThreadID}), nil
}

// audited announces a row queued for session.
func (p *Puller) audited(session bus.Target) func(bus.Inbound) {
	if p.Events == nil {
		return nil
	}
	return func(in bus.Inbound) {
		p.Events.Request(ledger.Via{Transport: ledger.Leaf, Actor: "fed:" + in.Peer, Peer: in.Peer}, ledger.Pulled, "pull", session.SessionID,
			ledger.Result{MessageID: in.ID, Harness: session.Harness, Outcome: ledger.Queued, Bytes: len(in.Body), Text: in.Body}, nil)
	}
}

// service is the leaf's one service, the recipient of everything it pulls (offline or not:
// its queue is durable).
func (p *Puller) service() bus.Target {
	return bus.Target{Harness: svc.Name, SessionID: svc.SessionID(p.Service)}
}
