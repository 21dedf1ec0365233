package fed

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/xmsg/xmsg/internal/inq"
	"github.com/xmsg/xmsg/internal/ratelog"
)

// Connection limits of the federation listener (docs/protocol.md §2.6). The pool sizes come
// from the connection budget (capacity.go); these are the fixed parts.
const (
	maxPerPeer    = 8 // concurrent authenticated connections per peer
	handshakeTime = 3 * time.Second
	// staleHandshake: a pending connection whose handshake has waited this long for the
	// client's next bytes may make room although it spoke; a client answers in milliseconds,
	// so only one stalled on purpose is that slow. A handshake slow because the hub is busy
	// (a fleet coming back at once) is not waiting for its client and is never taken: its
	// work would be lost and done again.
	staleHandshake = time.Second
	// Handshakes per second per source address, a token bucket (hsBudget): the burst holds
	// every peer that may connect, at least hsBurst, so a fleet of leaves behind one NAT
	// reconnects at once after a hub restart, and it refills in hsRefill, at least hsRate a
	// second; a connection over the rate waits for its token (at most maxTokenWait) instead of
	// being refused.
	hsRate           = 128
	hsBurst          = 1024
	hsRefill         = 8 * time.Second
	maxTokenWait     = 2 * time.Second
	maxSourceBuckets = 4096 // per-source buckets kept; full ones are dropped first
	// maxBusy bounds the authenticated connections being answered 503 hub_busy at once.
	maxBusy = 64
)

// conn is an authenticated federation connection: the TLS handshake is done and the peer
// identified before the HTTP server ever sees it.
type conn struct {
	*tls.Conn
	raw    *rawConn
	l      *listener
	once   sync.Once
	source netip.Addr
	// Guarded by l.mu: the slot the connection holds, and since when it is idle (zero while
	// a request is served).
	peer      string // the name its slot is counted under
	shared    bool   // a slot of the shared pool, not the peer's own room
	counted   bool   // holds a slot (false once released or evicted)
	busy      bool   // over capacity: answered 503 hub_busy, then closed
	idleSince time.Time
}

// rawConn is the TCP connection under TLS; the handshake's verifier records its result here,
// where the listener finds it after the handshake.
type rawConn struct {
	net.Conn
	spoke atomic.Bool // a byte arrived: not an idle holder
	// waitFrom is since when we have waited for the client (unix ns; 0: not waiting): from the
	// first Read after our last Write, so that a client trickling a byte at a time is still
	// waited for since then. inRead: a Read is under way.
	waitFrom atomic.Int64
	inRead   atomic.Bool
	// During the handshake, the listener's CPU slots (nil after it, or none): a handshake
	// holds one while it computes, never while it waits for its client. Only the handshake's
	// goroutine reads held; closed and gone end a wait for a slot.
	cpu    chan struct{}
	held   bool
	closed chan struct{}
	once   sync.Once
	gone   <-chan struct{}
	st     *state // the snapshot the handshake used
	peer   *Peer
	chain  []*x509.Certificate
}

func (r *rawConn) Read(b []byte) (int, error) {
	if r.held { // waiting for the client: the slot is for a handshake that computes
		<-r.cpu
		r.held = false
	}
	if r.waitFrom.Load() == 0 {
		r.waitFrom.Store(time.Now().UnixNano())
	}
	r.inRead.Store(true)
	n, err := r.Conn.Read(b)
	r.inRead.Store(false)
	if n > 0 && !r.spoke.Load() {
		r.spoke.Store(true)
	}
	if r.cpu != nil && err == nil {
		select {
		case r.cpu <- struct{}{}:
			r.held = true
		case <-r.closed:
		case <-r.gone:
		}
	}
	return n, err
}

func (r *rawConn) Close() error {
	r.once.Do(func() {
		if r.closed != nil {
			close(r.closed)
		}
	})
	return r.Conn.Close()
}

// handshakeDone gives back the CPU slot the handshake holds; r takes none from now on.
func (r *rawConn) handshakeDone() {
	if r.held {
		<-r.cpu
		r.held = false
	}
	r.cpu = nil
}

func (r *rawConn) Write(b []byte) (int, error) {
	r.waitFrom.Store(0) // our turn: whatever we waited for came
	return r.Conn.Write(b)
}

