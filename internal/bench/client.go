package bench

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// httpConn is a minimal HTTP/1.1 client on one keep-alive Unix connection: the bench should
// measure the daemon, not a client library.
type httpConn struct {
	c   net.Conn
	r   *bufio.Reader
	buf []byte
}

func dialHTTP(sock string) (*httpConn, error) {
	c, err := net.Dial("unix", sock)
	if err != nil {
		return nil, err
	}
	return &httpConn{c: c, r: bufio.NewReader(c)}, nil
}

func (h *httpConn) close() { h.c.Close() }

func (h *httpConn) do(method, path string, body []byte) (int, []byte, error) {
	b := h.buf[:0]
	b = append(b, method...)
	b = append(b, ' ')
	b = append(b, path...)
	b = append(b, " HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: "...)
	b = strconv.AppendInt(b, int64(len(body)), 10)
	b = append(b, "\r\n\r\n"...)
	b = append(b, body...)
	h.buf = b
	if _, err := h.c.Write(b); err != nil {
		return 0, nil, err
	}
	resp, err := http.ReadResponse(h.r, nil)
	if err != nil {
		return 0, nil, err
	}
	raw, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp.StatusCode, raw, err
}

// progress keeps one line on stderr up to date: the run, the path, and how far it is.
type progress struct {
	w     io.Writer
	tty   bool // redraw one line; otherwise one line per path
	mu    sync.Mutex
	run   string
	name  string
	total int
	n     atomic.Int64
	stop  chan struct{}
	wg    sync.WaitGroup
}

func newProgress(w io.Writer) *progress {
	p := &progress{w: w, stop: make(chan struct{})}
	if f, ok := w.(*os.File); ok {
		if fi, err := f.Stat(); err == nil && fi.Mode()&os.ModeCharDevice != 0 {
			p.tty = true
		}
	}
	if w == nil || !p.tty {
		return p
	}
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		t := time.NewTicker(200 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-p.stop:
				return
			case <-t.C:
				p.print()
			}
		}
	}()
	return p
}

func (p *progress) print() {
	p.mu.Lock()
	defer p.mu.Unlock()
	of := ""
	if p.total > 0 {
		of = fmt.Sprintf(" %d/%d", p.n.Load(), p.total)
	}
	fmt.Fprintf(p.w, "\r\033[K%s: %s%s", p.run, p.name, of)
}

func (p *progress) set(name string, total int) {
	p.mu.Lock()
	p.name, p.total = name, total
	p.n.Store(0)
	if p.w != nil && !p.tty {
		fmt.Fprintf(p.w, "%s: %s\n", p.run, name)
	}
	p.mu.Unlock()
}

func (p *progress) tick(n int) { p.n.Add(int64(n)) }

func (p *progress) done() {
	close(p.stop)
	p.wg.Wait()
	if p.w != nil && p.tty {
		fmt.Fprint(p.w, "\r\033[K")
	}
}
