package ledger

import (
	"sort"
	"sync"
	"sync/atomic"
)

// Counter is the sink that counts events by their bounded labels: kind, transport, the
// recipient's harness, the peer, the outcome and the code. Every label's values come from a
// closed set or from configuration (harness names, peer names), never from a sender, so the
// number of series is bounded whatever senders do. Safe for concurrent use; an event costs a
// map read and an atomic add once its series exists.
type Counter struct {
	m     sync.Map // Series → *atomic.Uint64
	bytes sync.Map // Series → *atomic.Uint64
	// peerOK reports whether a peer name is configured; others count as "other" (nil: all).
	peerOK func(string) bool
	// harnessOK reports whether a harness name is known; others count as "other" (nil: all).
	harnessOK func(string) bool
}

// Series is one counted combination of labels.
type Series struct {
	Kind      Kind
	Transport Transport
	Harness   string
	Peer      string
	Outcome   Outcome
	Code      string
}

// NewCounter returns a counter; harnessOK and peerOK bound the harness and peer labels to
// known names (nil: any).
func NewCounter(harnessOK, peerOK func(string) bool) *Counter {
	return &Counter{harnessOK: harnessOK, peerOK: peerOK}
}

// Event counts e.
func (c *Counter) Event(e *Event) {
	s := Series{Kind: e.Kind, Transport: e.Transport, Harness: e.Harness, Peer: e.Peer, Outcome: e.Outcome, Code: e.CodeWord()}
	if s.Harness != "" && c.harnessOK != nil && !c.harnessOK(s.Harness) {
		s.Harness = "other"
	}
	if s.Peer != "" && c.peerOK != nil && !c.peerOK(s.Peer) {
		s.Peer = "other"
	}
	add(&c.m, s, 1)
	if e.Bytes > 0 {
		add(&c.bytes, s, uint64(e.Bytes))
	}
}

func add(m *sync.Map, s Series, n uint64) {
	v, ok := m.Load(s)
	if !ok {
		v, _ = m.LoadOrStore(s, new(atomic.Uint64))
	}
	v.(*atomic.Uint64).Add(n)
}

// Count is one series and its totals.
type Count struct {
	Series
	Events uint64
	Bytes  uint64
}

// Counts are the totals so far, in a stable order.
func (c *Counter) Counts() []Count {
	var out []Count
	c.m.Range(func(k, v any) bool {
		n := Count{Series: k.(Series), Events: v.(*atomic.Uint64).Load()}
		if b, ok := c.bytes.Load(k); ok {
			n.Bytes = b.(*atomic.Uint64).Load()
		}
		out = append(out, n)
		return true
	})
	sort.Slice(out, func(i, j int) bool {
		a, b := out[i].Series, out[j].Series
		if a.Kind != b.Kind {
			return a.Kind < b.Kind
		}
		if a.Transport != b.Transport {
			return a.Transport < b.Transport
		}
		if a.Harness != b.Harness {
			return a.Harness < b.Harness
		}
		if a.Peer != b.Peer {
			return a.Peer < b.Peer
		}
		if a.Outcome != b.Outcome {
			return a.Outcome < b.Outcome
		}
		return a.Code < b.Code
	})
	return out
}
