package httpapi

// The lean server's HTTP/1.1 behaviour, with net/http's client and raw connections.

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// serveHandler runs h on a Server on a Unix socket and returns its path and the server.
func serveHandler(t *testing.T, h http.Handler, configure func(*Server)) (string, *Server) {
	t.Helper()
	dir, err := os.MkdirTemp("", "hs")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	path := filepath.Join(dir, "s.sock")
	l, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	srv := &Server{Handler: h, HeaderTimeout: 5 * time.Second, IdleTimeout: 5 * time.Second, MaxHeaderBytes: 64 << 10}
	if configure != nil {
		configure(srv)
	}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(l) }()
	t.Cleanup(func() {
		srv.Close()
		if err := <-done; err != http.ErrServerClosed {
			t.Errorf("Serve returned %v, want http.ErrServerClosed", err)
		}
	})
	return path, srv
}

func unixClient(path string) *http.Client {
	return &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", path)
		}}}
}

// echoHandler answers "<method> <path> <body>" as JSON-ish text with a Content-Length, like
// writeJSON, and counts the connections it saw (by remote pointer is not available: the
// test counts dials instead).
func echoHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			writeJSON(w, http.StatusBadRequest, map[string]string{"error": "body"})
			return
		}
		writeJSON(w, http.StatusOK, map[string]string{"method": r.Method, "path": r.URL.Path, "body": string(body)})
	})
}

// rawConn dials path for a raw exchange.
func rawConn(t *testing.T, path string) (net.Conn, *bufio.Reader) {
	t.Helper()
	c, err := net.Dial("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(10 * time.Second))
	return c, bufio.NewReader(c)
}

func readResp(t *testing.T, r *bufio.Reader, method string) (*http.Response, string) {
	t.Helper()
	resp, err := http.ReadResponse(r, &http.Request{Method: method})
	if err != nil {
		t.Fatalf("reading the answer: %v", err)
	}
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("reading the answer's body: %v", err)
	}
	return resp, string(b)
}

// TestServerKeepAliveWithClient: net/http's client reuses one connection for many requests
// (GET, POST with Content-Length, chunked POST), and gets every answer right.
func TestServerKeepAliveWithClient(t *testing.T) {
	path, _ := serveHandler(t, echoHandler(), nil)
	var dials atomic.Int32
	c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			dials.Add(1)
			return (&net.Dialer{}).DialContext(ctx, "unix", path)
		}}}
	for i := range 20 {
		var resp *http.Response
		var err error
		switch i % 3 {
		case 0:
			resp, err = c.Get("http://localhost/a")
		case 1:
			resp, err = c.Post("http://localhost/b", "application/json", strings.NewReader(`{"x":1}`))
		case 2:
			// An io.Reader of unknown length: the client sends it chunked.
			pr, pw := io.Pipe()
			go func() { pw.Write([]byte("chunk-")); pw.Write([]byte("ed")); pw.Close() }()
			resp, err = c.Post("http://localhost/c", "application/json", pr)
		}
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		want := map[int]string{0: `"method":"GET"`, 1: `"body":"{\"x\":1}"`, 2: `"body":"chunk-ed"`}[i%3]
		if resp.StatusCode != 200 || !strings.Contains(string(b), want) {
			t.Fatalf("request %d: %d %s, want %s", i, resp.StatusCode, b, want)
		}
	}
	if n := dials.Load(); n != 1 {
		t.Fatalf("%d connections for 20 requests, want 1 (keep-alive)", n)
	}
}

// TestServerPipelining: three requests in one write get three answers in order on one
// connection.
func TestServerPipelining(t *testing.T) {
	path, _ := serveHandler(t, echoHandler(), nil)
	c, r := rawConn(t, path)
	io.WriteString(c, "GET /1 HTTP/1.1\r\nHost: l\r\n\r\n"+
		"POST /2 HTTP/1.1\r\nHost: l\r\nContent-Length: 3\r\n\r\nabc"+
		"GET /3 HTTP/1.1\r\nHost: l\r\n\r\n")
	for _, want := range []string{`"path":"/1"`, `"body":"abc"`, `"path":"/3"`} {
		resp, body := readResp(t, r, "GET")
		if resp.StatusCode != 200 || !strings.Contains(body, want) {
			t.Fatalf("%d %s, want %s", resp.StatusCode, body, want)
		}
	}
}

