package bench

import (
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"
)

// Spread is the median of a figure over the runs and its range.
type Spread struct{ Median, Min, Max float64 }

func spread(v []float64) Spread {
	if len(v) == 0 {
		return Spread{}
	}
	s := append([]float64(nil), v...)
	sort.Float64s(s)
	return Spread{Median: s[len(s)/2], Min: s[0], Max: s[len(s)-1]}
}

func (s Spread) fmt(unit string, prec int) string {
	if s.Min == s.Max {
		return fmt.Sprintf("%.*f%s", prec, s.Median, unit)
	}
	return fmt.Sprintf("%.*f%s (%.*f–%.*f)", prec, s.Median, unit, prec, s.Min, prec, s.Max)
}

// Text writes the result as a table: per path the median over the runs and, with more than
// one run, the range in parentheses.
func (r *Result) Text(w io.Writer) {
	fmt.Fprintf(w, "xmsg bench: daemon %s", r.Daemon)
	if r.DaemonPID != 0 {
		fmt.Fprintf(w, " (pid %d)", r.DaemonPID)
	}
	fmt.Fprintf(w, ", %d-byte messages, %d run(s), %d CPUs; median (min–max over runs)\n", r.Size, len(r.Runs), r.CPUs)
	col := func(get func(Run) float64) Spread {
		var v []float64
		for _, run := range r.Runs {
			v = append(v, get(run))
		}
		return spread(v)
	}
	fmt.Fprintf(w, "baselines, same runs: fsync p50 %s, bbolt commit p50 %s, process round trip p50 %s\n"+
		"(a latency path's ratios are to the commits and fsyncs taken between its own sends: its commit p50;\n"+
		"machine CPU/op is every process's, so ops/s cannot exceed CPUs × 1 s / machine CPU/op)\n\n",
		col(func(x Run) float64 { return x.FsyncP50us }).fmt(" µs", 0), col(func(x Run) float64 { return x.CommitP50us }).fmt(" µs", 0),
		col(func(x Run) float64 { return x.RTTP50us }).fmt(" µs", 0))
	// The leaf path through leaves adds their CPU: a column only such a result has.
	leafCPU := false
	for _, run := range r.Runs {
		for _, f := range run.Figures {
			leafCPU = leafCPU || f.LeafCPUus > 0
		}
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	header := "path\tp50\tp99\tx commit\tx fsync\tits commit p50\tops/s\tdaemon CPU/op\tmachine CPU/op\t"
	if leafCPU {
		header += "leaf CPU/op\t"
	}
	fmt.Fprintln(tw, header)
	if len(r.Runs) == 0 {
		tw.Flush()
		return
	}
	for i, f0 := range r.Runs[0].Figures {
		fig := func(get func(Figure) float64) Spread {
			var v []float64
			for _, run := range r.Runs {
				if i < len(run.Figures) {
					v = append(v, get(run.Figures[i]))
				}
			}
			return spread(v)
		}
		cell := func(get func(Figure) float64, unit string, prec int) string {
			s := fig(get)
			if s.Max == 0 {
				return "-"
			}
			return s.fmt(unit, prec)
		}
		name := f0.Path
		if r := fig(func(f Figure) float64 { return float64(f.Refused) }); r.Max > 0 {
			name += " [" + r.fmt(" refused", 0) + ", retried]"
		}
		if r := fig(func(f Figure) float64 { return float64(f.Duplicates) }); r.Max > 0 {
			name += " [" + r.fmt(" delivered twice", 0) + "]"
		}
		last := ""
		if leafCPU {
			last = cell(func(f Figure) float64 { return f.LeafCPUus }, " µs", 0) + "\t"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", name,
			cell(func(f Figure) float64 { return f.P50us }, " µs", 0),
			cell(func(f Figure) float64 { return f.P99us }, " µs", 0),
			cell(func(f Figure) float64 { return f.XCommit }, "x", 2),
			cell(func(f Figure) float64 { return f.XFsync }, "x", 2),
			cell(func(f Figure) float64 { return f.CommitP50us }, " µs", 0),
			cell(func(f Figure) float64 { return f.PerSec }, "", 0),
			cell(func(f Figure) float64 { return f.CPUus }, " µs", 0),
			cell(func(f Figure) float64 { return f.MachineCPUus }, " µs", 0), last)
	}
	tw.Flush()
	if len(r.Runs[0].Growth) > 0 {
		fmt.Fprintln(w, "\ngrowth (p50 with more state / p50 with less, the commit drift between the two taken out; as measured in brackets):")
		for i, g := range r.Runs[0].Growth {
			var v, raw []float64
			for _, run := range r.Runs {
				if i < len(run.Growth) {
					v, raw = append(v, run.Growth[i].Ratio), append(raw, run.Growth[i].RawRatio)
				}
			}
			fmt.Fprintf(w, "  %s: %s [%s]\n", g.Name, strings.TrimSpace(spread(v).fmt("x", 2)), strings.TrimSpace(spread(raw).fmt("x", 2)))
		}
	}
	writeGoals(w, r.Goals)
}
