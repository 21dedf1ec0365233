//go:build linux

package main

import (
	"encoding/json"
	"strings"
	"testing"
)

// TestBenchLeafSmoke runs `xmsg bench --leaf` with tiny counts: a hub and a leaf daemon of
// its own, each in its own process, and every leaf-path figure in the JSON. No timing is
// asserted.
func TestBenchLeafSmoke(t *testing.T) {
	cmd := xmsgCmd(nil, "bench", "--leaf", "--count", "20", "--clients", "2", "--runs", "1", "--json")
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
		"1 consumer drains on the hub, 2 senders", "hub -> leaf -> svc, 1 consumer drains, 2 senders"} {
		if !paths[want] {
			t.Errorf("no figure for %q in %v", want, paths)
		}
	}
	if res.Runs[0].CommitP50 <= 0 {
		t.Errorf("no baselines: %s", out)
	}
}
