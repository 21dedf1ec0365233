//go:build linux

package vmtests

// The nspawn stage: xmsg's own units (systemd/) under a real systemd, PID 1 of a
// systemd-nspawn container that boots the host's /usr on a tmpfs root (vmtests/nspawn), in
// both shapes a host runs them: as a Debian host (the files plus systemd/examples' drop-ins)
// and as NixOS (the same files plus the drop-ins nix/module.nix writes, rendered here when
// NIXPKGS_LIB names a nixpkgs lib). The scenarios live in vmtests/nspawn/in-container.sh, one
// property each; this file builds the payload, boots the container once, runs every scenario
// as a subtest and always tears the container down.

import (
	"bufio"
	"context"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/xmsg/xmsg/internal/fed/fedtest"
	"github.com/xmsg/xmsg/internal/ostest"
)

// nspawnScenarios are run in this order; later ones may rely on the daemons that earlier ones
// started, and each starts what it needs when run alone (go test -run 'TestNspawn/crash').
var nspawnScenarios = []string{"activation", "credentials", "hardening", "isolation", "crash", "watchdog", "nixos", "units", "fedunit", "federation", "custody", "relaunch", "refused"}

var nspawnTiers = []string{"public", "trusted"}

func TestNspawn(t *testing.T) {
	ostest.Need(t, os.Geteuid() == 0, "root (the nspawn stage)")
	for _, tool := range []string{"systemd-nspawn", "unshare", "nsenter", "setpriv", "systemd-id128"} {
		_, err := exec.LookPath(tool)
		ostest.Need(t, err == nil, tool+" on PATH (Debian: apt-get install --no-install-recommends systemd-container)")
	}
	// The harness puts nspawn into its own cgroup by hand, which a systemd host forbids
	// (there, `systemd-run --scope` would be the way); not needed on CI runners so far.
	comm, err := os.ReadFile("/proc/1/comm")
	ostest.Need(t, err != nil || strings.TrimSpace(string(comm)) != "systemd", "a host whose PID 1 is not systemd")
	start := time.Now()
	repo, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}

	payload, nixos := nspawnPayload(t, repo)
	// The federation scenario needs a daemon that federates: a build without it says so in
	// `xmsg serve --help` (and refuses --fed-listen).
	help, _ := exec.Command(filepath.Join(payload, "bin", "xmsg"), "serve", "--help").CombinedOutput()
	noFederation := strings.Contains(string(help), "not available in this build")
	// A fixed state directory, so that a run killed before its cleanup (a go test timeout
	// kills without running t.Cleanup) is torn down by the next one: `down` below, first.
	// Concurrent runs on one machine (several checkouts) each need their own:
	// XMSG_NSPAWN_STATE names it.
	state := filepath.Join(os.TempDir(), "xmsg-vmtest-nspawn")
	if s := os.Getenv("XMSG_NSPAWN_STATE"); s != "" {
		state = s
	}
	if err := os.MkdirAll(state, 0o700); err != nil {
		t.Fatal(err)
	}
	// One container per state directory at a time: a second run on the same machine (another
	// checkout, or a go test of several packages) waits here instead of tearing down the
	// first one's container. The lock goes with the process, so a killed run cannot leave it.
	lock, err := os.OpenFile(state+".lock", os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		t.Fatalf("nspawn state lock: %v", err)
	}
	harness := filepath.Join(repo, "vmtests", "nspawn", "harness.sh")
	env := append(os.Environ(), "STATE="+state, "PAYLOAD="+payload, "MACHINE=xmsg-vmtest")
	run := func(ctx context.Context, args ...string) (string, error) {
		cmd := exec.CommandContext(ctx, harness, args...)
		cmd.Env = env
		cmd.WaitDelay = 5 * time.Second
		// Its own process group: nothing the harness or the scenarios signal can reach the
		// test process by accident.
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		out, err := cmd.CombinedOutput()
		return string(out), err
	}

	t.Cleanup(func() {
		// Always, even when boot failed half-way: down only touches what $STATE records.
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		out, err := run(ctx, "down")
		if err != nil {
			t.Errorf("harness down: %v\n%s", err, out)
		}
		t.Logf("nspawn stage took %s", time.Since(start).Round(100*time.Millisecond))
	})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	if out, err := run(ctx, "down"); err != nil {
		t.Fatalf("harness down (leftovers of an earlier run): %v\n%s", err, out)
	}
	cancel()
	ctx, cancel = context.WithTimeout(context.Background(), 90*time.Second)
	out, err := run(ctx, "boot")
	cancel()
	t.Logf("boot:\n%s", out)
	if err != nil {
		if b, rerr := os.ReadFile(filepath.Join(state, "console.log")); rerr == nil {
			t.Logf("console.log:\n%s", b)
		}
		t.Fatalf("harness boot: %v", err)
	}
	inside := func(ctx context.Context, args ...string) (string, error) {
		return run(ctx, append([]string{"exec", "/bin/bash", "/xmsg-payload/in-container.sh"}, args...)...)
	}
	ctx, cancel = context.WithTimeout(context.Background(), 60*time.Second)
	out, err = inside(ctx, "setup")
	cancel()
	if err != nil {
		t.Fatalf("setup: %v\n%s", err, out)
	}

	for _, sc := range nspawnScenarios {
		t.Run(sc, func(t *testing.T) {
			if sc == "federation" && noFederation {
				t.Skip("this build of xmsg has no federation (serve --help: --fed-listen not available in this build)")
			}
			if sc == "nixos" && !nixos {
				t.Skip("NIXPKGS_LIB is not set: no NixOS drop-ins to boot (units checks the Debian shape only)")
			}
			ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
			defer cancel()
			begin := time.Now()
			out, err := inside(ctx, sc)
			t.Logf("%s (%s):\n%s", sc, time.Since(begin).Round(10*time.Millisecond), out)
			var failed []string
			lines := bufio.NewScanner(strings.NewReader(out))
			for lines.Scan() {
				if strings.HasPrefix(lines.Text(), "FAIL ") {
					failed = append(failed, lines.Text())
				}
			}
			if err != nil || len(failed) > 0 {
				t.Errorf("scenario failed (%v):\n%s", err, strings.Join(failed, "\n"))
			}
		})
	}
}

