// Package wake wakes waiters by key: a long-poll subscribes to its key (a message id, a
// session id, a leaf's mailbox) and whoever commits what it waits for fires that key.
// Subscribing before re-checking the store means no wakeup is ever lost.
package wake

import (
	"context"
	"sync"
	"time"
)

// Set is the waiters of every key. The zero Set is ready to use.
type Set struct {
	mu sync.Mutex
	m  map[string]*entry
}

type entry struct {
	ch chan struct{}
	n  int
}

// Subscribe returns a channel closed by the next Fire of key, and the func that ends the
// subscription.
func (s *Set) Subscribe(key string) (<-chan struct{}, func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.m == nil {
		s.m = map[string]*entry{}
	}
	e := s.m[key]
	if e == nil {
		e = &entry{ch: make(chan struct{})}
		s.m[key] = e
	}
	e.n++
	return e.ch, func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		if e.n--; e.n == 0 && s.m[key] == e {
			delete(s.m, key)
		}
	}
}

// Fire wakes every subscriber of key.
func (s *Set) Fire(key string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if e := s.m[key]; e != nil {
		close(e.ch)
		delete(s.m, key)
	}
}

// Until calls check, and again at each Fire of key, until it reports done, fails, wait
// has passed (wait <= 0: one call) or ctx ends. It reports whether check was done.
func (s *Set) Until(ctx context.Context, key string, wait time.Duration, check func() (bool, error)) (bool, error) {
	var timer *time.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	for {
		ch, cancel := s.Subscribe(key)
		done, err := check()
		if err != nil || done || wait <= 0 {
			cancel()
			return done, err
		}
		if timer == nil {
			timer = time.NewTimer(wait)
		}
		select {
		case <-ch:
			cancel()
		case <-timer.C:
			cancel()
			return false, nil
		case <-ctx.Done():
			cancel()
			return false, nil
		}
	}
}
