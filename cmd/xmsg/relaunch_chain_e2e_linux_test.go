//go:build linux

package main

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/xmsg/xmsg/internal/daemontest"
)

// proc is one process as /proc shows it: enough to name it across a pid's reuse.
type proc struct {
	pid   int
	start string
	args  string
}

// procStat reads a process's parent, state and start time.
func procStat(pid int) (ppid int, state, start string, ok bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, "", "", false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, "", "", false
	}
	f := strings.Fields(s[i+1:]) // f[0] is field 3, state
	if len(f) < 20 {
		return 0, "", "", false
	}
	ppid, _ = strconv.Atoi(f[1])
	return ppid, f[0], f[19], true
}

// tree is root and every process below it (walking /proc by parent), root first.
func tree(root int) []proc {
	parent := map[int]int{}
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if ppid, _, _, ok := procStat(pid); ok {
			parent[pid] = ppid
		}
	}
	var out []proc
	var walk func(pid int)
	walk = func(pid int) {
		_, state, start, ok := procStat(pid)
		if !ok || state == "Z" {
			return
		}
		cmdline, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
		out = append(out, proc{pid: pid, start: start, args: strings.ReplaceAll(string(cmdline), "\x00", " ")})
		for child, p := range parent {
			if p == pid {
				walk(child)
			}
		}
	}
	walk(root)
	return out
}

// alive reports whether p still runs (neither gone, nor a zombie, nor its pid reused).
func (p proc) alive() bool {
	_, state, start, ok := procStat(p.pid)
	return ok && state != "Z" && start == p.start
}

// serves counts the `serve` processes of ps.
func serves(ps []proc) int {
	n := 0
	for _, p := range ps {
		if strings.Contains(" "+p.args+" ", " serve ") && !strings.Contains(p.args, "__relaunch") {
			n++
		}
	}
	return n
}

