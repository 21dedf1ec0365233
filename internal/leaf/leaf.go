// Package leaf is the leaf side of docs/protocol.md §7.5: an `xmsg serve --leaf` that accepts no
// connection from outside, serves one local service, and pulls that service's mail from each
// hub over the federation link. It holds the leaf principal's parsing rules and the pull
// loop; routing and storage stay in the bus, the wire in internal/fed.
//
// Delivery is at-least-once and nothing acknowledged is lost: a pulled row joins the local
// service's queue (its records ride a commit made within a short while), and the loop
// acknowledges it to the hub only once the service acknowledged it there and those records
// are committed; the hub keeps the row until that ack arrives. A crash in between makes the
// hub hand the row out again.
package leaf

import (
	"fmt"
	"strings"

	"github.com/xmsg/xmsg/internal/bus"
	"github.com/xmsg/xmsg/internal/harness/svc"
	"github.com/xmsg/xmsg/internal/principal"
)

// Identity is a leaf's configured principal (--leaf-principal).
type Identity struct {
	Principal string              // as configured, e.g. "svc:matrix": fromName suffix and idempotency scope
	Fed       principal.Principal // its federation principal (§7.5 parsing rules)
	Service   string              // the one local service admitted: Principal minus "svc:"
}

// Bus is what the leaf's bus knows of it: the one service it serves.
func (id Identity) Bus() *bus.LeafService {
	return &bus.LeafService{Name: id.Service, Principal: id.Principal}
}

// ParsePrincipal parses --leaf-principal (§7.5, principal.Parse). The local service the leaf
// admits is P minus "svc:".
func ParsePrincipal(p string) (Identity, error) {
	fed, err := principal.Parse(p)
	if err != nil {
		return Identity{}, fmt.Errorf("leaf: --leaf-principal %w", err)
	}
	return Identity{Principal: p, Fed: fed, Service: strings.TrimPrefix(p, svc.Name+":")}, nil
}
