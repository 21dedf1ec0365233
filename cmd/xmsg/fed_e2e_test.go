//go:build linux

package main

import (
	"bufio"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/xmsg/xmsg/internal/daemontest"
	"github.com/xmsg/xmsg/internal/fed/fedtest"
	"github.com/xmsg/xmsg/internal/ostest"
)

// The federation end-to-end tests: two real daemons (this binary as `xmsg serve`), each in
// a network namespace of its own joined by a veth pair (192.0.2.1 ↔ 192.0.2.2), each as its
// own OS user with its own state, certificates (generated here) and peers file. Everything
// crosses over real mTLS between the namespaces; clients run as the daemon's user (the peer
// gate admits nobody else).

const fedPort = 7443

// netPair makes two namespaces joined by a veth pair (va in a, 192.0.2.1; vb in b,
// 192.0.2.2); both are deleted at cleanup.
type netPair struct{ a, b, va, vb string }

func runCmd(t testing.TB, args ...string) {
	t.Helper()
	if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
		t.Fatalf("%s: %v: %s", strings.Join(args, " "), err, out)
	}
}

func newNetPair(t testing.TB) netPair {
	ostest.RequireRoot(t)
	ostest.RequireTool(t, "ip")
	ostest.RequireTool(t, "setpriv")
	var sfx [3]byte
	rand.Read(sfx[:])
	s := hex.EncodeToString(sfx[:])
	va, vb := "xva"+s, "xvb"+s
	np := netPair{a: "xmfa" + s, b: "xmfb" + s, va: va, vb: vb}
	runCmd(t, "ip", "netns", "add", np.a)
	t.Cleanup(func() { exec.Command("ip", "netns", "del", np.a).Run() })
	runCmd(t, "ip", "netns", "add", np.b)
	t.Cleanup(func() { exec.Command("ip", "netns", "del", np.b).Run() })
	runCmd(t, "ip", "link", "add", va, "netns", np.a, "type", "veth", "peer", "name", vb, "netns", np.b)
	for _, c := range [][]string{
		{"ip", "-n", np.a, "addr", "add", "192.0.2.1/24", "dev", va},
		{"ip", "-n", np.b, "addr", "add", "192.0.2.2/24", "dev", vb},
		{"ip", "-n", np.a, "link", "set", va, "up"}, {"ip", "-n", np.b, "link", "set", vb, "up"},
		{"ip", "-n", np.a, "link", "set", "lo", "up"}, {"ip", "-n", np.b, "link", "set", "lo", "up"},
	} {
		runCmd(t, c...)
	}
	return np
}

// fedNode is one daemon with its user, directories and credentials.
type fedNode struct {
	t        testing.TB
	name, ns string
	ip       string
	user     ostest.User
	exe      string
	base     string // owned by the node's user
	cert     *fedtest.Cert
	args     []string
	cmd      *exec.Cmd
	stderr   *daemontest.LogBuffer
}

func newFedNode(t testing.TB, name, ns, ip, exe string, user ...ostest.User) *fedNode {
	n := &fedNode{t: t, name: name, ns: ns, ip: ip, exe: exe}
	if len(user) > 0 {
		n.user = user[0]
	} else {
		n.user = ostest.AddUser(t)
	}
	base, err := os.MkdirTemp("", "xf"+name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(base) })
	n.base = base
	for _, d := range []string{"", "rt", "state", "sessions", "creds"} {
		p := filepath.Join(base, d)
		os.MkdirAll(p, 0o700)
		if err := os.Chown(p, int(n.user.UID), int(n.user.GID)); err != nil {
			t.Fatal(err)
		}
	}
	n.setCert(fedtest.New(t, name, nil, fedtest.Options{}))
	return n
}

func (n *fedNode) path(p string) string { return filepath.Join(n.base, p) }

// writeFile writes a credential owned by the node's user, mode 0600, replacing it by rename
// (how a rotation lands).
func (n *fedNode) writeFile(name string, data []byte) {
	n.t.Helper()
	p := n.path("creds/" + name)
	tmp := p + ".tmp"
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		n.t.Fatal(err)
	}
	os.Chown(tmp, int(n.user.UID), int(n.user.GID))
	if err := os.Rename(tmp, p); err != nil {
		n.t.Fatal(err)
	}
}

func (n *fedNode) setCert(c *fedtest.Cert) {
	n.cert = c
	n.writeFile("cert.pem", c.CertPEM)
	n.writeFile("key.pem", c.KeyPEM)
}

func (n *fedNode) addr() string { return fmt.Sprintf("%s:%d", n.ip, fedPort) }

// asUser is the command prefix that runs argv as the node's user (in the host namespace:
// Unix sockets are reached by path).
func (n *fedNode) asUser(env []string, argv ...string) *exec.Cmd {
	args := append([]string{fmt.Sprintf("--reuid=%d", n.user.UID), fmt.Sprintf("--regid=%d", n.user.GID), "--clear-groups", "--"}, argv...)
	cmd := exec.Command("setpriv", args...)
	cmd.Env = append(os.Environ(), append([]string{"HOME=" + n.base, "XDG_RUNTIME_DIR=" + n.path("rt")}, env...)...)
	cmd.Stderr = os.Stderr
	return cmd
}

