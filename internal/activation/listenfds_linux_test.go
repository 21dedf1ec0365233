//go:build linux

package activation

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/xmsg/xmsg/internal/ostest"
)

// listen is one -l/--fdname pair for systemd-socket-activate.
type listen struct {
	file   string // base name in the socket dir
	fdname string // "" = no --fdname for it
}

// TestSocketActivation runs the real systemd-socket-activate, which binds
// the sockets itself and execs the re-executed test binary (runChild) with
// LISTEN_FDS/LISTEN_FDNAMES, exactly as systemd does for a service.
func TestSocketActivation(t *testing.T) {
	tool := ostest.RequireTool(t, "systemd-socket-activate") // Debian package systemd
	all := []listen{{"register.sock", "register"}, {"http.sock", "http"}, {"agent.sock", "agent"}}
	tests := []struct {
		name    string
		root    bool
		listens []listen
		// prep runs after the sockets exist and were chmod 0600 (what
		// SocketMode=0600 does), before the child starts.
		prep    func(t *testing.T, dir string)
		linkDir bool   // pass the paths through a symlink to dir
		want    string // child stdout on success
		wantErr string // "" = must succeed
	}{
		{
			// Names, not positions: the order here is neither
			// alphabetical nor the order of the Paths fields.
			name: "all three in shuffled order", listens: all,
			want: "activated=true missing=",
		},
		{
			name: "register not passed", listens: []listen{{"agent.sock", "agent"}, {"http.sock", "http"}},
			want: "activated=true missing=register",
		},
		{
			name: "unknown name", listens: []listen{{"http.sock", "http"}, {"agent.sock", "agent"}, {"bogus.sock", "bogus"}},
			wantErr: `activation: fd 5 (name "bogus"): unknown name`,
		},
		{
			name: "duplicate name", listens: []listen{{"http.sock", "http"}, {"http2.sock", "http"}},
			wantErr: `activation: fd 4 (name "http"): duplicate name (also fd 3)`,
		},
		{
			name: "unnamed fds", listens: []listen{{"http.sock", ""}},
			wantErr: `activation: LISTEN_FDNAMES="": want one name per fd`,
		},
		{
			name: "socket mode 0666", listens: all,
			prep:    func(t *testing.T, dir string) { chmod(t, filepath.Join(dir, "http.sock"), 0o666) },
			wantErr: `activation: fd 4 (name "http"): ` + "%DIR%/http.sock: mode 0666, want 0600",
		},
		{
			name: "socket mode 0400", listens: all,
			prep:    func(t *testing.T, dir string) { chmod(t, filepath.Join(dir, "agent.sock"), 0o400) },
			wantErr: `activation: fd 5 (name "agent"): ` + "%DIR%/agent.sock: mode 0400, want 0600",
		},
		{
			name: "socket owned by another uid", root: true, listens: all,
			prep:    func(t *testing.T, dir string) { chown(t, filepath.Join(dir, "register.sock"), 65534) },
			wantErr: `activation: fd 3 (name "register"): ` + "%DIR%/register.sock: owned by uid 65534, want 0",
		},
		{
			name: "socket replaced by a regular file", listens: all,
			prep: func(t *testing.T, dir string) {
				p := filepath.Join(dir, "agent.sock")
				if err := os.Remove(p); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(p, nil, 0o600); err != nil {
					t.Fatal(err)
				}
			},
			wantErr: `activation: fd 5 (name "agent"): ` + "%DIR%/agent.sock: not a socket file",
		},
		{
			name: "dir mode 0755", listens: all,
			prep:    func(t *testing.T, dir string) { chmod(t, dir, 0o755) },
			wantErr: `activation: fd 3 (name "register"): insecure_socket_dir: %DIR%: mode 0755, want 0700`,
		},
		{
			name: "dir owned by another uid", root: true, listens: all,
			prep:    func(t *testing.T, dir string) { chown(t, dir, 65534) },
			wantErr: `activation: fd 3 (name "register"): insecure_socket_dir: %DIR%: owned by uid 65534, want 0`,
		},
		{
			name: "dir is a symlink", listens: all, linkDir: true,
			wantErr: `activation: fd 3 (name "register"): insecure_socket_dir: %DIR%: is a symlink`,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.root {
				ostest.RequireRoot(t)
			}
			dir := mkdir0700(t, "xmsg")
			sockDir := dir
			if tt.linkDir {
				sockDir = filepath.Join(t.TempDir(), "link")
				if err := os.Symlink(dir, sockDir); err != nil {
					t.Fatal(err)
				}
			}
			args := []string{}
			for _, l := range tt.listens {
				args = append(args, "-l", filepath.Join(sockDir, l.file))
				if l.fdname != "" {
					args = append(args, "--fdname="+l.fdname)
				}
			}
			exe, err := os.Executable()
			if err != nil {
				t.Fatal(err)
			}
			// systemd-socket-activate passes only TERM, PATH, USER,
			// HOME and -E variables to its child.
			args = append(args, "-E", ostest.Role(childRole), "-E", envChildDir+"="+sockDir, "--", exe)
			cmd := exec.Command(tool, args...)
			stdoutPipe, err := cmd.StdoutPipe()
			if err != nil {
				t.Fatal(err)
			}
			stderrPipe, err := cmd.StderrPipe()
			if err != nil {
				t.Fatal(err)
			}
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })

			// Wait until the tool listens on every socket: it says so
			// on stderr, one "Listening on <path> as <fd>." per socket.
			stderr := &syncBuf{}
			sc := bufio.NewScanner(stderrPipe)
			for n := 0; n < len(tt.listens); {
				if !sc.Scan() {
					t.Fatalf("systemd-socket-activate exited early: %v\nstderr:\n%s", sc.Err(), stderr)
				}
				stderr.add(sc.Text())
				if strings.HasPrefix(sc.Text(), "Listening on ") {
					n++
				}
			}
			stderrDone := make(chan struct{})
			go func() {
				defer close(stderrDone)
				for sc.Scan() {
					stderr.add(sc.Text())
				}
			}()

			// The tool creates the files with its own mode; set what
			// SocketMode=0600 would, then the case's change.
			inodes := map[string]os.FileInfo{}
			for _, l := range tt.listens {
				p := filepath.Join(dir, l.file)
				chmod(t, p, 0o600)
			}
			if tt.prep != nil {
				tt.prep(t, dir)
			}
			for _, l := range tt.listens {
				p := filepath.Join(dir, l.file)
				fi, err := os.Lstat(p)
				if err != nil {
					t.Fatal(err)
				}
				inodes[p] = fi
			}

			// The tool execs its child on the first connection attempt.
			// This connection stays queued and is the child's to accept.
			first := filepath.Join(sockDir, tt.listens[0].file)
			trigger, err := net.Dial("unix", first)
			if err != nil {
				t.Fatalf("trigger connection to %s: %v", first, err)
			}
			defer trigger.Close()

			// The child's first stdout line is its Acquire result; a
			// failed child exits without one.
			status, _ := bufio.NewReader(stdoutPipe).ReadString('\n')
			status = strings.TrimSpace(status)
			if tt.wantErr != "" {
				if status != "" {
					_ = cmd.Process.Kill()
					t.Fatalf("child accepted the sockets (%q); want it to refuse with %q", status, tt.wantErr)
				}
				err := cmd.Wait()
				<-stderrDone
				var ee *exec.ExitError
				if !errors.As(err, &ee) || ee.ExitCode() != childAcquireFailed {
					t.Fatalf("child exit = %v; want exit code %d\nstderr:\n%s", err, childAcquireFailed, stderr)
				}
				want := strings.ReplaceAll(tt.wantErr, "%DIR%", sockDir)
				if !strings.Contains(stderr.String(), want) {
					t.Fatalf("child stderr:\n%s\nwant it to contain %q", stderr, want)
				}
				return
			}

			if status != tt.want {
				_ = cmd.Process.Kill()
				t.Fatalf("child reported %q; want %q\nstderr:\n%s", status, tt.want, stderr)
			}
			// Every socket serves, each under its own name.
			for _, l := range tt.listens {
				c := trigger
				if l != tt.listens[0] {
					c, err = net.Dial("unix", filepath.Join(sockDir, l.file))
					if err != nil {
						t.Fatalf("dial %s: %v", l.file, err)
					}
					defer c.Close()
				}
				got, err := io.ReadAll(c)
				if err != nil {
					t.Fatalf("read from %s: %v", l.file, err)
				}
				if want := l.fdname + "\n"; string(got) != want {
					t.Errorf("%s answered %q; want %q", l.file, got, want)
				}
			}
			err = cmd.Wait()
			<-stderrDone
			if err != nil {
				t.Fatalf("child: %v\nstderr:\n%s", err, stderr)
			}
			// The child bound nothing and removed nothing: the same
			// socket files are there, even after its Close.
			for p, before := range inodes {
				after, err := os.Lstat(p)
				if err != nil || !os.SameFile(before, after) {
					t.Errorf("%s changed or vanished under the activated child (%v)", p, err)
				}
			}
			for _, f := range []string{"http.sock", "agent.sock", "register.sock"} {
				p := filepath.Join(dir, f)
				if _, ok := inodes[p]; ok {
					continue
				}
				if _, err := os.Lstat(p); !errors.Is(err, os.ErrNotExist) {
					t.Errorf("%s exists (%v): the activated child bound a socket", p, err)
				}
			}
		})
	}
}

