//go:build linux

package sandbox

import (
	"strings"
	"testing"
)

// TestSelfCheckCatchesAFalseReport: without any sandbox applied, a report that claims
// enforcement must be refused by the self-check (this process can list / and reach loopback).
func TestSelfCheckCatchesAFalseReport(t *testing.T) {
	for _, r := range []Report{{ABI: 7, FS: Enforced, Net: Unavailable}, {ABI: 7, FS: Unavailable, Net: Enforced}} {
		if _, err := SelfCheck(r, Policy{}); err == nil {
			t.Errorf("SelfCheck(%v) on an unsandboxed process succeeded", r)
		}
	}
	line, err := SelfCheck(Report{ABI: 7, FS: Unavailable, Net: Unavailable}, Policy{})
	if err != nil || !strings.Contains(line, "nothing enforced") {
		t.Errorf("nothing claimed: %q, %v", line, err)
	}
}
