package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/xmsg/xmsg/internal/daemontest"
	"github.com/xmsg/xmsg/internal/limits"
	"github.com/xmsg/xmsg/internal/mcp"
	"github.com/xmsg/xmsg/internal/version"
)

// cliRun runs the real CLI (this test binary as xmsg) with env and stdin, and returns what it
// printed and its exit status.
func cliRun(t *testing.T, env []string, stdin string, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	cmd := xmsgCmd(env, args...)
	cmd.Stdin = strings.NewReader(stdin)
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &ee):
		code = ee.ExitCode()
	default:
		t.Fatalf("xmsg %q: %v", args, err)
	}
	return o.String(), e.String(), code
}

// oneLine fails unless stderr is exactly one line.
func oneLine(t *testing.T, what, stderr string) {
	t.Helper()
	if strings.Count(stderr, "\n") != 1 || !strings.HasSuffix(stderr, "\n") {
		t.Errorf("%s: stderr is not one line: %q", what, stderr)
	}
}

// TestCommandTable: every command of the table answers --help with exit 0 and lists every
// flag it parses with its default; `xmsg help CMD` prints the same; the bash and zsh
// completions and the man page name every command and flag. All of them read the one table,
// so a flag added to a command shows up everywhere. Mutants tried: the help printer skipping
// the last flag (red: the flag is missing from --help), `help CMD` printing the general usage
// (red), completion built from a list of its own (red for every command not in it).
func TestCommandTable(t *testing.T) {
	var bash, zsh, man bytes.Buffer
	writeBashCompletion(&bash)
	writeZshCompletion(&zsh)
	writeMan(&man)
	for _, c := range visible() {
		var out, errOut bytes.Buffer
		if err := run([]string{c.name, "--help"}, strings.NewReader(""), &out, &errOut); err != nil {
			t.Errorf("%s --help: %v", c.name, err)
			continue
		}
		var viaHelp bytes.Buffer
		if err := run([]string{"help", c.name}, strings.NewReader(""), &viaHelp, io.Discard); err != nil || viaHelp.String() != out.String() {
			t.Errorf("help %s: %v; differs from --help:\n%s\n---\n%s", c.name, err, viaHelp.String(), out.String())
		}
		if !strings.Contains(bash.String(), "\t"+c.name+") ") || !strings.Contains(zsh.String(), "'"+c.name+":") {
			t.Errorf("completion lacks the command %s", c.name)
		}
		if !strings.Contains(man.String(), ".SS "+roff(c.synopsis())) {
			t.Errorf("man page lacks the command %s", c.name)
		}
		fs, _ := c.newFlagSet(stdio{})
		fs.VisitAll(func(f *flag.Flag) {
			if !strings.Contains(out.String(), "--"+f.Name) {
				t.Errorf("%s --help lacks --%s:\n%s", c.name, f.Name, out.String())
			}
			if f.DefValue != "" && f.DefValue != "false" && c.help == nil && !strings.Contains(out.String(), f.DefValue) {
				t.Errorf("%s --help lacks the default of --%s (%s)", c.name, f.Name, f.DefValue)
			}
			if !strings.Contains(bash.String(), "--"+f.Name) || !strings.Contains(zsh.String(), "'--"+f.Name+"[") {
				t.Errorf("completion lacks %s --%s", c.name, f.Name)
			}
			if !strings.Contains(man.String(), `\fB\-\-`+roff(f.Name)+`\fR`) {
				t.Errorf("man page lacks %s --%s", c.name, f.Name)
			}
		})
	}
	// The scripts and the page work in the real programs, where they are installed.
	if bashPath, err := exec.LookPath("bash"); err == nil {
		script := bash.String() + `
COMP_WORDS=(xmsg se); COMP_CWORD=1; _xmsg; echo "${COMPREPLY[*]}"
COMP_WORDS=(xmsg send --idem); COMP_CWORD=2; _xmsg; echo "${COMPREPLY[*]}"
COMP_WORDS=(xmsg help rep); COMP_CWORD=2; _xmsg; echo "${COMPREPLY[*]}"
`
		out, err := exec.Command(bashPath, "-c", script).CombinedOutput()
		if want := "serve send\n--idempotency-key\nreply replies\n"; err != nil || string(out) != want {
			t.Errorf("bash completion: %v %q, want %q", err, out, want)
		}
	}
	if zshPath, err := exec.LookPath("zsh"); err == nil {
		if out, err := exec.Command(zshPath, "-n", "-c", zsh.String()).CombinedOutput(); err != nil {
			t.Errorf("zsh completion does not parse: %v %s", err, out)
		}
	}
	if groff, err := exec.LookPath("groff"); err == nil {
		cmd := exec.Command(groff, "-man", "-Tutf8", "-ww", "-z")
		cmd.Stdin = &man
		if out, err := cmd.CombinedOutput(); err != nil || len(out) > 0 {
			t.Errorf("groff warns about the man page: %v\n%s", err, out)
		}
	}
	// Usage errors: exit 2, one line naming the fix.
	for _, args := range [][]string{{"send", "--bogus"}, {"help", "nosuch"}, {"nosuch"}, {"completion", "fish"}, {"list", "extra"},
		{"bench", "--leaves", "3"}} {
		err := run(args, strings.NewReader(""), io.Discard, io.Discard)
		var ue usageError
		if !errors.As(err, &ue) || strings.Contains(ue.msg, "\n") || ue.msg == "" {
			t.Errorf("%q: %v, want a one-line usage error naming the fix", args, err)
		}
	}
}

