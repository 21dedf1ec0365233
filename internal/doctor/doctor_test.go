package doctor

import (
	"os"
	"reflect"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/xmsg/xmsg/internal/peercred"
	"github.com/xmsg/xmsg/internal/sandbox"
)

func TestLines(t *testing.T) {
	tests := []struct {
		desc string
		f    Facts
		want []string
	}{
		{
			desc: "hardened daemon under systemd",
			f: Facts{
				Daemon: true, SocketActivation: true, PeerGate: true,
				Landlock:    "landlock: abi=7 fs=enforced net=enforced scope=enforced",
				LandlockABI: 7, Credentials: "credentials-directory",
				Notify: true, Watchdog: 30 * time.Second, Systemd: true,
			},
			want: []string{
				"socket activation: yes (systemd)",
				"peer gate: on (a connection from another uid is closed before a byte is read)",
				"landlock: abi=7 fs=enforced net=enforced scope=enforced",
				"credentials: LoadCredential= ($CREDENTIALS_DIRECTORY)",
				"sd_notify: yes (watchdog 30s)",
				"tcp listener: none",
				"systemd hardening: from the unit (systemd-analyze security shows it)",
			},
		},
		{
			desc: "systemd passed only some sockets",
			f: Facts{
				Daemon: true, SocketActivation: true, Missing: []string{"agent", "register"}, PeerGate: true,
				Landlock: "landlock: abi=4 fs=enforced net=partial scope=unavailable", LandlockABI: 4,
				Credentials: "none", Notify: true, Systemd: true,
			},
			want: []string{
				"socket activation: yes (systemd)",
				"socket activation: not passed by systemd, so not served: agent, register",
				"peer gate: on (a connection from another uid is closed before a byte is read)",
				"landlock: abi=4 fs=enforced net=partial scope=unavailable",
				"credentials: none loaded",
				"sd_notify: yes",
				"tcp listener: none",
				"systemd hardening: from the unit (systemd-analyze security shows it)",
			},
		},
		{
			desc: "bare run on a laptop: every fallback",
			f: Facts{
				Daemon: true, SocketDir: "/run/user/1000/xmsg", PeerGate: true,
				Landlock: "landlock: unavailable", Credentials: "path", TCPListen: "127.0.0.1:8787",
			},
			want: []string{
				"socket activation: no (self-bound sockets in /run/user/1000/xmsg)",
				"peer gate: on (a connection from another uid is closed before a byte is read)",
				"landlock: unavailable (running without it; --require-landlock would refuse to start)",
				"credentials: plain files named by flags (no $CREDENTIALS_DIRECTORY)",
				"sd_notify: no (NOTIFY_SOCKET unset; readiness is not signalled)",
				"tcp listener: 127.0.0.1:8787 (no peer-uid check on TCP)",
				"systemd hardening: none (not started by systemd)",
			},
		},
		{
			desc: "machine facts, no daemon",
			f:    Facts{Landlock: NotApplied, LandlockABI: 7, Credentials: "none"},
			want: []string{
				"socket activation: no (self-bound sockets in $XDG_RUNTIME_DIR/xmsg)",
				"peer gate: enforced by xmsg serve on every socket (no daemon reported here)",
				"landlock: not applied (the kernel offers ABI 7)",
				"credentials: no $CREDENTIALS_DIRECTORY (fallback: plain files named by flags)",
				"sd_notify: no (NOTIFY_SOCKET unset; readiness is not signalled)",
				"tcp listener: none",
				"systemd hardening: none (not started by systemd)",
			},
		},
		{
			desc: "machine without Landlock",
			f:    Facts{LandlockABI: 0},
			want: []string{
				"socket activation: no (self-bound sockets in $XDG_RUNTIME_DIR/xmsg)",
				"peer gate: enforced by xmsg serve on every socket (no daemon reported here)",
				"landlock: not applied (the kernel has no Landlock; --require-landlock would refuse to start)",
				"credentials: no $CREDENTIALS_DIRECTORY (fallback: plain files named by flags)",
				"sd_notify: no (NOTIFY_SOCKET unset; readiness is not signalled)",
				"tcp listener: none",
				"systemd hardening: none (not started by systemd)",
			},
		},
		{
			desc: "daemon with the peer gate off is shouted",
			f:    Facts{Daemon: true, Landlock: NotApplied, LandlockABI: 7, Credentials: "none"},
			want: []string{
				"socket activation: no (self-bound sockets in $XDG_RUNTIME_DIR/xmsg)",
				"peer gate: OFF",
				"landlock: not applied (the kernel offers ABI 7)",
				"credentials: none loaded",
				"sd_notify: no (NOTIFY_SOCKET unset; readiness is not signalled)",
				"tcp listener: none",
				"systemd hardening: none (not started by systemd)",
			},
		},
	}
	for _, tt := range tests {
		got := tt.f.Lines()
		if !reflect.DeepEqual(got, tt.want) {
			t.Errorf("%s:\ngot:\n  %s\nwant:\n  %s", tt.desc, strings.Join(got, "\n  "), strings.Join(tt.want, "\n  "))
		}
	}
}