func (n *fedNode) start(extra ...string) {
	n.t.Helper()
	n.args = append([]string{"serve", "--db-path", n.path("state/xmsg.db"), "--sessions-dir", n.path("sessions"), "--host-label", n.name,
		"--fed-listen", n.addr(), "--fed-cert", n.path("creds/cert.pem"), "--fed-key", n.path("creds/key.pem"),
		"--peers-file", n.path("creds/peers.json"), "--svc-exe", "bot=" + n.exe, "--svc-exe", "other=" + n.exe,
		"--fed-reload-interval-secs", "1", "--require-landlock"}, extra...)
	n.restart()
}

func (n *fedNode) restart() {
	n.t.Helper()
	n.stderr = &daemontest.LogBuffer{}
	setpriv := append([]string{"netns", "exec", n.ns, "setpriv", fmt.Sprintf("--reuid=%d", n.user.UID), fmt.Sprintf("--regid=%d", n.user.GID), "--clear-groups", "--", n.exe}, n.args...)
	n.cmd = exec.Command("ip", setpriv...)
	n.cmd.Env = append(os.Environ(), "XMSG_TEST_ROLE=xmsg", "HOME="+n.base, "XDG_RUNTIME_DIR="+n.path("rt"))
	n.cmd.Stderr = n.stderr
	if err := n.cmd.Start(); err != nil {
		n.t.Fatal(err)
	}
	stopped := false
	n.t.Cleanup(func() {
		if !stopped {
			n.cmd.Process.Signal(syscall.SIGTERM)
			n.cmd.Wait()
		}
	})
	for i := 0; i < 1000; i++ {
		if strings.Contains(n.stderr.String(), "msg=serving") {
			return
		}
		if n.cmd.ProcessState != nil {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	n.t.Fatalf("%s did not start: %s", n.name, n.stderr)
}

func (n *fedNode) kill() {
	n.cmd.Process.Signal(syscall.SIGKILL)
	n.cmd.Wait()
}

// http runs one request on the node's http.sock as its user.
func (n *fedNode) http(method, path, body string) (int, map[string]any, []any) {
	n.t.Helper()
	cmd := n.asUser([]string{"XMSG_TEST_ROLE=fedhttp", "SOCK=" + n.path("rt/xmsg/http.sock"), "METHOD=" + method, "URLPATH=" + path, "BODY=" + body}, n.exe)
	out, err := cmd.Output()
	if err != nil {
		n.t.Fatalf("fedhttp: %v", err)
	}
	var r httpResult
	json.Unmarshal(out, &r)
	var m map[string]any
	var l []any
	json.Unmarshal(r.Body, &m)
	json.Unmarshal(r.Body, &l)
	return r.Status, m, l
}

// text is GET path on n's http.sock, as n's user: the status and the body as text.
func (n *fedNode) text(path string) (int, string) {
	n.t.Helper()
	cmd := n.asUser([]string{"XMSG_TEST_ROLE=fedhttp", "SOCK=" + n.path("rt/xmsg/http.sock"), "METHOD=GET", "URLPATH=" + path}, n.exe)
	out, err := cmd.Output()
	if err != nil {
		n.t.Fatalf("fedhttp: %v", err)
	}
	var r httpResult
	json.Unmarshal(out, &r)
	var body string
	json.Unmarshal(r.Body, &body)
	return r.Status, body
}

// claude starts a fake Claude session on n, as n's user, named name; the returned function
// waits for the first line its inbox receives.
func (n *fedNode) claude(id, name string) func() string {
	n.t.Helper()
	dir := n.path("inbox-" + name)
	os.Mkdir(dir, 0o700)
	os.Chown(dir, int(n.user.UID), int(n.user.GID))
	log := filepath.Join(dir, "inbox.log")
	cmd := n.asUser([]string{"XMSG_TEST_ROLE=fedclaude", "SESSION_DIR=" + n.path("sessions"), "SESSION_ID=" + id, "SESSION_NAME=" + name,
		"SESSION_CWD=/", "SESSION_FILE=" + id + ".json", "INBOX_SOCK=" + filepath.Join(dir, "inbox.sock"), "INBOX_LOG=" + log}, n.exe)
	stdin, _ := cmd.StdinPipe()
	out, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		n.t.Fatal(err)
	}
	n.t.Cleanup(func() { stdin.Close(); cmd.Wait() })
	if l, _ := bufio.NewReader(out).ReadString('\n'); l != "ready\n" {
		n.t.Fatalf("fake claude: %q", l)
	}
	return func() string {
		for i := 0; i < 500; i++ {
			if raw, _ := os.ReadFile(log); len(raw) > 0 {
				return string(raw)
			}
			time.Sleep(10 * time.Millisecond)
		}
		return ""
	}
}

// bot is a service process registered on a node.
type bot struct {
	t   testing.TB
	cmd *exec.Cmd
	in  io.WriteCloser
	out *bufio.Reader
}

func (n *fedNode) bot(name string) *bot {
	n.t.Helper()
	cmd := n.asUser([]string{"XMSG_TEST_ROLE=fedbot", "NAME=" + name, "REGISTER_SOCK=" + n.path("rt/xmsg/register.sock"), "AGENT_SOCK=" + n.path("rt/xmsg/agent.sock")}, n.exe)
	b := &bot{t: n.t, cmd: cmd}
	b.in, _ = cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	b.out = bufio.NewReader(stdout)
	if err := cmd.Start(); err != nil {
		n.t.Fatal(err)
	}
	n.t.Cleanup(func() { b.in.Close(); cmd.Wait() })
	if reg := b.read(); reg["status"] != "ok" {
		n.t.Fatalf("bot %s on %s: register: %v", name, n.name, reg)
	}
	return b
}

func (b *bot) read() map[string]any {
	b.t.Helper()
	line, err := b.out.ReadBytes('\n')
	if err != nil {
		b.t.Fatalf("bot: %v", err)
	}
	var m map[string]any
	json.Unmarshal(line, &m)
	return m
}

func (b *bot) do(cmd map[string]any) map[string]any {
	b.t.Helper()
	raw, _ := json.Marshal(cmd)
	b.in.Write(append(raw, '\n'))
	return b.read()
}

func (b *bot) poll(wait int) map[string]any { return b.do(map[string]any{"op": "poll", "wait": wait}) }

// peersJSON renders a peers file from entries name → fields.
func peersJSON(entries map[string]map[string]any) []byte {
	raw, _ := json.Marshal(entries)
	return raw
}

// fedPair is the standard setup: a and b pinning each other, allowing everything.
func fedPair(t *testing.T, bExtra map[string]map[string]any, extraB ...string) (a, b *fedNode) {
	np := newNetPair(t)
	_, exe := ostest.WorldExe(t, "xmsg")
	a = newFedNode(t, "a", np.a, "192.0.2.1", exe)
	b = newFedNode(t, "b", np.b, "192.0.2.2", exe)
	a.writeFile("peers.json", peersJSON(map[string]map[string]any{
		"b": {"address": b.addr(), "pin": b.cert.Pin, "allow": []string{"send", "reply", "list"}}}))
	bp := map[string]map[string]any{"a": {"address": a.addr(), "pin": a.cert.Pin, "allow": []string{"send", "reply", "list"}, "from": []string{"192.0.2.1"}}}
	for k, v := range bExtra {
		bp[k] = v
	}
	b.writeFile("peers.json", peersJSON(bp))
	a.start()
	b.start(extraB...)
	return a, b
}

func str(v any) string { s, _ := v.(string); return s }

func TestFederationMessagesAndReplies(t *testing.T) {
	a, b := fedPair(t, nil)
	botA, botB := a.bot("bot"), b.bot("bot")

	// Landlock in force with federation: only the listener's port to bind, the peer's to connect.
	for _, n := range []*fedNode{a, b} {
		if want := fmt.Sprintf("net=enforced scope=enforced tcp_bind=%d tcp_connect=%d", fedPort, fedPort); !strings.Contains(n.stderr.String(), want) {
			t.Errorf("%s: startup report lacks %q:\n%s", n.name, want, n.stderr)
		}
	}

	// A monitor on b, run as b's user on b's http.sock, sees the message arrive from a.
	mon := b.asUser([]string{"XMSG_TEST_ROLE=xmsg"}, b.exe, "monitor", "--json", "--count", "1", "--event", "sent")
	var monOut strings.Builder
	mon.Stdout = &monOut
	if err := mon.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { mon.Process.Kill(); mon.Wait() })
	daemontest.WaitFor(t, "b's monitor attached", func() bool {
		_, expo := b.text("/metrics")
		return strings.Contains(expo, "xmsg_monitors 1")
	})

	// 1. HTTP (anonymous) a → b; the bot on b replies on register.sock; a's long-poll, which
	// asks b's, wakes with the reply.
	status, d, _ := a.http("POST", "/v1/sessions/svc:bot@b/messages", `{"from":"carol","text":"hello b"}`)
	if status != 202 || d["outcome"] != "delivered" || d["sessionId"] != "svc:bot" {
		t.Fatalf("http send a→b: %d %v", status, d)
	}
	id1 := str(d["messageId"])
	got := botB.poll(5)
	if got["action"] != "deliver" || got["messageId"] != id1 || !strings.Contains(str(got["text"]), "hello b") {
		t.Fatalf("bot on b got %v", got)
	}
	if o, _ := got["origin"].(map[string]any); o["kind"] != "fed" || o["host"] != "a" {
		t.Errorf("origin = %v, want fed from a", got["origin"])
	}
	if err := mon.Wait(); err != nil {
		t.Fatalf("b's monitor: %v", err)
	}
	var ev map[string]any
	json.Unmarshal([]byte(monOut.String()), &ev)
	if ev["event"] != "sent" || ev["transport"] != "fed" || ev["peer"] != "a" || ev["message_id"] != id1 || ev["from"] != "fed:a" {
		t.Errorf("b's monitor saw %q, want the message sent over fed from a", monOut.String())
	}
	if !strings.HasPrefix(str(got["fromName"]), "xmsg@a · carol") {
		t.Errorf("fromName = %v", got["fromName"])
	}
	botB.do(map[string]any{"op": "ack", "id": id1})
	poll := make(chan []any, 1)
	go func() {
		_, _, l := a.http("GET", "/v1/messages/"+id1+"/replies?wait=30", "")
		poll <- l
	}()
	time.Sleep(200 * time.Millisecond) // let the long-poll start waiting (not asserted)
	if r := botB.do(map[string]any{"op": "reply", "id": id1, "text": "hi carol"}); r["status"] != "ok" {
		t.Fatalf("svc reply on b: %v", r)
	}
	if l := <-poll; len(l) != 1 || str(l[0].(map[string]any)["text"]) != "hi carol" {
		t.Errorf("a's long-poll got %v", l)
	}

	// 2. agent.sock b → a (the bot on b, attested as svc:bot); the bot on a replies on
	// agent.sock; the reply is pushed back across into b's bot queue, and a long-poll on b
	// wakes when it lands.
	r := botB.do(map[string]any{"op": "asend", "ref": "svc:bot@a", "text": "hello a"})
	dl, _ := r["delivery"].(map[string]any)
	if r["status"] != "ok" || dl["outcome"] != "delivered" {
		t.Fatalf("agent.sock send b→a: %v", r)
	}
	id2 := str(dl["messageId"])
	got = botA.poll(5)
	if got["messageId"] != id2 || !strings.HasPrefix(str(got["fromName"]), "xmsg@b · svc:bot") {
		t.Fatalf("bot on a got %v", got)
	}
	botA.do(map[string]any{"op": "ack", "id": id2})
	go func() {
		_, _, l := b.http("GET", "/v1/messages/"+id2+"/replies?wait=30", "")
		poll <- l
	}()
	time.Sleep(200 * time.Millisecond)
	r = botA.do(map[string]any{"op": "areply", "id": id2, "text": "hi b"})
	rep, _ := r["reply"].(map[string]any)
	if r["status"] != "ok" || rep["pushOutcome"] != "pushed" {
		t.Fatalf("agent.sock reply on a: %v", r)
	}
	if l := <-poll; len(l) != 1 || str(l[0].(map[string]any)["text"]) != "hi b" {
		t.Errorf("b's long-poll got %v", l)
	}
	got = botB.poll(5)
	if got["action"] != "deliver" || !strings.Contains(str(got["envelope"]), "reply to message_id="+id2) || !strings.Contains(str(got["text"]), "hi b") {
		t.Fatalf("pushed reply in b's queue: %v", got)
	}
	botB.do(map[string]any{"op": "ack", "id": str(got["messageId"])})

	// 3. svc a → b over agent.sock, replied on b's register.sock (the svc reply path):
	// pushed back into a's queue.
	r = botA.do(map[string]any{"op": "asend", "ref": "bot@b", "text": "third"})
	dl, _ = r["delivery"].(map[string]any)
	id3 := str(dl["messageId"])
	if got = botB.poll(5); got["messageId"] != id3 {
		t.Fatalf("bot on b got %v, want %s", got, id3)
	}
	botB.do(map[string]any{"op": "ack", "id": id3})
	if r := botB.do(map[string]any{"op": "reply", "id": id3, "text": "third reply"}); r["status"] != "ok" {
		t.Fatalf("svc reply: %v", r)
	}
	if got = botA.poll(5); !strings.Contains(str(got["envelope"]), "reply to message_id="+id3) {
		t.Errorf("a's queue: %v", got)
	}

	// 4. To a Claude session on b (a real process with a session file and an inbox socket,
	// as b's user): one envelope line in its inbox, with a's badge.
	inbox := b.claude("c0000000-0000-4000-8000-00000000000c", "expert")
	status, d, _ = a.http("POST", "/v1/sessions/expert@b/messages", `{"from":"carol","text":"for claude"}`)
	if status != 202 || d["sessionId"] != "c0000000-0000-4000-8000-00000000000c" {
		t.Fatalf("send to claude on b: %d %v", status, d)
	}
	if line := inbox(); !strings.Contains(line, `from-name=\"xmsg@a · carol\"`) || !strings.Contains(line, "for claude") || !strings.Contains(line, "message_id="+str(d["messageId"])) {
		t.Errorf("claude inbox line: %s", line)
	}

	// The peer's session list, with refs.
	status, _, list := a.http("GET", "/v1/sessions?peer=b", "")
	if status != 200 || len(list) != 2 || list[1].(map[string]any)["ref"] != "svc:bot@b" || list[0].(map[string]any)["ref"] != "c0000000-0000-4000-8000-00000000000c@b" {
		t.Errorf("sessions?peer=b: %d %v", status, list)
	}
	if status, m, _ := a.http("GET", "/v1/sessions?peer=nobody", ""); status != 404 {
		t.Errorf("sessions?peer=nobody: %d %v", status, m)
	}
	if status, m, _ := a.http("POST", "/v1/sessions/x@nobody/messages", `{"from":"c","text":"t"}`); status != 400 || m["error"] != "unknown_peer" {
		t.Errorf("unknown peer: %d %v", status, m)
	}
	// doctor names the listener, the peer, its trust and its last handshakes, and (under
	// Landlock, as a daemon runs) that the session dirs are watched and liveness is by pidfd.
	_, doc, _ := a.http("GET", "/v1/doctor", "")
	lines := fmt.Sprint(doc["lines"])
	for _, want := range []string{"federation listener: 192.0.2.1:7443", "federation peer b: address 192.0.2.2:7443, pin " + b.cert.Pin, "allow list,reply,send", "last outbound handshake: ok", "federation reload: every 1s",
		"session dirs: watched by inotify", "process liveness: pidfd"} {
		if !strings.Contains(lines, want) {
			t.Errorf("doctor lacks %q:\n%s", want, lines)
		}
	}
	// The metrics say the same of the peer: its handshakes counted and it up, under the
	// peers file's name, and the scrape is valid exposition.
	status, expo := a.text("/metrics")
	for _, want := range []string{`xmsg_fed_up{peer="b",direction="outbound"} 1`, `xmsg_fed_handshakes_total{peer="b",direction="outbound",result="ok"} `, "xmsg_fed_refused_capacity_total 0"} {
		if status != 200 || !strings.Contains(expo, want) {
			t.Errorf("metrics (%d) lack %q:\n%s", status, want, expo)
		}
	}
	// A local send to the peer counts under its name: messages and bytes each way by peer.
	if !regexp.MustCompile(`xmsg_events_total\{event="sent",transport="http",harness="[^"]*",peer="b",outcome="delivered",code=""\} [1-9]`).MatchString(expo) {
		t.Errorf("metrics lack the sends to peer b:\n%s", expo)
	}
	promtool(t, expo)
}

