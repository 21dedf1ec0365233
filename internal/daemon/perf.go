package daemon

import (
	"context"
	"log/slog"
	"os"
	"runtime/debug"
	"runtime/metrics"
	"time"

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

// tuneGC lets the heap grow to 5x the live heap between collections (GOGC=400) unless GOGC
// says otherwise. The daemon's live heap is a few MB, and a send allocates a few KB, so the
// default collected every few hundred sends: about a fifth of a send's CPU under load in
// xmsg bench. The cost is tens of MB at most.
//
// That headroom is for a small heap. A hub holding thousands of leaves has a live heap of tens
// of MB, where 5x would be most of its RSS and no CPU saved that matters: so, unless GOMEMLIMIT
// says otherwise, a soft memory limit of max(64 MiB, 2x the live heap) (GOGC=100's growth),
// renewed every 10 s from the live heap the last collection measured, bounds it until ctx ends.
func tuneGC(ctx context.Context) {
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(400)
	}
	if os.Getenv("GOMEMLIMIT") != "" {
		return
	}
	setGCLimit()
	go func() {
		t := time.NewTicker(10 * time.Second)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				setGCLimit()
			}
		}
	}()
}

// gcLimitFloor is the soft memory limit of a small heap: GOGC=400's headroom stays below it.
const gcLimitFloor = 64 << 20

// setGCLimit sets the soft memory limit to max(gcLimitFloor, twice the live heap).
func setGCLimit() {
	sample := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
	metrics.Read(sample)
	limit := int64(gcLimitFloor)
	if sample[0].Value.Kind() == metrics.KindUint64 {
		limit = max(limit, 2*int64(sample[0].Value.Uint64()))
	}
	debug.SetMemoryLimit(limit)
}
