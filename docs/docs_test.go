package docs

import (
	"bufio"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/xmsg/xmsg/internal/bench"
	"github.com/xmsg/xmsg/internal/config"
	"github.com/xmsg/xmsg/internal/mcp"
)

// root is the repository root: this package is docs/.
const root = ".."

// sourceFiles returns the repository's text files that may cite the docs (relative paths).
func sourceFiles(t *testing.T) []string {
	t.Helper()
	exts := []string{".go", ".nix", ".md", ".sh", ".service", ".socket", ".conf", ".txt"}
	var files []string
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		if d.IsDir() {
			if rel == ".git" || rel == "vendor" || strings.HasPrefix(d.Name(), "result") {
				return filepath.SkipDir
			}
			return nil
		}
		if slices.Contains(exts, filepath.Ext(path)) || rel == filepath.Join(".ci", "run") {
			files = append(files, rel)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return files
}

// sections returns the section numbers of a doc's headings: "## 4. Socket protocols" gives
// "4", "### 4.2 register.sock" gives "4.2", "## Appendix A. ..." gives "Appendix A".
func sections(t *testing.T, name string) map[string]bool {
	t.Helper()
	b, err := os.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	heading := regexp.MustCompile(`^#{2,4} (Appendix [A-Z]|[0-9]+(?:\.[0-9]+)*)\.? `)
	got := map[string]bool{}
	sc := bufio.NewScanner(strings.NewReader(string(b)))
	for sc.Scan() {
		if m := heading.FindStringSubmatch(sc.Text()); m != nil {
			got[m[1]] = true
		}
	}
	return got
}

// TestCitedSectionsExist: every "docs/protocol.md §4.2" (or "docs/design.md §2", or
// "Appendix A") anywhere in the tree names a heading of that file, so a renumbered section
// cannot leave comments pointing at nothing.
func TestCitedSectionsExist(t *testing.T) {
	docs := map[string]map[string]bool{}
	for _, d := range []string{"protocol.md", "design.md", "security.md", "operations.md", "performance.md"} {
		docs[d] = sections(t, d)
	}
	cite := regexp.MustCompile(`docs/([a-z]+\.md) (§[0-9]+(?:\.[0-9]+)*|Appendix [A-Z])`)
	n := 0
	for _, f := range sourceFiles(t) {
		b, err := os.ReadFile(filepath.Join(root, f))
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range cite.FindAllStringSubmatch(string(b), -1) {
			n++
			secs, ok := docs[m[1]]
			if !ok {
				t.Errorf("%s cites docs/%s, which does not exist", f, m[1])
				continue
			}
			if sec := strings.TrimPrefix(m[2], "§"); !secs[sec] {
				t.Errorf("%s cites docs/%s %s: no such section", f, m[1], m[2])
			}
		}
	}
	if n < 40 {
		t.Errorf("found %d citations of docs/*.md sections; want the code's ~50 (is the pattern broken?)", n)
	}
}

// TestNoReferencesOutsideRepo: the specs the project was written from do not ship with it,
// so nothing may point at them; the docs in this directory replace them.
func TestNoReferencesOutsideRepo(t *testing.T) {
	// Spelled in pieces so that this file does not match itself.
	banned := []string{"PROTOCOL" + ".md", "DESIGN" + ".md", "STYLE" + ".md", "../" + "shared", "decisions " + "table"}
	for _, f := range sourceFiles(t) {
		b, err := os.ReadFile(filepath.Join(root, f))
		if err != nil {
			t.Fatal(err)
		}
		for i, line := range strings.Split(string(b), "\n") {
			for _, s := range banned {
				if strings.Contains(line, s) {
					t.Errorf("%s:%d: %q points outside the repository; cite docs/ instead", f, i+1, s)
				}
			}
		}
	}
}

// TestLinks: every relative link of the README and the docs names a file that exists.
func TestLinks(t *testing.T) {
	link := regexp.MustCompile(`\]\(([^)#:]+)(#[^)]*)?\)`)
	files := []string{filepath.Join(root, "README.md")}
	docs, _ := filepath.Glob("*.md")
	files = append(files, docs...)
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range link.FindAllStringSubmatch(string(b), -1) {
			if _, err := os.Stat(filepath.Join(filepath.Dir(f), m[1])); err != nil {
				t.Errorf("%s links %s, which does not exist", f, m[1])
			}
		}
	}
}

