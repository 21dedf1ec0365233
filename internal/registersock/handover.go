package registersock

import (
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// A waiting poll is answered by the goroutine that queues its message (handOver), not by
// the loop: waking the loop's goroutine for it costs more than the answer (the runtime wakes
// another thread to run it while the queuing goroutine still runs). The loop stays in its read
// (ReadAhead) meanwhile and takes up the next frame when it comes. Exactly one side answers a
// poll: whoever moves it out of pollWaiting.
const (
	pollWaiting  int32 = iota // the loop waits; the next message queued may claim the poll
	pollClaimed               // claimed: the queuing goroutine is answering it (handOver)
	pollAnswered              // the deliver frame is out (or what is left of it is the loop's to write)
	pollReturned              // the queuing goroutine did not answer: the loop looks again
	pollGone                  // the registered process is gone, or the connection broke: it ends unanswered
	pollClosed                // the loop left the wait itself: nobody else answers it
)

// waiting is one connection's poll while it waits, and what a handover leaves the loop.
type waiting struct {
	state atomic.Int32
	// ahead is the number of frames the loop has read ahead of the poll (ReadAhead's until):
	// a handover that answers the poll wakes the loop when there are any, since their
	// sender may be waiting for their answers before it sends anything more.
	ahead atomic.Int32
	// mu is held from a claim to the handover's end; the loop takes it to wait for that.
	mu sync.Mutex
	// rest is the part of the deliver frame the handover could not write without waiting:
	// the loop writes it (set before mu is released, read after the loop takes it).
	rest []byte
}

// open starts a wait.
func (w *waiting) open() {
	w.state.Store(pollWaiting)
	w.ahead.Store(0)
	w.rest = nil
}

// claim is called when a message is queued: true when the caller is to answer the poll
// (handOver), which then holds mu.
func (w *waiting) claim() bool {
	if !w.state.CompareAndSwap(pollWaiting, pollClaimed) {
		return false
	}
	w.mu.Lock()
	return true
}

// close ends the wait on the loop's side: true when nobody else answers the poll. Otherwise it
// waits for the handover to end, whose outcome is then w.state.
func (w *waiting) close() bool {
	if w.state.CompareAndSwap(pollWaiting, pollClosed) {
		return true
	}
	w.mu.Lock()
	w.mu.Unlock() // taken only to wait for the handover's end
	return false
}

// answeredAhead is ReadAhead's until: the wait ends once the poll is answered by a
// handover and the next frame is in. The count is published before the state is read, and
// the handover stores its outcome before it reads the count: one of them sees the other.
func (w *waiting) answeredAhead(lines int) bool {
	w.ahead.Store(int32(lines))
	return lines > 0 && w.state.Load() == pollAnswered
}

// handOver answers l's waiting poll (claimed, w.mu held) on the goroutine that queued a
// message for it: the same checks and frame as the loop's own answer, written without
// waiting. What it cannot do that way is left to the loop, woken for it: a deliver frame
// the socket has no room for (the rest of it), a poll that finds nothing after all (the
// message went to a takeover, or expired), a failed poll (the loop polls again and answers
// the error). A client that does not read its socket so holds up only its own loop, never the
// sender that queued the message.
func (s *Server) handOver(l *conn, w *waiting) {
	outcome := pollReturned
	defer func() {
		w.state.Store(outcome)
		// The loop is woken unless the poll was answered in full and no frame of the
		// client's waits ahead: its next frame then wakes the loop's read anyway.
		if outcome != pollAnswered || len(w.rest) > 0 || w.ahead.Load() > 0 {
			l.c.SetReadDeadline(time.Unix(1, 0))
		}
		w.mu.Unlock()
	}()
	if l.ctx.Err() != nil {
		return // taken over or shutting down: the loop ends the poll
	}
	p, err := s.cfg.Bus.Poll(l.ctx, l.reg, 0)
	if err != nil || p == nil {
		return
	}
	if !s.alive(l, "poll") {
		outcome = pollGone
		return
	}
	line := s.answer(l.reg, *p, int(l.batch.Load()))
	// The write deadline left by the last answer has passed on a connection idle longer
	// than writeTimeout, and would refuse the write; this one never waits, so needs none.
	l.c.SetWriteDeadline(time.Time{})
	n, err := writeNow(l.raw, line)
	if err != nil {
		s.cfg.Log.Debug("write abandoned", "socket", "register", "actor", l.actor, "err", err)
		outcome = pollGone
		return
	}
	if n < len(line) {
		w.rest = line[n:]
	}
	outcome = pollAnswered
}

// rawOf is c's descriptor, for writes that must not wait; nil when it has none.
func rawOf(c net.Conn) syscall.RawConn {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return nil
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return nil
	}
	return rc
}

// writeNow writes as much of line as rc's socket takes without waiting: n is what was
// written (0 when the socket is full), err a failure of the connection.
func writeNow(rc syscall.RawConn, line []byte) (n int, err error) {
	var werr error
	if err := rc.Write(func(fd uintptr) bool {
		for n < len(line) {
			m, err := unix.Write(int(fd), line[n:])
			switch {
			case err == unix.EINTR:
				continue
			case err == unix.EAGAIN:
				return true // full: the loop writes the rest, waiting as it may
			case err != nil:
				werr = err
				return true
			}
			n += m
		}
		return true
	}); err != nil {
		return n, err
	}
	return n, werr
}
