//go:build linux

package claude

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/xmsg/xmsg/internal/peercred"
)

func names(ss []Session) []string {
	var out []string
	for _, s := range ss {
		n := "<nil>"
		if s.Name != nil {
			n = *s.Name
		}
		out = append(out, fmt.Sprintf("%s/%s/live=%v", s.ID, n, s.Live))
	}
	return out
}

// TestFreshness: every change made before a request is seen by it, with no waiting between
// the change and the request: a file written, rewritten in place, replaced by a rename,
// deleted, and a file whose process has just died.
func TestFreshness(t *testing.T) {
	dir := t.TempDir()
	s, _ := newScanner(t, dir)
	defer s.Close()
	if got := lookup(t, s, "A", 0); len(got) != 0 {
		t.Fatalf("empty dir: %v", names(got))
	}
	writeSession(t, dir, "a.json", "A", "first", true)
	if got := lookup(t, s, "A", 0); len(got) != 1 || !got[0].Live || *got[0].Name != "first" {
		t.Fatalf("written: %v", names(got))
	}
	// In place, same size, at once (likely within one mtime tick: the version looks the
	// same, the event says otherwise).
	writeSession(t, dir, "a.json", "A", "again", true)
	if got := lookup(t, s, "again", 0); len(got) != 1 {
		t.Fatalf("rewritten in place: %v", names(got))
	}
	writeSession(t, dir, "a.json", "A", "agaim", true)
	if got := lookup(t, s, "agaim", 0); len(got) != 1 {
		t.Fatalf("rewritten in place again at once: %v", names(got))
	}
	tmp := filepath.Join(dir, ".a.tmp")
	writeSession(t, dir, ".a.tmp", "A", "renamed", true)
	if err := os.Rename(tmp, filepath.Join(dir, "a.json")); err != nil {
		t.Fatal(err)
	}
	if got := lookup(t, s, "A", 0); len(got) != 1 || *got[0].Name != "renamed" {
		t.Fatalf("replaced by rename: %v", names(got))
	}
	if got := lookup(t, s, "agaim", 0); len(got) != 0 {
		t.Fatalf("the old version is still served: %v", names(got))
	}
	os.Remove(filepath.Join(dir, "a.json"))
	if got := lookup(t, s, "A", 0); len(got) != 0 {
		t.Fatalf("deleted: %v", names(got))
	}
	// Made stale: the file stays, its process dies.
	child := exec.Command("sleep", "60")
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	start, err := peercred.Proc{}.StartTime(child.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := json.Marshal(map[string]any{"pid": child.Process.Pid, "sessionId": "C", "procStart": start, "messagingSocketPath": "/nonexistent"})
	os.WriteFile(filepath.Join(dir, "c.json"), raw, 0o600)
	if got := lookup(t, s, "C", 0); len(got) != 1 || !got[0].Live {
		t.Fatalf("child session: %v", names(got))
	}
	child.Process.Kill()
	child.Wait()
	if got := lookup(t, s, "C", 0); len(got) != 1 || got[0].Live {
		t.Fatalf("after its process died: %v, want one dead entry", names(got))
	}
	if got := lookup(t, s, "x", child.Process.Pid); len(got) != 1 || got[0].Live {
		t.Fatalf("by pid after its process died: %v", names(got))
	}
}

// TestRecreatedDirKeepsWorking: a watched directory removed and created again (with new
// files) is watched again; the files of the old one are not served.
func TestRecreatedDirKeepsWorking(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "sessions")
	os.Mkdir(dir, 0o700)
	writeSession(t, dir, "old.json", "OLD", "old", true)
	s, _ := newScanner(t, dir)
	defer s.Close()
	if got := lookup(t, s, "OLD", 0); len(got) != 1 {
		t.Fatalf("before: %v", names(got))
	}
	for round := range 3 {
		if err := os.RemoveAll(dir); err != nil {
			t.Fatal(err)
		}
		if got := lookup(t, s, "OLD", 0); len(got) != 0 {
			t.Fatalf("round %d: removed dir still served: %v", round, names(got))
		}
		os.Mkdir(dir, 0o700)
		id := fmt.Sprintf("NEW%d", round)
		writeSession(t, dir, "new.json", id, "new", true)
		if got := lookup(t, s, id, 0); len(got) != 1 || !got[0].Live {
			t.Fatalf("round %d: recreated dir: %v", round, names(got))
		}
		// And changes after the recreation are seen too (the new directory is watched).
		writeSession(t, dir, "new.json", id, "new2", true)
		if got := lookup(t, s, "new2", 0); len(got) != 1 {
			t.Fatalf("round %d: change in the recreated dir: %v", round, names(got))
		}
		if p := s.Problems(); len(p) != 0 {
			t.Fatalf("round %d: problems %v", round, p)
		}
	}
	// Replaced by a rename of another directory over it: same name, other inode.
	other := filepath.Join(filepath.Dir(dir), "other")
	os.Mkdir(other, 0o700)
	writeSession(t, other, "o.json", "OTHER", "o", true)
	os.RemoveAll(dir)
	if err := os.Rename(other, dir); err != nil {
		t.Fatal(err)
	}
	if got := lookup(t, s, "OTHER", 0); len(got) != 1 {
		t.Fatalf("dir renamed over: %v", names(got))
	}
}

