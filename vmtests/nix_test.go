package vmtests

// The Nix side, checked offline (there is no nixpkgs and usually no KVM where `go test` runs):
//
//   - TestNixParse: every .nix file of the repository parses (`nix-instantiate --parse`:
//     syntax and unbound variables).
//   - TestNixModuleTests: the lib-only module tests (the flake's lib.moduleTests) pass against
//     a checkout of github:nix-community/nixpkgs.lib named by $NIXPKGS_LIB.
//   - TestNixModuleDropInsOnlyAdd: nix/module.nix writes drop-ins on the package's units
//     (systemd/) with per-tier keys only, and names no other key of those units.
//   - TestNixModuleExposure: systemd-analyze security of the shipped units with the module's
//     drop-ins, merged by systemd-analyze itself, against the Debian shape.
//   - TestNixPackageInstallsUnits: nix/package.nix installs systemd/'s units, and its
//     substitutions match them (the binary's store path goes into ExecStart=).
//   - TestNixImageMatchesKubernetesExample: nix/image.nix (lib only) against deploy/'s pod.
//   - TestNixVMTestScripts: the Python test script of every VM test parses and lints clean.
//   - TestVendorHash: nix/source.nix's vendorHash is what `go mod vendor` gives today.
//
// Missing tools skip these tests, except with CI=true, where a skip would prove nothing.
// NIXPKGS_LIB is optional even in CI (the nixpkgs lib is not vendored into the repository).
// The VM tests themselves (vmtests/*.nix) run with `nix flake check` on a host with KVM.

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/xmsg/xmsg/internal/ostest"
)

// nixRepo returns the repository root (the parent of vmtests/).
func nixRepo(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		t.Fatalf("repository root %s: %v", root, err)
	}
	return root
}

// nixTool finds a Nix command or skips (fails in CI).
func nixTool(t *testing.T, name string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	ostest.Need(t, err == nil, name+" on PATH (Debian: apt-get install --no-install-recommends nix-bin)")
	return p
}

// nixCmd runs a Nix command offline: no substituters, no build users (the Debian nix-bin
// default names a nixbld group that a CI runner does not have), and a store of the test's own
// (nixStoreConfig), so that it runs as any user.
func nixCmd(name string, args ...string) *exec.Cmd {
	cmd := exec.Command(name, args...)
	cmd.Env = append(os.Environ(), "NIX_CONFIG=build-users-group =\nsubstituters =\n"+nixStoreConfig())
	return cmd
}

