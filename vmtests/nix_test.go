package vmtests

// The Nix side, checked offline (there is no nixpkgs and usually no KVM where `go test` runs):
//
//   - TestNixParse: every .nix file of the repository parses (`nix-instantiate --parse`:
//     syntax and unbound variables).
//   - TestNixModuleTests: the lib-only module tests (the flake's lib.moduleTests) pass against
//     a checkout of github:nix-community/nixpkgs.lib named by $NIXPKGS_LIB.
//   - TestNixModuleMatchesSystemdUnits: the units that nix/module.nix generates for a tier are
//     the units of systemd/ for that tier: same sockets, same hardening, key for key; for a
//     federating tier, the template plus the example drop-ins.
//   - TestNixModuleExposure: systemd-analyze security of the module's service variants.
//   - TestNixImageMatchesKubernetesExample: nix/image.nix (lib only) against deploy/'s pod.
//   - TestNixVMTestScripts: the Python test script of every VM test parses and lints clean.
//   - TestVendorHash: nix/source.nix's vendorHash is what `go mod vendor` gives today.
//
// Missing tools skip these tests, except with CI=true, where a skip would prove nothing.
// NIXPKGS_LIB is optional even in CI (the nixpkgs lib is not vendored into the repository).
// The VM tests themselves (vmtests/*.nix) run with `nix flake check` on a host with KVM.

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path"
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

// unit is a parsed unit file: section -> key -> values (one per assignment, in order).
type unit map[string]map[string][]string

// parseUnit reads a systemd unit file (comments, sections, Key=Value lines; no line
// continuations, which the project's units do not use).
func parseUnit(text string) (unit, error) {
	u := unit{}
	section := ""
	sc := bufio.NewScanner(strings.NewReader(text))
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		switch {
		case line == "" || strings.HasPrefix(line, "#") || strings.HasPrefix(line, ";"):
		case strings.HasPrefix(line, "[") && strings.HasSuffix(line, "]"):
			section = line[1 : len(line)-1]
		default:
			k, v, ok := strings.Cut(line, "=")
			if !ok || section == "" {
				return nil, fmt.Errorf("line %d: %q is not Key=Value in a section", n, line)
			}
			if u[section] == nil {
				u[section] = map[string][]string{}
			}
			u[section][k] = append(u[section][k], strings.TrimSpace(v))
		}
	}
	return u, sc.Err()
}

// nixValue renders one NixOS unit option value the way NixOS writes it into a unit file:
// booleans as true/false, numbers in decimal, lists as one assignment per element.
func nixValue(v any) []string {
	switch v := v.(type) {
	case bool:
		return []string{strconv.FormatBool(v)}
	case float64:
		return []string{strconv.FormatFloat(v, 'f', -1, 64)}
	case string:
		return []string{v}
	case []any:
		var out []string
		for _, e := range v {
			out = append(out, nixValue(e)...)
		}
		return out
	default:
		return []string{fmt.Sprint(v)}
	}
}

// normalize makes two spellings of the same setting compare equal: the values of a key become
// one token list (systemd splits most list settings on whitespace and accumulates repeated
// assignments), booleans are spelled true/false, and quotes around words are dropped.
func normalize(values []string) []string {
	out := []string{}
	for _, v := range values {
		for _, tok := range strings.Fields(v) {
			tok = strings.Trim(tok, `"`)
			switch strings.ToLower(tok) {
			case "yes", "true", "on":
				tok = "true"
			case "no", "false", "off":
				tok = "false"
			}
			out = append(out, tok)
		}
	}
	return out
}

