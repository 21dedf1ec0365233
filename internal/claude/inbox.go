package claude

import (
	"errors"
	"net"
	"time"
)

// InboxTimeout bounds connect and write to a session's inbox socket (docs/protocol.md §2.7).
const InboxTimeout = 5 * time.Second

// ErrInboxTimeout means the inbox did not accept the line in time (HTTP 504).
var ErrInboxTimeout = errors.New("claude: inbox timeout")

// Inbox is one delivery to a session's inbox: a connection opened before the line exists,
// written once, closed. A failure other than ErrInboxTimeout means the inbox is unavailable
// (HTTP 502). Delivery is at most once: no retries. Opening it early lets the session's accept run while the daemon
// waits for its commit instead of after it, and the line still reaches the inbox only once
// it is written: a connection closed without Write carries nothing.
type Inbox struct {
	path    string
	timeout time.Duration
	fd      int      // a connection made without waiting, or -1
	conn    net.Conn // a connection made by dialWait, or one whose write the poller finishes
	err     error    // the connect's failure, reported by Write
}

// Dial starts a delivery to the inbox at path. It never waits: in the common case (room in
// the listener's backlog) it connects with two system calls; when the backlog is full, Write
// connects, waiting for room up to the timeout (dialWait). A failure is kept for Write, so
// that the caller learns it at the moment it would have written.
func Dial(path string, timeout time.Duration) *Inbox {
	in := &Inbox{path: path, timeout: timeout, fd: -1}
	in.fd, in.err = connectNow(path)
	if in.err == errWouldBlock {
		in.err = nil
	}
	return in
}

// Failed is an Inbox whose delivery fails with err (a path refused before any connect).
func Failed(err error) *Inbox { return &Inbox{fd: -1, err: err} }

// Write writes line, whole, within the timeout. Call it at most once.
func (in *Inbox) Write(line []byte) error {
	if in.err != nil {
		return in.err
	}
	if in.fd >= 0 {
		rest, err := writeNow(in.fd, line)
		if err != nil || len(rest) == 0 {
			return err
		}
		// The socket buffer is full: the rest goes through the poller, on the same connection,
		// so the inbox sees exactly one connection and one line either way.
		in.conn, err = adopt(in.fd)
		in.fd = -1 // adopt closed it, whether or not it made a conn
		if err != nil {
			return err
		}
		line = rest
	}
	if in.conn == nil {
		c, err := dialWait(in.path, in.timeout)
		if err != nil {
			return timeoutOr(err)
		}
		in.conn = c
	}
	in.conn.SetWriteDeadline(time.Now().Add(in.timeout))
	if _, err := in.conn.Write(line); err != nil {
		return timeoutOr(err)
	}
	return nil
}

// Close ends the delivery; a connection that was never written carries nothing. Safe to call
// more than once, and on an Inbox that never connected.
func (in *Inbox) Close() {
	if in.fd >= 0 {
		closeNow(in.fd)
		in.fd = -1
	}
	if in.conn != nil {
		in.conn.Close()
		in.conn = nil
	}
}

// errWouldBlock: the listener's backlog is full; the connect has to wait for room.
var errWouldBlock = errors.New("claude: inbox connect would block")

func timeoutOr(err error) error {
	if err == errWouldBlock {
		return ErrInboxTimeout
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return ErrInboxTimeout
	}
	return err
}
