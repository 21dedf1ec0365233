package custody

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"os"
	"syscall"
	"time"

	"github.com/xmsg/xmsg/internal/jsonline"
	"github.com/xmsg/xmsg/internal/ledger"
)

// msgWriter is a connection that can carry descriptors: *net.UnixConn, and gate.Conn, which
// embeds one.
type msgWriter interface {
	WriteMsgUnix(b, oob []byte, addr *net.UnixAddr) (n, oobn int, err error)
	SetWriteDeadline(t time.Time) error
	Write(b []byte) (int, error)
}

// WriteFD writes line with f attached (SCM_RIGHTS) to the line's first byte. The kernel
// delivers the descriptor to whoever reads that byte with recvmsg; a reader that uses
// read(2) instead gets the line and the kernel closes the descriptor.
func WriteFD(c net.Conn, line []byte, f *os.File, timeout time.Duration) error {
	w, ok := c.(msgWriter)
	if !ok {
		return errors.New("custody: connection cannot carry descriptors")
	}
	w.SetWriteDeadline(time.Now().Add(timeout))
	n, _, err := w.WriteMsgUnix(line, syscall.UnixRights(int(f.Fd())), nil)
	if err != nil {
		return fmt.Errorf("custody: sendmsg: %w", err)
	}
	if n < len(line) {
		if _, err := w.Write(line[n:]); err != nil {
			return fmt.Errorf("custody: write: %w", err)
		}
	}
	return nil
}

// ReadFD reads one answer line (at most max bytes) with recvmsg, and the descriptor that
// came with it, if any. Descriptors beyond the first are closed; a second descriptor, or one
// arriving on a later line, is an error (nothing a daemon sends).
func ReadFD(c *net.UnixConn, max int) (line []byte, f *os.File, err error) {
	var fds []int
	defer func() {
		for _, fd := range fds {
			syscall.Close(fd)
		}
	}()
	buf := make([]byte, 4096)
	oob := make([]byte, syscall.CmsgSpace(4*4))
	for {
		// Go's ReadMsgUnix sets MSG_CMSG_CLOEXEC on Linux: the received descriptor is
		// close-on-exec from the start.
		n, oobn, _, _, err := c.ReadMsgUnix(buf, oob)
		if oobn > 0 {
			msgs, perr := syscall.ParseSocketControlMessage(oob[:oobn])
			if perr != nil {
				return nil, nil, fmt.Errorf("custody: control message: %w", perr)
			}
			for _, m := range msgs {
				got, rerr := syscall.ParseUnixRights(&m)
				if rerr == nil {
					fds = append(fds, got...)
				}
			}
		}
		line = append(line, buf[:n]...)
		if i := bytes.IndexByte(line, '\n'); i >= 0 {
			if i != len(line)-1 {
				return nil, nil, errors.New("custody: more than one line in the answer")
			}
			break
		}
		if err != nil {
			return nil, nil, fmt.Errorf("custody: read answer: %w", err)
		}
		if n == 0 {
			return nil, nil, errors.New("custody: connection closed before the answer")
		}
		if len(line) > max {
			return nil, nil, errors.New("custody: answer too long")
		}
	}
	switch len(fds) {
	case 0:
		return line, nil, nil
	case 1:
		f = os.NewFile(uintptr(fds[0]), "memfd:custody")
		fds = nil
		return line, f, nil
	}
	return nil, nil, fmt.Errorf("custody: %d descriptors in one answer", len(fds))
}

// Hand gives secret name to p and writes the answer `{"status":"ok","credential":{...}}`
// with its descriptor on c (SCM_RIGHTS), the one hand-over both sockets make (agent.sock for
// `xmsg exec --credential`, register.sock for a registered service). refusal, when not nil, is
// what the caller answers instead, as an error line of its protocol; err is a write that
// failed, after which the connection is done.
func (h *Holder) Hand(c net.Conn, name string, p Principal, timeout time.Duration) (refusal *Error, err error) {
	f, grant, err := h.Give(name, p)
	if err != nil {
		var ce *Error
		if errors.As(err, &ce) {
			return ce, nil
		}
		return &Error{Code: ledger.Internal, Detail: "credential unavailable"}, nil
	}
	defer f.Close() // the daemon's copy of the descriptor: the caller has its own now
	line, err := jsonline.Encode(handed{Status: "ok", Credential: grant})
	if err != nil {
		return &Error{Code: ledger.Internal, Detail: "credential unavailable"}, nil
	}
	return nil, WriteFD(c, line, f, timeout)
}

type handed struct {
	Status     string `json:"status"`
	Credential Grant  `json:"credential"`
}
