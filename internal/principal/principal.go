// Package principal is a sender's identity on the federation wire (docs/protocol.md §8.2,
// §8.3): who a node says sent a message, tagged by kind. A node sends its own senders' as
// principals; a node that receives one names the sender under the peer's authenticated name
// (step 7), never under its own, so a peer can only ever speak for its own users.
package principal

import (
	"errors"
	"fmt"
	"strings"

	"github.com/xmsg/xmsg/internal/agy"
	"github.com/xmsg/xmsg/internal/claude"
	"github.com/xmsg/xmsg/internal/envelope"
	"github.com/xmsg/xmsg/internal/harness/svc"
	"github.com/xmsg/xmsg/internal/harness/uid"
)

// Kind is what a principal is.
type Kind string

const (
	Session   Kind = "session"   // an attested session: harness, session_id, name
	Service   Kind = "service"   // a configured service: name
	Anonymous Kind = "anonymous" // an HTTP sender: from, its sanitized name
)

// Principal is a sender on the wire. Only its kind's fields are set (Check).
type Principal struct {
	Kind      Kind   `json:"kind"`
	Harness   string `json:"harness,omitempty"`
	SessionID string `json:"session_id,omitempty"`
	Name      string `json:"name,omitempty"`
	From      string `json:"from,omitempty"`
}

// Harness reports whether h is a harness a session principal or a replier may name: the
// wire's set, what a peer may claim for its own sessions, which is not this daemon's
// harness registry (a Codex thread, say, has no federation principal of its own kind).
func Harness(h string) bool { return wireHarnesses[h] }

var wireHarnesses = map[string]bool{claude.Name: true, agy.Name: true, uid.Pi.Name(): true, svc.Name: true,
	uid.OpenCode.Name(): true, uid.Hermes.Name(): true, uid.CLI.Name(): true}

// Check refuses a principal with a field of another kind, like an unknown field.
func (p Principal) Check() error {
	switch p.Kind {
	case Session:
		if p.From != "" {
			return errors.New("principal: \"from\" is not a field of a session principal")
		}
	case Service:
		if p.Harness != "" || p.SessionID != "" || p.From != "" {
			return errors.New("principal: a service principal has only \"name\"")
		}
	case Anonymous:
		if p.Harness != "" || p.SessionID != "" || p.Name != "" {
			return errors.New("principal: an anonymous principal has only \"from\"")
		}
	default:
		return fmt.Errorf("principal: unknown kind %q", p.Kind)
	}
	return nil
}

// Badge is p's name in svc origins and policy strings: "claude:alice", "svc:matrix",
// "anon:bob".
func (p Principal) Badge() string {
	switch p.Kind {
	case Session:
		return p.Harness + ":" + envelope.AttestedName(p.Harness, p.Name)
	case Service:
		return svc.SessionID(p.Name)
	}
	return "anon:" + p.From
}

// PolicyNames are the strings p matches in a peer's `principals` (§8.3 step 3).
func (p Principal) PolicyNames() []string {
	switch p.Kind {
	case Session:
		return []string{p.Harness + ":" + p.Name, "session:" + p.SessionID, p.Harness + ":" + p.SessionID}
	case Service:
		return []string{svc.SessionID(p.Name)}
	}
	return []string{"anon:" + p.From}
}

// RateKey names p's rate bucket.
func (p Principal) RateKey() string {
	switch p.Kind {
	case Session:
		return p.Harness + ":" + p.SessionID
	case Service:
		return svc.SessionID(p.Name)
	}
	return "anon:" + p.From
}

// Return is a sender as the return address of its message: replies go to this session.
type Return struct{ Harness, SessionID, Name string }

// Sender is what a principal that peer sent is here (§8.3 step 7): its sender badge, named
// under the peer's name; its badge for svc origins; and its return address (nil for an
// anonymous sender, whose replies are poll-only).
type Sender struct {
	FromName, Badge string
	Return          *Return
}

// ErrSender is the refusal of an anonymous principal's `from` (the protocol's bad_sender).
var ErrSender = errors.New("principal: invalid anonymous sender")

// Sender checks p as peer's claim about one of its own users and returns it as a sender
// here. A session id must be 1..256 printable ASCII bytes, a service name a valid one; an
// anonymous `from` that is no valid sender name is ErrSender.
func (p Principal) Sender(peer string) (Sender, error) {
	switch p.Kind {
	case Session:
		if !Harness(p.Harness) {
			return Sender{}, fmt.Errorf("invalid harness '%s'", p.Harness)
		}
		if p.SessionID == "" || len(p.SessionID) > 256 || !Printable(p.SessionID) {
			return Sender{}, errors.New("invalid session_id")
		}
		name := p.Name
		if name == "" {
			name = p.SessionID
		}
		return Sender{FromName: envelope.AttestedBadge(peer, p.Harness, name), Badge: p.Harness + ":" + envelope.AttestedName(p.Harness, name),
			Return: &Return{Harness: p.Harness, SessionID: p.SessionID, Name: name}}, nil
	case Service:
		if !envelope.ValidServiceName(p.Name) {
			return Sender{}, fmt.Errorf("invalid service name '%s'", p.Name)
		}
		return Sender{FromName: envelope.AttestedBadge(peer, svc.Name, p.Name), Badge: svc.SessionID(p.Name),
			Return: &Return{Harness: svc.Name, SessionID: svc.SessionID(p.Name), Name: p.Name}}, nil
	}
	clean, err := envelope.Anonymous(p.From)
	if err != nil {
		return Sender{}, fmt.Errorf("%w: %v", ErrSender, err)
	}
	return Sender{FromName: envelope.AnonymousBadge(peer, clean), Badge: "anon:" + clean}, nil
}

// Printable reports whether s is printable ASCII without spaces (an id on the wire).
func Printable(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < 0x21 || s[i] > 0x7e {
			return false
		}
	}
	return true
}

// leafSessions are the harnesses a leaf principal may name as a session (§7.5).
var leafSessions = []string{claude.Name, agy.Name, uid.Pi.Name()}

// Parse parses a leaf principal (--leaf-principal, §7.5): "svc:x" and a bare name x are the
// service x; "claude:x", "agy:x", "pi:x" a session with id and name x; "anon:x" an
// anonymous sender.
func Parse(s string) (Principal, error) {
	kind, name, qualified := strings.Cut(s, ":")
	if !qualified {
		kind, name = svc.Name, s
	}
	switch {
	case kind == svc.Name:
		if !envelope.ValidServiceName(name) {
			return Principal{}, fmt.Errorf("%q: service name must match [A-Za-z0-9._-]{1,32}", s)
		}
		return Principal{Kind: Service, Name: name}, nil
	case kind == "anon":
		clean, err := envelope.Anonymous(name)
		if err != nil || clean != name {
			return Principal{}, fmt.Errorf("%q: not a valid anonymous sender name", s)
		}
		return Principal{Kind: Anonymous, From: name}, nil
	}
	for _, h := range leafSessions {
		if kind == h {
			if !envelope.ValidServiceName(name) {
				return Principal{}, fmt.Errorf("%q: name must match [A-Za-z0-9._-]{1,32}", s)
			}
			return Principal{Kind: Session, Harness: kind, SessionID: name, Name: name}, nil
		}
	}
	return Principal{}, fmt.Errorf("%q: want svc:NAME, claude:NAME, agy:NAME, pi:NAME, anon:NAME or a bare service name", s)
}
