package peercred

import "errors"

// Guard answers, again and again, whether one process (pid with start time start) is still
// alive: by a pidfd where one can be had (one poll(2) per check), else by reading /proc. It
// is as strict as Alive: a pidfd is opened only after the start time is confirmed, so it can
// never stand for a process that reused the pid. Not safe for concurrent use.
type Guard struct {
	proc   Proc
	pid    int
	start  string
	pf     *Pidfd
	opened bool
}

// Guard returns a Guard for pid and start; Close releases it.
func (p Proc) Guard(pid int, start string) *Guard { return &Guard{proc: p, pid: pid, start: start} }

// Alive reports whether the process is still the one the Guard was made for.
func (g *Guard) Alive() bool {
	if !g.opened {
		g.opened = true
		pf, err := g.proc.OpenPidfd(g.pid, g.start)
		if errors.Is(err, ErrExited) {
			return false
		}
		g.pf = pf
	}
	if g.pf != nil {
		if exited, known := g.pf.Exited(); known {
			return !exited
		}
	}
	return g.proc.Alive(g.pid, g.start)
}

// Close releases the pidfd, if any.
func (g *Guard) Close() {
	if g.pf != nil {
		g.pf.Close()
	}
}
