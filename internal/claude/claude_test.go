package claude

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/xmsg/xmsg/internal/peercred"
)

func newScanner(t *testing.T, dirs ...string) (*Scanner, *bytes.Buffer) {
	var log bytes.Buffer
	return &Scanner{Dirs: dirs, Proc: peercred.Proc{}, UID: os.Geteuid(), Log: slog.New(slog.NewTextHandler(&log, nil))}, &log
}

// writeSession writes a session file for this (live) test process, or for a dead pid.
func writeSession(t *testing.T, dir, file, id, name string, live bool) {
	t.Helper()
	start, _ := peercred.Proc{}.StartTime(os.Getpid())
	pid := os.Getpid()
	if !live {
		start = "1" // not this process's start time: the entry is dead
	}
	raw, _ := json.Marshal(map[string]any{"pid": pid, "sessionId": id, "name": name, "cwd": "/", "status": "idle", "procStart": start, "messagingSocketPath": "/nonexistent"})
	if err := os.WriteFile(filepath.Join(dir, file), raw, 0o600); err != nil {
		t.Fatal(err)
	}
}

func TestScanSkipsWhatIsNotAPlainOwnedFile(t *testing.T) {
	dir := t.TempDir()
	writeSession(t, dir, "ok.json", "id-ok", "ok", true)
	os.Symlink(filepath.Join(dir, "ok.json"), filepath.Join(dir, "link.json"))
	syscall.Mkfifo(filepath.Join(dir, "fifo.json"), 0o600) // would block a naive open
	os.WriteFile(filepath.Join(dir, "secret.key"), []byte("x"), 0o600)
	os.WriteFile(filepath.Join(dir, "bad.json"), []byte("{"), 0o600)
	s, log := newScanner(t, dir)
	got := s.Scan()
	if len(got) != 1 || got[0].ID != "id-ok" || !got[0].Live {
		t.Fatalf("Scan = %+v, want only the plain file", got)
	}
	for _, want := range []string{"link.json", "fifo.json", "bad.json"} {
		if !strings.Contains(log.String(), want) {
			t.Errorf("no warning about %s:\n%s", want, log)
		}
	}
	if strings.Contains(log.String(), "secret.key") {
		t.Error("a .key file was looked at")
	}
}

// TestWarningsOncePerProblem: every request rescans, so a bad file must not flood the log.
func TestWarningsOncePerProblem(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "bad.json"), []byte("{"), 0o600)
	s, log := newScanner(t, dir)
	for range 5 {
		s.Scan()
	}
	if n := strings.Count(log.String(), "bad.json"); n != 1 {
		t.Errorf("bad.json warned %d times over 5 scans, want 1", n)
	}
	// Fixed, then broken again: warned again.
	writeSession(t, dir, "bad.json", "x", "x", true)
	s.Scan()
	os.WriteFile(filepath.Join(dir, "bad.json"), []byte("{"), 0o600)
	s.Scan()
	if n := strings.Count(log.String(), "bad.json"); n != 2 {
		t.Errorf("bad.json warned %d times, want 2 (once per occurrence)", n)
	}
}

// TestRewrittenFileIsReadAgain: the parse cache never serves an old version of a file.
func TestRewrittenFileIsReadAgain(t *testing.T) {
	dir := t.TempDir()
	writeSession(t, dir, "s.json", "id-1", "before", true)
	s, _ := newScanner(t, dir)
	if got := s.Scan(); len(got) != 1 || *got[0].Name != "before" {
		t.Fatalf("first scan = %+v", got)
	}
	// Same size, new content, in place (same inode): the mtime tells them apart.
	time.Sleep(10 * time.Millisecond)
	writeSession(t, dir, "s.json", "id-1", "after!", true)
	if got := s.Scan(); len(got) != 1 || *got[0].Name != "after!" {
		t.Errorf("after rewrite: %+v, want the new name", got)
	}
}

func TestForkClaimsAmongLiveOnly(t *testing.T) {
	a, b, c := t.TempDir(), t.TempDir(), t.TempDir()
	// Order the dirs by path so the claims are predictable.
	dirs := []string{a, b, c}
	writeSession(t, dirs[0], "x.json", "X", "", false) // dead, sorts first
	writeSession(t, dirs[1], "x.json", "X", "", true)
	writeSession(t, dirs[2], "x.json", "X", "", true)
	s, _ := newScanner(t, dirs...)
	ids := map[string]bool{}
	for _, se := range s.Scan() {
		if se.Live {
			ids[se.ID] = true
		}
	}
	if !ids["X"] || !ids["X~2"] || len(ids) != 2 {
		t.Errorf("live ids = %v, want X and X~2 (the dead file takes no claim)", ids)
	}
}
