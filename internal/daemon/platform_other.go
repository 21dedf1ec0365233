//go:build !linux

package daemon

import (
	"errors"
	"runtime"
)

// platformSupported refuses to start off Linux. The peer gate reads the peer's uid and pid
// from SO_PEERCRED, which exists only on Linux; elsewhere it refuses every connection (it
// fails closed), so a daemon that started would answer nobody while looking healthy. It stays
// refused until the gate has its port there (on macOS: getpeereid and LOCAL_PEEREPID, the
// start time from proc_pidinfo).
func platformSupported() error {
	return errors.New("daemon: xmsg serve runs on Linux only: the peer gate (SO_PEERCRED) is not implemented on " + runtime.GOOS + ", so every connection would be refused")
}
