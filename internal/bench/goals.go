package bench

import (
	"fmt"
	"io"
	"strings"
)

// PathKind says what a measured path measures, whatever the options made of its name (the
// client and service counts are in it): the goals find their figures by it.
type PathKind string

const (
	ClaudeOne     PathKind = "claude-one"      // 1 client -> claude (http)
	AgentOne      PathKind = "agent-one"       // 1 client -> claude (agent.sock)
	ClaudeMany    PathKind = "claude-many"     // N clients -> claude (http)
	ClaudeStale   PathKind = "claude-stale"    // 1 client -> claude, with many stale session files
	SvcOne        PathKind = "svc-one"         // 1 client -> svc, 1 registered
	DrainFew      PathKind = "drain-few"       // 1 consumer drains, up to 8 senders
	DrainAll      PathKind = "drain-all"       // 1 consumer drains, every client sending
	DrainBatch    PathKind = "drain-batch"     // 1 consumer drains in batches, up to 8 senders
	DrainBatchAll PathKind = "drain-batch-all" // 1 consumer drains in batches, every client sending
	SvcRegistered PathKind = "svc-registered"  // 1 client -> svc, many registered
	SvcMany       PathKind = "svc-many"        // N clients -> N services, N consumers
	HubSvcOne     PathKind = "hub-svc-one"     // the leaf bench: 1 client -> svc on the hub, one at a time
	LeafOne       PathKind = "leaf-one"        // 1 client -> hub -> leaf -> svc, one at a time
	HubDrain      PathKind = "hub-drain"       // 1 consumer drains on the hub
	LeafDrain     PathKind = "leaf-drain"      // hub -> leaf -> svc, 1 consumer drains
	LeavesDrain   PathKind = "leaves-drain"    // hub -> N leaves -> svc on each
)

// goal is one of the project's performance goals (docs/performance.md §2) as a figure of
// one run: a ratio to another figure of the same run, or to its baselines, where it can be.
type goal struct {
	Name string
	// Limit is the most the figure may be; with AtLeast, the least.
	Limit   float64
	AtLeast bool
	Unit    string // appended to the figure ("x", " µs", "/s")
	Prec    int    // decimals shown
	of      func(Run) (float64, bool)
}

// allGoals are the goals a bench result can speak to; a result speaks only to those whose
// paths it ran.
var allGoals = []goal{
	{Name: "1 client -> claude (http): p50 ≤ 1.5x a commit", Limit: 1.5, Unit: "x", Prec: 2, of: xCommit(ClaudeOne)},
	{Name: "1 client -> claude (agent.sock): p50 ≤ 1.5x a commit", Limit: 1.5, Unit: "x", Prec: 2, of: xCommit(AgentOne)},
	{Name: "1 client -> svc, 1 registered: p50 ≤ 1.5x a commit", Limit: 1.5, Unit: "x", Prec: 2, of: xCommit(SvcOne)},
	{Name: "1 client -> svc, many registered: p50 ≤ 1.5x a commit", Limit: 1.5, Unit: "x", Prec: 2, of: xCommit(SvcRegistered)},
	{Name: "many clients -> claude: daemon CPU per send ≤ 80 µs", Limit: 80, Unit: " µs", of: daemonCPU(ClaudeMany)},
	{Name: "a service message drained costs ≤ a send to a session (daemon CPU: many services / many clients -> claude)", Limit: 1, Unit: "x", Prec: 2, of: ratio(daemonCPU(SvcMany), daemonCPU(ClaudeMany))},
	{Name: "a service message drained in batches costs ≤ a send to a session (daemon CPU: batches with every client sending / many clients -> claude)", Limit: 1, Unit: "x", Prec: 2, of: ratio(daemonCPU(DrainBatchAll), daemonCPU(ClaudeMany))},
	{Name: "one consumer drains ≥ 4,000 msg/s (few senders)", Limit: 4000, AtLeast: true, Unit: "/s", of: perSec(DrainFew)},
	{Name: "many services with a consumer each ≥ 4,000 sends/s", Limit: 4000, AtLeast: true, Unit: "/s", of: perSec(SvcMany)},
	{Name: "many stale session files ≤ 1.2x the send latency of few", Limit: 1.2, Unit: "x", Prec: 2, of: growthOf(ClaudeStale)},
	{Name: "many registered services ≤ 1.2x the send latency of one", Limit: 1.2, Unit: "x", Prec: 2, of: growthOf(SvcRegistered)},
	{Name: "hub -> leaf -> svc one at a time ≤ 3x a commit", Limit: 3, Unit: "x", Prec: 2, of: xCommit(LeafOne)},
	{Name: "one leaf drains ≥ 0.8x the same service on the hub (msg/s)", Limit: 0.8, AtLeast: true, Unit: "x", Prec: 2, of: ratio(perSec(LeafDrain), perSec(HubDrain))},
	{Name: "many leaves: the hub's CPU per leaf message ≤ 2x its own service's", Limit: 2, Unit: "x", Prec: 2, of: ratio(daemonCPU(LeavesDrain), daemonCPU(HubDrain))},
	{Name: "many leaves: the leaves' CPU per message ≤ 2x the hub's own service's", Limit: 2, Unit: "x", Prec: 2, of: ratio(leafCPU(LeavesDrain), daemonCPU(HubDrain))},
}

