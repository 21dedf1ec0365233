// Package notify speaks systemd's sd_notify protocol over a socket connected once, at
// startup. go-systemd's daemon.SdNotify dials anew for every message; after Landlock's scoping
// (ABI 6+) a new connect to an abstract notify socket ("@...") would be refused, so the daemon
// connects before the sandbox applies and keeps the connection.
//
// All methods are no-ops on a nil *Notifier, which is what Open returns when NOTIFY_SOCKET is
// unset (not running under systemd, or Type= is not notify).
package notify

import (
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"time"
)

// Notifier is a connected notify socket.
type Notifier struct {
	conn *net.UnixConn
}

// Open connects to $NOTIFY_SOCKET and unsets it, so that children never talk to systemd on
// our behalf. It returns (nil, nil) when the variable is unset.
func Open() (*Notifier, error) {
	path := os.Getenv("NOTIFY_SOCKET")
	if path == "" {
		return nil, nil
	}
	os.Unsetenv("NOTIFY_SOCKET")
	addr := &net.UnixAddr{Name: path, Net: "unixgram"}
	if strings.HasPrefix(path, "@") {
		addr.Name = "\x00" + path[1:] // abstract namespace
	}
	conn, err := net.DialUnix("unixgram", nil, addr)
	if err != nil {
		return nil, fmt.Errorf("notify: connect %s: %w", path, err)
	}
	return &Notifier{conn: conn}, nil
}

// Enabled reports whether messages reach systemd.
func (n *Notifier) Enabled() bool { return n != nil }

func (n *Notifier) send(state string) error {
	if n == nil {
		return nil
	}
	if _, err := n.conn.Write([]byte(state)); err != nil {
		return fmt.Errorf("notify: send: %w", err)
	}
	return nil
}

// Ready tells systemd that every socket accepts (Type=notify start is complete).
func (n *Notifier) Ready() error { return n.send("READY=1") }

// Stopping tells systemd that a graceful stop began.
func (n *Notifier) Stopping() error { return n.send("STOPPING=1") }

// Status sets the one-line status shown by systemctl status. Newlines would start new
// assignments in the protocol, so they are replaced.
func (n *Notifier) Status(s string) error {
	return n.send("STATUS=" + strings.ReplaceAll(s, "\n", " "))
}

// Watchdog pets the watchdog (WatchdogSec=).
func (n *Notifier) Watchdog() error { return n.send("WATCHDOG=1") }

// Close closes the socket.
func (n *Notifier) Close() error {
	if n == nil {
		return nil
	}
	return n.conn.Close()
}

// WatchdogInterval returns WatchdogSec= as systemd passes it (WATCHDOG_USEC), or 0 when the
// watchdog is off or meant for another process (WATCHDOG_PID). Call it before anything
// unsets the environment.
func WatchdogInterval() time.Duration {
	usec, err := strconv.ParseInt(os.Getenv("WATCHDOG_USEC"), 10, 64)
	if err != nil || usec <= 0 {
		return 0
	}
	if p := os.Getenv("WATCHDOG_PID"); p != "" && p != strconv.Itoa(os.Getpid()) {
		return 0
	}
	return time.Duration(usec) * time.Microsecond
}
