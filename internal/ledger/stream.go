package ledger

import (
	"sync/atomic"
	"time"
)

// TextSink is a sink that may also be handed the text of the message or reply an event is
// about, which no other sink is ever given (the monitors that asked for text: Watchers).
type TextSink interface {
	Sink
	EventText(e *Event, text string)
}

// Sink takes the events of a stream. Event must not block and must not keep e: the stream
// calls it on the path of the request that caused the event, after its answer is out.
type Sink interface {
	Event(e *Event)
}

// Stream is the one event stream of a daemon: every change of a message's life is emitted
// here once and fanned out to the sinks it was built with (the audit log, the counters, the
// monitors). Built once in internal/daemon. A nil *Stream takes events and drops them, so a
// bus or server built without one (in a unit test) needs no stand-in.
type Stream struct {
	seq   atomic.Uint64
	sinks []Sink
	now   func() time.Time
}

// NewStream returns a stream over sinks (nil sinks are skipped).
func NewStream(sinks ...Sink) *Stream {
	s := &Stream{now: time.Now}
	for _, k := range sinks {
		if k != nil {
			s.sinks = append(s.sinks, k)
		}
	}
	return s
}

// Emit numbers e, stamps its time when unset, and hands it to every sink.
func (s *Stream) Emit(e Event) { s.emit(e, "") }

// emit is Emit with the text of the message or reply e is about ("" for none): only a
// TextSink is handed it, the audit log and the counters never.
func (s *Stream) emit(e Event, text string) {
	if s == nil {
		return
	}
	e.Seq = s.seq.Add(1)
	if e.Time.IsZero() {
		e.Time = s.now()
	}
	for _, k := range s.sinks {
		if ts, ok := k.(TextSink); ok && text != "" {
			ts.EventText(&e, text)
			continue
		}
		k.Event(&e)
	}
}

// Request emits the event of one request a transport answered: Sent (or Replied, Pulled,
// Acked as kind says) when err is nil, else Refused with err's code. It is the one way a
// transport announces what it did, so every socket's line has the same fields.
func (s *Stream) Request(via Via, kind Kind, request, target string, r Result, err error) {
	if s == nil {
		return
	}
	e := Event{Kind: kind, Request: request, To: target, From: via.Actor, Transport: via.Transport, Peer: via.Peer,
		MessageID: r.MessageID, InReplyTo: r.InReplyTo, ReplySeq: r.ReplySeq, Harness: r.Harness, Outcome: r.Outcome, Bytes: r.Bytes}
	if e.Peer == "" {
		e.Peer = r.Peer
	}
	if err != nil {
		x := AsError(err)
		e.Refusal(x.Code, x.Detail)
		e.Err = err
	}
	s.emit(e, r.Text)
}

// Result is what a transport knows of an answered request, for its event.
type Result struct {
	MessageID string
	InReplyTo string
	ReplySeq  uint64 // a reply's seq
	Harness   string
	Outcome   Outcome
	Bytes     int
	// Peer is the federation peer a request went to, when its transport is not the peer's
	// own (a local send to a remote ref): the event counts under it.
	Peer string
	// Text is the message's or the reply's text, for a monitor that asked for it
	// (TextSink); it never enters an Event.
	Text string
}