// TestFlagsAfterDoubleDash: `--` ends the flags, so a text that starts with "-" is sent as
// it is; without it the error suggests `--`. Mutant tried: parseArgs parsing on after `--`
// (red: "-x" is taken for a flag).
func TestFlagsAfterDoubleDash(t *testing.T) {
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	j := fs.Bool("json", false, "")
	pos, err := parseArgs(fs, []string{"alice", "--json", "--", "-x", "--json"}, false)
	if err != nil || !*j || strings.Join(pos, " ") != "alice -x --json" {
		t.Fatalf("got %q %v json=%v, want [alice -x --json] with --json set", pos, err, *j)
	}
	err = run([]string{"send", "alice", "-5 degrees"}, strings.NewReader(""), io.Discard, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "xmsg send REF -- TEXT") {
		t.Errorf("a text that looks like a flag: %v, want the -- hint", err)
	}
}

// startListen starts `xmsg listen NAME args...` and waits for its "listening" line; its
// stdout lines arrive on the returned channel.
func startListen(t *testing.T, d *daemon, name string, args ...string) (*exec.Cmd, <-chan string, string) {
	t.Helper()
	cmd := xmsgCmd(d.env, append([]string{"listen", name}, args...)...)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	errPipe, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	lines := make(chan string, 64)
	go func() {
		sc := bufio.NewScanner(out)
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	er := bufio.NewReader(errPipe)
	first, err := er.ReadString('\n')
	if err != nil || !strings.Contains(first, "listening as") {
		t.Fatalf("listen %s: %q %v", name, first, err)
	}
	go io.Copy(io.Discard, er)
	id := regexp.MustCompile(`\((cli:[^)]+)\)`).FindStringSubmatch(first)
	if id == nil {
		t.Fatalf("listen %s: no session id in %q", name, first)
	}
	return cmd, lines, id[1]
}

func nextLine(t *testing.T, lines <-chan string) string {
	t.Helper()
	l, ok := <-lines
	if !ok {
		t.Fatal("listen ended")
	}
	return l
}

// TestListenSendReply is the quickstart without any agent: `xmsg listen alice` is a session
// others send to by name; it prints each message with its id and the attested sender, and
// `xmsg reply ID TEXT` from another process answers it through the listen that received it
// (another listen, bob, is asked too and refused by the bus as not the recipient); `xmsg
// replies ID` shows the reply numbered from 1 with the replier's name. Mutants tried: the
// relay not forwarding (red: reply fails), reply stopping at the first not_recipient (red
// when bob's socket sorts first), replies numbering by seq (red: "#2" on a second message),
// the ack the next poll carries left off (red: the first message never acked).
func TestListenSendReply(t *testing.T) {
	d := newDaemon(t)
	// The recipient is the listen whose reply socket sorts last, so that reply asks the other
	// one first and must go on past its not_recipient.
	_, aliceLines, aliceID := startListen(t, d, "alice", "--json")
	_, bobLines, bobID := startListen(t, d, "bob", "--json")
	name, alice, aliceID := "alice", aliceLines, aliceID
	if bobID > aliceID {
		name, alice, aliceID = "bob", bobLines, bobID
	}
	out, stderr, code := cliRun(t, d.env, "", "send", name, "build is green")
	if code != 0 {
		t.Fatalf("send: %d %s", code, stderr)
	}
	id := strings.TrimSpace(out)
	var m struct{ MessageID, From, Text string }
	if err := json.Unmarshal([]byte(nextLine(t, alice)), &m); err != nil || m.MessageID != id || m.Text != "build is green" || !strings.Contains(m.From, "cli ") {
		t.Fatalf("listen printed %+v %v, want message %s from the attested cli sender", m, err, id)
	}
	out, stderr, code = cliRun(t, d.env, "", "reply", id, "on it")
	if code != 0 || out != "replied to "+id+"\n" {
		t.Fatalf("reply: %d %q %q", code, out, stderr)
	}
	out, _, code = cliRun(t, d.env, "", "replies", id)
	if want := "#1 " + name + " (" + aliceID + "): on it\n"; code != 0 || out != want {
		t.Errorf("replies: %d %q, want %q", code, out, want)
	}
	// A second message: its first reply is #1 too.
	out, _, _ = cliRun(t, d.env, "", "send", name, "second")
	id2 := strings.TrimSpace(out)
	nextLine(t, alice)
	// The first was acked on the poll that brought the second (the daemon announced pollAck).
	daemontest.WaitFor(t, "the first message's ack", func() bool {
		return strings.Contains(d.stderr.String(), "request=ack message_id="+id)
	})
	cliRun(t, d.env, "", "reply", id2, "again")
	if out, _, _ := cliRun(t, d.env, "", "replies", id2); !strings.HasPrefix(out, "#1 "+name) {
		t.Errorf("replies to the second message: %q, want #1", out)
	}
	// Nobody received this id: refused, named.
	if _, stderr, code := cliRun(t, d.env, "", "reply", "0190aaaa-0000-7000-8000-000000000000", "x"); code != exitRefused {
		t.Errorf("reply to an unknown message: %d %q, want %d", code, stderr, exitRefused)
	}
	if out, _, _ := cliRun(t, d.env, "", "list"); !strings.Contains(out, "cli") || !strings.Contains(out, "alice") || !strings.Contains(out, "bob") {
		t.Errorf("list does not show the listen session:\n%s", out)
	}
}

// TestListenReplyCommand: --reply CMD answers each message with CMD's stdout, the text on its
// stdin; --count ends the listen. Mutant tried: the text not given on stdin (red: empty
// reply, none sent).
func TestListenReplyCommand(t *testing.T) {
	d := newDaemon(t)
	cmd, lines, _ := startListen(t, d, "carol", "--reply", "tr a-z A-Z", "--count", "1")
	out, _, _ := cliRun(t, d.env, "", "send", "carol", "hello there")
	id := strings.TrimSpace(out)
	if l := nextLine(t, lines); l != "message "+id+" from xmsg@testhost · cli "+currentUser(t) {
		t.Errorf("listen printed %q", l)
	}
	if err := cmd.Wait(); err != nil {
		t.Errorf("listen --count 1: %v, want exit 0", err)
	}
	out, stderr, code := cliRun(t, d.env, "", "replies", id, "--wait", "10")
	// The listen has ended, so the replier shows by its id alone.
	if code != 0 || !strings.HasPrefix(out, "#1 cli:") || !strings.HasSuffix(out, ": HELLO THERE\n") {
		t.Errorf("replies: %d %q %q", code, out, stderr)
	}
}

func currentUser(t *testing.T) string {
	t.Helper()
	return strings.TrimPrefix(defaultFrom(), "cli ")
}

// TestSendChecks: the answers say what happened. The text limit counts the text (65,536
// bytes of text go through, though their request is larger), a text over it is refused
// before sending with the limit named (also 10 MB, which used to break the pipe), an empty
// or control-character target is a usage error shown escaped. Mutants tried: the daemon
// counting the request again (red: 65,536 bytes refused), checkSize off (red: the daemon's
// answer, or a broken pipe, instead of the named limit), checkRef off (red: exit 3).
func TestSendChecks(t *testing.T) {
	d := newDaemon(t)
	_, lines, _ := startListen(t, d, "dave", "--json")
	full := strings.Repeat("\n", limits.MaxBody) // each escapes to two bytes of JSON
	if out, stderr, code := cliRun(t, d.env, full, "send", "dave", "-"); code != 0 {
		t.Errorf("a text of exactly --max-body bytes: %d %q %q", code, out, stderr)
	} else {
		nextLine(t, lines)
	}
	for _, n := range []int{limits.MaxBody + 1, 10 << 20} {
		_, stderr, code := cliRun(t, d.env, strings.Repeat("x", n), "send", "dave", "-")
		if code != exitRefused || !strings.Contains(stderr, fmt.Sprint(n)) || !strings.Contains(stderr, fmt.Sprint(limits.MaxBody)) {
			t.Errorf("a text of %d bytes: %d %q, want %d naming both sizes", n, code, stderr, exitRefused)
		}
		oneLine(t, "oversized text", stderr)
	}
	for _, ref := range []string{"", " ", "a\x1b[31mred"} {
		_, stderr, code := cliRun(t, d.env, "", "send", ref, "hi")
		if code != exitUsage || strings.ContainsRune(stderr, 0x1b) {
			t.Errorf("send %q: %d %q, want a usage error with control characters escaped", ref, code, stderr)
		}
		oneLine(t, "bad target", stderr)
	}
	if _, stderr, _ := cliRun(t, d.env, "", "send", "a\x1b[31mred", "hi"); !strings.Contains(stderr, `\x1b`) {
		t.Errorf("the target is not shown escaped: %q", stderr)
	}
	// A flag the user typed with a control character in it comes back escaped too.
	if _, stderr, code := cliRun(t, d.env, "", "send", "dave", "hi", "--\x1b[31m"); code != exitUsage || strings.ContainsRune(stderr, 0x1b) || !strings.Contains(stderr, `\x1b`) {
		t.Errorf("a flag with an escape: %d %q, want it escaped", code, stderr)
	}
	if out, stderr, code := cliRun(t, d.env, "", "send", "dave", "--", "-5 degrees"); code != 0 {
		t.Errorf("send -- -TEXT: %d %q %q", code, out, stderr)
	} else if l := nextLine(t, lines); !strings.Contains(l, `"text":"-5 degrees"`) {
		t.Errorf("listen got %s", l)
	}
}

// TestRepliesWaitOutcomes: a wait that ends without a reply is exit 5 and one line; a wait
// over the bus's 60 s is capped and says so. Mutants tried: the timeout returning nil (red),
// the cap silent (red).
func TestRepliesWaitOutcomes(t *testing.T) {
	d := newDaemon(t)
	_, lines, _ := startListen(t, d, "erin")
	out, _, _ := cliRun(t, d.env, "", "send", "erin", "ping")
	id := strings.TrimSpace(out)
	nextLine(t, lines)
	_, stderr, code := cliRun(t, d.env, "", "replies", id, "--wait", "1")
	if code != exitTimeout || !strings.Contains(stderr, "no reply to "+id+" within 1 s") {
		t.Errorf("replies --wait 1 with no reply: %d %q, want %d", code, stderr, exitTimeout)
	}
	oneLine(t, "timeout", stderr)
	cliRun(t, d.env, "", "reply", id, "pong")
	out, stderr, code = cliRun(t, d.env, "", "replies", id, "--wait", "99999")
	if code != 0 || !strings.Contains(out, ": pong") || !strings.Contains(stderr, "capped at 60 s") {
		t.Errorf("replies --wait 99999: %d %q %q, want the reply and the cap said", code, out, stderr)
	}
}

// TestRepliesWaitDaemonGone: a daemon that ends a wait because it stops answers it empty; the
// client tells that from a timeout by asking again, and exits 1 with one line. The "daemon"
// is a real HTTP server on a real socket that answers the wait and then stops. Mutant tried:
// no second question (red: exit 5, "no reply").
func TestRepliesWaitDaemonGone(t *testing.T) {
	sock := filepath.Join(shortTemp(t), "http.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	srv := &http.Server{}
	srv.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Connection", "close")
		io.WriteString(w, "[]")
		// Stop after this answer, as a daemon does that ends its waits on SIGTERM.
		once.Do(func() { ln.Close() })
	})
	go srv.Serve(ln)
	defer srv.Close()
	_, stderr, code := cliRun(t, nil, "", "replies", "m1", "--wait", "5", "--http-sock", sock)
	if code != exitFailure || !strings.Contains(stderr, "went away") {
		t.Errorf("daemon gone during the wait: %d %q, want %d and \"went away\"", code, stderr, exitFailure)
	}
	oneLine(t, "gone", stderr)
}

