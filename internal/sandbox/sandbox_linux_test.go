//go:build linux

package sandbox

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/xmsg/xmsg/internal/ostest"
)

// The tests apply real Landlock in a child process (the test binary re-executed, the
// go-landlock way), because a sandbox cannot be lifted again. The child applies the
// policy it is given, then runs probes and prints their outcomes as JSON: "ok" or the
// errno name. Every allowed access is paired with a denied one.

const childEnv = "XMSG_SANDBOX_TEST_CHILD" // the childSpec, as JSON

type childSpec struct {
	Policy        Policy
	Probes        []probe
	DisableFilter bool // make the socket filter fail, to show the gap it closes
	BlockLandlock bool // refuse the landlock system calls with EPERM, as SystemCallFilter= can
}

type probe struct {
	Name string
	Op   string
	Path string
	Port int
	Addr string
}

type childResult struct {
	Report    Report
	Err       string
	Outcomes  map[string]string
	MainTID   int
	ThreadTID int
}

func TestMain(m *testing.M) {
	ostest.Main(m, ostest.Roles{"sandboxed": func() int { return runChild(os.Getenv(childEnv)) }})
}

// runChild is the child side: apply, probe, report on stdout.
func runChild(specJSON string) int {
	var spec childSpec
	if err := json.Unmarshal([]byte(specJSON), &spec); err != nil {
		fmt.Fprintln(os.Stderr, "child: bad spec:", err)
		return 2
	}
	// Pin the applying goroutine to one thread, and start a second locked thread
	// before Apply: the thread probes then show that a thread which existed before
	// the restriction, and is not the one that applied it, is restricted too.
	runtime.LockOSThread()
	res := childResult{Outcomes: map[string]string{}, MainTID: unix.Gettid()}
	type req struct {
		path string
		out  chan string
	}
	reqs := make(chan req)
	tid := make(chan int)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread stays this goroutine's
		tid <- unix.Gettid()
		for r := range reqs {
			_, err := os.ReadFile(r.path)
			r.out <- outcome(err)
		}
	}()
	res.ThreadTID = <-tid

	if spec.BlockLandlock {
		if err := blockLandlock(); err != nil {
			fmt.Fprintln(os.Stderr, "child: block landlock:", err)
			return 2
		}
	}
	if spec.DisableFilter {
		installFilter = func() error { return errors.New("disabled by the test") }
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	r, err := Apply(spec.Policy, log)
	res.Report = r
	if err != nil {
		res.Err = err.Error()
	}
	for _, p := range spec.Probes {
		var err error
		switch p.Op {
		case "thread_read":
			out := make(chan string)
			reqs <- req{p.Path, out}
			res.Outcomes[p.Name] = <-out
			continue
		case "new_thread_read":
			out := make(chan string)
			go func() {
				runtime.LockOSThread()
				_, err := os.ReadFile(p.Path)
				out <- outcome(err)
			}()
			res.Outcomes[p.Name] = <-out
			continue
		default:
			err = runProbe(p)
		}
		res.Outcomes[p.Name] = outcome(err)
	}
	if err := json.NewEncoder(os.Stdout).Encode(res); err != nil {
		return 2
	}
	return 0
}

// blockLandlock makes landlock_create_ruleset fail with EPERM in this process, as a
// systemd unit whose SystemCallFilter= lacks it does.
func blockLandlock() error {
	arch, ok := filterArch()
	if !ok {
		return fmt.Errorf("unsupported architecture %s", runtime.GOARCH)
	}
	prog, err := assemble([]insn{
		ld(offArch),
		jeq(arch, "", "allow"),
		ld(offNr),
		jeq(unix.SYS_LANDLOCK_CREATE_RULESET, "", "allow"),
		ret("eperm", unix.SECCOMP_RET_ERRNO|uint32(unix.EPERM)),
		ret("allow", unix.SECCOMP_RET_ALLOW),
	})
	if err != nil {
		return err
	}
	return installSeccomp(prog)
}

