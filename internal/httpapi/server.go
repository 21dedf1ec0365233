package httpapi

// A lean HTTP/1.1 server for http.sock and the TCP listener. net/http's server costs about
// 67 µs of CPU per request on one connection (28 µs at 64): most of it is the background
// read it starts for every request (a goroutine parked on the connection, woken and stopped
// with a deadline each time: cross-thread wake-ups that are expensive on a small VM) and its
// response machinery. This loop parses with the standard library's http.ReadRequest (request
// line, headers, Content-Length / Transfer-Encoding validation, chunked bodies) and writes the
// response itself. It keeps net/http's behaviour where a client can see it: keep-alive and
// pipelining, Connection: close, HTTP/1.0 (keep-alive only when asked for), Expect:
// 100-continue, the header size limit (431), 400/501/505 for bad requests, an unread body
// drained (at most 256 KiB) or the connection closed, the header/idle/write deadlines, and
// the answer's bytes (status line, the handler's headers in sorted order, Date, Connection).
//
// What it does not do: the background read. A handler that waits (a reply long-poll, a call
// to a federation peer) asks for hangupContext, which starts one for that request only, so a
// client that hangs up still frees its waiter place at once. Unlike net/http's, that watch
// keeps reading past pipelined bytes (up to 64 KiB, held for the next request), so a client
// that pipelined and hung up is seen to go too; EOF ends the wait even after a half-close.
//
// FuzzDifferential (server_fuzz_test.go) feeds the same bytes to this server and to
// net/http.Server and compares status, framing and the requests seen; the divergences it
// tolerates are listed there.

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"reflect"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// maxPostHandlerRead is how much of a body the handler left unread is drained to keep the
// connection (net/http's maxPostHandlerReadBytes); more, and the connection is closed.
const maxPostHandlerRead = 256 << 10

// Server serves Handler on HTTP/1.1 connections. Its zero timeouts mean none.
type Server struct {
	Handler        http.Handler
	HeaderTimeout  time.Duration // from the start of a request's headers
	IdleTimeout    time.Duration // between requests on a keep-alive connection
	WriteTimeout   time.Duration // from the end of a request's headers to the end of its answer
	MaxHeaderBytes int
	// BaseContext, when set, is the parent of every request's context (cancelled at stop,
	// so that long-polls answer at once).
	BaseContext func(net.Listener) context.Context
	Log         *slog.Logger

	mu        sync.Mutex
	listeners map[*net.Listener]struct{}
	conns     map[*conn]struct{}
	closing   atomic.Bool
}

// Serve accepts connections on l until Shutdown or Close, then returns http.ErrServerClosed
// (like net/http); it closes l.
func (s *Server) Serve(l net.Listener) error {
	l = &onceCloseListener{Listener: l}
	defer l.Close()
	if !s.track(&l, true) {
		return http.ErrServerClosed
	}
	defer s.track(&l, false)
	base := context.Background()
	if s.BaseContext != nil {
		base = s.BaseContext(l)
	}
	var delay time.Duration // how long to sleep on accept failure, as net/http does
	for {
		nc, err := l.Accept()
		if err != nil {
			if s.closing.Load() {
				return http.ErrServerClosed
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Temporary() { //nolint:staticcheck // EMFILE and the like
				delay = min(max(2*delay, 5*time.Millisecond), time.Second)
				s.logf("http: Accept error: %v; retrying in %v", err, delay)
				time.Sleep(delay)
				continue
			}
			return err
		}
		delay = 0
		c := &conn{s: s, nc: nc, ctx: connContext(base, nc), since: time.Now()}
		if !s.trackConn(c, true) {
			nc.Close()
			return http.ErrServerClosed
		}
		go c.serve()
	}
}

// Shutdown stops accepting, closes idle connections, and waits until every active request is
// answered (each connection closes after its answer) or ctx ends.
func (s *Server) Shutdown(ctx context.Context) error {
	s.closing.Store(true)
	err := s.closeListeners()
	wait := time.Millisecond
	t := time.NewTimer(wait)
	defer t.Stop()
	for {
		if s.closeIdle() {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
			wait = min(2*wait, 500*time.Millisecond)
			t.Reset(wait)
		}
	}
}

// Close closes the listeners and every connection at once.
func (s *Server) Close() error {
	s.closing.Store(true)
	err := s.closeListeners()
	s.mu.Lock()
	defer s.mu.Unlock()
	for c := range s.conns {
		c.nc.Close()
		delete(s.conns, c)
	}
	return err
}

func (s *Server) track(l *net.Listener, add bool) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !add {
		delete(s.listeners, l)
		return true
	}
	if s.closing.Load() {
		return false
	}
	if s.listeners == nil {
		s.listeners = map[*net.Listener]struct{}{}
	}
	s.listeners[l] = struct{}{}
	return true
}

