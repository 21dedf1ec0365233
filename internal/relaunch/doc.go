// Package relaunch lets a sandboxed daemon start over when a session directory appears (or is
// replaced) after it started, without anyone restarting it and without a gap for its clients.
//
// Landlock's rules name directories that exist when the sandbox is applied, and a process can
// only ever narrow its domain, never widen it: not even by executing itself again. So a
// directory that appears later (Claude Code installed after xmsg) stays unreadable for the
// daemon's lifetime; only a process started outside the domain can include it. This package
// provides the two halves of that:
//
//   - [Watch]: inotify watches, added before the sandbox, on each session directory and on
//     the nearest existing ancestor of each missing one. Watches added before the sandbox keep
//     reporting after it. It fires once, shortly after the first change (so that one
//     `mkdir -p` is one relaunch).
//   - [Handover]: a helper started before the sandbox, outside the domain, that holds copies
//     of the listening sockets and waits. When the daemon has stopped serving and closed its
//     store, the helper starts `xmsg serve` again, as its child, with the sockets passed the
//     way systemd's socket activation passes them (LISTEN_FDS, LISTEN_PID, LISTEN_FDNAMES) and
//     XMSG_HANDOVER naming why. The listening sockets never close, so a client that connects
//     meanwhile waits in the backlog instead of being refused; the new daemon, outside the old
//     domain, applies a sandbox that includes the directory. If the daemon ends any other way,
//     the helper sees its control pipe close and exits.
//
// The helper stays the new daemon's parent, and the one to start the next: a relaunched
// daemon that sees a directory appear asks it through a pipe ([Inherited]) and exits, and the
// helper starts the next in its place. The first daemon stays as a small waiter, the helper's
// parent, so that a terminal or supervisor that started it still sees one process. So after
// any number of relaunches three processes are left: the first daemon waiting, the helper,
// the current daemon. A stop sent to any of them stops all three: the waiter passes a stop it
// receives on through a pipe (Landlock's signal scoping forbids it to signal a process outside
// its domain), the helper passes it on to the current daemon as a signal and ends with its
// status, the current daemon dies with the helper (its parent-death signal), and a helper that
// ends makes the waiter end too. Under systemd no helper is needed: the daemon exits with
// [ExitRestart], and the unit restarts it while the socket units keep the sockets.
package relaunch

import (
	"os"
	"strconv"

	"github.com/xmsg/xmsg/internal/activation"
)

// Arg is the hidden subcommand that runs the handover helper.
const Arg = "__relaunch"

// ExitRestart is the exit status of a daemon that stopped so that systemd starts it again
// (the unit's RestartForceExitStatus= and SuccessExitStatus= name it): EX_TEMPFAIL.
const ExitRestart = 75

// EnvHandover says why the sockets were handed over (the directory that appeared); the new
// daemon logs it and doctor reports it (activation reads it beside LISTEN_FDS).
const EnvHandover = activation.EnvHandover

// EnvRelaunches is how many daemons the handover helper started before this one: 0 (or
// unset) for the first daemon of a chain. The metrics report it.
const EnvRelaunches = "XMSG_RELAUNCHES"

// Relaunches is this daemon's EnvRelaunches: the relaunches of its chain so far.
func Relaunches() int {
	n, err := strconv.Atoi(os.Getenv(EnvRelaunches))
	if err != nil || n < 0 {
		return 0
	}
	return n
}
