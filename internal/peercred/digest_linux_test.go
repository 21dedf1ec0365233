//go:build linux

package peercred

import (
	"crypto/sha256"
	"encoding/hex"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// TestDigestsFollowContent: a remembered digest is the content's: a file written in place
// (same inode) gets its new digest, never the remembered one.
func TestDigestsFollowContent(t *testing.T) {
	var d Digests
	p := filepath.Join(t.TempDir(), "f")
	for _, content := range []string{"one", "two", "two!"} {
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		sum := sha256.Sum256([]byte(content))
		for i := 0; i < 2; i++ { // the second read is the remembered one
			got, err := d.File(p)
			if want := hex.EncodeToString(sum[:]); err != nil || got != want {
				t.Fatalf("File(%q) = %s, %v; want %s", content, got, err, want)
			}
		}
	}
	if _, err := d.File(t.TempDir()); err == nil {
		t.Error("a directory has a digest")
	}
}

// TestExeDigestOfDeleted: the running file of a process whose executable was deleted has no
// digest, although /proc/<pid>/exe still opens it.
func TestExeDigestOfDeleted(t *testing.T) {
	dir := t.TempDir()
	sleep, err := exec.LookPath("sleep")
	if err != nil {
		t.Skip("no sleep on PATH")
	}
	data, err := os.ReadFile(sleep)
	if err != nil {
		t.Fatal(err)
	}
	exe := filepath.Join(dir, "sleep")
	if err := os.WriteFile(exe, data, 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe, "30")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	var d Digests
	want := sha256.Sum256(data)
	if path, sum, err := (Proc{}).ExeDigest(cmd.Process.Pid, &d); err != nil || path != exe || sum != hex.EncodeToString(want[:]) {
		t.Fatalf("ExeDigest = %q %s %v; want %q and the file's digest", path, sum, err, exe)
	}
	os.Remove(exe)
	if _, _, err := (Proc{}).ExeDigest(cmd.Process.Pid, &d); err == nil {
		t.Fatal("ExeDigest of a deleted executable succeeded")
	}
}