// TestLookupChecksOnlyCandidates: a lookup reads /proc only for the files the ref names. The
// stale files' /proc entries are FIFOs, so reading any of them would block the lookup.
func TestLookupChecksOnlyCandidates(t *testing.T) {
	proc, dir := t.TempDir(), t.TempDir()
	stat := func(pid int, start string) {
		os.MkdirAll(filepath.Join(proc, fmt.Sprint(pid)), 0o700)
		line := fmt.Sprintf("%d (x) S 1 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 %s 0 0\n", pid, start)
		os.WriteFile(filepath.Join(proc, fmt.Sprint(pid), "stat"), []byte(line), 0o600)
	}
	file := func(name, id string, pid int, start string) {
		raw, _ := json.Marshal(map[string]any{"pid": pid, "sessionId": id, "name": name, "procStart": start, "messagingSocketPath": "/x"})
		os.WriteFile(filepath.Join(dir, name+".json"), raw, 0o600)
	}
	stat(42, "777")
	file("cand", "CAND", 42, "777")
	for i := range 50 {
		pid := 1000 + i
		os.MkdirAll(filepath.Join(proc, fmt.Sprint(pid)), 0o700)
		if err := syscall.Mkfifo(filepath.Join(proc, fmt.Sprint(pid), "stat"), 0o600); err != nil {
			t.Fatal(err)
		}
		file(fmt.Sprintf("stale%d", i), fmt.Sprintf("S%d", i), pid, "1")
	}
	s, _ := newScanner(t, dir)
	s.Proc = peercred.Proc{Root: proc}
	defer s.Close()
	done := make(chan []Session, 1)
	go func() {
		a, _ := s.Lookup("cand", 0)
		b, _ := s.Lookup("CAND", 42)
		done <- append(a, b...)
	}()
	select {
	case got := <-done:
		if len(got) != 2 || !got[0].Live || !got[1].Live {
			t.Fatalf("lookups = %v", names(got))
		}
	case <-time.After(20 * time.Second):
		// Unblock the stuck reads so the test can end.
		for i := range 50 {
			if f, err := os.OpenFile(filepath.Join(proc, fmt.Sprint(1000+i), "stat"), os.O_WRONLY|syscall.O_NONBLOCK, 0); err == nil {
				f.Close()
			}
		}
		t.Fatal("a lookup read the /proc entry of a file it was not asked about")
	}
}

// lossyWatcher is inotify that loses every file event and then reports the overflow.
type lossyWatcher struct {
	watcher
	overflow bool
}

func (w *lossyWatcher) drain(fn func(int, event, string)) error {
	if w.overflow {
		w.overflow = false
		fn(-1, evOverflow, "")
	}
	return w.watcher.drain(func(int, event, string) {}) // the real events are dropped
}

// TestOverflowRescans: when the kernel reports lost events (IN_Q_OVERFLOW), every directory is
// read again, so nothing written before the request is missed even then.
func TestOverflowRescans(t *testing.T) {
	dir := t.TempDir()
	real, err := newWatcher()
	if err != nil {
		t.Fatal(err)
	}
	w := &lossyWatcher{watcher: real}
	old := startWatch
	startWatch = func() (watcher, error) { return w, nil }
	defer func() { startWatch = old }()
	s, _ := newScanner(t, dir)
	defer s.Close()
	lookup(t, s, "x", 0)
	writeSession(t, dir, "a.json", "A", "a", true)
	if got := lookup(t, s, "A", 0); len(got) != 0 {
		t.Fatalf("the lossy watcher let an event through: %v", names(got))
	}
	w.overflow = true
	if got := lookup(t, s, "A", 0); len(got) != 1 {
		t.Fatalf("after an overflow: %v, want the file written while events were lost", names(got))
	}
}

// lookup is Scanner.Lookup for tests, where a scan is never incomplete.
func lookup(t *testing.T, s *Scanner, ref string, pid int) []Session {
	t.Helper()
	found, err := s.Lookup(ref, pid)
	if err != nil {
		t.Fatalf("Lookup(%q, %d): %v", ref, pid, err)
	}
	return found
}

// failingAddWatcher is a real watcher that cannot watch one directory (as when the user's
// inotify watch limit is reached).
type failingAddWatcher struct {
	watcher
	refuse string
}

func (w *failingAddWatcher) add(dir string) (int, error) {
	if dir == w.refuse {
		return -1, errors.New("no space left on device")
	}
	return w.watcher.add(dir)
}

// TestWatchReport: xmsg doctor's line says whether the session directories are watched,
// and names the fallback (every request rescans) and its cause when inotify is missing or a
// directory could not be watched; a missing directory is neither. Mutants tried: the
// per-directory failure not reported (red); noWatch not reported (red).
func TestWatchReport(t *testing.T) {
	watched, unwatched := t.TempDir(), t.TempDir()
	s, _ := newScanner(t, watched, filepath.Join(t.TempDir(), "missing"))
	defer s.Close()
	if got := s.WatchReport(); got != "watched by inotify (a request reads only what changed)" {
		t.Errorf("all watched: %q", got)
	}

	real, err := newWatcher()
	if err != nil {
		t.Fatal(err)
	}
	old := startWatch
	startWatch = func() (watcher, error) { return &failingAddWatcher{watcher: real, refuse: unwatched}, nil }
	s2, _ := newScanner(t, watched, unwatched)
	defer s2.Close()
	if got, want := s2.WatchReport(), "rescanned on every request, not watched: "+unwatched+": no space left on device"; got != want {
		t.Errorf("one unwatched: %q, want %q", got, want)
	}

	startWatch = func() (watcher, error) { return nil, errors.New("too many open files") }
	defer func() { startWatch = old }()
	s3, _ := newScanner(t, watched)
	defer s3.Close()
	if got, want := s3.WatchReport(), "rescanned on every request (no inotify: too many open files)"; got != want {
		t.Errorf("no inotify: %q, want %q", got, want)
	}
}
