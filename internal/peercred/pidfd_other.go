//go:build !linux

package peercred

import "errors"

// Pidfd is Linux-only; elsewhere callers read /proc (or its stand-in) each time.
type Pidfd struct{}

// OpenPidfd always fails here.
func (p Proc) OpenPidfd(pid int, start string) (*Pidfd, error) {
	return nil, errors.New("peercred: no pidfd on this platform")
}

// Exited is never known: a Pidfd cannot exist here.
func (*Pidfd) Exited() (exited, known bool) { return false, false }

// Wait returns false at once.
func (*Pidfd) Wait() bool { return false }

// Close does nothing.
func (*Pidfd) Close() {}