func (s *Server) trackConn(c *conn, add bool) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !add {
		delete(s.conns, c)
		return true
	}
	if s.closing.Load() {
		return false
	}
	if s.conns == nil {
		s.conns = map[*conn]struct{}{}
	}
	s.conns[c] = struct{}{}
	return true
}

func (s *Server) closeListeners() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	var err error
	for l := range s.listeners {
		if cerr := (*l).Close(); cerr != nil && err == nil {
			err = cerr
		}
	}
	return err
}

// closeIdle closes the connections that wait between requests (and those that never sent a
// request within 5 s, as net/http does) and reports whether none is left.
func (s *Server) closeIdle() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for c := range s.conns {
		st := connState(c.state.Load())
		if st == stateIdle || (st == stateNew && time.Since(c.since) > 5*time.Second) {
			c.nc.Close()
			delete(s.conns, c)
		}
	}
	return len(s.conns) == 0
}

func (s *Server) logf(format string, args ...any) {
	if s.Log != nil {
		s.Log.Debug(fmt.Sprintf(format, args...))
	}
}

type onceCloseListener struct {
	net.Listener
	once sync.Once
	err  error
}

func (l *onceCloseListener) Close() error {
	l.once.Do(func() { l.err = l.Listener.Close() })
	return l.err
}

type connState int32

const (
	stateNew connState = iota
	stateActive
	stateIdle
)

// conn is one client connection; requests are served one after another on its goroutine.
type conn struct {
	s     *Server
	nc    net.Conn
	ctx   context.Context
	since time.Time
	state atomic.Int32
	cr    connReader
	br    *bufio.Reader
	bw    *bufio.Writer
	date  []byte
}

func (c *conn) setState(st connState) { c.state.Store(int32(st)) }

func (c *conn) serve() {
	defer func() {
		if err := recover(); err != nil && err != http.ErrAbortHandler {
			c.s.logf("http: panic serving: %v\n%s", err, debug.Stack())
		}
		c.nc.Close()
		c.s.trackConn(c, false)
	}()
	c.cr.nc = c.nc
	c.br = bufio.NewReaderSize(&c.cr, 4<<10)
	c.bw = bufio.NewWriterSize(c.nc, 4<<10)
	// Under Listener, the connection says when it waits (it may be evicted for a new one)
	// and when a request begins (counted against its holder's requests in progress).
	lc, _ := c.nc.(*limitConn)
	lastPost := false
	for first := true; ; first = false {
		if !first {
			// Between requests: the idle deadline, counted once until the next request starts.
			c.setState(stateIdle)
			if c.s.closing.Load() {
				return
			}
			c.setReadDeadline(c.s.IdleTimeout)
			if lc != nil {
				lc.wait()
			}
			if _, err := c.br.Peek(4); err != nil {
				return
			}
		} else if lc != nil {
			// The first request's header deadline runs from the connect, as net/http's;
			// until its first byte the connection is idle (evictable).
			c.setReadDeadline(c.s.HeaderTimeout)
			if _, err := c.br.Peek(1); err != nil {
				return
			}
		}
		if lc != nil {
			if ok, evicted := lc.begin(); !ok {
				if !evicted {
					// Busy connections cannot be evicted: this bound keeps one holder from
					// taking them all. Answered, then closed without a reset.
					lc.refuseBusy()
				}
				return
			}
		}
		c.setState(stateActive)
		w, ok := c.readRequest(lastPost, first && lc != nil)
		if !ok {
			return
		}
		lastPost = w.req.Method == http.MethodPost
		if w.req.RequestURI == "*" && w.req.Method == http.MethodOptions {
			// net/http answers "OPTIONS *" itself: 200, no body.
			w.Header().Set("Content-Length", "0")
		} else {
			c.s.Handler.ServeHTTP(w, w.req)
		}
		if !w.finish() {
			return
		}
	}
}

