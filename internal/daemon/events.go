package daemon

import (
	"sync/atomic"
	"time"

	"github.com/xmsg/xmsg/internal/harness"
	"github.com/xmsg/xmsg/internal/ledger"
)

// Bounds of the monitors a tier serves at once, and of the events each may leave unread
// before it loses the oldest (docs/operations.md, "Watching a tier").
const (
	maxMonitors  = 8
	monitorQueue = 4096
)

// events is the daemon's one event stream (ledger.Stream) and its sinks: the audit log,
// the counters behind /metrics, and the monitors. Built once, before the bus.
type events struct {
	stream   *ledger.Stream
	counts   *ledger.Counter
	watchers *ledger.Watchers
	tier     *tier // GET /v1/events and GET /metrics (metrics.go)
	// harnesses bound the harness label; set once the bus is built (setHarnesses).
	harnesses atomic.Pointer[harness.Registry]
}

// setHarnesses bounds the harness label to r's names from now on.
func (e *events) setHarnesses(r *harness.Registry) { e.harnesses.Store(r) }

// buildEvents builds the stream. Harness labels are bounded by the bus's registry and peer
// labels by the peers file, so no sender can grow the counters' series.
func (d *Daemon) buildEvents() *events {
	e := &events{}
	// The bus is built after the stream (it is one of its sources); until then, and for a
	// harness its registry does not know, the label is "other".
	harnessOK := func(h string) bool { r := e.harnesses.Load(); return r != nil && r.Named(h) != nil }
	peerOK := func(p string) bool { return d.fed != nil && d.fed.node != nil && d.fed.node.Known(p) }
	e.counts = ledger.NewCounter(harnessOK, peerOK)
	e.watchers = ledger.NewWatchers(maxMonitors, monitorQueue)
	e.stream = ledger.NewStream(ledger.AuditLog(d.log), e.counts, e.watchers)
	e.tier = &tier{d: d, ev: e, start: time.Now()}
	d.events = e
	return e
}