func (c *conn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() { c.l.release(c) })
	return err
}

// pending is a connection before or during its handshake.
type pending struct {
	raw  *rawConn
	key  netip.Addr // sourceKey of its address
	at   time.Time
	gone chan struct{} // closed when evicted
	in   bool          // still counted (guarded by l.mu)
	// Its place in its source's queue (guarded by l.mu).
	prev, next *pending
}

// queue is one source's pending connections, oldest first. Linked through the connections,
// so that taking one out costs the same with one pending as with a thousand: a fleet behind
// one address holds the whole pool, and a slice copied on every handshake's end was most of
// what the listener allocated while it came back.
type queue struct {
	head, tail *pending
	n          int
}

func (q *queue) push(p *pending) {
	p.prev, p.next = q.tail, nil
	if q.tail != nil {
		q.tail.next = p
	} else {
		q.head = p
	}
	q.tail = p
	q.n++
}

func (q *queue) remove(p *pending) {
	if p.prev != nil {
		p.prev.next = p.next
	} else {
		q.head = p.next
	}
	if p.next != nil {
		p.next.prev = p.prev
	} else {
		q.tail = p.prev
	}
	p.prev, p.next = nil, nil
	q.n--
}

// size is how many q holds (a nil queue holds none).
func (q *queue) size() int {
	if q == nil {
		return 0
	}
	return q.n
}

// listener accepts TCP connections, keeps the pools of capacity.go, runs the TLS handshake
// (3 s budget) and hands out only authenticated connections.
type listener struct {
	inner net.Listener
	n     *Node
	cap   capacity
	out   chan net.Conn
	done  chan struct{}
	once  sync.Once
	wg    sync.WaitGroup
	rlog  ratelog.Limiter // refusals and evictions, one line per reason a second

	mu      sync.Mutex
	bySrc   map[netip.Addr]*queue
	npend   int
	perPeer map[string][]*conn // oldest first
	shared  int
	busy    int
	buckets map[netip.Addr]*hsBucket
	// evictedAt is when a source last lost a pending connection to a newcomer: a source
	// that redials the moment it is evicted (a flood) then weighs one more than one that came
	// once, so that among equals (256 sources holding one silent connection each, say) the
	// flood makes room, not the peer whose ClientHello is a moment late.
	evictedAt map[netip.Addr]time.Time
	// cpu holds a token for each handshake computing now (cpuSlots): a fleet's thousand
	// handshakes at once each finish in turn, instead of all sharing the CPU until every one
	// is late (the 3 s budget) and its work lost.
	cpu     chan struct{}
	refused atomic.Int64 // capacity refusals (doctor)
	evicted atomic.Int64
	// evictedQuiet: of the pending evicted, those that had not sent a byte.
	evictedQuiet atomic.Int64
}

func (n *Node) newListener(inner net.Listener) *listener {
	l := &listener{inner: inner, n: n, cap: n.cap, out: make(chan net.Conn), done: make(chan struct{}),
		bySrc: map[netip.Addr]*queue{}, perPeer: map[string][]*conn{}, buckets: map[netip.Addr]*hsBucket{},
		evictedAt: map[netip.Addr]time.Time{}, cpu: make(chan struct{}, cpuSlots())}
	n.lst.Store(l)
	l.wg.Add(1)
	go l.acceptLoop()
	return l
}

func (l *listener) Addr() net.Addr { return l.inner.Addr() }

