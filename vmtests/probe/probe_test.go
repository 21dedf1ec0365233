package main

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/xmsg/xmsg/internal/ostest"
)

// The test binary doubles as the probe: in the role "probe" it runs the probe's main, so the
// tests exercise the real command line in a real child process (optionally as another uid).
func TestMain(m *testing.M) {
	ostest.Main(m, ostest.Roles{"probe": func() int { return run(os.Args[1:], os.Stdout, os.Stderr) }})
}

// probeCmd returns a command running the probe with args; prefix (e.g. setpriv ...) goes first.
func probeCmd(t *testing.T, exe string, prefix []string, args ...string) *exec.Cmd {
	t.Helper()
	argv := append(append(append([]string{}, prefix...), exe), args...)
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = append(os.Environ(), ostest.Role("probe"))
	return cmd
}

func runProbe(t *testing.T, exe string, prefix []string, args ...string) (string, int) {
	t.Helper()
	out, err := probeCmd(t, exe, prefix, args...).CombinedOutput()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("run probe: %v", err)
	}
	return string(out), code
}

func self(t *testing.T) string {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	return exe
}

func TestParseTCP(t *testing.T) {
	const header = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"
	tests := []struct {
		name    string
		in      string
		want    []tcpSocket
		wantErr bool
	}{
		{"empty table", header, nil, false},
		{"listener v4", header +
			"   0: 0100007F:1E6B 00000000:0000 0A 00000000:00000000 00:00000000 00000000   998        0 12345 1 0000000000000000 100 0 0 10 0\n",
			[]tcpSocket{{Port: 7787, State: tcpListen, UID: 998}}, false},
		{"established v6", header +
			"   0: 00000000000000000000000001000000:0016 00000000000000000000000001000000:D431 01 00000000:00000000 00:00000000 00000000     0        0 1 1 0 20 4 30 10 -1\n",
			[]tcpSocket{{Port: 22, State: 1, UID: 0}}, false},
		{"no header", "garbage\n", nil, true},
		{"short row", header + "   0: 0100007F:1E6B\n", nil, true},
		{"bad port", header + "   0: 0100007F:XYZ 00000000:0000 0A 0:0 0:0 0 998 0\n", nil, true},
		{"bad uid", header + "   0: 0100007F:0050 00000000:0000 0A 0:0 0:0 0 -1 0\n", nil, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseTCP([]byte(tt.in))
			if (err != nil) != tt.wantErr {
				t.Fatalf("err: got %v, want error %v", err, tt.wantErr)
			}
			if fmt.Sprint(got) != fmt.Sprint(tt.want) {
				t.Errorf("got %+v, want %+v", got, tt.want)
			}
		})
	}
}

func FuzzParseTCP(f *testing.F) {
	f.Add([]byte("  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n" +
		"   0: 0100007F:1E6B 00000000:0000 0A 00000000:00000000 00:00000000 00000000   998        0 12345 1\n"))
	f.Add([]byte("local_address\n:\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		ls, err := parseTCP(b)
		if err != nil {
			return
		}
		for _, l := range ls {
			if l.Port < 0 || l.Port > 65535 || l.State < 0 || l.State > 255 || l.UID < 0 {
				t.Fatalf("out of range: %+v", l)
			}
		}
	})
}

func TestNotcp(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Skipf("no TCP loopback: %v", err)
	}
	defer ln.Close()
	port := strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)
	// A uid that owns nothing, so only --port can find the listener.
	const nobody = "4000000001"
	tests := []struct {
		name     string
		args     []string
		wantCode int
	}{
		{"our listener by port", []string{"notcp", "--uid", nobody, "--port", port}, 1},
		{"our listener by uid", []string{"notcp", "--uid", strconv.Itoa(os.Getuid())}, 1},
		{"nothing for an unused uid", []string{"notcp", "--uid", nobody}, 0},
		{"our own netns by pid", []string{"notcp", "--uid", nobody, "--pid", strconv.Itoa(os.Getpid()), "--port", port}, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out, code := runProbe(t, self(t), nil, tt.args...)
			if code != tt.wantCode {
				t.Errorf("exit: got %d, want %d; output:\n%s", code, tt.wantCode, out)
			}
		})
	}
}

// fakeServer listens on a Unix socket and handles every connection with handle.
func fakeServer(t *testing.T, handle func(net.Conn)) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "s.sock")
	ln, err := net.Listen("unix", p)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go handle(c)
		}
	}()
	return p
}

func TestGate(t *testing.T) {
	tests := []struct {
		name     string
		handle   func(net.Conn)
		wantCode int
		wantLine string
	}{
		// What the peer gate does: close before reading one byte.
		{"closed at once", func(c net.Conn) { c.Close() }, 0, "PASS gate-silent"},
		// Closing with our request unread makes the kernel report a reset, still no data.
		{"closed after the request arrived", func(c net.Conn) {
			buf := make([]byte, 1)
			c.Read(buf)
			c.Close()
		}, 0, "PASS gate-silent"},
		// The mutant: the gate is gone and the request is answered.
		{"answered", func(c net.Conn) {
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
			c.Close()
		}, 1, "FAIL gate-silent"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			sock := fakeServer(t, tt.handle)
			out, code := runProbe(t, self(t), nil, "gate", "--sock", sock, "--timeout", "10s")
			if code != tt.wantCode || !strings.Contains(out, tt.wantLine) {
				t.Errorf("got exit %d output:\n%s\nwant exit %d and %q", code, out, tt.wantCode, tt.wantLine)
			}
		})
	}
	t.Run("unreachable socket", func(t *testing.T) {
		out, code := runProbe(t, self(t), nil, "gate", "--sock", filepath.Join(t.TempDir(), "none.sock"))
		if code != 1 || !strings.Contains(out, "FAIL gate-connect") {
			t.Errorf("got exit %d output:\n%s\nwant exit 1 and FAIL gate-connect", code, out)
		}
	})
}

