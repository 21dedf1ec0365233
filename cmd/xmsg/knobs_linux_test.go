//go:build linux

package main

import (
	"os"
	"time"

	"github.com/xmsg/xmsg/internal/relaunch"
)

// The relaunch tests recreate a session directory many times; each change waits this long
// before the daemon starts again (a knob of the test binary only, as knobs_test.go's).
func init() {
	if d, err := time.ParseDuration(os.Getenv("XMSG_TEST_RELAUNCH_SETTLE")); err == nil && d > 0 {
		relaunch.Settle = d
	}
}
