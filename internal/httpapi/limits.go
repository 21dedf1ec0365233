package httpapi

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"sort"
	"strconv"
	"sync"
	"time"

	"github.com/xmsg/xmsg/internal/bus"
	"github.com/xmsg/xmsg/internal/gate"
	"github.com/xmsg/xmsg/internal/inq"
	"github.com/xmsg/xmsg/internal/ledger"
	"github.com/xmsg/xmsg/internal/limits"
	"github.com/xmsg/xmsg/internal/ratelog"
)

// Limits are http.sock's fairness bounds (docs/design.md §3). Zero values take the defaults
// in DefaultLimits.
type Limits struct {
	MaxConns         int           // connections at once; the next evicts the oldest idle one
	MaxPerPID        int           // requests in progress at once of one peer pid (of one connection on TCP)
	MaxWaitersPerPID int           // reply long-polls of one peer pid waiting at once
	HeaderTimeout    time.Duration // request headers, from the first byte of the request
	BodyTimeout      time.Duration // request body, from the end of the headers
	IdleTimeout      time.Duration // keep-alive connection between requests
	// PerConnection makes every connection its own holder, for a listener whose peers carry
	// no pid (TCP): the bounds above then apply per connection instead of lumping every
	// peer into one account (which let one peer's connections starve all the others).
	PerConnection bool
	// NoEvict refuses (503) the new connection over MaxConns instead of closing the oldest
	// idle one: the attack tests' controls only (--evict-idle=false).
	NoEvict bool
}

// DefaultLimits are the limits package's (the reasons are given there).
var DefaultLimits = Limits{MaxConns: limits.HTTPMaxConns, MaxPerPID: limits.HTTPMaxPerPID, MaxWaitersPerPID: limits.HTTPMaxWaitersPerPID,
	HeaderTimeout: limits.HTTPHeaderTimeout, BodyTimeout: limits.HTTPBodyTimeout, IdleTimeout: limits.HTTPIdleTimeout}

func (l Limits) withDefaults() Limits {
	d := DefaultLimits
	if l.MaxConns <= 0 {
		l.MaxConns = d.MaxConns
	}
	if l.MaxPerPID <= 0 {
		l.MaxPerPID = d.MaxPerPID
	}
	if l.MaxWaitersPerPID <= 0 {
		l.MaxWaitersPerPID = d.MaxWaitersPerPID
	}
	if l.HeaderTimeout <= 0 {
		l.HeaderTimeout = d.HeaderTimeout
	}
	if l.BodyTimeout <= 0 {
		l.BodyTimeout = d.BodyTimeout
	}
	if l.IdleTimeout <= 0 {
		l.IdleTimeout = d.IdleTimeout
	}
	return l
}

// Listener bounds the connections of l (a gate.Listener, whose connections carry the peer
// pid; or, with lim.PerConnection, a TCP listener): at most lim.MaxConns at once. Over that
// bound the newest connection is never the one refused while another waits idle (no byte of
// its next request read): the oldest idle connection of the holder (peer pid, or connection)
// holding the most is closed to make room, as any HTTP server closes an idle keep-alive. Only
// when none is idle is the new connection answered 503 naming the bound, then closed after a
// short drain (so the answer is not lost to a reset). A holder's requests in progress are
// bounded by lim.MaxPerPID (the Server answers the next one 503): busy connections cannot be
// evicted, so that is the bound that keeps one process (slow bodies, slow headers) from
// holding every slot. Refusals and evictions are logged at most once a second per reason
// with the count of the others. A connection without gate credentials on a listener that is
// not PerConnection counts as pid 0.
func Listener(l net.Listener, lim Limits, socket string, log *slog.Logger) net.Listener {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &limitListener{Listener: l, lim: lim.withDefaults(), socket: socket, log: log,
		conns: map[*limitConn]struct{}{}, held: map[int]int{}, busy: map[int]int{}, drains: make(chan struct{}, maxDrains)}
}

type limitListener struct {
	net.Listener
	lim    Limits
	socket string
	log    *slog.Logger
	rl     ratelog.Limiter
	drains chan struct{} // refused connections being drained (refuse)

	mu     sync.Mutex
	conns  map[*limitConn]struct{}
	held   map[int]int // connections by holder
	busy   map[int]int // connections in a request, by holder
	nextID int         // PerConnection holders are -1, -2, ...
}

func (l *limitListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		holder := 0
		if cred, ok := gate.CredOf(c); ok {
			holder = cred.PID
		}
		l.mu.Lock()
		if l.lim.PerConnection {
			l.nextID++
			holder = -l.nextID
		}
		var victim *limitConn
		if len(l.conns) >= l.lim.MaxConns {
			if victim = l.victimLocked(); victim == nil || l.lim.NoEvict {
				l.mu.Unlock()
				l.refuse(c, holder, "too many connections", l.lim.MaxConns)
				continue
			}
			l.releaseLocked(victim)
		}
		lc := &limitConn{Conn: c, l: l, holder: holder, idle: true, since: time.Now()}
		l.conns[lc] = struct{}{}
		l.held[holder]++
		l.mu.Unlock()
		if victim != nil {
			l.rl.Log(l.log, slog.LevelWarn, "evicted", "refused", "socket", l.socket, "actor", actorOf(victim.holder), "request", "connect", "reason", "idle connection closed to make room", "limit", l.lim.MaxConns)
			victim.Conn.Close()
		}
		return lc, nil
	}
}

