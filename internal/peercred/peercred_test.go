package peercred

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// writeStat writes a fake /proc/<pid>/stat (and returns its dir) with the
// layout of a real one: comm in parentheses, state, ppid, ..., starttime as
// field 22.
func writeStat(t *testing.T, root string, pid int, comm string, ppid int, start string) string {
	t.Helper()
	dir := filepath.Join(root, fmt.Sprint(pid))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	line := fmt.Sprintf("%d (%s) S %d %d %d 0 -1 4194304 101 0 0 0 0 0 0 0 20 0 1 0 %s 3133440 379 18446744073709551615\n",
		pid, comm, ppid, ppid, ppid, start)
	if err := os.WriteFile(filepath.Join(dir, "stat"), []byte(line), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

func TestParseStat(t *testing.T) {
	tests := []struct {
		name, in string
		want     Stat
		wantErr  bool
	}{
		{
			name: "real layout",
			in:   "12842 (cat) R 12822 12822 1662 0 -1 4194304 101 0 0 0 0 0 0 0 20 0 1 0 40497 3133440 379 18446744073709551615 0\n",
			want: Stat{PID: 12842, PPID: 12822, StartTime: "40497", Comm: "cat"},
		},
		{
			name: "comm with spaces and parens",
			in:   "7 (a) b (c) ) S 3 3 3 0 -1 4194304 101 0 0 0 0 0 0 0 20 0 1 0 99 1 2\n",
			want: Stat{PID: 7, PPID: 3, StartTime: "99", Comm: "a) b (c) "},
		},
		{
			name: "comm that imitates fields",
			in:   "7 (x) S 1 1 1 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 5 ) S 42 1 1 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 77 1\n",
			want: Stat{PID: 7, PPID: 42, StartTime: "77", Comm: "x) S 1 1 1 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 5 "},
		},
		{
			name: "exactly 22 fields",
			in:   "1 (init) S 0 1 1 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 3",
			want: Stat{PID: 1, PPID: 0, StartTime: "3", Comm: "init"},
		},
		{name: "empty", in: "", wantErr: true},
		{name: "no parens", in: "1 init S 0 1", wantErr: true},
		{name: "close before open", in: "1 )init( S 0 1 1 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 3", wantErr: true},
		{name: "too few fields", in: "1 (init) S 0 1 1 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0", wantErr: true},
		{name: "negative ppid", in: "1 (x) S -1 1 1 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 3", wantErr: true},
		{name: "signed starttime", in: "1 (x) S 0 1 1 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 +3", wantErr: true},
		{name: "non-numeric starttime", in: "1 (x) S 0 1 1 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 3a", wantErr: true},
		{name: "non-numeric pid", in: "x1 (x) S 0 1 1 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 3", wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseStat([]byte(tt.in))
			if tt.wantErr {
				if err == nil {
					t.Fatalf("parseStat(%q) = %+v, want an error", tt.in, got)
				}
				return
			}
			if err != nil {
				t.Fatalf("parseStat(%q) error = %v", tt.in, err)
			}
			if got != tt.want {
				t.Errorf("parseStat(%q) = %+v, want %+v", tt.in, got, tt.want)
			}
		})
	}
}

func FuzzParseStat(f *testing.F) {
	if self, err := os.ReadFile("/proc/self/stat"); err == nil {
		f.Add(self)
	}
	for _, s := range []string{
		"",
		"(",
		")",
		")(",
		"1 () S 0 1 1 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 3",
		"7 (a) b (c) ) S 3 3 3 0 -1 4194304 101 0 0 0 0 0 0 0 20 0 1 0 99 1 2\n",
		"99999999999999999999 (x) S 1 1 1 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 3",
		"1 (x) S 1 1 1 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 18446744073709551616",
		"1 (\x00\xff) S 1 1 1 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 3",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		st, err := parseStat(data)
		if err != nil {
			return
		}
		if st.PID < 0 || st.PPID < 0 || st.StartTime == "" || strings.Trim(st.StartTime, "0123456789") != "" {
			t.Fatalf("parseStat(%q) = %+v: invalid fields accepted", data, st)
		}
		// The comm field is everything between the first '(' and the last ')'.
		if !strings.Contains(string(data), "("+st.Comm+")") {
			t.Fatalf("parseStat(%q) comm %q is not delimited by the parentheses", data, st.Comm)
		}
	})
}

func TestStatFakeTree(t *testing.T) {
	root := t.TempDir()
	writeStat(t, root, 42, "evil) S 1 1", 7, "1000")
	p := Proc{Root: root}
	st, err := p.Stat(42)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := st, (Stat{PID: 42, PPID: 7, StartTime: "1000", Comm: "evil) S 1 1"}); got != want {
		t.Errorf("Stat(42) = %+v, want %+v", got, want)
	}
	if got, err := p.StartTime(42); err != nil || got != "1000" {
		t.Errorf("StartTime(42) = %q, %v; want 1000", got, err)
	}
	for _, pid := range []int{0, -1, 43} {
		if _, err := p.Stat(pid); err == nil {
			t.Errorf("Stat(%d) succeeded on a tree without it", pid)
		}
	}
	// A stat file whose pid field disagrees with its directory is refused.
	dir := writeStat(t, root, 50, "x", 1, "5")
	if err := os.Rename(dir, filepath.Join(root, "51")); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Stat(51); err == nil {
		t.Error("Stat(51) accepted a stat file that says pid 50")
	}
}