// TestDesignLayout: docs/design.md §1 (the one map of the tree; the README points to it) names
// every package directory and every top-level directory, and its code block nothing that does
// not exist.
func TestDesignLayout(t *testing.T) {
	b, err := os.ReadFile("design.md")
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	i, j := strings.Index(s, "## 1. Layout"), strings.Index(s, "## 2. ")
	if i < 0 || j < i {
		t.Fatal("design.md has no §1 Layout before §2")
	}
	sec := s[i:j]
	start := strings.Index(sec, "```\n")
	end := strings.Index(sec[start+4:], "```")
	if start < 0 || end < 0 {
		t.Fatal("design.md §1 has no code block")
	}
	listed := map[string]bool{}
	for _, line := range strings.Split(sec[start+4:start+4+end], "\n") {
		f := strings.Fields(line)
		if len(f) == 0 || strings.Contains(f[0], "...") {
			continue
		}
		for _, p := range strings.Split(f[0], ",") {
			if p = strings.TrimSuffix(strings.TrimSpace(p), "/"); p != "" {
				listed[p] = true
			}
		}
	}
	for p := range listed {
		if _, err := os.Stat(filepath.Join(root, p)); err != nil {
			t.Errorf("design.md §1 lists %s, which does not exist", p)
		}
	}
	entries, err := os.ReadDir(root)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if e.IsDir() && !strings.HasPrefix(e.Name(), ".") && e.Name() != "internal" && e.Name() != "cmd" && !strings.HasPrefix(e.Name(), "result") && !listed[e.Name()] {
			t.Errorf("design.md §1 does not list the top-level directory %s/", e.Name())
		}
	}
	// Every directory under internal/ and cmd/ that holds Go files (a nested test-support
	// package too) is named in §1, as `name` (internal/name) or `cmd/name`.
	n, seen := 0, map[string]bool{}
	for _, top := range []string{"internal", "cmd"} {
		filepath.WalkDir(filepath.Join(root, top), func(path string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() || filepath.Ext(path) != ".go" {
				return err
			}
			rel, _ := filepath.Rel(root, filepath.Dir(path))
			rel = filepath.ToSlash(rel)
			if strings.Contains(rel, "testdata") || seen[rel] {
				return nil
			}
			n, seen[rel] = n+1, true
			name := strings.TrimPrefix(rel, "internal/")
			if !strings.Contains(sec, "`"+name+"`") && !strings.Contains(sec, "`"+rel+"`") {
				t.Errorf("design.md §1 does not name the package %s", rel)
			}
			return nil
		})
	}
	if n < 30 {
		t.Errorf("found %d package directories; want the tree's ~35 (is the walk broken?)", n)
	}
}

// TestReadme: the README stays a front page: at most 150 lines, opening with the two commands
// (run the bus, run the tests), and linking every document of docs/, whose contents are
// checked in their own homes (the tests above and below).
func TestReadme(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	if n := strings.Count(s, "\n"); n > 150 {
		t.Errorf("README.md has %d lines; keep it to 150 (the detail belongs in docs/)", n)
	}
	start := strings.Index(s, "```sh\n")
	end := strings.Index(s[start+6:], "```")
	if start < 0 || end < 0 {
		t.Fatal("README.md has no sh block")
	}
	var cmds []string
	for _, line := range strings.Split(strings.TrimSpace(s[start+6:start+6+end]), "\n") {
		cmd, _, _ := strings.Cut(line, "#")
		cmds = append(cmds, strings.TrimSpace(cmd))
	}
	if want := []string{"go run ./cmd/xmsg serve", "go test ./..."}; !slices.Equal(cmds, want) {
		t.Errorf("README.md's first commands: got %q, want %q (the bus with no config, and the tests)", cmds, want)
	}
	// The MCP bridge's tools as the README names them are the ones tools/list gives.
	if m := regexp.MustCompile(`xmsg mcp .*\(tools: ([a-z, ]+)\)`).FindStringSubmatch(s); m == nil || m[1] != strings.Join(mcp.ToolNames(), ", ") {
		t.Errorf("README.md's xmsg mcp line names the tools %q; the bridge has %q", m, mcp.ToolNames())
	}
	docs, _ := filepath.Glob("*.md")
	for _, d := range docs {
		if !strings.Contains(s, "](docs/"+d+")") {
			t.Errorf("README.md does not link docs/%s", d)
		}
	}
}