func (l *listener) Accept() (net.Conn, error) {
	select {
	case c := <-l.out:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

func (l *listener) Close() error {
	var err error
	l.once.Do(func() {
		close(l.done)
		err = l.inner.Close()
	})
	return err
}

func sourceOf(c net.Conn) netip.Addr {
	if ap, err := netip.ParseAddrPort(c.RemoteAddr().String()); err == nil {
		return ap.Addr().Unmap().WithZone("")
	}
	return netip.Addr{}
}

func (l *listener) acceptLoop() {
	defer l.wg.Done()
	for {
		c, err := l.inner.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				l.Close()
				return
			}
			// Out of file descriptors and the like: wait and go on, as net/http does.
			select {
			case <-l.done:
				return
			case <-time.After(50 * time.Millisecond):
			}
			continue
		}
		src := sourceOf(c)
		if !l.n.st.Load().peers.SourceKnown(src) {
			// Every peer that may connect has a `from` list and this address is in none:
			// no handshake is spent on it.
			c.Close()
			l.log("source", src, "fed connection closed before TLS: source address in no peer's from list", nil)
			continue
		}
		p, wait, victim, reason := l.admit(c, src, time.Now())
		if victim != nil {
			victim.raw.Conn.Close()
			l.evicted.Add(1)
			if victim.quiet() {
				l.evictedQuiet.Add(1)
			}
			l.log("evict", src, "fed pending connection evicted for a newer one", nil, "evicted_source", victim.key.String())
		}
		if p == nil {
			c.Close()
			l.refused.Add(1)
			l.log("refuse:"+reason, src, "fed connection refused for capacity", errors.New(reason))
			continue
		}
		go l.handshake(p, wait)
	}
}

// admit finds a newcomer from src a place in the pending pool, making room by evicting
// (the returned victim, already uncounted), and reserves its handshake token (wait is how
// long until it may start). A nil pending means refused, for reason.
func (l *listener) admit(c net.Conn, src netip.Addr, now time.Time) (p *pending, wait time.Duration, victim *pending, reason string) {
	key := sourceKey(src)
	inbound := l.n.st.Load().peers.inbound
	rate, burst := hsBudget(inbound)
	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case l.bySrc[key].size() >= l.cap.srcShare(inbound):
		// Over its own share: it makes room only among its own source's connections.
		if victim = pick(l.bySrc[key], now); victim == nil {
			return nil, 0, nil, "pending connections of this source address at their bound"
		}
	case l.npend >= l.cap.pending:
		if victim = l.heaviest(now); victim == nil {
			return nil, 0, nil, "pending pool full of handshakes in progress"
		}
	}
	wait, ok := l.token(key, now, rate, burst)
	if !ok {
		return nil, 0, nil, "handshakes per second of this source address over the rate"
	}
	if victim != nil {
		if victim.quiet() {
			// It read nothing, so no handshake was spent on it: its token goes back. A fleet
			// reconnecting at once evicts its own connections that were a moment late to
			// speak, and those must not use up the budget the fleet needs to come back.
			l.refund(victim.key, burst)
		}
		l.drop(victim)
		l.markEvicted(victim.key, now)
	}
	gone := make(chan struct{})
	p = &pending{raw: &rawConn{Conn: c, cpu: l.cpu, closed: make(chan struct{}), gone: gone}, key: key, at: now, gone: gone, in: true}
	q := l.bySrc[key]
	if q == nil {
		q = &queue{}
		l.bySrc[key] = q
	}
	q.push(p)
	l.npend++
	return p, wait, victim, ""
}

// quiet reports what the handshake saw: not a byte read from p yet. A quiet connection may
// still have its ClientHello waiting unread (its goroutine not scheduled under load): heard
// asks the kernel before one is evicted.
func (p *pending) quiet() bool { return !p.raw.spoke.Load() }

// heard reports (and remembers) bytes from the client waiting in p's receive buffer.
func (p *pending) heard() bool {
	if inq.Pending(p.raw.Conn) {
		p.raw.spoke.Store(true)
		return true
	}
	return false
}

// stalled reports a handshake waiting in a Read for its client, which has owed it the rest of
// its flight for staleHandshake or longer (bytes trickled meanwhile do not count), with none
// of it unread in the kernel.
func (p *pending) stalled(now time.Time) bool {
	since := p.raw.waitFrom.Load()
	return p.raw.inRead.Load() && since != 0 && now.UnixNano()-since >= int64(staleHandshake) && !inq.Pending(p.raw.Conn)
}

// pick is the connection of q that makes room: the oldest that never sent a byte, else the
// oldest stalled handshake, else none.
func pick(q *queue, now time.Time) *pending {
	if q == nil {
		return nil
	}
	for p := q.head; p != nil; p = p.next {
		if p.quiet() && !p.heard() {
			return p
		}
	}
	for p := q.head; p != nil; p = p.next {
		if !p.quiet() && p.stalled(now) {
			return p
		}
	}
	return nil
}

