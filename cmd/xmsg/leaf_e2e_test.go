//go:build linux

package main

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/xmsg/xmsg/internal/daemontest"
	"github.com/xmsg/xmsg/internal/fed/fedtest"
	"github.com/xmsg/xmsg/internal/ostest"
	"github.com/xmsg/xmsg/internal/store"
)

// Leaf nodes end to end (issue 13): a hub daemon and a leaf daemon, each the real binary as
// its own OS user in its own network namespace, joined by a veth pair (192.0.2.1 hub,
// 192.0.2.2 leaf), with real mTLS. Helper processes (ostest roles "leafcli" and "leafline")
// are the sessions and services around them.

var leafRoles = ostest.Roles{
	"leafcli":  func() int { leafRoleCLI(); return 0 },
	"leafline": func() int { leafRoleLine(); return 0 },
}

// leafRoleCLI answers HTTP requests read from stdin ({"method","path","body"} lines), one
// {"status","body"} or {"err"} line each, on $SOCK (a Unix socket) or $TCP (host:port).
func leafRoleCLI() {
	c := &http.Client{Timeout: 90 * time.Second}
	base := "http://" + os.Getenv("TCP")
	if sock := os.Getenv("SOCK"); sock != "" {
		base = "http://localhost"
		c.Transport = &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", sock)
		}}
	}
	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 1<<20), 1<<20)
	enc := json.NewEncoder(os.Stdout)
	for in.Scan() {
		var req struct{ Method, Path, Body string }
		json.Unmarshal(in.Bytes(), &req)
		hr, _ := http.NewRequest(req.Method, base+req.Path, strings.NewReader(req.Body))
		if req.Body != "" {
			hr.Header.Set("Content-Type", "application/json")
		}
		resp, err := c.Do(hr)
		if err != nil {
			enc.Encode(map[string]string{"err": err.Error()})
			continue
		}
		raw, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if !json.Valid(raw) {
			raw, _ = json.Marshal(string(raw))
		}
		enc.Encode(map[string]any{"status": resp.StatusCode, "body": json.RawMessage(raw)})
	}
}

// leafRoleLine connects to $SOCK (a register socket), sends $FIRST and prints the answer;
// then relays each stdin line on that connection and prints one answer line. A line
// "agent {...}" goes instead on a fresh $AGENT_SOCK connection from this same process, so
// it is attested as the session this process registered. A dead connection prints
// {"err"} and ends the process.
func leafRoleLine() {
	c, err := net.Dial("unix", os.Getenv("SOCK"))
	if err != nil {
		fmt.Printf("{\"err\":%q}\n", err.Error())
		return
	}
	r := bufio.NewReaderSize(c, 1<<20)
	trip := func(conn net.Conn, rd *bufio.Reader, line string) (string, bool) {
		if _, err := conn.Write([]byte(line + "\n")); err != nil {
			return fmt.Sprintf("{\"err\":%q}", err.Error()), false
		}
		resp, err := rd.ReadString('\n')
		if err != nil {
			return fmt.Sprintf("{\"err\":%q}", err.Error()), false
		}
		return strings.TrimSpace(resp), true
	}
	out, ok := trip(c, r, os.Getenv("FIRST"))
	fmt.Println(out)
	if !ok {
		return
	}
	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 1<<20), 1<<20)
	for in.Scan() {
		line := in.Text()
		if rest, isAgent := strings.CutPrefix(line, "agent "); isAgent {
			a, err := net.Dial("unix", os.Getenv("AGENT_SOCK"))
			if err != nil {
				fmt.Printf("{\"err\":%q}\n", err.Error())
				continue
			}
			out, _ := trip(a, bufio.NewReader(a), rest)
			a.Close()
			fmt.Println(out)
			continue
		}
		out, ok := trip(c, r, line)
		fmt.Println(out)
		if !ok {
			return
		}
	}
}

// dialIn connects to addr from inside network namespace ns: the thread enters ns for the
// connect only (a connected socket keeps working from anywhere).
func dialIn(ns, addr string) (net.Conn, error) {
	type res struct {
		c   net.Conn
		err error
	}
	ch := make(chan res, 1)
	go func() {
		runtime.LockOSThread()
		self, err := os.Open("/proc/thread-self/ns/net")
		if err != nil {
			ch <- res{nil, err}
			return
		}
		defer self.Close()
		target, err := os.Open("/run/netns/" + ns)
		if err != nil {
			ch <- res{nil, err}
			return
		}
		defer target.Close()
		if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
			ch <- res{nil, err}
			return
		}
		c, err := net.DialTimeout("tcp", addr, 5*time.Second)
		if unix.Setns(int(self.Fd()), unix.CLONE_NEWNET) == nil {
			runtime.UnlockOSThread() // back home; otherwise the thread dies with the goroutine
		}
		ch <- res{c, err}
	}()
	r := <-ch
	return r.c, r.err
}

// lnode is one daemon of the test: its user, namespace, directory and process.
type lnode struct {
	t        *testing.T
	name     string
	user     ostest.User
	ns       string
	dir      string
	exe      string
	args     []string
	cert     *fedtest.Cert
	cmd      *exec.Cmd
	stderr   *daemontest.LogBuffer
	extraEnv []string
	past     strings.Builder // the logs of the runs before this one (restarts)
}

// userCmd runs exe as u, inside network namespace ns when it is set (nsenter and setpriv
// both exec, so the pid is exe's).
func userCmd(u ostest.User, ns, exe string, env []string, args ...string) *exec.Cmd {
	var cmd *exec.Cmd
	if ns != "" {
		cmd = exec.Command("nsenter", append([]string{"--net=/run/netns/" + ns, "--", "setpriv",
			"--reuid=" + strconv.Itoa(int(u.UID)), "--regid=" + strconv.Itoa(int(u.GID)), "--clear-groups", "--", exe}, args...)...)
	} else {
		cmd = exec.Command(exe, args...)
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: u.UID, Gid: u.GID, Groups: []uint32{}}}
	}
	cmd.Env = append([]string{"PATH=/usr/bin:/bin:/usr/sbin:/sbin"}, env...)
	return cmd
}