// TestSecurityTestsExist: every test docs/security.md names as the one holding a property
// exists in the tree, so a renamed or deleted test cannot leave a guarantee claimed by nothing.
func TestSecurityTestsExist(t *testing.T) {
	b, err := os.ReadFile("security.md")
	if err != nil {
		t.Fatal(err)
	}
	named := regexp.MustCompile("`(Test[A-Z][A-Za-z0-9_]*)`").FindAllStringSubmatch(string(b), -1)
	if len(named) < 5 {
		t.Fatalf("security.md names %d tests; want the 7 or more it cites (is the pattern broken?)", len(named))
	}
	defined := map[string]bool{}
	def := regexp.MustCompile(`(?m)^func (Test[A-Za-z0-9_]+)\(`)
	for _, f := range sourceFiles(t) {
		if !strings.HasSuffix(f, "_test.go") {
			continue
		}
		b, err := os.ReadFile(filepath.Join(root, f))
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range def.FindAllStringSubmatch(string(b), -1) {
			defined[m[1]] = true
		}
	}
	for _, m := range named {
		if !defined[m[1]] {
			t.Errorf("security.md names %s, which no test file defines", m[1])
		}
	}
}

// TestPerformanceBlock: docs/performance.md shows `xmsg bench`'s own report: its fixed lines
// and its table's columns are exactly what internal/bench prints, so a change of the report
// cannot leave a hand-edited block behind.
func TestPerformanceBlock(t *testing.T) {
	b, err := os.ReadFile("performance.md")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	var want strings.Builder
	(&bench.Result{}).Text(&want)
	lines := strings.Split(strings.TrimSpace(want.String()), "\n")
	if len(lines) < 5 {
		t.Fatalf("bench's report of an empty result has %d lines; want its header (is Text changed?)", len(lines))
	}
	i := strings.Index(doc, "```\nxmsg bench: daemon ")
	if i < 0 {
		t.Fatal("performance.md has no block starting with bench's first line (\"xmsg bench: daemon ...\")")
	}
	block := doc[i+4:]
	block = block[:strings.Index(block, "```")]
	for _, fixed := range lines[2:4] { // the two lines that explain the ratios and the CPU column
		if !strings.Contains(block, fixed+"\n") {
			t.Errorf("performance.md's block lacks bench's line %q", fixed)
		}
	}
	cols := regexp.MustCompile(`\s{2,}`)
	header := cols.Split(strings.TrimSpace(lines[len(lines)-1]), -1)
	found := false
	for _, l := range strings.Split(block, "\n") {
		if strings.HasPrefix(l, "path ") {
			found = true
			if got := cols.Split(strings.TrimSpace(l), -1); !slices.Equal(got, header) {
				t.Errorf("performance.md's table columns: got %q, want bench's %q", got, header)
			}
		}
	}
	if !found {
		t.Error("performance.md's block has no table header (a line starting with \"path\")")
	}
	// The goals' lines come after the table, under their own heading.
	var withGoal strings.Builder
	(&bench.Result{Runs: []bench.Run{{}}, Goals: []bench.GoalFigure{{Name: "a goal"}}}).Text(&withGoal)
	heading := ""
	for _, l := range strings.Split(withGoal.String(), "\n") {
		if strings.HasPrefix(l, "goals ") {
			heading = l
		}
	}
	if heading == "" || !strings.Contains(block, "\n"+heading+"\n") {
		t.Errorf("performance.md's block lacks bench's goals heading %q", heading)
	}
}