// moduleUnits evaluates nix/module.nix (lib only) with one tier configured by settings (a Nix
// attrset expression) and returns its units in unit-file form, keyed by unit file name.
func moduleUnits(t *testing.T, lib, root, tier, settings string) map[string]unit {
	t.Helper()
	expr := fmt.Sprintf(`let
	  e = import %s { lib = import %s; };
	  c = e.eval { services.xmsg.tiers.%s = %s; };
	in { inherit (c.systemd) services sockets; failed = e.failedAssertions c; }`,
		strconv.Quote(filepath.Join(root, "nix", "tests", "eval.nix")), strconv.Quote(filepath.Join(lib, "lib")), tier, settings)
	var got struct {
		Services map[string]map[string]any `json:"services"`
		Sockets  map[string]map[string]any `json:"sockets"`
		Failed   []string                  `json:"failed"`
	}
	nixEvalJSON(t, expr, &got)
	if len(got.Failed) != 0 {
		t.Fatalf("failed assertions for tier %s = %s: %q", tier, settings, got.Failed)
	}

	// The NixOS unit options the module uses, and where NixOS writes them.
	unitLevel := map[string]string{
		"description": "Description", "requires": "Requires", "after": "After", "partOf": "PartOf",
		"documentation": "Documentation",
	}
	convert := func(def map[string]any, body string) unit {
		u := unit{"Unit": {}, body: {}}
		for opt, val := range def {
			switch opt {
			case "description", "requires", "after", "partOf", "documentation":
				u["Unit"][unitLevel[opt]] = nixValue(val)
			case "wantedBy":
				u["Install"] = map[string][]string{"WantedBy": nixValue(val)}
			case "listenStreams":
				u[body]["ListenStream"] = nixValue(val)
			case "environment":
				for k, v := range val.(map[string]any) {
					u[body]["Environment"] = append(u[body]["Environment"], k+"="+fmt.Sprint(v))
				}
			case "serviceConfig", "socketConfig":
				for k, v := range val.(map[string]any) {
					u[body][k] = nixValue(v)
				}
			default:
				t.Errorf("unit option %q is not compared by this test; extend it", opt)
			}
		}
		return u
	}
	units := map[string]unit{}
	for name, def := range got.Services {
		units[name+".service"] = convert(def, "Service")
	}
	for name, def := range got.Sockets {
		units[name+".socket"] = convert(def, "Socket")
	}
	return units
}

func TestNixModuleMatchesSystemdUnits(t *testing.T) {
	lib := nixpkgsLib(t)
	root := nixRepo(t)
	nixTrackInputs(t, root, ".nix", ".service", ".socket", ".conf")

	t.Run("default", func(t *testing.T) {
		const tier = "eq"
		compareWithSystemdDir(t, root, tier, moduleUnits(t, lib, root, tier, "{ }"), nil)
	})

	// A federating tier: the module's federation options against the template plus the
	// example drop-ins of systemd/examples/xmsg@public.service.d/, merged the way systemd
	// merges them. The settings are the ones those drop-ins spell out.
	t.Run("federation", func(t *testing.T) {
		const tier = "public"
		settings := `{ federation = {
			listenAddress = "192.0.2.10:7788";
			certFile = "/etc/xmsg/public/fed-cert"; keyFile = "/etc/xmsg/public/fed-key";
			caFile = "/etc/xmsg/public/fed-ca"; peersFile = "/etc/xmsg/public/peers";
			ipAddressAllow = [ "192.0.2.20" ];
		}; }`
		dropIns, err := filepath.Glob(filepath.Join(root, "systemd", "examples", "xmsg@public.service.d", "*.conf"))
		if err != nil || len(dropIns) < 2 {
			t.Fatalf("example drop-ins: got %q (%v), want credentials.conf and federation.conf", dropIns, err)
		}
		var drops []unit
		for _, f := range dropIns {
			if filepath.Base(f) == "services.conf" {
				continue // svcExecutables, compared by the module tests
			}
			b, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			d, err := parseUnit(string(b))
			if err != nil {
				t.Fatalf("%s: %v", f, err)
			}
			drops = append(drops, d)
		}
		compareWithSystemdDir(t, root, tier, moduleUnits(t, lib, root, tier, settings), drops)
	})
}

// systemdListKeys are the [Service] settings that systemd accumulates over assignments (an
// empty assignment resets them); any other key takes the last assignment.
var systemdListKeys = map[string]bool{
	"ExecStart": true, "Environment": true, "LoadCredential": true, "RestrictAddressFamilies": true,
	"IPAddressAllow": true, "IPAddressDeny": true, "SocketBindAllow": true, "SocketBindDeny": true,
	"SystemCallFilter": true, "ReadOnlyPaths": true, "BindReadOnlyPaths": true,
}