// raw runs requests against node to's listener from namespace ns with cert, outside any daemon.
func raw(t *testing.T, ns string, to *fedNode, cert *fedtest.Cert, exe string, reqs ...map[string]any) []httpResult {
	t.Helper()
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "c.pem"), cert.CertPEM, 0o600)
	os.WriteFile(filepath.Join(dir, "k.pem"), cert.KeyPEM, 0o600)
	rq, _ := json.Marshal(reqs)
	cmd := exec.Command("ip", "netns", "exec", ns, exe)
	cmd.Env = append(os.Environ(), "XMSG_TEST_ROLE=fedraw", "CERT="+filepath.Join(dir, "c.pem"), "KEY="+filepath.Join(dir, "k.pem"), "ADDR="+to.addr(), "REQS="+string(rq))
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("fedraw: %v", err)
	}
	var res []httpResult
	json.Unmarshal(out, &res)
	return res
}

func envelope(ref string, principal map[string]any, v int) map[string]any {
	id := uuid.Must(uuid.NewV7()).String()
	if principal == nil {
		principal = map[string]any{"kind": "session", "harness": "claude", "session_id": "s-1", "name": "alice"}
	}
	e := map[string]any{"v": v, "id": id, "principal": principal, "to": map[string]any{"ref": ref}, "body": "x", "push_replies": true, "thread_id": id, "created_at": 1}
	body, _ := json.Marshal(e)
	return map[string]any{"Method": "POST", "Path": "/fed/v2/messages", "Body": string(body), "id": id}
}

