package httpapi

// FuzzDifferential pins the lean server to net/http's: the same bytes go to both (each on a
// Unix socket of its own, then the client half-closes), and what comes back must be the same
// bytes (Date headers aside), the connection must end the same way (EOF, or a reset), and the
// handler must have seen the same requests (method, path, body, trailers). Its seeds
// (testdata/fuzz/FuzzDifferential, and the f.Add calls) run in plain go test; go test -fuzz
// FuzzDifferential looks for more.
//
// Divergences tolerated, each because net/http's behaviour cannot be had through
// http.ReadRequest (skip reports them):
//   - an empty "Host:" header: net/http serves it, here it is 400 "missing required Host
//     header" (ReadRequest drops the header, so an empty one looks like none);
//   - an absolute-form target ("GET http://h/ HTTP/1.1"): req.Host is the target's, so a
//     missing or malformed Host header is not seen here;
//   - "PRI * HTTP/2.0" with headers: net/http checks for the HTTP/2 preface before it drops
//     Host, so with exactly a Host header it keeps the connection; here it is closed.
//   - a body or pipelined request sent while a waiting handler's hang-up watch reads
//     (handlers here do not wait, so the fuzz test does not reach it).

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// seen records what a handler was asked, one line per request.
type seen struct {
	mu    sync.Mutex
	lines []string
}

func (s *seen) take() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	l := s.lines
	s.lines = nil
	return l
}

// diffHandler answers every request with what it saw; /unread leaves the body unread, /close
// asks for the connection to close, /big answers 3000 bytes.
func diffHandler(s *seen) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var body []byte
		var berr error
		if r.URL.Path != "/unread" {
			body, berr = io.ReadAll(r.Body)
		}
		var tr []string
		for k, v := range r.Trailer {
			tr = append(tr, k+"="+strings.Join(v, ","))
		}
		sort.Strings(tr)
		line := fmt.Sprintf("%s %s %q err=%v trailers=%v host=%q", r.Method, r.URL.RequestURI(), body, berr != nil, tr, r.Host)
		s.mu.Lock()
		s.lines = append(s.lines, line)
		s.mu.Unlock()
		if r.URL.Path == "/close" {
			w.Header().Set("Connection", "close")
		}
		out := line
		if r.URL.Path == "/big" {
			out = strings.Repeat("x", 3000)
		}
		w.Header().Set("Content-Type", "text/plain")
		w.Header().Set("Content-Length", fmt.Sprint(len(out)))
		io.WriteString(w, out)
	})
}

// diffServers are a lean Server and a net/http.Server with the same handler and limits.
type diffServers struct {
	lean, std         string // socket paths
	leanSeen, stdSeen *seen
}

var (
	diffOnce sync.Once
	diffSrv  diffServers
)

func startDiffServers(t testing.TB) diffServers {
	diffOnce.Do(func() {
		dir, err := os.MkdirTemp("", "hdiff")
		if err != nil {
			t.Fatal(err)
		}
		diffSrv = diffServers{lean: filepath.Join(dir, "lean.sock"), std: filepath.Join(dir, "std.sock"), leanSeen: &seen{}, stdSeen: &seen{}}
		ll, err := net.Listen("unix", diffSrv.lean)
		if err != nil {
			t.Fatal(err)
		}
		sl, err := net.Listen("unix", diffSrv.std)
		if err != nil {
			t.Fatal(err)
		}
		const hdr = 4 << 10
		lean := &Server{Handler: diffHandler(diffSrv.leanSeen), HeaderTimeout: 5 * time.Second, IdleTimeout: 5 * time.Second, MaxHeaderBytes: hdr}
		std := &http.Server{Handler: diffHandler(diffSrv.stdSeen), ReadHeaderTimeout: 5 * time.Second, IdleTimeout: 5 * time.Second, MaxHeaderBytes: hdr,
			ErrorLog: nil}
		std.ErrorLog = nullLogger()
		// Behind Listener, as in the daemon: its connection wrapper must not change what a
		// client sees (it once hid CloseWrite, and a 431 ended in a reset).
		go lean.Serve(Listener(ll, Limits{MaxConns: 1 << 20, MaxPerPID: 1 << 20}, "diff", nil))
		go std.Serve(sl)
	})
	return diffSrv
}

