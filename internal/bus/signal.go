package bus

import "sync"

// signals wakes waiters by key (a message id for reply long-polls, a session id for queue
// polls). Subscribing before re-checking the store means no wakeup is ever lost.
type signals struct {
	mu sync.Mutex
	m  map[string]*waitEntry
}

type waitEntry struct {
	ch chan struct{}
	n  int
}

func (s *signals) subscribe(key string) (<-chan struct{}, func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.m == nil {
		s.m = map[string]*waitEntry{}
	}
	e := s.m[key]
	if e == nil {
		e = &waitEntry{ch: make(chan struct{})}
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

func (s *signals) fire(key string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if e := s.m[key]; e != nil {
		close(e.ch)
		delete(s.m, key)
	}
}
