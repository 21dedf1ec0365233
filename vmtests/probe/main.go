// Command probe checks, from inside a tier, that xmsg's tier isolation holds. It runs as a
// tier user (runuser -u xmsg-<tier> -- probe ...), performs one group of checks, prints one
// line per check and exits 1 if any check failed (2 on a usage error, 0 otherwise):
//
//	PASS <name>
//	FAIL <name>: <why>
//	INFO <text>
//
// The nspawn tests (vmtests/nspawn) and the NixOS VM tests (vmtests/*.nix) both drive it, so
// its command line is stable. It depends on the standard library only and speaks the wire
// protocol itself (docs/protocol.md §3, §4), like an independent client would.
//
// Commands:
//
//	probe own --dir DIR [--name NAME] [--timeout DUR]
//	    Positive control: the bus in DIR (holding http.sock, agent.sock, register.sock) works
//	    for this user. GET /healthz is 200; register as svc NAME (default "probe"; the daemon
//	    must run with --svc-exe NAME=<path of this binary>); send a unique text to svc:NAME
//	    over agent.sock; poll it back on register.sock, ack it, reply "pong" over agent.sock;
//	    read the reply back with GET /v1/messages/<id>/replies; send anonymously with
//	    POST /v1/sessions/svc:NAME/messages (202) and poll that back too.
//
//	probe other [--dir DIR] [--state DIR] [--marker FILE]... [--cred FILE]...
//	    Negative checks against ANOTHER tier: connecting to each of DIR's three sockets,
//	    listing DIR and the state directory, reading each marker and credential file must all
//	    fail with a permission error. Any success FAILs, and so does ENOENT: a path that does
//	    not exist proves nothing about isolation (the caller plants the markers).
//
//	probe gate --sock PATH [--timeout DUR]
//	    The socket at PATH belongs to another tier whose directory and socket modes root has
//	    relaxed, so connect() succeeds. After writing a request, the daemon's SO_PEERCRED
//	    check must close the connection without sending a single byte.
//
//	probe notcp [--uid UID] [--pid PID]... [--port PORT]...
//	    No TCP socket in LISTEN state belongs to UID (default: the probe's own uid, which is
//	    the daemon's uid when run as the tier user), and none listens on any PORT, in the
//	    network namespace of the probe and in that of each PID (e.g. the daemon's MainPID,
//	    whose PrivateNetwork= namespace is not the probe's).
//
//	probe enqueue --dir DIR --count N --ids FILE [--name NAME] [--timeout DUR]
//	    Registers as svc NAME, sends N messages to svc:NAME over http.sock WITHOUT polling
//	    them, writes "<messageId> <text>" lines to FILE, then exits (which ends the
//	    registration). Used to prove that accepted messages survive a daemon crash.
//
//	probe drain --dir DIR --ids FILE [--name NAME] [--timeout DUR]
//	    Re-registers as svc NAME and polls until every message listed in FILE has been
//	    delivered with its text; acks each one.
//
//	probe sandbox [--readonly DIR]... [--writable DIR]...
//	    Run INSIDE a unit (as the ExecStart= of a copy of xmsg@.service): its sandbox is in
//	    force. Creating AF_INET and AF_INET6 sockets fails while AF_UNIX works; creating a file
//	    in each --readonly DIR fails with EROFS while each --writable DIR accepts one;
//	    /proc/self/status shows NoNewPrivs 1, Seccomp 2 (filter) and no effective capability.
//
//	probe answer --dir DIR [--name NAME] [--count N] [--text TEXT] [--timeout DUR]
//	    Registers as svc NAME and answers the next N messages (default 1), whatever their
//	    origin: ack, then reply TEXT (default "pong") over agent.sock. The far end of a
//	    federation test, whose sender reads the reply back through its own bus.
//
//	probe send --dir DIR --to REF [--text TEXT] [--want-status N] [--want-error CODE]
//	           [--want-reply TEXT] [--timeout DUR]
//	    POST /v1/sessions/REF/messages (anonymous) must answer N (default 202) and, with
//	    --want-error, that error code; with --want-reply, a reply with that text must then
//	    arrive on the message (GET .../replies, long-polled): across federation, the reply
//	    crossed back.
//
//	probe listen --addr HOST:PORT... [--timeout DUR]
//	    Accepts (and at once closes) TCP connections on each address until the timeout: the
//	    live target that netcheck's dials need.
//
//	probe netcheck [--bind-ok A]... [--bind-denied A]... [--dial-ok A]... [--dial-denied A]...
//	               [--families]
//	    Run INSIDE a federating tier's unit: binding each --bind-ok address works and each
//	    --bind-denied one fails with EPERM (SocketBindAllow=/SocketBindDeny=); dialing each
//	    --dial-ok address connects (TCP and UDP) and each --dial-denied one gets EPERM for a
//	    datagram and no answer to a TCP connect although a listener runs there
//	    (IPAddressAllow=/IPAddressDeny=); with --families, AF_INET/AF_INET6 sockets can be
//	    made, AF_NETLINK/AF_PACKET ones cannot (RestrictAddressFamilies=).
package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// report collects check results and prints them as they happen.
type report struct {
	w      io.Writer
	failed bool
}

