package main

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/xmsg/xmsg/internal/ostest"
	"github.com/xmsg/xmsg/internal/peercred"
)

// Helper roles of the federation tests, selected by XMSG_TEST_ROLE (see TestMain). Each
// prints JSON lines on stdout for the test to read.

// fedRoles are the roles of the federation tests (TestMain adds them); files built only on
// some systems add theirs in init.
var fedRoles = ostest.Roles{
	"fedbot":    func() int { fedBot(); return 0 },
	"fedhttp":   func() int { fedHTTP(); return 0 },
	"fedburst":  func() int { fedBurst(); return 0 },
	"fedraw":    func() int { fedRaw(); return 0 },
	"fedclaude": func() int { fedClaude(); return 0 },
}

// fedClaude is a stand-in Claude Code session run as another user: a real process with a
// real inbox socket at $INBOX_SOCK and a real session file in $SESSION_DIR naming its pid and
// start time. Every line it receives is appended to $INBOX_LOG. It prints "ready" once the
// file is in place and exits when stdin closes.
func fedClaude() {
	dir, id, name := os.Getenv("SESSION_DIR"), os.Getenv("SESSION_ID"), os.Getenv("SESSION_NAME")
	sock := os.Getenv("INBOX_SOCK")
	l, err := net.Listen("unix", sock)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	start, err := peercred.Proc{}.StartTime(os.Getpid())
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	f := map[string]any{"pid": os.Getpid(), "sessionId": id, "cwd": os.Getenv("SESSION_CWD"), "status": "idle", "kind": "interactive",
		"startedAt": 1700000000000, "updatedAt": 1700000000000, "procStart": start, "messagingSocketPath": sock, "name": name}
	raw, _ := json.Marshal(f)
	tmp := filepath.Join(dir, "."+id+".tmp")
	os.WriteFile(tmp, raw, 0o600)
	os.Rename(tmp, filepath.Join(dir, os.Getenv("SESSION_FILE")))
	fmt.Println("ready")
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			data, _ := io.ReadAll(c)
			c.Close()
			lf, _ := os.OpenFile(os.Getenv("INBOX_LOG"), os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o600)
			lf.Write(data)
			lf.Close()
		}
	}()
	io.Copy(io.Discard, os.Stdin)
}

func unixClient(sock string) *http.Client {
	return &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", sock)
	}}, Timeout: 90 * time.Second}
}

type httpResult struct {
	Status int             `json:"status"`
	Body   json.RawMessage `json:"body,omitempty"`
	Err    string          `json:"err,omitempty"`
}

func doHTTP(c *http.Client, method, url, body string) httpResult {
	req, _ := http.NewRequest(method, url, strings.NewReader(body))
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.Do(req)
	if err != nil {
		return httpResult{Err: err.Error()}
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	if !json.Valid(raw) {
		raw, _ = json.Marshal(string(raw))
	}
	return httpResult{Status: resp.StatusCode, Body: raw}
}

// fedHTTP does one request on $SOCK (http.sock): $METHOD $URLPATH with $BODY.
func fedHTTP() {
	r := doHTTP(unixClient(os.Getenv("SOCK")), os.Getenv("METHOD"), "http://localhost"+os.Getenv("URLPATH"), os.Getenv("BODY"))
	json.NewEncoder(os.Stdout).Encode(r)
}

// fedBurst sends $N messages at once to $URLPATH on $SOCK, each from its own anonymous
// sender, and prints one line per answer as it arrives.
func fedBurst() {
	c := unixClient(os.Getenv("SOCK"))
	var n int
	fmt.Sscan(os.Getenv("N"), &n)
	var mu sync.Mutex
	var wg sync.WaitGroup
	enc := json.NewEncoder(os.Stdout)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := doHTTP(c, "POST", "http://localhost"+os.Getenv("URLPATH"), fmt.Sprintf(`{"from":"burst %d","text":"burst %d"}`, i, i))
			mu.Lock()
			enc.Encode(r)
			mu.Unlock()
		}()
	}
	wg.Wait()
}

// fedRaw speaks to a federation listener directly with $CERT/$KEY (outside any daemon):
// the requests of $REQS (a JSON array of {method, path, body}) on one kept-alive connection
// to $ADDR. It prints one JSON array of results.
func fedRaw() {
	pair, err := tls.LoadX509KeyPair(os.Getenv("CERT"), os.Getenv("KEY"))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{
		Certificates: []tls.Certificate{pair}, InsecureSkipVerify: true, MinVersion: tls.VersionTLS13}}}
	var reqs []struct{ Method, Path, Body string }
	json.Unmarshal([]byte(os.Getenv("REQS")), &reqs)
	out := []httpResult{}
	for _, r := range reqs {
		out = append(out, doHTTP(c, r.Method, "https://"+os.Getenv("ADDR")+r.Path, r.Body))
	}
	json.NewEncoder(os.Stdout).Encode(out)
}

// fedBot is a service: it registers as svc:$NAME on $REGISTER_SOCK and then runs the JSON
// commands it reads on stdin, one answer line each:
//
//	{"op":"poll","wait":N}               register.sock poll
//	{"op":"ack","id":ID}                 register.sock ack
//	{"op":"reply","id":ID,"text":T}      register.sock (svc) reply
//	{"op":"asend","ref":R,"text":T}      agent.sock send (push_replies true), attested as the service
//	{"op":"areply","id":ID,"text":T}     agent.sock reply
func fedBot() {
	fail := func(err error) { fmt.Fprintln(os.Stderr, "fedbot:", err); os.Exit(1) }
	c, err := net.Dial("unix", os.Getenv("REGISTER_SOCK"))
	if err != nil {
		fail(err)
	}
	r := bufio.NewReader(c)
	call := func(v any) json.RawMessage {
		raw, _ := json.Marshal(v)
		c.Write(append(raw, '\n'))
		line, err := r.ReadBytes('\n')
		if err != nil {
			fail(err)
		}
		return line
	}
	agent := func(v any) json.RawMessage {
		a, err := net.Dial("unix", os.Getenv("AGENT_SOCK"))
		if err != nil {
			return json.RawMessage(fmt.Sprintf(`{"status":"error","error":"dial","detail":%q}`, err.Error()))
		}
		defer a.Close()
		raw, _ := json.Marshal(v)
		a.Write(append(raw, '\n'))
		line, _ := bufio.NewReader(a).ReadBytes('\n')
		return line
	}
	reg := call(map[string]any{"harness": "svc", "name": os.Getenv("NAME")})
	os.Stdout.Write(reg)
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		var cmd struct {
			Op, ID, Ref, Text string
			Wait              int
		}
		json.Unmarshal(in.Bytes(), &cmd)
		var out json.RawMessage
		switch cmd.Op {
		case "poll":
			out = call(map[string]any{"action": "poll", "waitSecs": cmd.Wait})
		case "ack":
			out = call(map[string]any{"action": "ack", "messageId": cmd.ID})
		case "reply":
			out = call(map[string]any{"action": "reply", "messageId": cmd.ID, "text": cmd.Text})
		case "asend":
			out = agent(map[string]any{"action": "send", "ref": cmd.Ref, "text": cmd.Text, "push_replies": true})
		case "areply":
			out = agent(map[string]any{"action": "reply", "messageId": cmd.ID, "text": cmd.Text})
		default:
			out = json.RawMessage(`{"status":"error","detail":"unknown op"}` + "\n")
		}
		os.Stdout.Write(out)
	}
}