// TestServerAnswerBytes: the answer is net/http's, byte for byte but the Date: status line,
// the handler's headers in sorted order, then Date.
func TestServerAnswerBytes(t *testing.T) {
	path, _ := serveHandler(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusAccepted, map[string]string{"a": "b"})
	}), nil)
	c, r := rawConn(t, path)
	io.WriteString(c, "GET / HTTP/1.1\r\nHost: l\r\n\r\n")
	var got strings.Builder
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			t.Fatal(err)
		}
		got.WriteString(line)
		if line == "\r\n" {
			break
		}
	}
	body := make([]byte, len(`{"a":"b"}`+"\n"))
	io.ReadFull(r, body)
	want := regexp.MustCompile(`^HTTP/1\.1 202 Accepted\r\nContent-Length: 10\r\nContent-Type: application/json\r\nDate: [A-Z][a-z]{2}, \d\d [A-Z][a-z]{2} \d{4} \d\d:\d\d:\d\d GMT\r\n\r\n$`)
	if !want.MatchString(got.String()) || string(body) != `{"a":"b"}`+"\n" {
		t.Fatalf("answer %q %q", got.String(), body)
	}
}

// TestServerConnectionClose: Connection: close gets Connection: close and the end of the
// connection; HTTP/1.0 closes unless it asks for keep-alive (then it keeps it and says so).
func TestServerConnectionClose(t *testing.T) {
	path, _ := serveHandler(t, echoHandler(), nil)
	cases := []struct {
		req, wantConn string
		closed        bool
		status        string
	}{
		{"GET / HTTP/1.1\r\nHost: l\r\nConnection: close\r\n\r\n", "close", true, "HTTP/1.1 200 OK"},
		{"GET / HTTP/1.0\r\n\r\n", "", true, "HTTP/1.0 200 OK"},
		{"GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n", "keep-alive", false, "HTTP/1.0 200 OK"},
		{"GET / HTTP/1.1\r\nHost: l\r\n\r\n", "", false, "HTTP/1.1 200 OK"},
	}
	for _, tc := range cases {
		c, r := rawConn(t, path)
		io.WriteString(c, tc.req)
		status, _ := r.ReadString('\n')
		if strings.TrimSpace(status) != tc.status {
			t.Errorf("%q: status line %q, want %q", tc.req, status, tc.status)
		}
		resp, err := http.ReadResponse(bufio.NewReader(io.MultiReader(strings.NewReader("HTTP/1.1 200 OK\r\n"), r)), nil)
		if err != nil {
			t.Fatal(err)
		}
		io.ReadAll(resp.Body)
		got := resp.Header.Get("Connection")
		if resp.Close {
			got = "close" // ReadResponse takes Connection: close out of the header
		}
		if got != tc.wantConn {
			t.Errorf("%q: Connection %q, want %q", tc.req, got, tc.wantConn)
		}
		c.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
		_, err = r.ReadByte()
		if closed := err == io.EOF; closed != tc.closed {
			t.Errorf("%q: connection closed %v (%v), want %v", tc.req, closed, err, tc.closed)
		}
	}
}

