//go:build linux

package daemon

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// nonDumpable clears this process's dumpable flag: /proc/<pid>/{fd,mem,environ} become
// root's, so another process of the same uid can neither open the custody memfds through
// /proc nor read the daemon's memory, and no core dump is written.
func nonDumpable() error {
	if err := unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0); err != nil {
		return fmt.Errorf("custody: prctl(PR_SET_DUMPABLE): %w", err)
	}
	return nil
}