func (r *report) pass(name string) { fmt.Fprintf(r.w, "PASS %s\n", name) }

func (r *report) fail(name string, format string, args ...any) {
	r.failed = true
	fmt.Fprintf(r.w, "FAIL %s: %s\n", name, oneLine(fmt.Sprintf(format, args...)))
}

func (r *report) info(format string, args ...any) {
	fmt.Fprintf(r.w, "INFO %s\n", oneLine(fmt.Sprintf(format, args...)))
}

// check records err as the result of check name and reports whether it passed.
func (r *report) check(name string, err error) bool {
	if err != nil {
		r.fail(name, "%v", err)
		return false
	}
	r.pass(name)
	return true
}

func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }

// multiFlag is a repeatable string flag.
type multiFlag []string

func (m *multiFlag) String() string     { return strings.Join(*m, ",") }
func (m *multiFlag) Set(v string) error { *m = append(*m, v); return nil }

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprintln(stderr, "usage: probe own|other|gate|notcp|enqueue|drain|sandbox|answer|send|listen|netcheck [flags] (see the package doc)")
		return 2
	}
	r := &report{w: stdout}
	fset := flag.NewFlagSet("probe "+args[0], flag.ContinueOnError)
	fset.SetOutput(stderr)
	dir := fset.String("dir", "", "directory holding http.sock, agent.sock and register.sock")
	name := fset.String("name", "probe", "svc name to register as")
	timeout := fset.Duration("timeout", 30*time.Second, "overall deadline")
	state := fset.String("state", "", "another tier's state directory")
	sock := fset.String("sock", "", "socket path")
	uid := fset.Int("uid", os.Getuid(), "uid that must own no TCP listener")
	count := fset.Int("count", 5, "messages to enqueue")
	ids := fset.String("ids", "", "file of enqueued message ids")
	var markers, creds, pids, ports multiFlag
	fset.Var(&markers, "marker", "file of another tier that must be unreadable (repeatable)")
	fset.Var(&creds, "cred", "credential file that must be unreadable (repeatable)")
	fset.Var(&pids, "pid", "also check the network namespace of this process (repeatable)")
	fset.Var(&ports, "port", "TCP port on which nothing may listen (repeatable)")
	var readonly, writable multiFlag
	fset.Var(&readonly, "readonly", "directory that must be read-only (repeatable)")
	fset.Var(&writable, "writable", "directory that must be writable (repeatable)")
	text := fset.String("text", "", "reply text (answer: default pong) or message text (send)")
	to := fset.String("to", "", "ref to send to")
	wantStatus := fset.Int("want-status", http.StatusAccepted, "HTTP status the send must get")
	wantError := fset.String("want-error", "", "error code the send must get")
	wantReply := fset.String("want-reply", "", "reply text that must arrive")
	var addrs, bindOK, bindDenied, dialOK, dialDenied multiFlag
	fset.Var(&addrs, "addr", "address to listen on (repeatable)")
	fset.Var(&bindOK, "bind-ok", "address that must be bindable (repeatable)")
	fset.Var(&bindDenied, "bind-denied", "address whose bind must fail with EPERM (repeatable)")
	fset.Var(&dialOK, "dial-ok", "address that must be reachable (repeatable)")
	fset.Var(&dialDenied, "dial-denied", "address whose connect must fail with EPERM (repeatable)")
	families := fset.Bool("families", false, "netcheck: also check which socket families can be made")
	if err := fset.Parse(args[1:]); err != nil {
		return 2
	}
	if fset.NArg() != 0 {
		fmt.Fprintf(stderr, "probe: unexpected arguments %q\n", fset.Args())
		return 2
	}
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	need := func(flagName, v string) bool {
		if v == "" {
			fmt.Fprintf(stderr, "probe %s: --%s is required\n", args[0], flagName)
			return false
		}
		return true
	}

	switch args[0] {
	case "own":
		if !need("dir", *dir) {
			return 2
		}
		own(ctx, r, *dir, *name)
	case "other":
		other(r, *dir, *state, markers, creds)
	case "gate":
		if !need("sock", *sock) {
			return 2
		}
		gate(ctx, r, *sock)
	case "notcp":
		notcp(r, *uid, pids, ports)
	case "enqueue":
		if !need("dir", *dir) || !need("ids", *ids) {
			return 2
		}
		enqueue(ctx, r, *dir, *name, *count, *ids)
	case "drain":
		if !need("dir", *dir) || !need("ids", *ids) {
			return 2
		}
		drain(ctx, r, *dir, *name, *ids)
	case "sandbox":
		sandbox(r, readonly, writable)
	case "answer":
		if !need("dir", *dir) {
			return 2
		}
		n := 1 // --count defaults to 5 for enqueue; one answer unless asked for more
		fset.Visit(func(f *flag.Flag) {
			if f.Name == "count" {
				n = *count
			}
		})
		reply := *text
		if reply == "" {
			reply = "pong"
		}
		answer(ctx, r, *dir, *name, n, reply)
	case "send":
		if !need("dir", *dir) || !need("to", *to) {
			return 2
		}
		send(ctx, r, *dir, *to, *text, *wantStatus, *wantError, *wantReply)
	case "listen":
		if len(addrs) == 0 {
			fmt.Fprintln(stderr, "probe listen: --addr is required")
			return 2
		}
		listen(ctx, r, addrs)
	case "netcheck":
		if len(bindOK)+len(bindDenied)+len(dialOK)+len(dialDenied) == 0 && !*families {
			fmt.Fprintln(stderr, "probe netcheck: nothing to check")
			return 2
		}
		netcheck(r, bindOK, bindDenied, dialOK, dialDenied, *families)
	default:
		fmt.Fprintf(stderr, "probe: unknown command %q\n", args[0])
		return 2
	}
	if r.failed {
		return 1
	}
	return 0
}