func TestMachine(t *testing.T) {
	pid := strconv.Itoa(os.Getpid())
	tests := []struct {
		desc string
		env  map[string]string
		want Facts
	}{
		{
			desc: "bare shell",
			env:  map[string]string{},
			want: Facts{Credentials: "none"},
		},
		{
			desc: "under systemd",
			env: map[string]string{
				"LISTEN_FDS": "3", "NOTIFY_SOCKET": "/run/systemd/notify", "CREDENTIALS_DIRECTORY": "/run/credentials/xmsg@a.service",
				"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": pid, "INVOCATION_ID": "abc", "XDG_RUNTIME_DIR": "/run/xmsg-a",
			},
			want: Facts{
				SocketActivation: true, SocketDir: "/run/xmsg-a/xmsg", Credentials: "credentials-directory",
				Notify: true, Watchdog: 30 * time.Second, Systemd: true,
			},
		},
		{
			desc: "watchdog meant for another process",
			env:  map[string]string{"NOTIFY_SOCKET": "@notify", "WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "1"},
			want: Facts{Credentials: "none", Notify: true},
		},
		{
			desc: "malformed watchdog",
			env:  map[string]string{"WATCHDOG_USEC": "-5"},
			want: Facts{Credentials: "none"},
		},
		{
			desc: "overflowing watchdog",
			env:  map[string]string{"WATCHDOG_USEC": "18446744073709551615"},
			want: Facts{Credentials: "none"},
		},
	}
	vars := []string{"LISTEN_FDS", "NOTIFY_SOCKET", "CREDENTIALS_DIRECTORY", "WATCHDOG_USEC", "WATCHDOG_PID", "INVOCATION_ID", "XDG_RUNTIME_DIR"}
	for _, tt := range tests {
		t.Run(tt.desc, func(t *testing.T) {
			for _, v := range vars {
				t.Setenv(v, tt.env[v])
			}
			got := Machine()
			tt.want.Landlock = NotApplied
			tt.want.LandlockABI = sandbox.Probe()
			// This kernel offers both (the probes themselves are tested below).
			tt.want.SessionWatch, tt.want.Pidfd = "inotify available", "yes"
			tt.want.PtraceScope = PtraceScope() // read from the kernel (TestPtraceScope)
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("Machine() = %+v, want %+v", got, tt.want)
			}
		})
	}
}

// A leaf in a container: no systemd, no notify socket, no Landlock. Every fallback is named.
func TestLeafFallbackLines(t *testing.T) {
	f := Facts{Daemon: true, PeerGate: true, Leaf: "svc:matrix", SocketDir: "/run/shared/xmsg", Landlock: "landlock: unavailable",
		Credentials: "path", TCPListen: "127.0.0.1:7787"}
	got := strings.Join(f.Lines(), "\n")
	for _, want := range []string{
		"leaf: principal svc:matrix; only its http.sock, the leaf register socket and a --listen TCP listener, if any, are served",
		"socket activation: not used in leaf mode (the register socket is self-bound in /run/shared/xmsg)",
		"landlock: unavailable (running without it",
		"sd_notify: no (NOTIFY_SOCKET unset",
		"systemd hardening: none (not started by systemd)",
		"tcp listener: 127.0.0.1:7787 (no peer-uid check on TCP)",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("lines lack %q:\n%s", want, got)
		}
	}
	if strings.Contains(got, "socket activation: yes") || strings.Contains(got, "self-bound sockets in") {
		t.Errorf("a leaf reported the normal socket line:\n%s", got)
	}
}

// TestWatchAndLivenessLines: the two mechanisms a send's cost rests on get a line each when
// reported, naming the fallback when they are missing; unreported, no line.
func TestWatchAndLivenessLines(t *testing.T) {
	base := Facts{Daemon: true, PeerGate: true, Credentials: "none"}
	n := len(base.Lines())
	f := base
	f.SessionWatch, f.Pidfd = "watched by inotify (a request reads only what changed)", "yes"
	if got := f.Lines()[n:]; !reflect.DeepEqual(got, []string{
		"session dirs: watched by inotify (a request reads only what changed)",
		"process liveness: pidfd (a reused pid cannot pass for the process it replaced)",
	}) {
		t.Errorf("lines %q", got)
	}
	f.Pidfd = "function not implemented"
	if got := f.Lines()[n+1]; got != "process liveness: /proc read on every check (no pidfd: function not implemented)" {
		t.Errorf("fallback line %q", got)
	}
}

// TestProbesOnThisMachine: the probes Machine uses answer yes here (Linux with inotify and
// pidfd_open, as CI's kernel is), so a daemon here reports no fallback.
func TestProbesOnThisMachine(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("pidfd and inotify are Linux's")
	}
	if got := PidfdProbe(peercred.Proc{}); got != "yes" {
		t.Errorf("PidfdProbe = %q", got)
	}
	if got := PidfdProbe(peercred.Proc{Root: t.TempDir()}); got == "yes" {
		t.Errorf("PidfdProbe on an empty proc tree = yes")
	}
}