// TestUnitDocumentation: every Documentation= of the systemd units, and every link the NixOS
// module renders, names a document this repository has and installs.
func TestUnitDocumentation(t *testing.T) {
	units, err := filepath.Glob(filepath.Join(root, "systemd", "*.s*"))
	if err != nil || len(units) == 0 {
		t.Fatalf("no units found: %v", err)
	}
	const prefix = "file:///usr/local/share/doc/xmsg/"
	for _, u := range units {
		b, err := os.ReadFile(u)
		if err != nil {
			t.Fatal(err)
		}
		found := false
		for _, line := range strings.Split(string(b), "\n") {
			v, ok := strings.CutPrefix(line, "Documentation=")
			if !ok {
				continue
			}
			found = true
			for _, uri := range strings.Fields(v) {
				name, ok := strings.CutPrefix(uri, prefix)
				if !ok {
					t.Errorf("%s: Documentation=%s: want %s<doc>, where operations.md installs the docs", filepath.Base(u), uri, prefix)
					continue
				}
				if _, err := os.Stat(name); err != nil {
					t.Errorf("%s: Documentation=%s: docs/%s does not exist", filepath.Base(u), uri, name)
				}
			}
		}
		if !found {
			t.Errorf("%s has no Documentation=", filepath.Base(u))
		}
	}
	// The install step the units rely on is the one the docs give.
	for _, f := range []string{"operations.md"} {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(b), "docs/*.md /usr/local/share/doc/xmsg/") {
			t.Errorf("%s does not show installing docs/*.md into /usr/local/share/doc/xmsg/", f)
		}
	}
	mod, err := os.ReadFile(filepath.Join(root, "nix", "module.nix"))
	if errors.Is(err, fs.ErrNotExist) {
		// The Nix package builds and tests a source tree without its .nix files (nix/source.nix).
		t.Log("no nix/module.nix in this tree: the module's links are not checked")
		return
	}
	if err != nil {
		t.Fatal(err)
	}
	pkg, err := os.ReadFile(filepath.Join(root, "nix", "package.nix"))
	if err != nil {
		t.Fatal(err)
	}
	links := regexp.MustCompile(`/share/doc/xmsg/([a-z]+\.md)`).FindAllStringSubmatch(string(mod), -1)
	if len(links) == 0 {
		t.Error("nix/module.nix renders no documentation links")
	}
	for _, m := range links {
		if _, err := os.Stat(m[1]); err != nil {
			t.Errorf("nix/module.nix links share/doc/xmsg/%s: docs/%s does not exist", m[1], m[1])
		}
	}
	if !strings.Contains(string(pkg), `share/doc/xmsg" README.md docs/*.md`) {
		t.Error("nix/package.nix does not install docs/*.md into share/doc/xmsg")
	}
}

// flagTable returns the rows of a markdown table whose first cell starts with a `--flag`,
// in the part of doc between the headings start and end: flag name → {env, default}. A
// default cell is compared without its backticks.
func flagTable(t *testing.T, doc, start, end string) map[string][2]string {
	t.Helper()
	b, err := os.ReadFile(doc)
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	i := strings.Index(s, start)
	if i < 0 {
		t.Fatalf("%s has no %q", doc, start)
	}
	s = s[i:]
	if j := strings.Index(s, end); j >= 0 {
		s = s[:j]
	}
	flagRe := regexp.MustCompile("^`--([a-z0-9-]+)")
	envRe := regexp.MustCompile("^`(XMSG_[A-Z0-9_]+)`")
	rows := map[string][2]string{}
	for _, line := range strings.Split(s, "\n") {
		cells := strings.Split(strings.Trim(line, "|"), " | ")
		if len(cells) < 3 {
			continue
		}
		m := flagRe.FindStringSubmatch(strings.TrimSpace(cells[0]))
		if m == nil {
			continue
		}
		e := envRe.FindStringSubmatch(strings.TrimSpace(cells[1]))
		if e == nil {
			t.Errorf("%s: --%s: env cell %q does not start with `XMSG_...`", doc, m[1], cells[1])
			continue
		}
		if _, dup := rows[m[1]]; dup {
			t.Errorf("%s: --%s is listed twice", doc, m[1])
		}
		rows[m[1]] = [2]string{e[1], strings.ReplaceAll(strings.TrimSpace(cells[2]), "`", "")}
	}
	return rows
}

