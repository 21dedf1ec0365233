package fed

import (
	"testing"
	"time"
)

func TestLimiter(t *testing.T) {
	l := newLimiter()
	now := time.Unix(1000, 0)
	l.now = func() time.Time { return now }
	for i := range 3 {
		if !l.take([]string{"peer", "p1"}, []int{60, 3}) {
			t.Fatalf("take %d refused", i)
		}
	}
	if l.take([]string{"peer", "p1"}, []int{60, 3}) {
		t.Error("4th take of a 3/min bucket allowed")
	}
	// The refused take did not drain the peer bucket: 57 left for other principals.
	for i := range 57 {
		if !l.take([]string{"peer", "p2"}, []int{60, 100}) {
			t.Fatalf("other principal, take %d refused", i)
		}
	}
	if l.take([]string{"peer", "p3"}, []int{60, 100}) {
		t.Error("61st take of the peer bucket allowed")
	}
	now = now.Add(20 * time.Second) // refills 1 token of p1 (3/min) and 20 of the peer
	if !l.take([]string{"peer", "p1"}, []int{60, 3}) || l.take([]string{"peer", "p1"}, []int{60, 3}) {
		t.Error("refill: want exactly one more take after 20 s")
	}
}