// mergeDropIn applies a drop-in's [Service] section to u the way systemd does.
func mergeDropIn(u, drop unit) {
	for k, vs := range drop["Service"] {
		for _, v := range vs {
			switch {
			case !systemdListKeys[k]:
				u["Service"][k] = []string{v}
			case strings.TrimSpace(v) == "":
				u["Service"][k] = nil
			default:
				u["Service"][k] = append(u["Service"][k], v)
			}
		}
		if len(u["Service"][k]) == 0 {
			delete(u["Service"], k)
		}
	}
}

// compareWithSystemdDir compares the module's units for tier with systemd/'s templates
// instantiated for it (plus drop-ins on the service), key for key.
func compareWithSystemdDir(t *testing.T, root, tier string, got map[string]unit, serviceDropIns []unit) {
	t.Helper()
	// Keys that legitimately differ: where the binary lives (compared below without its path)
	// and the documentation link of a non-Nix install.
	ignored := map[string]bool{"Unit.Documentation": true, "Service.ExecStart": true, "Install.Also": true}

	templates := map[string]string{
		"xmsg@.service":         "xmsg@" + tier + ".service",
		"xmsg-http@.socket":     "xmsg-http@" + tier + ".socket",
		"xmsg-agent@.socket":    "xmsg-agent@" + tier + ".socket",
		"xmsg-register@.socket": "xmsg-register@" + tier + ".socket",
	}
	if len(got) != len(templates) {
		t.Errorf("module units: got %d (%v), want %d", len(got), slices.Sorted(mapKeys(got)), len(templates))
	}
	for file, instance := range templates {
		b, err := os.ReadFile(filepath.Join(root, "systemd", file))
		if err != nil {
			t.Fatal(err)
		}
		want, err := parseUnit(strings.ReplaceAll(string(b), "%i", tier))
		if err != nil {
			t.Fatalf("systemd/%s: %v", file, err)
		}
		if strings.HasSuffix(file, ".service") {
			for _, d := range serviceDropIns {
				mergeDropIn(want, d)
			}
		}
		mod, ok := got[instance]
		if !ok {
			t.Errorf("%s: systemd/ has it, the module does not generate it", instance)
			continue
		}
		for _, section := range []string{"Unit", "Service", "Socket", "Install"} {
			keys := map[string]bool{}
			for k := range want[section] {
				keys[k] = true
			}
			for k := range mod[section] {
				keys[k] = true
			}
			for _, k := range slices.Sorted(mapKeys(keys)) {
				if ignored[section+"."+k] {
					continue
				}
				w, inWant := want[section][k]
				g, inGot := mod[section][k]
				switch {
				case !inGot:
					t.Errorf("%s [%s] %s=%q: in systemd/%s, missing from the module", instance, section, k, w, file)
				case !inWant:
					t.Errorf("%s [%s] %s=%q: set by the module, not in systemd/%s", instance, section, k, g, file)
				case !slices.Equal(normalize(g), normalize(w)):
					t.Errorf("%s [%s] %s: module %q, systemd/%s %q", instance, section, k, g, file, w)
				}
			}
		}
		// The documents are the same; only where the package installs them differs.
		if w, g := docNames(want["Unit"]["Documentation"]), docNames(mod["Unit"]["Documentation"]); len(w) == 0 || !slices.Equal(g, w) {
			t.Errorf("%s Documentation: module %q, systemd/%s %q (the directory may differ)", instance, g, file, w)
		}
		if execs := want["Service"]["ExecStart"]; len(execs) > 0 {
			w := normalize(execs)
			g := normalize(mod["Service"]["ExecStart"])
			if len(g) == 0 || filepath.Base(g[0]) != filepath.Base(w[0]) || !slices.Equal(g[1:], w[1:]) {
				t.Errorf("%s ExecStart: module %q, systemd/%s %q (the binary's directory may differ)", instance, g, file, w)
			}
		}
	}
}

// docNames returns the file names of Documentation= URIs, in order.
func docNames(vals []string) []string {
	var names []string
	for _, uri := range normalize(vals) {
		names = append(names, path.Base(uri))
	}
	return names
}