// TestWrongSocketKind: a socket of another kind is named, not reported as an HTTP parse error.
// Mutant tried: unreachable without the malformed-HTTP case (red: `malformed HTTP status`).
func TestWrongSocketKind(t *testing.T) {
	d := newDaemon(t)
	for _, c := range []struct{ sock, want string }{
		{d.sock("agent"), "this is agent.sock, not http.sock"},
		{d.sock("register"), "this is register.sock, not http.sock"},
	} {
		_, stderr, code := cliRun(t, d.env, "", "list", "--http-sock", c.sock)
		if code != exitFailure || !strings.Contains(stderr, c.want) {
			t.Errorf("list --http-sock %s: %d %q, want %q", filepath.Base(c.sock), code, stderr, c.want)
		}
	}
	_, stderr, code := cliRun(t, d.env, "", "listen", "x", "--register-sock", d.sock("http"))
	if code != exitFailure || !strings.Contains(stderr, "this is http.sock, not register.sock") {
		t.Errorf("listen on http.sock: %d %q", code, stderr)
	}
}

// TestRefusalNamesTheOwner: a socket of another uid is refused by the daemon before a byte
// (a bare EOF to the client); the client names the owner instead. Root only: it makes a file
// another uid owns. Mutant tried: ownerRefusal comparing with the file's gid (red).
func TestRefusalNamesTheOwner(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: a socket owned by another uid")
	}
	dir := shortTemp(t)
	sock := filepath.Join(dir, "http.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close() // the peer gate: closed before a byte is read
		}
	}()
	if err := os.Chown(sock, 65534, 0); err != nil {
		t.Fatal(err)
	}
	_, stderr, code := cliRun(t, nil, "", "list", "--http-sock", sock)
	if code != exitFailure || !strings.Contains(stderr, "refused: "+sock+" is owned by uid 65534, you are uid 0") {
		t.Errorf("list on another uid's socket: %d %q", code, stderr)
	}
}