// ---------------------------------------------------------------- own

func own(ctx context.Context, r *report, dir, name string) {
	c := newHTTPClient(filepath.Join(dir, "http.sock"))
	status, body, err := c.do(ctx, "GET", "/healthz", nil)
	if !r.check("healthz", expectStatus(status, body, err, http.StatusOK)) {
		return
	}

	reg, err := registerSvc(ctx, dir, name)
	if !r.check("register", err) {
		return
	}
	defer reg.Close()

	text := "ping-" + nonce()
	var sent struct {
		Status   string `json:"status"`
		Error    string `json:"error"`
		Detail   string `json:"detail"`
		Delivery struct {
			MessageID string `json:"messageId"`
		} `json:"delivery"`
	}
	err = agentCall(ctx, dir, map[string]any{
		"action": "send", "ref": "svc:" + name, "text": text, "push_replies": false,
	}, &sent)
	if err == nil && (sent.Status != "ok" || sent.Delivery.MessageID == "") {
		err = fmt.Errorf("got status %q error %q detail %q, want ok with delivery.messageId", sent.Status, sent.Error, sent.Detail)
	}
	if !r.check("agent-send", err) {
		return
	}
	id := sent.Delivery.MessageID

	d, err := reg.pollFor(ctx, r, map[string]bool{id: true})
	if err == nil && d.Text != text {
		err = fmt.Errorf("delivered text: got %q, want %q", d.Text, text)
	}
	if err == nil && (d.Origin.Kind != "local" || d.Origin.Harness != "svc" || d.Origin.SessionID != "svc:"+name) {
		err = fmt.Errorf("origin: got %+v, want local svc svc:%s", d.Origin, name)
	}
	if !r.check("poll-deliver", err) {
		return
	}
	if !r.check("ack", reg.ack(ctx, id)) {
		return
	}

	var replied struct {
		Status string          `json:"status"`
		Error  string          `json:"error"`
		Detail string          `json:"detail"`
		Reply  json.RawMessage `json:"reply"`
	}
	err = agentCall(ctx, dir, map[string]any{"action": "reply", "messageId": id, "text": "pong"}, &replied)
	if err == nil && (replied.Status != "ok" || len(replied.Reply) == 0) {
		err = fmt.Errorf("got status %q error %q detail %q, want ok with reply", replied.Status, replied.Error, replied.Detail)
	}
	if !r.check("agent-reply", err) {
		return
	}

	status, body, err = c.do(ctx, "GET", "/v1/messages/"+id+"/replies", nil)
	err = expectStatus(status, body, err, http.StatusOK)
	if err == nil {
		var replies []struct {
			Text string `json:"text"`
		}
		if jerr := json.Unmarshal(body, &replies); jerr != nil {
			err = fmt.Errorf("decode replies %q: %v", body, jerr)
		} else if len(replies) == 0 || replies[len(replies)-1].Text != "pong" {
			err = fmt.Errorf("replies: got %s, want the last one with text \"pong\"", body)
		}
	}
	if !r.check("http-replies", err) {
		return
	}

	hi := "hi-" + nonce()
	payload, _ := json.Marshal(map[string]string{"from": "probe", "text": hi})
	status, body, err = c.do(ctx, "POST", "/v1/sessions/svc:"+name+"/messages", payload)
	err = expectStatus(status, body, err, http.StatusAccepted)
	var accepted struct {
		MessageID string `json:"messageId"`
	}
	if err == nil {
		if jerr := json.Unmarshal(body, &accepted); jerr != nil || accepted.MessageID == "" {
			err = fmt.Errorf("202 body %q: want a messageId", body)
		}
	}
	if !r.check("http-send", err) {
		return
	}
	d, err = reg.pollFor(ctx, r, map[string]bool{accepted.MessageID: true})
	if err == nil && (d.Text != hi || d.Origin.Kind != "anonymous") {
		err = fmt.Errorf("got text %q origin %+v, want %q from an anonymous origin", d.Text, d.Origin, hi)
	}
	if err == nil {
		err = reg.ack(ctx, accepted.MessageID)
	}
	r.check("http-send-deliver", err)
}