// render writes a unit back as unit-file text, one assignment per value, keys sorted.
func (u unit) render() string {
	var b strings.Builder
	for _, section := range []string{"Unit", "Service", "Socket", "Install"} {
		if len(u[section]) == 0 {
			continue
		}
		fmt.Fprintf(&b, "[%s]\n", section)
		for _, k := range slices.Sorted(mapKeys(u[section])) {
			for _, v := range u[section][k] {
				fmt.Fprintf(&b, "%s=%s\n", k, v)
			}
		}
	}
	return b.String()
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

// systemdFederationExposure scores what systemd/ ships for a federating tier: the template
// with the example drop-ins, loaded by systemd-analyze itself (--root) as a host would.
func systemdFederationExposure(t *testing.T, root string) (float64, string) {
	t.Helper()
	host := t.TempDir()
	unitDir := filepath.Join(host, "etc", "systemd", "system")
	units, _ := filepath.Glob(filepath.Join(root, "systemd", "xmsg*@.*"))
	drops, _ := filepath.Glob(filepath.Join(root, "systemd", "examples", "xmsg@public.service.d", "*.conf"))
	if len(units) != 4 || len(drops) < 2 {
		t.Fatalf("units %q, drop-ins %q", units, drops)
	}
	for _, f := range append(units, drops...) {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		dst := filepath.Join(unitDir, filepath.Base(f))
		if strings.HasSuffix(f, ".conf") {
			dst = filepath.Join(unitDir, "xmsg@public.service.d", filepath.Base(f))
		}
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(dst, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return nixAnalyzeSecurity(t, "--root="+host, "xmsg@public.service")
}

// TestNixModuleExposure checks the exposure of the module's service variants: the default tier
// (the unit of systemd/, bound 1.0), a tier with Claude session dirs under /home
// (ProtectHome=tmpfs plus read-only binds; bound 1.0), and a federating tier. Federation needs
// the host's network and IP sockets, which on top of the relaxations every tier has
// (PrivateUsers=no, ProtectProc= default: attestation needs both) scores 1.3 on systemd 252:
// PrivateNetwork= 0.5, AF_INET/AF_INET6 0.3, an IP allow list 0.1 (systemd/federation_test.go
// names why no narrower setting exists for each). So the federating module unit must score
// what systemd/'s template plus its federation drop-ins score, with the same findings, and at
// most 1.3: any further relaxation fails.
func TestNixModuleExposure(t *testing.T) {
	lib := nixpkgsLib(t)
	root := nixRepo(t)
	nixTrackInputs(t, root, ".nix")
	dir := t.TempDir()

	// Positive control: the same analysis does score an unhardened service above the bound.
	plain := filepath.Join(dir, "plain.service")
	if err := os.WriteFile(plain, []byte("[Service]\nExecStart=/bin/true\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if got, _ := nixAnalyzeSecurity(t, plain); got <= 1.0 {
		t.Fatalf("unhardened control: got exposure %.1f, want > 1.0", got)
	}

	fedExposure, fedFindings := systemdFederationExposure(t, root)
	for _, tc := range []struct {
		name, settings string
		bound          float64
		sameAs         string // findings that must be exactly these (systemd/'s)
	}{
		{"default", `{ }`, 1.0, ""},
		{"sessions", `{ sessionDirs = [ "/home/agent/.claude/sessions" ]; }`, 1.0, ""},
		{"federation", `{ federation = {
			listenAddress = "192.0.2.10:7788";
			peers.desktop = { address = "192.0.2.20:7788"; pin = "sha256:00"; allow = [ "send" ]; };
			certFile = "/etc/xmsg/eq/fed-cert"; keyFile = "/etc/xmsg/eq/fed-key";
		}; }`, 1.3, fedFindings},
	} {
		t.Run(tc.name, func(t *testing.T) {
			units := moduleUnits(t, lib, root, "eq", tc.settings)
			svc, ok := units["xmsg@eq.service"]
			if !ok {
				t.Fatalf("no xmsg@eq.service among %v", slices.Sorted(mapKeys(units)))
			}
			path := filepath.Join(dir, tc.name, "xmsg@eq.service")
			if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(path, []byte(svc.render()), 0o600); err != nil {
				t.Fatal(err)
			}
			got, findings := nixAnalyzeSecurity(t, path)
			t.Logf("exposure %.1f; findings:\n%s", got, findings)
			if got > tc.bound {
				t.Errorf("exposure: got %.1f, want <= %.1f; findings:\n%s", got, tc.bound, findings)
			}
			if tc.sameAs != "" && (findings != tc.sameAs || got != fedExposure) {
				t.Errorf("exposure %.1f, findings:\n%s\nwant systemd/'s template + drop-ins: %.1f,\n%s", got, findings, fedExposure, tc.sameAs)
			}
		})
	}
}

func mapKeys[K comparable, V any](m map[K]V) func(func(K) bool) {
	return func(yield func(K) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

// TestParseUnitAndNormalize pins the comparison's own helpers, so that the equivalence test
// cannot pass by parsing nothing or by equating different settings.
func TestParseUnitAndNormalize(t *testing.T) {
	u, err := parseUnit("# c\n[Service]\nA=1\nA=2 3\nB=\n; c\n[Socket]\nC=yes\n")
	if err != nil {
		t.Fatal(err)
	}
	if got, want := u["Service"]["A"], []string{"1", "2 3"}; !slices.Equal(got, want) {
		t.Errorf("A: got %q, want %q", got, want)
	}
	if got, ok := u["Service"]["B"]; !ok || len(normalize(got)) != 0 {
		t.Errorf("B: got %q (present %v), want present and empty", got, ok)
	}
	if _, err := parseUnit("A=1\n"); err == nil {
		t.Error("parseUnit accepted a key outside any section")
	}
	for _, tc := range []struct {
		a, b []string
		same bool
	}{
		{[]string{"yes"}, []string{"true"}, true},
		{[]string{"a b", "c"}, []string{"a", "b c"}, true},
		{[]string{`"serve"`}, []string{"serve"}, true},
		{[]string{"strict"}, []string{"full"}, false},
		{[]string{"AF_UNIX"}, []string{"AF_UNIX AF_INET"}, false},
		{[]string{"0600"}, []string{"0666"}, false},
		{[]string{""}, []string{"any"}, false},
	} {
		if got := slices.Equal(normalize(tc.a), normalize(tc.b)); got != tc.same {
			t.Errorf("normalize(%q) == normalize(%q): got %v, want %v", tc.a, tc.b, got, tc.same)
		}
	}
	for _, tc := range []struct {
		v    any
		want []string
	}{
		{true, []string{"true"}},
		{float64(448), []string{"448"}},
		{[]any{"a", "b c"}, []string{"a", "b c"}},
		{"", []string{""}},
	} {
		if got := nixValue(tc.v); !slices.Equal(got, tc.want) {
			t.Errorf("nixValue(%#v): got %q, want %q", tc.v, got, tc.want)
		}
	}
}

// TestMergeDropIn pins the drop-in merge of the comparison: a scalar key takes the last
// assignment, a list key accumulates, an empty assignment resets it.
func TestMergeDropIn(t *testing.T) {
	u := unit{"Service": {"PrivateNetwork": {"yes"}, "RestrictAddressFamilies": {"AF_UNIX"}, "ExecStart": {"/a"}, "IPAddressDeny": {"any"}}}
	mergeDropIn(u, unit{"Service": {
		"PrivateNetwork": {"no"}, "RestrictAddressFamilies": {"AF_INET AF_INET6"},
		"ExecStart": {"", "/b --x"}, "IPAddressDeny": {""}, "SocketBindDeny": {"any"},
	}})
	want := unit{"Service": {
		"PrivateNetwork": {"no"}, "RestrictAddressFamilies": {"AF_UNIX", "AF_INET AF_INET6"},
		"ExecStart": {"/b --x"}, "SocketBindDeny": {"any"},
	}}
	if got, w := u.render(), want.render(); got != w {
		t.Errorf("merged:\n%s\nwant:\n%s", got, w)
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
