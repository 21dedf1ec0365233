package daemon

import (
	"context"
	"log/slog"
	"os"
	"runtime"
	"runtime/debug"
	"runtime/metrics"

	"github.com/xmsg/xmsg/internal/claude"
	"github.com/xmsg/xmsg/internal/doctor"
	"github.com/xmsg/xmsg/internal/peercred"
)

// reportWatchFallbacks says at startup, rather than at the first request, when the session
// directories cannot be watched (every request then rescans them) or pidfds are unavailable
// (liveness is then read from /proc each time): the first look at the directories sets up
// the watch and logs a failure, and a pidfd of this process is tried once. It returns the
// pidfd's answer for xmsg doctor (doctor.Facts.Pidfd).
func reportWatchFallbacks(sessions *claude.Scanner, proc peercred.Proc, log *slog.Logger) (pidfd string) {
	sessions.Problems()
	pidfd = doctor.PidfdProbe(proc)
	if pidfd != "yes" {
		log.Warn("pidfds unavailable; process liveness is read from /proc on every check", "err", pidfd)
	}
	return pidfd
}

// oneProc runs the process on one P (GOMAXPROCS=1) unless GOMAXPROCS says otherwise: for a
// leaf, which serves one service. Each message wakes a leaf from idle (the pull's answer, the
// service's frames), and with a P per CPU the scheduler's search for work on the other Ps
// (findRunnable) was 15–18% of a leaf's CPU in profiles; with 50 leaves on two CPUs one P
// each took a third off their CPU per message (docs/performance.md §5). One P still drains
// a service at thousands of messages a second: the fsyncs and other blocking calls hand it
// to the rest meanwhile.
func oneProc() {
	if os.Getenv("GOMAXPROCS") == "" {
		runtime.GOMAXPROCS(1)
	}
}

// tuneGC lets the heap grow to 5x the live heap between collections (GOGC=400) unless GOGC
// says otherwise. The daemon's live heap is a few MB, and a send allocates a few KB, so the
// default collected every few hundred sends: about a fifth of a send's CPU under load in
// xmsg bench. The cost is tens of MB at most.
//
// That headroom is for a small heap. A hub holding thousands of leaves has a live heap of tens
// of MB, where 5x would be most of its RSS and no CPU saved that matters: so, unless GOMEMLIMIT
// says otherwise, a soft memory limit (gcLimit: GOGC=100's growth over what a collection
// cannot free), renewed after every collection until ctx ends. The limit counts the
// goroutine stacks and the runtime's own memory as well as the heap, and a hub's thousands of
// connections hold more in stacks than in heap: a limit of the heap's alone, or one renewed
// only now and then while a fleet reconnects after a restart, sat under what the process
// already held, and the collector then ran without pause at its cap of half the CPU.
func tuneGC(ctx context.Context) {
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(400)
	}
	if os.Getenv("GOMEMLIMIT") != "" {
		return
	}
	setGCLimit()
	afterGC(ctx, setGCLimit)
}

// afterGC calls f after every collection (when the collection found a sentinel unreachable)
// until ctx ends.
func afterGC(ctx context.Context, f func()) {
	// Big enough not to share a tiny allocation with anything that stays reachable.
	sentinel := new([64]byte)
	runtime.AddCleanup(sentinel, func(ctx context.Context) {
		if ctx.Err() == nil {
			f()
			afterGC(ctx, f)
		}
	}, ctx)
}

// gcLimitFloor is the soft memory limit of a small heap: GOGC=400's headroom stays below it.
const gcLimitFloor = 64 << 20

// gcLimit is the soft memory limit for what the runtime holds now: at least gcLimitFloor, and
// room for the live heap to double beside what no collection frees (stacks, the runtime's
// metadata and buffers).
func gcLimit() int64 {
	samples := []metrics.Sample{
		{Name: "/gc/heap/live:bytes"},
		{Name: "/memory/classes/total:bytes"},
		{Name: "/memory/classes/heap/objects:bytes"},
		{Name: "/memory/classes/heap/unused:bytes"},
		{Name: "/memory/classes/heap/free:bytes"},
		{Name: "/memory/classes/heap/released:bytes"},
	}
	metrics.Read(samples)
	v := make([]int64, len(samples))
	for i, s := range samples {
		if s.Value.Kind() != metrics.KindUint64 {
			return gcLimitFloor
		}
		v[i] = int64(s.Value.Uint64())
	}
	live, nonHeap := v[0], v[1]-v[2]-v[3]-v[4]-v[5]
	return max(gcLimitFloor, 2*live+max(nonHeap, 0))
}

// setGCLimit sets the soft memory limit to gcLimit.
func setGCLimit() { debug.SetMemoryLimit(gcLimit()) }
