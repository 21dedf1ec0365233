package systemd

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/xmsg/xmsg/internal/ostest"
)

// unit is a parsed unit file: section -> key -> values in file order. Repeated keys keep every
// value, which is how systemd treats list settings such as SystemCallFilter=.
type unit map[string]map[string][]string

func parseUnit(t *testing.T, path string) unit {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatalf("open unit: %v", err)
	}
	defer f.Close()
	u := unit{}
	section := ""
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		switch {
		case line == "" || strings.HasPrefix(line, "#") || strings.HasPrefix(line, ";"):
		case strings.HasPrefix(line, "[") && strings.HasSuffix(line, "]"):
			section = line[1 : len(line)-1]
			if u[section] == nil {
				u[section] = map[string][]string{}
			}
		default:
			k, v, ok := strings.Cut(line, "=")
			if !ok || section == "" {
				t.Fatalf("%s: malformed line %q", path, line)
			}
			u[section][k] = append(u[section][k], v)
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatalf("read unit: %v", err)
	}
	return u
}

// get returns the effective (last) value of a key, "" when absent.
func (u unit) get(section, key string) string {
	vs := u[section][key]
	if len(vs) == 0 {
		return ""
	}
	return vs[len(vs)-1]
}

func TestSocketUnits(t *testing.T) {
	for _, name := range []string{"http", "agent", "register"} {
		t.Run(name, func(t *testing.T) {
			u := parseUnit(t, "xmsg-"+name+"@.socket")
			tests := []struct{ section, key, want string }{
				{"Socket", "ListenStream", "/run/xmsg-%i/xmsg/" + name + ".sock"},
				// The daemon looks its fds up by these names, never by position.
				{"Socket", "FileDescriptorName", name},
				{"Socket", "Service", "xmsg@%i.service"},
				{"Socket", "SocketUser", "xmsg-%i"},
				{"Socket", "SocketGroup", "xmsg-%i"},
				{"Socket", "SocketMode", "0600"},
				{"Socket", "DirectoryMode", "0700"},
				// PartOf= would restart the socket with the service and reset waiting clients.
				{"Unit", "PartOf", ""},
				{"Install", "WantedBy", "sockets.target"},
			}
			for _, tt := range tests {
				if got := u.get(tt.section, tt.key); got != tt.want {
					t.Errorf("[%s] %s: got %q, want %q", tt.section, tt.key, got, tt.want)
				}
			}
			if got := len(u["Socket"]["ListenStream"]); got != 1 {
				t.Errorf("ListenStream count: got %d, want 1 (FileDescriptorName= names every fd of a unit)", got)
			}
		})
	}
}

func TestServiceUnit(t *testing.T) {
	u := parseUnit(t, "xmsg@.service")
	tests := []struct{ section, key, want string }{
		{"Unit", "Requires", "xmsg-http@%i.socket xmsg-agent@%i.socket xmsg-register@%i.socket"},
		{"Unit", "After", "xmsg-http@%i.socket xmsg-agent@%i.socket xmsg-register@%i.socket"},
		{"Service", "Type", "notify"},
		{"Service", "NotifyAccess", "main"},
		{"Service", "ExecStart", "/usr/local/bin/xmsg serve --require-landlock"},
		{"Service", "User", "xmsg-%i"},
		{"Service", "Group", "xmsg-%i"},
		{"Service", "Environment", "XDG_RUNTIME_DIR=/run/xmsg-%i"},
		{"Service", "StateDirectory", "xmsg-%i"},
		{"Service", "StateDirectoryMode", "0700"},
		{"Service", "UMask", "0077"},
		{"Service", "NoNewPrivileges", "yes"},
		{"Service", "CapabilityBoundingSet", ""},
		{"Service", "ProtectSystem", "strict"},
		{"Service", "ReadOnlyPaths", "/run"},
		{"Service", "PrivateNetwork", "yes"},
		{"Service", "RestrictAddressFamilies", "AF_UNIX"},
		{"Service", "IPAddressDeny", "any"},
		// invisible would hide every client from the Landlocked daemon (see the unit).
		{"Service", "ProtectProc", ""},
		{"Service", "ProcSubset", "pid"},
		{"Service", "Restart", "on-failure"},
		// A refused store (exit 65, cmd/xmsg exitStoreRefused) is refused again at every
		// restart: no loop.
		{"Service", "RestartPreventExitStatus", "65"},
		// The daemon pets the watchdog at half the interval; vmtests/nspawn stops one and
		// watches systemd restart it.
		{"Service", "WatchdogSec", "20s"},
	}
	for _, tt := range tests {
		if got := u.get(tt.section, tt.key); got != tt.want {
			t.Errorf("[%s] %s: got %q, want %q", tt.section, tt.key, got, tt.want)
		}
	}
	// The template must carry no credentials and no secrets: per-tier drop-ins add them.
	if got := u["Service"]["LoadCredential"]; len(got) != 0 {
		t.Errorf("LoadCredential in the template: got %q, want none", got)
	}
	// systemd 252 puts the Landlock calls and seccomp(2) in no group that @system-service
	// includes, so they must be listed: the daemon sandboxes itself with them.
	filters := strings.Join(u["Service"]["SystemCallFilter"], " ")
	for _, sc := range []string{"landlock_create_ruleset", "landlock_add_rule", "landlock_restrict_self", "seccomp"} {
		if !strings.Contains(filters, sc) {
			t.Errorf("SystemCallFilter: %s missing from %q", sc, filters)
		}
	}
	if got := u.get("Service", "TimeoutStopSec"); got == "" || got == "infinity" {
		t.Errorf("TimeoutStopSec: got %q, want a bounded value", got)
	}
}