// heaviest is the victim when the pending pool is full: the oldest connection that never sent
// a byte, of the source holding most that has one; else the oldest stalled handshake of the
// source holding most; else none. The kernel is asked only about the one chosen (a flood
// makes this the hot path); one that turns out to have spoken is skipped and the choice made
// again.
func (l *listener) heaviest(now time.Time) *pending {
	for {
		var best *pending
		bestN := 0
		for key, q := range l.bySrc {
			n := l.weight(key, q.n, now)
			if n < bestN {
				continue
			}
			for p := q.head; p != nil; p = p.next {
				if p.quiet() {
					if n > bestN || p.at.Before(best.at) {
						best, bestN = p, n
					}
					break
				}
			}
		}
		if best == nil {
			break
		}
		if !best.heard() {
			return best
		}
	}
	var best *pending
	bestN := 0
	for _, q := range l.bySrc {
		if q.n < bestN {
			continue
		}
		for p := q.head; p != nil; p = p.next {
			if !p.quiet() && p.stalled(now) {
				if q.n > bestN || p.at.Before(best.at) {
					best, bestN = p, q.n
				}
				break
			}
		}
	}
	return best
}

// weight is what a source holding n pending connections counts as when a victim is chosen:
// one more while it lost one to a newcomer within the handshake time (under l.mu).
func (l *listener) weight(key netip.Addr, n int, now time.Time) int {
	if at, ok := l.evictedAt[key]; ok {
		if now.Sub(at) < handshakeTime {
			return n + 1
		}
		delete(l.evictedAt, key)
	}
	return n
}

// markEvicted records that key lost a pending connection now (under l.mu). The record is kept
// for the handshake time; past maxSourceBuckets sources the old ones are swept first.
func (l *listener) markEvicted(key netip.Addr, now time.Time) {
	if len(l.evictedAt) >= maxSourceBuckets {
		for k, at := range l.evictedAt {
			if now.Sub(at) >= handshakeTime {
				delete(l.evictedAt, k)
			}
		}
		if len(l.evictedAt) >= maxSourceBuckets {
			return // a flood of that many sources: no weight, eviction still works
		}
	}
	l.evictedAt[key] = now
}

// drop uncounts p (under l.mu); its goroutine finds it gone.
func (l *listener) drop(p *pending) {
	if !p.in {
		return
	}
	p.in = false
	q := l.bySrc[p.key]
	q.remove(p)
	if q.n == 0 {
		delete(l.bySrc, p.key)
	}
	l.npend--
	if p.gone != nil {
		close(p.gone)
	}
}

// cpuSlots is how many handshakes may compute at once: two per CPU the runtime uses, so that
// the CPUs are kept busy while a handshake writes or is woken.
func cpuSlots() int { return 2 * runtime.GOMAXPROCS(0) }

// hsBucket is a per-source token bucket of handshakes.
type hsBucket struct {
	tokens float64
	last   time.Time
}

// hsBudget is the per-source handshake bucket of a hub whose peers file names inbound peers
// that may connect: a burst of all of them (at least hsBurst), refilled in hsRefill (at least
// hsRate a second). One address can thus make the hub do no more handshakes than its own
// configured fleet does when it comes back after a restart, which the hub must afford anyway
// (those peers may as well come from as many addresses, which no per-source bound limits).
func hsBudget(inbound int) (rate, burst float64) {
	return max(hsRate, float64(inbound)/hsRefill.Seconds()), max(hsBurst, float64(inbound))
}

// token takes one handshake token of key from a bucket of rate and burst, possibly in
// advance: wait is when it exists. False: it would not exist within maxTokenWait (nothing is
// taken).
func (l *listener) token(key netip.Addr, now time.Time, rate, burst float64) (time.Duration, bool) {
	b := l.buckets[key]
	if b == nil {
		if len(l.buckets) >= maxSourceBuckets {
			for k, o := range l.buckets {
				if o.tokens+now.Sub(o.last).Seconds()*rate >= burst {
					delete(l.buckets, k)
				}
			}
		}
		if len(l.buckets) >= maxSourceBuckets {
			// Sources past the map's bound share one bucket: fail closed, not open.
			key = netip.Addr{}
			b = l.buckets[key]
		}
		if b == nil {
			b = &hsBucket{tokens: burst, last: now}
			l.buckets[key] = b
		}
	}
	b.tokens = min(burst, b.tokens+now.Sub(b.last).Seconds()*rate)
	b.last = now
	if b.tokens >= 1 {
		b.tokens--
		return 0, true
	}
	wait := time.Duration((1 - b.tokens) / rate * float64(time.Second))
	if wait > maxTokenWait {
		return 0, false
	}
	b.tokens--
	return wait, true
}