func expectStatus(got int, body []byte, err error, want int) error {
	if err != nil {
		return err
	}
	if got != want {
		return fmt.Errorf("status: got %d (%q), want %d", got, truncate(body), want)
	}
	return nil
}

func truncate(b []byte) string {
	if len(b) > 200 {
		return string(b[:200]) + "..."
	}
	return string(b)
}

func nonce() string {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		return strconv.FormatInt(time.Now().UnixNano(), 16)
	}
	return hex.EncodeToString(b[:])
}

// ---------------------------------------------------------------- wire clients

type httpClient struct{ c *http.Client }

func newHTTPClient(sock string) *httpClient {
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", sock)
		},
		DisableKeepAlives: true,
	}
	return &httpClient{c: &http.Client{Transport: tr}}
}

func (h *httpClient) do(ctx context.Context, method, path string, body []byte) (int, []byte, error) {
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, "http://localhost"+path, rd)
	if err != nil {
		return 0, nil, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := h.c.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	return resp.StatusCode, b, err
}

// jsonConn is one JSON-lines connection (agent.sock or register.sock).
type jsonConn struct {
	net.Conn
	rd *bufio.Reader
}

func dialJSON(ctx context.Context, path string) (*jsonConn, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, "unix", path)
	if err != nil {
		return nil, err
	}
	if dl, ok := ctx.Deadline(); ok {
		c.SetDeadline(dl)
	}
	return &jsonConn{Conn: c, rd: bufio.NewReader(c)}, nil
}

