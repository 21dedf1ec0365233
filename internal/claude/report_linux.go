//go:build linux

package claude

import (
	"bufio"
	"errors"
	"log/slog"
	"net"
	"os"
	"time"

	"github.com/xmsg/xmsg/internal/activation"
	"github.com/xmsg/xmsg/internal/jsonline"
	"github.com/xmsg/xmsg/internal/peercred"
)

// Reports is the daemon's reply socket for Claude Code sessions' peer status reports.
type Reports struct {
	l    *net.UnixListener
	path string
	log  *slog.Logger
}

// maxReporters bounds the connections served at once; more wait in the backlog.
const maxReporters = 8

// ListenReports binds the reply socket at path (its directory made 0700 when missing, as
// every socket of the daemon; a socket file left by a daemon that died is replaced). It must
// be bound before the sandbox applies.
func ListenReports(path string, log *slog.Logger) (*Reports, error) {
	if !ValidAddress(path) {
		return nil, errors.New("claude: reply socket path cannot be a reply address")
	}
	l, err := activation.Bind(path)
	if err != nil {
		return nil, err
	}
	return &Reports{l: l, path: path, log: log}, nil
}

// Path is the socket's path (the reply address is Address(Path())).
func (r *Reports) Path() string {
	if r == nil {
		return ""
	}
	return r.path
}

// Serve reads one report per connection and hands it to handle with the kernel's
// credentials of the writer; it returns when the listener is closed. A connection of
// another uid is closed unread; each is read for at most 5 s and one line of
// MaxReportLine (an auth line before it, which a session writes when it holds a key for
// this socket, is skipped).
func (r *Reports) Serve(handle func(peercred.Cred, Report)) error {
	sem := make(chan struct{}, maxReporters)
	for {
		c, err := r.l.AcceptUnix()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return nil
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			// Out of descriptors and the like: wait a little rather than spin.
			time.Sleep(50 * time.Millisecond)
			continue
		}
		sem <- struct{}{}
		go func() {
			defer func() { <-sem }()
			r.serve(c, handle)
		}()
	}
}

func (r *Reports) serve(c *net.UnixConn, handle func(peercred.Cred, Report)) {
	defer c.Close()
	cred, err := peercred.FromConn(c)
	// The same fence as every socket of the daemon: another uid is never read.
	if err != nil || int(cred.UID) != os.Geteuid() {
		return
	}
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	br := bufio.NewReaderSize(c, 4096)
	for i := 0; i < 2; i++ {
		line, err := jsonline.ReadLine(br, MaxReportLine)
		if len(line) == 0 && err != nil {
			return
		}
		rep, ok, perr := ParseReport(line)
		if perr != nil {
			r.log.Debug("claude report refused", "peer_pid", cred.PID, "err", perr)
			return
		}
		if ok {
			handle(cred, rep)
			return
		}
		if err != nil {
			return
		}
	}
}

// Close stops the socket and removes its file.
func (r *Reports) Close() error {
	if r == nil {
		return nil
	}
	return r.l.Close()
}