func errCode(r httpResult) string {
	var m map[string]any
	json.Unmarshal(r.Body, &m)
	return str(m["error"])
}

func TestFederationRefusals(t *testing.T) {
	ca := fedtest.New(t, "ca", nil, fedtest.Options{CA: true})
	member := fedtest.New(t, "member", ca, fedtest.Options{URIs: []string{"spiffe://xmsg.test/node/member"}})
	wrongSAN := fedtest.New(t, "wrongsan", ca, fedtest.Options{URIs: []string{"spiffe://xmsg.test/admin/x"}})
	both := fedtest.New(t, "both", ca, fedtest.Options{URIs: []string{"spiffe://xmsg.test/node/both"}})
	stranger := fedtest.New(t, "stranger", nil, fedtest.Options{})
	outbound := fedtest.New(t, "outbound", nil, fedtest.Options{})
	elsewhere := fedtest.New(t, "elsewhere", nil, fedtest.Options{})
	narrow := fedtest.New(t, "narrow", nil, fedtest.Options{})
	var a, b *fedNode
	extra := map[string]map[string]any{
		"cluster":   {"address": "192.0.2.9:7443", "ca": "", "identities": []string{"spiffe://xmsg.test/node/*"}, "allow": []string{"send"}},
		"bothpin":   {"address": "192.0.2.9:7443", "pin": both.Pin, "allow": []string{"send"}},
		"outbound":  {"address": "192.0.2.9:7443", "pin": outbound.Pin},
		"elsewhere": {"address": "192.0.2.9:7443", "pin": elsewhere.Pin, "allow": []string{"send"}, "from": []string{"198.51.100.0/24"}},
		"narrow":    {"address": "192.0.2.9:7443", "pin": narrow.Pin, "allow": []string{"send"}, "principals": []string{"claude:alice", "claude:rate"}, "targets": []string{"svc:bot"}},
	}
	// The CA bundle is a file of its own next to the peers file (root-owned is fine: public).
	caDir := t.TempDir()
	os.Chmod(caDir, 0o755)
	os.WriteFile(filepath.Join(caDir, "ca.pem"), ca.CertPEM, 0o644)
	extra["cluster"]["ca"] = filepath.Join(caDir, "ca.pem")
	for d := filepath.Dir(caDir); d != "/" && d != os.TempDir(); d = filepath.Dir(d) {
		os.Chmod(d, 0o755)
	}
	a, b = fedPair(t, extra, "--fed-rate-principal", "3")
	exe := a.exe
	check := func(name string, res []httpResult, wantStatus int, wantCode string) {
		t.Helper()
		for i, r := range res {
			switch {
			case wantStatus == 0 && (r.Err == "" || r.Status != 0):
				t.Errorf("%s [%d]: got %d %s %s, want a TLS failure (nothing reaches HTTP)", name, i, r.Status, r.Body, r.Err)
			case wantStatus != 0 && (r.Status != wantStatus || errCode(r) != wantCode):
				t.Errorf("%s [%d]: got %d %s %s, want %d %s", name, i, r.Status, r.Body, r.Err, wantStatus, wantCode)
			}
		}
	}
	// Positive controls: the CA member and the narrow peer get through.
	check("ca member", raw(t, a.ns, b, member, exe, envelope("svc:bot", nil, 2)), 202, "")
	check("narrow, allowed principal and target", raw(t, a.ns, b, narrow, exe, envelope("svc:bot", nil, 2)), 202, "")
	// Handshake refusals.
	check("unknown pin", raw(t, a.ns, b, stranger, exe, envelope("svc:bot", nil, 2)), 0, "")
	check("wrong SAN", raw(t, a.ns, b, wrongSAN, exe, envelope("svc:bot", nil, 2)), 0, "")
	check("CA and pin", raw(t, a.ns, b, both, exe, envelope("svc:bot", nil, 2)), 0, "")
	check("outbound-only", raw(t, a.ns, b, outbound, exe, envelope("svc:bot", nil, 2)), 0, "")
	// Source check: every request on the connection.
	check("from outside", raw(t, a.ns, b, elsewhere, exe, envelope("svc:bot", nil, 2), envelope("svc:bot", nil, 2)), 403, "peer_rejected")
	// Policy and envelope refusals.
	eve := map[string]any{"kind": "session", "harness": "claude", "session_id": "s-2", "name": "eve"}
	check("principal not allowed", raw(t, a.ns, b, narrow, exe, envelope("svc:bot", eve, 2)), 403, "op_denied")
	check("target not allowed", raw(t, a.ns, b, narrow, exe, envelope("svc:other", nil, 2)), 403, "op_denied")
	check("no_forward", raw(t, a.ns, b, a.cert, exe, envelope("svc:bot@c", nil, 2)), 400, "no_forward")
	check("wrong v", raw(t, a.ns, b, a.cert, exe, envelope("svc:bot", nil, 1)), 400, "bad_request")
	rate := map[string]any{"kind": "session", "harness": "claude", "session_id": "s-rate", "name": "rate"}
	res := raw(t, a.ns, b, narrow, exe, envelope("svc:bot", rate, 2), envelope("svc:bot", rate, 2), envelope("svc:bot", rate, 2), envelope("svc:bot", rate, 2))
	check("within the rate", res[:3], 202, "")
	check("rate limit", res[3:], 429, "rate_limited")
	// Exactly the accepted messages (2 controls + 3 within the rate) reached the bot.
	botB := b.bot("bot")
	n := 0
	for ; n < 20; n++ {
		got := botB.poll(0)
		if got["action"] != "deliver" {
			break
		}
		botB.do(map[string]any{"op": "ack", "id": str(got["messageId"])})
	}
	if n != 5 {
		t.Errorf("bot on b received %d messages, want 5 (refused ones delivered?)", n)
	}
	if status, m, _ := b.http("GET", "/healthz", ""); status != 200 {
		t.Errorf("healthz: %d %v", status, m)
	}
}