// TestListenFDs hands fds to the child with exec.Cmd.ExtraFiles; the child
// sets LISTEN_PID to its own pid before calling Acquire.
func TestListenFDs(t *testing.T) {
	tests := []struct {
		name    string
		file    func(t *testing.T) (*os.File, string) // becomes fd 3 (nil = none); string: path to dial
		env     []string                              // LISTEN_* (and helper) variables
		wantErr string
		wantFD3 string // "open" or "closed" after the failed Acquire ("" = don't care)
		wantOut string // on success
	}{
		{
			name:    "pipe",
			file:    pipeFile,
			env:     []string{"LISTEN_FDS=1", "LISTEN_FDNAMES=http"},
			wantErr: `activation: fd 3 (name "http"): not a socket`,
			wantFD3: "closed",
		},
		{
			name:    "tcp listener",
			file:    tcpListener,
			env:     []string{"LISTEN_FDS=1", "LISTEN_FDNAMES=http"},
			wantErr: `activation: fd 3 (name "http"): socket family 2, want AF_UNIX`,
		},
		{
			name:    "unix datagram socket",
			file:    unixDgram,
			env:     []string{"LISTEN_FDS=1", "LISTEN_FDNAMES=agent"},
			wantErr: `activation: fd 3 (name "agent"): socket type 2, want SOCK_STREAM`,
		},
		{
			name:    "bound but not listening",
			file:    unixNotListening,
			env:     []string{"LISTEN_FDS=1", "LISTEN_FDNAMES=register"},
			wantErr: `activation: fd 3 (name "register"): socket is not listening`,
		},
		{
			name:    "abstract listener",
			file:    abstractListener,
			env:     []string{"LISTEN_FDS=1", "LISTEN_FDNAMES=http"},
			wantErr: `activation: fd 3 (name "http"): abstract socket "@xmsg-activation-test-`,
		},
		{
			name:    "bound to a relative path",
			env:     []string{"LISTEN_FDS=1", "LISTEN_FDNAMES=agent", envRelativeFD3 + "=1"},
			wantErr: `activation: fd 3 (name "agent"): bound path "agent.sock" is not absolute`,
		},
		{
			name:    "good listener",
			file:    goodListener,
			env:     []string{"LISTEN_FDS=1", "LISTEN_FDNAMES=agent"},
			wantOut: "activated=true missing=http,register",
		},
		{
			name:    "more names than fds",
			file:    goodListener,
			env:     []string{"LISTEN_FDS=1", "LISTEN_FDNAMES=agent:http"},
			wantErr: `activation: LISTEN_FDNAMES="agent:http": want one name per fd (LISTEN_FDS=1)`,
			wantFD3: "closed",
		},
		{
			name:    "LISTEN_FDS not a number",
			file:    goodListener,
			env:     []string{"LISTEN_FDS=x", "LISTEN_FDNAMES=agent"},
			wantErr: `activation: LISTEN_FDS="x": want a positive number of fds`,
		},
		{
			name:    "LISTEN_FDS zero",
			file:    goodListener,
			env:     []string{"LISTEN_FDS=0", "LISTEN_FDNAMES="},
			wantErr: `activation: LISTEN_FDS="0": want a positive number of fds`,
		},
		{
			name:    "LISTEN_FDS huge",
			file:    goodListener,
			env:     []string{"LISTEN_FDS=100000", "LISTEN_FDNAMES=agent"},
			wantErr: `activation: LISTEN_FDS=100000: more than 64 fds`,
		},
		{
			// fd 3 is an fd of the child's own (close-on-exec), not
			// an inherited one: refuse, and leave it open.
			name:    "fd not inherited",
			env:     []string{"LISTEN_FDS=1", "LISTEN_FDNAMES=http", envCloexecFD3 + "=1"},
			wantErr: `activation: fd 3: not inherited (close-on-exec set; LISTEN_FDS=1)`,
			wantFD3: "open",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			exe, err := os.Executable()
			if err != nil {
				t.Fatal(err)
			}
			cmd := ostest.Command(exe, childRole)
			cmd.Dir = mkdir0700(t, "cwd") // a good socket dir, for the relative case
			cmd.Env = append(cmd.Env, envSetListenPID+"=1",
				envChildDir+"="+filepath.Join(t.TempDir(), "self"))
			cmd.Env = append(cmd.Env, tt.env...)
			var dial string
			if tt.file != nil {
				var f *os.File
				f, dial = tt.file(t)
				// Only the child keeps the fd: if it dies, the
				// socket dies with it and nothing below blocks.
				defer f.Close()
				cmd.ExtraFiles = []*os.File{f}
			}
			var stdout, stderr bytes.Buffer
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			if tt.wantOut != "" {
				if err := cmd.Start(); err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = cmd.Process.Kill() })
				cmd.ExtraFiles[0].Close()
				// The listener is already listening: this connection
				// waits in its backlog until the child accepts it.
				c, err := net.Dial("unix", dial)
				if err != nil {
					t.Fatal(err)
				}
				got, _ := io.ReadAll(c)
				c.Close()
				if err := cmd.Wait(); err != nil {
					t.Fatalf("child: %v\nstderr:\n%s", err, &stderr)
				}
				if string(got) != "agent\n" {
					t.Errorf("inherited socket answered %q; want %q", got, "agent\n")
				}
				if out := strings.TrimSpace(stdout.String()); out != tt.wantOut {
					t.Errorf("child stdout = %q; want %q", out, tt.wantOut)
				}
				return
			}
			// A child that wrongly accepts would wait for a connection
			// forever: its first stdout line gives it away.
			cmd.Stdout = nil
			stdoutPipe, err := cmd.StdoutPipe()
			if err != nil {
				t.Fatal(err)
			}
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = cmd.Process.Kill() })
			if status, _ := bufio.NewReader(stdoutPipe).ReadString('\n'); status != "" {
				_ = cmd.Process.Kill()
				t.Fatalf("child accepted the fds (%q); want it to refuse with %q", strings.TrimSpace(status), tt.wantErr)
			}
			err = cmd.Wait()
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ee.ExitCode() != childAcquireFailed {
				t.Fatalf("child exit = %v; want exit code %d\nstderr:\n%s", err, childAcquireFailed, &stderr)
			}
			if !strings.Contains(stderr.String(), tt.wantErr) {
				t.Fatalf("child stderr:\n%s\nwant it to contain %q", &stderr, tt.wantErr)
			}
			if tt.wantFD3 != "" && !strings.Contains(stderr.String(), "child fd3="+tt.wantFD3) {
				t.Errorf("child stderr:\n%s\nwant fd 3 %s after the failed Acquire", &stderr, tt.wantFD3)
			}
		})
	}
}