var tierLine = regexp.MustCompile(`^u\s+xmsg-([a-z0-9-]+)\s`)

// TestTierSnippets checks that every tier user of sysusers.d has both runtime directories in
// tmpfiles.d, 0700 and owned by itself: a root-owned socket directory makes the daemon refuse
// to start.
func TestTierSnippets(t *testing.T) {
	users, err := os.ReadFile("sysusers.d/xmsg.conf")
	if err != nil {
		t.Fatal(err)
	}
	tmp, err := os.ReadFile("tmpfiles.d/xmsg.conf")
	if err != nil {
		t.Fatal(err)
	}
	dirs := map[string]string{} // path -> "mode user group"
	for _, line := range strings.Split(string(tmp), "\n") {
		f := strings.Fields(line)
		if len(f) >= 5 && f[0] == "d" {
			dirs[f[1]] = strings.Join(f[2:5], " ")
		}
	}
	var tiers []string
	for _, line := range strings.Split(string(users), "\n") {
		if m := tierLine.FindStringSubmatch(line); m != nil {
			tiers = append(tiers, m[1])
		}
	}
	if len(tiers) < 2 {
		t.Fatalf("tiers in sysusers.d: got %q, want at least public and trusted", tiers)
	}
	for _, tier := range tiers {
		user := "xmsg-" + tier
		for _, dir := range []string{"/run/" + user, "/run/" + user + "/xmsg"} {
			want := "0700 " + user + " " + user
			if got := dirs[dir]; got != want {
				t.Errorf("tmpfiles.d %s: got %q, want %q", dir, got, want)
			}
		}
	}
}

// analyze runs systemd-analyze in a private mount namespace with a tmpfs on /run (it writes
// there even offline) and a tmpfs on /usr/local/bin holding a stand-in xmsg binary (verify
// checks that ExecStart= names an executable). Needs root for unshare -m.
func analyze(t *testing.T, args ...string) (string, error) {
	t.Helper()
	return analyzeEnv(t, nil, args...)
}

// analyzeEnv is analyze with extra environment variables (e.g. SYSTEMD_UNIT_PATH).
func analyzeEnv(t *testing.T, env []string, args ...string) (string, error) {
	t.Helper()
	ostest.RequireTool(t, "systemd-analyze")
	ostest.RequireTool(t, "unshare")
	ostest.Need(t, os.Geteuid() == 0, "root (systemd-analyze runs in a private mount namespace)")
	script := `set -e
mount -t tmpfs -o mode=0755 xmsg-analyze /run
mount -t tmpfs -o mode=0755 xmsg-analyze /usr/local/bin
cp /bin/true /usr/local/bin/xmsg
exec systemd-analyze "$@"`
	cmd := exec.Command("unshare", append([]string{"-m", "--propagation", "private", "sh", "-c", script, "sh"}, args...)...)
	cmd.Env = append(append(os.Environ(), "SYSTEMD_PAGER=", "SYSTEMD_COLORS=0", "LC_ALL=C"), env...)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

func TestAnalyzeVerify(t *testing.T) {
	units, err := filepath.Glob("xmsg*@.*")
	if err != nil || len(units) != 4 {
		t.Fatalf("units: got %q (%v), want 4", units, err)
	}
	out, err := analyze(t, append([]string{"verify", "--man=no"}, units...)...)
	// verify reports unknown keys and bad values as warnings with exit status 0: any output
	// at all is a finding.
	if err != nil || strings.TrimSpace(out) != "" {
		t.Errorf("systemd-analyze verify: err=%v, output:\n%s", err, out)
	}
}

var exposureLine = regexp.MustCompile(`Overall exposure level for \S+: ([0-9.]+)`)

func TestAnalyzeSecurity(t *testing.T) {
	// --threshold uses a 0-100 scale: 10 is an exposure of 1.0.
	out, err := analyze(t, "security", "--offline=true", "--threshold=10", "--no-pager", "xmsg@.service")
	m := exposureLine.FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("systemd-analyze security: no exposure line (err=%v):\n%s", err, out)
	}
	got, perr := strconv.ParseFloat(m[1], 64)
	if perr != nil {
		t.Fatalf("exposure %q: %v", m[1], perr)
	}
	t.Logf("exposure of xmsg@.service: %.1f", got)
	if got > 1.0 || err != nil {
		t.Errorf("exposure: got %.1f (err=%v), want <= 1.0; findings:\n%s", got, err, findings(out))
	}
}

// findings keeps the lines systemd-analyze marks as exposed.
func findings(out string) string {
	var b strings.Builder
	for _, line := range strings.Split(out, "\n") {
		if strings.HasPrefix(line, "✗") {
			fmt.Fprintln(&b, line)
		}
	}
	return b.String()
}