// victimLocked is the idle connection to close for a new one: of the holder with the most
// connections, the one idle longest. One with bytes waiting in its socket is not idle: its
// request has arrived and is about to be read. Nil when none is idle.
func (l *limitListener) victimLocked() (victim *limitConn) {
	var cands []*limitConn
	var closing *limitConn
	for c := range l.conns {
		if c.closing && (closing == nil || c.since.Before(closing.since)) {
			closing = c
		}
		if c.idle {
			cands = append(cands, c)
		}
	}
	if closing != nil {
		// Already answered (refused) and only draining what its client still sends, so that
		// the answer is read: cutting that short costs nobody a request, whatever bytes wait.
		return closing
	}
	defer func() {
		if victim == nil {
			victim = l.doomedLocked(cands)
		}
	}()
	sort.Slice(cands, func(i, j int) bool {
		a, b := cands[i], cands[j]
		if l.held[a.holder] != l.held[b.holder] {
			return l.held[a.holder] > l.held[b.holder]
		}
		return a.since.Before(b.since)
	})
	for _, c := range cands {
		if !inq.Pending(c.Conn) {
			return c
		}
	}
	return nil
}

// refuse answers c 503 naming the bound and closes it: the write side first, then, after the
// client has had a moment to read the answer (and whatever it sent is drained), the rest.
func (l *limitListener) refuse(c net.Conn, holder int, reason string, limit int) {
	l.rl.Log(l.log, slog.LevelWarn, reason, "refused", "socket", l.socket, "actor", actorOf(holder), "request", "connect", "reason", reason, "limit", limit)
	why := ", none idle"
	if l.lim.NoEvict {
		why = ""
	}
	detail := fmt.Sprintf("%s on %s (limit %d)%s; retry later", reason, l.socket, limit, why)
	// A refused connection is outside the pool, so its drain is bounded here: a flood of them
	// must not hold a descriptor each for the drain's half second (a daemon at its descriptor
	// limit then fails the requests it did admit). Past maxDrains a refused connection gets a
	// short drain instead, enough to take in what its client already sent, so that the close
	// does not reset the answer away.
	drain := shortDrain
	select {
	case l.drains <- struct{}{}:
		drain = 500 * time.Millisecond
	default:
	}
	go func() {
		if drain != shortDrain {
			defer func() { <-l.drains }()
		}
		answerAndClose(c, http.StatusServiceUnavailable, ledger.ServiceUnavailable.String(), detail, drain)
	}()
}

// maxDrains bounds the refused connections a listener drains for long at once (refuse);
// shortDrain is the drain of the others.
const (
	maxDrains  = 16
	shortDrain = 25 * time.Millisecond
)

// answerAndClose writes a whole error answer to a connection whose request was not (or not
// wholly) read, half-closes it and drains what the client sends for up to drain, so that the
// close does not reset the answer away (net/http's closeWriteAndWait).
func answerAndClose(c net.Conn, status int, code, detail string, drain time.Duration) {
	defer c.Close()
	body, _ := json.Marshal(map[string]string{"error": code, "detail": detail})
	c.SetDeadline(time.Now().Add(drain))
	fmt.Fprintf(c, "HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nConnection: close\r\nContent-Length: %d\r\n\r\n%s",
		status, http.StatusText(status), len(body), body)
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		cw.CloseWrite()
	}
	io.Copy(io.Discard, io.LimitReader(c, 256<<10))
}

func actorOf(holder int) string {
	if holder < 0 {
		return "conn:" + strconv.Itoa(-holder)
	}
	return "pid:" + strconv.Itoa(holder)
}

// doomedLocked is, when no connection is idle, one whose request has arrived but whose holder
// already has MaxPerPID requests in progress: that request would be answered 503 at once, so
// closing it for a newcomer costs its holder nothing it could have had. Of the holder with
// the most connections, the oldest; nil when there is none.
func (l *limitListener) doomedLocked(idle []*limitConn) *limitConn {
	var best *limitConn
	for _, c := range idle {
		if l.busy[c.holder] < l.lim.MaxPerPID {
			continue
		}
		if best == nil || l.held[c.holder] > l.held[best.holder] || (l.held[c.holder] == l.held[best.holder] && c.since.Before(best.since)) {
			best = c
		}
	}
	return best
}

// releaseLocked gives c's place back, once.
func (l *limitListener) releaseLocked(c *limitConn) {
	if c.released {
		return
	}
	c.released = true
	delete(l.conns, c)
	if !c.idle {
		if l.busy[c.holder]--; l.busy[c.holder] <= 0 {
			delete(l.busy, c.holder)
		}
	}
	if l.held[c.holder]--; l.held[c.holder] <= 0 {
		delete(l.held, c.holder)
	}
}

