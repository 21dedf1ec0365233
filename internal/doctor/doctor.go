// Package doctor says which protections are in force and which portable fallback applies
// in their place (docs/design.md §7). The daemon fills Facts at startup; `xmsg doctor` prints
// the daemon's Lines and those of Machine, what this machine and environment offer.
package doctor

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/xmsg/xmsg/internal/claude"
	"github.com/xmsg/xmsg/internal/creds"
	"github.com/xmsg/xmsg/internal/peercred"
	"github.com/xmsg/xmsg/internal/sandbox"
)

// Facts are the protections of one daemon (Daemon true) or of this machine (Machine).
type Facts struct {
	Daemon bool `json:"daemon"` // reported by a running `xmsg serve`

	SocketActivation bool     `json:"socket_activation"`    // sockets came from systemd (LISTEN_FDS)
	Missing          []string `json:"missing,omitempty"`    // names systemd did not pass: not served
	SocketDir        string   `json:"socket_dir,omitempty"` // where self-bound sockets live

	PeerGate bool `json:"peer_gate"` // always true in serve

	Landlock    string `json:"landlock"`     // sandbox.Report.String(), or "not applied"
	LandlockABI int    `json:"landlock_abi"` // what the kernel offers (sandbox.Probe)

	Credentials string `json:"credentials"` // creds.Source: "credentials-directory", "path", "none"

	Notify   bool          `json:"notify"`   // NOTIFY_SOCKET set
	Watchdog time.Duration `json:"watchdog"` // WATCHDOG_USEC for this process; 0 = none

	TCPListen string `json:"tcp_listen,omitempty"` // --listen address; "" = none

	Systemd bool `json:"systemd"` // started by systemd (INVOCATION_ID set)

	Leaf string `json:"leaf,omitempty"` // leaf mode: the leaf principal; "" = not a leaf

	// SessionWatch is how the Claude session directories are kept fresh (a daemon's
	// claude.Scanner.WatchReport), or for Machine whether inotify is offered; "" = no line.
	SessionWatch string `json:"session_watch,omitempty"`
	// Pidfd is "yes" when process liveness is checked through pidfds, else why not (then
	// /proc is read on every check); "" = no line.
	Pidfd string `json:"pidfd,omitempty"`
	// ClaudeReports is the daemon's reply socket for Claude Code's peer status reports, or
	// why it has none ("none: ..."); "" off a daemon.
	ClaudeReports string `json:"claude_reports,omitempty"`
	// Relaunched names the session directory whose appearance made the daemon start again with
	// its sockets handed over (internal/relaunch); "" = it was not.
	Relaunched string `json:"relaunched,omitempty"`
	// PtraceScope is Yama's ptrace policy (yama.go), which bounds what credential custody
	// can promise against the uid's other processes; "" = no line.
	PtraceScope string `json:"ptrace_scope,omitempty"`
}

// NotApplied is the Landlock value of Facts when no sandbox was applied.
const NotApplied = "not applied"

