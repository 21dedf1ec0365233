// Package wake wakes waiters by key: a long-poll subscribes to its key (a message id, a
// session id, a leaf's mailbox) and whoever commits what it waits for fires that key.
// Subscribing before re-checking the store means no wakeup is ever lost.
package wake

import (
	"context"
	"slices"
	"sync"
	"time"
)

// Set is the waiters of every key. The zero Set is ready to use.
type Set struct {
	mu sync.Mutex
	m  map[string]*entry
}

type entry struct {
	ch  chan struct{}
	n   int
	fns []*func() func() // Notify's and NotifyThen's, called by the next Fire
}

// entry is key's waiters, made when it has none (under s.mu).
func (s *Set) entry(key string) *entry {
	if s.m == nil {
		s.m = map[string]*entry{}
	}
	e := s.m[key]
	if e == nil {
		e = &entry{ch: make(chan struct{})}
		s.m[key] = e
	}
	return e
}

// Subscribe returns a channel closed by the next Fire of key, and the func that ends the
// subscription.
func (s *Set) Subscribe(key string) (<-chan struct{}, func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.entry(key)
	e.n++
	return e.ch, func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		if e.n--; e.n == 0 && s.m[key] == e {
			delete(s.m, key)
		}
	}
}

// Notify has f called by the next Fire of key, unless the returned func (which ends the
// subscription) comes first: a Subscribe for a waiter that is not a goroutine blocked on a
// channel (one blocked in a read, which f interrupts). f runs under the Set's lock, on the
// firing goroutine: it must be quick and must not use the Set.
func (s *Set) Notify(key string, f func()) func() {
	return s.NotifyThen(key, func() func() { f(); return nil })
}

// NotifyThen is Notify whose f may hand work back: what f returns (nil: nothing) runs on the
// firing goroutine once the Set's lock is released, before Fire returns, so it may take
// locks and make system calls (a waiting poll answered by the goroutine that queued its
// message). Ending the subscription after f was called does not stop that work.
func (s *Set) NotifyThen(key string, f func() func()) func() {
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.entry(key)
	e.n++
	fp := &f
	e.fns = append(e.fns, fp)
	return func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		i := slices.Index(e.fns, fp)
		if i < 0 {
			return // fired, or ended already
		}
		e.fns = slices.Delete(e.fns, i, i+1)
		if e.n--; e.n == 0 && s.m[key] == e {
			delete(s.m, key)
		}
	}
}

// Fire wakes every subscriber of key, then does the work their NotifyThen handed back. It
// reports whether key had a subscriber.
func (s *Set) Fire(key string) bool {
	var then []func()
	s.mu.Lock()
	e := s.m[key]
	if e != nil {
		close(e.ch)
		delete(s.m, key)
		for _, f := range e.fns {
			if w := (*f)(); w != nil {
				then = append(then, w)
			}
		}
		e.fns = nil
	}
	s.mu.Unlock()
	for _, w := range then {
		w()
	}
	return e != nil
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