// TestServerExpectContinue: a client that sends Expect: 100-continue (curl does for bodies
// over 1 KiB) gets 100 Continue before its body is read, then the answer; a handler that never
// reads the body answers without 100 Continue and closes the connection (the body was never
// sent). net/http's client does the exchange end to end.
func TestServerExpectContinue(t *testing.T) {
	var read atomic.Bool
	path, _ := serveHandler(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/skip" {
			writeJSON(w, http.StatusRequestEntityTooLarge, map[string]string{"error": "too big"})
			return
		}
		b, _ := io.ReadAll(r.Body)
		read.Store(true)
		writeJSON(w, http.StatusOK, map[string]int{"n": len(b)})
	}), nil)
	c, r := rawConn(t, path)
	io.WriteString(c, "POST /read HTTP/1.1\r\nHost: l\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n")
	if line, _ := r.ReadString('\n'); line != "HTTP/1.1 100 Continue\r\n" {
		t.Fatalf("got %q, want 100 Continue", line)
	}
	if line, _ := r.ReadString('\n'); line != "\r\n" {
		t.Fatalf("100 Continue not ended: %q", line)
	}
	io.WriteString(c, "hello")
	if resp, body := readResp(t, r, "POST"); resp.StatusCode != 200 || !strings.Contains(body, `"n":5`) {
		t.Fatalf("%d %s", resp.StatusCode, body)
	}
	// Not read: no 100, the answer, then the end of the connection.
	c2, r2 := rawConn(t, path)
	io.WriteString(c2, "POST /skip HTTP/1.1\r\nHost: l\r\nContent-Length: 100000\r\nExpect: 100-continue\r\n\r\n")
	resp, _ := readResp(t, r2, "POST")
	if resp.StatusCode != 413 || !resp.Close {
		t.Fatalf("unread 100-continue body: %d close=%v, want 413 close", resp.StatusCode, resp.Close)
	}
	if _, err := r2.ReadByte(); err != io.EOF {
		t.Fatalf("connection not closed: %v", err)
	}
	// net/http's client, with a body it holds back until 100 Continue.
	tr := &http.Transport{ExpectContinueTimeout: 5 * time.Second, DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", path)
	}}
	req, _ := http.NewRequest("POST", "http://localhost/read", strings.NewReader(strings.Repeat("x", 2000)))
	req.Header.Set("Expect", "100-continue")
	res, err := (&http.Client{Transport: tr, Timeout: 10 * time.Second}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != 200 || !strings.Contains(string(b), `"n":2000`) {
		t.Fatalf("client with Expect: %d %s", res.StatusCode, b)
	}
	// Another expectation: 417 and close.
	c3, r3 := rawConn(t, path)
	io.WriteString(c3, "POST /read HTTP/1.1\r\nHost: l\r\nContent-Length: 1\r\nExpect: something\r\n\r\nx")
	if resp, _ := readResp(t, r3, "POST"); resp.StatusCode != http.StatusExpectationFailed {
		t.Fatalf("Expect: something: %d, want 417", resp.StatusCode)
	}
}

// TestServerUnreadBody: a body the handler did not read is drained, and the connection kept,
// when it is small; a large one (over 256 KiB) closes the connection after the answer.
// Mutant tried: sendHeader without the drain: the small case reads the body as the next
// request (400) and goes red.
func TestServerUnreadBody(t *testing.T) {
	path, _ := serveHandler(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, map[string]string{"path": r.URL.Path})
	}), nil)
	c, r := rawConn(t, path)
	io.WriteString(c, "POST /a HTTP/1.1\r\nHost: l\r\nContent-Length: 10\r\n\r\n0123456789GET /b HTTP/1.1\r\nHost: l\r\n\r\n")
	for _, want := range []string{"/a", "/b"} {
		if resp, body := readResp(t, r, "GET"); resp.StatusCode != 200 || !strings.Contains(body, want) {
			t.Fatalf("%d %s, want %s", resp.StatusCode, body, want)
		}
	}
	// Chunked, unread, small: drained too.
	io.WriteString(c, "POST /c HTTP/1.1\r\nHost: l\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\nGET /d HTTP/1.1\r\nHost: l\r\n\r\n")
	for _, want := range []string{"/c", "/d"} {
		if resp, body := readResp(t, r, "GET"); resp.StatusCode != 200 || !strings.Contains(body, want) {
			t.Fatalf("%d %s, want %s", resp.StatusCode, body, want)
		}
	}
	big := 300 << 10
	c2, r2 := rawConn(t, path)
	go func() {
		fmt.Fprintf(c2, "POST /big HTTP/1.1\r\nHost: l\r\nContent-Length: %d\r\n\r\n", big)
		c2.Write(make([]byte, big))
	}()
	resp, _ := readResp(t, r2, "POST")
	if resp.StatusCode != 200 || !resp.Close {
		t.Fatalf("big unread body: %d close=%v, want 200 close", resp.StatusCode, resp.Close)
	}
}