func runProbe(p probe) error {
	switch p.Op {
	case "read":
		_, err := os.ReadFile(p.Path)
		return err
	case "list":
		_, err := os.ReadDir(p.Path)
		return err
	case "write":
		f, err := os.OpenFile(p.Path, os.O_WRONLY|os.O_APPEND, 0)
		if err != nil {
			return err
		}
		defer f.Close()
		_, err = f.WriteString("x")
		return err
	case "create":
		return os.WriteFile(p.Path, []byte("x"), 0o600)
	case "connect":
		return tcp(unix.IPPROTO_TCP, p.Port, unix.Connect)
	case "connect_mptcp":
		return tcp(unix.IPPROTO_MPTCP, p.Port, unix.Connect)
	case "bind":
		return tcp(unix.IPPROTO_TCP, p.Port, unix.Bind)
	case "bind_mptcp":
		return tcp(unix.IPPROTO_MPTCP, p.Port, unix.Bind)
	case "listen":
		// net.Listen tries Multipath TCP first since Go 1.24.
		ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p.Port))
		if err != nil {
			return err
		}
		return ln.Close()
	case "dial":
		c, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", p.Port))
		if err != nil {
			return err
		}
		return c.Close()
	case "udp":
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM, 0)
		if err != nil {
			return err
		}
		return unix.Close(fd)
	case "io_uring":
		// io_uring_setup(1, NULL): EFAULT when the call is reachable, ENOSYS when not.
		_, _, errno := unix.Syscall(unix.SYS_IO_URING_SETUP, 1, 0, 0)
		if errno != 0 {
			return errno
		}
		return nil
	case "abstract":
		c, err := net.Dial("unix", p.Addr)
		if err != nil {
			return err
		}
		return c.Close()
	case "abstract_own":
		// A server created inside the sandbox is in the same domain: reachable.
		ln, err := net.Listen("unix", p.Addr)
		if err != nil {
			return err
		}
		defer ln.Close()
		c, err := net.Dial("unix", p.Addr)
		if err != nil {
			return err
		}
		return c.Close()
	case "unix":
		c, err := net.Dial("unix", p.Path)
		if err != nil {
			return err
		}
		return c.Close()
	case "kill_parent":
		return unix.Kill(os.Getppid(), 0)
	case "kill_self":
		return unix.Kill(os.Getpid(), 0)
	}
	return fmt.Errorf("unknown probe op %q", p.Op)
}

func tcp(proto, port int, op func(int, unix.Sockaddr) error) error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, proto)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	return op(fd, &unix.SockaddrInet4{Port: port, Addr: [4]byte{127, 0, 0, 1}})
}

// outcome is "ok" or the errno name (EACCES, EPERM, ...).
func outcome(err error) string {
	if err == nil {
		return "ok"
	}
	var errno syscall.Errno
	if errors.As(err, &errno) {
		if name := unix.ErrnoName(errno); name != "" {
			return name
		}
	}
	return err.Error()
}

// runInChild runs spec in a re-executed test binary and returns its result and stderr.
func runInChild(t *testing.T, spec childSpec) (childResult, string) {
	t.Helper()
	b, err := json.Marshal(spec)
	if err != nil {
		t.Fatal(err)
	}
	cmd := ostest.Command("", "sandboxed")
	cmd.Env = append(cmd.Env, childEnv+"="+string(b))
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("child: %v\nstderr:\n%s", err, stderr.String())
	}
	var res childResult
	if err := json.Unmarshal(stdout.Bytes(), &res); err != nil {
		t.Fatalf("child output %q: %v\nstderr:\n%s", stdout.String(), err, stderr.String())
	}
	return res, stderr.String()
}

// requireABI skips (or fails under CI=true) when the kernel lacks Landlock ABI want.
func requireABI(t *testing.T, want int) {
	t.Helper()
	got := Probe()
	ostest.Need(t, got >= want, fmt.Sprintf("Landlock ABI %d (the kernel offers %d)", want, got))
}