// call writes one frame and decodes the next line into out.
func (c *jsonConn) call(frame any, out any) error {
	b, err := json.Marshal(frame)
	if err != nil {
		return err
	}
	if _, err := c.Write(append(b, '\n')); err != nil {
		return fmt.Errorf("write: %w", err)
	}
	line, err := c.rd.ReadBytes('\n')
	if err != nil {
		return fmt.Errorf("read answer: %w (got %q)", err, line)
	}
	if err := json.Unmarshal(line, out); err != nil {
		return fmt.Errorf("decode %q: %w", line, err)
	}
	return nil
}

// agentCall sends one frame on a fresh agent.sock connection, as the real clients do.
func agentCall(ctx context.Context, dir string, frame, out any) error {
	c, err := dialJSON(ctx, filepath.Join(dir, "agent.sock"))
	if err != nil {
		return err
	}
	defer c.Close()
	return c.call(frame, out)
}

type origin struct {
	Kind      string `json:"kind"`
	Harness   string `json:"harness"`
	SessionID string `json:"sessionId"`
}

type deliver struct {
	Action    string `json:"action"`
	MessageID string `json:"messageId"`
	Text      string `json:"text"`
	Envelope  string `json:"envelope"`
	Origin    origin `json:"origin"`
	Status    string `json:"status"`
	Detail    string `json:"detail"`
}

// registration is a live svc registration: the connection that holds it.
type registration struct{ *jsonConn }

func registerSvc(ctx context.Context, dir, name string) (*registration, error) {
	c, err := dialJSON(ctx, filepath.Join(dir, "register.sock"))
	if err != nil {
		return nil, err
	}
	var ans struct {
		Status    string `json:"status"`
		SessionID string `json:"sessionId"`
		Detail    string `json:"detail"`
	}
	if err := c.call(map[string]string{"harness": "svc", "name": name, "cwd": "/"}, &ans); err != nil {
		c.Close()
		return nil, err
	}
	if ans.Status != "ok" || ans.SessionID != "svc:"+name {
		c.Close()
		return nil, fmt.Errorf("got status %q sessionId %q detail %q, want ok svc:%s", ans.Status, ans.SessionID, ans.Detail, name)
	}
	return &registration{c}, nil
}

// pollFor polls until one of want is delivered and returns it. Deliveries of other messages
// (left over from earlier runs) are acked and reported as INFO, so a retried run still works.
func (g *registration) pollFor(ctx context.Context, r *report, want map[string]bool) (deliver, error) {
	for ctx.Err() == nil {
		var d deliver
		if err := g.call(map[string]any{"action": "poll", "waitSecs": 10}, &d); err != nil {
			return d, err
		}
		switch {
		case d.Action == "timeout":
			continue
		case d.Action != "deliver":
			return d, fmt.Errorf("poll: got action %q status %q detail %q, want deliver", d.Action, d.Status, d.Detail)
		case want[d.MessageID]:
			return d, nil
		default:
			r.info("acking an unrelated queued message %s", d.MessageID)
			if err := g.ack(ctx, d.MessageID); err != nil {
				return d, err
			}
		}
	}
	return deliver{}, fmt.Errorf("poll: %w", ctx.Err())
}

