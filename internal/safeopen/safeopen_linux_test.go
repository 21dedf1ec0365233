//go:build linux

package safeopen

import (
	"net"
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

// TestOpenRefuses: symlinks anywhere on the path, FIFOs, sockets, directories and
// files of another euid are refused; only a regular file of ours is opened.
func TestOpenRefuses(t *testing.T) {
	root := t.TempDir()
	os.Mkdir(filepath.Join(root, "d"), 0o700)
	os.WriteFile(filepath.Join(root, "d", "ok"), []byte("x"), 0o600)
	os.Symlink(filepath.Join(root, "d", "ok"), filepath.Join(root, "d", "link"))
	os.Symlink(filepath.Join(root, "d"), filepath.Join(root, "dirlink"))
	os.Symlink("d", filepath.Join(root, "rellink")) // relative, and stays beneath root

	syscall.Mkfifo(filepath.Join(root, "d", "fifo"), 0o600)
	if l, err := net.Listen("unix", filepath.Join(root, "d", "sock")); err == nil {
		defer l.Close()
	}
	if _, _, err := Open(root, "d/ok"); err != nil {
		t.Fatalf("regular file refused: %v", err)
	}
	refused := []string{"d/link", "dirlink/ok", "rellink/ok", "d/fifo", "d/sock", "d", "../" + filepath.Base(root) + "/d/ok", "/etc/passwd", "d/missing"}
	if os.Geteuid() == 0 {
		other := filepath.Join(root, "d", "other")
		os.WriteFile(other, []byte("x"), 0o644)
		if err := os.Chown(other, 65534, 65534); err != nil {
			t.Fatal(err)
		}
		refused = append(refused, "d/other")
	} else if os.Getenv("CI") == "true" {
		t.Fatal("root is needed in CI to plant a file of another uid")
	}
	for _, rel := range refused {
		if f, _, err := Open(root, rel); err == nil {
			f.Close()
			t.Errorf("Open(%s) succeeded, want a refusal", rel)
		}
	}
}