func TestFederationCertRotation(t *testing.T) {
	a, b := fedPair(t, nil)
	send := func() (int, map[string]any) {
		status, m, _ := a.http("POST", "/v1/sessions/svc:bot@b/messages", `{"from":"r","text":"x"}`)
		return status, m
	}
	if status, m := send(); status != 202 {
		t.Fatalf("before rotation: %d %v", status, m)
	}
	old := a.cert
	// Rotate a's certificate on disk, and tell b the new pin: both daemons pick it up by
	// reload (1 s here), without a restart.
	a.setCert(fedtest.New(t, "a", nil, fedtest.Options{}))
	b.writeFile("peers.json", peersJSON(map[string]map[string]any{"a": {"address": a.addr(), "pin": a.cert.Pin, "allow": []string{"send", "reply", "list"}}}))
	pid := a.cmd.Process.Pid
	ok := false
	for i := 0; i < 100 && !ok; i++ {
		time.Sleep(100 * time.Millisecond)
		doc := fmt.Sprint(a.httpDoctor())
		ok = strings.Contains(doc, "federation certificate: "+a.cert.Pin) && strings.Contains(fmt.Sprint(b.httpDoctor()), "pin "+a.cert.Pin)
	}
	if !ok {
		t.Fatalf("rotation not picked up:\n%s\n%s", a.stderr, b.stderr)
	}
	if status, m := send(); status != 202 {
		t.Errorf("after rotation: %d %v", status, m)
	}
	if a.cmd.Process.Pid != pid || a.cmd.ProcessState != nil {
		t.Error("a restarted")
	}
	// The old certificate is refused now.
	res := raw(t, a.ns, b, old, a.exe, envelope("svc:bot", nil, 2))
	if len(res) != 1 || res[0].Err == "" {
		t.Errorf("old certificate after rotation: %+v, want a TLS failure", res)
	}
	// Invalid material is refused and the running config kept.
	a.writeFile("key.pem", old.KeyPEM)
	for i := 0; i < 100 && !strings.Contains(a.stderr.String(), "fed reload refused"); i++ {
		time.Sleep(50 * time.Millisecond)
	}
	if !strings.Contains(a.stderr.String(), "fed reload refused") {
		t.Errorf("mismatched key not refused:\n%s", a.stderr)
	}
	if strings.Contains(a.stderr.String(), "PRIVATE KEY") {
		t.Error("the log shows key material")
	}
	if status, m := send(); status != 202 {
		t.Errorf("after a refused reload: %d %v", status, m)
	}
}

