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
//     store, the helper executes `xmsg serve` again with the sockets passed the way systemd's
//     socket activation passes them (LISTEN_FDS, LISTEN_PID, LISTEN_FDNAMES) and XMSG_HANDOVER
//     naming why. The listening sockets never close, so a client that connects meanwhile waits
//     in the backlog instead of being refused; the new daemon, outside the old domain, applies
//     a sandbox that includes the directory. If the daemon ends any other way, the helper sees
//     its control pipe close and exits.
//
// The old daemon then stays as a small waiter in the new one's place as its parent, so that a
// terminal or supervisor that started it still sees one process: a stop it receives is passed
// on through a pipe (Landlock's signal scoping forbids it to signal a process outside its
// domain), and its exit status is the new daemon's. Under systemd no helper is needed: the
// daemon exits with [ExitRestart], and the unit restarts it while the socket units keep the
// sockets.
package relaunch

import "github.com/xmsg/xmsg/internal/activation"

// Arg is the hidden subcommand that runs the handover helper.
const Arg = "__relaunch"

// ExitRestart is the exit status of a daemon that stopped so that systemd starts it again
// (the unit's RestartForceExitStatus= and SuccessExitStatus= name it): EX_TEMPFAIL.
const ExitRestart = 75

// Environment of the relaunched daemon.
const (
	// EnvHandover says why the sockets were handed over (the directory that appeared); the new
	// daemon logs it and doctor reports it (activation reads it beside LISTEN_FDS).
	EnvHandover = activation.EnvHandover
	// EnvStopFD names the read end of the pipe on which the waiting old daemon passes on a
	// stop ("t" or end of file) or a reload ("h").
	EnvStopFD = "XMSG_HANDOVER_STOP_FD"
)