// setReadDeadline sets the read deadline d from now (none for 0).
func (c *conn) setReadDeadline(d time.Duration) {
	var t time.Time
	if d > 0 {
		t = time.Now().Add(d)
	}
	c.nc.SetReadDeadline(t)
}

// errorHeaders follow the status of an answer to a request that could not be read.
const errorHeaders = "\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n"

// readRequest reads the next request's headers within the header deadline and the header
// size limit. On a request that cannot be served it answers as net/http would (or not at
// all, for a connection that ended or timed out) and reports false.
func (c *conn) readRequest(lastPost, peeked bool) (*response, bool) {
	if !peeked {
		c.setReadDeadline(c.s.HeaderTimeout)
	}
	max := c.s.MaxHeaderBytes
	if max <= 0 {
		max = http.DefaultMaxHeaderBytes
	}
	allowance := int64(max) + 4096 // net/http's allowance for bufio's read-ahead
	if peeked {
		// The first request's bytes already read (to see it begin) count, as they would
		// in net/http, which reads a first request without peeking.
		allowance -= int64(c.br.Buffered())
	}
	c.cr.limit(allowance)
	if lastPost {
		// RFC 7230 section 3 tolerance for old clients that end a POST body with CRLF.
		peek, _ := c.br.Peek(4)
		n := 0
		for n < len(peek) && (peek[n] == '\r' || peek[n] == '\n') {
			n++
		}
		c.br.Discard(n)
	}
	req, err := http.ReadRequest(c.br)
	if err == nil {
		err = checkRequest(req)
	}
	tooLarge := c.cr.hit
	c.cr.unlimit()
	if err != nil {
		if d := c.s.WriteTimeout; d > 0 {
			c.nc.SetWriteDeadline(time.Now().Add(d))
		}
		c.answerBadRequest(err, tooLarge)
		return nil, false
	}
	// The headers are in: the body (if any) has its own deadline (bodyDeadline), set by the
	// handler; the answer has the write deadline.
	c.nc.SetReadDeadline(time.Time{})
	if d := c.s.WriteTimeout; d > 0 {
		c.nc.SetWriteDeadline(time.Now().Add(d))
	}
	w := &response{c: c, status: http.StatusOK, contentLength: -1}
	if req.Body != nil && req.Body != http.NoBody {
		w.body = &requestBody{rc: req.Body, w: w, orig: req}
		req.Body = w.body
	}
	w.req = req.WithContext(c.ctx)
	if isH2Upgrade(req) {
		w.closeAfter = true // net/http: a handler may hijack it; nothing else can follow
	}
	w.wantsClose = req.Close
	w.http10KeepAlive = !req.ProtoAtLeast(1, 1) && hasToken(req.Header.Get("Connection"), "keep-alive")
	if hasToken(req.Header.Get("Expect"), "100-continue") {
		if req.ProtoAtLeast(1, 1) && req.ContentLength != 0 && w.body != nil {
			w.body.expectContinue = true
		}
	} else if req.Header.Get("Expect") != "" {
		w.Header().Set("Connection", "close")
		w.WriteHeader(http.StatusExpectationFailed)
		w.finish()
		return nil, false
	}
	return w, true
}

// answerBadRequest answers a request that could not be read, in net/http's words.
func (c *conn) answerBadRequest(err error, tooLarge bool) {
	var status string
	var se statusError
	switch {
	case tooLarge:
		status = "431 Request Header Fields Too Large"
		fmt.Fprint(c.nc, "HTTP/1.1 "+status+errorHeaders+status)
		c.closeWriteAndWait()
		return
	case isUnsupportedTE(err):
		// Not echoing the transfer coding back (net/http: cross-site scripting).
		fmt.Fprintf(c.nc, "HTTP/1.1 %d %s%sUnsupported transfer encoding", http.StatusNotImplemented, http.StatusText(http.StatusNotImplemented), errorHeaders)
		return
	case isCommonNetReadError(err):
		return // the client went away or timed out: nothing to say
	case errors.As(err, &se):
		status = fmt.Sprintf("%d %s: %s", se.code, http.StatusText(se.code), se.text)
	default:
		status = "400 Bad Request"
	}
	fmt.Fprint(c.nc, "HTTP/1.1 "+status+errorHeaders+status)
}

