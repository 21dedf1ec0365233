package vmtests

import (
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"testing"
)

// The Nix checks here only parse and evaluate; they never build. They still need a store to
// open, and the system one (/nix, or the nix daemon's socket) is root's on a Debian machine
// with nix-bin installed the usual way. A store of the test binary's own, in a temporary
// directory, serves every user alike, so a contributor who is not root runs the same checks.
var (
	nixStoreOnce sync.Once
	nixStoreDir  string
	nixStoreErr  error
)

// nixStoreConfig is the NIX_CONFIG line that points a Nix command at the test's own store.
func nixStoreConfig() string {
	nixStoreOnce.Do(func() { nixStoreDir, nixStoreErr = os.MkdirTemp("", "xmsg-nixstore-") })
	if nixStoreErr != nil {
		// Fall back to the default store: the command then fails with Nix's own message
		// (for root it still works), which names the problem better than a guess here.
		return ""
	}
	return "store = local?root=" + nixStoreDir
}

func TestMain(m *testing.M) {
	code := m.Run()
	if nixStoreDir != "" {
		// A chroot store's files are read-only (as in /nix/store): make them removable first.
		chmodTree(nixStoreDir)
		os.RemoveAll(nixStoreDir)
	}
	os.Exit(code)
}

// chmodTree makes every directory under root writable by its owner, so RemoveAll can empty it.
func chmodTree(root string) {
	filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err == nil && d.IsDir() {
			os.Chmod(path, 0o700)
		}
		return nil
	})
}