func (g *registration) ack(_ context.Context, id string) error {
	var ans struct {
		Status string `json:"status"`
		Detail string `json:"detail"`
	}
	if err := g.call(map[string]string{"action": "ack", "messageId": id}, &ans); err != nil {
		return err
	}
	if ans.Status != "ok" {
		return fmt.Errorf("ack: got status %q detail %q, want ok", ans.Status, ans.Detail)
	}
	return nil
}

// ---------------------------------------------------------------- other

func other(r *report, dir, state string, markers, creds []string) {
	if dir == "" && state == "" && len(markers) == 0 && len(creds) == 0 {
		r.fail("other", "nothing to check: give --dir, --state, --marker or --cred")
		return
	}
	if dir != "" {
		r.check("list:"+dir, denied(listDir(dir)))
		for _, s := range []string{"http.sock", "agent.sock", "register.sock"} {
			p := filepath.Join(dir, s)
			r.check("connect:"+p, denied(connectOnly(p)))
		}
	}
	if state != "" {
		r.check("list:"+state, denied(listDir(state)))
	}
	for _, m := range markers {
		r.check("read:"+m, denied(readFile(m)))
	}
	for _, c := range creds {
		r.check("cred:"+c, denied(readFile(c)))
	}
}

// denied turns "the access failed with a permission error" into nil. Success is the
// isolation failure; ENOENT and other errors fail too, because they prove nothing.
func denied(err error) error {
	switch {
	case err == nil:
		return errors.New("access succeeded, want permission denied")
	case errors.Is(err, syscall.EACCES), errors.Is(err, syscall.EPERM):
		return nil
	case errors.Is(err, fs.ErrNotExist):
		return fmt.Errorf("%v: the path must exist for this check to mean anything", err)
	default:
		return fmt.Errorf("%v: want permission denied", err)
	}
}

func listDir(dir string) error {
	_, err := os.ReadDir(dir)
	return err
}

func readFile(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	_, err = f.Read(make([]byte, 1))
	if err == io.EOF {
		err = nil
	}
	return err
}

func connectOnly(path string) error {
	c, err := net.DialTimeout("unix", path, 5*time.Second)
	if err != nil {
		return err
	}
	return c.Close()
}

// ---------------------------------------------------------------- gate

func gate(ctx context.Context, r *report, sock string) {
	var d net.Dialer
	c, err := d.DialContext(ctx, "unix", sock)
	if err != nil {
		r.fail("gate-connect", "%v (the modes must be relaxed so that only the peer check is left)", err)
		return
	}
	defer c.Close()
	r.pass("gate-connect")
	if dl, ok := ctx.Deadline(); ok {
		c.SetDeadline(dl)
	}
	// One request that every socket would answer if it got past the gate: an HTTP request
	// line and a JSON frame are both complete by the blank line / newline.
	_, werr := io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"+
		`{"harness":"svc","name":"probe","cwd":"/"}`+"\n")
	got, rerr := io.ReadAll(c)
	switch {
	case len(got) > 0:
		r.fail("gate-silent", "got %d bytes %q, want none", len(got), truncate(got))
	case rerr == nil, errors.Is(rerr, syscall.ECONNRESET):
		// EOF (or a reset: the daemon closed with our bytes unread) and nothing read.
		if werr != nil {
			r.info("write: %v (the daemon had already closed the connection)", werr)
		}
		r.pass("gate-silent")
	default:
		r.fail("gate-silent", "read: %v, want EOF without data", rerr)
	}
}

