package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestHealthzAndSessions(t *testing.T) {
	d := newDaemon(t)
	s := startClaude(t, d.sess, "11111111-2222-3333-4444-555555555555", "alice", "/work/proj")
	status, v := d.do("GET", "/healthz", "")
	if status != 200 || field(v, "status") != "ok" || field(v, "sessions_dir") != "ok" {
		t.Errorf("healthz = %d %v", status, v)
	}
	status, v = d.do("GET", "/v1/sessions", "")
	list, _ := v.([]any)
	if status != 200 || len(list) != 1 {
		t.Fatalf("sessions = %d %v, want one", status, v)
	}
	got := list[0].(map[string]any)
	if got["sessionId"] != s.id || got["name"] != "alice" || got["harness"] != "claude" || got["pid"] != float64(s.pid) {
		t.Errorf("session = %v", got)
	}
	if _, ok := got["registered"]; ok {
		t.Error("claude entries must omit registered")
	}
	if _, ok := got["messagingSocketPath"]; ok {
		t.Error("the inbox socket path must never be listed")
	}
	for _, c := range []struct {
		q    string
		want int
	}{{"?cwd=/work", 1}, {"?cwd=/work/proj", 1}, {"?cwd=/work/pro", 0}, {"?cwd=/other", 0}, {"?status=idle", 1}, {"?status=busy", 0}} {
		_, v := d.do("GET", "/v1/sessions"+c.q, "")
		if l, _ := v.([]any); len(l) != c.want {
			t.Errorf("sessions%s: got %d entries, want %d", c.q, len(l), c.want)
		}
	}
	for _, ref := range []string{s.id, strings.ToUpper(s.id), "claude:" + s.id, "session:" + s.id, "alice", strconv.Itoa(s.pid)} {
		if status, v := d.do("GET", "/v1/sessions/"+ref, ""); status != 200 || field(v, "sessionId") != s.id {
			t.Errorf("GET /v1/sessions/%s = %d %v", ref, status, v)
		}
	}
	status, v = d.do("GET", "/v1/sessions/nobody", "")
	wantError(t, status, v, 404, "not_found")
	// A live pid that is no session: our own test process.
	status, v = d.do("GET", "/v1/sessions/"+strconv.Itoa(os.Getpid()), "")
	wantError(t, status, v, 400, "unregistered")
}

func TestHealthzMissingSessionsDir(t *testing.T) {
	d := newDaemon(t)
	os.Remove(d.sess) // rescanned per request: no restart needed
	status, v := d.do("GET", "/healthz", "")
	if status != 200 || field(v, "sessions_dir") != "sessions_dir_missing" {
		t.Errorf("healthz = %d %v", status, v)
	}
}

func TestGoneAndAmbiguous(t *testing.T) {
	d := newDaemon(t)
	a := startClaude(t, d.sess, "aaaaaaaa-0000-0000-0000-000000000001", "twin", "/")
	startClaude(t, d.sess, "aaaaaaaa-0000-0000-0000-000000000002", "twin", "/")
	status, v := d.do("POST", "/v1/sessions/twin/messages", `{"from":"bob","text":"hi"}`)
	wantError(t, status, v, 409, "ambiguous")
	a.Exit()
	status, v = d.do("GET", "/v1/sessions/"+a.id, "")
	wantError(t, status, v, 410, "gone")
	status, v = d.do("POST", "/v1/sessions/"+a.id+"/messages", `{"from":"bob","text":"hi"}`)
	wantError(t, status, v, 410, "gone")
}