func (n *fedNode) httpDoctor() any {
	_, doc, _ := n.http("GET", "/v1/doctor", "")
	return doc["lines"]
}

// TestFederationKillDuringBurst: every message b answered 202 (through a) survives a kill -9
// of b in the middle of a burst.
func TestFederationKillDuringBurst(t *testing.T) {
	a, b := fedPair(t, nil, "--fed-rate-peer", "100000")
	// The default burst goes to a service, whose durable queue holds at most 100; the long one
	// (XMSG_LONG=1) goes to a Claude session, whose message rows are what must survive.
	n, ref := 40, "svc:bot"
	var claudeID string
	if os.Getenv("XMSG_LONG") == "1" {
		claudeID = "c0000000-0000-4000-8000-0000000000b1"
		b.claude(claudeID, "burst")
		n, ref = 400, "burst"
	}
	cmd := a.asUser([]string{"XMSG_TEST_ROLE=fedburst", "SOCK=" + a.path("rt/xmsg/http.sock"), "URLPATH=/v1/sessions/" + ref + "@b/messages", "N=" + strconv.Itoa(n)}, a.exe)
	stdout, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	accepted := map[string]bool{}
	failed := 0
	sc := bufio.NewScanner(stdout)
	killed := false
	for sc.Scan() {
		var r httpResult
		json.Unmarshal(sc.Bytes(), &r)
		var m map[string]any
		json.Unmarshal(r.Body, &m)
		if r.Status == 202 {
			accepted[str(m["messageId"])] = true
		} else {
			failed++
		}
		if !killed && len(accepted) >= n/4 {
			killed = true
			b.kill()
		}
	}
	cmd.Wait()
	b.restart()
	got := map[string]bool{}
	if claudeID != "" {
		for id := range accepted {
			if status, m, _ := b.http("GET", "/v1/messages/"+id, ""); status == 200 && m["sessionId"] == claudeID {
				got[id] = true
			}
		}
	} else {
		botB := b.bot("bot")
		for i := 0; i < n+5; i++ {
			d := botB.poll(0)
			if d["action"] != "deliver" {
				break
			}
			got[str(d["messageId"])] = true
			botB.do(map[string]any{"op": "ack", "id": str(d["messageId"])})
		}
	}
	for id := range accepted {
		if !got[id] {
			t.Errorf("message %s was answered 202 but is gone after kill -9", id)
		}
	}
	t.Logf("burst of %d to %s: %d answered 202, %d failed (b killed), %d found after restart", n, ref, len(accepted), failed, len(got))
	if !killed {
		t.Error("b was never killed")
	}
}

