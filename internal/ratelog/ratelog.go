// Package ratelog keeps refusal log lines from flooding the journal: a client of our own uid
// can provoke a refusal thousands of times a second (a full queue, a connection cap), and one
// line per refusal would turn the log into the attack's amplifier. A Limiter lets one line per
// key through per interval and reports, on the next line that passes, how many were
// suppressed in between.
package ratelog

import (
	"context"
	"log/slog"
	"sync"
	"time"
)

// maxKeys bounds the limiter's memory: keys come from a fixed set of reasons in practice,
// but a caller that built them from client input must still not grow the map without limit.
// Past it, every new key shares one overflow entry.
const maxKeys = 256

const overflowKey = "\x00overflow"

// Limiter is safe for concurrent use. The zero value lets one line per key per second through.
type Limiter struct {
	Every time.Duration    // interval per key; zero: one second
	Now   func() time.Time // clock; nil: time.Now

	mu   sync.Mutex
	keys map[string]*entry
}

type entry struct {
	last       time.Time
	suppressed int
}

// Allow reports whether a line for key may be logged now and, if so, how many lines for key
// were suppressed since the previous one that was.
func (l *Limiter) Allow(key string) (ok bool, suppressed int) {
	now := time.Now
	if l.Now != nil {
		now = l.Now
	}
	every := l.Every
	if every <= 0 {
		every = time.Second
	}
	t := now()
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.keys == nil {
		l.keys = map[string]*entry{}
	}
	e := l.keys[key]
	if e == nil {
		if len(l.keys) >= maxKeys {
			l.prune(t, every)
		}
		if len(l.keys) >= maxKeys {
			key = overflowKey
			e = l.keys[key]
		}
		if e == nil {
			e = &entry{}
			l.keys[key] = e
		}
	}
	if !e.last.IsZero() && t.Sub(e.last) < every {
		e.suppressed++
		return false, 0
	}
	e.last = t
	suppressed, e.suppressed = e.suppressed, 0
	return true, suppressed
}

// prune forgets keys with nothing suppressed whose interval has passed: forgetting them loses
// no count.
func (l *Limiter) prune(t time.Time, every time.Duration) {
	for k, e := range l.keys {
		if e.suppressed == 0 && t.Sub(e.last) >= every {
			delete(l.keys, k)
		}
	}
}

// Log writes msg with args at level to log unless a line for key was written within the
// interval; a line that passes carries "suppressed", the count of lines for key dropped since
// the previous one. key should name the kind of refusal (socket, request, reason), never a
// client-chosen value.
func (l *Limiter) Log(log *slog.Logger, level slog.Level, key, msg string, args ...any) {
	if !log.Enabled(context.Background(), level) {
		return
	}
	ok, suppressed := l.Allow(key)
	if !ok {
		return
	}
	log.Log(context.Background(), level, msg, append(args, "suppressed", suppressed)...)
}