// ---------------------------------------------------------------- notcp

func notcp(r *report, uid int, pids, ports []string) {
	sources := []string{"/proc/self/net"}
	for _, p := range pids {
		if _, err := strconv.Atoi(p); err != nil {
			r.fail("notcp", "--pid %q: not a number", p)
			return
		}
		sources = append(sources, "/proc/"+p+"/net")
	}
	wantPorts := map[int]bool{}
	for _, p := range ports {
		n, err := strconv.Atoi(p)
		if err != nil {
			r.fail("notcp", "--port %q: not a number", p)
			return
		}
		wantPorts[n] = true
	}
	for _, src := range sources {
		var found []string
		var err error
		for _, f := range []string{"tcp", "tcp6"} {
			b, rerr := os.ReadFile(filepath.Join(src, f))
			if rerr != nil {
				err = rerr
				break
			}
			ls, perr := parseTCP(b)
			if perr != nil {
				err = fmt.Errorf("%s/%s: %w", src, f, perr)
				break
			}
			for _, l := range ls {
				if l.State == tcpListen && (l.UID == uid || wantPorts[l.Port]) {
					found = append(found, fmt.Sprintf("%s port %d uid %d", f, l.Port, l.UID))
				}
			}
		}
		if err == nil && len(found) > 0 {
			err = fmt.Errorf("listening: %s", strings.Join(found, ", "))
		}
		r.check("notcp:"+src, err)
	}
}

const tcpListen = 0x0A

// tcpSocket is one row of /proc/net/tcp or /proc/net/tcp6.
type tcpSocket struct {
	Port  int
	State int
	UID   int
}

// parseTCP parses the /proc/net/tcp{,6} table: a header line, then rows of
// "sl local_address rem_address st tx_queue:rx_queue tr:tm->when retrnsmt uid ...", where
// local_address is HEXIP:HEXPORT and st is the hex TCP state.
func parseTCP(b []byte) ([]tcpSocket, error) {
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) == 0 || !strings.Contains(lines[0], "local_address") {
		return nil, errors.New("missing header")
	}
	var out []tcpSocket
	for _, line := range lines[1:] {
		f := strings.Fields(line)
		if len(f) < 8 {
			return nil, fmt.Errorf("short row %q", line)
		}
		_, portHex, ok := strings.Cut(f[1], ":")
		if !ok {
			return nil, fmt.Errorf("local address %q", f[1])
		}
		port, err := strconv.ParseUint(portHex, 16, 16)
		if err != nil {
			return nil, fmt.Errorf("port %q: %w", portHex, err)
		}
		st, err := strconv.ParseUint(f[3], 16, 8)
		if err != nil {
			return nil, fmt.Errorf("state %q: %w", f[3], err)
		}
		uid, err := strconv.ParseUint(f[7], 10, 32)
		if err != nil {
			return nil, fmt.Errorf("uid %q: %w", f[7], err)
		}
		out = append(out, tcpSocket{Port: int(port), State: int(st), UID: int(uid)})
	}
	return out, nil
}

// ---------------------------------------------------------------- enqueue / drain

func enqueue(ctx context.Context, r *report, dir, name string, count int, idsFile string) {
	// Registered while sending, so that the svc target resolves; never polled, so every
	// message stays queued in the daemon's store.
	reg, err := registerSvc(ctx, dir, name)
	if !r.check("register", err) {
		return
	}
	defer reg.Close()
	c := newHTTPClient(filepath.Join(dir, "http.sock"))
	var lines []string
	for i := range count {
		text := fmt.Sprintf("queued-%d-%s", i, nonce())
		payload, _ := json.Marshal(map[string]string{"from": "probe", "text": text})
		status, body, err := c.do(ctx, "POST", "/v1/sessions/svc:"+name+"/messages", payload)
		err = expectStatus(status, body, err, http.StatusAccepted)
		var acc struct {
			MessageID string `json:"messageId"`
		}
		if err == nil && (json.Unmarshal(body, &acc) != nil || acc.MessageID == "") {
			err = fmt.Errorf("202 body %q: want a messageId", body)
		}
		if !r.check(fmt.Sprintf("enqueue-%d", i), err) {
			return
		}
		lines = append(lines, acc.MessageID+" "+text)
	}
	r.check("write-ids", os.WriteFile(idsFile, []byte(strings.Join(lines, "\n")+"\n"), 0o600))
}