// TestOther runs the probe as uid/gid 65534 against files of root (the test's user): modes
// 0700/0600 must make every check pass; a readable marker, a missing one and a reachable
// socket must each make it fail.
func TestOther(t *testing.T) {
	ostest.Need(t, os.Geteuid() == 0, "root, to run the probe as another uid")
	ostest.RequireTool(t, "setpriv")
	// The probe binary must be reachable by uid 65534: copy it into a 0755 directory.
	bin := t.TempDir()
	// t.TempDir's parent is 0700 too: open it for uid 65534, or every access would fail with
	// EACCES for the wrong reason and the test could not fail.
	for _, d := range []string{filepath.Dir(bin), bin} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	exe := filepath.Join(bin, "probe")
	b, err := os.ReadFile(self(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(exe, b, 0o755); err != nil {
		t.Fatal(err)
	}
	as := []string{"setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"}

	// A tier laid out like /run/xmsg-<t>/xmsg and /var/lib/xmsg-<t>, owned by root.
	root := t.TempDir()
	if err := os.Chmod(root, 0o755); err != nil {
		t.Fatal(err)
	}
	sockDir := filepath.Join(root, "run", "xmsg")
	state := filepath.Join(root, "state")
	open := filepath.Join(root, "open")
	for _, d := range []string{sockDir, state, open} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	os.Chmod(filepath.Join(root, "run"), 0o755)
	os.Chmod(open, 0o755)
	for _, s := range []string{"http.sock", "agent.sock", "register.sock"} {
		ln, err := net.Listen("unix", filepath.Join(sockDir, s))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ln.Close() })
	}
	marker := filepath.Join(state, "marker")
	cred := filepath.Join(root, "cred")
	readable := filepath.Join(open, "readable")
	for _, f := range []struct {
		path string
		mode os.FileMode
	}{{marker, 0o600}, {cred, 0o400}, {readable, 0o644}} {
		if err := os.WriteFile(f.path, []byte("secret"), f.mode); err != nil {
			t.Fatal(err)
		}
	}

	tests := []struct {
		name     string
		args     []string
		wantCode int
		wantLine string
	}{
		{"all denied", []string{"other", "--dir", sockDir, "--state", state, "--marker", marker, "--cred", cred}, 0, "PASS cred:" + cred},
		{"readable marker", []string{"other", "--marker", readable}, 1, "FAIL read:" + readable + ": access succeeded"},
		{"missing marker", []string{"other", "--marker", filepath.Join(state, "..", "nope")}, 1, "must exist"},
		{"listable dir", []string{"other", "--state", open}, 1, "FAIL list:" + open},
		{"nothing to check", []string{"other"}, 1, "FAIL other"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out, code := runProbe(t, exe, as, tt.args...)
			if code != tt.wantCode || !strings.Contains(out, tt.wantLine) {
				t.Errorf("got exit %d output:\n%s\nwant exit %d and %q", code, out, tt.wantCode, tt.wantLine)
			}
		})
	}

	// The mutant of the socket directory mode: relaxed to 0755 with sockets 0666, connect
	// succeeds and the probe must say so.
	if err := os.Chmod(sockDir, 0o755); err != nil {
		t.Fatal(err)
	}
	os.Chmod(filepath.Join(sockDir, "http.sock"), 0o666)
	out, code := runProbe(t, exe, as, "other", "--dir", sockDir)
	if want := "FAIL connect:" + filepath.Join(sockDir, "http.sock") + ": access succeeded"; code != 1 || !strings.Contains(out, want) {
		t.Errorf("relaxed: got exit %d output:\n%s\nwant exit 1 and %q", code, out, want)
	}
}

func TestUsage(t *testing.T) {
	tests := [][]string{
		{},
		{"bogus"},
		{"own"},
		{"gate"},
		{"enqueue", "--dir", "/x"},
		{"own", "--dir", "/x", "extra"},
	}
	for _, args := range tests {
		var buf bytes.Buffer
		if got := run(args, &buf, &buf); got != 2 {
			t.Errorf("run(%q): got exit %d, want 2", args, got)
		}
	}
}

func TestStatusField(t *testing.T) {
	status := []byte("Name:\tprobe\nNoNewPrivs:\t1\nSeccomp:\t2\nSeccomp_filters:\t3\n")
	tests := []struct{ key, want string }{
		{"NoNewPrivs", "1"}, {"Seccomp", "2"}, {"Seccomp_filters", "3"}, {"CapEff", ""},
	}
	for _, tt := range tests {
		if got := statusField(status, tt.key); got != tt.want {
			t.Errorf("statusField(%q): got %q, want %q", tt.key, got, tt.want)
		}
	}
}

// TestSandboxOutsideUnit: run where no sandbox is in force, `probe sandbox` must fail every
// check that only a sandbox can make pass, and pass its positive controls.
func TestSandboxOutsideUnit(t *testing.T) {
	dir := t.TempDir()
	out, code := runProbe(t, self(t), nil, "sandbox", "--readonly", dir, "--writable", dir)
	for _, want := range []string{
		"FAIL socket-inet:", "FAIL readonly:" + dir, "PASS writable:" + dir, "PASS socket-unix", "FAIL status-Seccomp",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	if code != 1 {
		t.Errorf("exit: got %d, want 1", code)
	}
}
