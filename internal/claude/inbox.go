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

// Deliver writes one line to the inbox socket at path and closes the connection. Any other
// failure means the inbox is unavailable (HTTP 502). Delivery is at most once: no retries.
func Deliver(path string, line []byte, timeout time.Duration) error {
	// The common case (the listener's backlog has room, the line fits the socket buffer)
	// needs neither the runtime's poller nor a timer: a few plain system calls.
	if done, err := deliverFast(path, line, timeout); done {
		return err
	}
	return deliverNet(path, line, timeout)
}

// deliverNet is Deliver through the net package, with the timeout on connect and write.
func deliverNet(path string, line []byte, timeout time.Duration) error {
	d := net.Dialer{Timeout: timeout}
	c, err := d.Dial("unix", path)
	if err != nil {
		if isTimeout(err) {
			return ErrInboxTimeout
		}
		return err
	}
	defer c.Close()
	c.SetWriteDeadline(time.Now().Add(timeout))
	if _, err := c.Write(line); err != nil {
		if isTimeout(err) {
			return ErrInboxTimeout
		}
		return err
	}
	return nil
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}
