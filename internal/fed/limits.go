package fed

import (
	"fmt"
	"strings"
	"sync"
	"time"
)

// limiter holds token buckets keyed by string (docs/protocol.md §5.6): each refills at rate per
// minute up to a burst of rate.
type limiter struct {
	mu      sync.Mutex
	buckets map[string]*bucket
	now     func() time.Time
}

type bucket struct {
	tokens float64
	last   time.Time
	rate   int
}

// maxBuckets bounds the map: principals are chosen by peers, so a peer could otherwise
// grow it without end. Full buckets carry no state and are dropped first.
const maxBuckets = 4096

func newLimiter() *limiter { return &limiter{buckets: map[string]*bucket{}, now: time.Now} }

func (l *limiter) refill(k string, rate int, now time.Time) *bucket {
	b := l.buckets[k]
	if b == nil {
		if len(l.buckets) >= maxBuckets {
			l.sweep(now)
		}
		b = &bucket{tokens: float64(rate), last: now, rate: rate}
		l.buckets[k] = b
	}
	b.tokens = min(float64(rate), b.tokens+now.Sub(b.last).Minutes()*float64(rate))
	b.last, b.rate = now, rate
	return b
}

func (l *limiter) sweep(now time.Time) {
	for k, b := range l.buckets {
		if b.tokens+now.Sub(b.last).Minutes()*float64(b.rate) >= float64(b.rate) {
			delete(l.buckets, k)
		}
	}
}

// has reports whether k's bucket holds a token now, taking none.
func (l *limiter) has(k string, rate int) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.refill(k, rate, l.now()).tokens >= 1
}

// take spends one token from every bucket in keys (with its rate), or from none: a refused
// request does not drain the buckets that still had room.
func (l *limiter) take(keys []string, rates []int) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.now()
	bs := make([]*bucket, len(keys))
	for i, k := range keys {
		bs[i] = l.refill(k, rates[i], now)
		if bs[i].tokens < 1 {
			return false
		}
	}
	for _, b := range bs {
		b.tokens--
	}
	return true
}

// book remembers, per peer, the last handshake result in each direction, and the reload
// state, for `xmsg doctor`.
type book struct {
	mu         sync.Mutex
	handshakes map[string]string // "<peer> <direction>" → result line
	// tally counts handshakes by peer (a configured name, or "(unknown)"), direction and
	// result: bounded by the peers file, for metrics.
	tally  map[HandshakeKey]uint64
	reload string
}

// HandshakeKey is one counted kind of handshake.
type HandshakeKey struct {
	Peer, Direction string
	OK              bool
}

func (b *book) handshake(peer, dir string, err error) {
	line := "ok"
	if err != nil {
		line = "refused: " + oneLine(err.Error())
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.handshakes == nil {
		b.handshakes, b.tally = map[string]string{}, map[HandshakeKey]uint64{}
	}
	b.handshakes[peer+" "+dir] = fmt.Sprintf("%s at %s", line, time.Now().UTC().Format(time.RFC3339))
	b.tally[HandshakeKey{Peer: peer, Direction: dir, OK: err == nil}]++
}

func (b *book) get(peer, dir string) string {
	b.mu.Lock()
	defer b.mu.Unlock()
	if s, ok := b.handshakes[peer+" "+dir]; ok {
		return s
	}
	return "none yet"
}

func (b *book) setReload(s string) {
	b.mu.Lock()
	b.reload = s
	b.mu.Unlock()
}

func (b *book) getReload() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.reload
}

func oneLine(s string) string {
	s = strings.ReplaceAll(s, "\n", " ")
	if len(s) > 200 {
		s = s[:200] + "…"
	}
	return s
}
