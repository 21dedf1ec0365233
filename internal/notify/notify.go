// Package notify speaks the sd_notify protocol (sd_notify(3)) to the service
// manager: READY=1, STOPPING=1, STATUS=..., WATCHDOG=1.
//
// Unlike go-systemd's daemon.SdNotify, which connects anew for every
// message, [Open] connects once, early, and every later message is written
// to that connected socket. The daemon's startup order depends on it
// (docs/design.md §2, step 4): the notify socket is connected before the Landlock
// sandbox is applied, and afterwards a new connect would be refused —
// Landlock's abstract-unix scoping (ABI 6) forbids connecting to an
// abstract socket outside the sandbox (systemd's NOTIFY_SOCKET may be one),
// and filesystem rules may forbid reaching /run/systemd/notify — while sends
// on an already-connected datagram socket stay allowed.
//
// Without NOTIFY_SOCKET (not started by systemd, or Type= other than
// notify), Open returns a nil *Notifier, and every method of a nil Notifier
// is a no-op, so callers need no "are we under systemd" branches.
package notify

import (
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/coreos/go-systemd/v22/daemon"
)

// sendTimeout bounds one send (a variable so that tests can shorten it).
var sendTimeout = 5 * time.Second

// Notifier is a socket connected to the service manager's notify socket.
// Its methods are safe for concurrent use, and are no-ops (returning nil) on
// a nil Notifier or after Close. A message that the service manager does not
// take within 5 seconds is dropped and its method returns an error.
type Notifier struct {
	mu   sync.Mutex
	conn *net.UnixConn // nil after Close
}

// Open connects a datagram socket to $NOTIFY_SOCKET (a path, or an abstract
// name written "@name") and removes NOTIFY_SOCKET from the environment, so
// that child processes do not send notifications in our name. Outcomes:
//
//   - NOTIFY_SOCKET unset or empty: (nil, nil); notifications are silently
//     off (docs/design.md §7).
//   - connected: (n, nil).
//   - an address that is neither absolute nor abstract, or a failed
//     connect: (nil, err).
//
// Call Open before the sandbox is applied (see the package doc). The order
// relative to [WatchdogInterval] does not matter: Open leaves WATCHDOG_USEC
// and WATCHDOG_PID alone.
func Open() (*Notifier, error) {
	addr := os.Getenv("NOTIFY_SOCKET")
	_ = os.Unsetenv("NOTIFY_SOCKET")
	if addr == "" {
		return nil, nil
	}
	// systemd only ever hands out an absolute path or an abstract name
	// (vsock: addresses of newer versions are not supported here). A
	// relative path would depend on the working directory.
	if addr[0] != '/' && addr[0] != '@' {
		return nil, fmt.Errorf("notify: NOTIFY_SOCKET=%q: want an absolute path or @abstract name", addr)
	}
	// Go's net package maps a leading '@' to the abstract namespace.
	conn, err := net.DialUnix("unixgram", nil, &net.UnixAddr{Name: addr, Net: "unixgram"})
	if err != nil {
		return nil, fmt.Errorf("notify: connect: %w", err)
	}
	return &Notifier{conn: conn}, nil
}

// Enabled reports whether notifications are sent (n is open).
func (n *Notifier) Enabled() bool {
	if n == nil {
		return false
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.conn != nil
}

// Ready sends READY=1: startup is finished and every socket accepts.
func (n *Notifier) Ready() error { return n.send(daemon.SdNotifyReady) }

// Stopping sends STOPPING=1: shutdown has begun.
func (n *Notifier) Stopping() error { return n.send(daemon.SdNotifyStopping) }

// Watchdog sends WATCHDOG=1; send it every [WatchdogInterval]/2.
func (n *Notifier) Watchdog() error { return n.send(daemon.SdNotifyWatchdog) }

// Status sends STATUS=s, the one-line status that systemctl status shows.
// Line breaks and NUL bytes in s become spaces: the protocol is one
// VARIABLE=value per line, so a newline in s could otherwise smuggle in
// other assignments (READY=1, MAINPID=...).
func (n *Notifier) Status(s string) error {
	s = strings.Map(func(r rune) rune {
		if r == '\n' || r == '\r' || r == 0 {
			return ' '
		}
		return r
	}, s)
	return n.send("STATUS=" + s)
}

func (n *Notifier) send(state string) error {
	if n == nil {
		return nil
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.conn == nil {
		return nil
	}
	// A datagram socket blocks when the receiver's queue is full (a
	// stalled service manager). Bound the wait so that a stuck send can
	// neither hold the lock forever nor stall a shutdown.
	if err := n.conn.SetWriteDeadline(time.Now().Add(sendTimeout)); err != nil {
		return fmt.Errorf("notify: send: %w", err)
	}
	if _, err := n.conn.Write([]byte(state)); err != nil {
		return fmt.Errorf("notify: send: %w", err)
	}
	return nil
}

// Close closes the socket; later calls are no-ops.
func (n *Notifier) Close() error {
	if n == nil {
		return nil
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.conn == nil {
		return nil
	}
	err := n.conn.Close()
	n.conn = nil
	if err != nil && !errors.Is(err, net.ErrClosed) {
		return fmt.Errorf("notify: close: %w", err)
	}
	return nil
}

// WatchdogInterval returns the service manager's watchdog timeout from
// WATCHDOG_USEC, or 0 when the watchdog is off: WATCHDOG_USEC unset or not a
// positive number, or WATCHDOG_PID set to another process (the variables
// were inherited and the watchdog is not ours). Ping with [Notifier.Watchdog]
// at half this interval. It reads the environment only, so it may be called
// before or after [Open].
func WatchdogInterval() time.Duration {
	d, err := daemon.SdWatchdogEnabled(false)
	if err != nil {
		// A malformed value is treated as "off" rather than as a
		// startup error: pinging too rarely gets us restarted by
		// systemd, which is loud; refusing to start over it is not
		// better.
		return 0
	}
	return d
}