func newLnode(t *testing.T, name, ns, exe string) *lnode {
	t.Helper()
	u := ostest.AddUser(t)
	dir, err := os.MkdirTemp("", "xl")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	nd := &lnode{t: t, name: name, user: u, ns: ns, dir: dir, exe: exe, cert: fedtest.New(t, name, nil, fedtest.Options{})}
	for _, d := range []string{"", "rt", "state", "sessions"} {
		p := filepath.Join(dir, d)
		os.Mkdir(p, 0o700)
		os.Chmod(p, 0o700)
		os.Chown(p, int(u.UID), int(u.GID))
	}
	nd.file("cert.pem", nd.cert.CertPEM)
	nd.file("key.pem", nd.cert.KeyPEM)
	return nd
}

func (nd *lnode) path(name string) string { return filepath.Join(nd.dir, name) }

func (nd *lnode) file(name string, data []byte) {
	nd.t.Helper()
	p := nd.path(name)
	if err := os.WriteFile(p, data, 0o600); err != nil {
		nd.t.Fatal(err)
	}
	os.Chown(p, int(nd.user.UID), int(nd.user.GID))
}

func (nd *lnode) env() []string {
	return append([]string{ostest.Role("xmsg"), "HOME=" + nd.dir, "XDG_RUNTIME_DIR=" + nd.path("rt")}, nd.extraEnv...)
}