// exchange sends in on a new connection to path, half-closes, and returns everything read
// until the server ends the connection, with how it ended ("eof", "reset", "timeout").
func exchange(t testing.TB, path string, in []byte) ([]byte, string) {
	c, err := net.Dial("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(3 * time.Second))
	go func() {
		c.Write(in)
		c.(*net.UnixConn).CloseWrite()
	}()
	var out bytes.Buffer
	_, err = io.Copy(&out, c)
	var ne net.Error
	switch {
	case err == nil:
		return out.Bytes(), "eof"
	case errors.Is(err, syscall.ECONNRESET):
		return out.Bytes(), "reset"
	case errors.As(err, &ne) && ne.Timeout():
		return out.Bytes(), "timeout"
	default:
		return out.Bytes(), err.Error()
	}
}

var dateLine = regexp.MustCompile(`(?m)^Date: [^\r\n]*\r\n`)

// skip reports an input in one of the divergences the doc comment lists.
func skip(in []byte) bool {
	low := bytes.ToLower(in)
	return regexp.MustCompile(`(?m)^host:[ \t]*\r?$`).Match(low) ||
		regexp.MustCompile(`(?m)^[a-z]+ [a-z]+://`).Match(low) ||
		bytes.Contains(in, []byte("PRI * HTTP/2.0"))
}

func FuzzDifferential(f *testing.F) {
	for _, seed := range []string{
		"GET / HTTP/1.1\r\nHost: l\r\n\r\n",
		"GET /a HTTP/1.1\r\nHost: l\r\n\r\nGET /b HTTP/1.1\r\nHost: l\r\n\r\n",
		"POST /p HTTP/1.1\r\nHost: l\r\nContent-Length: 5\r\n\r\nhello",
		"POST /p HTTP/1.1\r\nHost: l\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\nX-T: 1\r\n\r\n",
		"POST /p HTTP/1.1\r\nHost: l\r\nTrailer: X-T\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\nX-T: 1\r\n\r\n",
		"POST /p HTTP/1.1\r\nHost: l\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
		"POST /p HTTP/1.1\r\nHost: l\r\nTransfer-Encoding: gzip\r\n\r\n",
		"POST /p HTTP/1.1\r\nHost: l\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab",
		"GET / HTTP/1.1\r\n\r\n",
		"GET / HTTP/1.1\r\nHost: a b\r\n\r\n",
		"GET / HTTP/1.0\r\n\r\nGET / HTTP/1.0\r\n\r\n",
		"GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\nGET /x HTTP/1.0\r\n\r\n",
		"GET /close HTTP/1.1\r\nHost: l\r\n\r\nGET /after HTTP/1.1\r\nHost: l\r\n\r\n",
		"GET / HTTP/1.1\r\nHost: l\r\nConnection: close\r\n\r\nGET /after HTTP/1.1\r\nHost: l\r\n\r\n",
		"HEAD /big HTTP/1.1\r\nHost: l\r\n\r\nGET /big HTTP/1.1\r\nHost: l\r\n\r\n",
		"GET / HTTP/2.0\r\nHost: l\r\n\r\n",
		"GET / HTTP/1.1\r\nHost: l\r\nX-Big: " + strings.Repeat("a", 5000) + "\r\n\r\n",
		"GET / HTTP/1.1\r\nHost: l\r\nBad Name: x\r\n\r\n",
		"GET / HTTP/1.1\r\nHost: l\r\nX: a\x01b\r\n\r\n",
		"GET / HTTP/1.1\r\nHost: l\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\nab",
		"GET / HTTP/1.1\r\nHost: l\r\nExpect: something\r\n\r\n",
		"POST /unread HTTP/1.1\r\nHost: l\r\nContent-Length: 3\r\n\r\nabcGET /next HTTP/1.1\r\nHost: l\r\n\r\n",
		"OPTIONS * HTTP/1.1\r\nHost: l\r\n\r\n",
		"garbage\r\n\r\n",
		"GET / HTTP/1.1\r\nHost: l\r\n\r\n\r\nGET /crlf HTTP/1.1\r\nHost: l\r\n\r\n",
		"POST /p HTTP/1.1\r\nHost: l\r\nContent-Length: 1\r\n\r\na\r\nGET /crlf HTTP/1.1\r\nHost: l\r\n\r\n",
		"POST /p HTTP/1.1\r\nHost: l\r\nContent-Length: 10\r\n\r\nabc",
		"GET / HTTP/1.1\nHost: l\n\n",
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		if len(in) > 16<<10 || skip(in) {
			return
		}
		s := startDiffServers(t)
		s.leanSeen.take()
		s.stdSeen.take()
		stdOut, stdEnd := exchange(t, s.std, in)
		leanOut, leanEnd := exchange(t, s.lean, in)
		stdReqs, leanReqs := s.stdSeen.take(), s.leanSeen.take()
		if stdEnd == "timeout" || leanEnd == "timeout" {
			t.Skip("a server did not end the exchange in time (a machine under load)")
		}
		stdN, leanN := dateLine.ReplaceAll(stdOut, nil), dateLine.ReplaceAll(leanOut, nil)
		if !bytes.Equal(stdN, leanN) {
			t.Errorf("input %q:\nnet/http: %q\nlean:     %q", in, stdN, leanN)
		}
		if stdEnd != leanEnd {
			t.Errorf("input %q: net/http's connection ended by %s, the lean server's by %s", in, stdEnd, leanEnd)
		}
		if strings.Join(stdReqs, "\n") != strings.Join(leanReqs, "\n") {
			t.Errorf("input %q: requests seen:\nnet/http: %q\nlean:     %q", in, stdReqs, leanReqs)
		}
	})
}

// TestUnsupportedTEErrorType: the type name isUnsupportedTE looks for is the one this Go
// release's ReadRequest gives (for two Transfer-Encoding headers and for an unknown coding).
func TestUnsupportedTEErrorType(t *testing.T) {
	for _, in := range []string{
		"POST / HTTP/1.1\r\nHost: l\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n",
		"POST / HTTP/1.1\r\nHost: l\r\nTransfer-Encoding: gzip\r\n\r\n",
	} {
		_, err := http.ReadRequest(bufio.NewReader(strings.NewReader(in)))
		if !isUnsupportedTE(err) {
			t.Errorf("%q: error %T %v is not classed as an unsupported transfer encoding", in, err, err)
		}
	}
	_, err := http.ReadRequest(bufio.NewReader(strings.NewReader("POST / HTTP/1.1\r\nHost: l\r\nContent-Length: x\r\n\r\n")))
	if err == nil || isUnsupportedTE(err) {
		t.Errorf("a bad Content-Length: %v, want an error not classed as a transfer encoding", err)
	}
}

func nullLogger() *log.Logger { return log.New(io.Discard, "", 0) }