// closeWriteAndWait half-closes the connection and gives the client a moment to read the
// answer before the close, as net/http does; meanwhile it reads and discards what the client
// still sends (at most 1 MiB), which net/http does not: a close with unread bytes resets the
// connection, and a reset can destroy the answer in the client's buffer before it is read.
func (c *conn) closeWriteAndWait() {
	if cw, ok := c.nc.(interface{ CloseWrite() error }); ok {
		cw.CloseWrite()
	}
	c.nc.SetReadDeadline(time.Now().Add(500 * time.Millisecond))
	io.Copy(io.Discard, io.LimitReader(c.br, 1<<20))
}

// unsupportedTE is the type net/http's ReadRequest gives a Transfer-Encoding it does not
// serve (one it does not know, or more than one header): unexported, so named by its type's
// name, which TestUnsupportedTEErrorType pins to the Go release in use (the differential
// fuzz test would see it too: a 400 where net/http says 501).
const unsupportedTE = "*http.unsupportedTEError"

func isUnsupportedTE(err error) bool {
	for ; err != nil; err = errors.Unwrap(err) {
		if reflect.TypeOf(err).String() == unsupportedTE {
			return true
		}
	}
	return false
}

// isH2Upgrade is net/http's Request.isH2Upgrade: the HTTP/2 client preface, which net/http
// hands to the handler (to hijack) and then closes.
func isH2Upgrade(r *http.Request) bool {
	return r.Method == "PRI" && len(r.Header) == 0 && r.URL.Path == "*" && r.Proto == "HTTP/2.0"
}

func isCommonNetReadError(err error) bool {
	if err == io.EOF {
		return true
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return true
	}
	var oe *net.OpError
	return errors.As(err, &oe) && oe.Op == "read"
}

// statusError is a request refused with a status and a reason (net/http's statusError).
type statusError struct {
	code int
	text string
}

func (e statusError) Error() string { return http.StatusText(e.code) + ": " + e.text }

// checkRequest is what net/http's server checks after http.ReadRequest.
func checkRequest(req *http.Request) error {
	// net/http's http1ServerSupportsRequest: HTTP/1.x, and the HTTP/2 preface "PRI *".
	if req.ProtoMajor != 1 && !(req.ProtoMajor == 2 && req.ProtoMinor == 0 && req.Method == "PRI" && req.RequestURI == "*") {
		return statusError{http.StatusHTTPVersionNotSupported, "unsupported protocol version"}
	}
	// ReadRequest moved Host into req.Host and dropped the header; an HTTP/1.1 request must
	// have sent one. (Two divergences from net/http follow, listed in FuzzDifferential: an
	// empty "Host:" is refused here, since http.ReadRequest leaves no trace of an empty
	// header, and for an absolute-form target, "GET http://h/ HTTP/1.1", req.Host is the
	// target's, so a missing or malformed Host header is not seen; no client sends either.)
	if req.ProtoAtLeast(1, 1) && req.Host == "" && !isH2Upgrade(req) && req.Method != "CONNECT" {
		return statusError{http.StatusBadRequest, "missing required Host header"}
	}
	if !validHost(req.Host) {
		return statusError{http.StatusBadRequest, "malformed Host header"}
	}
	for k, vv := range req.Header {
		if !validFieldName(k) {
			return statusError{http.StatusBadRequest, "invalid header name"}
		}
		for _, v := range vv {
			if !validFieldValue(v) {
				return statusError{http.StatusBadRequest, "invalid header value"}
			}
		}
	}
	return nil
}

// validHost is httpguts.ValidHostHeader: the bytes a Host header may hold.
func validHost(h string) bool {
	for i := 0; i < len(h); i++ {
		if !validHostByte[h[i]] {
			return false
		}
	}
	return true
}

var validHostByte = func() (t [256]bool) {
	for _, b := range []byte("0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ!$%&'()*+,-.:;=[]_~") {
		t[b] = true
	}
	return t
}()

// validFieldName is a token (RFC 7230 section 3.2.6).
func validFieldName(k string) bool {
	if k == "" {
		return false
	}
	for i := 0; i < len(k); i++ {
		b := k[i]
		if b <= ' ' || b >= 0x7f || strings.IndexByte(`"(),/:;<=>?@[\]{}`, b) >= 0 {
			return false
		}
	}
	return true
}

