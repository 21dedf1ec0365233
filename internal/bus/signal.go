package bus

import "github.com/xmsg/xmsg/internal/wake"

// signals wakes waiters by key (a message id for reply long-polls, a session id for queue
// polls); see internal/wake.
type signals struct{ wake.Set }

func (s *signals) subscribe(key string) (<-chan struct{}, func()) { return s.Subscribe(key) }
func (s *signals) fire(key string)                                { s.Fire(key) }
