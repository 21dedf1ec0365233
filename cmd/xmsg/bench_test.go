//go:build linux

package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestBenchSmoke runs `xmsg bench` with tiny counts: every path runs against a real daemon
// in its own process with child sessions and services, and the JSON has every figure. No
// timing is asserted.
func TestBenchSmoke(t *testing.T) {
	cmd := xmsgCmd(nil, "bench", "--count", "10", "--clients", "2", "--services", "2", "--stale", "20", "--runs", "1", "--json")
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("bench: %v\n%s", err, stderr.String())
	}
	var res struct {
		DaemonPID int `json:"daemon_pid"`
		CPUs      int `json:"cpus"`
		Runs      []struct {
			FsyncP50  float64 `json:"fsync_p50_us"`
			CommitP50 float64 `json:"commit_p50_us"`
			Figures   []struct {
				Path      string  `json:"path"`
				Kind      string  `json:"kind"`
				N         int     `json:"n"`
				PerSec    float64 `json:"per_sec"`
				P50       float64 `json:"p50_us"`
				XCommit   float64 `json:"x_commit"`
				CommitP50 float64 `json:"commit_p50_us"`
			} `json:"figures"`
			Growth []struct {
				Name     string  `json:"name"`
				Ratio    float64 `json:"ratio"`
				RawRatio float64 `json:"raw_ratio"`
			} `json:"growth"`
		} `json:"runs"`
		Goals []benchGoal `json:"goals"`
	}
	if err := json.Unmarshal(out, &res); err != nil {
		t.Fatalf("not JSON: %v\n%s", err, out)
	}
	if res.DaemonPID == 0 || res.CPUs <= 0 || len(res.Runs) != 1 {
		t.Fatalf("result = %s", out)
	}
	r := res.Runs[0]
	if r.FsyncP50 <= 0 || r.CommitP50 <= 0 || len(r.Growth) != 2 {
		t.Errorf("baselines or growth missing: %s", out)
	}
	for _, g := range r.Growth {
		if g.Ratio <= 0 || g.RawRatio <= 0 {
			t.Errorf("growth %q: ratio %v, raw %v", g.Name, g.Ratio, g.RawRatio)
		}
	}
	paths, kinds := map[string]bool{}, map[string]bool{}
	for _, f := range r.Figures {
		paths[f.Path] = true
		if f.N <= 0 || f.PerSec <= 0 {
			t.Errorf("figure %q empty: %+v", f.Path, f)
		}
		if f.Kind == "" || kinds[f.Kind] {
			t.Errorf("figure %q: kind %q (none, or another figure's)", f.Path, f.Kind)
		}
		kinds[f.Kind] = true
		// A latency path's ratio is to the commits taken between its own sends.
		if f.P50 > 0 && (f.CommitP50 <= 0 || math.Abs(f.XCommit-f.P50/f.CommitP50) > 1e-9) {
			t.Errorf("figure %q: x commit %v, want p50 %v / its own commit p50 %v", f.Path, f.XCommit, f.P50, f.CommitP50)
		}
	}
	for _, want := range []string{"1 client -> claude (http)", "1 client -> claude (agent.sock)", "2 clients -> claude (http)",
		"1 client -> svc (http), 1 registered", "1 consumer drains, 2 senders", "1 consumer drains in batches, 2 senders", "1 client -> svc (http), 2 registered", "2 clients -> 2 services, 2 consumers"} {
		if !paths[want] {
			t.Errorf("no figure for %q in %v", want, paths)
		}
	}
	if !strings.Contains(stderr.String(), "run 1/1: ") {
		t.Errorf("no progress on stderr: %q", stderr.String())
	}
	// Every local goal has its figure: the one-client paths', the throughput paths' and the
	// two growth ratios; the two of daemon CPU too unless it read zero (a clock tick is 10 ms,
	// longer than some of these tiny paths take).
	checkGoals(t, res.Goals, 8, 10)
}

// benchGoal is a goal's figure in `xmsg bench --json`.
type benchGoal struct {
	Name    string  `json:"name"`
	Limit   float64 `json:"limit"`
	Median  float64 `json:"median"`
	Min     float64 `json:"min"`
	Max     float64 `json:"max"`
	Runs    int     `json:"runs"`
	Verdict string  `json:"verdict"`
}

// checkGoals: a result speaks to between least and most goals, each with a figure of its one
// run and a verdict.
func checkGoals(t *testing.T, goals []benchGoal, least, most int) {
	t.Helper()
	if len(goals) < least || len(goals) > most {
		t.Errorf("%d goals, want %d to %d: %+v", len(goals), least, most, goals)
	}
	for _, g := range goals {
		if g.Runs != 1 || g.Median <= 0 || g.Min != g.Median || g.Max != g.Median || g.Limit <= 0 {
			t.Errorf("goal %q: %+v", g.Name, g)
		}
		if v := g.Verdict; v != "met" && v != "not met" {
			t.Errorf("goal %q: verdict %q of one run", g.Name, v)
		}
	}
}

