package bench

import (
	"bytes"
	"strings"
	"testing"
)

// TestGoals: a goal's figure comes from its own paths in each run, by kind and not by name
// (a figure without a kind is no goal's);
// a ratio needs both of its figures in the same run; a goal none of whose runs has its
// figures is left out; and the verdict reads the worst run for "met", the median for "met at
// the median", either way for a goal with a floor (AtLeast).
func TestGoals(t *testing.T) {
	run := func(claudeX, svcCPU, claudeCPU, leafRate, hubRate float64) Run {
		return Run{Figures: []Figure{
			{Path: "a figure of a result from before kinds", XCommit: 9, CPUus: 9, PerSec: 9},
			{Path: "named as the options say", Kind: ClaudeOne, XCommit: claudeX},
			{Kind: SvcMany, CPUus: svcCPU},
			{Kind: ClaudeMany, CPUus: claudeCPU},
			{Kind: LeafDrain, PerSec: leafRate},
			{Kind: HubDrain, PerSec: hubRate},
		}, Growth: []Growth{{Name: "stale", Kind: ClaudeStale, Ratio: 1.1}}}
	}
	runs := []Run{
		run(1.4, 90, 100, 900, 1000),
		run(1.6, 110, 100, 700, 1000),
		run(1.45, 120, 100, 850, 1000),
	}
	byName := map[string]GoalFigure{}
	for _, g := range goals(runs) {
		byName[g.Name] = g
	}
	for _, c := range []struct {
		name          string
		median, worst float64
		verdict       Verdict
	}{
		{"1 client -> claude (http): p50 ≤ 1.5x a commit", 1.45, 1.6, MetAtMedian},
		{"a service message drained costs ≤ a send to a session (daemon CPU: many services / many clients -> claude)", 1.1, 1.2, NotMet},
		{"one leaf drains ≥ 0.8x the same service on the hub (msg/s)", 0.85, 0.7, MetAtMedian},
		{"many stale session files ≤ 1.2x the send latency of few", 1.1, 1.1, Met},
	} {
		g, ok := byName[c.name]
		if !ok {
			t.Errorf("no goal %q in %v", c.name, byName)
			continue
		}
		worst := g.Max
		if g.AtLeast {
			worst = g.Min
		}
		if !near(g.Median, c.median) || !near(worst, c.worst) || g.Verdict != c.verdict || g.Runs != 3 {
			t.Errorf("%s: median %v worst %v verdict %q over %d runs, want %v %v %q over 3", c.name, g.Median, worst, g.Verdict, g.Runs, c.median, c.worst, c.verdict)
		}
	}
	if len(byName) != 5 { // and the many clients' CPU per send
		t.Errorf("goals without their figures in the runs were given: %v", byName)
	}
	// A ratio's two figures must come from the same run.
	split := []Run{{Figures: []Figure{{Kind: LeafDrain, PerSec: 900}}}, {Figures: []Figure{{Kind: HubDrain, PerSec: 1000}}}}
	if gs := goals(split); len(gs) != 0 {
		t.Errorf("a ratio made of two runs' figures: %+v", gs)
	}
	// A figure that reads zero was not measured (daemon CPU of a daemon not our own).
	if gs := goals([]Run{{Figures: []Figure{{Kind: ClaudeMany}, {Kind: SvcMany}}}}); len(gs) != 0 {
		t.Errorf("goals of figures not measured: %+v", gs)
	}
	// A floor met in every run.
	if gs := goals([]Run{run(1, 1, 1, 900, 1000)}); !hasVerdict(gs, "one leaf drains ≥ 0.8x the same service on the hub (msg/s)", Met) {
		t.Errorf("a floor met in the one run: %+v", gs)
	}
	var text bytes.Buffer
	(&Result{Runs: runs, Goals: goals(runs)}).Text(&text)
	if !strings.Contains(text.String(), "  1 client -> claude (http): p50 ≤ 1.5x a commit: 1.45x (1.40–1.60): met at the median\n") {
		t.Errorf("text:\n%s", text.String())
	}
}

func near(a, b float64) bool { return a-b < 1e-9 && b-a < 1e-9 }

func hasVerdict(gs []GoalFigure, name string, v Verdict) bool {
	for _, g := range gs {
		if g.Name == name {
			return g.Verdict == v
		}
	}
	return false
}
