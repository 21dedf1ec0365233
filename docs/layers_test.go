package docs

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

const module = "github.com/xmsg/xmsg/"

// layerOrder reads design.md §1's layer table: every package it names, in the table's order
// (rows bottom-up, left to right within a row).
func layerOrder(t *testing.T) map[string]int {
	t.Helper()
	sec := section(t, "design.md", "## 1. Layout", "## 2. ")
	order := map[string]int{}
	tick := regexp.MustCompile("`([a-z/]+)`")
	in := false
	for _, line := range strings.Split(sec, "\n") {
		if strings.HasPrefix(line, "| layer | packages |") {
			in = true
			continue
		}
		if !in {
			continue
		}
		if !strings.HasPrefix(line, "|") {
			break
		}
		cols := strings.Split(line, "|")
		if len(cols) < 4 || strings.HasPrefix(cols[1], "---") {
			continue
		}
		for _, m := range tick.FindAllStringSubmatch(cols[2], -1) {
			if _, dup := order[m[1]]; dup {
				t.Errorf("design.md §1 places %s twice", m[1])
			}
			order[m[1]] = len(order)
		}
	}
	if len(order) < 30 {
		t.Fatalf("design.md §1's layer table names %d packages; want every internal package", len(order))
	}
	return order
}

func section(t *testing.T, file, from, to string) string {
	t.Helper()
	b := read(t, file)
	i := strings.Index(b, from)
	j := strings.Index(b[i+1:], to)
	if i < 0 || j < 0 {
		t.Fatalf("%s has no section %q before %q", file, from, to)
	}
	return b[i : i+1+j]
}

// goFile is one non-test Go file of the tree, parsed.
type goFile struct {
	pkg  string // internal package ("bus", "fed/fedtest") or "cmd/xmsg"
	path string
	f    *ast.File
}

func goFiles(t *testing.T) []goFile {
	t.Helper()
	var out []goFile
	fset := token.NewFileSet()
	for _, top := range []string{"internal", "cmd"} {
		err := filepath.WalkDir(filepath.Join(root, top), func(path string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") || strings.Contains(path, "testdata") {
				return err
			}
			f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
			if err != nil {
				return err
			}
			rel, _ := filepath.Rel(root, filepath.Dir(path))
			out = append(out, goFile{pkg: strings.TrimPrefix(filepath.ToSlash(rel), "internal/"), path: path, f: f})
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	return out
}

// TestLayering: every internal package is placed in design.md §1's table, and imports only
// packages placed before it there; only the packages §1 names import store. Mutants tried:
// store imports bus (an upward import): red; a new package left out of the table: red; fed
// importing store removed from the allowed list: red.
func TestLayering(t *testing.T) {
	order := layerOrder(t)
	storeOK := map[string]bool{"records": true, "bus": true, "hub": true, "fed": true, "daemon": true, "daemontest": true, "cmd/xmsg": true}
	files := goFiles(t)
	for _, g := range files {
		own, placed := order[g.pkg]
		if !placed && g.pkg != "cmd/xmsg" {
			t.Errorf("%s: package %s is not placed in design.md §1's layer table", g.path, g.pkg)
			continue
		}
		if g.pkg == "cmd/xmsg" {
			own = len(order) // the binary is above everything
		}
		for _, imp := range g.f.Imports {
			p, _ := strconv.Unquote(imp.Path.Value)
			if !strings.HasPrefix(p, module+"internal/") {
				continue
			}
			dep := strings.TrimPrefix(p, module+"internal/")
			at, ok := order[dep]
			if !ok {
				continue // reported as unplaced where it is defined
			}
			if at >= own {
				t.Errorf("%s: %s imports %s, which design.md §1 places above it (or beside it, after it)", g.path, g.pkg, dep)
			}
			if dep == "store" && !storeOK[g.pkg] {
				t.Errorf("%s: %s imports store; design.md §1 lets only %v touch it", g.path, g.pkg, keys(storeOK))
			}
		}
	}
}

// TestProcReaders: only peercred names another process's /proc entries; the other readers of
// /proc are the ones design.md §1 lists, each for what it lists. A string literal starting
// with /proc is the test's witness (every read in the tree is spelled that way). Mutant tried:
// bench reading "/proc/1/stat": red.
func TestProcReaders(t *testing.T) {
	allowed := map[string][]string{
		"custody":  {"/proc/self/fd/"},
		"cmd/xmsg": {"/proc/self/fd/"},
		"doctor":   {"/proc/sys/"},
		"bench":    {"/proc/stat"},
		"daemon":   {"/proc"}, // the Landlock rule's path, exactly
	}
	n := 0
	for _, g := range goFiles(t) {
		ast.Inspect(g.f, func(x ast.Node) bool {
			lit, ok := x.(*ast.BasicLit)
			if !ok || lit.Kind != token.STRING {
				return true
			}
			s, err := strconv.Unquote(lit.Value)
			if err != nil || !strings.HasPrefix(s, "/proc") {
				return true
			}
			n++
			if g.pkg == "peercred" {
				return true
			}
			for _, a := range allowed[g.pkg] {
				if s == a || (strings.HasSuffix(a, "/") && strings.HasPrefix(s, a)) {
					return true
				}
			}
			t.Errorf("%s: %s names %q; design.md §1 says who may read /proc, and what", g.path, g.pkg, s)
			return true
		})
	}
	if n < 5 {
		t.Fatalf("found %d /proc literals; the walk is broken", n)
	}
}

// recordWrites are the store's writes of a message's records (design.md §1: only
// records calls them). Queue entries and process sessions are not records.
var recordWrites = []string{"PutMessage", "DeleteMessage", "AddReply", "PutReply", "PutIdem", "DeleteIdem",
	"PutOutbound", "DeleteOutbound", "PutMailbox", "PutMailboxMax", "AckMailbox", "SetMessageOutcome", "SetOutboundOutcome"}

// TestRecordWriters: only records (and store itself) calls the store's record writes.
// Each name must still be a method of the store's transaction, so a rename cannot empty the
// rule. Mutant tried: hub's settle calling tx.AckMailbox itself again: red.
func TestRecordWriters(t *testing.T) {
	writes := map[string]bool{}
	for _, w := range recordWrites {
		writes[w] = false
	}
	calls := 0
	for _, g := range goFiles(t) {
		ast.Inspect(g.f, func(x ast.Node) bool {
			switch x := x.(type) {
			case *ast.FuncDecl:
				if g.pkg == "store" && x.Recv != nil {
					if _, ok := writes[x.Name.Name]; ok {
						writes[x.Name.Name] = true
					}
				}
			case *ast.CallExpr:
				sel, ok := x.Fun.(*ast.SelectorExpr)
				if !ok {
					return true
				}
				if _, ok := writes[sel.Sel.Name]; !ok {
					return true
				}
				switch g.pkg {
				case "records":
					calls++
				case "store":
				default:
					t.Errorf("%s: %s calls %s; design.md §1 lets only records write a message's records", g.path, g.pkg, sel.Sel.Name)
				}
			}
			return true
		})
	}
	for w, found := range writes {
		if !found {
			t.Errorf("store has no method %s: the rule's list is stale", w)
		}
	}
	if calls < len(recordWrites)-1 {
		t.Fatalf("records calls %d record writes; the walk is broken", calls)
	}
}

func keys(m map[string]bool) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

func read(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