// TestServerBadRequests: what net/http answers to requests it cannot serve.
func TestServerBadRequests(t *testing.T) {
	path, _ := serveHandler(t, echoHandler(), func(s *Server) { s.MaxHeaderBytes = 1 << 10 })
	cases := []struct{ req, status string }{
		{"GARBAGE\r\n\r\n", "HTTP/1.1 400 Bad Request"},
		{"GET / HTTP/1.1\r\n\r\n", "HTTP/1.1 400 Bad Request: missing required Host header"},
		{"GET / HTTP/1.1\r\nHost: a b\r\n\r\n", "HTTP/1.1 400 Bad Request: malformed Host header"},
		{"GET / HTTP/2.0\r\nHost: l\r\n\r\n", "HTTP/1.1 505 HTTP Version Not Supported: unsupported protocol version"},
		{"POST / HTTP/1.1\r\nHost: l\r\nTransfer-Encoding: gzip\r\n\r\n", "HTTP/1.1 501 Not Implemented"},
		{"POST / HTTP/1.1\r\nHost: l\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab", "HTTP/1.1 400 Bad Request"},
		{"GET / HTTP/1.1\r\nHost: l\r\nX-Big: " + strings.Repeat("a", 8<<10) + "\r\n\r\n", "HTTP/1.1 431 Request Header Fields Too Large"},
	}
	for _, tc := range cases {
		c, r := rawConn(t, path)
		io.WriteString(c, tc.req)
		line, _ := r.ReadString('\n')
		if strings.TrimSpace(line) != tc.status {
			t.Errorf("%.40q: %q, want %q", tc.req, line, tc.status)
		}
		rest, _ := io.ReadAll(r)
		if !strings.Contains(string(rest), "Connection: close") {
			t.Errorf("%.40q: no Connection: close in %q", tc.req, rest)
		}
	}
}

// TestServerIdleDeadline: a keep-alive connection that sends nothing after its answer is
// closed after the idle deadline; one that never sends a request after the header deadline.
func TestServerIdleDeadline(t *testing.T) {
	path, _ := serveHandler(t, echoHandler(), func(s *Server) {
		s.IdleTimeout, s.HeaderTimeout = 200*time.Millisecond, 300*time.Millisecond
	})
	c, r := rawConn(t, path)
	io.WriteString(c, "GET / HTTP/1.1\r\nHost: l\r\n\r\n")
	readResp(t, r, "GET")
	t0 := time.Now()
	if _, err := r.ReadByte(); err != io.EOF {
		t.Fatalf("idle connection: %v, want EOF", err)
	}
	if time.Since(t0) > 5*time.Second {
		t.Fatal("idle connection held until the client's own deadline")
	}
	c2, r2 := rawConn(t, path)
	_ = c2
	if _, err := r2.ReadByte(); err != io.EOF {
		t.Fatalf("silent new connection: %v, want EOF", err)
	}
}

// TestServerHangupCancelsWait: a handler waiting on hangupContext is cancelled when the client
// hangs up; a pipelined request after it is still served in order when the client stays.
// Mutants tried: hangup returning r.Context() (no watch): the wait is never cancelled, red;
// the watch's byte not handed on: the next request reads as "ET /next", red.
func TestServerHangupCancelsWait(t *testing.T) {
	cancelled := make(chan struct{}, 1)
	path, _ := serveHandler(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/wait" {
			select {
			case <-hangupContext(w, r).Done():
				cancelled <- struct{}{}
				return
			case <-time.After(300 * time.Millisecond):
			}
		}
		writeJSON(w, http.StatusOK, map[string]string{"request": r.Method + " " + r.URL.Path})
	}), nil)
	c, _ := rawConn(t, path)
	io.WriteString(c, "GET /wait HTTP/1.1\r\nHost: l\r\n\r\n")
	time.Sleep(50 * time.Millisecond)
	c.Close()
	select {
	case <-cancelled:
	case <-time.After(5 * time.Second):
		t.Fatal("a client that hung up did not cancel the waiting handler")
	}
	// Pipelined behind a wait: the byte the watch read is not lost.
	c2, r2 := rawConn(t, path)
	io.WriteString(c2, "GET /wait HTTP/1.1\r\nHost: l\r\n\r\n")
	time.Sleep(50 * time.Millisecond)
	io.WriteString(c2, "GET /next HTTP/1.1\r\nHost: l\r\n\r\n")
	for _, want := range []string{`"GET /wait"`, `"GET /next"`} {
		if resp, body := readResp(t, r2, "GET"); resp.StatusCode != 200 || !strings.Contains(body, want) {
			t.Fatalf("%d %s, want %s", resp.StatusCode, body, want)
		}
	}
}

