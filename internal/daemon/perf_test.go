package daemon

import (
	"context"
	"os"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"sync"
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

// TestGCLimitCountsStacks: the limit leaves the heap its room beside the goroutine stacks, which
// the runtime counts against it and no collection frees (a hub's connections hold more in
// stacks than in heap). Mutant tried: the limit of the live heap alone (2x live): red.
func TestGCLimitCountsStacks(t *testing.T) {
	old := debug.SetMemoryLimit(-1)
	defer debug.SetMemoryLimit(old)
	// 2,000 goroutines of 32 KiB stacks each: about 64 MiB of stacks, a few KB of heap.
	var wg sync.WaitGroup
	release := make(chan struct{})
	for range 2000 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			deep(64, release)
		}()
	}
	defer func() { close(release); wg.Wait() }()
	runtime.GC()
	s := []metrics.Sample{{Name: "/memory/classes/heap/stacks:bytes"}, {Name: "/gc/heap/live:bytes"}}
	metrics.Read(s)
	stacks, live := int64(s[0].Value.Uint64()), int64(s[1].Value.Uint64())
	if got := gcLimit(); got < stacks+2*live {
		t.Errorf("memory limit %d MiB with %d MiB of stacks and %d MiB live: the heap has no room to grow", got>>20, stacks>>20, live>>20)
	}
}

// deep recurses n frames of 512 bytes each, then waits.
func deep(n int, wait <-chan struct{}) byte {
	var pad [512]byte
	if n == 0 {
		<-wait
		return pad[0]
	}
	pad[n%512] = deep(n-1, wait)
	return pad[0]
}

// TestGCLimitRenewedAfterCollection: the limit follows the process after each collection, not
// now and then: a hub whose fleet reconnects grows within seconds of its start. Mutant tried:
// afterGC calling f never: red.
func TestGCLimitRenewedAfterCollection(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	calls := make(chan struct{}, 16)
	afterGC(ctx, func() {
		select {
		case calls <- struct{}{}:
		default:
		}
	})
	for i := range 3 {
		for waited := 0; ; waited++ {
			runtime.GC()
			select {
			case <-calls:
			default:
				if waited < 1000 {
					runtime.Gosched()
					continue
				}
				t.Fatalf("collection %d: f not called after 1000 collections", i)
			}
			break
		}
	}
}

// TestOneProc: a leaf runs on one P unless GOMAXPROCS says otherwise. Mutant tried: oneProc
// ignoring the environment: the operator's GOMAXPROCS is overridden, red.
func TestOneProc(t *testing.T) {
	was := runtime.GOMAXPROCS(0)
	defer runtime.GOMAXPROCS(was)
	runtime.GOMAXPROCS(max(was, 2))
	t.Setenv("GOMAXPROCS", "")
	os.Unsetenv("GOMAXPROCS")
	oneProc()
	if n := runtime.GOMAXPROCS(0); n != 1 {
		t.Fatalf("GOMAXPROCS = %d without the variable, want 1", n)
	}
	runtime.GOMAXPROCS(3)
	t.Setenv("GOMAXPROCS", "3")
	oneProc()
	if n := runtime.GOMAXPROCS(0); n != 3 {
		t.Fatalf("GOMAXPROCS = %d with GOMAXPROCS=3 set, want it left alone", n)
	}
}