// nspawnPayload builds what the container gets read-only at /xmsg-payload: the daemon and the
// probe (built from this tree), the unit directory, the in-container script, one self-signed
// federation certificate per tier with its expected SPKI pin and, when nix/module.nix can be
// evaluated (NIXPKGS_LIB), the NixOS drop-ins (see nspawnNixOS). It reports whether those are
// there.
func nspawnPayload(t *testing.T, repo string) (string, bool) {
	t.Helper()
	payload := t.TempDir()
	goTool := filepath.Join(runtime.GOROOT(), "bin", "go")
	if p, err := exec.LookPath("go"); err == nil {
		goTool = p
	}
	for _, b := range []struct{ out, pkg string }{
		{"bin/xmsg", "./cmd/xmsg"},
		{"bin/xmsg-probe", "./vmtests/probe"},
	} {
		cmd := exec.Command(goTool, "build", "-o", filepath.Join(payload, b.out), b.pkg)
		cmd.Dir = repo
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("go build %s: %v\n%s", b.pkg, err, out)
		}
	}
	if out, err := exec.Command("cp", "-r", filepath.Join(repo, "systemd"), filepath.Join(payload, "systemd")).CombinedOutput(); err != nil {
		t.Fatalf("copy units: %v\n%s", err, out)
	}
	script, err := os.ReadFile(filepath.Join(repo, "vmtests", "nspawn", "in-container.sh"))
	if err != nil {
		t.Fatal(err)
	}
	nspawnWrite(t, filepath.Join(payload, "in-container.sh"), script, 0o755)
	for _, tier := range nspawnTiers {
		cert, key, pin := nspawnCert(t, "xmsg-"+tier)
		dir := filepath.Join(payload, "creds", tier)
		nspawnWrite(t, filepath.Join(dir, "fed-cert"), cert, 0o644)
		nspawnWrite(t, filepath.Join(dir, "fed-key"), key, 0o644)
		nspawnWrite(t, filepath.Join(dir, "pin"), []byte(pin), 0o644)
	}
	return payload, nspawnNixOS(t, repo, payload)
}

// nspawnNixOS renders what nix/module.nix writes for two tiers into payload/nixos/: tier nix
// (booted and run: its four drop-ins and its tmpfiles rules) and the federating tier nixfed
// (only loaded and scored: its service drop-in, for the addresses of
// systemd/examples/xmsg@public.service.d/federation.conf). Without NIXPKGS_LIB (or
// nix-instantiate) there is nothing to render, and the container has the Debian shape only.
func nspawnNixOS(t *testing.T, repo, payload string) bool {
	t.Helper()
	lib := os.Getenv("NIXPKGS_LIB")
	if _, err := exec.LookPath("nix-instantiate"); lib == "" || err != nil {
		t.Logf("NixOS shape left out: NIXPKGS_LIB=%q, nix-instantiate: %v", lib, err)
		return false
	}
	dropIns, tmpfiles := moduleDropIns(t, lib, repo, `{ nix.svcExecutables.probe = "/usr/local/bin/xmsg-probe"; }`, "")
	fed, _ := moduleDropIns(t, lib, repo, nixFederationTier("nixfed", "192.0.2.10:7788", "192.0.2.20"), "")
	const fedService = "xmsg@nixfed.service.d/overrides.conf"
	if fed[fedService] == "" || len(dropIns) != 4 {
		t.Fatalf("module drop-ins: tier nix %v, tier nixfed %v", slices.Sorted(maps.Keys(dropIns)), slices.Sorted(maps.Keys(fed)))
	}
	dropIns[fedService] = fed[fedService]
	for path, text := range dropIns {
		nspawnWrite(t, filepath.Join(payload, "nixos", "units", path), []byte(text), 0o644)
	}
	nspawnWrite(t, filepath.Join(payload, "nixos", "tmpfiles.conf"), []byte(strings.Join(tmpfiles, "\n")+"\n"), 0o644)
	return true
}

func nspawnWrite(t *testing.T, path string, b []byte, mode os.FileMode) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b, mode); err != nil {
		t.Fatal(err)
	}
}

// nspawnCert returns a self-signed certificate and key (PEM) and the pin the daemon logs for
// it: "sha256:" + hex(SHA-256(SubjectPublicKeyInfo)).
func nspawnCert(t *testing.T, cn string) (cert, key []byte, pin string) {
	t.Helper()
	c := fedtest.New(t, cn, nil, fedtest.Options{})
	return c.CertPEM, c.KeyPEM, c.Pin
}
