//go:build linux

package main

import (
	"encoding/json"
	"strings"
	"testing"
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
		Runs      []struct {
			FsyncP50  float64 `json:"fsync_p50_us"`
			CommitP50 float64 `json:"commit_p50_us"`
			Figures   []struct {
				Path   string  `json:"path"`
				N      int     `json:"n"`
				PerSec float64 `json:"per_sec"`
			} `json:"figures"`
			Growth []struct {
				Ratio float64 `json:"ratio"`
			} `json:"growth"`
		} `json:"runs"`
	}
	if err := json.Unmarshal(out, &res); err != nil {
		t.Fatalf("not JSON: %v\n%s", err, out)
	}
	if res.DaemonPID == 0 || len(res.Runs) != 1 {
		t.Fatalf("result = %s", out)
	}
	r := res.Runs[0]
	if r.FsyncP50 <= 0 || r.CommitP50 <= 0 || len(r.Growth) != 2 {
		t.Errorf("baselines or growth missing: %s", out)
	}
	paths := map[string]bool{}
	for _, f := range r.Figures {
		paths[f.Path] = true
		if f.N <= 0 || f.PerSec <= 0 {
			t.Errorf("figure %q empty: %+v", f.Path, f)
		}
	}
	for _, want := range []string{"1 client -> claude (http)", "1 client -> claude (agent.sock)", "2 clients -> claude (http)",
		"1 client -> svc (http), 1 registered", "1 consumer drains, 2 senders", "1 client -> svc (http), 2 registered", "2 clients -> 2 services, 2 consumers"} {
		if !paths[want] {
			t.Errorf("no figure for %q in %v", want, paths)
		}
	}
	if !strings.Contains(stderr.String(), "run 1/1: ") {
		t.Errorf("no progress on stderr: %q", stderr.String())
	}
}
