package fed

import (
	"fmt"
	"strings"
	"time"
)

// StartReload re-reads the credentials and the peers file every cfg.ReloadInterval (0: never).
func (n *Node) StartReload() {
	if n.cfg.ReloadInterval <= 0 {
		n.book.setReload("off (--fed-reload-interval-secs 0)")
		return
	}
	n.book.setReload(fmt.Sprintf("every %s, no change yet", n.cfg.ReloadInterval))
	n.wg.Add(1)
	go func() {
		defer n.wg.Done()
		t := time.NewTicker(n.cfg.ReloadInterval)
		defer t.Stop()
		for {
			select {
			case <-n.stop:
				return
			case <-t.C:
				n.Reload()
			}
		}
	}()
}

// Reload reads everything again. A valid change is swapped in for new connections (and the
// idle outbound ones are closed, so the next call uses it); invalid material is logged by
// name (never its content) and the current snapshot is kept. It reports whether it swapped.
func (n *Node) Reload() (bool, error) {
	n.reloadMu.Lock()
	defer n.reloadMu.Unlock()
	cur := n.st.Load()
	when := time.Now().UTC().Format(time.RFC3339)
	// Stat, then read and hash, before parsing: an unchanged peers file (a thousand peers,
	// every second) costs a few stat calls, a file whose stamp moved is compared as bytes,
	// and only a changed one is parsed.
	stamps, stamped := n.stampInputs(cur)
	if stamped && n.sameStamps(stamps) {
		return false, nil
	}
	n.reads.Add(1)
	in, err := readInputs(n.cfg)
	if err == nil && n.unchanged(in, cur) {
		if stamped {
			n.stamps, n.stampedAt = stamps, time.Now()
		}
		return false, nil
	}
	n.stamps = nil // taken before this read, they may not describe what is swapped in
	var next *state
	if err != nil {
		err = fmt.Errorf("fed: %w", err)
	} else {
		in.cas = map[string][]byte{}
		next, err = n.build(in)
	}
	if err != nil {
		n.cfg.Log.Error("fed reload refused; keeping the current credentials and peers", "err", err)
		n.book.setReload(fmt.Sprintf("every %s, last attempt %s REFUSED (kept the previous config): %s", n.cfg.ReloadInterval, when, oneLine(err.Error())))
		return false, err
	}
	if next.hash == cur.hash {
		return false, nil
	}
	before := map[uint16]bool{}
	for _, p := range n.Ports() {
		before[p] = true
	}
	n.st.Store(next)
	n.transport.CloseIdleConnections()
	// The sandbox allowed connects to the ports known at start; Landlock rules cannot be
	// added later, so a peer on a new port stays unreachable until a restart. Say so.
	for _, p := range n.Ports() {
		if !before[p] && n.startPorts != nil && !n.startPorts[p] {
			n.cfg.Log.Warn("fed reload: a peer uses a port the sandbox did not allow at start; it is unreachable until a restart", "port", p)
		}
	}
	n.cfg.Log.Info("fed reloaded", "pin", next.pin, "peers", len(next.peers.names))
	n.warnCapacity(next)
	n.book.setReload(fmt.Sprintf("every %s, last change %s applied", n.cfg.ReloadInterval, when))
	return true, nil
}

// Handshakes are the handshakes counted so far, and whether each peer's last one in each
// direction succeeded (its "up"), for metrics. Peers are the configured ones and
// "(unknown)": bounded by the peers file.
func (n *Node) Handshakes() (counts map[HandshakeKey]uint64, up map[HandshakeKey]bool) {
	n.book.mu.Lock()
	defer n.book.mu.Unlock()
	counts, up = map[HandshakeKey]uint64{}, map[HandshakeKey]bool{}
	for k, v := range n.book.tally {
		counts[k] = v
	}
	for k, line := range n.book.handshakes {
		peer, dir, _ := strings.Cut(k, " ")
		up[HandshakeKey{Peer: peer, Direction: dir}] = strings.HasPrefix(line, "ok")
	}
	return counts, up
}

// ListenerCounts are the federation listener's connections refused for capacity and evicted
// to make room since start; ok is false without a listener. Both happen before a handshake,
// so no peer is known for them.
func (n *Node) ListenerCounts() (refused, evicted uint64, ok bool) {
	lst := n.lst.Load()
	if lst == nil {
		return 0, 0, false
	}
	return uint64(lst.refused.Load()), uint64(lst.evicted.Load()), true
}

// DoctorLines describes the federation for `xmsg doctor`: the listener, our pin, each peer
// (name, trust, pin or CA identities, allow list, last handshakes) and the reload state.
func (n *Node) DoctorLines() []string {
	st := n.st.Load()
	var l []string
	if n.cfg.Listen != "" {
		l = append(l, "federation listener: "+n.cfg.Listen+" (mTLS, TLS 1.3 only, client certificate required)")
	} else {
		l = append(l, "federation listener: none (outbound only)")
	}
	l = append(l, "federation certificate: "+st.pin+" (from "+string(st.source)+")")
	for _, p := range st.peers.All() {
		trust := "pin " + p.PinString()
		if p.Pin == nil {
			trust = "ca " + p.CAFile + " identities " + strings.Join(p.Identities, ",")
		}
		allow := strings.Join(p.AllowList(), ",")
		if allow == "" {
			allow = "none (outbound only)"
		}
		extra := ""
		if p.Leaf {
			extra = " leaf"
		}
		l = append(l, fmt.Sprintf("federation peer %s%s: address %s, %s, allow %s; last inbound handshake: %s; last outbound handshake: %s",
			p.Name, extra, p.Address, trust, allow, n.book.get(p.Name, "inbound"), n.book.get(p.Name, "outbound")))
	}
	if n.cfg.Listen != "" {
		l = append(l, "federation capacity: "+n.cap.describe(st.peers.inbound))
		for _, w := range n.cap.warnings(st.peers.inbound) {
			l = append(l, "federation capacity WARNING: "+w)
		}
		if lst := n.lst.Load(); lst != nil {
			l = append(l, "federation connections: "+lst.stats())
		}
	}
	if s := n.book.get("(unknown)", "inbound"); s != "none yet" {
		l = append(l, "federation unknown certificates: last inbound handshake: "+s)
	}
	l = append(l, fmt.Sprintf("federation outbound handshakes: %d (kept-alive connections are reused; a reload closes the idle ones)", n.dials.Load()))
	r := n.book.getReload()
	if r == "" {
		r = "not started"
	}
	l = append(l, "federation reload: "+r)
	return l
}