// limitConn is one admitted connection. The Server tells it when it waits for a request
// (idle: it may be evicted) and when a request begins (busy: counted against MaxPerPID).
type limitConn struct {
	net.Conn
	l      *limitListener
	holder int

	// guarded by l.mu
	idle     bool
	since    time.Time // when it last became idle, or began closing
	closing  bool      // answered a refusal, draining before the close
	released bool
}

// refuseBusy answers a request over its holder's MaxPerPID requests in progress: 503 naming
// the bound, logged like the listener's refusals.
func (c *limitConn) refuseBusy() {
	l := c.l
	reason := "too many requests in progress from one " + c.holderKind()
	l.rl.Log(l.log, slog.LevelWarn, reason, "refused", "socket", l.socket, "actor", actorOf(c.holder), "request", "request", "reason", reason, "limit", l.lim.MaxPerPID)
	l.mu.Lock()
	c.closing, c.since = true, time.Now()
	l.mu.Unlock()
	answerAndClose(c, http.StatusServiceUnavailable, ledger.ServiceUnavailable.String(), fmt.Sprintf("%s (limit %d); retry later", reason, l.lim.MaxPerPID), 500*time.Millisecond)
}

// holderKind names what a holder is, for answers: a process, or (TCP) a connection.
func (c *limitConn) holderKind() string {
	if c.l.lim.PerConnection {
		return "connection"
	}
	return "process"
}

// CloseWrite half-closes the connection underneath (a gate.Conn's *net.UnixConn, a
// *net.TCPConn), so that an answer followed by a close is read before the peer sees the end
// instead of being reset away.
func (c *limitConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}

func (c *limitConn) Close() error {
	err := c.Conn.Close()
	c.l.mu.Lock()
	c.l.releaseLocked(c)
	c.l.mu.Unlock()
	return err
}

// wait marks c idle: waiting for the first byte of its next request.
func (c *limitConn) wait() {
	l := c.l
	l.mu.Lock()
	defer l.mu.Unlock()
	if c.released || c.idle {
		return
	}
	c.idle, c.since = true, time.Now()
	if l.busy[c.holder]--; l.busy[c.holder] <= 0 {
		delete(l.busy, c.holder)
	}
}

// begin marks c busy: a request has begun. False means it must be refused: it was evicted
// (closed) meanwhile, or its holder already has MaxPerPID requests in progress.
func (c *limitConn) begin() (ok bool, evicted bool) {
	l := c.l
	l.mu.Lock()
	defer l.mu.Unlock()
	if c.released {
		return false, true
	}
	if !c.idle {
		return true, false
	}
	if l.busy[c.holder] >= l.lim.MaxPerPID {
		return false, false
	}
	c.idle = false
	l.busy[c.holder]++
	return true, false
}

type pidKey struct{}

// peerPID is the connection's peer pid as the gate reported it; 0 when unknown.
func peerPID(ctx context.Context) int {
	pid, _ := ctx.Value(pidKey{}).(int)
	return pid
}

// connContext records the holder of c (a limitConn: its peer pid or, per connection, its own
// key; a gate.Conn: its peer pid) in the request context, for the per-holder waiter count.
func connContext(ctx context.Context, c net.Conn) context.Context {
	if lc, ok := c.(*limitConn); ok {
		return context.WithValue(ctx, pidKey{}, lc.holder)
	}
	if cred, ok := gate.CredOf(c); ok {
		return context.WithValue(ctx, pidKey{}, cred.PID)
	}
	return ctx
}

// waiters counts reply long-polls per peer pid, so that one process cannot take every place
// of the bus's global waiter bound.
type waiters struct {
	mu  sync.Mutex
	max int
	n   map[int]int
}

func (w *waiters) take(pid int) (release func(), ok bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.n == nil {
		w.n = map[int]int{}
	}
	if w.n[pid] >= w.max {
		return nil, false
	}
	w.n[pid]++
	return func() {
		w.mu.Lock()
		defer w.mu.Unlock()
		if w.n[pid]--; w.n[pid] <= 0 {
			delete(w.n, pid)
		}
	}, true
}

// bodyDeadline bounds the time to receive a request body, counted once from the end of the
// headers: a body trickled a byte at a time cannot hold the connection past it. Requests
// without a body get no read deadline, so that the server's background read (which notices
// a client hanging up during a long-poll) is not cut short.
func bodyDeadline(next http.Handler, d time.Duration) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Body != nil && r.Body != http.NoBody {
			http.NewResponseController(w).SetReadDeadline(time.Now().Add(d))
		}
		next.ServeHTTP(w, r)
	})
}

func tooManyWaiters() error {
	return &bus.Error{Code: ledger.ServiceUnavailable, Detail: "too many waiting reply polls from this process"}
}