func checkOutcomes(t *testing.T, res childResult, want map[string]string) {
	t.Helper()
	if res.Err != "" {
		t.Fatalf("Apply in child: %s", res.Err)
	}
	for name, w := range want {
		if got := res.Outcomes[name]; got != w {
			t.Errorf("probe %s: got %q, want %q", name, got, w)
		}
	}
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestApplyFilesystem(t *testing.T) {
	requireABI(t, 3)
	ro, rw, outside := t.TempDir(), t.TempDir(), t.TempDir()
	roFile := filepath.Join(ro, "f")
	rwFile := filepath.Join(rw, "f")
	marker := filepath.Join(outside, "marker")
	roSingle := filepath.Join(outside, "single-file")
	writeFile(t, roFile, "ro")
	writeFile(t, rwFile, "rw")
	writeFile(t, marker, "marker")
	writeFile(t, roSingle, "single")
	missing := filepath.Join(ro, "not-yet-created")
	// Positive control: this uid can read the marker without the sandbox.
	if _, err := os.ReadFile(marker); err != nil {
		t.Fatalf("marker unreadable before the sandbox: %v", err)
	}

	res, stderr := runInChild(t, childSpec{
		Policy: Policy{ReadWrite: []string{rw}, ReadOnly: []string{ro, missing, roSingle}},
		Probes: []probe{
			{Name: "read_ro", Op: "read", Path: roFile},
			{Name: "list_ro", Op: "list", Path: ro},
			{Name: "write_ro", Op: "write", Path: roFile},
			{Name: "create_ro", Op: "create", Path: filepath.Join(ro, "new")},
			{Name: "read_ro_file_rule", Op: "read", Path: roSingle},
			{Name: "write_ro_file_rule", Op: "write", Path: roSingle},
			{Name: "read_rw", Op: "read", Path: rwFile},
			{Name: "write_rw", Op: "write", Path: rwFile},
			{Name: "create_rw", Op: "create", Path: filepath.Join(rw, "new")},
			{Name: "list_rw", Op: "list", Path: rw},
			{Name: "read_marker", Op: "read", Path: marker},
			{Name: "write_marker", Op: "write", Path: marker},
			{Name: "list_outside", Op: "list", Path: outside},
			{Name: "create_outside", Op: "create", Path: filepath.Join(outside, "new")},
			{Name: "thread_read_ro", Op: "thread_read", Path: roFile},
			{Name: "thread_read_marker", Op: "thread_read", Path: marker},
			{Name: "new_thread_read_ro", Op: "new_thread_read", Path: roFile},
			{Name: "new_thread_read_marker", Op: "new_thread_read", Path: marker},
		},
	})
	checkOutcomes(t, res, map[string]string{
		"read_ro":                "ok",
		"list_ro":                "ok",
		"write_ro":               "EACCES",
		"create_ro":              "EACCES",
		"read_ro_file_rule":      "ok",
		"write_ro_file_rule":     "EACCES",
		"read_rw":                "ok",
		"write_rw":               "ok",
		"create_rw":              "ok",
		"list_rw":                "ok",
		"read_marker":            "EACCES",
		"write_marker":           "EACCES",
		"list_outside":           "EACCES",
		"create_outside":         "EACCES",
		"thread_read_ro":         "ok",
		"thread_read_marker":     "EACCES",
		"new_thread_read_ro":     "ok",
		"new_thread_read_marker": "EACCES",
	})
	if res.MainTID == res.ThreadTID {
		t.Errorf("thread probe ran on the applying thread %d; it must run on another", res.MainTID)
	}
	if res.Report.FS != Enforced {
		t.Errorf("Report.FS = %q, want %q", res.Report.FS, Enforced)
	}
	// The missing path is skipped, with a line that names it and says why.
	if !strings.Contains(stderr, "landlock path skipped") || !strings.Contains(stderr, missing) ||
		!strings.Contains(stderr, "open file descriptor") {
		t.Errorf("stderr lacks the skip line for %s:\n%s", missing, stderr)
	}
	// The marker is untouched and still readable outside the sandbox.
	if b, err := os.ReadFile(marker); err != nil || string(b) != "marker" {
		t.Errorf("marker after child: %q, %v; want %q", b, err, "marker")
	}
}

// listen returns a plain TCP listener on 127.0.0.1 and its port.
func listen(t *testing.T) (net.Listener, int) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	return ln, ln.Addr().(*net.TCPAddr).Port
}