// validFieldValue has no control byte other than horizontal tab.
func validFieldValue(v string) bool {
	for i := 0; i < len(v); i++ {
		if b := v[i]; (b < ' ' && b != '\t') || b == 0x7f {
			return false
		}
	}
	return true
}

// hasToken is net/http's: whether v holds token (any case) between token boundaries
// (start or end, space, comma, tab). Not a split on commas: "100-continue x" holds
// "100-continue" for net/http, and the answers must agree (FuzzDifferential found it).
func hasToken(v, token string) bool {
	if len(token) > len(v) || token == "" {
		return false
	}
	if v == token {
		return true
	}
	boundary := func(b byte) bool { return b == ' ' || b == ',' || b == '\t' }
	for sp := 0; sp <= len(v)-len(token); sp++ {
		if b := v[sp]; b != token[0] && b|0x20 != token[0] {
			continue
		}
		if sp > 0 && !boundary(v[sp-1]) {
			continue
		}
		if end := sp + len(token); end != len(v) && !boundary(v[end]) {
			continue
		}
		if strings.EqualFold(v[sp:sp+len(token)], token) {
			return true
		}
	}
	return false
}

// connReader is the connection under the bufio.Reader: it caps what the headers may read,
// and hands out first the bytes a hang-up watch read (pipelined data).
type connReader struct {
	nc      net.Conn
	remain  int64 // bytes left to read while limited; < 0 unlimited
	limited bool
	hit     bool
	held    []byte // what the hang-up watch read, not yet handed out
}

// maxHeld bounds what a hang-up watch reads ahead: a client that sends more than this while
// its answer is awaited is treated as gone (its wait ends), so the watch never stops
// watching (which let a client that pipelined one byte and hung up keep its waiter place).
const maxHeld = 64 << 10

func (r *connReader) limit(n int64) { r.remain, r.limited, r.hit = n, true, false }
func (r *connReader) unlimit()      { r.limited = false }

func (r *connReader) Read(p []byte) (int, error) {
	if r.limited {
		if r.remain <= 0 {
			r.hit = true
			return 0, io.EOF
		}
		if int64(len(p)) > r.remain {
			p = p[:r.remain]
		}
	}
	if len(r.held) > 0 && len(p) > 0 {
		n := copy(p, r.held)
		r.held = r.held[n:]
		if len(r.held) == 0 {
			r.held = nil
		}
		r.remain -= int64(n)
		return n, nil
	}
	n, err := r.nc.Read(p)
	r.remain -= int64(n)
	return n, err
}

// requestBody is the request body as the handler sees it: it sends 100 Continue before the
// first read when the client asked for it, and records whether it was read to the end.
type requestBody struct {
	rc             io.ReadCloser
	w              *response
	orig           *http.Request // ReadRequest's: its body reader files the trailers there
	expectContinue bool
	sentContinue   bool
	sawEOF         bool
	err            error // a read error other than EOF: the connection is not reusable
}

func (b *requestBody) Read(p []byte) (int, error) {
	if b.sawEOF {
		return 0, io.EOF
	}
	if b.expectContinue && !b.sentContinue {
		b.sentContinue = true
		if !b.w.wroteHeader {
			b.w.c.bw.WriteString("HTTP/1.1 100 Continue\r\n\r\n")
			b.w.c.bw.Flush()
		}
	}
	n, err := b.rc.Read(p)
	// A Content-Length body cut short by the client's EOF is at its end too (net/http's body
	// marks it so: the connection then ends on its own, without a Connection: close); a
	// chunked one is not (its reader's error is sticky, and net/http says close), nor one
	// behind Expect: 100-continue (net/http's expectContinueReader sees only io.EOF).
	if err == io.EOF || err == io.ErrUnexpectedEOF && b.orig != nil && b.orig.ContentLength > 0 && !b.expectContinue {
		b.sawEOF = true
		// The trailers were read with the last chunk, into ReadRequest's request (the
		// handler holds a copy made with its context): hand them over, as net/http does.
		if b.orig != nil && b.w.req != nil && b.orig.Trailer != nil {
			b.w.req.Trailer = b.orig.Trailer
		}
	} else if err != nil {
		b.err = err
	}
	return n, err
}

func (b *requestBody) Close() error { return nil }