// Lines returns one human line per mechanism, each naming the fallback in force when the
// mechanism is absent (the table of docs/design.md §7).
func (f Facts) Lines() []string {
	var l []string

	dir := f.SocketDir
	if dir == "" {
		dir = "$XDG_RUNTIME_DIR/xmsg"
	}
	if f.Leaf != "" {
		// docs/protocol.md §7.5: a leaf binds its two listeners itself, with or without systemd.
		l = append(l, "leaf: principal "+f.Leaf+"; only its http.sock, the leaf register socket and a --listen TCP listener, if any, are served (no agent.sock or federation listener)")
		l = append(l, "socket activation: not used in leaf mode (the register socket is self-bound in "+dir+")")
	} else if f.SocketActivation {
		l = append(l, "socket activation: yes (systemd)")
		if len(f.Missing) > 0 {
			l = append(l, "socket activation: not passed by systemd, so not served: "+strings.Join(f.Missing, ", "))
		}
	} else {
		l = append(l, "socket activation: no (self-bound sockets in "+dir+")")
	}
	if f.Relaunched != "" {
		l = append(l, "relaunched: the session dir "+f.Relaunched+" appeared or was replaced, so the daemon started again, its sockets handed over (no connection refused)")
	}

	switch {
	case !f.Daemon:
		l = append(l, "peer gate: enforced by xmsg serve on every socket (no daemon reported here)")
	case f.PeerGate:
		l = append(l, "peer gate: on (a connection from another uid is closed before a byte is read)")
	default:
		l = append(l, "peer gate: OFF")
	}

	switch {
	case f.Landlock == "" || f.Landlock == NotApplied:
		if f.LandlockABI == 0 {
			l = append(l, "landlock: not applied (the kernel has no Landlock; --require-landlock would refuse to start)")
		} else {
			l = append(l, fmt.Sprintf("landlock: not applied (the kernel offers ABI %d)", f.LandlockABI))
		}
	case f.Landlock == "landlock: unavailable":
		l = append(l, "landlock: unavailable (running without it; --require-landlock would refuse to start)")
	default:
		l = append(l, f.Landlock)
	}

	switch creds.Source(f.Credentials) {
	case creds.SourceCredentialsDirectory:
		l = append(l, "credentials: LoadCredential= ($CREDENTIALS_DIRECTORY)")
	case creds.SourcePath:
		l = append(l, "credentials: plain files named by flags (no $CREDENTIALS_DIRECTORY)")
	default:
		if f.Daemon {
			l = append(l, "credentials: none loaded")
		} else {
			l = append(l, "credentials: no $CREDENTIALS_DIRECTORY (fallback: plain files named by flags)")
		}
	}

	switch {
	case f.Notify && f.Watchdog > 0:
		l = append(l, fmt.Sprintf("sd_notify: yes (watchdog %s)", f.Watchdog))
	case f.Notify:
		l = append(l, "sd_notify: yes")
	default:
		l = append(l, "sd_notify: no (NOTIFY_SOCKET unset; readiness is not signalled)")
	}

	if f.TCPListen == "" {
		l = append(l, "tcp listener: none")
	} else {
		// docs/protocol.md §2.3: the TCP listener has no peer check.
		l = append(l, "tcp listener: "+f.TCPListen+" (no peer-uid check on TCP)")
	}

	if f.Systemd {
		l = append(l, "systemd hardening: from the unit (systemd-analyze security shows it)")
	} else {
		l = append(l, "systemd hardening: none (not started by systemd)")
	}

	// The two mechanisms a send's cost rests on (docs/design.md §7): without them every
	// request rescans the session directories, or reads /proc for every liveness check.
	if f.SessionWatch != "" {
		l = append(l, "session dirs: "+f.SessionWatch)
	}
	if f.ClaudeReports != "" {
		l = append(l, "claude reports: "+f.ClaudeReports)
	}
	switch f.Pidfd {
	case "":
	case "yes":
		l = append(l, "process liveness: pidfd (a reused pid cannot pass for the process it replaced)")
	default:
		l = append(l, "process liveness: /proc read on every check (no pidfd: "+f.Pidfd+")")
	}
	if f.PtraceScope != "" {
		l = append(l, "ptrace: "+f.PtraceScope)
	}
	return l
}

// Machine returns what this machine and this process's environment offer, for when no
// daemon reports its own facts: the Landlock ABI (nothing is restricted to find it) and
// whether systemd passed sockets, a notify socket and credentials.
func Machine() Facts {
	f := Facts{
		SocketActivation: os.Getenv("LISTEN_FDS") != "",
		Landlock:         NotApplied,
		LandlockABI:      sandbox.Probe(),
		Credentials:      string(creds.SourceNone),
		Notify:           os.Getenv("NOTIFY_SOCKET") != "",
		Watchdog:         watchdog(),
		Systemd:          os.Getenv("INVOCATION_ID") != "",
	}
	if rt := os.Getenv("XDG_RUNTIME_DIR"); rt != "" {
		f.SocketDir = rt + "/xmsg"
	}
	if creds.Dir() != "" {
		f.Credentials = string(creds.SourceCredentialsDirectory)
	}
	if err := claude.CanWatch(); err != nil {
		f.SessionWatch = "no inotify (" + err.Error() + "): a daemon would rescan them on every request"
	} else {
		f.SessionWatch = "inotify available"
	}
	f.Pidfd = PidfdProbe(peercred.Proc{})
	f.PtraceScope = PtraceScope()
	return f
}

// PidfdProbe opens a pidfd of this process, as liveness checks do for sessions: "yes", or
// why it failed.
func PidfdProbe(proc peercred.Proc) string {
	start, err := proc.StartTime(os.Getpid())
	if err == nil {
		var pf *peercred.Pidfd
		if pf, err = proc.OpenPidfd(os.Getpid(), start); err == nil {
			pf.Close()
			return "yes"
		}
	}
	return err.Error()
}

// watchdog returns the interval systemd asks this process to ping at, or 0. Like
// sd_watchdog_enabled, it ignores a WATCHDOG_USEC meant for another process (WATCHDOG_PID).
func watchdog() time.Duration {
	usec, err := strconv.ParseUint(os.Getenv("WATCHDOG_USEC"), 10, 63)
	if err != nil || usec == 0 || usec > uint64(1<<63-1)/1000 {
		return 0
	}
	if p := os.Getenv("WATCHDOG_PID"); p != "" && p != strconv.Itoa(os.Getpid()) {
		return 0
	}
	return time.Duration(usec) * time.Microsecond
}
