package daemon

import (
	"log/slog"
	"os"
	"runtime/debug"

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
func tuneGC() {
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(400)
	}
}
