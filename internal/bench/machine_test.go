package bench

import (
	"runtime"
	"testing"
	"time"
)

// TestMachineCPU: /proc/stat's busy time is read (positive, since boot) and grows by about
// what a busy loop of this process spends (the machine's other work only adds to it).
func TestMachineCPU(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("/proc/stat is Linux's")
	}
	m0 := machineCPU()
	if m0 <= 0 {
		t.Fatalf("machineCPU() = %v", m0)
	}
	spin := 200 * time.Millisecond
	for t0 := time.Now(); time.Since(t0) < spin; {
	}
	// At least half the spin is seen: ticks are 10 ms, and the spinning thread may be
	// descheduled for a while on a loaded machine.
	if d := machineCPU() - m0; d < float64(spin.Microseconds())/2 {
		t.Errorf("busy time grew %v µs over a %v spin", d, spin)
	}
}