// freePort returns a TCP port that was free a moment ago.
func freePort(t *testing.T) int {
	t.Helper()
	ln, port := listen(t)
	ln.Close()
	return port
}

func TestApplyNetwork(t *testing.T) {
	requireABI(t, 4)
	_, listed := listen(t)
	_, unlisted := listen(t)
	bindListed, bindUnlisted := freePort(t), freePort(t)

	res, _ := runInChild(t, childSpec{
		Policy: Policy{BindTCP: []uint16{uint16(bindListed)}, ConnectTCP: []uint16{uint16(listed)}},
		Probes: []probe{
			{Name: "connect_listed", Op: "connect", Port: listed},
			{Name: "connect_unlisted", Op: "connect", Port: unlisted},
			{Name: "dial_listed", Op: "dial", Port: listed},
			{Name: "dial_unlisted", Op: "dial", Port: unlisted},
			{Name: "bind_listed", Op: "bind", Port: bindListed},
			{Name: "bind_unlisted", Op: "bind", Port: bindUnlisted},
			// Multipath TCP escapes Landlock's TCP rules; the socket filter refuses it.
			{Name: "connect_mptcp_unlisted", Op: "connect_mptcp", Port: unlisted},
			{Name: "bind_mptcp_unlisted", Op: "bind_mptcp", Port: bindUnlisted},
			// net.Listen tries MPTCP first, then falls back to TCP, which Landlock governs.
			{Name: "listen_listed", Op: "listen", Port: bindListed},
			{Name: "listen_unlisted", Op: "listen", Port: bindUnlisted},
			{Name: "udp", Op: "udp"},
			{Name: "io_uring", Op: "io_uring"},
		},
	})
	checkOutcomes(t, res, map[string]string{
		"connect_listed":         "ok",
		"connect_unlisted":       "EACCES",
		"dial_listed":            "ok",
		"dial_unlisted":          "EACCES",
		"bind_listed":            "ok",
		"bind_unlisted":          "EACCES",
		"connect_mptcp_unlisted": "EACCES",
		"bind_mptcp_unlisted":    "EACCES",
		"listen_listed":          "ok",
		"listen_unlisted":        "EACCES",
		"udp":                    "EACCES",
		"io_uring":               "ENOSYS",
	})
	if res.Report.Net != Enforced {
		t.Errorf("Report.Net = %q, want %q", res.Report.Net, Enforced)
	}
	// The startup line names the ports left open (federation: its listener and its peers).
	if got, want := res.Report.TCP, fmt.Sprintf("tcp_bind=%d tcp_connect=%d", bindListed, listed); got != want {
		t.Errorf("Report.TCP = %q, want %q", got, want)
	}
	// Control: outside the sandbox io_uring_setup is reachable (EFAULT for the NULL
	// params), so the ENOSYS above comes from the filter.
	if got := outcome(runProbe(probe{Op: "io_uring"})); got != "EFAULT" {
		t.Logf("io_uring_setup outside the sandbox: %s (io_uring disabled here)", got)
	}
}