// TestBenchOnly: --only runs the paths whose name holds its text, and a growth figure only
// when both of its paths ran; one that matches no path is a usage error, not an empty result.
// Mutants tried: the filter ignored (red: every path); a growth figure with one of its paths
// missing (red: the bench fails on a ratio over 0).
func TestBenchOnly(t *testing.T) {
	for _, c := range []struct {
		only   string
		paths  []string
		growth int
	}{
		{"registered", []string{"1 client -> svc (http), 1 registered", "1 client -> svc (http), 2 registered"}, 1},
		{"2 registered", []string{"1 client -> svc (http), 2 registered"}, 0},
		{"agent.sock", []string{"1 client -> claude (agent.sock)"}, 0},
	} {
		out, err := xmsgCmd(nil, "bench", "--only", c.only, "--count", "10", "--clients", "2", "--services", "2", "--stale", "20", "--runs", "1", "--json", "--quiet").Output()
		if err != nil {
			t.Fatalf("bench --only %q: %v", c.only, err)
		}
		var res struct {
			Runs []struct {
				Figures []struct{ Path string } `json:"figures"`
				Growth  []struct{ Name string } `json:"growth"`
			} `json:"runs"`
		}
		if err := json.Unmarshal(out, &res); err != nil || len(res.Runs) != 1 {
			t.Fatalf("bench --only %q: %v\n%s", c.only, err, out)
		}
		var got []string
		for _, f := range res.Runs[0].Figures {
			got = append(got, f.Path)
		}
		if strings.Join(got, "|") != strings.Join(c.paths, "|") || len(res.Runs[0].Growth) != c.growth {
			t.Errorf("bench --only %q: paths %q, %d growth figures; want %q, %d", c.only, got, len(res.Runs[0].Growth), c.paths, c.growth)
		}
	}
	cmd := xmsgCmd(nil, "bench", "--only", "no such path", "--count", "10", "--clients", "2", "--services", "2", "--stale", "20", "--runs", "1", "--quiet")
	var stderr strings.Builder
	cmd.Stderr = &stderr
	code := exitCode(cmd.Run())
	if code != 2 || !strings.Contains(stderr.String(), `--only "no such path" matches no path`) {
		t.Errorf("bench --only matching nothing: exit %d, %q; want 2 and the reason", code, stderr.String())
	}
}

// exitCode is a command's exit status from its Run or Wait error: 0 for none, -1 for an error
// that is not an exit.
func exitCode(err error) int {
	if err == nil {
		return 0
	}
	if ee, ok := err.(interface{ ExitCode() int }); ok {
		return ee.ExitCode()
	}
	return -1
}

// TestBenchInterruptLeavesNothing stops a running `xmsg bench` with SIGTERM: its daemon and
// its child sessions end with it, and its temporary directory is removed (an interrupted
// bench used to leave its daemon running).
func TestBenchInterruptLeavesNothing(t *testing.T) {
	tmp := shortTemp(t)
	cmd := xmsgCmd([]string{"TMPDIR=" + tmp}, "bench", "--count", "1000000", "--clients", "2", "--services", "2", "--stale", "20", "--runs", "1")
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	// The first progress line of the run: the daemon and every child are running.
	sc := bufio.NewScanner(stderr)
	for sc.Scan() && !strings.Contains(sc.Text(), "run 1/1: baselines") {
	}
	kids := childPIDs(t, cmd.Process.Pid)
	t.Cleanup(func() { // should the test fail, leave no process of its bench behind
		for _, pid := range kids {
			syscall.Kill(pid, syscall.SIGKILL)
		}
	})
	if len(kids) < 3 {
		t.Fatalf("bench has %d child processes, want the daemon and its sessions", len(kids))
	}
	cmd.Process.Signal(syscall.SIGTERM)
	go io.Copy(io.Discard, stderr)
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	select {
	case err := <-exited:
		if err == nil {
			t.Error("an interrupted bench exited 0")
		}
	case <-time.After(time.Minute): // a hang guard, not a timing: stopping takes well under a second
		cmd.Process.Kill()
		t.Fatal("bench did not end after SIGTERM")
	}
	for _, pid := range kids {
		if err := syscall.Kill(pid, 0); err != syscall.ESRCH {
			raw, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
			t.Errorf("child %d (%q) survived the bench: %v", pid, raw, err)
		}
	}
	if left, _ := os.ReadDir(tmp); len(left) != 0 {
		t.Errorf("bench left %v in its TMPDIR", left)
	}
}

// childPIDs lists the processes whose parent is pid.
func childPIDs(t *testing.T, pid int) []int {
	t.Helper()
	ents, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	var kids []int
	for _, e := range ents {
		n, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		raw, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		// The fields after the command (which may hold spaces) start after the last ')'.
		f := strings.Fields(string(raw[strings.LastIndexByte(string(raw), ')')+1:]))
		if len(f) > 1 && f[1] == strconv.Itoa(pid) {
			kids = append(kids, n)
		}
	}
	return kids
}