// refund gives key's bucket back a token taken for a connection that never handshook.
func (l *listener) refund(key netip.Addr, burst float64) {
	if b := l.buckets[key]; b != nil {
		b.tokens = min(burst, b.tokens+1)
	}
}

func (l *listener) handshake(p *pending, wait time.Duration) {
	if wait > 0 {
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-p.gone:
		case <-l.done:
		}
		t.Stop()
	}
	raw := p.raw
	tc := tls.Server(raw, l.n.serverConfig())
	ctx, cancel := context.WithTimeout(context.Background(), handshakeTime)
	err := tc.HandshakeContext(ctx)
	cancel()
	raw.handshakeDone()
	l.mu.Lock()
	evicted := !p.in
	l.drop(p)
	var fc *conn
	var victim *conn
	if err == nil && raw.peer != nil && !evicted {
		fc = &conn{Conn: tc, raw: raw, l: l, source: sourceOf(raw.Conn), peer: raw.peer.Name, idleSince: time.Now()}
		var ok bool
		if ok, victim = l.admitAuth(fc, raw.st); !ok {
			if l.busy < maxBusy {
				fc.busy = true
				l.busy++
			} else {
				fc = nil
			}
		}
	}
	l.mu.Unlock()
	if victim != nil {
		victim.Close()
		l.evicted.Add(1)
		l.log("evict-auth", victim.source, "fed idle connection closed to make room", nil, "peer", victim.peer)
	}
	if fc == nil {
		if err != nil && raw.peer == nil && !evicted {
			l.log("handshake", sourceOf(raw.Conn), "fed handshake refused", err)
		} else if err == nil && !evicted {
			l.refused.Add(1)
			l.log("refuse:busy", sourceOf(raw.Conn), "fed connection refused for capacity", errors.New("no room and too many answered busy"), "peer", raw.peer.Name)
		}
		tc.Close()
		return
	}
	if fc.busy {
		l.refused.Add(1)
		l.log("refuse:busy", fc.source, "fed connection refused for capacity: answered hub_busy", errors.New("no room for the peer"), "peer", fc.peer)
	}
	select {
	case l.out <- fc:
	case <-l.done:
		fc.Close()
	}
}

// admitAuth gives an authenticated connection its slot (under l.mu): its peer's own room,
// else a shared slot, else the place of an idle connection (the peer's own oldest when it
// is at maxPerPeer; else the oldest idle shared one of the peer holding most). False: no
// room (the caller answers 503 hub_busy).
func (l *listener) admitAuth(fc *conn, st *state) (bool, *conn) {
	inbound := st.peers.inbound
	mine := l.perPeer[fc.peer]
	take := func(shared bool) {
		fc.shared, fc.counted = shared, true
		l.perPeer[fc.peer] = append(l.perPeer[fc.peer], fc)
		if shared {
			l.shared++
		}
	}
	if len(mine) < l.cap.room(inbound) {
		take(false)
		return true, nil
	}
	if len(mine) < maxPerPeer && l.shared < l.cap.shared(inbound) {
		take(true)
		return true, nil
	}
	var victim *conn
	if len(mine) >= maxPerPeer {
		victim = oldestIdle(mine, func(*conn) bool { return true })
	} else {
		most := 0
		for _, list := range l.perPeer {
			n := 0
			for _, c := range list {
				if c.shared {
					n++
				}
			}
			if n < most || n == 0 {
				continue
			}
			if v := oldestIdle(list, func(c *conn) bool { return c.shared }); v != nil && (n > most || victim == nil || v.idleSince.Before(victim.idleSince)) {
				victim, most = v, n
			}
		}
	}
	if victim == nil {
		return false, nil
	}
	shared := victim.shared
	l.uncount(victim)
	take(shared)
	return true, victim
}

func oldestIdle(list []*conn, ok func(*conn) bool) *conn {
	var v *conn
	for _, c := range list {
		if ok(c) && !c.idleSince.IsZero() && (v == nil || c.idleSince.Before(v.idleSince)) {
			v = c
		}
	}
	return v
}

