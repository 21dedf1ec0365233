package ledger

import "time"

// Kind is what happened to a message, one word per change of its life.
type Kind uint8

const (
	// Sent: a request to send was accepted and the message recorded (Outcome: delivered,
	// queued, accepted).
	Sent Kind = iota + 1
	// Refused: a request was answered with an error code and changed nothing.
	Refused
	// Failed: a recorded message's hand-over failed after its record (delivery_failed).
	Failed
	// Acked: a queued message was taken by its service, or by a leaf (Outcome delivered).
	Acked
	// Replied: a reply was recorded (Outcome: its push outcome).
	Replied
	// Reported: the recipient's harness reported the message's state (held, delivered,
	// denied, expired).
	Reported
	// Pulled: a leaf took rows from its hub's mailbox into its service's queue.
	Pulled
	// Watched: a monitor attached (its audit line; Detail says whether with text).
	Watched
	numKinds
)

var kinds = [numKinds]string{
	Sent: "sent", Refused: "refused", Failed: "failed", Acked: "acked", Replied: "replied",
	Reported: "reported", Pulled: "pulled", Watched: "watched",
}

// String is the kind's word in the event stream, the monitor and the metrics.
func (k Kind) String() string {
	if k >= numKinds {
		return ""
	}
	return kinds[k]
}

// MarshalText writes the word.
func (k Kind) MarshalText() ([]byte, error) { return []byte(k.String()), nil }

// UnmarshalText reads a word; an unknown one is an error, so a filter cannot silently match
// nothing.
func (k *Kind) UnmarshalText(b []byte) error {
	v, ok := ParseKind(string(b))
	if !ok {
		return errUnknown("event kind", string(b))
	}
	*k = v
	return nil
}

// ParseKind is the kind of a word.
func ParseKind(word string) (Kind, bool) {
	for i, w := range kinds {
		if w == word && w != "" {
			return Kind(i), true
		}
	}
	return 0, false
}

// Kinds are all kinds, in order.
func Kinds() []Kind {
	out := make([]Kind, 0, numKinds-1)
	for k := Sent; k < numKinds; k++ {
		out = append(out, k)
	}
	return out
}

// Transport is the way a request reached the daemon.
type Transport uint8

const (
	NoTransport Transport = iota
	HTTP                  // http.sock
	TCP                   // the optional TCP listener
	Agent                 // agent.sock
	Register              // register.sock
	Fed                   // a federation peer (Peer names it)
	Leaf                  // a leaf's pull from its hub (Peer names the hub)
	Daemon                // the daemon itself: retention, a harness's report
	numTransports
)

var transports = [numTransports]string{
	NoTransport: "", HTTP: "http", TCP: "tcp", Agent: "agent", Register: "register", Fed: "fed",
	Leaf: "leaf", Daemon: "daemon",
}

// String is the transport's word (the audit log's `socket`).
func (t Transport) String() string {
	if t >= numTransports {
		return ""
	}
	return transports[t]
}

// MarshalText writes the word.
func (t Transport) MarshalText() ([]byte, error) { return []byte(t.String()), nil }

// UnmarshalText reads a word.
func (t *Transport) UnmarshalText(b []byte) error {
	v, ok := ParseTransport(string(b))
	if !ok {
		return errUnknown("transport", string(b))
	}
	*t = v
	return nil
}

// ParseTransport is the transport of a word.
func ParseTransport(word string) (Transport, bool) {
	for i, w := range transports {
		if w == word && w != "" {
			return Transport(i), true
		}
	}
	return NoTransport, false
}

// Transports are all transports, in order.
func Transports() []Transport {
	out := make([]Transport, 0, numTransports-1)
	for t := HTTP; t < numTransports; t++ {
		out = append(out, t)
	}
	return out
}

// Via is where a request came from, as its transport knows it from attested facts: the
// transport, the actor (the attested caller, "anon", "fed:PEER"), and the peer for
// federation and leaf traffic.
type Via struct {
	Transport Transport
	Actor     string
	Peer      string
}

// Event is one change of a message's life. It never holds a message's or a reply's text:
// the stream is for watching and counting, and the text is the store's alone (a monitor
// that asks for text reads it from there, and is audited for it).
type Event struct {
	Seq       uint64    `json:"seq"` // the stream's order, set by Emit
	Time      time.Time `json:"time"`
	Kind      Kind      `json:"event"`
	Request   string    `json:"request,omitempty"` // send, reply, ack, pull, mcp_start...
	MessageID string    `json:"message_id,omitempty"`
	InReplyTo string    `json:"in_reply_to,omitempty"` // a reply's original
	ReplySeq  uint64    `json:"reply_seq,omitempty"`   // a reply's seq (docs/protocol.md §3.7)
	From      string    `json:"from,omitempty"`        // attested sender (actor or badge)
	To        string    `json:"to,omitempty"`          // the ref asked for, or the session
	Harness   string    `json:"harness,omitempty"`     // the recipient's harness
	Transport Transport `json:"transport,omitempty"`
	Peer      string    `json:"peer,omitempty"`
	Outcome   Outcome   `json:"outcome,omitempty"`
	Code      *Code     `json:"code,omitempty"`
	Detail    string    `json:"detail,omitempty"` // a refusal's reason; never a body
	Bytes     int       `json:"bytes,omitempty"`
	// Err is a refusal's cause, for the audit log's level (never encoded: it may name paths).
	Err error `json:"-"`
}

// Refusal fills in e's code and detail.
func (e *Event) Refusal(c Code, detail string) {
	e.Kind, e.Code, e.Detail = Refused, &c, detail
}

// CodeWord is the event's code as a wire word ("" when it has none).
func (e *Event) CodeWord() string {
	if e.Code == nil {
		return ""
	}
	return e.Code.String()
}

type unknownErr struct{ what, word string }

func (u unknownErr) Error() string { return "ledger: unknown " + u.what + " " + quote(u.word) }

func errUnknown(what, word string) error { return unknownErr{what, word} }

func quote(s string) string {
	if len(s) > 64 {
		s = s[:64]
	}
	b := make([]byte, 0, len(s)+2)
	b = append(b, '"')
	for _, r := range s {
		if r < 0x20 || r == 0x7f || r == '"' || r == '\\' {
			b = append(b, '?')
			continue
		}
		b = append(b, string(r)...)
	}
	return string(append(b, '"'))
}