// TestFederationStartupRefusals: the startup validation errors of docs/protocol.md §10.1, one
// clear line each.
func TestFederationStartupRefusals(t *testing.T) {
	dir := shortTemp(t)
	c := fedtest.New(t, "n", nil, fedtest.Options{})
	write := func(name string, data []byte, mode os.FileMode) string {
		p := filepath.Join(dir, name)
		os.WriteFile(p, data, mode)
		os.Chmod(p, mode)
		return p
	}
	cert, key := write("cert.pem", c.CertPEM, 0o600), write("key.pem", c.KeyPEM, 0o600)
	good := write("peers.json", []byte(`{"b": {"address": "192.0.2.2:7443", "pin": "`+c.Pin+`", "allow": ["send"]}}`), 0o600)
	bad := write("bad.json", []byte(`{"b": {"address": "192.0.2.2:7443", "pin": "`+c.Pin+`", "colour": 1}}`), 0o600)
	empty := write("empty.pem", []byte("no certificate here\n"), 0o600)
	open := write("open.pem", c.CertPEM, 0o644)
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"--fed-listen", "0.0.0.0:7443", "--peers-file", good, "--fed-cert", cert, "--fed-key", key}, "unspecified address"},
		{[]string{"--fed-listen", "[::]:7443", "--peers-file", good, "--fed-cert", cert, "--fed-key", key}, "unspecified address"},
		{[]string{"--fed-listen", "localhost:7443", "--peers-file", good, "--fed-cert", cert, "--fed-key", key}, "want IP:PORT"},
		{[]string{"--fed-listen", "127.0.0.1:7443", "--fed-cert", cert, "--fed-key", key}, "needs a peers file"},
		{[]string{"--peers-file", good}, "needs both fed-cert and fed-key"},
		{[]string{"--peers-file", good, "--fed-cert", cert}, "needs both fed-cert and fed-key"},
		{[]string{"--peers-file", bad, "--fed-cert", cert, "--fed-key", key}, `peer "b": field "colour": unknown field`},
		{[]string{"--peers-file", good, "--fed-cert", empty, "--fed-key", key}, "fed-cert/fed-key"},
		{[]string{"--peers-file", good, "--fed-cert", open, "--fed-key", key}, "accessible by group or others"},
		{[]string{"--peers-file", good, "--fed-cert", filepath.Join(dir, "missing.pem"), "--fed-key", key}, "fed-cert: open"},
	} {
		args := append([]string{"serve", "--db-path", filepath.Join(dir, "x.db")}, tt.args...)
		out, err := xmsgCmd([]string{"XDG_RUNTIME_DIR=" + dir}, args...).CombinedOutput()
		if err == nil || !strings.Contains(string(out), tt.want) || strings.Contains(string(out), "PRIVATE KEY") {
			t.Errorf("serve %v: %v\n%s\nwant a refusal naming %q", tt.args, err, out, tt.want)
		}
	}
}

