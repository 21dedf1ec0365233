package wake

import (
	"context"
	"sync/atomic"
	"testing"
	"time"
)

// TestUntil: a Fire between two checks wakes the waiter (it subscribed before checking, so
// none is lost); without a Fire the wait ends when wait passes or ctx ends, not done; a
// check that fails ends it with the error.
func TestUntil(t *testing.T) {
	var s Set
	var ready atomic.Bool
	var calls atomic.Int32
	go func() {
		for calls.Load() == 0 {
			time.Sleep(time.Millisecond)
		}
		ready.Store(true)
		s.Fire("k")
	}()
	done, err := s.Until(context.Background(), "k", time.Minute, func() (bool, error) {
		calls.Add(1)
		return ready.Load(), nil
	})
	if !done || err != nil {
		t.Fatalf("Until after a Fire = %v %v, want done", done, err)
	}
	if done, err := s.Until(context.Background(), "k", 0, func() (bool, error) { return false, nil }); done || err != nil {
		t.Fatalf("Until without wait = %v %v", done, err)
	}
	if done, err := s.Until(context.Background(), "k", time.Millisecond, func() (bool, error) { return false, nil }); done || err != nil {
		t.Fatalf("Until past its wait = %v %v", done, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if done, err := s.Until(ctx, "k", time.Minute, func() (bool, error) { return false, nil }); done || err != nil {
		t.Fatalf("Until with an ended ctx = %v %v", done, err)
	}
	boom := context.DeadlineExceeded
	if _, err := s.Until(context.Background(), "k", time.Minute, func() (bool, error) { return false, boom }); err != boom {
		t.Fatalf("Until with a failing check = %v", err)
	}
	if len(s.m) != 0 {
		t.Fatalf("subscriptions left behind: %d", len(s.m))
	}
}

// TestNotify: a Fire calls each Notify of its key once, not one of another key and not one
// ended before it; ending a subscription after the Fire is harmless, and the key is forgotten
// once its last subscription ends.
func TestNotify(t *testing.T) {
	var s Set
	var a, b, ended, other int
	stopA := s.Notify("k", func() { a++ })
	stopB := s.Notify("k", func() { b++ })
	stopEnded := s.Notify("k", func() { ended++ })
	stopOther := s.Notify("j", func() { other++ })
	stopEnded()
	if !s.Fire("k") {
		t.Fatal("Fire of a key with subscribers reported none")
	}
	if s.Fire("k") {
		t.Fatal("a second Fire reported the subscribers the first one woke")
	}
	stopA()
	stopB()
	if a != 1 || b != 1 || ended != 0 || other != 0 {
		t.Fatalf("calls: a %d, b %d, ended %d, other key %d; want 1, 1, 0, 0", a, b, ended, other)
	}
	stopOther()
	if len(s.m) != 0 {
		t.Fatalf("keys left: %v", s.m)
	}
}

// TestNotifyThen: the work a NotifyThen hands back runs on the firing goroutine, after the
// Set's lock is released (it may use the Set) and before Fire returns; once, and only for
// the key fired.
func TestNotifyThen(t *testing.T) {
	var s Set
	var ran, other int
	var inside bool
	s.NotifyThen("k", func() func() {
		return func() {
			// Under the Set's lock this would deadlock.
			stop := s.Notify("k", func() {})
			stop()
			inside = true
			ran++
		}
	})
	s.NotifyThen("j", func() func() { return func() { other++ } })
	s.NotifyThen("k", func() func() { return nil })
	s.Fire("k")
	if !inside || ran != 1 || other != 0 {
		t.Fatalf("after Fire: ran %d (done %v), other key %d; want 1, true, 0", ran, inside, other)
	}
	s.Fire("k")
	if ran != 1 {
		t.Fatalf("a second Fire ran the work again: %d", ran)
	}
}
