package main

import (
	"os"
	"time"

	"github.com/xmsg/xmsg/internal/relaunch"
)

// The test binary is also the daemon of the e2e tests (ostest.Command): these knobs exist only
// in it, never in the xmsg binary.
func init() {
	testAckDelay = func() time.Duration {
		d, _ := time.ParseDuration(os.Getenv("XMSG_TEST_ACK_DELAY"))
		return max(d, 0)
	}
	// The relaunch tests recreate a session directory many times; each change waits this
	// long before the daemon starts again.
	if d, err := time.ParseDuration(os.Getenv("XMSG_TEST_RELAUNCH_SETTLE")); err == nil && d > 0 {
		relaunch.Settle = d
	}
}