// TestFederationSandboxPorts: under Landlock the daemon can connect only to the peer ports it
// started with. A peer added by a reload on another port is unreachable although a TLS server
// answers there (a connect that got through would fail the pin check instead: peer_rejected),
// while the original peer still works (positive control).
func TestFederationSandboxPorts(t *testing.T) {
	a, b := fedPair(t, nil)
	// A TLS server in b's namespace on a port the sandbox of a does not allow.
	dir := t.TempDir()
	c := fedtest.New(t, "other", nil, fedtest.Options{})
	os.WriteFile(filepath.Join(dir, "c.pem"), c.CertPEM, 0o600)
	os.WriteFile(filepath.Join(dir, "k.pem"), c.KeyPEM, 0o600)
	echo := exec.Command("ip", "netns", "exec", b.ns, a.exe)
	echo.Env = append(os.Environ(), "XMSG_TEST_ROLE=tlsecho", "CERT="+filepath.Join(dir, "c.pem"), "KEY="+filepath.Join(dir, "k.pem"), "ADDR=192.0.2.2:7444")
	out, _ := echo.StdoutPipe()
	if err := echo.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { echo.Process.Kill(); echo.Wait() })
	bufio.NewReader(out).ReadString('\n')
	a.writeFile("peers.json", peersJSON(map[string]map[string]any{
		"b": {"address": b.addr(), "pin": b.cert.Pin, "allow": []string{"send", "reply", "list"}},
		// A pin the server on 7444 does not have: a connect that got through would be refused
		// at the handshake (peer_rejected), not be unreachable.
		"b2": {"address": "192.0.2.2:7444", "pin": fedtest.New(t, "b2", nil, fedtest.Options{}).Pin, "allow": []string{"send"}}}))
	for i := 0; i < 100 && !strings.Contains(a.stderr.String(), "the sandbox did not allow"); i++ {
		time.Sleep(50 * time.Millisecond)
	}
	if !strings.Contains(a.stderr.String(), "the sandbox did not allow at start") {
		t.Fatalf("no reload warning about the new port:\n%s", a.stderr)
	}
	if status, m, _ := a.http("POST", "/v1/sessions/svc:bot@b2/messages", `{"from":"x","text":"t"}`); status != 503 || m["error"] != "peer_unreachable" {
		t.Errorf("peer on a port outside the sandbox: %d %v, want 503 peer_unreachable", status, m)
	}
	if status, m, _ := a.http("POST", "/v1/sessions/svc:bot@b/messages", `{"from":"x","text":"t"}`); status != 202 {
		t.Errorf("peer on the allowed port: %d %v", status, m)
	}
}