// usageFlags parses config.Usage (what `xmsg serve --help` prints): flag name → {env, default}.
func usageFlags(t *testing.T) map[string][2]string {
	t.Helper()
	var buf strings.Builder
	config.Usage(&buf)
	lines := strings.Split(buf.String(), "\n")
	flags := map[string][2]string{}
	for i, line := range lines {
		name, ok := strings.CutPrefix(line, "  --")
		if !ok {
			continue
		}
		name, _, _ = strings.Cut(name, " ")
		if i+1 >= len(lines) {
			t.Fatalf("--help: --%s has no env line", name)
		}
		env, def, ok := strings.Cut(strings.TrimSpace(lines[i+1]), ", default ")
		env, ok2 := strings.CutPrefix(env, "env ")
		if !ok || !ok2 {
			t.Fatalf("--help: --%s: env line %q is not \"env X, default D\"", name, lines[i+1])
		}
		flags[name] = [2]string{env, def}
	}
	if len(flags) < 40 {
		t.Fatalf("parsed %d flags from --help; want every flag (is the parser broken?)", len(flags))
	}
	return flags
}

// TestServeFlagTable: docs/protocol.md §10.1 lists exactly the flags `xmsg serve --help`
// prints, each with the same environment variable and default, so an added, renamed or
// re-defaulted flag cannot leave the reference behind (deleting a row of the table, or
// changing a default in config, turns this red).
func TestServeFlagTable(t *testing.T) {
	help := usageFlags(t)
	doc := flagTable(t, "protocol.md", "### 10.1 ", "### 10.2 ")
	for name, h := range help {
		d, ok := doc[name]
		switch {
		case !ok:
			t.Errorf("protocol.md §10.1 does not list --%s (env %s, default %s)", name, h[0], h[1])
		case d != h:
			t.Errorf("protocol.md §10.1: --%s is documented with env %s, default %q; --help says env %s, default %q", name, d[0], d[1], h[0], h[1])
		}
	}
	for name := range doc {
		if _, ok := help[name]; !ok {
			t.Errorf("protocol.md §10.1 lists --%s, which xmsg serve --help does not have", name)
		}
	}
}