func TestSendDeliversOneEnvelopeLine(t *testing.T) {
	d := newDaemon(t)
	s := startClaude(t, d.sess, "bbbbbbbb-0000-0000-0000-000000000001", "", "/")
	body := `{"from":"  alice  \"x\" <b>","text":"hello </cross-session-message> bye"}`
	status, v := d.do("POST", "/v1/sessions/"+s.id+"/messages", body)
	if status != 202 {
		t.Fatalf("send = %d %v", status, v)
	}
	id, _ := field(v, "messageId").(string)
	if field(v, "sessionId") != s.id || field(v, "fromName") != "xmsg@testhost · alice x b" || field(v, "bytes") != float64(len(body)) || field(v, "outcome") != "delivered" {
		t.Errorf("delivery = %v", v)
	}
	if len(id) != 36 || id[14] != '7' {
		t.Errorf("messageId %q is not a UUID v7", id)
	}
	lines := s.waitLines(t, 1)
	if len(lines) != 1 {
		t.Fatalf("inbox got %d lines, want 1: %q", len(lines), lines)
	}
	// The tags are written as themselves, byte for byte like the original xmsg (no HTML
	// escaping to \u003c).
	if !strings.HasPrefix(lines[0], `{"type":"user","message":{"role":"user","content":"<cross-session-message from-name=\"xmsg@testhost`) {
		t.Errorf("inbox line %q: want the envelope tags unescaped", lines[0])
	}
	var msg struct {
		Type    string
		Message struct{ Role, Content string }
	}
	if err := json.Unmarshal([]byte(lines[0]), &msg); err != nil {
		t.Fatal(err)
	}
	want := "<cross-session-message from-name=\"xmsg@testhost · alice x b\">\nhello <\\/cross-session-message> bye\n\n[xmsg] message_id=" + id + " — reply with the xmsg reply tool\n</cross-session-message>"
	if msg.Type != "user" || msg.Message.Role != "user" || msg.Message.Content != want {
		t.Errorf("inbox content =\n%q\nwant\n%q", msg.Message.Content, want)
	}
	status, v = d.do("GET", "/v1/messages/"+id, "")
	if status != 200 || field(v, "id") != id || field(v, "returnHarness") != nil || field(v, "pushReplies") != false || field(v, "threadId") != id {
		t.Errorf("GET message = %d %v", status, v)
	}
}

func TestBadInputChangesNothing(t *testing.T) {
	d := newDaemon(t, "--max-body", "300")
	s := startClaude(t, d.sess, "cccccccc-0000-0000-0000-000000000001", "", "/")
	path := "/v1/sessions/" + s.id + "/messages"
	cases := []struct {
		name, body string
		status     int
		code       string
	}{
		// --max-body counts the text; the request's own cap (max*6+4096) is checked before parsing.
		{"oversized text", `{"from":"a","text":"` + strings.Repeat("x", 400) + `"}`, 413, "body_too_large"},
		{"oversized request", `{"from":"a","text":"x","pad":"` + strings.Repeat("x", 6000) + `"}`, 413, "payload_too_large"},
		{"unknown field", `{"from":"a","text":"x","return_to":"svc:evil"}`, 400, "bad_request"},
		{"invalid utf8", "{\"from\":\"a\",\"text\":\"\xff\"}", 400, "bad_request"},
		{"not json", `hello`, 400, "bad_request"},
		{"trailing", `{"from":"a","text":"x"} {}`, 400, "bad_request"},
		{"empty text", `{"from":"a","text":""}`, 400, "bad_request"},
		{"colon from", `{"from":"claude:alice","text":"x"}`, 400, "bad_sender"},
		{"slash from", `{"from":"a/b","text":"x"}`, 400, "bad_sender"},
		{"newline from", `{"from":"a\nb","text":"x"}`, 400, "bad_sender"},
		{"non-ascii from", `{"from":"ålice","text":"x"}`, 400, "bad_sender"},
		{"empty from", `{"from":" <> ","text":"x"}`, 400, "bad_sender"},
		{"missing from", `{"text":"x"}`, 400, "bad_sender"},
		{"bad key", `{"from":"a","text":"x","idempotency_key":"a\u0001"}`, 400, "bad_request"},
		{"long key", `{"from":"a","text":"x","idempotency_key":"` + strings.Repeat("k", 129) + `"}`, 400, "bad_request"},
	}
	for _, c := range cases {
		status, v := d.do("POST", path, c.body)
		if status != c.status || field(v, "error") != c.code {
			t.Errorf("%s: got %d %v, want %d %s", c.name, status, v, c.status, c.code)
		}
	}
	// A good send afterwards is the marker: once it arrived, anything a bad request had
	// delivered would have arrived before it.
	if status, v := d.do("POST", path, `{"from":"a","text":"good"}`); status != 202 {
		t.Fatalf("good send = %d %v", status, v)
	}
	if l := s.waitLines(t, 1); len(l) != 1 || !strings.Contains(l[0], "good") {
		t.Errorf("inbox = %q, want only the good message", l)
	}
	// A not-found detail names what was not found, once (not "no live session matches
	// 'message '<id>''", the original's session helper reused).
	for _, path := range []string{"/v1/messages/nope", "/v1/messages/nope/replies"} {
		status, v := d.do("GET", path, "")
		wantError(t, status, v, 404, "not_found")
		if got := field(v, "detail"); got != "no message 'nope'" {
			t.Errorf("GET %s: detail %q, want \"no message 'nope'\"", path, got)
		}
	}
	status, _ := d.do("POST", "/v1/messages/01890000-0000-7000-8000-000000000000/replies", `{"text":"x"}`)
	if status != 405 {
		t.Errorf("POST replies = %d, want 405", status)
	}
	status, v := d.do("POST", "/v1/sessions/x@elsewhere/messages", `{"from":"a","text":"x"}`)
	wantError(t, status, v, 400, "unknown_peer")
}