// TestServerHangupAfterPipelinedBytes: a client that pipelined bytes behind a waiting request
// (in the same write, and later) and then hung up still cancels the wait at once: the watch
// keeps reading past pipelined bytes. (It once stopped after one byte, and the waiter place
// stayed taken for the whole wait.) Mutant: the watch returning after the first read with
// data: red.
func TestServerHangupAfterPipelinedBytes(t *testing.T) {
	cancelled := make(chan struct{}, 1)
	path, _ := serveHandler(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/wait" {
			select {
			case <-hangupContext(w, r).Done():
				cancelled <- struct{}{}
				return
			case <-time.After(20 * time.Second):
			}
		}
		writeJSON(w, http.StatusOK, map[string]string{"request": r.Method + " " + r.URL.Path})
	}), nil)
	c, _ := rawConn(t, path)
	io.WriteString(c, "GET /wait HTTP/1.1\r\nHost: l\r\n\r\nGET /n")
	time.Sleep(50 * time.Millisecond)
	io.WriteString(c, "ext HTTP/1.1\r\n")
	time.Sleep(50 * time.Millisecond)
	c.Close()
	select {
	case <-cancelled:
	case <-time.After(10 * time.Second):
		t.Fatal("a client that pipelined bytes and hung up did not cancel the waiting handler")
	}
}

// TestServerUnreadBodyAnswerRead: a handler that answers without reading a body too large to
// drain (over 256 KiB) closes the connection, and a client that sends its whole request
// before reading gets the answer and then a clean close (EOF), not a reset (over TCP).
// Mutant: closing without closeWriteAndWait: red (reset).
func TestServerUnreadBodyAnswerRead(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusRequestEntityTooLarge, map[string]string{"error": "too_large"})
	}), HeaderTimeout: 5 * time.Second}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
	c, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	const n = 600 << 10
	if _, err := io.WriteString(c, fmt.Sprintf("POST / HTTP/1.1\r\nHost: l\r\nContent-Length: %d\r\n\r\n", n)); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Write(make([]byte, n)); err != nil {
		t.Fatalf("writing the body: %v", err)
	}
	// A client busy elsewhere before it reads: a reset, had one been sent, has arrived.
	time.Sleep(100 * time.Millisecond)
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("the answer: %v, want it read whole", err)
	}
	io.Copy(io.Discard, resp.Body)
	if resp.StatusCode != http.StatusRequestEntityTooLarge || !resp.Close {
		t.Fatalf("got %d, close %v; want 413 and Connection: close", resp.StatusCode, resp.Close)
	}
	if _, err := br.ReadByte(); err != io.EOF {
		t.Fatalf("after the answer: %v, want a clean close (EOF), not a reset", err)
	}
}

// TestServerShutdown: Shutdown lets an active request finish (its answer says Connection:
// close), closes idle connections, and Serve returns http.ErrServerClosed.
func TestServerShutdown(t *testing.T) {
	release := make(chan struct{})
	started := make(chan struct{})
	path, srv := serveHandler(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/slow" {
			close(started)
			<-release
		}
		writeJSON(w, http.StatusOK, map[string]string{"path": r.URL.Path})
	}), nil)
	idle, ri := rawConn(t, path)
	io.WriteString(idle, "GET /x HTTP/1.1\r\nHost: l\r\n\r\n")
	readResp(t, ri, "GET")
	active, ra := rawConn(t, path)
	io.WriteString(active, "GET /slow HTTP/1.1\r\nHost: l\r\n\r\n")
	<-started
	done := make(chan error, 1)
	go func() { done <- srv.Shutdown(context.Background()) }()
	if _, err := ri.ReadByte(); err != io.EOF {
		t.Fatalf("idle connection at shutdown: %v, want EOF", err)
	}
	select {
	case err := <-done:
		t.Fatalf("Shutdown returned %v before the active request ended", err)
	case <-time.After(100 * time.Millisecond):
	}
	close(release)
	resp, _ := readResp(t, ra, "GET")
	if resp.StatusCode != 200 || !resp.Close {
		t.Fatalf("active request at shutdown: %d close=%v", resp.StatusCode, resp.Close)
	}
	if err := <-done; err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
}

