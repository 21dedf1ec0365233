//go:build !linux

package activation

import (
	"errors"
	"os"
	"strconv"
)

// inherit refuses socket activation off Linux: the checks it needs
// (SO_DOMAIN, SO_ACCEPTCONN on an inherited fd) are Linux-only, and an fd we
// cannot verify must not be served. It returns (nil, nil) when LISTEN_PID
// does not name this process, as on Linux.
func inherit() (*Sockets, error) {
	pidEnv := os.Getenv("LISTEN_PID")
	for _, k := range []string{"LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"} {
		_ = os.Unsetenv(k)
	}
	if pid, err := strconv.Atoi(pidEnv); err != nil || pid != os.Getpid() {
		return nil, nil
	}
	return nil, errors.New("activation: socket activation (LISTEN_FDS) is only supported on linux")
}