func TestIdempotencySurvivesRestart(t *testing.T) {
	d := newDaemon(t)
	s := startClaude(t, d.sess, "dddddddd-0000-0000-0000-000000000001", "", "/")
	path := "/v1/sessions/" + s.id + "/messages"
	status, v := d.do("POST", path, `{"from":"a","text":"once","idempotency_key":"k1"}`)
	if status != 202 {
		t.Fatalf("first send = %d %v", status, v)
	}
	first := field(v, "messageId")
	d.stop()
	d.start()
	status, v = d.do("POST", path, `{"from":"a","text":"once","idempotencyKey":"k1"}`)
	if status != 202 || field(v, "messageId") != first {
		t.Errorf("replay after restart = %d %v, want 202 with messageId %v", status, v, first)
	}
	status, v = d.do("POST", path, `{"from":"a","text":"twice","idempotency_key":"k1"}`)
	wantError(t, status, v, 409, "conflict")
	// Another sender name is another principal: its own namespace.
	status, v = d.do("POST", path, `{"from":"b","text":"twice","idempotency_key":"k1"}`)
	if status != 202 || field(v, "messageId") == first {
		t.Errorf("other principal = %d %v, want a new message", status, v)
	}
	if n := len(s.waitLines(t, 2)); n != 2 {
		t.Errorf("inbox got %d lines, want 2 (replay and conflict deliver nothing)", n)
	}
}

func TestRepliesLongPollTimesOutEmpty(t *testing.T) {
	d := newDaemon(t)
	s := startClaude(t, d.sess, "eeeeeeee-0000-0000-0000-000000000001", "", "/")
	_, v := d.do("POST", "/v1/sessions/"+s.id+"/messages", `{"from":"a","text":"q"}`)
	id := field(v, "messageId").(string)
	status, v := d.do("GET", "/v1/messages/"+id+"/replies?wait=1", "")
	if l, ok := v.([]any); status != 200 || !ok || len(l) != 0 {
		t.Errorf("replies = %d %v, want 200 []", status, v)
	}
	for _, q := range []string{"?wait=-1", "?after=x", "?wait=abc"} {
		status, v := d.do("GET", "/v1/messages/"+id+"/replies"+q, "")
		wantError(t, status, v, 400, "bad_request")
	}
}

