package daemon

import (
	"runtime/debug"
	"testing"
)

// TestGCLimit: the soft memory limit is at least the floor and at least twice the live heap.
func TestGCLimit(t *testing.T) {
	old := debug.SetMemoryLimit(-1)
	defer debug.SetMemoryLimit(old)
	keep := make([][]byte, 0, 40)
	for range 40 {
		keep = append(keep, make([]byte, 1<<20)) // ~40 MiB live
	}
	debug.FreeOSMemory() // a collection, so the live heap is measured
	setGCLimit()
	got := debug.SetMemoryLimit(-1)
	if got < gcLimitFloor || got < 2*40<<20 {
		t.Errorf("memory limit %d MiB with 40 MiB live; want at least max(64 MiB, 80 MiB)", got>>20)
	}
	_ = keep[len(keep)-1][0]
}
