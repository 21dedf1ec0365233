package fed

import (
	"fmt"
	"net/netip"
)

// The federation listener's connection budget (docs/protocol.md §2.6). It is no constant: a
// hub of a thousand leaves needs a thousand connections, and what bounds it is the process's
// descriptor limit. The budget is split into two pools that cannot take from each other:
//
//   - pending: connections before and during the TLS handshake, which have proven nothing.
//     Small, with a per-source share; when full, a newcomer takes the place of the oldest
//     idle connection of the heaviest source (listener.go), so a flood of silent TCP
//     connections costs a peer that speaks at once nothing.
//   - authenticated: every configured peer that may connect keeps room for one connection of
//     its own, and the rest is shared (each peer up to maxPerPeer).

// fdReserve is what the budget leaves of RLIMIT_NOFILE for everything else the daemon holds
// open (its other sockets, the store, the session directories, outbound connections): at
// most a quarter of the limit, at most 1024.
func fdReserve(nofile uint64) int { return int(min(nofile/4, 1024)) }

// MinConns is the smallest --fed-max-conns.
const MinConns = 32

// capacity is one sizing of the pools.
type capacity struct {
	total   int    // every connection of the listener
	pending int    // of which unauthenticated (before/during TLS)
	perSrc  int    // of the pending, per source address
	auth    int    // of which authenticated
	nofile  uint64 // RLIMIT_NOFILE (soft) at start; 0 unknown
	flag    int    // --fed-max-conns as given; 0 = from the descriptor limit
	clamped bool   // the flag asked for more than the descriptor limit allows
}

// sizeCapacity sizes the pools from --fed-max-conns (0: from the descriptor limit) and
// RLIMIT_NOFILE (0: unknown).
func sizeCapacity(flag int, nofile uint64) capacity {
	c := capacity{flag: flag, nofile: nofile}
	allowed := 1 << 16 // no limit known: still a bound
	if nofile > 0 {
		allowed = max(MinConns, int(min(nofile, 1<<30))-fdReserve(nofile))
	}
	c.total = allowed
	if flag > 0 {
		c.total = max(flag, MinConns)
		if c.total > allowed {
			c.total, c.clamped = allowed, true
		}
	}
	// A handshake takes milliseconds; a pool of an eighth (16..1024) holds the reconnection
	// of a thousand leaves behind one address at once.
	c.pending = min(max(c.total/8, 16), 1024)
	c.perSrc = max(c.pending/2, 4)
	c.auth = c.total - c.pending
	return c
}

// srcShare is how many pending connections one source address may hold: half the pool, or
// all of it when more peers may connect than half the pool holds (a fleet of leaves behind one
// NAT, which reconnects at once after a hub restart). A source at its share makes room only
// among its own connections; with the whole pool, a flood from one address still takes room
// only from itself (it is the source holding most), never from another address's handshakes.
func (c capacity) srcShare(inbound int) int {
	if inbound > c.perSrc {
		return max(c.pending, c.perSrc)
	}
	return c.perSrc
}

// room is how many connections each peer that may connect keeps for itself: one, when the
// budget holds one for each of them, else none (first come, and a warning says so).
func (c capacity) room(inbound int) int {
	if inbound > 0 && inbound <= c.auth {
		return 1
	}
	return 0
}

// shared is the part of the authenticated pool that is nobody's own room.
func (c capacity) shared(inbound int) int { return c.auth - c.room(inbound)*inbound }

// describe is doctor's line about the budget.
func (c capacity) describe(inbound int) string {
	from := fmt.Sprintf("RLIMIT_NOFILE %d", c.nofile)
	if c.flag > 0 {
		from = fmt.Sprintf("--fed-max-conns %d, RLIMIT_NOFILE %d", c.flag, c.nofile)
	}
	return fmt.Sprintf("%d connections (%s): %d before authentication (%d per source address), %d authenticated: %s, %d shared (at most %d per peer)",
		c.total, from, c.pending, c.perSrc, c.auth, c.ownRoom(inbound), c.shared(inbound), maxPerPeer)
}

// ownRoom says what room of their own the peers that may connect keep: what room gives them.
func (c capacity) ownRoom(inbound int) string {
	switch {
	case inbound == 0:
		return "no peer may connect, so none keeps room of its own"
	case c.room(inbound) == 0:
		return fmt.Sprintf("no room of its own for any of the %d peers that may connect (the budget holds fewer; first come, first served)", inbound)
	}
	return fmt.Sprintf("room for %d of its own for each of the %d peers that may connect", c.room(inbound), inbound)
}

// warnings are what the operator must hear at start, at reload and in doctor.
func (c capacity) warnings(inbound int) []string {
	var w []string
	if c.clamped {
		w = append(w, fmt.Sprintf("--fed-max-conns %d is more than RLIMIT_NOFILE %d allows; using %d (raise LimitNOFILE=)", c.flag, c.nofile, c.total))
	}
	if inbound > c.auth {
		w = append(w, fmt.Sprintf("the peers file names %d peers that may connect (leaves and peers with an allow list) but the budget holds %d authenticated connections: some will be answered hub_busy; raise LimitNOFILE= or --fed-max-conns", inbound, c.auth))
	}
	return w
}

// sourceKey is what the per-source bounds count by: the address for IPv4, its /64 for IPv6
// (one host is given a /64 and could otherwise be any number of sources).
func sourceKey(a netip.Addr) netip.Addr {
	if a.Is4() || !a.IsValid() {
		return a
	}
	p, _ := a.Prefix(64)
	return p.Addr()
}