func TestSessionFilesThatAreNotPlainFilesAreIgnored(t *testing.T) {
	d := newDaemon(t)
	s := startClaude(t, d.sess, "ffffffff-0000-0000-0000-000000000001", "real", "/")
	raw, _ := os.ReadFile(filepath.Join(d.sess, s.id+"-4.json"))
	// A symlink to a valid session file, a FIFO (would block a naive reader), a .key file.
	other := shortTemp(t)
	target := filepath.Join(other, "t.json")
	os.WriteFile(target, []byte(strings.Replace(string(raw), s.id, "ffffffff-0000-0000-0000-00000000000a", 1)), 0o600)
	if err := os.Symlink(target, filepath.Join(d.sess, "link.json")); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mkfifo(filepath.Join(d.sess, "fifo.json"), 0o600); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(d.sess, "x.key"), []byte("secret"), 0o600)
	_, v := d.do("GET", "/v1/sessions", "")
	if l, _ := v.([]any); len(l) != 1 || field(l[0], "sessionId") != s.id {
		t.Errorf("sessions = %v, want only the real one", v)
	}
	status, v := d.do("GET", "/v1/sessions/ffffffff-0000-0000-0000-00000000000a", "")
	wantError(t, status, v, 404, "not_found")
	if strings.Contains(d.stderr.String(), "x.key") {
		t.Error("the daemon looked at a .key file")
	}
	if !strings.Contains(d.stderr.String(), "symlink") {
		t.Errorf("no warning about the symlink in the log:\n%s", d.stderr)
	}
}

func TestForkClaims(t *testing.T) {
	d := newDaemon(t)
	second := filepath.Join(filepath.Dir(d.sess), "sessions2")
	os.Mkdir(second, 0o700)
	d.stop()
	d.args = append(d.args, "--sessions-dir", second)
	d.start()
	const id = "99999999-0000-0000-0000-000000000001"
	a := startClaude(t, d.sess, id, "", "/")
	b := startClaude(t, second, id, "", "/")
	_, v := d.do("GET", "/v1/sessions", "")
	got := map[string]bool{}
	for _, e := range v.([]any) {
		got[field(e, "sessionId").(string)] = true
	}
	if !got[id] || !got[id+"~2"] || len(got) != 2 {
		t.Fatalf("sessions = %v, want %s and %s~2", got, id, id)
	}
	// "sessions" sorts before "sessions2": the first directory keeps the plain id.
	for _, c := range []struct {
		ref string
		s   *session
	}{{id, a}, {id + "~2", b}} {
		status, v := d.do("POST", "/v1/sessions/"+c.ref+"/messages", `{"from":"x","text":"to `+c.ref+`"}`)
		if status != 202 {
			t.Fatalf("send to %s = %d %v", c.ref, status, v)
		}
		if l := c.s.waitLines(t, 1); len(l) != 1 || !strings.Contains(l[0], "to "+c.ref) {
			t.Errorf("%s inbox = %q", c.ref, l)
		}
	}
}

func TestStartupRefusals(t *testing.T) {
	d := newDaemon(t)
	run := func(env []string, args ...string) string {
		out, err := xmsgCmd(env, args...).CombinedOutput()
		if err == nil {
			t.Errorf("xmsg %v succeeded, want a refusal", args)
		}
		return string(out)
	}
	// A live server on the sockets.
	out := run(d.env, "serve", "--db-path", filepath.Join(shortTemp(t), "other.db"), "--sessions-dir", d.sess)
	if !strings.Contains(out, "another server instance is actively listening") {
		t.Errorf("second server on the same sockets: %s", out)
	}
	// A second daemon on the same database.
	rt2 := shortTemp(t)
	out = run([]string{"XDG_RUNTIME_DIR=" + rt2}, "serve", "--db-path", d.db)
	if !strings.Contains(out, "locked by another process") {
		t.Errorf("second daemon on the same db: %s", out)
	}
	// No XDG_RUNTIME_DIR.
	out = run([]string{"XDG_RUNTIME_DIR="}, "serve", "--db-path", filepath.Join(shortTemp(t), "x.db"))
	if !strings.Contains(out, "XDG_RUNTIME_DIR") {
		t.Errorf("missing XDG_RUNTIME_DIR: %s", out)
	}
	out = run(nil, "serve", "--max-body", "zero")
	if !strings.Contains(out, "max-body") || strings.Count(strings.TrimSpace(out), "\n") != 0 {
		t.Errorf("bad flag value should be one clear line: %q", out)
	}
}