func drain(ctx context.Context, r *report, dir, name, idsFile string) {
	b, err := os.ReadFile(idsFile)
	if !r.check("read-ids", err) {
		return
	}
	want := map[string]string{} // message id -> text
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		id, text, ok := strings.Cut(line, " ")
		if !ok {
			r.fail("read-ids", "malformed line %q", line)
			return
		}
		want[id] = text
	}
	reg, err := registerSvc(ctx, dir, name)
	if !r.check("register", err) {
		return
	}
	defer reg.Close()
	pending := map[string]bool{}
	for id := range want {
		pending[id] = true
	}
	for len(pending) > 0 {
		d, err := reg.pollFor(ctx, r, pending)
		if err == nil && d.Text != want[d.MessageID] {
			err = fmt.Errorf("message %s: got text %q, want %q", d.MessageID, d.Text, want[d.MessageID])
		}
		if err == nil {
			err = reg.ack(ctx, d.MessageID)
		}
		if !r.check("drain:"+d.MessageID, err) {
			r.fail("drain", "%d of %d messages not delivered", len(pending), len(want))
			return
		}
		delete(pending, d.MessageID)
	}
	r.pass(fmt.Sprintf("drain-all:%d", len(want)))
}

// ---------------------------------------------------------------- sandbox

func sandbox(r *report, readonly, writable []string) {
	for _, fam := range []struct {
		name string
		af   int
	}{{"inet", syscall.AF_INET}, {"inet6", syscall.AF_INET6}} {
		fd, err := syscall.Socket(fam.af, syscall.SOCK_STREAM, 0)
		if err == nil {
			syscall.Close(fd)
			r.fail("socket-"+fam.name, "socket() succeeded, want it refused")
		} else {
			r.pass("socket-" + fam.name)
			r.info("socket-%s: %v", fam.name, err)
		}
	}
	fd, err := syscall.Socket(syscall.AF_UNIX, syscall.SOCK_STREAM, 0)
	if r.check("socket-unix", err) {
		syscall.Close(fd)
	}
	for _, d := range readonly {
		err := createFile(d)
		switch {
		case err == nil:
			err = errors.New("file created, want EROFS")
		case errors.Is(err, syscall.EROFS):
			err = nil
		default:
			err = fmt.Errorf("%v: want EROFS (a read-only mount, not a permission check)", err)
		}
		r.check("readonly:"+d, err)
	}
	for _, d := range writable {
		r.check("writable:"+d, createFile(d))
	}
	status, err := os.ReadFile("/proc/self/status")
	if !r.check("proc-status", err) {
		return
	}
	for _, want := range []struct{ key, value string }{
		{"NoNewPrivs", "1"}, {"Seccomp", "2"}, {"CapEff", "0000000000000000"},
	} {
		got := statusField(status, want.key)
		if got != want.value {
			r.fail("status-"+want.key, "got %q, want %q", got, want.value)
		} else {
			r.pass("status-" + want.key)
		}
	}
}

func createFile(dir string) error {
	f, err := os.CreateTemp(dir, ".xmsg-probe-*")
	if err != nil {
		return err
	}
	f.Close()
	return os.Remove(f.Name())
}

// statusField returns the value of "Key:\tvalue" in /proc/<pid>/status, "" when absent.
func statusField(status []byte, key string) string {
	for _, line := range strings.Split(string(status), "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok && k == key {
			return strings.TrimSpace(v)
		}
	}
	return ""
}
