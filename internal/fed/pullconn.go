package fed

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync"
	"syscall"
	"time"
)

// pullConn is a leaf's kept connection to one hub for its pull loop (POST /fed/v2/inbox): the
// puller writes each request and reads its answer itself. net/http's client hands every
// request to its connection's write goroutine and every answer back from its read goroutine,
// two goroutine hand-offs each way per pull, which at one row per pull was a fifth of a
// leaf's CPU. One puller per hub uses it, one request at a time; everything else a leaf asks
// of its hub goes through the shared client.
//
// Like a pooled connection it keeps the peers snapshot it was dialled with: a reload makes
// the next pull dial again (with the current address, pin and certificate).
type pullConn struct {
	mu sync.Mutex // one request at a time (the puller's; a second caller waits)
	// cmu guards c's changes and closed, so that Node.Close can close c while a long-poll
	// holds mu; c is changed only by the holder of mu, which reads it without cmu.
	cmu    sync.Mutex
	c      net.Conn
	closed bool
	st     *state // the snapshot c was dialled with
	r      *bufio.Reader
	w      *bufio.Writer
}

// pullConns holds a node's pull connections, one per hub.
type pullConns struct {
	mu    sync.Mutex
	conns map[string]*pullConn
}

func (p *pullConns) get(peer string) *pullConn {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.conns == nil {
		p.conns = map[string]*pullConn{}
	}
	pc := p.conns[peer]
	if pc == nil {
		pc = &pullConn{}
		p.conns[peer] = pc
	}
	return pc
}

// closeAll closes every pull connection (Node.Close): a pull in flight fails, and no later
// one dials.
func (p *pullConns) closeAll() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, pc := range p.conns {
		pc.cmu.Lock()
		pc.closed = true
		if pc.c != nil {
			pc.c.Close()
		}
		pc.cmu.Unlock()
	}
}

// set installs c, dialled with st (the caller holds mu); false when the node closed
// meanwhile (c is closed then).
func (pc *pullConn) set(c net.Conn, st *state) bool {
	pc.cmu.Lock()
	defer pc.cmu.Unlock()
	if pc.closed {
		c.Close()
		return false
	}
	pc.c, pc.st, pc.r, pc.w = c, st, bufio.NewReaderSize(c, 64<<10), bufio.NewWriterSize(c, 16<<10)
	return true
}

// drop closes and forgets the connection (the caller holds mu): the next request dials.
func (pc *pullConn) drop() {
	pc.cmu.Lock()
	defer pc.cmu.Unlock()
	if pc.c != nil {
		pc.c.Close()
	}
	pc.c, pc.st, pc.r, pc.w = nil, nil, nil, nil
}

// errStale is a kept connection that failed before any answer came: the hub closed it while
// it was idle (a restart, its idle timeout). The request is sent again on a new one.
var errStale = errors.New("fed: kept connection closed by the peer")

// maxPullAnswer bounds the answer read: a batch of MaxInboxBatchBytes stored bytes past its
// first row, that row (at most a body's JSON-escaped size) and the JSON around them, and no
// less than any other answer of a peer may be (call).
func (n *Node) maxPullAnswer() int64 {
	return max(int64(MaxInboxBatchBytes)*2+int64(n.cfg.MaxBody)*6+65536, int64(n.cfg.MaxBody)*64+65536)
}

// postPull sends body (JSON) to peer's POST /fed/v2/inbox on the peer's pull connection and
// returns the answer's status and body. Transport failures come back as callError's codes.
func (n *Node) postPull(ctx context.Context, peer string, body []byte) (int, []byte, error) {
	return n.pullRequest(ctx, peer, body, 0, nil)
}

// errLineTooLong is a followed answer's line past the bound of a pull's answer.
var errLineTooLong = errors.New("fed: followed pull's line too long")

// pullRequest is postPull, and with line set a followed pull's (PullRequest.Follow): when the
// hub answers 200 with JSON lines, each line goes to line as it comes (the connection's read
// deadline is idle from each one on); their end, the answer's, returns 0 and nil. Any other
// answer is returned as postPull's. An error of line ends the answer there (the connection
// is dropped) and is returned as it is.
func (n *Node) pullRequest(ctx context.Context, peer string, body []byte, idle time.Duration, line func([]byte) error) (int, []byte, error) {
	pc := n.pulls.get(peer)
	pc.mu.Lock()
	defer pc.mu.Unlock()
	for attempt := 0; ; attempt++ {
		if pc.c != nil && pc.st != n.st.Load() {
			pc.drop() // reloaded: dial with the current snapshot
		}
		reused := pc.c != nil
		if !reused {
			st := n.st.Load()
			c, err := n.dialTLS(ctx, "tcp", net.JoinHostPort(peer, "443"))
			if err != nil {
				return 0, nil, callError(peer, err)
			}
			if !pc.set(c, st) {
				return 0, nil, callError(peer, errUnreachable)
			}
		}
		status, raw, err := pc.roundTrip(ctx, peer, body, n.maxPullAnswer(), idle, line)
		if err == nil {
			return status, raw, nil
		}
		pc.drop()
		if errors.Is(err, errLine) {
			return 0, nil, errors.Unwrap(err)
		}
		if errors.Is(err, errStale) && reused && attempt == 0 && ctx.Err() == nil {
			continue // safe to send again: acks are idempotent and rows stay until acked
		}
		if ctx.Err() != nil {
			err = ctx.Err()
		}
		return 0, nil, callError(peer, err)
	}
}

