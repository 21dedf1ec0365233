//go:build darwin

package activation

import (
	"os/exec"
	"path/filepath"
	"strings"
)

// fallbackRuntimeDir returns the per-user Darwin temp dir (docs/protocol.md §2.1),
// which macOS creates 0700 for each user; "" if it cannot be found.
func fallbackRuntimeDir() string {
	out, err := exec.Command("/usr/bin/getconf", "DARWIN_USER_TEMP_DIR").Output()
	if err != nil {
		return ""
	}
	d := strings.TrimSpace(string(out))
	if !filepath.IsAbs(d) {
		return ""
	}
	return filepath.Clean(d)
}