func TestAliveFakeTree(t *testing.T) {
	root := t.TempDir()
	writeStat(t, root, 42, "x", 1, "1000")
	p := Proc{Root: root}
	tests := []struct {
		pid   int
		start string
		want  bool
	}{
		{42, "1000", true},
		{42, "1001", false},
		{42, "100", false},
		{42, "", false},
		{43, "1000", false},
	}
	for _, tt := range tests {
		if got := p.Alive(tt.pid, tt.start); got != tt.want {
			t.Errorf("Alive(%d, %q) = %v, want %v", tt.pid, tt.start, got, tt.want)
		}
	}
}

func TestAncestorsFakeTree(t *testing.T) {
	root := t.TempDir()
	// 50 -> 40 -> 30 -> 20 -> 1; 60 -> 61 (missing); 70 -> 71 started later (pid reused).
	writeStat(t, root, 1, "init", 0, "1")
	writeStat(t, root, 20, "a", 1, "10")
	writeStat(t, root, 30, "b", 20, "20")
	writeStat(t, root, 40, "c", 30, "30")
	writeStat(t, root, 50, "d", 40, "40")
	writeStat(t, root, 60, "e", 61, "60")
	writeStat(t, root, 70, "f", 71, "70")
	writeStat(t, root, 71, "g", 1, "700")
	writeStat(t, root, 80, "h", 81, "80")
	writeStat(t, root, 81, "i", 80, "80") // a cycle, only possible in a fake tree
	p := Proc{Root: root}
	tests := []struct {
		name     string
		pid, max int
		want     []int
	}{
		{"whole chain, stops after ppid 1", 50, 32, []int{50, 40, 30, 20}},
		{"max", 50, 2, []int{50, 40}},
		{"max below one", 50, 0, []int{50}},
		{"init itself", 1, 32, []int{1}},
		{"unreadable parent", 60, 32, []int{60}},
		{"parent started after child", 70, 32, []int{70}},
		{"cycle bounded by max", 80, 5, []int{80, 81, 80, 81, 80}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			chain, err := p.Ancestors(tt.pid, tt.max)
			if err != nil {
				t.Fatal(err)
			}
			var got []int
			for _, st := range chain {
				got = append(got, st.PID)
			}
			if fmt.Sprint(got) != fmt.Sprint(tt.want) {
				t.Errorf("Ancestors(%d, %d) = %v, want %v", tt.pid, tt.max, got, tt.want)
			}
		})
	}
	if _, err := p.Ancestors(99, 32); err == nil {
		t.Error("Ancestors(99) of a missing pid succeeded")
	}
}

func TestExeFakeTree(t *testing.T) {
	root := t.TempDir()
	bin := t.TempDir()
	target := filepath.Join(bin, "prog")
	if err := os.WriteFile(target, []byte("x"), 0o755); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(bin, "link")
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
	want, err := Canonical(target)
	if err != nil {
		t.Fatal(err)
	}
	dir := writeStat(t, root, 5, "x", 1, "1")
	if err := os.Symlink(link, filepath.Join(dir, "exe")); err != nil {
		t.Fatal(err)
	}
	// The kernel's " (deleted)" marker is refused even when a file with that
	// very name exists (planted by whoever deleted the binary).
	if err := os.WriteFile(target+" (deleted)", []byte("x"), 0o755); err != nil {
		t.Fatal(err)
	}
	dir = writeStat(t, root, 6, "x", 1, "1")
	if err := os.Symlink(target+" (deleted)", filepath.Join(dir, "exe")); err != nil {
		t.Fatal(err)
	}
	p := Proc{Root: root}
	if got, err := p.Exe(5); err != nil || got != want {
		t.Errorf("Exe(5) = %q, %v; want %q (symlinks resolved)", got, err, want)
	}
	if got, err := p.Exe(6); err == nil {
		t.Errorf("Exe(6) = %q, want an error for a deleted executable", got)
	}
	if got, err := p.Exe(7); err == nil {
		t.Errorf("Exe(7) = %q, want an error for a missing pid", got)
	}
}

func TestCanonical(t *testing.T) {
	dir := t.TempDir()
	real, err := filepath.EvalSymlinks(dir)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "f"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(dir, "f"), filepath.Join(dir, "l")); err != nil {
		t.Fatal(err)
	}
	t.Chdir(dir)
	tests := []struct{ in, want string }{
		{"l", filepath.Join(real, "f")},
		{"./sub/../f", filepath.Join(real, "f")},
		{filepath.Join(dir, "l"), filepath.Join(real, "f")},
	}
	for _, tt := range tests {
		if got, err := Canonical(tt.in); err != nil || got != tt.want {
			t.Errorf("Canonical(%q) = %q, %v; want %q", tt.in, got, err, tt.want)
		}
	}
	if got, err := Canonical("missing"); err == nil {
		t.Errorf("Canonical(missing) = %q, want an error", got)
	}
}
