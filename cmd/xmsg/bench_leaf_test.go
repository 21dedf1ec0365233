//go:build linux

package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestBenchLeafSmoke runs `xmsg bench --leaf` with tiny counts: a hub and a leaf daemon of
// its own, each in its own process, and every leaf-path figure in the JSON. No timing is
// asserted.
func TestBenchLeafSmoke(t *testing.T) {
	cmd := xmsgCmd(nil, "bench", "--leaf", "--leaves", "2", "--count", "20", "--clients", "2", "--runs", "1", "--json")
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("bench --leaf: %v\n%s", err, stderr.String())
	}
	var res struct {
		Runs []struct {
			CommitP50 float64 `json:"commit_p50_us"`
			Figures   []struct {
				Path   string  `json:"path"`
				N      int     `json:"n"`
				PerSec float64 `json:"per_sec"`
				P50    float64 `json:"p50_us"`
			} `json:"figures"`
		} `json:"runs"`
		Goals []benchGoal `json:"goals"`
	}
	if err := json.Unmarshal(out, &res); err != nil || len(res.Runs) != 1 {
		t.Fatalf("not the result: %v\n%s", err, out)
	}
	paths := map[string]bool{}
	for _, f := range res.Runs[0].Figures {
		paths[f.Path] = true
		if f.N <= 0 || f.PerSec <= 0 || f.P50 <= 0 {
			t.Errorf("figure %q empty: %+v", f.Path, f)
		}
	}
	for _, want := range []string{"1 client -> svc on the hub (http), one at a time", "1 client -> hub -> leaf -> svc, one at a time",
		"1 consumer drains on the hub, 2 senders", "hub -> leaf -> svc, 1 consumer drains, 2 senders", "hub -> 2 leaves -> svc on each, 2 senders"} {
		if !paths[want] {
			t.Errorf("no figure for %q in %v", want, paths)
		}
	}
	if res.Runs[0].CommitP50 <= 0 {
		t.Errorf("no baselines: %s", out)
	}
	// The leaf goals: the trip one at a time, one leaf's drain, and (unless a CPU figure of
	// these tiny paths read zero) the hub's and the leaves' CPU through many leaves.
	checkGoals(t, res.Goals, 2, 4)
}

// TestBenchLeafState: --leaf-state DIR puts the leaves' stores in DIR (seen there while the
// bench runs), says so in the result, and leaves nothing behind; without --leaf, or with a
// DIR that is not a directory, it is a usage error. Mutant tried: the leaves' stores left
// beside the hub's (red: none seen in DIR).
func TestBenchLeafState(t *testing.T) {
	dir := t.TempDir()
	cmd := xmsgCmd(nil, "bench", "--leaf", "--leaf-state", dir, "--count", "20", "--clients", "2", "--runs", "1", "--only", "drains", "--json")
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	seen := false
	var err error
wait:
	for {
		if m, _ := filepath.Glob(filepath.Join(dir, "xmsg-bench-leaves*", "leaf.db")); len(m) > 0 {
			seen = true
		}
		select {
		case err = <-done:
			break wait
		case <-time.After(5 * time.Millisecond):
		}
	}
	if err != nil {
		t.Fatalf("bench --leaf --leaf-state: %v\n%s", err, stderr.String())
	}
	if !seen {
		t.Error("no leaf store seen in --leaf-state's directory while the bench ran")
	}
	var res struct{ Daemon string }
	if err := json.Unmarshal([]byte(stdout.String()), &res); err != nil || !strings.Contains(res.Daemon, "the leaves' stores in "+dir) {
		t.Errorf("the result does not say where the leaves' stores were: %q (%v)", res.Daemon, err)
	}
	if left, _ := os.ReadDir(dir); len(left) != 0 {
		t.Errorf("left behind in --leaf-state's directory: %v", left)
	}
	file := filepath.Join(dir, "file")
	os.WriteFile(file, nil, 0o600)
	for _, args := range [][]string{{"--leaf-state", dir}, {"--leaf", "--leaf-state", file}, {"--leaf", "--leaf-state", filepath.Join(dir, "none")}} {
		out, err := xmsgCmd(nil, append([]string{"bench"}, args...)...).CombinedOutput()
		if code := exitCode(err); code != 2 || !strings.Contains(string(out), "--leaf-state") {
			t.Errorf("bench %v: exit %d, %q; want a usage error (2) about --leaf-state", args, code, out)
		}
	}
}