func chmod(t *testing.T, path string, mode os.FileMode) {
	t.Helper()
	if err := os.Chmod(path, mode); err != nil {
		t.Fatal(err)
	}
}

func chown(t *testing.T, path string, uid int) {
	t.Helper()
	if err := os.Lchown(path, uid, uid); err != nil {
		t.Fatal(err)
	}
}

func pipeFile(t *testing.T) (*os.File, string) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	w.Close()
	return r, ""
}

// fileOf returns a dup of the listener's fd as an *os.File; the socket
// lives on in the file after the caller closes the listener.
func fileOf(t *testing.T, l interface{ File() (*os.File, error) }) *os.File {
	t.Helper()
	f, err := l.File()
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func tcpListener(t *testing.T) (*os.File, string) {
	l, err := net.ListenTCP("tcp", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return fileOf(t, l), ""
}

func unixDgram(t *testing.T) (*os.File, string) {
	p := filepath.Join(mkdir0700(t, "xmsg"), "agent.sock")
	c, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: p, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	chmod(t, p, 0o600)
	return fileOf(t, c), p
}

// unixNotListening is a stream socket bound to a good path (0600 file in a
// 0700 dir) on which listen(2) was never called.
func unixNotListening(t *testing.T) (*os.File, string) {
	p := filepath.Join(mkdir0700(t, "xmsg"), "register.sock")
	fd, err := syscall.Socket(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Bind(fd, &syscall.SockaddrUnix{Name: p}); err != nil {
		t.Fatal(err)
	}
	chmod(t, p, 0o600)
	return os.NewFile(uintptr(fd), "unbound"), p
}

func abstractListener(t *testing.T) (*os.File, string) {
	l, err := net.Listen("unix", "@xmsg-activation-test-"+strconv.Itoa(os.Getpid()))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return fileOf(t, l.(*net.UnixListener)), ""
}

// goodListener is what systemd would pass: a listening socket, 0600, in a
// 0700 directory, all ours.
func goodListener(t *testing.T) (*os.File, string) {
	p := filepath.Join(mkdir0700(t, "xmsg"), "agent.sock")
	l, err := Bind(p)
	if err != nil {
		t.Fatal(err)
	}
	l.SetUnlinkOnClose(false)
	defer l.Close()
	return fileOf(t, l), p
}

// syncBuf collects lines written by one goroutine and read by another.
type syncBuf struct {
	mu sync.Mutex
	b  strings.Builder
}

func (b *syncBuf) add(line string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.b.WriteString(line + "\n")
}

func (b *syncBuf) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}