// response is the http.ResponseWriter of one request.
type response struct {
	c               *conn
	req             *http.Request
	body            *requestBody // nil without a body
	header          http.Header
	status          int
	wroteHeader     bool // WriteHeader was called (logically)
	sentHeader      bool // the header is in the connection's buffer
	contentLength   int64
	written         int64
	pending         []byte // body held back until the end when no Content-Length was set
	wantsClose      bool
	http10KeepAlive bool
	closeAfter      bool
	bodyLeft        bool // closed with its request body unread: half-close and wait (net/http)
	watch           *hangupWatch
	after           []func() // run once the answer is flushed (afterAnswer)
	// streaming: the handler flushed before its answer was whole (Flush); the header is out
	// and the body goes as chunks (HTTP/1.1) or as bytes up to the close (HTTP/1.0).
	streaming bool
	chunked   bool
}

func (w *response) Header() http.Header {
	if w.header == nil {
		w.header = make(http.Header, 2)
	}
	return w.header
}

func (w *response) WriteHeader(code int) {
	if w.wroteHeader {
		return
	}
	if code < 100 || code > 999 {
		panic(fmt.Sprintf("invalid WriteHeader code %v", code))
	}
	if code < 200 {
		return // informational answers are not ours to send
	}
	w.wroteHeader = true
	w.status = code
	if cl := w.header.Get("Content-Length"); cl != "" {
		if n, err := strconv.ParseInt(cl, 10, 64); err == nil && n >= 0 {
			w.contentLength = n
		} else {
			w.header.Del("Content-Length")
		}
	}
}

func (w *response) Write(p []byte) (int, error) {
	if !w.wroteHeader {
		w.WriteHeader(http.StatusOK)
	}
	if !bodyAllowed(w.status) {
		return 0, http.ErrBodyNotAllowed
	}
	if w.contentLength >= 0 && w.written+int64(len(p)) > w.contentLength {
		return 0, http.ErrContentLength
	}
	w.written += int64(len(p))
	if w.req.Method == http.MethodHead {
		return len(p), nil
	}
	if w.contentLength < 0 {
		w.pending = append(w.pending, p...)
		return len(p), nil
	}
	w.sendHeader(p)
	return w.c.bw.Write(p)
}

// SetReadDeadline is what http.NewResponseController(w).SetReadDeadline calls.
func (w *response) SetReadDeadline(t time.Time) error { return w.c.nc.SetReadDeadline(t) }

// SetWriteDeadline is what http.NewResponseController(w).SetWriteDeadline calls.
func (w *response) SetWriteDeadline(t time.Time) error { return w.c.nc.SetWriteDeadline(t) }