// lineError is line's own error, ended a followed answer (returned as it is, unwrapped).
type lineError struct{ err error }

func (e lineError) Error() string        { return e.err.Error() }
func (e lineError) Unwrap() error        { return e.err }
func (e lineError) Is(target error) bool { return target == errLine }

var errLine = errors.New("fed: a followed pull's line was refused")

// roundTrip writes one request and reads its answer. The connection is left usable only on
// success with a kept-alive answer read in full; the caller drops it otherwise. With line
// set, a 200 answer of JSON lines is read a line at a time (readLines).
func (pc *pullConn) roundTrip(ctx context.Context, peer string, body []byte, limit int64, idle time.Duration, line func([]byte) error) (int, []byte, error) {
	c := pc.c
	if d, ok := ctx.Deadline(); ok {
		c.SetDeadline(d)
	} else if line != nil {
		// A followed pull has no end of its own: its answer's start, then each line, must
		// come within the idle time.
		c.SetDeadline(time.Now().Add(idle + InboxAckTimeout))
	} else {
		c.SetDeadline(time.Time{})
	}
	// A cancelled context (the daemon stopping) ends a long-poll in flight at once.
	stop := context.AfterFunc(ctx, func() { c.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	w := pc.w
	w.WriteString("POST /fed/v2/inbox HTTP/1.1\r\nHost: ")
	w.WriteString(peer)
	w.WriteString("\r\nContent-Type: application/json\r\nContent-Length: ")
	w.WriteString(strconv.Itoa(len(body)))
	w.WriteString("\r\n\r\n")
	w.Write(body)
	if err := w.Flush(); err != nil {
		if errors.Is(err, syscall.EPIPE) || errors.Is(err, syscall.ECONNRESET) {
			return 0, nil, fmt.Errorf("%w: %v", errStale, err)
		}
		return 0, nil, err
	}
	if _, err := pc.r.Peek(1); err != nil {
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNRESET) {
			return 0, nil, fmt.Errorf("%w: %v", errStale, err)
		}
		return 0, nil, err
	}
	resp, err := http.ReadResponse(pc.r, nil)
	if err != nil {
		return 0, nil, err
	}
	if line != nil && resp.StatusCode == http.StatusOK && resp.Header.Get("Content-Type") == followType {
		if err := readLines(c, resp.Body, limit, idle, line); err != nil {
			// Closed first: closing the body would read the rest of the answer, which a
			// hub keeps writing for as long as it has mail.
			c.Close()
			resp.Body.Close()
			return 0, nil, err
		}
		resp.Body.Close()
		if resp.Close {
			pc.drop()
		}
		return 0, nil, nil
	}
	raw, err := io.ReadAll(io.LimitReader(resp.Body, limit+1))
	resp.Body.Close()
	if err != nil {
		return 0, nil, err
	}
	if int64(len(raw)) > limit {
		return 0, nil, fmt.Errorf("fed: pull answer over %d bytes", limit)
	}
	if resp.Close {
		pc.drop() // the hub closes it after this answer
	}
	return resp.StatusCode, raw, nil
}

// readLines reads a followed answer's lines from body until its end, each at most limit
// bytes, giving each to line; the connection's read deadline is idle plus InboxAckTimeout
// from each line on (a hub ends its answer after idle without a line).
func readLines(c net.Conn, body io.Reader, limit int64, idle time.Duration, line func([]byte) error) error {
	r := bufio.NewReaderSize(body, 64<<10)
	for {
		c.SetReadDeadline(time.Now().Add(idle + InboxAckTimeout))
		var buf []byte
		for {
			part, err := r.ReadSlice('\n')
			buf = append(buf, part...)
			if int64(len(buf)) > limit {
				return errLineTooLong
			}
			if err == bufio.ErrBufferFull {
				continue
			}
			if err == io.EOF && len(buf) == 0 {
				return nil // the answer's end
			}
			if err != nil {
				return err
			}
			break
		}
		if err := line(buf); err != nil {
			return lineError{err}
		}
	}
}