// TestServerHeadAndHandlerClose: OPTIONS * gets net/http's empty 200; HEAD gets the headers (with the length) and no body; a
// handler's own Connection: close closes the connection.
func TestServerHeadAndHandlerClose(t *testing.T) {
	path, _ := serveHandler(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/close" {
			w.Header().Set("Connection", "close")
		}
		writeJSON(w, http.StatusOK, map[string]string{"a": "b"})
	}), nil)
	c, r := rawConn(t, path)
	io.WriteString(c, "OPTIONS * HTTP/1.1\r\nHost: l\r\n\r\nHEAD / HTTP/1.1\r\nHost: l\r\n\r\nGET /close HTTP/1.1\r\nHost: l\r\n\r\n")
	if resp, body := readResp(t, r, "OPTIONS"); resp.StatusCode != 200 || resp.ContentLength != 0 || body != "" {
		t.Fatalf("OPTIONS *: %d length %d body %q, want net/http's 200 and no body", resp.StatusCode, resp.ContentLength, body)
	}
	resp, body := readResp(t, r, "HEAD")
	if resp.StatusCode != 200 || resp.ContentLength != 10 || body != "" {
		t.Fatalf("HEAD: %d length %d body %q", resp.StatusCode, resp.ContentLength, body)
	}
	resp, _ = readResp(t, r, "GET")
	if !resp.Close {
		t.Fatal("handler's Connection: close not sent")
	}
	if _, err := r.ReadByte(); err != io.EOF {
		t.Fatalf("connection not closed: %v", err)
	}
}

// TestServerAfterAnswer: work queued with afterAnswer (a send's audit line) runs once the
// answer is out: here it waits for the client to have read the answer, which would never
// happen if it ran before. Mutant tried: running the queue before the flush: red (timeout).
func TestServerAfterAnswer(t *testing.T) {
	got := make(chan struct{})
	ran := make(chan bool, 1)
	path, _ := serveHandler(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		afterAnswer(w)(func() {
			select {
			case <-got:
				ran <- true
			case <-time.After(3 * time.Second):
				ran <- false
			}
		})
		writeJSON(w, http.StatusOK, map[string]string{"a": "b"})
	}), nil)
	c, r := rawConn(t, path)
	io.WriteString(c, "GET / HTTP/1.1\r\nHost: l\r\n\r\n")
	readResp(t, r, "GET")
	close(got)
	if !<-ran {
		t.Fatal("the queued work ran before the answer was sent")
	}
}

// TestServerStreamsFlushes: a handler that flushes sends each part as a chunk at once (the
// client reads the first part while the handler still waits to write the second), the write
// deadline can be moved per write, and the connection takes the next request after the
// stream's last chunk. Mutant tried: Flush buffering like an unflushed answer (no chunked
// mode): the client never reads the first part while the handler waits.
func TestServerStreamsFlushes(t *testing.T) {
	next := make(chan struct{})
	path, _ := serveHandler(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/stream" {
			w.Write([]byte("plain"))
			return
		}
		rc := http.NewResponseController(w)
		w.Header().Set("Content-Type", "application/x-ndjson")
		for i := range 2 {
			fmt.Fprintf(w, "part %d\n", i)
			if err := rc.SetWriteDeadline(time.Now().Add(time.Minute)); err != nil {
				t.Error(err)
			}
			if err := rc.Flush(); err != nil {
				t.Error(err)
			}
			if i == 0 {
				<-next
			}
		}
	}), nil)
	c, err := net.Dial("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	br := bufio.NewReader(c)
	fmt.Fprint(c, "GET /stream HTTP/1.1\r\nHost: x\r\n\r\n")
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.TransferEncoding) != 1 || resp.TransferEncoding[0] != "chunked" {
		t.Fatalf("transfer encoding %v, want chunked", resp.TransferEncoding)
	}
	body := bufio.NewReader(resp.Body)
	if l, err := body.ReadString('\n'); l != "part 0\n" || err != nil {
		t.Fatalf("first part %q %v", l, err)
	}
	close(next)
	rest, err := io.ReadAll(body)
	if string(rest) != "part 1\n" || err != nil {
		t.Fatalf("rest %q %v", rest, err)
	}
	fmt.Fprint(c, "GET /plain HTTP/1.1\r\nHost: x\r\n\r\n")
	resp, err = http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	if b, _ := io.ReadAll(resp.Body); string(b) != "plain" || resp.ContentLength != 5 {
		t.Fatalf("next request on the connection: %q (length %d)", b, resp.ContentLength)
	}
}