// nixTrackInputs reads every file of root that ends in one of exts. The Nix tools read them in a
// subprocess, which go test's result cache does not see; reading them here makes a changed
// .nix (or .go, for the vendor hash) file re-run the test instead of replaying a cached PASS.
func nixTrackInputs(t *testing.T, root string, exts ...string) {
	t.Helper()
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && path != root && (d.Name() == ".git" || d.Name() == "vendor" || d.Name() == "testdata" || strings.HasPrefix(d.Name(), "result")) {
			return filepath.SkipDir
		}
		if !d.IsDir() && slices.ContainsFunc(exts, func(ext string) bool { return strings.HasSuffix(d.Name(), ext) }) {
			_, err := os.ReadFile(path)
			return err
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// nixFiles lists the repository's .nix files, skipping version control and build results.
func nixFiles(t *testing.T, root string) []string {
	t.Helper()
	var files []string
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && path != root && (d.Name() == ".git" || d.Name() == "vendor" || strings.HasPrefix(d.Name(), "result")) {
			return filepath.SkipDir
		}
		if !d.IsDir() && strings.HasSuffix(d.Name(), ".nix") {
			files = append(files, path)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return files
}

func TestNixParse(t *testing.T) {
	instantiate := nixTool(t, "nix-instantiate")
	root := nixRepo(t)
	if _, err := os.Stat(filepath.Join(root, "flake.nix")); err != nil {
		// A source tree without its Nix files: nix/source.nix leaves them out of the Nix
		// build, whose check phase runs these tests.
		t.Skipf("no flake.nix in %s (%v): a tree without the Nix files", root, err)
	}
	nixTrackInputs(t, root, ".nix")

	parse := func(path string) error {
		out, err := nixCmd(instantiate, "--parse", path).CombinedOutput()
		if err != nil {
			return fmt.Errorf("%v: %s", err, bytes.TrimSpace(out))
		}
		return nil
	}

	// Positive control: the same check does reject a broken file (a syntax error, and an
	// unbound variable, which --parse reports too).
	for name, text := range map[string]string{
		"syntax.nix":  "{ a = ; }",
		"unbound.nix": "{ lib }: lib.x + unboundName",
	} {
		bad := filepath.Join(t.TempDir(), name)
		if err := os.WriteFile(bad, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := parse(bad); err == nil {
			t.Fatalf("nix-instantiate --parse accepted %s %q; the check below would prove nothing", name, text)
		}
	}

	files := nixFiles(t, root)
	// The files that must exist: without them the loop below would pass vacuously.
	for _, want := range []string{"flake.nix", "nix/module.nix", "nix/package.nix", "vmtests/isolation.nix"} {
		if !slices.Contains(files, filepath.Join(root, want)) {
			t.Errorf("%s: not found among the .nix files %q", want, files)
		}
	}
	for _, f := range files {
		rel, _ := filepath.Rel(root, f)
		if err := parse(f); err != nil {
			t.Errorf("%s: %v", rel, err)
		}
	}
}

// nixpkgsLib returns $NIXPKGS_LIB (a checkout of github:nix-community/nixpkgs.lib, or of
// nixpkgs) or skips.
func nixpkgsLib(t *testing.T) string {
	t.Helper()
	dir := os.Getenv("NIXPKGS_LIB")
	if dir == "" {
		t.Skip("NIXPKGS_LIB is not set (a checkout of github:nix-community/nixpkgs.lib)")
	}
	if _, err := os.Stat(filepath.Join(dir, "lib", "default.nix")); err != nil {
		t.Fatalf("NIXPKGS_LIB=%s: %v", dir, err)
	}
	return dir
}

// nixEvalJSON evaluates a Nix expression strictly and decodes its JSON value into out.
func nixEvalJSON(t *testing.T, expr string, out any) {
	t.Helper()
	instantiate := nixTool(t, "nix-instantiate")
	cmd := nixCmd(instantiate, "--eval", "--strict", "--json", "-E", expr)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	b, err := cmd.Output()
	if err != nil {
		t.Fatalf("nix-instantiate --eval: %v\n%s", err, stderr.String())
	}
	if err := json.Unmarshal(b, out); err != nil {
		t.Fatalf("decode %q: %v", b, err)
	}
}

func TestNixModuleTests(t *testing.T) {
	lib := nixpkgsLib(t)
	root := nixRepo(t)
	nixTrackInputs(t, root, ".nix")

	// The flake exposes exactly this expression as lib.moduleTests.
	tests := filepath.Join(root, "nix", "tests", "module-tests.nix")
	var failed []struct {
		Name     string          `json:"name"`
		Expected json.RawMessage `json:"expected"`
		Result   json.RawMessage `json:"result"`
	}
	nixEvalJSON(t, fmt.Sprintf("import %s { lib = import %s; }", strconv.Quote(tests), strconv.Quote(filepath.Join(lib, "lib"))), &failed)
	for _, f := range failed {
		t.Errorf("%s:\n got: %s\nwant: %s", f.Name, f.Result, f.Expected)
	}

	// Positive control: the harness does report a failing case.
	nixEvalJSON(t, fmt.Sprintf(`(import %s).runTests { testControl = { expr = 1; expected = 2; }; }`,
		strconv.Quote(filepath.Join(lib, "lib"))), &failed)
	if len(failed) != 1 || failed[0].Name != "testControl" {
		t.Errorf("lib.runTests control: got %d failures, want testControl", len(failed))
	}
}

// moduleDropIns evaluates nix/module.nix (lib only) with the given tiers (a Nix attrset
// expression for services.xmsg.tiers, plus extra module config) and returns the drop-ins NixOS
// would write for them, keyed by path below /etc/systemd/system ("xmsg@t.service.d/overrides.conf"),
// and the tmpfiles rules.
func moduleDropIns(t *testing.T, lib, root, tiers, extra string) (map[string]string, []string) {
	t.Helper()
	if extra == "" {
		extra = "{ }"
	}
	expr := fmt.Sprintf(`let
	  e = import %s { lib = import %s; };
	  c = e.eval { imports = [ %s ]; services.xmsg.tiers = %s; };
	in { dropIns = e.dropIns c; tmpfiles = c.systemd.tmpfiles.rules; failed = e.failedAssertions c; }`,
		strconv.Quote(filepath.Join(root, "nix", "tests", "eval.nix")), strconv.Quote(filepath.Join(lib, "lib")), extra, tiers)
	var got struct {
		DropIns  map[string]string `json:"dropIns"`
		Tmpfiles []string          `json:"tmpfiles"`
		Failed   []string          `json:"failed"`
	}
	nixEvalJSON(t, expr, &got)
	if len(got.Failed) != 0 {
		t.Fatalf("failed assertions for tiers %s: %q", tiers, got.Failed)
	}
	return got.DropIns, got.Tmpfiles
}

// unitKeys returns the keys assigned in a unit file or drop-in, per section.
func unitKeys(text string) map[string][]string {
	keys := map[string][]string{}
	section := ""
	for _, line := range strings.Split(text, "\n") {
		line = strings.TrimSpace(line)
		switch {
		case line == "" || strings.HasPrefix(line, "#") || strings.HasPrefix(line, ";"):
		case strings.HasPrefix(line, "[") && strings.HasSuffix(line, "]"):
			section = line[1 : len(line)-1]
		default:
			if k, _, ok := strings.Cut(line, "="); ok && !slices.Contains(keys[section], k) {
				keys[section] = append(keys[section], k)
			}
		}
	}
	return keys
}

// dropInKeys are the only keys the module's drop-ins may write, each with why it differs per
// tier. Everything else, hardening included, is the package's unit (systemd/), so a NixOS tier
// runs the same hardened service as a Debian one; vmtests/nspawn boots both and compares.
var dropInKeys = map[string]string{
	"Service.ExecStart":               "settings and the typed options rendered as flags",
	"Service.User":                    "a tier run by an existing account",
	"Service.Group":                   "a tier run by an existing account",
	"Service.LoadCredential":          "federation credentials and custody secrets",
	"Service.ExecStartPre":            "creating missing session directories",
	"Service.ProtectHome":             "tmpfs instead of yes, to bind session/attestation dirs back",
	"Service.BindReadOnlyPaths":       "the session and attestation directories under the home trees",
	"Service.PrivateNetwork":          "federation dials its peers from the host's namespace",
	"Service.RestrictAddressFamilies": "federation adds AF_INET AF_INET6 to the unit's AF_UNIX",
	"Service.IPAddressAllow":          "federation's peers",
	"Service.SocketBindAllow":         "federation's listener port",
	"Service.SocketBindDeny":          "federation: no other port",
	"Socket.SocketUser":               "a tier run by an existing account",
	"Socket.SocketGroup":              "a tier run by an existing account",
}

// nixModuleShapes are tier configurations that together set every typed option with a unit
// effect: the default, an existing user, session and attestation dirs under /home, a
// federating tier, a custody secret.
var nixModuleShapes = map[string]string{
	"default":    `{ eq = { }; }`,
	"user":       `{ eq = { user = "agent"; group = "users"; }; }`,
	"sessions":   `{ eq = { sessionDirs = [ "/home/agent/.claude/sessions" ]; settings.codex-home = "/home/agent/.codex"; }; }`,
	"federation": nixFederationTier("eq", "192.0.2.10:7788", "192.0.2.20"),
	"custody":    `{ eq.custody.token = { file = "/etc/xmsg/eq/token"; allow = [ "svc:a" ]; }; }`,
}

// nixFederationTier is a federating tier as Nix: a listener, one peer, the credentials.
func nixFederationTier(tier, listen, peer string) string {
	return fmt.Sprintf(`{ %s.federation = {
		listenAddress = %q;
		peers.desktop = { address = "%s:7788"; pin = "sha256:00"; allow = [ "send" ]; };
		certFile = "/etc/xmsg/%s/fed-cert"; keyFile = "/etc/xmsg/%s/fed-key";
	}; }`, tier, listen, peer, tier, tier)
}

// TestNixModuleDropInsOnlyAdd evaluates the module for every shape and checks that its
// drop-ins write only the per-tier keys of dropInKeys, and that module.nix names no other key
// of the shipped units at all (the issue's `grep` of unit keys). Positive controls: a
// hardening key set on top through the module system, and one written into a copy of
// module.nix, are both reported.
func TestNixModuleDropInsOnlyAdd(t *testing.T) {
	lib := nixpkgsLib(t)
	root := nixRepo(t)
	nixTrackInputs(t, root, ".nix", ".service", ".socket")

	foreign := func(dropIns map[string]string) []string {
		var bad []string
		for path, text := range dropIns {
			for section, keys := range unitKeys(text) {
				for _, k := range keys {
					if _, ok := dropInKeys[section+"."+k]; !ok {
						bad = append(bad, path+": "+section+"."+k)
					}
				}
			}
		}
		slices.Sort(bad)
		return bad
	}
	seen := map[string]bool{}
	for name, tiers := range nixModuleShapes {
		t.Run(name, func(t *testing.T) {
			dropIns, _ := moduleDropIns(t, lib, root, tiers, "")
			if len(dropIns) != 4 {
				t.Errorf("drop-ins: got %v, want the service's and the three sockets'", slices.Sorted(maps.Keys(dropIns)))
			}
			if bad := foreign(dropIns); len(bad) > 0 {
				t.Errorf("drop-in keys that are not per-tier (dropInKeys): %q", bad)
			}
			for _, text := range dropIns {
				for section, keys := range unitKeys(text) {
					for _, k := range keys {
						seen[section+"."+k] = true
					}
				}
			}
		})
	}
	// Every allowed key is used by some shape: the list holds nothing the module no longer writes.
	for k := range dropInKeys {
		if !seen[k] {
			t.Errorf("%s is in dropInKeys but no shape's drop-in writes it", k)
		}
	}
	// Positive control: a hardening key relaxed on top (as a user could) shows up.
	dropIns, _ := moduleDropIns(t, lib, root, nixModuleShapes["default"],
		`{ systemd.services."xmsg@eq".serviceConfig.NoNewPrivileges = false; }`)
	if bad := foreign(dropIns); !slices.Contains(bad, "xmsg@eq.service.d/overrides.conf: Service.NoNewPrivileges") {
		t.Errorf("control: NoNewPrivileges=false on top was not reported: %q", bad)
	}

	// The module's source names no key of the shipped units outside dropInKeys.
	shipped := map[string]bool{}
	units, _ := filepath.Glob(filepath.Join(root, "systemd", "xmsg*@.*"))
	if len(units) != 4 {
		t.Fatalf("shipped units: %q", units)
	}
	for _, u := range units {
		b, err := os.ReadFile(u)
		if err != nil {
			t.Fatal(err)
		}
		for section, keys := range unitKeys(string(b)) {
			for _, k := range keys {
				shipped[section+"."+k] = true
			}
		}
	}
	// A Nix assignment `Key = value;` outside comments (prose says `Key=value`).
	written := func(module string) []string {
		module = regexp.MustCompile(`(?m)#.*$`).ReplaceAllString(module, "")
		var bad []string
		for k := range shipped {
			_, key, _ := strings.Cut(k, ".")
			if _, ok := dropInKeys[k]; !ok && regexp.MustCompile(`\b`+key+` = `).MatchString(module) {
				bad = append(bad, k)
			}
		}
		slices.Sort(bad)
		return bad
	}
	mod, err := os.ReadFile(filepath.Join(root, "nix", "module.nix"))
	if err != nil {
		t.Fatal(err)
	}
	if bad := written(string(mod)); len(bad) > 0 {
		t.Errorf("nix/module.nix writes keys the shipped units hold: %q", bad)
	}
	if bad := written(string(mod) + "\nProtectClock = true;\n"); !slices.Contains(bad, "Service.ProtectClock") {
		t.Errorf("control: a ProtectClock assignment in module.nix was not reported: %q", bad)
	}
}

var nixExposureLine = regexp.MustCompile(`Overall exposure level for \S+: ([0-9.]+)`)

// nixAnalyzeSecurity runs `systemd-analyze security --offline=true` on a unit file, in a private
// mount namespace with a tmpfs on /run (it writes there even offline), and returns the
// exposure (0-10) and the findings.
func nixAnalyzeSecurity(t *testing.T, args ...string) (float64, string) {
	t.Helper()
	ostest.RequireTool(t, "systemd-analyze")
	ostest.RequireTool(t, "unshare")
	ostest.Need(t, os.Geteuid() == 0, "root (systemd-analyze runs in a private mount namespace)")
	cmd := exec.Command("unshare", "-m", "--propagation", "private", "sh", "-c",
		`mount -t tmpfs -o mode=0755 xmsg-analyze /run && exec systemd-analyze security --offline=true --no-pager "$@"`, "sh")
	cmd.Args = append(cmd.Args, args...)
	cmd.Env = append(os.Environ(), "SYSTEMD_PAGER=", "SYSTEMD_COLORS=0", "LC_ALL=C")
	out, _ := cmd.CombinedOutput()
	m := nixExposureLine.FindStringSubmatch(string(out))
	if m == nil {
		t.Fatalf("systemd-analyze security %q: no exposure line:\n%s", args, out)
	}
	exposure, err := strconv.ParseFloat(m[1], 64)
	if err != nil {
		t.Fatalf("exposure %q: %v", m[1], err)
	}
	var findings, findingKeys []string
	for _, line := range strings.Split(string(out), "\n") {
		// "✗" in a UTF-8 locale, "-" in the C locale this test runs it in
		if strings.HasPrefix(line, "✗") || strings.HasPrefix(line, "- ") {
			findings = append(findings, strings.Join(strings.Fields(line), " "))
			findingKeys = append(findingKeys, strings.Fields(line)[1])
		}
	}
	slices.Sort(findingKeys)
	return exposure, strings.Join(findings, "\n") + "\n(keys: " + strings.Join(findingKeys, " ") + ")"
}

// unitRoot writes a host root for systemd-analyze --root: the shipped units in
// /etc/systemd/system and the given drop-ins (path below that directory -> text).
func unitRoot(t *testing.T, root string, dropIns map[string]string) string {
	t.Helper()
	host := t.TempDir()
	unitDir := filepath.Join(host, "etc", "systemd", "system")
	units, _ := filepath.Glob(filepath.Join(root, "systemd", "xmsg*@.*"))
	if len(units) != 4 {
		t.Fatalf("units %q", units)
	}
	files := map[string]string{}
	for _, f := range units {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		files[filepath.Base(f)] = string(b)
	}
	maps.Copy(files, dropIns)
	for name, text := range files {
		dst := filepath.Join(unitDir, name)
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(dst, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return host
}

// exampleDropIns reads systemd/examples/xmsg@public.service.d/ as drop-ins of instance tier.
func exampleDropIns(t *testing.T, root, tier string, names ...string) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, n := range names {
		b, err := os.ReadFile(filepath.Join(root, "systemd", "examples", "xmsg@public.service.d", n))
		if err != nil {
			t.Fatal(err)
		}
		out["xmsg@"+tier+".service.d/"+n] = string(b)
	}
	return out
}

// TestNixModuleExposure scores the module's drop-ins on top of the shipped units, merged by
// systemd-analyze itself (--root, as a host would load them), against what a Debian host
// runs: a default tier is the bare template (0.5 on systemd 252, the same findings); a
// federating tier is the template plus systemd/examples' drop-ins (1.3: PrivateNetwork= 0.5,
// AF_INET/AF_INET6 0.3, an IP allow list 0.1; systemd/federation_test.go says why no narrower
// setting exists), with the same findings; session dirs under /home stay within 1.0.
// vmtests/nspawn checks the same merge under a running systemd.
func TestNixModuleExposure(t *testing.T) {
	lib := nixpkgsLib(t)
	root := nixRepo(t)
	nixTrackInputs(t, root, ".nix", ".service", ".socket", ".conf")
	dir := t.TempDir()

	// Positive control: the same analysis does score an unhardened service above the bound.
	plain := filepath.Join(dir, "plain.service")
	if err := os.WriteFile(plain, []byte("[Service]\nExecStart=/bin/true\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if got, _ := nixAnalyzeSecurity(t, plain); got <= 1.0 {
		t.Fatalf("unhardened control: got exposure %.1f, want > 1.0", got)
	}

	debExposure, debFindings := nixAnalyzeSecurity(t, "--root="+unitRoot(t, root, nil), "xmsg@eq.service")
	fedExposure, fedFindings := nixAnalyzeSecurity(t, "--root="+unitRoot(t, root,
		exampleDropIns(t, root, "eq", "credentials.conf", "federation.conf")), "xmsg@eq.service")
	for _, tc := range []struct {
		name         string
		bound        float64
		wantExposure float64
		wantFindings string // systemd/'s, "" for none to compare
	}{
		{"default", 0.5, debExposure, debFindings},
		{"sessions", 1.0, 0, ""},
		{"federation", 1.3, fedExposure, fedFindings},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dropIns, _ := moduleDropIns(t, lib, root, nixModuleShapes[tc.name], "")
			got, findings := nixAnalyzeSecurity(t, "--root="+unitRoot(t, root, dropIns), "xmsg@eq.service")
			t.Logf("exposure %.1f; findings:\n%s", got, findings)
			if got > tc.bound {
				t.Errorf("exposure: got %.1f, want <= %.1f; findings:\n%s", got, tc.bound, findings)
			}
			if tc.wantFindings != "" && (findings != tc.wantFindings || got != tc.wantExposure) {
				t.Errorf("exposure %.1f, findings:\n%s\nwant systemd/'s (Debian shape): %.1f,\n%s", got, findings, tc.wantExposure, tc.wantFindings)
			}
		})
	}
}

func TestVendorHash(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("nix/vendor-hash.sh uses GNU cp")
	}
	nixTool(t, "nix")
	root := nixRepo(t)
	if _, err := os.Stat(filepath.Join(root, "vendor")); err == nil {
		// buildGoModule's build tree: the vendored modules are the ones being hashed.
		t.Skip("the tree has a vendor/ directory (a Nix build); the hash is checked on a clean checkout")
	}
	nixTrackInputs(t, root, ".go", "go.mod", "go.sum", ".nix", ".sh")
	// The go command that runs this test vendors the modules, as in nixpkgs' goModules.
	goBin := filepath.Join(runtime.GOROOT(), "bin")
	_, err := os.Stat(filepath.Join(goBin, "go"))
	ostest.Need(t, err == nil, "the go command next to GOROOT")
	cmd := exec.Command("sh", filepath.Join(root, "nix", "vendor-hash.sh"), "--check")
	cmd.Env = append(os.Environ(), "PATH="+goBin+string(os.PathListSeparator)+os.Getenv("PATH"),
		"NIX_CONFIG=build-users-group =")
	out, err := cmd.CombinedOutput()
	if err != nil {
		// On a mismatch the script names both hashes: put the new one into nix/source.nix.
		t.Fatalf("nix/vendor-hash.sh --check: %v\n%s", err, out)
	}
}

// TestNixImageMatchesKubernetesExample evaluates nix/image.nix (lib only, dockerTools stubbed:
// the arguments the image is built from; nix/tests/module-tests.nix checks them) and holds
// deploy/kubernetes/leaf-pod.json to it: the image name and version, the uid and gid every
// container runs as, a volume on each of the image's writable paths and the bot's
// XDG_RUNTIME_DIR on the leaf's.
func TestNixImageMatchesKubernetesExample(t *testing.T) {
	lib := nixpkgsLib(t)
	root := nixRepo(t)
	nixTrackInputs(t, root, ".nix", ".json")
	var img struct {
		Name, Tag string
		Version   string
		Config    struct {
			User    string
			Env     []string
			Volumes map[string]any
		}
	}
	nixEvalJSON(t, fmt.Sprintf(`let
	  lib = import %s;
	  a = (import %s { inherit lib; }).imageArgs;
	in { inherit (a) name tag config; version = (import %s { inherit lib; }).version; }`,
		strconv.Quote(filepath.Join(lib, "lib")), strconv.Quote(filepath.Join(root, "nix", "tests", "eval.nix")),
		strconv.Quote(filepath.Join(root, "nix", "source.nix"))), &img)

	b, err := os.ReadFile(filepath.Join(root, "deploy", "kubernetes", "leaf-pod.json"))
	if err != nil {
		t.Fatal(err)
	}
	var pod struct {
		Spec struct {
			SecurityContext struct {
				RunAsUser, RunAsGroup int
			}
			Containers []struct {
				Name, Image  string
				Env          []struct{ Name, Value string }
				VolumeMounts []struct{ Name, MountPath string }
			}
		}
	}
	if err := json.Unmarshal(b, &pod); err != nil {
		t.Fatalf("leaf-pod.json: %v", err)
	}
	if got, want := fmt.Sprintf("%d:%d", pod.Spec.SecurityContext.RunAsUser, pod.Spec.SecurityContext.RunAsGroup), img.Config.User; got != want {
		t.Errorf("pod runAsUser:runAsGroup %s, image User %s", got, want)
	}
	imageEnv := map[string]string{}
	for _, e := range img.Config.Env {
		k, v, _ := strings.Cut(e, "=")
		imageEnv[k] = v
	}
	if len(img.Config.Volumes) != 2 || imageEnv["XDG_RUNTIME_DIR"] == "" {
		t.Fatalf("image config %+v: want two volumes and XDG_RUNTIME_DIR", img.Config)
	}
	var leafSeen, botSeen bool
	for _, c := range pod.Spec.Containers {
		mounts := map[string]bool{}
		for _, m := range c.VolumeMounts {
			mounts[m.MountPath] = true
		}
		if strings.HasPrefix(c.Image, img.Name+":") {
			leafSeen = true
			if c.Image != img.Name+":"+img.Version {
				t.Errorf("leaf image %s, want %s:%s (nix/source.nix)", c.Image, img.Name, img.Version)
			}
			for v := range img.Config.Volumes {
				if !mounts[v] {
					t.Errorf("leaf container: no volume on the image's writable path %s (the root filesystem is read-only)", v)
				}
			}
			continue
		}
		botSeen = true
		var rt string
		for _, e := range c.Env {
			if e.Name == "XDG_RUNTIME_DIR" {
				rt = e.Value
			}
		}
		if rt != imageEnv["XDG_RUNTIME_DIR"] || !mounts[rt] {
			t.Errorf("container %s: XDG_RUNTIME_DIR=%q mounted=%v, want the leaf's %s", c.Name, rt, mounts[rt], imageEnv["XDG_RUNTIME_DIR"])
		}
	}
	if !leafSeen || !botSeen {
		t.Errorf("leaf-pod.json: leaf container %v, bot container %v; want both", leafSeen, botSeen)
	}
}

// TestNixVMTestScripts lints the Python test script of every NixOS VM test: no KVM here, so
// none of them runs, and a typo in a script would only show on a host that has one. The
// script is evaluated from the .nix file (no nixpkgs needed: the nodes are never evaluated),
// parsed by Python and checked by pyflakes with the test driver's names as builtins.
func TestNixVMTestScripts(t *testing.T) {
	ostest.RequireTool(t, "python3")
	ostest.RequireTool(t, "pyflakes3") // Debian: apt-get install --no-install-recommends pyflakes3
	root := nixRepo(t)
	if _, err := os.Stat(filepath.Join(root, "flake.nix")); err != nil {
		t.Skipf("no flake.nix in %s (%v): a tree without the Nix files", root, err)
	}
	nixTrackInputs(t, root, ".nix")
	// What the NixOS test driver defines for every script (besides one name per node).
	driver := []string{"start_all", "test_script", "machines", "driver", "log", "os", "create_machine",
		"subtest", "run_tests", "join_all", "retry", "serial_stdout_off", "serial_stdout_on",
		"polling_condition", "Machine", "t"}
	lint := func(t *testing.T, script string, nodes []string) error {
		path := filepath.Join(t.TempDir(), "testScript.py")
		if err := os.WriteFile(path, []byte(script), 0o600); err != nil {
			t.Fatal(err)
		}
		names := append(slices.Clone(driver), nodes...)
		if len(nodes) == 1 {
			names = append(names, "machine")
		}
		for _, args := range [][]string{{"python3", "-c", "import ast,sys; ast.parse(open(sys.argv[1]).read())", path}, {"pyflakes3", path}} {
			cmd := exec.Command(args[0], args[1:]...)
			cmd.Env = append(os.Environ(), "PYFLAKES_BUILTINS="+strings.Join(names, ","))
			if out, err := cmd.CombinedOutput(); err != nil || len(bytes.TrimSpace(out)) > 0 {
				return fmt.Errorf("%s: %v\n%s", args[0], err, out)
			}
		}
		return nil
	}

	// Positive control: an undefined name and a syntax error are both reported.
	if err := lint(t, "start_all()\nmachine.succeed('true')\nundefined_name.fail('x')\n", []string{"machine"}); err == nil {
		t.Fatal("lint control: an undefined name passed")
	}
	if err := lint(t, "def f(:\n", nil); err == nil {
		t.Fatal("lint control: a syntax error passed")
	}

	files, _ := filepath.Glob(filepath.Join(root, "vmtests", "*.nix"))
	if len(files) < 3 {
		t.Fatalf("VM tests: got %q, want isolation, activation and federation", files)
	}
	for _, f := range files {
		t.Run(filepath.Base(f), func(t *testing.T) {
			var got struct {
				Script string   `json:"script"`
				Nodes  []string `json:"nodes"`
			}
			nixEvalJSON(t, fmt.Sprintf(`let v = import %s { pkgs = { }; xmsg = "/xmsg"; probe = "/probe"; module = { }; };
			  in { script = v.testScript; nodes = builtins.attrNames v.nodes; }`, strconv.Quote(f)), &got)
			if strings.TrimSpace(got.Script) == "" || len(got.Nodes) == 0 {
				t.Fatalf("no testScript or no nodes: %+v", got)
			}
			if err := lint(t, got.Script, got.Nodes); err != nil {
				t.Error(err)
			}
		})
	}
}

// TestNixPackageInstallsUnits holds nix/package.nix's postInstall to the shipped units (the
// offline checks cannot build the package): every unit of systemd/ is installed, and every
// `--replace-fail FROM` pattern occurs in the units it is applied to, so that the build
// neither fails nor leaves /usr/local paths in the store's copy. The binary's pattern must be
// ExecStart='s.
func TestNixPackageInstallsUnits(t *testing.T) {
	root := nixRepo(t)
	nixTrackInputs(t, root, ".nix", ".service", ".socket")
	pkg, err := os.ReadFile(filepath.Join(root, "nix", "package.nix"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(pkg), `install -Dm0644 -t "$out/lib/systemd/system" systemd/xmsg@.service systemd/xmsg-*@.socket`) {
		t.Fatal("nix/package.nix does not install systemd/xmsg@.service and systemd/xmsg-*@.socket into $out/lib/systemd/system")
	}
	units, _ := filepath.Glob(filepath.Join(root, "systemd", "xmsg*@.*"))
	if len(units) != 4 {
		t.Fatalf("shipped units: %q", units)
	}
	text := map[string]string{}
	for _, u := range units {
		b, err := os.ReadFile(u)
		if err != nil {
			t.Fatal(err)
		}
		text[filepath.Base(u)] = string(b)
	}
	// substituteInPlace TARGET --replace-fail FROM TO, TARGET one unit or the loop's "$unit".
	subst := regexp.MustCompile(`substituteInPlace "([^"]+)" --replace-fail (\S+) `).FindAllStringSubmatch(string(pkg), -1)
	if len(subst) < 2 {
		t.Fatalf("nix/package.nix: got %d substitutions, want the documents' and the binary's", len(subst))
	}
	for _, m := range subst {
		target, from := m[1], m[2]
		for name, body := range text {
			if target != "$unit" && target != "$out/lib/systemd/system/"+name {
				continue
			}
			if !strings.Contains(body, from) {
				t.Errorf("%s: --replace-fail %s would fail the build: not in the unit", name, from)
			}
		}
	}
	if !slices.ContainsFunc(subst, func(m []string) bool {
		return m[1] == "$out/lib/systemd/system/xmsg@.service" && strings.Contains(text["xmsg@.service"], "\nExecStart="+m[2]+" ")
	}) {
		t.Error("nix/package.nix does not point xmsg@.service's ExecStart= at $out/bin/xmsg")
	}
}
