package httpapi

import (
	"context"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/xmsg/xmsg/internal/bus"
	"github.com/xmsg/xmsg/internal/gate"
	"github.com/xmsg/xmsg/internal/limits"
	"github.com/xmsg/xmsg/internal/ratelog"
)

// Limits are http.sock's fairness bounds (docs/design.md §3). Zero values take the defaults
// in DefaultLimits.
type Limits struct {
	MaxConns         int           // connections at once; the next is closed unread
	MaxPerPID        int           // connections of one peer pid
	MaxWaitersPerPID int           // reply long-polls of one peer pid waiting at once
	HeaderTimeout    time.Duration // request headers, from the first byte of the request
	BodyTimeout      time.Duration // request body, from the end of the headers
	IdleTimeout      time.Duration // keep-alive connection between requests
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

// Listener caps the connections of l (a gate.Listener, whose connections carry the peer pid):
// at most lim.MaxConns at once and lim.MaxPerPID per peer pid. A connection over either is
// closed before a byte is read, like lineserver's, and the refusal logged at most once a second
// with the count of the others. A connection without gate credentials counts as pid 0.
func Listener(l net.Listener, lim Limits, socket string, log *slog.Logger) net.Listener {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &limitListener{Listener: l, lim: lim.withDefaults(), socket: socket, log: log, perPID: map[int]int{}}
}

type limitListener struct {
	net.Listener
	lim    Limits
	socket string
	log    *slog.Logger
	rl     ratelog.Limiter

	mu     sync.Mutex
	n      int
	perPID map[int]int
}

func (l *limitListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		pid := 0
		if cred, ok := gate.CredOf(c); ok {
			pid = cred.PID
		}
		l.mu.Lock()
		reason, limit := "", 0
		switch {
		case l.n >= l.lim.MaxConns:
			reason, limit = "too many connections", l.lim.MaxConns
		case l.perPID[pid] >= l.lim.MaxPerPID:
			reason, limit = "too many connections from one process", l.lim.MaxPerPID
		default:
			l.n++
			l.perPID[pid]++
		}
		l.mu.Unlock()
		if reason != "" {
			l.rl.Log(l.log, slog.LevelWarn, reason, "refused", "socket", l.socket, "actor", "pid:"+strconv.Itoa(pid), "request", "connect", "reason", reason, "limit", limit)
			c.Close()
			continue
		}
		return &limitConn{Conn: c, l: l, pid: pid}, nil
	}
}

func (l *limitListener) release(pid int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.n--
	if l.perPID[pid]--; l.perPID[pid] <= 0 {
		delete(l.perPID, pid)
	}
}

// limitConn gives its place back once, on the first Close.
type limitConn struct {
	net.Conn
	l    *limitListener
	pid  int
	once sync.Once
}

func (c *limitConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() { c.l.release(c.pid) })
	return err
}

type pidKey struct{}

// peerPID is the connection's peer pid as the gate reported it; 0 when unknown.
func peerPID(ctx context.Context) int {
	pid, _ := ctx.Value(pidKey{}).(int)
	return pid
}

// connContext records the peer pid of c (a limitConn over a gate.Conn, or a gate.Conn) in the
// request context, for the per-pid waiter count.
func connContext(ctx context.Context, c net.Conn) context.Context {
	if lc, ok := c.(*limitConn); ok {
		return context.WithValue(ctx, pidKey{}, lc.pid)
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
	return &bus.Error{Code: "service_unavailable", Detail: "too many waiting reply polls from this process"}
}