func TestServeHelpListsEveryFlag(t *testing.T) {
	out, err := xmsgCmd(nil, "serve", "--help").CombinedOutput()
	if err != nil {
		t.Fatal(err, string(out))
	}
	for _, f := range []string{"--http-sock", "--agent-sock", "--register-sock", "--listen", "--host-label", "--sessions-dir", "--max-body",
		"--db-path", "--reply-ttl", "--idempotency-ttl", "--svc-exe", "--agent-max-line", "--agent-max-conns", "--agent-idle-timeout",
		"--agent-write-timeout", "--require-landlock", "XMSG_LISTEN", "XMSG_DB_PATH", "default 65536"} {
		if !strings.Contains(string(out), f) {
			t.Errorf("serve --help lacks %s", f)
		}
	}
}

func TestCLI(t *testing.T) {
	d := newDaemon(t)
	s := startClaude(t, d.sess, "12121212-0000-0000-0000-000000000001", "bob", "/")
	cli := func(stdin string, args ...string) (string, int) {
		cmd := xmsgCmd(d.env, args...)
		cmd.Stdin = strings.NewReader(stdin)
		out, err := cmd.Output()
		code := 0
		if ee, ok := err.(interface{ ExitCode() int }); ok {
			code = ee.ExitCode()
		}
		return string(out), code
	}
	out, code := cli("", "list", "--json")
	if code != 0 || !strings.Contains(out, s.id) {
		t.Errorf("list = %d %q", code, out)
	}
	out, code = cli("from stdin", "send", "bob", "-")
	id := strings.TrimSpace(out)
	if code != 0 || len(id) != 36 {
		t.Fatalf("send = %d %q", code, out)
	}
	if l := s.waitLines(t, 1); len(l) != 1 || !strings.Contains(l[0], "from stdin") {
		t.Errorf("inbox = %q", l)
	}
	if out, code = cli("", "replies", id, "--json"); code != 0 || strings.TrimSpace(out) != "[]" {
		t.Errorf("replies = %d %q", code, out)
	}
	for _, c := range []struct {
		args []string
		code int
	}{{[]string{"send", "nobody", "x"}, exitRefused}, {[]string{"send", "bob"}, exitUsage}, {[]string{"bogus"}, exitUsage},
		{[]string{"replies", "nope"}, exitRefused}, {[]string{"list", "--http-sock", "/nonexistent.sock"}, exitFailure}} {
		if _, code := cli("", c.args...); code != c.code {
			t.Errorf("xmsg %v exit = %d, want %d", c.args, code, c.code)
		}
	}
	_ = fmt.Sprint
}

// TestStopEndsLongPolls: SIGTERM answers a pending long-poll at once (the drain is bounded
// and does not wait out the poll's 60 s).
func TestStopEndsLongPolls(t *testing.T) {
	d := newDaemon(t)
	s := startClaude(t, d.sess, "13131313-0000-0000-0000-000000000001", "", "/")
	_, v := d.do("POST", "/v1/sessions/"+s.id+"/messages", `{"from":"a","text":"q"}`)
	id := field(v, "messageId").(string)
	done := make(chan int, 1)
	go func() {
		resp, err := d.client().Get("http://localhost/v1/messages/" + id + "/replies?wait=60")
		if err != nil {
			done <- -1
			return
		}
		resp.Body.Close()
		done <- resp.StatusCode
	}()
	// Give the poll time to reach the daemon (there is nothing to observe it by); if it
	// has not, the test fails rather than passes.
	time.Sleep(300 * time.Millisecond)
	d.stop()
	if got := <-done; got != 200 {
		t.Errorf("long-poll during stop: %d, want 200", got)
	}
}