func (nd *lnode) start() {
	nd.t.Helper()
	if nd.stderr != nil {
		nd.past.WriteString(nd.stderr.String())
	}
	nd.stderr = &daemontest.LogBuffer{}
	nd.cmd = userCmd(nd.user, nd.ns, nd.exe, nd.env(), nd.args...)
	nd.cmd.Stderr = nd.stderr
	if err := nd.cmd.Start(); err != nil {
		nd.t.Fatal(err)
	}
	for i := 0; i < 1000; i++ {
		if strings.Contains(nd.stderr.String(), "msg=serving") {
			return
		}
		if nd.cmd.ProcessState != nil {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	nd.t.Fatalf("%s did not start: %s", nd.name, nd.stderr)
}

// kill is kill -9.
func (nd *lnode) kill() {
	nd.cmd.Process.Kill()
	nd.cmd.Wait()
}

func (nd *lnode) stop() {
	if nd.cmd == nil || nd.cmd.ProcessState != nil {
		return
	}
	nd.cmd.Process.Signal(syscall.SIGTERM)
	nd.cmd.Wait()
}

// lhelper is a running helper process speaking JSON lines.
type lhelper struct {
	t     *testing.T
	name  string
	cmd   *exec.Cmd
	in    io.WriteCloser
	out   *bufio.Reader
	lines chan string
	first string
}

func startHelper(t *testing.T, name string, cmd *exec.Cmd, expectFirst bool) *lhelper {
	t.Helper()
	h := &lhelper{t: t, name: name, cmd: cmd, lines: make(chan string, 16)}
	h.in, _ = cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		r := bufio.NewReaderSize(stdout, 1<<20)
		for {
			l, err := r.ReadString('\n')
			if err != nil {
				close(h.lines)
				return
			}
			h.lines <- strings.TrimSpace(l)
		}
	}()
	t.Cleanup(h.close)
	if expectFirst {
		h.first = h.next()
	}
	return h
}

func (h *lhelper) close() {
	h.in.Close()
	h.cmd.Process.Kill()
	h.cmd.Wait()
}

// next returns the helper's next line; the bound only guards against a hang.
func (h *lhelper) next() string {
	h.t.Helper()
	select {
	case l, ok := <-h.lines:
		if !ok {
			return `{"err":"helper exited"}`
		}
		return l
	case <-time.After(120 * time.Second):
		h.t.Fatalf("%s: no answer", h.name)
		return ""
	}
}

func (h *lhelper) call(line string) map[string]any {
	h.t.Helper()
	fmt.Fprintln(h.in, line)
	var v map[string]any
	l := h.next()
	if err := json.Unmarshal([]byte(l), &v); err != nil {
		h.t.Fatalf("%s: not JSON: %q", h.name, l)
	}
	return v
}

func jsonLine(v any) string {
	raw, _ := json.Marshal(v)
	return string(raw)
}

// http performs one request through a cli helper; it returns the status (0 on a transport
// error) and the decoded body.
func (h *lhelper) http(method, path, body string) (int, map[string]any) {
	h.t.Helper()
	v := h.call(jsonLine(map[string]string{"method": method, "path": path, "body": body}))
	if _, failed := v["err"]; failed {
		return 0, v
	}
	status, _ := v["status"].(float64)
	m, _ := v["body"].(map[string]any)
	if m == nil {
		m = map[string]any{"raw": v["body"]}
	}
	return int(status), m
}

func jstr(v any, keys ...string) string {
	for _, k := range keys {
		m, _ := v.(map[string]any)
		v = m[k]
	}
	s, _ := v.(string)
	return s
}

// procSockets lists pid's listening sockets from /proc: Unix socket paths and TCP
// addresses, and counts its UDP sockets (the views of /proc/<pid>/net are its namespace's).
func procSockets(t *testing.T, pid int) (unixPaths, tcp []string, udp int) {
	t.Helper()
	inodes := map[string]bool{}
	fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, fd := range fds {
		link, _ := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", pid, fd.Name()))
		if ino, ok := strings.CutPrefix(link, "socket:["); ok {
			inodes[strings.TrimSuffix(ino, "]")] = true
		}
	}
	read := func(name string) [][]string {
		raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/net/%s", pid, name))
		if err != nil {
			t.Fatal(err)
		}
		var rows [][]string
		for _, l := range strings.Split(string(raw), "\n")[1:] {
			if f := strings.Fields(l); len(f) > 0 {
				rows = append(rows, f)
			}
		}
		return rows
	}
	for _, f := range read("unix") {
		// Num RefCount Protocol Flags Type St Inode [Path]; __SO_ACCEPTCON (0x10000) = listening.
		flags, _ := strconv.ParseUint(f[3], 16, 32)
		if len(f) >= 7 && inodes[f[6]] && flags&0x10000 != 0 {
			p := ""
			if len(f) > 7 {
				p = f[7]
			}
			unixPaths = append(unixPaths, p)
		}
	}
	for _, name := range []string{"tcp", "tcp6"} {
		for _, f := range read(name) {
			// sl local rem st ... inode(9); st 0A = LISTEN
			if len(f) > 9 && inodes[f[9]] && f[3] == "0A" {
				tcp = append(tcp, hexAddr(f[1]))
			}
		}
	}
	for _, name := range []string{"udp", "udp6", "raw", "raw6"} {
		for _, f := range read(name) {
			if len(f) > 9 && inodes[f[9]] {
				udp++
			}
		}
	}
	return unixPaths, tcp, udp
}

// hexAddr renders /proc/net/tcp's "0100007F:1E6B" as 127.0.0.1:7787 (IPv4 only; IPv6 as is).
func hexAddr(s string) string {
	h, p, _ := strings.Cut(s, ":")
	port, _ := strconv.ParseUint(p, 16, 16)
	if len(h) != 8 {
		return s
	}
	b, _ := hex.DecodeString(h)
	return fmt.Sprintf("%d.%d.%d.%d:%d", b[3], b[2], b[1], b[0], port)
}

// fedClient is a TLS client with cert that dials the hub's federation listener from the leaf
// namespace, for requests a daemon would never make.
func fedClient(ns string, cert *fedtest.Cert) *http.Client {
	pair, _ := tls.X509KeyPair(cert.CertPEM, cert.KeyPEM)
	return &http.Client{Timeout: 15 * time.Second, Transport: &http.Transport{
		DialContext:     func(ctx context.Context, _, addr string) (net.Conn, error) { return dialIn(ns, addr) },
		TLSClientConfig: &tls.Config{Certificates: []tls.Certificate{pair}, InsecureSkipVerify: true, MinVersion: tls.VersionTLS13}}}
}

func fedDo(t *testing.T, c *http.Client, method, path string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest(method, "https://192.0.2.1:7443"+path, strings.NewReader("{}"))
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, strings.TrimSpace(string(raw))
}

// leafSetup is the whole cast: namespaces, hub, leaf, and the helpers around them.
type leafSetup struct {
	t               *testing.T
	net             netPair // a: the hub (192.0.2.1), b: the leaf (192.0.2.2); from fed_e2e_test.go
	exe             string
	hub, leaf       *lnode
	leaf2, plain    *fedtest.Cert
	hubCLI, leafCLI *lhelper
	bot             *lhelper
	regSock         string
	leafCreds       string // the leaf's $CREDENTIALS_DIRECTORY
}

// leafSecretVolume lays out files as the kubelet delivers a Secret volume with fsGroup:
// names linked to ..data/<name>, ..data linked to a timestamped directory, files root-owned,
// group the node's gid, mode 0440.
func leafSecretVolume(t *testing.T, nd *lnode, files map[string][]byte) string {
	t.Helper()
	dir := nd.path("secret")
	const ts = "..2026_12_01_10_00_00.123456789"
	if err := os.MkdirAll(filepath.Join(dir, ts), 0o755); err != nil {
		t.Fatal(err)
	}
	os.Chmod(dir, 0o755)
	for name, data := range files {
		p := filepath.Join(dir, ts, name)
		if err := os.WriteFile(p, data, 0o440); err != nil {
			t.Fatal(err)
		}
		os.Chmod(p, 0o440)
		os.Chown(p, 0, int(nd.user.GID))
		if err := os.Symlink("..data/"+name, filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink(ts, filepath.Join(dir, "..data")); err != nil {
		t.Fatal(err)
	}
	return dir
}

func newLeafSetup(t *testing.T) *leafSetup {
	ostest.RequireRoot(t)
	for _, tool := range []string{"ip", "nsenter", "setpriv", "useradd"} {
		ostest.RequireTool(t, tool)
	}
	s := &leafSetup{t: t, net: newNetPair(t)}
	_, s.exe = ostest.WorldExe(t, "xmsg-leaf-test")
	s.hub = newLnode(t, "hub", s.net.a, s.exe)
	s.leaf = newLnode(t, "leaf1", s.net.b, s.exe)
	s.leaf2 = fedtest.New(t, "leaf2", nil, fedtest.Options{})
	s.plain = fedtest.New(t, "plain", nil, fedtest.Options{})
	s.hub.file("peers.json", []byte(fmt.Sprintf(`{
		"leaf1": {"address": "192.0.2.2:1", "pin": %q, "leaf": true, "allow": ["send", "reply"], "from": ["192.0.2.2/32"]},
		"leaf2": {"address": "192.0.2.3:1", "pin": %q, "leaf": true, "allow": ["send", "reply"]},
		"plain": {"address": "192.0.2.4:1", "pin": %q, "allow": ["send"]}}`, s.leaf.cert.Pin, s.leaf2.Pin, s.plain.Pin)))
	// The leaf's credentials come as a pod gets them: a Secret volume in the kubelet's layout
	// (root-owned, group = the leaf's gid as fsGroup, 0440), named by $CREDENTIALS_DIRECTORY.
	s.leafCreds = leafSecretVolume(t, s.leaf, map[string][]byte{"fed-cert": s.leaf.cert.CertPEM, "fed-key": s.leaf.cert.KeyPEM,
		"peers": []byte(fmt.Sprintf(`{"hub": {"address": "192.0.2.1:7443", "pin": %q}}`, s.hub.cert.Pin))})
	fedArgs := func(nd *lnode) []string {
		return []string{"--db-path", nd.path("state/xmsg.db"), "--peers-file", nd.path("peers.json"), "--fed-cert", nd.path("cert.pem"),
			"--fed-key", nd.path("key.pem"), "--fed-reload-interval-secs", "0", "--host-label", nd.name}
	}
	s.hub.args = append([]string{"serve", "--sessions-dir", s.hub.path("sessions"), "--fed-listen", "192.0.2.1:7443",
		"--fed-rate-peer", "100000", "--fed-rate-principal", "100000"}, fedArgs(s.hub)...)
	s.regSock = s.leaf.path("rt/xmsg/register.sock")
	s.leaf.args = []string{"serve", "--leaf", "--leaf-principal", "svc:bot", "--listen", "127.0.0.1:7787",
		"--db-path", s.leaf.path("state/xmsg.db"), "--fed-reload-interval-secs", "0", "--host-label", s.leaf.name}
	s.leaf.extraEnv = []string{"CREDENTIALS_DIRECTORY=" + s.leafCreds}
	s.hub.start()
	t.Cleanup(s.hub.stop)
	s.leaf.start()
	t.Cleanup(s.leaf.stop)
	s.hubCLI = startHelper(t, "hub cli", userCmd(s.hub.user, "", s.exe, []string{ostest.Role("leafcli"), "SOCK=" + s.hub.path("rt/xmsg/http.sock")}), false)
	s.leafCLI = startHelper(t, "leaf cli", userCmd(s.leaf.user, s.net.b, s.exe, []string{ostest.Role("leafcli"), "TCP=127.0.0.1:7787"}), false)
	s.startBot()
	return s
}

// startBot (re)starts the leaf's service, svc:bot, on the leaf register socket.
func (s *leafSetup) startBot() {
	s.t.Helper()
	if s.bot != nil {
		s.bot.close()
	}
	s.bot = startHelper(s.t, "bot", userCmd(s.leaf.user, "", s.exe, []string{ostest.Role("leafline"), "SOCK=" + s.regSock,
		`FIRST={"harness":"svc","name":"bot"}`}), true)
	if !strings.Contains(s.bot.first, `"sessionId":"svc:bot"`) {
		s.t.Fatalf("bot registration: %s\nleaf: %s", s.bot.first, s.leaf.stderr)
	}
}

// hubSend sends text to the leaf's service from an anonymous hub sender; it returns the
// message id of the hub's 202 (the acknowledgement), or "" when the hub did not answer.
func (s *leafSetup) hubSend(text string) string {
	s.t.Helper()
	var status int
	var body map[string]any
	// A kept-alive connection to a hub killed since fails before anything is sent: retry.
	for i := 0; i < 3 && status == 0; i++ {
		status, body = s.hubCLI.http("POST", "/v1/sessions/svc:bot@leaf1/messages", jsonLine(map[string]string{"from": "faults", "text": text}))
	}
	if status != 202 {
		return ""
	}
	if body["outcome"] != "queued" {
		s.t.Errorf("send to a leaf: outcome %v, want queued", body["outcome"])
	}
	return body["messageId"].(string)
}

func (s *leafSetup) hubOutcome(id string) string {
	s.t.Helper()
	_, body := s.hubCLI.http("GET", "/v1/messages/"+id, "")
	o, _ := body["outcome"].(string)
	return o
}

// botPoll polls the bot's queue; it returns the delivered message id, "" on timeout.
func (s *leafSetup) botPoll(wait int) (string, map[string]any) {
	s.t.Helper()
	v := s.bot.call(fmt.Sprintf(`{"action":"poll","waitSecs":%d}`, wait))
	if v["action"] == "deliver" {
		return v["messageId"].(string), v
	}
	if v["action"] != "timeout" {
		s.t.Fatalf("bot poll: %v\nleaf: %s", v, s.leaf.stderr)
	}
	return "", v
}

func (s *leafSetup) botAck(id string) {
	s.t.Helper()
	if v := s.bot.call(jsonLine(map[string]string{"action": "ack", "messageId": id})); v["status"] != "ok" {
		s.t.Fatalf("bot ack: %v", v)
	}
}

func TestLeafNode(t *testing.T) {
	s := newLeafSetup(t)

	t.Run("listeners", func(t *testing.T) {
		unixPaths, tcp, udp := procSockets(t, s.leaf.cmd.Process.Pid)
		httpSock := s.leaf.path("rt/xmsg/http.sock")
		slices.Sort(unixPaths)
		if want := []string{httpSock, s.regSock}; !slices.Equal(unixPaths, want) {
			t.Errorf("leaf listening Unix sockets = %q, want only %q (the HTTP API and the register socket)", unixPaths, want)
		}
		if len(tcp) != 1 || tcp[0] != "127.0.0.1:7787" {
			t.Errorf("leaf listening TCP sockets = %q, want only 127.0.0.1:7787", tcp)
		}
		if udp != 0 {
			t.Errorf("leaf holds %d UDP/raw sockets", udp)
		}
		if _, err := os.Lstat(s.leaf.path("rt/xmsg/agent.sock")); err == nil {
			t.Errorf("leaf created agent.sock")
		}
		// Positive control: the same check sees the hub's five listeners (its three sockets,
		// the reply socket of Claude Code's reports, the federation listener).
		hu, ht, _ := procSockets(t, s.hub.cmd.Process.Pid)
		if len(hu) != 4 || len(ht) != 1 {
			t.Errorf("hub listeners: unix %q tcp %q, want 4 and 1", hu, ht)
		}
	})

	// `xmsg monitor` on the leaf, run as the leaf's user on its http.sock, sees a row the
	// hub sent as the leaf's pull loop takes it (pulled, over the leaf transport, from the
	// hub) and its service's ack, in that message's order of events.
	t.Run("monitor", func(t *testing.T) {
		httpSock := s.leaf.path("rt/xmsg/http.sock")
		mon := userCmd(s.leaf.user, "", s.exe, []string{ostest.Role("xmsg"), "HOME=" + s.leaf.dir}, "monitor", "--http-sock", httpSock, "--json", "--event", "pulled,acked")
		out, err := mon.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		var monErr strings.Builder
		mon.Stderr = &monErr
		if err := mon.Start(); err != nil {
			t.Fatal(err)
		}
		defer func() { mon.Process.Kill(); mon.Wait() }()
		events := make(chan map[string]any, 64)
		go func() {
			defer close(events)
			sc := bufio.NewScanner(out)
			for sc.Scan() {
				var e map[string]any
				if json.Unmarshal(sc.Bytes(), &e) == nil {
					events <- e
				}
			}
		}()
		// The watch is attached before its own audit line is written.
		daemontest.WaitFor(t, "the leaf's audit line of the monitor", func() bool {
			return strings.Contains(s.leaf.stderr.String(), "request=events")
		})
		id := s.hubSend("seen by the leaf's monitor")
		if id == "" {
			t.Fatal("the hub did not take the send")
		}
		got, _ := s.botPoll(10)
		if got != id {
			t.Fatalf("bot got %q, want %s", got, id)
		}
		s.botAck(id)
		var seen []string
		for len(seen) < 2 {
			select {
			case e, ok := <-events:
				if !ok {
					t.Fatalf("the monitor ended after %v: %s", seen, monErr.String())
				}
				if e["message_id"] != id {
					continue
				}
				seen = append(seen, fmt.Sprint(e["event"]))
				if e["event"] == "pulled" && (e["transport"] != "leaf" || e["from"] != "fed:hub" || e["peer"] != "hub") {
					t.Errorf("pulled event %v: want over leaf from fed:hub", e)
				}
			case <-time.After(20 * time.Second):
				t.Fatalf("the leaf's monitor saw %v of message %s; want pulled and acked\n%s", seen, id, monErr.String())
			}
		}
		if !slices.Contains(seen, "pulled") || !slices.Contains(seen, "acked") {
			t.Errorf("the leaf's monitor saw %v of message %s; want pulled and acked", seen, id)
		}
	})

	// The leaf's HTTP API on its http.sock: served to the leaf's uid (`xmsg health`, the pod's
	// probe), behind the peer gate for any other (root here: not one byte).
	t.Run("http.sock", func(t *testing.T) {
		httpSock := s.leaf.path("rt/xmsg/http.sock")
		out, err := userCmd(s.leaf.user, "", s.exe, []string{ostest.Role("xmsg"), "HOME=" + s.leaf.dir}, "health", "--http-sock", httpSock).CombinedOutput()
		if err != nil || !strings.Contains(string(out), `"status":"ok"`) {
			t.Errorf("xmsg health on the leaf's http.sock as its uid: %v\n%s", err, out)
		}
		c, err := net.Dial("unix", httpSock)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		c.Write([]byte("GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"))
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		if n, _ := c.Read(make([]byte, 64)); n != 0 {
			t.Errorf("another uid read %d bytes from the leaf's http.sock; want 0 (the peer gate)", n)
		}
	})

	t.Run("fallbacks reported", func(t *testing.T) {
		status, body := s.leafCLI.http("GET", "/v1/doctor", "")
		lines := fmt.Sprint(body["lines"])
		for _, want := range []string{"leaf: principal svc:bot", "socket activation: not used in leaf mode", "sd_notify: no", "landlock:", "leaf: pulling from hub hub", "systemd hardening: none",
			"credentials: LoadCredential= ($CREDENTIALS_DIRECTORY)"} {
			if status != 200 || !strings.Contains(lines, want) {
				t.Errorf("leaf doctor lacks %q: %d %s", want, status, lines)
			}
		}
		for _, want := range []string{"status=\"leaf: principal svc:bot", "status=\"sd_notify: no", "landlock: abi="} {
			if !strings.Contains(s.leaf.stderr.String(), want) {
				t.Errorf("leaf startup lines lack %q", want)
			}
		}
		// `xmsg doctor --url` reaches the leaf's TCP listener.
		out, err := userCmd(s.leaf.user, s.net.b, s.exe, s.leaf.env(), "doctor", "--url", "http://127.0.0.1:7787").CombinedOutput()
		if err != nil || !strings.Contains(string(out), "leaf: principal svc:bot") {
			t.Errorf("xmsg doctor --url: %v\n%s", err, out)
		}
	})

	t.Run("registration", func(t *testing.T) {
		other := startHelper(t, "other", userCmd(s.leaf.user, "", s.exe, []string{ostest.Role("leafline"), "SOCK=" + s.regSock,
			`FIRST={"harness":"svc","name":"other"}`}), true)
		if !strings.Contains(other.first, "does not match leaf principal") {
			t.Errorf("other service on the leaf: %s", other.first)
		}
		pi := startHelper(t, "pi", userCmd(s.leaf.user, "", s.exe, []string{ostest.Role("leafline"), "SOCK=" + s.regSock,
			`FIRST={"harness":"pi","sessionName":"x"}`}), true)
		if !strings.Contains(pi.first, `"status":"error"`) {
			t.Errorf("pi session on the leaf: %s", pi.first)
		}
	})

	t.Run("round trips", func(t *testing.T) {
		// A hub session (pi, attested on agent.sock) sends to the leaf's service.
		pi := startHelper(t, "hub pi", userCmd(s.hub.user, "", s.exe, []string{ostest.Role("leafline"), "SOCK=" + s.hub.path("rt/xmsg/register.sock"),
			"AGENT_SOCK=" + s.hub.path("rt/xmsg/agent.sock"), `FIRST={"harness":"pi","sessionName":"asker"}`}), true)
		var reg map[string]any
		json.Unmarshal([]byte(pi.first), &reg)
		piID, _ := reg["sessionId"].(string)
		if piID == "" {
			t.Fatalf("hub pi registration: %s", pi.first)
		}
		v := pi.call("agent " + jsonLine(map[string]any{"action": "send", "ref": "svc:bot@leaf1", "text": "hello leaf", "push_replies": true}))
		id := jstr(v, "delivery", "messageId")
		if v["status"] != "ok" || jstr(v, "delivery", "outcome") != "queued" {
			t.Fatalf("hub pi send: %v", v)
		}
		got, d := s.botPoll(30)
		if got != id || d["text"] != "hello leaf" || jstr(d, "origin", "kind") != "fed" || jstr(d, "origin", "host") != "hub" || !strings.HasPrefix(jstr(d, "origin", "principal"), "pi:") {
			t.Fatalf("bot got %v, want %s from the hub's pi session", d, id)
		}
		if r := s.bot.call(jsonLine(map[string]string{"action": "reply", "messageId": id, "text": "hello hub"})); r["status"] != "ok" {
			t.Fatalf("bot reply: %v", r)
		}
		s.botAck(id)
		p := pi.call(`{"action":"poll","waitSecs":30}`)
		if p["action"] != "deliver" || !strings.Contains(fmt.Sprint(p["text"]), "hello hub") || !strings.Contains(fmt.Sprint(p["envelope"]), "reply to message_id="+id) {
			t.Fatalf("hub pi got %v, want the bot's reply", p)
		}
		pi.call(jsonLine(map[string]string{"action": "ack", "messageId": p["messageId"].(string)}))

		// A leaf-side send (its HTTP listener) reaches the hub session, attributed to the
		// leaf principal whatever `from` says; the reply is not pushed, the leaf pulls it.
		status, body := s.leafCLI.http("POST", "/v1/sessions/"+piID+"@hub/messages", `{"from":"mallory","text":"from the leaf"}`)
		if status != 202 || body["fromName"] != "xmsg@leaf1 · svc:bot" {
			t.Fatalf("leaf send: %d %v", status, body)
		}
		lid := body["messageId"].(string)
		// Idempotency is scoped to the leaf principal, not to `from`.
		_, k1 := s.leafCLI.http("POST", "/v1/sessions/"+piID+"@hub/messages", `{"from":"a","text":"once","idempotency_key":"k1"}`)
		_, k2 := s.leafCLI.http("POST", "/v1/sessions/"+piID+"@hub/messages", `{"from":"b","text":"once","idempotency_key":"k1"}`)
		if k1["messageId"] == nil || k1["messageId"] != k2["messageId"] {
			t.Errorf("idempotent leaf sends from two `from`s: %v and %v, want one message", k1, k2)
		}
		p = pi.call(`{"action":"poll","waitSecs":30}`)
		if p["action"] != "deliver" || p["messageId"] != lid || p["fromName"] != "xmsg@leaf1 · svc:bot" {
			t.Fatalf("hub pi got %v, want the leaf's message", p)
		}
		pi.call(jsonLine(map[string]string{"action": "ack", "messageId": lid}))
		if q := pi.call(`{"action":"poll","waitSecs":30}`); q["messageId"] != k1["messageId"] {
			t.Errorf("hub pi got %v, want the idempotent send once", q)
		} else {
			pi.call(jsonLine(map[string]string{"action": "ack", "messageId": q["messageId"].(string)}))
		}
		if q := pi.call(`{"action":"poll","waitSecs":0}`); q["action"] != "timeout" {
			t.Errorf("hub pi got %v, want nothing more", q)
		}
		r := pi.call("agent " + jsonLine(map[string]string{"action": "reply", "messageId": lid, "text": "answer for the leaf"}))
		if jstr(r, "reply", "pushOutcome") != "disabled" {
			t.Errorf("reply to a leaf-originated message: %v, want pushOutcome disabled", r)
		}
		status, body = s.leafCLI.http("GET", "/v1/messages/"+lid+"/replies?wait=10", "")
		if status != 200 || !strings.Contains(fmt.Sprint(body["raw"]), "answer for the leaf") {
			t.Errorf("leaf reply poll: %d %v", status, body)
		}
	})

	// The hub's metrics count a leaf's mail until its service acks it: the gauge is read from
	// the counts the hub's commits keep (store.MailboxLens), so it must follow the rows.
	t.Run("mailbox depth", func(t *testing.T) {
		depth := func() string {
			_, body := s.hubCLI.http("GET", "/metrics", "")
			for _, line := range strings.Split(fmt.Sprint(body["raw"]), "\n") {
				if v, ok := strings.CutPrefix(line, `xmsg_leaf_mailbox_depth{peer="leaf1"} `); ok {
					return v
				}
			}
			return "none"
		}
		// The round trips' last ack reaches the hub with the leaf's next acks (within the
		// records' ride).
		daemontest.WaitFor(t, "the depth at 0 before the sends", func() bool { return depth() == "0" })
		ids := []string{s.hubSend("depth 1"), s.hubSend("depth 2")}
		if d := depth(); d != "2" {
			t.Fatalf("depth with two messages the bot has not taken: %s, want 2", d)
		}
		for range ids {
			id, _ := s.botPoll(30)
			if id == "" {
				t.Fatalf("the bot got nothing\nleaf: %s", s.leaf.stderr)
			}
			s.botAck(id)
		}
		daemontest.WaitFor(t, "the depth back to 0 once the bot acked both", func() bool { return depth() == "0" })
	})

	t.Run("isolation", func(t *testing.T) {
		// Mail for leaf1 that the bot does not take yet: it stays in leaf1's mailbox.
		id := s.hubSend("pending for leaf1")
		if id == "" {
			t.Fatal("hub send failed")
		}
		l2 := fedClient(s.net.b, s.leaf2)
		if status, body := fedDo(t, l2, "GET", "/fed/v2/inbox?wait=0"); status != 200 || body != "null" {
			t.Errorf("leaf2 reads its inbox: %d %s, want 200 null", status, body)
		}
		if status, body := fedDo(t, l2, "POST", "/fed/v2/inbox/"+id+"/ack"); status != 404 {
			t.Errorf("leaf2 acks leaf1's row: %d %s, want 404", status, body)
		}
		if got := s.hubOutcome(id); got != "queued" {
			t.Errorf("after leaf2's ack the hub says %q, want queued", got)
		}
		pl := fedClient(s.net.b, s.plain)
		if status, body := fedDo(t, pl, "GET", "/fed/v2/inbox?wait=0"); status != 403 || !strings.Contains(body, "peer is not a leaf") {
			t.Errorf("non-leaf inbox: %d %s, want 403 peer is not a leaf", status, body)
		}
		if status, body := fedDo(t, pl, "POST", "/fed/v2/inbox/"+id+"/ack"); status != 403 || !strings.Contains(body, "op_denied") {
			t.Errorf("non-leaf ack: %d %s, want 403 op_denied", status, body)
		}
		if got, _ := s.botPoll(30); got != id {
			t.Fatalf("bot got %q, want %s", got, id)
		}
		s.botAck(id)
	})

	// The records of a pulled row ride a later commit on the leaf (an hour here, and the
	// service's ack held as long, so that no commit comes): the service has the row and acked
	// it, the leaf's store has no record of it, and the hub, acked only once there is one,
	// still holds it. A kill -9 then, and the restarted leaf delivers the row again.
	t.Run("kill inside the records' ride", func(t *testing.T) {
		env := s.leaf.extraEnv
		s.leaf.stop()
		s.leaf.extraEnv = append(slices.Clone(env), "XMSG_TEST_RECORD_RIDE=1h", "XMSG_TEST_ACK_DELAY=1h")
		s.leaf.start()
		s.startBot()
		s.leaf.extraEnv = env
		id := s.hubSend("riding")
		if got, _ := s.botPoll(30); got != id {
			t.Fatalf("bot got %q, want %s", got, id)
		}
		s.botAck(id)
		if o := s.hubOutcome(id); o != "queued" {
			t.Errorf("before the leaf's commit the hub says %q, want queued (it keeps the row)", o)
		}
		s.leaf.kill()
		st, err := store.Open(s.leaf.path("state/xmsg.db"), 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		var recorded bool
		st.View(func(tx *store.Tx) error { _, recorded, _ = tx.Message(id); return nil })
		st.Close()
		if recorded {
			t.Fatal("the leaf had stored the row's record before the kill: the kill was not inside the ride")
		}
		s.leaf.start()
		s.startBot()
		if got, _ := s.botPoll(30); got != id {
			t.Fatalf("after the restart the bot got %q, want %s again", got, id)
		}
		s.botAck(id)
		for i := 0; i < 1000 && s.hubOutcome(id) != "delivered"; i++ {
			time.Sleep(10 * time.Millisecond)
		}
		if o := s.hubOutcome(id); o != "delivered" {
			t.Errorf("after the ack the hub says %q, want delivered", o)
		}
	})

	t.Run("faults", func(t *testing.T) { leafFaults(t, s) })
}

// leafFaults runs rounds of faults (kill -9 of the leaf between local delivery and hub ack,
// kill -9 of the hub while the leaf polls, a cut of the veth) with mail in flight, and checks
// that every message the hub acknowledged reaches the service. Duplicates are counted.
func leafFaults(t *testing.T, s *leafSetup) {
	rounds, cut := 7, 300*time.Millisecond
	if os.Getenv("XMSG_LONG") == "1" {
		rounds, cut = 40, 3*time.Second
	}
	acked := map[string]bool{}
	seen := map[string]int{}
	n := 0
	send := func() string {
		n++
		id := s.hubSend(fmt.Sprintf("fault message %d", n))
		if id != "" {
			acked[id] = true
		}
		return id
	}
	// drain takes every acknowledged message until none is missing.
	drain := func(what string) {
		t.Helper()
		for i := 0; i < 400; i++ {
			missing := 0
			for id := range acked {
				if seen[id] == 0 {
					missing++
				}
			}
			if missing == 0 {
				return
			}
			id, _ := s.botPoll(10)
			if id != "" {
				seen[id]++
				s.botAck(id)
			}
		}
		t.Fatalf("%s: messages never arrived\nleaf: %s", what, s.leaf.stderr)
	}
	// settle waits until the hub has every acknowledged message's ack from the leaf (its
	// outcome turns delivered): the leaf is then back in its long-poll.
	confirmed := map[string]bool{}
	settle := func() {
		t.Helper()
		for id := range acked {
			for i := 0; i < 1000 && !confirmed[id]; i++ {
				if confirmed[id] = s.hubOutcome(id) == "delivered"; !confirmed[id] {
					time.Sleep(10 * time.Millisecond)
				}
			}
			if !confirmed[id] {
				t.Fatalf("message %s: the hub never got the leaf's ack (outcome %q)", id, s.hubOutcome(id))
			}
		}
	}
	var leafKills, hubKills, cuts int
	for r := 0; r < rounds; r++ {
		// 1. kill -9 of the leaf after the local delivery, before the hub ack.
		id := send()
		got, _ := s.botPoll(30)
		if got == "" {
			t.Fatalf("round %d: nothing delivered\nleaf: %s", r, s.leaf.stderr)
		}
		seen[got]++
		if o := s.hubOutcome(got); o != "queued" {
			t.Errorf("round %d: before the local ack the hub says %q, want queued (it keeps the row)", r, o)
		}
		s.leaf.kill()
		leafKills++
		if o := s.hubOutcome(got); o != "queued" {
			t.Errorf("round %d: after the leaf's kill the hub says %q, want queued", r, o)
		}
		s.leaf.start()
		s.startBot()
		// The row comes again (the hub kept it). Rows the bot acked before may come first:
		// the service gets a row while the leaf's commit of it is in flight, and a kill in
		// that commit also undoes the deletes of earlier acks that rode it (at-least-once,
		// counted as duplicates below); nothing else may.
		for {
			again, _ := s.botPoll(30)
			if again == "" {
				t.Errorf("round %d: after the restart the bot got nothing, want %s again", r, got)
				break
			}
			if again != got && seen[again] == 0 {
				t.Errorf("round %d: after the restart the bot got %q, neither %s again nor a message it acked before", r, again, got)
			}
			seen[again]++
			s.botAck(again)
			if again == got {
				break
			}
		}
		for i := 0; i < 1000 && s.hubOutcome(got) != "delivered"; i++ {
			time.Sleep(10 * time.Millisecond)
		}
		if o := s.hubOutcome(got); o != "delivered" {
			t.Errorf("round %d: after the ack the hub says %q, want delivered", r, o)
		}
		_ = id
		drain("after a leaf kill")

		// 2. kill -9 of the hub with mail waiting in its mailbox (the leaf waits for the local
		// ack of the first message), and kill -9 of the hub while the leaf's long-poll is
		// open: the leaf retries with backoff until the hub is back.
		send()
		send()
		s.hub.kill()
		hubKills++
		s.hub.start()
		send()
		drain("after a hub kill with mail waiting")
		settle()
		s.hub.kill()
		hubKills++
		time.Sleep(cut) // the hub stays down a while: the leaf's retries fail and back off
		s.hub.start()
		send()
		drain("after a hub kill during a poll")

		// 3. a network cut: mail waits in the mailbox and arrives once the link is back.
		runCmd(t, "ip", "-n", s.net.b, "link", "set", s.net.vb, "down")
		cuts++
		for _, id := range []string{send(), send()} {
			// The leaf cannot ack across the cut: the row waits in the hub's mailbox.
			if o := s.hubOutcome(id); o != "queued" {
				t.Errorf("round %d: during the cut the hub says %q, want queued", r, o)
			}
		}
		time.Sleep(cut)
		runCmd(t, "ip", "-n", s.net.b, "link", "set", s.net.vb, "up")
		drain("after a network cut")
	}
	lost, dups := 0, 0
	for id := range acked {
		if seen[id] == 0 {
			lost++
		}
		dups += max(0, seen[id]-1)
	}
	// The leaf reconnected to the restarted hubs with backoff, which its log shows.
	// The leaf reconnected to the restarted hubs, retrying with backoff, which its logs (all
	// its runs) show: a poll or an ack that failed, and the doubled delay of a second retry.
	logs := s.leaf.past.String() + s.leaf.stderr.String()
	// A batched pull acks and polls in one request ("leaf pull failed").
	pollRetries, ackRetries := strings.Count(logs, "leaf poll failed")+strings.Count(logs, "leaf pull failed"), strings.Count(logs, "leaf hub ack failed")
	if hubKills > 0 && (pollRetries+ackRetries == 0 || !strings.Contains(logs, "retry_in=200ms")) {
		t.Errorf("no retry with backoff logged across %d hub kills", hubKills)
	}
	faults := leafKills + hubKills + cuts
	t.Logf("faults: %d (leaf kill -9: %d, hub kill -9: %d, veth cuts of %s: %d); acknowledged messages: %d; lost: %d; duplicates: %d; retried after a failure: %d polls, %d hub acks",
		faults, leafKills, hubKills, cut, cuts, len(acked), lost, dups, pollRetries, ackRetries)
	if faults < 20 {
		t.Errorf("only %d faults", faults)
	}
	if lost != 0 {
		t.Errorf("%d acknowledged messages lost", lost)
	}
	settle() // every mailbox row acked: the hub says delivered for each
}

// TestLeafStartupRefusals: the leaf's startup rules (docs/protocol.md §7.5, §10.1), each one
// line and a non-zero exit from the real binary.
func TestLeafStartupRefusals(t *testing.T) {
	dir := shortTemp(t)
	c := fedtest.New(t, "leaf", nil, fedtest.Options{})
	write := func(name string, data []byte) string {
		p := filepath.Join(dir, name)
		os.WriteFile(p, data, 0o600)
		return p
	}
	cert, key := write("cert.pem", c.CertPEM), write("key.pem", c.KeyPEM)
	hub := write("hub.json", []byte(`{"hub": {"address": "192.0.2.1:7443", "pin": "`+c.Pin+`"}}`))
	leaves := write("leaves.json", []byte(`{"l": {"pin": "`+c.Pin+`", "leaf": true}}`))
	base := []string{"--leaf", "--leaf-principal", "svc:bot", "--listen", "127.0.0.1:0"}
	fedArgs := []string{"--peers-file", hub, "--fed-cert", cert, "--fed-key", key}
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"--leaf", "--leaf-principal", "svc:bot"}, "needs a peers file"}, // no --listen is fine: http.sock
		{[]string{"--leaf", "--listen", "127.0.0.1:0"}, "--leaf needs --leaf-principal"},
		{append(append(base, "--fed-listen", "127.0.0.1:7443"), fedArgs...), "--leaf forbids --fed-listen"},
		{append(append(base, "--svc-exe", "bot=/bin/true"), fedArgs...), "--leaf forbids --svc-exe"},
		{base, "needs a peers file"},
		{append(base, "--peers-file", leaves, "--fed-cert", cert, "--fed-key", key), "names no hub"},
		{append([]string{"--leaf", "--leaf-principal", "svc:not a name", "--listen", "127.0.0.1:0"}, fedArgs...), "--leaf-principal"},
	} {
		args := append([]string{"serve", "--db-path", filepath.Join(dir, "x.db"), "--leaf-register-sock", filepath.Join(dir, "rt", "reg.sock")}, tt.args...)
		out, err := xmsgCmd([]string{"XDG_RUNTIME_DIR=" + dir}, args...).CombinedOutput()
		if err == nil || !strings.Contains(string(out), tt.want) {
			t.Errorf("serve %v: %v\n%s\nwant a refusal naming %q", tt.args, err, out, tt.want)
		}
	}
}