// TestDoctorAndVersion: doctor shows the running daemon's version and uptime, and exits 1
// when none answers (printing what it can); --version and the MCP bridge's serverInfo carry
// the build's version (internal/version). Mutants tried: doctor returning nil when
// unreachable (red), serverInfo "dev" (red).
func TestDoctorAndVersion(t *testing.T) {
	d := newDaemon(t)
	out, stderr, code := cliRun(t, d.env, "", "doctor")
	if code != 0 || !strings.Contains(out, "  version "+version.String()+", up ") {
		t.Errorf("doctor: %d\n%s%s", code, out, stderr)
	}
	out, stderr, code = cliRun(t, d.env, "", "doctor", "--http-sock", filepath.Join(shortTemp(t), "none.sock"))
	if code != exitFailure || !strings.Contains(out, "machine:") || !strings.Contains(out, "not reachable") {
		t.Errorf("doctor with no daemon: %d\n%s%s", code, out, stderr)
	}
	oneLine(t, "doctor unreachable", stderr)
	if out, _, _ := cliRun(t, nil, "", "--version"); out != "xmsg "+version.String()+"\n" {
		t.Errorf("--version: %q", out)
	}
	in := `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18"}}` + "\n" +
		`{"jsonrpc":"2.0","id":2,"method":"tools/list"}` + "\n"
	out, stderr, _ = cliRun(t, d.env, in, "mcp")
	var init struct {
		Result struct {
			ServerInfo struct{ Version string } `json:"serverInfo"`
			Tools      []struct{ Name string }
		}
	}
	var listed []string
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		init.Result.Tools = nil
		if err := json.Unmarshal([]byte(l), &init); err != nil {
			t.Fatalf("mcp: %q %v %s", l, err, stderr)
		}
		for _, tl := range init.Result.Tools {
			listed = append(listed, tl.Name)
		}
	}
	if init.Result.ServerInfo.Version != version.String() {
		t.Errorf("serverInfo.version %q, want %q", init.Result.ServerInfo.Version, version.String())
	}
	// The tools mcp --help names are the bridge's table; a bridge below no Codex process (this
	// one) lists all of them but receive, which only a Codex thread can use.
	help, _, _ := cliRun(t, nil, "", "mcp", "--help")
	named := regexp.MustCompile(`Its tools: ([a-z, ]+[a-z])`).FindStringSubmatch(help)
	plain := slices.DeleteFunc(mcp.ToolNames(), func(n string) bool { return n == "receive" })
	if named == nil || named[1] != strings.Join(mcp.ToolNames(), ", ") || strings.Join(listed, ",") != strings.Join(plain, ",") {
		t.Errorf("mcp --help names %q; tools/list gives %q, want %q", named, listed, plain)
	}
}
