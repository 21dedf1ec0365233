package systemd

import (
	"net"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

const fedDropIn = "examples/xmsg@public.service.d/federation.conf"

// TestFederationDropIn checks the federating tier's drop-in key by key: it relaxes only what
// federation needs (the host's network, IPv4/IPv6 sockets) and narrows both (one bind port,
// the peers' addresses), and it never resets a restriction of the template.
func TestFederationDropIn(t *testing.T) {
	u := parseUnit(t, fedDropIn)
	s := u["Service"]

	// ExecStart= is reset, then set once: the template's command plus --fed-listen.
	exec := s["ExecStart"]
	if len(exec) != 2 || exec[0] != "" {
		t.Fatalf("ExecStart: got %q, want a reset (empty) and one command", exec)
	}
	args := strings.Fields(exec[1])
	if !slices.Contains(args, "--require-landlock") || args[0] != "/usr/local/bin/xmsg" || args[1] != "serve" {
		t.Errorf("ExecStart: got %q, want the template's `xmsg serve --require-landlock` plus --fed-listen", exec[1])
	}
	var listen string
	for _, a := range args {
		if v, ok := strings.CutPrefix(a, "--fed-listen="); ok {
			listen = v
		}
	}
	host, port, err := net.SplitHostPort(listen)
	if err != nil || net.ParseIP(host) == nil || net.ParseIP(host).IsUnspecified() {
		t.Fatalf("--fed-listen=%q: want a specific IP:PORT (%v)", listen, err)
	}

	for _, tt := range []struct{ key, want string }{
		{"PrivateNetwork", "no"},
		{"RestrictAddressFamilies", "AF_INET AF_INET6"},
		{"SocketBindDeny", "any"},
		// the listener's port only, over the listener's family
		{"SocketBindAllow", "ipv4:tcp:" + port},
	} {
		if got := s[tt.key]; len(got) != 1 || got[0] != tt.want {
			t.Errorf("%s: got %q, want exactly %q", tt.key, got, tt.want)
		}
	}
	if net.ParseIP(host).To4() == nil {
		t.Errorf("--fed-listen host %s is not IPv4, but SocketBindAllow= says ipv4", host)
	}
	allow := s["IPAddressAllow"]
	if len(allow) == 0 {
		t.Error("IPAddressAllow: missing; with IPAddressDeny=any no peer is reachable")
	}
	for _, a := range allow {
		for _, f := range strings.Fields(a) {
			if f == "any" || strings.HasSuffix(f, "/0") || strings.Contains(f, "localhost") || strings.Contains(f, "link-local") || strings.Contains(f, "multicast") {
				t.Errorf("IPAddressAllow=%s: want the peers' addresses, not a whole range", f)
			}
		}
	}
	// An empty assignment resets a list in systemd: IPAddressDeny= would undo the template's
	// deny-all, RestrictAddressFamilies= would allow every family, SystemCallFilter= every call.
	for _, key := range []string{"IPAddressDeny", "RestrictAddressFamilies", "SystemCallFilter", "SocketBindDeny", "ReadOnlyPaths", "CapabilityBoundingSet"} {
		for _, v := range s[key] {
			if strings.TrimSpace(v) == "" {
				t.Errorf("%s= (empty) resets the template's restriction", key)
			}
		}
	}
	// Nothing else in [Service]: every other hardening key stays the template's.
	for key := range s {
		switch key {
		case "ExecStart", "PrivateNetwork", "RestrictAddressFamilies", "SocketBindAllow", "SocketBindDeny", "IPAddressAllow":
		default:
			t.Errorf("%s: the federation drop-in sets a key beyond what federation needs", key)
		}
	}
}

// fedRoot lays out what a federating tier's host has: the template units and the example
// drop-ins as /etc/systemd/system/xmsg@public.service.d/.
func fedRoot(t *testing.T) string {
	t.Helper()
	root := t.TempDir()
	unitDir := filepath.Join(root, "etc", "systemd", "system")
	dropDir := filepath.Join(unitDir, "xmsg@public.service.d")
	if err := os.MkdirAll(dropDir, 0o755); err != nil {
		t.Fatal(err)
	}
	units, _ := filepath.Glob("xmsg*@.*")
	drops, _ := filepath.Glob("examples/xmsg@public.service.d/*.conf")
	if len(units) != 4 || len(drops) < 2 {
		t.Fatalf("units %q, drop-ins %q: want 4 units and the credentials and federation drop-ins", units, drops)
	}
	for _, f := range units {
		copyFile(t, f, filepath.Join(unitDir, filepath.Base(f)))
	}
	for _, f := range drops {
		copyFile(t, f, filepath.Join(dropDir, filepath.Base(f)))
	}
	return root
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	b, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestAnalyzeVerifyFederation runs systemd-analyze verify on the instance xmsg@public.service
// with its drop-ins: a misspelled key there (SocketBindAlow=) is only a warning to systemd,
// so any output at all fails.
func TestAnalyzeVerifyFederation(t *testing.T) {
	root := fedRoot(t)
	unitDir := filepath.Join(root, "etc", "systemd", "system")
	out, err := analyzeEnv(t, []string{"SYSTEMD_UNIT_PATH=" + unitDir + ":"}, "verify", "--man=no", filepath.Join(unitDir, "xmsg@public.service"))
	if err != nil || strings.TrimSpace(out) != "" {
		t.Errorf("systemd-analyze verify xmsg@public.service with drop-ins: err=%v, output:\n%s", err, out)
	}

	// Positive control: the same run does report a misspelled key in a drop-in.
	bad := filepath.Join(unitDir, "xmsg@public.service.d", "typo.conf")
	if err := os.WriteFile(bad, []byte("[Service]\nSocketBindAlow=tcp:1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	out, _ = analyzeEnv(t, []string{"SYSTEMD_UNIT_PATH=" + unitDir + ":"}, "verify", "--man=no", filepath.Join(unitDir, "xmsg@public.service"))
	if !strings.Contains(out, "SocketBindAlow") {
		t.Errorf("control: verify did not report the misspelled key in a drop-in; output:\n%s", out)
	}
}

var findingLine = regexp.MustCompile(`^(?:✗|-) (\S+)`)

// securityFindings returns the exposure and the keys systemd-analyze marks as exposed.
func securityFindings(t *testing.T, out string) (float64, []string) {
	t.Helper()
	m := exposureLine.FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("systemd-analyze security: no exposure line:\n%s", out)
	}
	got, err := strconv.ParseFloat(m[1], 64)
	if err != nil {
		t.Fatalf("exposure %q: %v", m[1], err)
	}
	var keys []string
	for _, line := range strings.Split(out, "\n") {
		if f := findingLine.FindStringSubmatch(line); f != nil {
			keys = append(keys, f[1])
		}
	}
	return got, keys
}

// The findings of the template (exposure 0.5): the relaxations every tier has, each explained
// in xmsg@.service (PrivateUsers=no and ProtectProc= for attestation, AF_UNIX for the
// sockets, the root directory shared with the host, /dev/rtc that ProtectClock= implies).
var templateFindings = []string{"RootDirectory=/RootImage=", "RestrictAddressFamilies=~AF_UNIX", "ProtectProc=", "PrivateUsers=", "DeviceAllow="}

// federationFindings are what federation adds, and why no narrower setting exists:
//   - PrivateNetwork= (0.5): the daemon dials its peers; a private network namespace holds
//     only loopback. SocketBindAllow=/IPAddressAllow= narrow the host's namespace instead.
//   - RestrictAddressFamilies=~AF_(INET|INET6) (0.3): TCP needs AF_INET/AF_INET6; the daemon's
//     seccomp filter narrows them to plain TCP and Landlock to the configured ports.
//   - IPAddressDeny= (0.1): the allow list has non-localhost entries because the peers are
//     other hosts; it holds nothing but them.
var federationFindings = []string{"PrivateNetwork=", "RestrictAddressFamilies=~AF_(INET|INET6)", "IPAddressDeny="}

// TestAnalyzeSecurityFederation scores the federating tier (template + example drop-ins, loaded
// by systemd itself with --root). The target is 1.0; it scores 1.3, and the test pins
// why: exactly the template's findings plus the three above, so that any further relaxation
// (or a new finding) fails.
func TestAnalyzeSecurityFederation(t *testing.T) {
	root := fedRoot(t)
	out, _ := analyzeEnv(t, nil, "security", "--offline=true", "--no-pager", "--root="+root, "xmsg@public.service")
	got, keys := securityFindings(t, out)
	t.Logf("exposure of the federating xmsg@public.service: %.1f; findings %q", got, keys)
	want := slices.Concat(templateFindings, federationFindings)
	slices.Sort(keys)
	slices.Sort(want)
	if !slices.Equal(keys, want) {
		t.Errorf("findings: got %q, want %q", keys, want)
	}
	if got > 1.3 {
		t.Errorf("exposure: got %.1f, want <= 1.3", got)
	}

	// Positive control: the drop-in's narrowing is what keeps it there. Without
	// IPAddressAllow= narrowing (allow any), the IPAddressDeny= finding grows.
	drop := filepath.Join(root, "etc", "systemd", "system", "xmsg@public.service.d", "federation.conf")
	b, err := os.ReadFile(drop)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(drop, append(b, []byte("IPAddressDeny=\n")...), 0o644); err != nil {
		t.Fatal(err)
	}
	out, _ = analyzeEnv(t, nil, "security", "--offline=true", "--no-pager", "--root="+root, "xmsg@public.service")
	if mutant, _ := securityFindings(t, out); mutant <= got {
		t.Errorf("control: IPAddressDeny= reset scored %.1f, want more than %.1f", mutant, got)
	}
}