// TestNetworkGapWithoutFilter is the control for the socket filter: with it disabled,
// Multipath TCP gets past Landlock's TCP rules on this kernel, and Apply reports the
// network as partial.
func TestNetworkGapWithoutFilter(t *testing.T) {
	requireABI(t, 4)
	if fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM, unix.IPPROTO_MPTCP); err != nil {
		t.Skipf("kernel has no Multipath TCP: %v", err)
	} else {
		unix.Close(fd)
	}
	_, unlisted := listen(t)
	res, stderr := runInChild(t, childSpec{
		DisableFilter: true,
		Probes: []probe{
			{Name: "connect_unlisted", Op: "connect", Port: unlisted},
			{Name: "connect_mptcp_unlisted", Op: "connect_mptcp", Port: unlisted},
		},
	})
	if res.Err != "" {
		t.Fatalf("Apply in child: %s", res.Err)
	}
	if res.Report.Net != Partial {
		t.Errorf("Report.Net without the filter = %q, want %q", res.Report.Net, Partial)
	}
	if !strings.Contains(stderr, "socket filter not installed") {
		t.Errorf("stderr lacks the filter warning:\n%s", stderr)
	}
	if got := res.Outcomes["connect_unlisted"]; got != "EACCES" {
		t.Errorf("connect_unlisted: got %q, want EACCES", got)
	}
	if got := res.Outcomes["connect_mptcp_unlisted"]; got != "ok" {
		t.Skipf("MPTCP connect without the filter: %q; this kernel applies Landlock's TCP rules to MPTCP", got)
	}
}

func TestApplyScope(t *testing.T) {
	requireABI(t, 6)
	name := fmt.Sprintf("@xmsg-sandbox-test-%d", os.Getpid())
	ln, err := net.Listen("unix", name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })

	res, _ := runInChild(t, childSpec{
		Probes: []probe{
			{Name: "abstract_outside", Op: "abstract", Addr: name},
			{Name: "abstract_inside", Op: "abstract_own", Addr: name + "-inside"},
			{Name: "kill_parent", Op: "kill_parent"},
			{Name: "kill_self", Op: "kill_self"},
		},
	})
	checkOutcomes(t, res, map[string]string{
		"abstract_outside": "EPERM",
		"abstract_inside":  "ok",
		"kill_parent":      "EPERM",
		"kill_self":        "ok",
	})
	if res.Report.Scope != Enforced {
		t.Errorf("Report.Scope = %q, want %q", res.Report.Scope, Enforced)
	}
}

// TestApplyConnectUnix: pathname Unix sockets (the Claude inbox sockets) are reachable
// only beneath ConnectUnix from ABI 9; below that Landlock does not govern them, and the
// rule must not break Apply.
func TestApplyConnectUnix(t *testing.T) {
	requireABI(t, 1)
	listed, unlisted := t.TempDir(), t.TempDir()
	for _, d := range []string{listed, unlisted} {
		ln, err := net.Listen("unix", filepath.Join(d, "inbox.sock"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ln.Close() })
	}
	res, _ := runInChild(t, childSpec{
		Policy: Policy{ConnectUnix: []string{listed}},
		Probes: []probe{
			{Name: "listed", Op: "unix", Path: filepath.Join(listed, "inbox.sock")},
			{Name: "unlisted", Op: "unix", Path: filepath.Join(unlisted, "inbox.sock")},
			{Name: "read_listed", Op: "list", Path: listed},
		},
	})
	want := map[string]string{"listed": "ok", "unlisted": "ok", "read_listed": "EACCES"}
	if Probe() >= 9 {
		want["unlisted"] = "EACCES"
	}
	checkOutcomes(t, res, want)
}

