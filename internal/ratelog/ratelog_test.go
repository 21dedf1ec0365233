package ratelog

import (
	"strconv"
	"testing"
	"time"
)

func TestOneLinePerIntervalWithSuppressedCount(t *testing.T) {
	now := time.Unix(1000, 0)
	l := &Limiter{Now: func() time.Time { return now }}
	if ok, n := l.Allow("a"); !ok || n != 0 {
		t.Fatalf("first line: %v %d", ok, n)
	}
	for range 5 {
		if ok, _ := l.Allow("a"); ok {
			t.Fatal("line within the interval let through")
		}
	}
	// Keys are independent: another reason is still logged.
	if ok, _ := l.Allow("b"); !ok {
		t.Fatal("another key was suppressed")
	}
	now = now.Add(time.Second)
	if ok, n := l.Allow("a"); !ok || n != 5 {
		t.Fatalf("after the interval: %v suppressed=%d, want true 5", ok, n)
	}
}

func TestKeysAreBounded(t *testing.T) {
	now := time.Unix(1000, 0)
	l := &Limiter{Now: func() time.Time { return now }}
	for i := range 10 * maxKeys {
		l.Allow(strconv.Itoa(i))
	}
	if len(l.keys) > maxKeys+1 {
		t.Fatalf("%d keys held, want at most %d", len(l.keys), maxKeys+1)
	}
	// The overflow entry still suppresses: a flood of fresh keys is one line per interval.
	if ok, _ := l.Allow("fresh"); ok {
		t.Fatal("a fresh key past the bound was let through within the interval")
	}
}