// GoalFigure is a goal's figure over a result's runs (those that ran its paths).
type GoalFigure struct {
	Name    string  `json:"name"`
	Limit   float64 `json:"limit"`
	AtLeast bool    `json:"at_least,omitempty"`
	Median  float64 `json:"median"`
	Min     float64 `json:"min"`
	Max     float64 `json:"max"`
	Runs    int     `json:"runs"`
	Verdict Verdict `json:"verdict"`
	unit    string
	prec    int
}

// Verdict is what a goal's figures say of it.
type Verdict string

const (
	Met         Verdict = "met"               // in every run
	MetAtMedian Verdict = "met at the median" // some runs not
	NotMet      Verdict = "not met"           // not at the median
)

// meets reports whether v is within the goal.
func (g goal) meets(v float64) bool {
	if g.AtLeast {
		return v >= g.Limit
	}
	return v <= g.Limit
}

// goals returns the figure of every goal the runs speak to.
func goals(runs []Run) []GoalFigure {
	var out []GoalFigure
	for _, g := range allGoals {
		var v []float64
		for _, r := range runs {
			if x, ok := g.of(r); ok {
				v = append(v, x)
			}
		}
		if len(v) == 0 {
			continue
		}
		s := spread(v)
		gf := GoalFigure{Name: g.Name, Limit: g.Limit, AtLeast: g.AtLeast, Median: s.Median, Min: s.Min, Max: s.Max, Runs: len(v), unit: g.Unit, prec: g.Prec}
		worst := s.Max
		if g.AtLeast {
			worst = s.Min
		}
		switch {
		case g.meets(worst):
			gf.Verdict = Met
		case g.meets(s.Median):
			gf.Verdict = MetAtMedian
		default:
			gf.Verdict = NotMet
		}
		out = append(out, gf)
	}
	return out
}

// writeGoals writes the goals' lines of a result's text.
func writeGoals(w io.Writer, gs []GoalFigure) {
	if len(gs) == 0 {
		return
	}
	fmt.Fprintln(w, "\ngoals (docs/performance.md §2; each a figure of one run, median and range over the runs):")
	for _, g := range gs {
		s := Spread{Median: g.Median, Min: g.Min, Max: g.Max}
		fmt.Fprintf(w, "  %s: %s: %s\n", g.Name, strings.TrimSpace(s.fmt(g.unit, g.prec)), g.Verdict)
	}
}

// figure returns the run's figure of kind k.
func (r Run) figure(k PathKind) (Figure, bool) {
	for _, f := range r.Figures {
		if f.Kind == k {
			return f, true
		}
	}
	return Figure{}, false
}

// measured is one figure of path k in a run; false when the run has no such path, or the
// figure is zero (not measured).
func measured(k PathKind, get func(Figure) float64) func(Run) (float64, bool) {
	return func(r Run) (float64, bool) {
		f, ok := r.figure(k)
		v := get(f)
		return v, ok && v > 0
	}
}

func xCommit(k PathKind) func(Run) (float64, bool) {
	return measured(k, func(f Figure) float64 { return f.XCommit })
}

func daemonCPU(k PathKind) func(Run) (float64, bool) {
	return measured(k, func(f Figure) float64 { return f.CPUus })
}

func leafCPU(k PathKind) func(Run) (float64, bool) {
	return measured(k, func(f Figure) float64 { return f.LeafCPUus })
}

func perSec(k PathKind) func(Run) (float64, bool) {
	return measured(k, func(f Figure) float64 { return f.PerSec })
}

// ratio is a's figure over b's, both of the same run.
func ratio(a, b func(Run) (float64, bool)) func(Run) (float64, bool) {
	return func(r Run) (float64, bool) {
		x, ok1 := a(r)
		y, ok2 := b(r)
		return x / y, ok1 && ok2
	}
}

// growthOf is the growth ratio whose larger path is of kind k.
func growthOf(k PathKind) func(Run) (float64, bool) {
	return func(r Run) (float64, bool) {
		for _, g := range r.Growth {
			if g.Kind == k {
				return g.Ratio, true
			}
		}
		return 0, false
	}
}