// sendHeader writes the status line and headers into the connection's buffer, once. Before
// that it settles the body the handler left unread, as net/http does: drained (up to 256 KiB)
// to keep the connection, else the connection is closed after the answer.
func (w *response) sendHeader(p []byte) {
	if w.sentHeader {
		return
	}
	w.sentHeader = true
	if w.header == nil {
		w.header = http.Header{}
	}
	h := w.header
	isHEAD := w.req.Method == http.MethodHead
	is11 := w.req.ProtoAtLeast(1, 1)
	closing := w.c.s.closing.Load()
	if w.http10KeepAlive {
		if !(isHEAD || w.contentLength >= 0 || !bodyAllowed(w.status)) {
			w.closeAfter = true
		}
	} else if !is11 || w.wantsClose {
		w.closeAfter = true
	}
	if h.Get("Connection") == "close" || closing {
		w.closeAfter = true
	}
	if b := w.body; b != nil {
		switch {
		case b.expectContinue && !b.sentContinue:
			w.closeAfter = true // the client has not sent the body
		case b.err != nil:
			w.closeAfter = true
		case !b.sawEOF && !w.closeAfter:
			n, err := io.CopyN(io.Discard, b, maxPostHandlerRead+1)
			if err != io.EOF || n > maxPostHandlerRead {
				w.closeAfter = true
				w.bodyLeft = b.err == nil
			}
		case !b.sawEOF:
			w.bodyLeft = true
		}
	}
	if !bodyAllowed(w.status) {
		h.Del("Content-Length")
		h.Del("Transfer-Encoding")
	} else if _, ok := h["Content-Type"]; !ok && h.Get("Content-Encoding") == "" && len(p) > 0 {
		h.Set("Content-Type", http.DetectContentType(p))
	}
	// A Connection: close of the handler's own stays where it is; otherwise the server says it.
	sayClose := w.closeAfter && (closing || !hasToken(h.Get("Connection"), "close"))
	if sayClose {
		h.Del("Connection")
	}
	bw := w.c.bw
	if is11 {
		bw.WriteString("HTTP/1.1 ")
	} else {
		bw.WriteString("HTTP/1.0 ")
	}
	bw.Write(strconv.AppendInt(w.c.date[:0], int64(w.status), 10))
	bw.WriteByte(' ')
	if text := http.StatusText(w.status); text != "" {
		bw.WriteString(text)
	} else {
		bw.WriteString("status code ")
		bw.Write(strconv.AppendInt(w.c.date[:0], int64(w.status), 10))
	}
	bw.WriteString("\r\n")
	if len(h) > 0 {
		h.Write(bw) // sorted by key, like net/http
	}
	if _, ok := h["Date"]; !ok {
		w.c.date = time.Now().UTC().AppendFormat(w.c.date[:0], http.TimeFormat)
		bw.WriteString("Date: ")
		bw.Write(w.c.date)
		bw.WriteString("\r\n")
	}
	if _, ok := h["Content-Length"]; !ok && w.contentLength >= 0 && bodyAllowed(w.status) {
		bw.WriteString("Content-Length: ")
		bw.Write(strconv.AppendInt(w.c.date[:0], w.contentLength, 10))
		bw.WriteString("\r\n")
	}
	switch {
	case sayClose && is11:
		bw.WriteString("Connection: close\r\n")
	case !w.closeAfter && w.http10KeepAlive && h.Get("Connection") == "":
		bw.WriteString("Connection: keep-alive\r\n")
	}
	bw.WriteString("\r\n")
}

// Flush is http.Flusher's (what http.NewResponseController(w).Flush calls).
func (w *response) Flush() { w.FlushError() }

// FlushError sends what the handler wrote so far, for an answer that is a stream (GET
// /v1/events): the header, then the body written since the last flush. An answer without a
// Content-Length goes as chunks on HTTP/1.1 and, on HTTP/1.0, as bytes up to the close. An
// answer that is never flushed is sent whole, with its length, as before.
func (w *response) FlushError() error {
	if !w.wroteHeader {
		w.WriteHeader(http.StatusOK)
	}
	if !w.sentHeader {
		if w.contentLength < 0 && bodyAllowed(w.status) && w.req.Method != http.MethodHead {
			w.streaming = true
			if w.req.ProtoAtLeast(1, 1) {
				w.chunked = true
				w.Header().Set("Transfer-Encoding", "chunked")
			} else {
				w.closeAfter = true
				w.http10KeepAlive = false
			}
		}
		w.sendHeader(w.pending)
	}
	w.writePending()
	return w.c.bw.Flush()
}

// writePending writes the body held since the last flush of a streamed answer: one chunk.
func (w *response) writePending() {
	if !w.streaming || len(w.pending) == 0 {
		return
	}
	if w.chunked {
		w.c.bw.WriteString(strconv.FormatInt(int64(len(w.pending)), 16))
		w.c.bw.WriteString("\r\n")
		w.c.bw.Write(w.pending)
		w.c.bw.WriteString("\r\n")
	} else {
		w.c.bw.Write(w.pending)
	}
	w.pending = w.pending[:0]
}

// finish completes the answer once the handler returned and reports whether the connection
// takes another request.
func (w *response) finish() bool {
	w.stopWatch()
	if !w.wroteHeader {
		w.WriteHeader(http.StatusOK)
	}
	if w.streaming {
		w.writePending()
		if w.chunked {
			w.c.bw.WriteString("0\r\n\r\n")
		}
		err := w.c.bw.Flush()
		for _, fn := range w.after {
			fn()
		}
		return err == nil && !w.closeAfter && !(w.watch != nil && w.watch.hungUp)
	}
	if w.contentLength < 0 && bodyAllowed(w.status) {
		// The whole body is known now: send it with its length (for HEAD, the length of
		// what the handler wrote, if it wrote anything).
		if w.req.Method != http.MethodHead {
			w.contentLength = int64(len(w.pending))
		} else if w.written > 0 {
			w.contentLength = w.written
		}
	}
	w.sendHeader(w.pending)
	if len(w.pending) > 0 {
		w.c.bw.Write(w.pending)
	}
	err := w.c.bw.Flush()
	for _, fn := range w.after {
		fn()
	}
	if err != nil {
		return false
	}
	if w.contentLength >= 0 && w.written != w.contentLength && w.req.Method != http.MethodHead && bodyAllowed(w.status) {
		return false // the body is shorter than announced: the client cannot frame the next one
	}
	if w.watch != nil && w.watch.hungUp {
		return false
	}
	if w.closeAfter && w.bodyLeft {
		// The client may still be sending the body: closing now, with its bytes unread,
		// would reset the connection and could destroy the answer before it is read.
		w.c.closeWriteAndWait()
	}
	return !w.closeAfter
}