// uncount frees c's slot (under l.mu).
func (l *listener) uncount(c *conn) {
	if !c.counted {
		return
	}
	c.counted = false
	list := l.perPeer[c.peer]
	for i, o := range list {
		if o == c {
			list = append(list[:i:i], list[i+1:]...)
			break
		}
	}
	if len(list) == 0 {
		delete(l.perPeer, c.peer)
	} else {
		l.perPeer[c.peer] = list
	}
	if c.shared {
		l.shared--
	}
}

// release gives back a closed connection's slot.
func (l *listener) release(c *conn) {
	l.mu.Lock()
	if c.busy {
		c.busy = false
		l.busy--
	}
	l.uncount(c)
	l.mu.Unlock()
}

// connState tracks which authenticated connections are idle (http.Server.ConnState): only
// an idle keep-alive may be closed to make room, never one serving a request or a poll.
func (l *listener) connState(c net.Conn, s http.ConnState) {
	fc, ok := c.(*conn)
	if !ok {
		return
	}
	l.mu.Lock()
	switch s {
	case http.StateNew, http.StateIdle:
		fc.idleSince = time.Now()
	case http.StateActive:
		fc.idleSince = time.Time{}
	}
	l.mu.Unlock()
}

// log writes one line per kind a second (a flood must not fill the journal), with the
// count of the suppressed ones.
func (l *listener) log(kind string, src netip.Addr, msg string, err error, attrs ...any) {
	ok, n := l.rlog.Allow(kind)
	if !ok {
		return
	}
	level := slog.LevelWarn
	if strings.HasPrefix(kind, "evict") {
		level = slog.LevelInfo // the pools doing their job; a refusal is what needs an operator
	}
	args := []any{"source", src.String()}
	if err != nil {
		args = append(args, "err", oneLine(err.Error()))
	}
	args = append(append(args, attrs...), "suppressed_since_last", n)
	l.n.cfg.Log.Log(context.Background(), level, msg, args...)
}

// stats is doctor's line about the pools now.
func (l *listener) stats() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	auth := 0
	for _, list := range l.perPeer {
		auth += len(list)
	}
	return fmt.Sprintf("pending %d, authenticated %d (%d shared), answered busy now %d; since start %d refused for capacity, %d evicted (%d before they sent a byte)",
		l.npend, auth, l.shared, l.busy, l.refused.Load(), l.evicted.Load(), l.evictedQuiet.Load())
}

// serverConfig is the static outer config: it fetches the current snapshot per connection,
// so a reload applies to the next handshake and never to one in progress.
//
// No session tickets (docs/security.md §1): every connection proves its key in a full
// handshake. A resumed session would be judged on the certificate its ticket remembers, and
// after a restart, when a fleet comes back at once, no ticket of the previous process is
// valid unless its ticket keys were kept on disk, a secret the hub does not keep; what it
// would save is the signatures (about an eighth of the hub's CPU of a fleet's comeback).
func (n *Node) serverConfig() *tls.Config {
	return &tls.Config{
		MinVersion:             tls.VersionTLS13,
		SessionTicketsDisabled: true,
		GetConfigForClient: func(hello *tls.ClientHelloInfo) (*tls.Config, error) {
			raw, _ := hello.Conn.(*rawConn)
			st := n.st.Load()
			return &tls.Config{
				MinVersion:             tls.VersionTLS13,
				SessionTicketsDisabled: true,
				Certificates:           []tls.Certificate{st.cert},
				NextProtos:             []string{"http/1.1"},
				// Any certificate is requested; VerifyConnection alone decides (no system
				// roots, no name check): pins and CA peers are ours to judge (§8.1).
				ClientAuth: tls.RequireAnyClientCert,
				VerifyConnection: func(cs tls.ConnectionState) error {
					p, err := st.peers.Inbound(cs.PeerCertificates)
					name := "(unknown)"
					if p != nil {
						name = p.Name
					}
					n.book.handshake(name, "inbound", err)
					if err != nil {
						return err
					}
					if raw != nil {
						raw.st, raw.peer, raw.chain = st, p, cs.PeerCertificates
					}
					return nil
				},
			}, nil
		},
	}
}