// TestNixOptionNames: every module option the NixOS parts of the docs name exists in
// nix/module.nix, and every `settings.<key>` is a flag of `xmsg serve`, so a renamed option
// (requireLandlock became settings.require-landlock) cannot stay in the docs.
func TestNixOptionNames(t *testing.T) {
	mod, err := os.ReadFile(filepath.Join(root, "nix", "module.nix"))
	if errors.Is(err, fs.ErrNotExist) {
		t.Log("no nix/module.nix in this tree: option names are not checked")
		return
	}
	if err != nil {
		t.Fatal(err)
	}
	declared := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^\s*([A-Za-z][A-Za-z0-9-]*) = (?:mkOption|mkEnableOption)\b`).FindAllStringSubmatch(string(mod), -1) {
		declared[m[1]] = true
	}
	for _, m := range regexp.MustCompile(`option = "([A-Za-z]+)";`).FindAllStringSubmatch(string(mod), -1) {
		declared[m[1]] = true // the credential options, built from a list
	}
	for _, want := range []string{"svcExecutables", "sessionDirs", "listenAddress", "certFile", "require-landlock"} {
		if !declared[want] {
			t.Fatalf("found no declaration of %s in nix/module.nix (is the pattern broken?)", want)
		}
	}
	flags := usageFlags(t)
	// Names of NixOS itself or of the flake, not of this module.
	notOurs := map[string]bool{"nixosModules": true, "specialArgs": true, "serviceConfig": true, "allowedTCPPorts": true,
		"moduleTests": true, "vendorHash": true}
	camel := regexp.MustCompile(`\b(?:federation\.)?([a-z]+[A-Z][A-Za-z]*)\b`)
	setting := regexp.MustCompile(`settings\.("?)([a-z][a-z0-9-]*)"?`)
	// §4 holds every NixOS part of the docs (the README's former section too, as a subsection).
	for _, part := range []struct{ file, start, end string }{
		{"operations.md", "## 4. NixOS", "## 5. "},
	} {
		b, err := os.ReadFile(part.file)
		if err != nil {
			t.Fatal(err)
		}
		s := string(b)
		i := strings.Index(s, part.start)
		j := strings.Index(s, part.end)
		if i < 0 || j < i {
			t.Fatalf("%s: no section %q..%q", part.file, part.start, part.end)
		}
		s = s[i:j]
		for _, m := range camel.FindAllStringSubmatch(s, -1) {
			if !declared[m[1]] && !notOurs[m[1]] {
				t.Errorf("%s names option %s, which nix/module.nix does not declare", part.file, m[1])
			}
		}
		for _, m := range setting.FindAllStringSubmatch(s, -1) {
			if _, ok := flags[m[2]]; !ok {
				t.Errorf("%s names settings.%s, which is not a flag of xmsg serve", part.file, m[2])
			}
		}
	}
}

// TestLogTableMessagesExist: every log line that operations.md §6 lists is one the code
// writes: the message of each (its words before the first key=value, "..." or "…") begins a
// string literal in the code. So a line renamed or dropped in the code (a leaf's "leaf
// register socket", long since "leaf sockets register=... http=...") cannot stay documented.
func TestLogTableMessagesExist(t *testing.T) {
	b, err := os.ReadFile("operations.md")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	start := strings.Index(doc, "## 6. Logs")
	if start < 0 {
		t.Fatal("operations.md has no §6 Logs")
	}
	table := doc[start:]
	if end := strings.Index(table[1:], "\n## "); end >= 0 {
		table = table[:end+1]
	}
	var code strings.Builder
	for _, f := range sourceFiles(t) {
		if filepath.Ext(f) != ".go" || strings.HasSuffix(f, "_test.go") || !(strings.HasPrefix(f, "internal") || strings.HasPrefix(f, "cmd")) {
			continue
		}
		src, err := os.ReadFile(filepath.Join(root, f))
		if err != nil {
			t.Fatal(err)
		}
		code.Write(src)
	}
	src := code.String()
	cell := regexp.MustCompile("`([^`]+)`")
	// Cut at the first key=value, elision, bracket or placeholder (N, M).
	cut := regexp.MustCompile(`\s*(\S+=|\.\.\.|…|\[|<|\(|\b[NM]\b).*$`)
	// written: msg begins a literal, or is one literal ending in ": " and another after it
	// (a prefix added to a message built elsewhere, "federation capacity: " + w).
	written := func(msg string) bool {
		if strings.Contains(src, `"`+msg) {
			return true
		}
		for i := strings.Index(msg, ": "); i >= 0; {
			if strings.Contains(src, `"`+msg[:i+2]+`"`) && strings.Contains(src, `"`+msg[i+2:]) {
				return true
			}
			j := strings.Index(msg[i+2:], ": ")
			if j < 0 {
				break
			}
			i += 2 + j
		}
		return false
	}
	n := 0
	for _, line := range strings.Split(table, "\n") {
		cols := strings.Split(line, "|")
		if len(cols) < 3 || !strings.HasPrefix(line, "| `") {
			continue
		}
		for _, m := range cell.FindAllStringSubmatch(cols[1], -1) {
			for _, part := range strings.Split(m[1], "…") {
				msg := strings.TrimSpace(cut.ReplaceAllString(strings.TrimSpace(part), ""))
				if msg == "" {
					continue
				}
				n++
				if !written(msg) {
					t.Errorf("operations.md §6 lists the log line %q, whose message %q no string in the code begins with", m[1], msg)
				}
			}
		}
	}
	if n < 20 {
		t.Fatalf("found %d log lines in operations.md §6; the table's format changed", n)
	}
}

// TestFlagNeedsAreTrue: where protocol.md §10.1 says a flag needs another ("`--leaf` without
// `--leaf-principal`" among the refusals, "needs `--leaf-principal`" in the table), the
// configuration really refuses it without that one, and says so. A requirement the code
// dropped (a leaf once needed --listen; it has its own http.sock now) cannot stay documented.
func TestFlagNeedsAreTrue(t *testing.T) {
	b, err := os.ReadFile("protocol.md")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	start, end := strings.Index(doc, "### 10.1 "), strings.Index(doc, "### 10.2 ")
	if start < 0 || end < start {
		t.Fatal("protocol.md has no §10.1")
	}
	sec := strings.Join(strings.Fields(doc[start:end]), " ") // claims may wrap lines
	help := usageFlags(t)
	// Values that pass a flag's own checks, for the flags a claim names.
	sample := map[string]string{"leaf-principal": "svc:x", "listen": "127.0.0.1:7787", "leaf-register-sock": "/run/x/register.sock"}
	arg := func(name string) []string {
		if help[name][1] == "false" {
			return []string{"--" + name}
		}
		v, ok := sample[name]
		if !ok {
			t.Fatalf("no sample value for --%s: add one", name)
		}
		return []string{"--" + name, v}
	}
	type claim struct {
		flag  string
		needs []string
	}
	var claims []claim
	flagList := "`--([a-z-]+)`((?: (?:or|and) `--[a-z-]+`)*)"
	one := regexp.MustCompile("`--([a-z-]+)`")
	without := regexp.MustCompile("`--([a-z-]+)` without `--([a-z-]+)`((?: (?:or|and) `--[a-z-]+`)*)")
	for _, m := range without.FindAllStringSubmatch(sec, -1) {
		c := claim{flag: m[1], needs: []string{m[2]}}
		for _, o := range one.FindAllStringSubmatch(m[3], -1) {
			c.needs = append(c.needs, o[1])
		}
		claims = append(claims, c)
	}
	needs := regexp.MustCompile("^\\| `--([a-z-]+)` \\|[^|]*\\|[^|]*\\|[^|]*needs " + flagList)
	for _, line := range strings.Split(doc[start:end], "\n") {
		if m := needs.FindStringSubmatch(line); m != nil {
			c := claim{flag: m[1], needs: []string{m[2]}}
			for _, o := range one.FindAllStringSubmatch(m[3], -1) {
				c.needs = append(c.needs, o[1])
			}
			claims = append(claims, c)
		}
	}
	if len(claims) < 2 {
		t.Fatalf("found %d claims of a flag needing another in §10.1; the wording changed", len(claims))
	}
	// Refused at start, not by the flags alone: the peers file may come as a credential
	// (internal/fed refuses a listener without one).
	atStart := map[[2]string]bool{{"fed-listen", "peers-file"}: true}
	env := func(k string) string {
		return map[string]string{"HOME": "/home/u", "XDG_RUNTIME_DIR": "/run/user/1000"}[k]
	}
	for _, c := range claims {
		for _, missing := range c.needs {
			if atStart[[2]string{c.flag, missing}] {
				continue
			}
			args := arg(c.flag)
			for _, other := range c.needs {
				if other != missing {
					args = append(args, arg(other)...)
				}
			}
			_, err := config.Parse(args, env)
			if err == nil || !strings.Contains(err.Error(), "--"+missing) {
				t.Errorf("protocol.md §10.1 says --%s needs --%s, but xmsg serve %s: %v", c.flag, missing, strings.Join(args, " "), err)
			}
		}
	}
}
