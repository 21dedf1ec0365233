// Package leaf is the leaf side of docs/protocol.md §7.5: an `xmsg serve --leaf` that accepts no
// connection from outside, serves one local service, and pulls that service's mail from each
// hub over the federation link. It holds the leaf principal's parsing rules and the pull
// loop; routing and storage stay in the bus, the wire in internal/fed.
//
// Delivery is at-least-once and nothing acknowledged is lost: a pulled row is committed to
// the local service queue, the loop waits until the service acknowledges it there, and only
// then acknowledges it to the hub, which keeps the row until that ack arrives. A crash in
// between makes the hub hand the row out again.
package leaf

import (
	"fmt"
	"strings"

	"github.com/xmsg/xmsg/internal/bus"
	"github.com/xmsg/xmsg/internal/envelope"
)

// ParsePrincipal parses --leaf-principal (§7.5): "svc:x" and a bare name x are the service
// x; "claude:x", "agy:x", "pi:x" a session with id and name x; "anon:x" an anonymous sender.
// The local service the leaf admits is P minus "svc:".
func ParsePrincipal(p string) (bus.LeafIdentity, error) {
	id := bus.LeafIdentity{Principal: p, Service: strings.TrimPrefix(p, "svc:")}
	kind, name, qualified := strings.Cut(p, ":")
	if !qualified {
		kind, name = "svc", p
	}
	switch kind {
	case "svc":
		if !envelope.ValidServiceName(name) {
			return id, fmt.Errorf("leaf: --leaf-principal %q: service name must match [A-Za-z0-9._-]{1,32}", p)
		}
		id.Fed = bus.Principal{Kind: "service", Name: name}
	case "claude", "agy", "pi":
		if !envelope.ValidServiceName(name) {
			return id, fmt.Errorf("leaf: --leaf-principal %q: name must match [A-Za-z0-9._-]{1,32}", p)
		}
		id.Fed = bus.Principal{Kind: "session", Harness: kind, SessionID: name, Name: name}
	case "anon":
		clean, err := envelope.Anonymous(name)
		if err != nil || clean != name {
			return id, fmt.Errorf("leaf: --leaf-principal %q: not a valid anonymous sender name", p)
		}
		id.Fed = bus.Principal{Kind: "anonymous", From: name}
	default:
		return id, fmt.Errorf("leaf: --leaf-principal %q: want svc:NAME, claude:NAME, agy:NAME, pi:NAME, anon:NAME or a bare service name", p)
	}
	return id, nil
}
