// Package harness says what a harness is to the bus: the facts that decide how a ref
// resolves to one of its sessions, how its callers are admitted, how a message reaches them
// and how they are listed. Each harness is a type in a package of its own (internal/claude,
// internal/codex, internal/agy, internal/harness/uid for pi/opencode/hermes,
// internal/harness/svc); the bus holds a Registry of them and routes by these facts, never
// by comparing names.
package harness

import (
	"fmt"
	"strings"
)

// Admission is how a harness's callers are identified (docs/protocol.md §4.1, §7.1).
type Admission int

const (
	// SessionFile: a session file names the caller's ancestor by pid and start time, and
	// the session's own socket receives its messages (Claude Code).
	SessionFile Admission = iota
	// Lease: a trusted executable holding a thread's writer lock; which thread a call is for
	// is named per call (_meta), never decided by the pid alone (Codex).
	Lease
	// Presence: a trusted executable holding a conversation's flocked presence lock (agy).
	Presence
	// UID: registered on register.sock by uid alone, with a durable per-process id.
	UID
	// Exe: registered on register.sock after its executable is attested; a configured name
	// with a durable queue (services).
	Exe
)

// Delivery is how a message reaches a harness's session.
type Delivery int

const (
	// Inbox: written to the session's own socket once the record is committed.
	Inbox Delivery = iota
	// Queue: committed to the session's queue, which it polls and acknowledges.
	Queue
	// Agentapi: handed to agentapi when the session holds credentials, else queued for its
	// conversation until a credential frame flushes it.
	Agentapi
)

// Harness is one kind of agent session.
type Harness interface {
	// Name is the harness's name on the wire ("claude", "svc", ...).
	Name() string
	// Refs are the ref prefixes that pin a ref to this harness ("claude:x", "session:x").
	Refs() []string
	Admission() Admission
	Delivery() Delivery
	// Kind is a Session object's kind in listings: "interactive" or "daemon".
	Kind() string
	// Rank orders registrations in listings (lower first).
	Rank() int
	// Envelope is a queued message's envelope as this harness's session reads it, given the
	// sender's badge, the message's Claude-style body and its plain envelope.
	Envelope(badge, claudeBody, plain string) string
	// Origin reports whether its queue entries carry the sender's origin (docs/protocol.md §7.3).
	Origin() bool
}

// Registry is a set of harnesses by name and by ref prefix. It is built once and then only
// read, so it is safe for concurrent use.
type Registry struct {
	byName map[string]Harness
	byRef  map[string]Harness
	all    []Harness
}

// NewRegistry registers hs; a name or ref prefix used twice is a programming error.
func NewRegistry(hs ...Harness) (*Registry, error) {
	r := &Registry{byName: map[string]Harness{}, byRef: map[string]Harness{}}
	for _, h := range hs {
		if _, dup := r.byName[h.Name()]; dup || h.Name() == "" {
			return nil, fmt.Errorf("harness: register: name %q empty or taken", h.Name())
		}
		r.byName[h.Name()] = h
		for _, p := range h.Refs() {
			p = strings.ToLower(p)
			if _, dup := r.byRef[p]; dup {
				return nil, fmt.Errorf("harness: register: ref prefix %q taken", p)
			}
			r.byRef[p] = h
		}
		r.all = append(r.all, h)
	}
	return r, nil
}

// Named returns the harness named name, or nil.
func (r *Registry) Named(name string) Harness { return r.byName[name] }

// Split splits "svc:x" into (the svc harness, "x"); a ref without a known prefix gives
// (nil, ref).
func (r *Registry) Split(ref string) (Harness, string) {
	if p, rest, ok := strings.Cut(ref, ":"); ok && rest != "" {
		if h := r.byRef[strings.ToLower(p)]; h != nil {
			return h, rest
		}
	}
	return nil, ref
}

// All returns the harnesses in registration order.
func (r *Registry) All() []Harness { return r.all }

// Is reports whether the harness named name is admitted as a.
func (r *Registry) Is(name string, a Admission) bool {
	h := r.byName[name]
	return h != nil && h.Admission() == a
}

// Delivers reports whether the harness named name is reached by d.
func (r *Registry) Delivers(name string, d Delivery) bool {
	h := r.byName[name]
	return h != nil && h.Delivery() == d
}

// Spec is a Harness given by its facts. Most harnesses are one Spec value; one whose
// envelope differs (Codex) embeds a Spec and overrides Envelope.
type Spec struct {
	ID       string   // Name
	Prefixes []string // Refs; nil means {ID}
	Admit    Admission
	Deliver  Delivery
	Daemon   bool // listed with kind "daemon" rather than "interactive"
	Order    int  // Rank
	Origins  bool // Origin
}

func (s Spec) Name() string { return s.ID }

func (s Spec) Refs() []string {
	if s.Prefixes == nil {
		return []string{s.ID}
	}
	return s.Prefixes
}

func (s Spec) Admission() Admission { return s.Admit }
func (s Spec) Delivery() Delivery   { return s.Deliver }
func (s Spec) Rank() int            { return s.Order }
func (s Spec) Origin() bool         { return s.Origins }

func (s Spec) Kind() string {
	if s.Daemon {
		return "daemon"
	}
	return "interactive"
}

// Envelope is the plain envelope.
func (Spec) Envelope(_, _, plain string) string { return plain }