func TestApplyRequire(t *testing.T) {
	requireABI(t, 1)
	dir := t.TempDir()
	res, _ := runInChild(t, childSpec{
		Policy: Policy{ReadWrite: []string{dir}, Require: true},
		Probes: []probe{{Name: "read_outside", Op: "read", Path: "/etc/hostname"}},
	})
	want := plan(Probe(), true)
	if !want.Complete() {
		// This kernel cannot do it all: Require must refuse and restrict nothing.
		if res.Err == "" || res.Outcomes["read_outside"] != "ok" {
			t.Fatalf("Require on %v: err %q, read_outside %q; want an error and no restriction",
				want, res.Err, res.Outcomes["read_outside"])
		}
		return
	}
	if res.Err != "" {
		t.Fatalf("Require on a kernel that enforces all: %s", res.Err)
	}
	if got := res.Report.String(); got != want.String() {
		t.Errorf("Report = %q, want %q", got, want.String())
	}
	if !res.Report.Complete() {
		t.Errorf("Report %v not complete", res.Report)
	}
	if got := res.Outcomes["read_outside"]; got != "EACCES" {
		t.Errorf("read_outside: got %q, want EACCES", got)
	}
}

// TestApplyLandlockBlocked: when a seccomp filter refuses the landlock system calls (a
// unit whose SystemCallFilter= lacks them), best effort says so and why, and Require
// refuses before restricting anything.
func TestApplyLandlockBlocked(t *testing.T) {
	requireABI(t, 1)
	tests := []struct {
		require bool
		wantErr string
	}{
		{false, ""},
		{true, "require-landlock"},
	}
	for _, tt := range tests {
		res, stderr := runInChild(t, childSpec{
			BlockLandlock: true,
			Policy:        Policy{ReadOnly: []string{t.TempDir()}, Require: tt.require},
			Probes:        []probe{{Name: "read_outside", Op: "read", Path: "/proc/self/status"}},
		})
		if tt.wantErr == "" {
			if res.Err != "" {
				t.Errorf("best effort: Apply error %q, want none", res.Err)
			}
			if got, want := res.Report.String(), "landlock: unavailable"; got != want {
				t.Errorf("best effort: Report %q, want %q", got, want)
			}
			if !strings.Contains(stderr, "likely by a seccomp filter") {
				t.Errorf("best effort: stderr lacks the reason:\n%s", stderr)
			}
		} else if !strings.Contains(res.Err, tt.wantErr) || !strings.Contains(res.Err, "seccomp filter") {
			t.Errorf("require: Apply error %q, want one containing %q and the reason", res.Err, tt.wantErr)
		}
		// Nothing was restricted: reporting "unavailable" is the truth.
		if got := res.Outcomes["read_outside"]; got != "ok" {
			t.Errorf("require=%v: read_outside %q, want ok", tt.require, got)
		}
	}
}

func TestApplyRelativePath(t *testing.T) {
	requireABI(t, 1)
	res, _ := runInChild(t, childSpec{
		Policy: Policy{ReadOnly: []string{"relative/dir"}},
		Probes: []probe{{Name: "read_outside", Op: "read", Path: "/etc/hostname"}},
	})
	if !strings.Contains(res.Err, "not absolute") {
		t.Errorf("Apply error %q, want one about a path that is not absolute", res.Err)
	}
}

func TestProbe(t *testing.T) {
	got := Probe()
	if got < 0 || got > maxABI {
		t.Fatalf("Probe() = %d, want 0..%d", got, maxABI)
	}
	requireABI(t, 1)
	// Probing restricts nothing.
	if _, err := os.ReadFile("/proc/self/status"); err != nil {
		t.Errorf("after Probe: %v", err)
	}
}

func TestSocketFilterAssembles(t *testing.T) {
	for _, x32 := range []bool{false, true} {
		prog, err := socketFilter(unix.AUDIT_ARCH_X86_64, x32)
		if err != nil {
			t.Fatalf("socketFilter(x32=%v): %v", x32, err)
		}
		if last := prog[len(prog)-1]; last.Code != unix.BPF_RET|unix.BPF_K {
			t.Errorf("last instruction %+v is not a return", last)
		}
	}
	if _, err := assemble([]insn{jeq(1, "nowhere", "")}); err == nil {
		t.Error("assemble with an unknown label: got nil error")
	}
}