func bodyAllowed(status int) bool {
	return status >= 200 && status != http.StatusNoContent && status != http.StatusNotModified
}

// hangupWatch reads the connection while a handler waits, to notice the client hanging up
// (net/http does this for every request; here only handlers that wait ask for it).
type hangupWatch struct {
	ctx      context.Context
	cancel   context.CancelFunc
	done     chan struct{}
	hungUp   bool
	stopping atomic.Bool // stopWatch's deadline, not another, woke the read
}

// hangup returns a context cancelled when the client hangs up (or the request ends). It reads
// the connection meanwhile, so it is only started once the body was read to the end.
func (w *response) hangup() context.Context {
	if w.watch != nil {
		return w.watch.ctx
	}
	if w.body != nil && !w.body.sawEOF {
		return w.req.Context()
	}
	ctx, cancel := context.WithCancel(w.req.Context())
	hw := &hangupWatch{ctx: ctx, cancel: cancel, done: make(chan struct{})}
	w.watch = hw
	cr := &w.c.cr
	// The watch keeps reading, also past pipelined bytes (kept in cr.held, behind what the
	// bufio.Reader already holds, and handed out in order once the watch stops): a client
	// that pipelined its next request and then hung up is seen to go at once. The connection
	// is not read by anyone else while the watch runs (stopWatch waits for it).
	go func() {
		defer close(hw.done)
		var buf [4 << 10]byte
		for {
			n, err := w.c.nc.Read(buf[:min(len(buf), maxHeld-len(cr.held))])
			cr.held = append(cr.held, buf[:n]...)
			if err != nil {
				var ne net.Error
				if !(errors.As(err, &ne) && ne.Timeout()) {
					hw.hungUp = true
					cancel()
					return
				}
				if hw.stopping.Load() {
					return
				}
				// A deadline left from the body (bodyDeadline), not stopWatch's: keep
				// watching, without it.
				w.c.nc.SetReadDeadline(time.Time{})
				continue
			}
			if len(cr.held) >= maxHeld {
				hw.hungUp = true
				cancel()
				return
			}
		}
	}()
	return ctx
}

// stopWatch ends the request's hang-up watch, if any, before the connection is read again.
func (w *response) stopWatch() {
	hw := w.watch
	if hw == nil {
		return
	}
	select {
	case <-hw.done:
	default:
		hw.stopping.Store(true)
		w.c.nc.SetReadDeadline(time.Unix(1, 0)) // wakes the read
		<-hw.done
		w.c.nc.SetReadDeadline(time.Time{})
	}
	hw.cancel()
}

// afterAnswer returns a function that queues work (the audit line of a send) to run once the
// answer to the request is sent; under another http.ResponseWriter it runs the work at once.
func afterAnswer(w http.ResponseWriter) func(func()) {
	for {
		switch rw := w.(type) {
		case *response:
			return func(fn func()) { rw.after = append(rw.after, fn) }
		case interface{ Unwrap() http.ResponseWriter }:
			w = rw.Unwrap()
		default:
			return func(fn func()) { fn() }
		}
	}
}

// hangupContext is r's context, cancelled also when the client hangs up: for handlers that
// wait. Under another http.ResponseWriter (net/http's) r's context already is that.
func hangupContext(w http.ResponseWriter, r *http.Request) context.Context {
	for {
		switch rw := w.(type) {
		case *response:
			return rw.hangup()
		case interface{ Unwrap() http.ResponseWriter }:
			w = rw.Unwrap()
		default:
			return r.Context()
		}
	}
}