// relaunches replaces the watched session directory n times (one atomic exchange with a fresh
// directory: one change, and never a moment without it), each time waiting for the next daemon
// to serve.
func relaunches(t *testing.T, d *daemon, n int) {
	t.Helper()
	for i := 0; i < n; i++ {
		before := strings.Count(d.stderr.String(), "msg=serving")
		fresh := d.sess + ".new"
		if err := os.Mkdir(fresh, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := unix.Renameat2(unix.AT_FDCWD, fresh, unix.AT_FDCWD, d.sess, unix.RENAME_EXCHANGE); err != nil {
			t.Fatal(err)
		}
		daemontest.WaitFor(t, "relaunch "+strconv.Itoa(i+1), func() bool {
			return strings.Count(d.stderr.String(), "msg=serving") > before
		})
		os.RemoveAll(fresh) // the replaced one
	}
}

// waitGone waits until none of ps runs.
func waitGone(t *testing.T, ps []proc) {
	t.Helper()
	daemontest.WaitFor(t, "every process of the chain to end", func() bool {
		for _, p := range ps {
			if p.alive() {
				return false
			}
		}
		return true
	})
}

// waitExit waits for the process the test started to exit and returns its status (bounded: a
// chain that does not stop fails the test, and killLeft ends what is left). It waits for the
// process only, not for its stderr, which a daemon left behind would hold open.
func waitExit(t *testing.T, d *daemon) int {
	t.Helper()
	d.stopped = true
	done := make(chan int, 1)
	go func() {
		st, err := d.cmd.Process.Wait()
		if err != nil {
			done <- -1
			return
		}
		done <- st.ExitCode()
	}()
	select {
	case code := <-done:
		return code
	case <-time.After(daemontest.Wait):
		d.cmd.Process.Kill()
		t.Fatalf("the first process did not exit\n%s", d.stderr)
		return -1
	}
}

// killLeft ends, at the test's end, whatever of ps a failed test left running.
func killLeft(t *testing.T, ps *[]proc) {
	t.Cleanup(func() {
		for _, p := range *ps {
			if p.alive() {
				syscall.Kill(p.pid, syscall.SIGKILL)
			}
		}
	})
}

func relaunchDaemon(t *testing.T) *daemon {
	t.Setenv("XMSG_TEST_RELAUNCH_SETTLE", "20ms")
	return newDaemon(t)
}

// TestRelaunchChainStaysSmall: ten relaunches (the watched session directory replaced ten
// times) leave the process the test started (the first daemon, waiting), the relaunch helper
// and the current daemon: two `serve` processes and one helper, not one more per relaunch.
func TestRelaunchChainStaysSmall(t *testing.T) {
	d := relaunchDaemon(t)
	var seen []proc
	killLeft(t, &seen)
	relaunches(t, d, 10)
	if n := strings.Count(d.stderr.String(), `msg="sockets handed over`); n != 10 {
		t.Fatalf("want 10 handovers, got %d:\n%s", n, d.stderr)
	}
	ps := tree(d.cmd.Process.Pid)
	seen = ps
	var lines []string
	for _, p := range ps {
		lines = append(lines, strconv.Itoa(p.pid)+" "+p.args)
	}
	if got := serves(ps); got != 2 || len(ps) != 3 {
		t.Fatalf("after 10 relaunches: %d processes, %d of them serve; want 3 (the first daemon, the helper, the current daemon), 2 serving:\n%s",
			len(ps), got, strings.Join(lines, "\n"))
	}
	// Still one bus: it answers, and its metrics count the relaunches of its chain.
	if status, _ := d.do("GET", "/healthz", ""); status != 200 {
		t.Fatalf("healthz after 10 relaunches: %d", status)
	}
	if v, raw := metric(t, d, "xmsg_relaunches"); v != 10 {
		t.Errorf("xmsg_relaunches %v after 10 relaunches:\n%s", v, raw)
	}
}

// TestRelaunchChainStops: after relaunches, a SIGTERM to the first process of the chain, to
// the helper or to the last (the current daemon) ends every process of it, the first with
// status 0; so does a SIGTERM to the helper before any relaunch, and a SIGKILL of the helper
// (the current daemon dies with it; the first then ends with the helper's status).
func TestRelaunchChainStops(t *testing.T) {
	for _, c := range []struct {
		name       string
		relaunches int
		sig        syscall.Signal
		to         func(ps []proc) int
		wantExit   int
	}{
		{"first", 2, syscall.SIGTERM, func(ps []proc) int { return ps[0].pid }, 0},
		{"last", 2, syscall.SIGTERM, func(ps []proc) int { return ps[len(ps)-1].pid }, 0},
		{"helper", 2, syscall.SIGTERM, func(ps []proc) int { return ps[1].pid }, 0},
		{"helper before a relaunch", 0, syscall.SIGTERM, func(ps []proc) int { return ps[1].pid }, 0},
		{"helper killed", 2, syscall.SIGKILL, func(ps []proc) int { return ps[1].pid }, 128 + int(syscall.SIGKILL)},
	} {
		t.Run(c.name, func(t *testing.T) {
			d := relaunchDaemon(t)
			var ps []proc
			killLeft(t, &ps)
			relaunches(t, d, c.relaunches)
			ps = tree(d.cmd.Process.Pid)
			if want := 2 + min(c.relaunches, 1); len(ps) != want {
				t.Fatalf("want %d processes in the chain, got %v", want, ps)
			}
			syscall.Kill(c.to(ps), c.sig)
			if got := waitExit(t, d); got != c.wantExit {
				t.Errorf("the first process exited %d, want %d\n%s", got, c.wantExit, d.stderr)
			}
			waitGone(t, ps)
			if c.sig == syscall.SIGKILL {
				return // the killed helper's daemon had no say in the socket files
			}
			if _, err := os.Stat(d.sock("http")); !os.IsNotExist(err) {
				t.Errorf("http.sock after the stop: %v; want it removed", err)
			}
		})
	}
}

// TestGoRunStopsTheDaemon: under `go run`, which dies of SIGTERM without passing it on, the
// daemon stops with it (and so does a relaunch chain started that way).
func TestGoRunStopsTheDaemon(t *testing.T) {
	base := shortTemp(t)
	goExe := filepath.Join(base, "go")
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Link(self, goExe); err != nil {
		t.Skipf("cannot link the test binary as go: %v", err)
	}
	for _, relaunched := range []int{0, 2} {
		t.Run(strconv.Itoa(relaunched)+" relaunches", func(t *testing.T) {
			t.Setenv("XMSG_TEST_RELAUNCH_SETTLE", "20ms")
			d := &daemon{t: t, launcher: goExe}
			b := shortTemp(t)
			d.rt, d.db, d.sess = filepath.Join(b, "rt"), filepath.Join(b, "state", "xmsg.db"), filepath.Join(b, "sessions")
			os.Mkdir(d.rt, 0o700)
			os.Mkdir(d.sess, 0o700)
			d.env = []string{"XDG_RUNTIME_DIR=" + d.rt, "HOME=" + b}
			d.args = []string{"serve", "--db-path", d.db, "--sessions-dir", d.sess, "--host-label", "testhost"}
			d.start()
			t.Cleanup(d.stop)
			var ps []proc
			killLeft(t, &ps)
			relaunches(t, d, relaunched)
			ps = tree(d.cmd.Process.Pid)
			if serves(ps) == 0 {
				t.Fatalf("no daemon under the go stand-in: %v", ps)
			}
			d.cmd.Process.Signal(syscall.SIGTERM)
			waitExit(t, d)
			waitGone(t, ps)
			daemontest.WaitFor(t, "the daemon's stopped line", func() bool {
				return strings.Count(d.stderr.String(), "msg=stopped") == relaunched+1
			})
		})
	}
}