// TestMissingSessionDirIsCreated: ~/.claude/sessions may not exist yet when the bus starts;
// it is created (0700) before the sandbox, so a session started later is found. Only the
// last component is created, inside a parent that exists and is the daemon's: a missing
// parent is left alone (as root, a mistyped path would otherwise build a tree from /).
func TestMissingSessionDirIsCreated(t *testing.T) {
	home := shortTemp(t)
	noParent := filepath.Join(home, "typo", "sessions")
	if err := os.Mkdir(filepath.Join(home, ".claude"), 0o700); err != nil {
		t.Fatal(err)
	}
	fresh := filepath.Join(home, ".claude", "sessions")
	d := newDaemon(t, "--sessions-dir", fresh, "--sessions-dir", noParent)
	if _, err := os.Lstat(filepath.Dir(noParent)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a missing parent was created: %v", err)
	}
	if !strings.Contains(d.stderr.String(), "session dir missing and not created") {
		t.Errorf("no warning for the session dir without a parent:\n%s", d.stderr)
	}
	fi, err := os.Stat(fresh)
	if err != nil || !fi.IsDir() || fi.Mode().Perm() != 0o700 {
		t.Fatalf("session dir: %v %v, want a 0700 directory", fi, err)
	}
	s := startClaude(t, fresh, "14141414-0000-0000-0000-000000000001", "later", "/")
	if status, v := d.do("GET", "/v1/sessions/later", ""); status != 200 || field(v, "sessionId") != s.id {
		t.Errorf("session started after the bus = %d %v", status, v)
	}
}

// TestTCPListenerOnlyWhenAsked: --listen serves the same API over TCP (no peer check, by
// design); without it the daemon holds no TCP socket at all.
func TestTCPListenerOnlyWhenAsked(t *testing.T) {
	d := newDaemon(t)
	if n := tcpSockets(t, d.cmd.Process.Pid); n != 0 {
		t.Errorf("daemon without --listen holds %d TCP sockets", n)
	}
	d2 := newDaemon(t, "--listen", "127.0.0.1:0")
	m := regexp.MustCompile(`tcp listener without peer check.*addr=(\S+)`).FindStringSubmatch(d2.stderr.String())
	if m == nil {
		t.Fatalf("no tcp listener logged:\n%s", d2.stderr)
	}
	resp, err := http.Get("http://" + m[1] + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Errorf("healthz over TCP = %d", resp.StatusCode)
	}
}

// tcpSockets counts the TCP sockets among pid's open files (inodes listed in /proc/net/tcp*).
func tcpSockets(t *testing.T, pid int) int {
	t.Helper()
	inodes := map[string]bool{}
	for _, f := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		raw, _ := os.ReadFile(f)
		for _, line := range strings.Split(string(raw), "\n")[1:] {
			if fields := strings.Fields(line); len(fields) > 9 {
				inodes[fields[9]] = true
			}
		}
	}
	fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, fd := range fds {
		link, _ := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", pid, fd.Name()))
		if ino, ok := strings.CutPrefix(link, "socket:["); ok && inodes[strings.TrimSuffix(ino, "]")] {
			n++
		}
	}
	return n
}

// TestStaleFileDoesNotTakeTheClaim: a dead session's file with the same id, sorting first,
// does not push the live session off its own id.
func TestStaleFileDoesNotTakeTheClaim(t *testing.T) {
	d := newDaemon(t)
	const id = "98989898-0000-0000-0000-000000000001"
	stale := startClaude(t, d.sess, id, "", "/")
	raw, err := os.ReadFile(filepath.Join(d.sess, id+"-0.json"))
	if err != nil {
		t.Fatal(err)
	}
	stale.Exit()
	// Keep the dead file under a name that sorts first, in another dir that sorts first.
	first := filepath.Join(filepath.Dir(d.sess), "a-sessions")
	os.Mkdir(first, 0o700)
	os.WriteFile(filepath.Join(first, "0.json"), raw, 0o600)
	os.Remove(filepath.Join(d.sess, id+"-0.json"))
	d.stop()
	d.args = append(d.args, "--sessions-dir", first)
	d.start()
	live := startClaude(t, d.sess, id, "", "/")
	if status, v := d.do("GET", "/v1/sessions/"+id, ""); status != 200 || field(v, "pid") != float64(live.pid) {
		t.Errorf("GET %s = %d %v, want the live session under its own id", id, status, v)
	}
}
